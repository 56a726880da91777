#!/usr/bin/env python3
"""Writes the C ABI's per-op surface from its declaration (capi/abi/ksabi/ops.py).

    python capi/abi/generate.py           # write the generated files, then freeze the layout
    python capi/abi/generate.py --check   # exit 1 naming every stale file (CI: tests/test_capi_generated.py)

Generated (checked in, so a C user needs no Python to build): the declarations of
capi/include/kernelset.h and the core's tables capi/src/core/ops_table.{c,h}; the ctypes mirror
src/kernelset/capi/_abi.py; the Rust -sys crate, the safe crate's per-op module and its layout and
golden-call tests; the Go package's generated.go and golden-call test; the Node package's marked
blocks of index.js, index.d.ts and its golden test. Whole files start with a "generated" line;
blocks of hand-written files sit between "BEGIN GENERATED: <name>" and "END GENERATED: <name>".

Writing then freezes the header's layout in capi/abi/abi-<major>.json through
capi/abi/check_abi.py --update, which refuses a change to what is frozen (a field reordered or
retyped, a value changed, a function's signature changed) and an addition without a minor bump.
Standard library only (plus gcc for the freeze).
"""
from __future__ import annotations

import argparse
import difflib
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from ksabi import c, go, node, python, rust  # noqa: E402
from ksabi.text import replace_block  # noqa: E402


def validate() -> list[str]:
    """What the declaration itself gets wrong (the layout against the frozen one is check_abi's)."""
    from ksabi import ops as D
    errors = []
    ids = [f.op_id for f in D.OPS if f.op_id is not None]
    if ids != list(range(1, len(ids) + 1)):
        errors.append(f"op ids are {ids}: ops take the next id, in ks_api_t order")
    names = [f.name for f in c.functions()]
    errors += [f"{n} is declared twice" for n in sorted({n for n in names if names.count(n) > 1})]
    newest = max([f.since for f in D.OPS] + [s.since for s in D.OPTION_STRUCTS]
                 + [x.since for s in D.OPTION_STRUCTS for x in s.fields])
    if newest > (D.ABI_MAJOR, D.ABI_MINOR):
        errors.append(f"something is marked since ABI {newest[0]}.{newest[1]}, but ABI_MINOR is {D.ABI_MINOR}")
    for s in D.OPTION_STRUCTS:
        users = [f for f in D.OPS if f.options is s]
        if not users:
            errors.append(f"{s.name} is used by no op")
        for f in users:
            for x in s.fields:
                v = f.field_default(x)
                if x.enum is not None and int(v) not in dict(x.enum.values).values():
                    errors.append(f"{f.name}: default {x.name}={v} is none of {x.enum.prefix}_*")
    for f in D.OPS:
        if f.since < max([f.options.since] if f.options else [(1, 0)]):
            errors.append(f"{f.name}: older than its option struct")
    return errors


def outputs() -> dict[Path, tuple]:
    """path -> ("whole", text) or ("blocks", comment syntax, {block name: text})."""
    b = ROOT / "capi" / "bindings"
    return {
        ROOT / "capi/include/kernelset.h": ("blocks", "/*", {"declarations": c.header_block()}),
        ROOT / "capi/src/core/ops_table.c": ("whole", c.ops_table_c()),
        ROOT / "capi/src/core/ops_table.h": ("whole", c.ops_table_h()),
        ROOT / "src/kernelset/capi/_abi.py": ("whole", python.abi_py()),
        b / "rust/kernelset-sys/src/lib.rs": ("whole", rust.sys_lib()),
        b / "rust/kernelset/src/generated.rs": ("whole", rust.safe_generated()),
        b / "rust/kernelset/tests/layout.rs": ("whole", rust.layout_test()),
        b / "rust/kernelset/tests/golden/calls.rs": ("whole", rust.golden_calls()),
        b / "go/generated.go": ("whole", go.generated()),
        b / "go/golden_calls_test.go": ("whole", go.golden_calls()),
        b / "node/index.js": ("blocks", "//", node.index_js_blocks()),
        b / "node/index.d.ts": ("blocks", "//", node.index_dts_blocks()),
        b / "node/test/golden.test.js": ("blocks", "//", node.golden_test_blocks()),
    }


def render(path: Path, spec: tuple) -> str:
    if spec[0] == "whole":
        return spec[1]
    _, comment, blocks = spec
    text = path.read_text()
    for name, body in blocks.items():
        text = replace_block(text, name, body, comment, str(path.relative_to(ROOT)))
    return text


def stale() -> list[tuple[Path, str, str]]:
    """(path, text now, text generated) of every generated file that differs."""
    out = []
    for path, spec in outputs().items():
        want = render(path, spec)
        have = path.read_text() if path.exists() else ""
        if have != want:
            out.append((path, have, want))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a generated file is stale")
    ap.add_argument("--diff", action="store_true", help="with --check: print the diffs")
    ap.add_argument("--no-freeze", action="store_true", help="write the files but leave abi-<major>.json alone")
    args = ap.parse_args(argv)
    problems = validate()
    if problems:
        for p in problems:
            print(f"capi/abi/ksabi/ops.py: {p}", file=sys.stderr)
        return 1
    diffs = stale()
    if args.check:
        for path, have, want in diffs:
            rel = path.relative_to(ROOT)
            print(f"{rel} is stale: run python capi/abi/generate.py", file=sys.stderr)
            if args.diff:
                sys.stderr.writelines(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                                           f"{rel} (now)", f"{rel} (generated)"))
        return 1 if diffs else 0
    for path, _, want in diffs:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(want)
        os.replace(tmp, path)
        print(f"wrote {path.relative_to(ROOT)}")
    if args.no_freeze:
        return 0
    return freeze()


def freeze() -> int:
    """Freezes the header's layout (check_abi.py --update) when it differs from abi-<major>.json; the
    freeze refuses a breaking change and an addition without a minor bump."""
    import json

    import check_abi
    header = check_abi.Header(check_abi.HEADER.read_text())
    path = check_abi.ABI_DIR / f"abi-{header.version[0]}.json"
    if path.exists() and json.loads(path.read_text()) == check_abi.snapshot(header):
        return 0
    problems = check_abi.update()
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
