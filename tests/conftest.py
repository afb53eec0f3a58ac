"""Shared by every test: a clean compile cache and environment, and the CPU for the CPU tests.

On a machine with a GPU the script would pick CUDA; every test outside test_gpu.py and
test_kernels.py checks the CPU path, so it sees no GPU, in this process and in the processes it
starts. Without a GPU, the Triton kernels run in Triton's interpreter, on the CPU: it must be
chosen before they are defined, so before anything imports train_gpt.
"""
import os

import pytest
import torch

# One thread, as in the worker processes the tests start (torchrun gives each rank one): on some
# processors the CPU kernels split a product differently with two threads, which changes its
# rounding, and runs in this process are compared bit for bit with runs in those.
torch.set_num_threads(1)
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(autouse=True)
def isolated(request, monkeypatch):
    torch._dynamo.reset()  # dynamo caches per function; a test must not inherit others' entries
    saved = dict(os.environ)  # main() sets the allocator variable
    if request.path.name not in ("test_gpu.py", "test_kernels.py"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    yield
    os.environ.clear()
    os.environ.update(saved)
