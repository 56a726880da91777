"""The C ABI's per-op surface is generated from its declaration (capi/abi/ksabi/ops.py) by
capi/abi/generate.py and checked in; these tests fail when a generated file is stale.

- every generated file (the header's declarations, the core's op tables, the ctypes mirror, the
  Rust, Go and Node bindings and their golden calls) is what the generator writes now, and the
  generator runs without site-packages (standard library only: a C user regenerates without torch);
- the declaration exports exactly the registry's C-ABI ops;
- a hypothetical op added to the declaration makes every generated file stale, its header and C
  tables compile, and the frozen-layout check sees only additions; a reordered option field or a
  changed op id in the declaration is refused as breaking (the ABI-freeze check still guards it);
- generated Rust and Go are as rustfmt and gofmt format them (when those tools are installed).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ABI = ROOT / "capi" / "abi"
GENERATE = ABI / "generate.py"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


generate = _load("ks_capi_generate", GENERATE)  # puts capi/abi on sys.path: ksabi, check_abi
from ksabi import ops as decl  # noqa: E402
from ksabi.schema import Field, In, OptionStruct, Out, op  # noqa: E402

check_abi = _load("ks_check_abi_generated", ABI / "check_abi.py")


def test_generated_files_are_up_to_date():
    # -S: no site-packages (no torch), as a C user without the Python package runs it
    proc = subprocess.run([sys.executable, "-S", str(GENERATE), "--check", "--diff"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"stale generated files (run python capi/abi/generate.py):\n{proc.stderr[-6000:]}"
    assert generate.validate() == []


def test_declaration_is_the_registry_c_abi_ops():
    from kernelset.core import registry
    exported = sorted(e.name for e in registry.catalog() if e.spec.c_abi)
    assert sorted(f.name for f in decl.OPS if f.op_id is not None) == exported


# ---- a hypothetical op through the generator


SCALE_ROWS_OPTIONS = OptionStruct("ks_scale_rows_options", (Field("alpha", "float", 1.0, "default 1"),),
                                  since=(1, 2))
SCALE_ROWS = op("scale_rows", 23, In("x"), In("scale", optional=True), Out("out"), options=SCALE_ROWS_OPTIONS,
                since=(1, 2), section="Scaling. x [..., H]; scale [H] or NULL; out like x.",
                doc="out = alpha * x * scale over the last dim.")


@pytest.fixture
def with_new_op(monkeypatch):
    monkeypatch.setattr(decl, "ABI_MINOR", 2)
    monkeypatch.setattr(decl, "OPTION_STRUCTS", decl.OPTION_STRUCTS + (SCALE_ROWS_OPTIONS,))
    monkeypatch.setattr(decl, "OPS", decl.OPS + (SCALE_ROWS,))


def _header_text() -> str:
    path = check_abi.HEADER
    return generate.render(path, generate.outputs()[path])


def _layout(tmp_path: Path, header_text: str) -> tuple:
    inc = tmp_path / "include"
    inc.mkdir(exist_ok=True)
    (inc / "kernelset.h").write_text(header_text)
    h = check_abi.Header(header_text)
    return h, check_abi.snapshot(h, header_path=inc / "kernelset.h")


def test_a_new_op_regenerates_every_surface(with_new_op):
    assert generate.validate() == []
    stale = {p.relative_to(ROOT).as_posix() for p, _, _ in generate.stale()}
    assert stale == {p.relative_to(ROOT).as_posix() for p in generate.outputs()}
    outs = {p.relative_to(ROOT).as_posix(): generate.render(p, spec) for p, spec in generate.outputs().items()}
    assert "ks_status_t ks_scale_rows(const DLTensor *x, const DLTensor *scale, DLTensor *out," in \
        outs["capi/include/kernelset.h"]
    assert '"ks_scale_rows": (_S, [_T, _T, _T, _V, _V])' in outs["src/kernelset/capi/_abi.py"]
    assert "pub fn scale_rows(" in outs["capi/bindings/rust/kernelset/src/generated.rs"]
    assert "Op::ScaleRows => call_scale_rows(op, a, o)" in outs["capi/bindings/rust/kernelset/tests/golden/calls.rs"]
    assert "func ScaleRows(x, scale, out *Tensor, o *ScaleRowsOptions, s Stream) error {" in \
        outs["capi/bindings/go/generated.go"]
    assert "function scaleRows(x, scale, out, opts = null, stream = null) {" in outs["capi/bindings/node/index.js"]
    assert "scale_rows: (t, o, sc) => ks.scaleRows(t.x, t.scale, t.out, o)," in \
        outs["capi/bindings/node/test/golden.test.js"]


def test_a_new_op_compiles_and_only_adds_to_the_frozen_layout(with_new_op, tmp_path):
    if not shutil.which("gcc"):
        pytest.skip("no gcc")
    h, now = _layout(tmp_path, _header_text())
    frozen = json.loads((ABI / "abi-1.json").read_text())
    bad, added = check_abi.compare_frozen(frozen, now)
    assert bad == []
    assert "function ks_scale_rows added" in added and "struct ks_scale_rows_options added" in added
    assert any(a.startswith("struct ks_api_t: fields appended (scale_rows)") for a in added)
    assert check_abi.check_table(h) == []
    # the core's generated tables compile against the new header (the op's C glue is the one missing piece)
    core = tmp_path / "core"
    core.mkdir()
    (tmp_path / "cuda").symlink_to(ROOT / "capi" / "src" / "cuda")
    shutil.copy(ROOT / "capi" / "src" / "core" / "ks_internal.h", core)
    for name in ("options.c", "core.c"):
        shutil.copy(ROOT / "capi" / "src" / "core" / name, core)
    for path, spec in generate.outputs().items():
        if path.parent == ROOT / "capi" / "src" / "core":
            (core / path.name).write_text(generate.render(path, spec))
    for name in ("ops_table.c", "options.c", "core.c"):
        proc = subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-c", str(core / name), "-I",
                               str(tmp_path / "include"), "-o", str(tmp_path / (name + ".o"))],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{name}:\n{proc.stderr}"
    assert "ks_query_scale_rows" in (core / "ops_table.h").read_text()


def test_the_freeze_refuses_breaking_declaration_changes(monkeypatch, tmp_path):
    if not shutil.which("gcc"):
        pytest.skip("no gcc")
    frozen = json.loads((ABI / "abi-1.json").read_text())
    # option fields swapped
    swapped = dataclasses.replace(decl.SWIGLU_OAI_OPTIONS, fields=decl.SWIGLU_OAI_OPTIONS.fields[::-1])
    monkeypatch.setattr(decl, "OPTION_STRUCTS", tuple(swapped if s is decl.SWIGLU_OAI_OPTIONS else s
                                                      for s in decl.OPTION_STRUCTS))
    _, now = _layout(tmp_path, _header_text())
    bad, _ = check_abi.compare_frozen(frozen, now)
    assert any("ks_swiglu_oai_options: field 1" in b for b in bad), bad
    monkeypatch.undo()
    # an op id changed (and so the ids no longer run 1..n)
    moved = tuple(dataclasses.replace(f, op_id=99) if f.name == "softmax" else f for f in decl.OPS)
    monkeypatch.setattr(decl, "OPS", moved)
    assert any("op ids" in e for e in generate.validate())
    _, now = _layout(tmp_path, _header_text())
    bad, _ = check_abi.compare_frozen(frozen, now)
    assert "enum constant KS_OP_SOFTMAX changed from 9 to 99" in bad


def test_generated_rust_and_go_are_formatted():
    rel = [p for p in generate.outputs() if p.suffix in (".rs", ".go")]
    rustfmt, gofmt = shutil.which("rustfmt"), shutil.which("gofmt")
    if not rustfmt and not gofmt:
        pytest.skip("neither rustfmt nor gofmt is installed")
    if rustfmt:
        config = ROOT / "capi" / "bindings" / "rust" / "rustfmt.toml"
        files = [str(p) for p in rel if p.suffix == ".rs"]
        proc = subprocess.run([rustfmt, "--check", "--edition", "2021", "--config-path", str(config), *files],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    if gofmt:
        proc = subprocess.run([gofmt, "-l", *[str(p) for p in rel if p.suffix == ".go"]], capture_output=True,
                              text=True, timeout=60, env=dict(os.environ, GOFLAGS=""))
        assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr
