"""Shared by every test: a clean compile cache and environment, and the CPU for the CPU tests.

On a machine with a GPU the script would pick CUDA; every test outside test_gpu.py,
test_kernels.py and test_copies.py checks the CPU path, so it sees no GPU, in this process and
in the processes it starts. Without a GPU, the Triton kernels run in Triton's interpreter, on
the CPU: it must be chosen before they are defined, so before anything imports train_gpt. The
tests keep their freed memory, as run.sh has the CPU smoke run do: this process and those it
starts.
"""
import ctypes
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from compare import CPU_MALLOC  # noqa: E402

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters, from glibc's malloc.h


def keep_freed_memory():
    """run.sh's allocator setting for this process, as far as mallopt goes, where glibc is the C
    library: blocks of up to 2 GiB come from the heap rather than their own mappings, and the
    heap is not given back."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS): nothing to set
        return
    for parameter in (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD):
        libc.mallopt(parameter, 2**31 - 1)  # an int: 2 GiB, the most mallopt takes


# One thread, as in the worker processes the tests start (torchrun gives each rank one): on some
# processors the CPU kernels split a product differently with two threads, which changes its
# rounding, and runs in this process are compared bit for bit with runs in those.
torch.set_num_threads(1)
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    # Fresh pages for every step's tensors cost the training processes more than their math: a
    # third of the suite's time went to the kernel's side of it. The processes the tests start
    # (pytest-xdist's workers among them) read the setting from the environment as they start;
    # this one read it before this file ran, so it takes the same through mallopt.
    if "GLIBC_TUNABLES" not in os.environ:  # a user's own setting wins
        os.environ["GLIBC_TUNABLES"] = CPU_MALLOC
        keep_freed_memory()
    # Inductor compiles in a pool of worker processes, each importing torch: on the suite's two
    # cores that costs more than it saves (measured: 96 s of CPU against 78 s in one thread for
    # the GPU path's two-rank test). The code it generates is the same.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


# The files whose tests run on the GPU where there is one; the others see none.
MAY_USE_GPU = ("test_gpu.py", "test_kernels.py", "test_copies.py")


def pytest_collection_modifyitems(items):
    """pytest-xdist runs the tests on several workers (pytest.ini): those that may use the GPU
    go to one of them, one after another, so that no two share it."""
    for item in items:
        if item.path.name in MAY_USE_GPU:
            item.add_marker(pytest.mark.xdist_group("gpu"))


@pytest.fixture(autouse=True)
def isolated(request, monkeypatch):
    torch._dynamo.reset()  # dynamo caches per function; a test must not inherit others' entries
    saved = dict(os.environ)  # main() sets the allocator variable
    if request.path.name not in MAY_USE_GPU:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    yield
    os.environ.clear()
    os.environ.update(saved)
