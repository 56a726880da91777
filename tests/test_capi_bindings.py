"""The language bindings of libkernelset (capi/bindings/{rust,go,node}), the ABI check
(capi/abi/check_abi.py) and the golden data (capi/golden/golden.json). (That the bindings' per-op
surface is what capi/abi/generate.py writes from the declaration: tests/test_capi_generated.py.)

- the header against the frozen layout and every binding's declarations, and that the checker
  catches an appended field without a minor bump, a reordered field and a wrong binding type;
- golden.json is what capi/golden/make_golden.py generates now (inputs bitwise, outputs within
  tolerance) and small;
- ``cargo test --offline``, ``go test`` and ``node --test`` call every op of the header on CPU
  against golden.json plus the failure classes; each is rerun against a golden file with one
  expected value changed, which must fail.
A missing toolchain (cargo, go, node/npm, gcc) skips its test unless KS_REQUIRE_BINDINGS=1,
which turns the skip into a failure (CI). The library is built with scripts/build_capi.sh when
it is missing or older than its sources.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CAPI = ROOT / "capi"
LIB = ROOT / "src" / "kernelset" / "capi" / "lib" / "libkernelset.so"
RUST, GO, NODE = CAPI / "bindings" / "rust", CAPI / "bindings" / "go", CAPI / "bindings" / "node"
GOLDEN = CAPI / "golden" / "golden.json"
REQUIRE = os.environ.get("KS_REQUIRE_BINDINGS") == "1"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


check_abi = _load("ks_check_abi", CAPI / "abi" / "check_abi.py")


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        msg = f"{name} is not installed (the {name} binding test needs it)"
        if REQUIRE:
            pytest.fail(msg + "; KS_REQUIRE_BINDINGS=1", pytrace=False)
        pytest.skip(msg)
    return path


def _run(cmd: list[str], cwd: Path, timeout: int, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(cmd, cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def library(capi_library) -> Path:
    """libkernelset.so, built when missing or older than its sources (tests/conftest.py)."""
    _tool("gcc")
    assert Path(capi_library) == LIB
    return LIB


@pytest.fixture(scope="module")
def corrupted_golden(tmp_path_factory) -> tuple[Path, str]:
    """golden.json with one expected value of one case moved far off: every binding must fail it."""
    doc = json.loads(GOLDEN.read_text())
    case = next(c for c in doc["cases"] if c["op"] == "layer_norm")
    name = next(iter(case["expected"]))
    raw = bytearray(bytes.fromhex(case["expected"][name]))
    import struct
    raw[0:4] = struct.pack("<f", struct.unpack("<f", bytes(raw[0:4]))[0] + 10.0)
    case["expected"][name] = raw.hex()
    path = tmp_path_factory.mktemp("golden") / "golden.json"
    path.write_text(json.dumps(doc))
    return path, case["name"]


def _ok(proc: subprocess.CompletedProcess, what: str) -> None:
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"


def _fails_on(proc: subprocess.CompletedProcess, case: str, what: str) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"{what} passed a golden file with a wrong expected value:\n{out[-3000:]}"
    assert case in out, f"{what} failed, but not naming the corrupted case {case}:\n{out[-3000:]}"


# ---- the ABI check ------------------------------------------------------------------------------


def test_abi_check_passes():
    _tool("gcc")
    proc = _run([sys.executable, str(CAPI / "abi" / "check_abi.py")], ROOT, 120)
    _ok(proc, "capi/abi/check_abi.py")
    assert "bindings agree" in proc.stdout


@pytest.fixture(scope="module")
def header_now():
    _tool("gcc")
    h = check_abi.Header(check_abi.HEADER.read_text())
    return h, check_abi.snapshot(h)


def _variant(tmp_path: Path, old: str, new: str, minor: int | None = None) -> tuple:
    text = check_abi.HEADER.read_text()
    assert old in text
    text = text.replace(old, new)
    if minor is not None:  # the header's minor raised by `minor`
        now = int(re.search(r"#define KS_ABI_VERSION_MINOR (\d+)", text).group(1))
        text = text.replace(f"#define KS_ABI_VERSION_MINOR {now}", f"#define KS_ABI_VERSION_MINOR {now + minor}")
    path = tmp_path / "kernelset.h"
    path.write_text(text)
    h = check_abi.Header(text)
    return h, check_abi.snapshot(h, header_path=path)


def test_abi_check_catches_layout_changes(tmp_path, header_now):
    h, now = header_now
    frozen = json.loads((CAPI / "abi" / "abi-1.json").read_text())
    assert check_abi.check_layout(h, now, frozen) == []
    appended = ("  float temperature;  /* default 1.0; y = softmax(x / temperature) over the last dim */",
                "  float temperature;\n  int32_t dim;")
    # a field appended without raising the minor version
    h2, now2 = _variant(tmp_path, *appended)
    errs = check_abi.check_layout(h2, now2, frozen)
    assert any("ks_softmax_options: fields appended (dim)" in e and "without raising" in e for e in errs), errs
    # with the minor raised it is allowed, once frozen with --update
    h3, now3 = _variant(tmp_path, *appended, minor=1)
    errs = check_abi.check_layout(h3, now3, frozen)
    assert errs and all("freeze it with --update" in e for e in errs), errs
    assert check_abi.compare_frozen(frozen, now3)[0] == []
    # reordering fields breaks the ABI whatever the minor
    h4, now4 = _variant(tmp_path, "  float alpha;  /* default 1.702 */\n  float limit;  /* default 7.0 */",
                        "  float limit;\n  float alpha;", minor=1)
    errs = check_abi.check_layout(h4, now4, frozen)
    assert any("ks_swiglu_oai_options: field 1" in e and "breaking" in e for e in errs), errs
    # a changed enum value and a changed function signature
    h5, now5 = _variant(tmp_path, "KS_OP_SOFTMAX = 9,", "KS_OP_SOFTMAX = 99,")
    assert any("KS_OP_SOFTMAX changed from 9 to 99" in e for e in check_abi.check_layout(h5, now5, frozen))
    h6, now6 = _variant(tmp_path, "const DLTensor *k_cache, int64_t max_seq_len,",
                        "const DLTensor *k_cache, int32_t max_seq_len,")
    errs = check_abi.check_layout(h6, now6, frozen)
    assert any("ks_paged_attention_workspace_size changed" in e for e in errs), errs


def test_abi_check_catches_binding_drift(tmp_path, header_now):
    h, now = header_now
    rust = (RUST / "kernelset-sys" / "src" / "lib.rs").read_text()
    bad = tmp_path / "lib.rs"
    bad.write_text(rust.replace("        max_seq_len: i64,\n        bytes: *mut usize,",
                                "        max_seq_len: i32,\n        bytes: *mut usize,"))
    assert any("ks_paged_attention_workspace_size is fn(*const DLTensor, *const DLTensor, i32" in e
               for e in check_abi.check_rust(h, bad))
    bad.write_text(rust.replace("    pub z_loss: f32,\n", ""))
    assert any("ks_cross_entropy_options fields" in e for e in check_abi.check_rust(h, bad))
    bad.write_text(rust.replace("pub const KS_OP_MROPE: ks_op_t = 14;", "pub const KS_OP_MROPE: ks_op_t = 15;"))
    assert any("KS_OP_MROPE = 15" in e for e in check_abi.check_rust(h, bad))

    godir = tmp_path / "go"
    godir.mkdir()
    for p in GO.glob("*.go"):
        text = p.read_text()
        if p.name == "generated.go":
            text = text.replace("\tc.window_right = C.int32_t(o.WindowRight)\n", "")
        (godir / p.name).write_text(text)
    assert any("ks_attention_options.window_right is never set" in e for e in check_abi.check_go(h, godir))

    node = (NODE / "index.js").read_text()
    badjs = tmp_path / "index.js"
    badjs.write_text(node.replace("'ks_status_t swiglu(const DLTensor *gate, const DLTensor *up, DLTensor *out",
                                  "'ks_status_t swiglu(const DLTensor *gate, DLTensor *up, DLTensor *out"))
    assert any("ks_api_t.swiglu is fn(*const DLTensor, *mut DLTensor" in e for e in check_abi.check_node(h, badjs))
    badjs.write_text(node.replace("window_left: 'int32_t', window_right: 'int32_t'", "window_left: 'int32_t'"))
    assert any("ks_attention_options fields" in e for e in check_abi.check_node(h, badjs))

    py = check_abi.PY_ABI.read_text()
    badpy = tmp_path / "_abi.py"
    badpy.write_text(py.replace('"ks_silu_and_mul": (_S, [_T, _T, _V]),', '"ks_silu_and_mul": (_S, [_T, _V]),'))
    assert any("ks_silu_and_mul is" in e for e in check_abi.check_python(h, now, badpy))


# ---- golden data --------------------------------------------------------------------------------


def test_golden_is_up_to_date_and_small():
    make_golden = _load("ks_make_golden", CAPI / "golden" / "make_golden.py")
    assert GOLDEN.stat().st_size < 2 * 1024 * 1024
    old = json.loads(GOLDEN.read_text())
    new = make_golden.build()
    assert make_golden.stale(old, new) == [], "capi/golden/golden.json is stale: run capi/golden/make_golden.py"
    assert set(new["ops"]) == {c["op"] for c in new["cases"]}
    # the staleness check itself: a changed input bit and an output beyond tolerance are caught
    case = json.loads(json.dumps(new["cases"][0]))
    data = bytearray(bytes.fromhex(case["tensors"][0]["data"]))
    data[0] ^= 1
    case["tensors"][0]["data"] = data.hex()
    assert any("tensors differ" in p for p in make_golden.stale({**new, "cases": [case] + new["cases"][1:]}, new))
    case = json.loads(json.dumps(new["cases"][0]))
    name = next(iter(case["expected"]))
    out = bytearray(bytes.fromhex(case["expected"][name]))
    out[3] ^= 0x40  # flips an exponent bit of the first value
    case["expected"][name] = out.hex()
    assert any("relative error" in p for p in make_golden.stale({**new, "cases": [case] + new["cases"][1:]}, new))


# ---- bindings -----------------------------------------------------------------------------------


def test_rust_bindings(library, corrupted_golden):
    cargo = _tool("cargo")
    env = {"CARGO_TARGET_DIR": str(RUST / "target"), "CARGO_NET_OFFLINE": "true"}
    _ok(_run([cargo, "test", "--offline", "-q"], RUST, 600, env), "cargo test --offline")
    bad, case = corrupted_golden
    proc = _run([cargo, "test", "--offline", "-q", "--test", "golden"], RUST, 300, {**env, "KS_GOLDEN": str(bad)})
    _fails_on(proc, case, "the Rust golden test")


def test_go_bindings(library, corrupted_golden):
    go = _tool("go")
    env = {"GOFLAGS": "-count=1", "GOPROXY": "off", "GOTOOLCHAIN": "local", "CGO_ENABLED": "1"}
    _ok(_run([go, "test", "./..."], GO, 600, env), "go test")
    bad, case = corrupted_golden
    proc = _run([go, "test", "-run", "TestGoldenEveryOp", "./..."], GO, 300, {**env, "KS_GOLDEN": str(bad)})
    _fails_on(proc, case, "the Go golden test")


def test_node_bindings(library, corrupted_golden):
    node = _tool("node")
    if not (NODE / "node_modules" / "koffi").exists():
        npm = _tool("npm")
        # the suite's only network fetch: npm retries each request, and the install is tried twice
        # (a registry hiccup would otherwise fail CI, where KS_REQUIRE_BINDINGS=1)
        for _ in range(2):
            proc = _run([npm, "ci", "--no-audit", "--no-fund", "--fetch-retries=4"], NODE, 300)
            if proc.returncode == 0:
                break
        if proc.returncode:
            msg = f"npm ci in capi/bindings/node failed (koffi from the npm registry):\n{proc.stderr[-2000:]}"
            if REQUIRE:
                pytest.fail(msg, pytrace=False)
            pytest.skip(msg)
    _ok(_run([node, "--test", "test/"], NODE, 300), "node --test")
    bad, case = corrupted_golden
    proc = _run([node, "--test", "test/golden.test.js"], NODE, 300, {"KS_GOLDEN": str(bad)})
    _fails_on(proc, case, "the Node golden test")
