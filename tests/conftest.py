"""Shared test settings."""
import pytest


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """Tiny models run fastest on one thread; two threads on a busy 2-core machine thrash (10x slower)."""
    try:
        import torch
    except ImportError:  # the simulator's tests need no torch
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
