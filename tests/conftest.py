"""Test setup: without a GPU, Triton kernels run in the interpreter on CPU tensors.

TRITON_INTERPRET and KS_POISON_OUTPUTS must be set before Triton or kernelset is imported.
"""
import os
import zlib

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("KS_POISON_OUTPUTS", "1")

import kernelset  # noqa: E402
from kernelset.testing.interpreter import patch_bf16_rounding  # noqa: E402

if os.environ.get("TRITON_INTERPRET") == "1":
    patch_bf16_rounding()

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run scripts/gpu_check.sh on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    # Fresh random inputs per test (each test id its own seed), reproducible from the test id: crc32
    # rather than hash(), which Python salts per process. KS_TEST_SEED shifts every seed, to draw
    # new inputs for a whole run.
    torch.manual_seed((zlib.crc32(request.node.nodeid.encode()) + int(os.environ.get("KS_TEST_SEED", "0"))) % 2**31)
    yield
    kernelset.core.dispatch.clear_cache()
