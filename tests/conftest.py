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


# ---- the C library (tests/test_capi*.py): built once per session when missing or older than a
# source: the C sources, the AOT generator, the header, and the Python launch policies the
# generator translates to C (a stale build would plan launches with an old policy)
_CAPI_SOURCES = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), *p)
                 for p in (("capi", "src"), ("capi", "aot"), ("capi", "include"), ("src", "kernelset", "ops"))]
_CAPI_BUILD: dict = {}


def _capi_newest_source() -> float:
    newest = 0.0
    for base in _CAPI_SOURCES:
        for dirpath, _, files in os.walk(base):
            for f in files:
                if f.endswith((".c", ".h", ".py")):
                    newest = max(newest, os.path.getmtime(os.path.join(dirpath, f)))
    return newest


def build_capi() -> str | None:
    """Builds libkernelset.so once per session when missing or stale; returns the build error (the
    end of its log) or None. Usable at import time by modules whose tables call the library."""
    import shutil
    import subprocess
    import sys

    from kernelset import capi
    if not _CAPI_BUILD:
        if not shutil.which("gcc"):
            _CAPI_BUILD["error"] = "no gcc to build the C library"
            return _CAPI_BUILD["error"]
        import fcntl
        path = capi.library_path()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # parallel test workers (pytest-xdist) build once: the first takes the lock and builds, the
        # others wait for it and then find the library fresh
        with open(path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.exists(path) or os.path.getmtime(path) < _capi_newest_source():
                root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
                proc = subprocess.run([os.path.join(root, "scripts", "build_capi.sh")], cwd=root,
                                      env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True,
                                      timeout=900)
                if proc.returncode:
                    _CAPI_BUILD["error"] = ("scripts/build_capi.sh failed:\n" + proc.stdout[-3000:]
                                            + proc.stderr[-5000:])
        _CAPI_BUILD["path"] = path
    return _CAPI_BUILD.get("error")


@pytest.fixture(scope="session")
def capi_library() -> str:
    """Path of libkernelset.so, (re)built by scripts/build_capi.sh when needed; a failed build fails
    every test that uses it with the build log (without building again)."""
    err = build_capi()
    if err:
        pytest.fail(err, pytrace=False)
    return _CAPI_BUILD["path"]
