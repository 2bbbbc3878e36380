"""Shared test settings."""

import os

import pytest

try:
    import torch
except ImportError:  # the simulator's tests need no torch
    torch = None
if torch is None or not torch.cuda.is_available():
    # Our Triton kernels then run on the CPU under triton's interpreter (when triton is installed);
    # it must be chosen before any kernel is defined, so here, before the tests import the model.
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """Tiny models run fastest on one thread; two threads on a busy 2-core machine thrash (10x slower)."""
    if torch is None:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
