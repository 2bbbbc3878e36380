"""Our Triton kernels compiled for an H100/H200 (sm_90) on a machine without a GPU: the instructions a GPU
would run, which triton's interpreter (numpy) cannot show. A test's script compiles its kernel and prints
what it finds in the PTX; it runs after PRELUDE, which imports what compiling needs."""

import os
import subprocess
import sys

import pytest

NO_NVIDIA_BACKEND = 3  # PRELUDE's exit status where triton cannot compile for NVIDIA GPUs
PRELUDE = f"""
import re, sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
if "nvidia" not in triton.backends.backends:
    sys.exit({NO_NVIDIA_BACKEND})
"""


def nvidia_compile_output(script: str, *args: str) -> str:
    """What `script` prints, run after PRELUDE with `args` by a new Python without triton's interpreter
    (tests/conftest.py chooses it for this one); the test is skipped where triton has no NVIDIA backend."""
    environment = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    process = subprocess.run(
        [sys.executable, "-c", PRELUDE + script, *args], capture_output=True, text=True, env=environment, timeout=300
    )
    if process.returncode == NO_NVIDIA_BACKEND:
        pytest.skip("triton has no NVIDIA backend here")
    assert process.returncode == 0, process.stderr[-2000:]
    return process.stdout.strip()
