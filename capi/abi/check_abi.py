#!/usr/bin/env python3
"""The C ABI check: kernelset.h against the frozen layout and against every language binding.

    python capi/abi/check_abi.py            # exit 1 with one line per problem
    python capi/abi/check_abi.py --update   # freeze the header into capi/abi/abi-<major>.json

1. Layout (frozen in abi-<major>.json): sizes, alignments and field offsets of every struct
   (measured by compiling a small C program with gcc, not computed here), the values of every
   enum constant, and the canonical signature of every KS_API function. Within a major version a
   struct may only grow by appended fields, and constants and functions may only be added; any
   addition needs KS_ABI_VERSION_MINOR above the frozen minor. ``--update`` refuses a breaking
   change and an addition without a minor bump.
2. Bindings: the Rust -sys crate declares every KS_API function, every ks_api_t field, every
   struct field and every enum constant with matching types and values; the Go package calls
   every KS_API function, sets every option field and reads every ks_api_t field (cgo reads the
   header itself, so it cannot disagree on types); the Node package's koffi declarations (C
   prototypes and struct members) match the header's types; ks.capi's ctypes mirror
   (src/kernelset/capi/_abi.py) has every prototype (const erased, option structs as void *),
   the measured struct layouts, and the status and op constants.

The header's declarations and the bindings' per-op surface are generated from one declaration
(capi/abi/ksabi/ops.py, by capi/abi/generate.py, which freezes with ``--update``); this check still
parses what is checked in, so a hand edit or a generator bug is caught all the same.

Types are compared in one canonical spelling, Rust-like: ``const DLTensor *const *`` is
``*const *const DLTensor``, ``size_t`` is ``usize``, ``ks_stream_t`` is ``*mut void``, a function
pointer is ``fn(a, b) -> r``. The header is read by a small parser for the C subset it uses
(typedef'd structs and enums, anonymous enums, KS_API prototypes, function-pointer fields).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "capi" / "include" / "kernelset.h"
ABI_DIR = ROOT / "capi" / "abi"
RUST_SYS = ROOT / "capi" / "bindings" / "rust" / "kernelset-sys" / "src" / "lib.rs"
GO_DIR = ROOT / "capi" / "bindings" / "go"
NODE_INDEX = ROOT / "capi" / "bindings" / "node" / "index.js"
PY_ABI = ROOT / "src" / "kernelset" / "capi" / "_abi.py"

PRIMITIVES = {
    "int8_t": "i8", "uint8_t": "u8", "int16_t": "i16", "uint16_t": "u16", "int32_t": "i32", "uint32_t": "u32",
    "int64_t": "i64", "uint64_t": "u64", "size_t": "usize", "float": "f32", "double": "f64", "char": "char",
    "void": "void", "int": "i32",
}


def _rel(p: Path) -> str:
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return str(p)


# ---- canonical types ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CType:
    """base with pointer levels: consts[0] is the base's const, consts[i] the i-th '*''s own const."""

    base: str
    consts: tuple[bool, ...] = (False,)
    array: int | None = None

    def render(self) -> str:
        s = self.base
        for c in self.consts[:-1]:
            s = ("*const " if c else "*mut ") + s
        return f"[{s}; {self.array}]" if self.array is not None else s


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Splits at `sep` outside (), [], <>, {}."""
    out, depth, cur = [], 0, []
    for i, ch in enumerate(text):
        if ch in "([<{":
            depth += 1
        elif ch in ")]>}" and not (ch == ">" and i and text[i - 1] == "-"):  # "->" closes nothing
            depth -= 1
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur))
    return [s.strip() for s in out]


class Header:
    """What kernelset.h declares: typedefs, structs (ordered fields), enum constants, functions."""

    def __init__(self, text: str):
        self.defines: dict[str, str] = {}
        self.typedefs: dict[str, CType] = {}
        self.enum_types: set[str] = set()
        self.structs: dict[str, list[tuple[str, str]]] = {}  # name -> [(field, canonical type)]
        self.enums: dict[str, int] = {}
        self.functions: dict[str, str] = {}  # name -> "fn(..) -> r"
        self.param_names: dict[str, list[str]] = {}
        self._parse(text)

    # C declarations -> canonical
    def ctype(self, decl: str) -> tuple[str | None, CType]:
        """A declaration ('const DLTensor *const *k_caches', 'int32_t x[3]', 'size_t') -> (name, type)."""
        decl = re.sub(r"\b(_Out_|_In_|_Inout_)\b", " ", decl)
        array = None
        m = re.search(r"\[\s*(\d+)\s*\]\s*$", decl)
        if m:
            array, decl = int(m.group(1)), decl[:m.start()]
        toks = re.findall(r"[A-Za-z_]\w*|\*", decl)
        i, base_const, words = 0, False, []
        while i < len(toks) and toks[i] != "*":
            if toks[i] == "const":
                base_const = True
            elif toks[i] in ("struct", "enum"):
                pass
            else:
                words.append(toks[i])
            i += 1
        name = None
        if i == len(toks) and len(words) >= 2 and words[-1] not in PRIMITIVES and words[-2] != "unsigned":
            name = words.pop()
        if not words:
            raise ValueError(f"no type in declaration {decl!r}")
        base = " ".join(words)
        consts = [base_const]
        while i < len(toks):
            if toks[i] == "*":
                consts.append(False)
            elif toks[i] == "const":
                consts[-1] = True
            else:
                if i != len(toks) - 1:
                    raise ValueError(f"unexpected {toks[i]!r} in declaration {decl!r}")
                name = toks[i]
            i += 1
        return name, self._resolve(base, tuple(consts), array)

    def _resolve(self, base: str, consts: tuple[bool, ...], array: int | None) -> CType:
        if base in self.typedefs:
            t = self.typedefs[base]
            merged = t.consts[:-1] + (t.consts[-1] or consts[0],) + consts[1:]
            return CType(t.base, merged, array)
        if base in self.enum_types:
            return CType("i32", consts, array)
        return CType(PRIMITIVES.get(base, base), consts, array)

    def fn_type(self, ret: str, params: str) -> tuple[str, list[str]]:
        """'ks_status_t', 'const DLTensor *x, ...' -> ('fn(*const DLTensor, ..) -> i32', [names])."""
        ps = [] if params.strip() in ("", "void") else _split_top(params)
        types, names = [], []
        for p in ps:
            n, t = self.ctype(p)
            types.append(t.render())
            names.append(n or "")
        return f"fn({', '.join(types)}) -> {self.ctype(ret)[1].render()}", names

    def field_decl(self, decl: str) -> tuple[str, str]:
        m = re.fullmatch(r"(.+?)\(\s*\*\s*(\w+)\s*\)\s*\((.*)\)", decl.strip(), re.S)
        if m:
            return m.group(2), self.fn_type(m.group(1), m.group(3))[0]
        name, t = self.ctype(decl)
        if name is None:
            raise ValueError(f"field without a name: {decl!r}")
        return name, t.render()

    def _parse(self, text: str) -> None:
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
        text = re.sub(r"//[^\n]*", " ", text)
        body = []
        for line in text.splitlines():
            s = line.strip()
            if s.startswith("#"):
                m = re.match(r"#\s*define\s+(\w+)\s+(.+)$", s)
                if m:
                    self.defines[m.group(1)] = m.group(2).strip()
                continue
            body.append(line)
        decls = _split_top(" ".join(body), ";")
        for d in decls:
            d = " ".join(d.split())
            if not d:
                continue
            self._decl(d)

    def _enum_body(self, body: str) -> None:
        nxt = 0
        for item in _split_top(body):
            if not item:
                continue
            name, _, val = item.partition("=")
            v = int(val.strip(), 0) if val.strip() else nxt
            self.enums[name.strip()] = v
            nxt = v + 1

    def _decl(self, d: str) -> None:
        m = re.fullmatch(r"typedef enum \{(.*)\} (\w+)", d)
        if m:
            self._enum_body(m.group(1))
            self.enum_types.add(m.group(2))
            return
        m = re.fullmatch(r"enum \{(.*)\}", d)
        if m:
            self._enum_body(m.group(1))
            return
        m = re.fullmatch(r"typedef struct \{(.*)\} (\w+)", d)
        if m:
            fields = [self.field_decl(f) for f in _split_top(m.group(1), ";") if f.strip()]
            self.structs[m.group(2)] = fields
            return
        m = re.fullmatch(r"KS_API (.+?)\b(ks_\w+) ?\((.*)\)", d)
        if m:
            sig, names = self.fn_type(m.group(1), m.group(3))
            self.functions[m.group(2)] = sig
            self.param_names[m.group(2)] = names
            return
        m = re.fullmatch(r"typedef (.+)", d)
        if m:
            name, t = self.ctype(m.group(1))
            if name is None:
                raise ValueError(f"typedef without a name: {d!r}")
            self.typedefs[name] = t
            return
        raise ValueError(f"kernelset.h: declaration this checker does not understand: {d!r}")

    @property
    def version(self) -> tuple[int, int]:
        return int(self.defines["KS_ABI_VERSION_MAJOR"]), int(self.defines["KS_ABI_VERSION_MINOR"])


# ---- measured layout ---------------------------------------------------------------------------


def measure(header: Header, cc: str = "gcc", header_path: Path = HEADER) -> dict:
    """Sizes, alignments and offsets from the compiler: a C program that prints them as JSON."""
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "kernelset.h"', "int main(void) {",
             '  printf("{\\"structs\\": {");']
    for si, (name, fields) in enumerate(header.structs.items()):
        lines.append(f'  printf("%s\\"{name}\\": {{\\"size\\": %zu, \\"align\\": %zu, \\"fields\\": [", '
                     f'"{", " if si else ""}", sizeof({name}), _Alignof({name}));')
        for fi, (f, _) in enumerate(fields):
            lines.append(f'  printf("%s[\\"{f}\\", %zu, %zu]", "{", " if fi else ""}", offsetof({name}, {f}), '
                         f"sizeof((({name} *)0)->{f}));")
        lines.append('  printf("]}");')
    lines.append('  printf("}, \\"enums\\": {");')
    for ei, name in enumerate(header.enums):
        lines.append(f'  printf("%s\\"{name}\\": %lld", "{", " if ei else ""}", (long long){name});')
    lines.append('  printf("}}\\n");  return 0; }')
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "layout.c", Path(tmp) / "layout"
        src.write_text("\n".join(lines) + "\n")
        subprocess.run([cc, "-std=c99", "-Wall", "-Werror", "-I", str(header_path.parent), str(src), "-o", str(exe)],
                       check=True, capture_output=True, text=True)
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def snapshot(header: Header, cc: str = "gcc", header_path: Path = HEADER) -> dict:
    major, minor = header.version
    lay = measure(header, cc, header_path)
    for name, fields in header.structs.items():
        for row, (_, t) in zip(lay["structs"][name]["fields"], fields):
            row.append(t)
    return {"major": major, "minor": minor, "structs": lay["structs"], "enums": lay["enums"],
            "functions": dict(header.functions)}


def compare_frozen(frozen: dict, now: dict) -> tuple[list[str], list[str]]:
    """(breaking problems, additions) between the frozen file and the header of the same major."""
    bad, added = [], []
    for name, fs in frozen["structs"].items():
        cur = now["structs"].get(name)
        if cur is None:
            bad.append(f"struct {name} was removed")
            continue
        old_fields, new_fields = fs["fields"], cur["fields"]
        for i, of in enumerate(old_fields):
            if i >= len(new_fields) or new_fields[i] != of:
                got = new_fields[i] if i < len(new_fields) else "nothing"
                bad.append(f"struct {name}: field {i} was {of} (name, offset, size, type), now {got}")
        if cur["align"] != fs["align"]:
            bad.append(f"struct {name}: alignment {fs['align']} -> {cur['align']}")
        if cur["size"] < fs["size"]:
            bad.append(f"struct {name}: shrank from {fs['size']} to {cur['size']} bytes")
        elif len(new_fields) > len(old_fields) or cur["size"] > fs["size"]:
            added.append(f"struct {name}: fields appended ({', '.join(f[0] for f in new_fields[len(old_fields):])})")
    for name in now["structs"].keys() - frozen["structs"].keys():
        added.append(f"struct {name} added")
    for name, v in frozen["enums"].items():
        if name not in now["enums"]:
            bad.append(f"enum constant {name} was removed")
        elif now["enums"][name] != v:
            bad.append(f"enum constant {name} changed from {v} to {now['enums'][name]}")
    for name in now["enums"].keys() - frozen["enums"].keys():
        added.append(f"enum constant {name} added")
    for name, sig in frozen["functions"].items():
        if name not in now["functions"]:
            bad.append(f"function {name} was removed")
        elif now["functions"][name] != sig:
            bad.append(f"function {name} changed from {sig} to {now['functions'][name]}")
    for name in now["functions"].keys() - frozen["functions"].keys():
        added.append(f"function {name} added")
    return bad, added


def check_layout(header: Header, now: dict, frozen: dict | None = None) -> list[str]:
    """The header against abi-<major>.json (or `frozen`)."""
    major, minor = header.version
    if frozen is None:
        path = ABI_DIR / f"abi-{major}.json"
        if not path.exists():
            return [f"{_rel(path)} is missing: run capi/abi/check_abi.py --update to freeze ABI {major}"]
        frozen = json.loads(path.read_text())
    bad, added = compare_frozen(frozen, now)
    errors = [f"ABI {major}: {b} (breaking within a major version)" for b in bad]
    if minor < frozen["minor"]:
        errors.append(f"KS_ABI_VERSION_MINOR {minor} is below the frozen minor {frozen['minor']}")
    if added and minor <= frozen["minor"]:
        errors += [f"ABI {major}.{minor}: {a} without raising KS_ABI_VERSION_MINOR above {frozen['minor']}"
                   for a in added]
    if added and minor > frozen["minor"] and not bad:
        errors += [f"ABI {major}.{minor}: {a}; freeze it with --update" for a in added]
    return errors


def check_table(header: Header) -> list[str]:
    """ks_api_t lists every KS_API function but the entry points (as field `x` of `ks_x`)."""
    errors = []
    table = dict(header.structs["ks_api_t"])
    for fn, sig in header.functions.items():
        if fn in ("ks_get_api", "ks_abi_version"):
            continue
        f = fn[3:]
        if f not in table:
            errors.append(f"ks_api_t has no field {f} for {fn}")
        elif table[f] != sig:
            errors.append(f"ks_api_t.{f} is {table[f]}, {fn} is {sig}")
    return errors


# ---- Rust --------------------------------------------------------------------------------------


def _rust_type(t: str, aliases: dict[str, str]) -> str:
    t = " ".join(t.replace("::std::os::raw::", "").replace("std::os::raw::", "").replace("core::ffi::", "")
                 .replace("std::ffi::", "").split()).strip().rstrip(",").strip()
    t = re.sub(r",\s*>$", ">", t)
    m = re.fullmatch(r'Option\s*<\s*unsafe\s+extern\s+"C"\s+fn\s*\((.*)\)\s*(->\s*(.+))?>', t, re.S)
    if m:
        params = [_rust_type(p.split(":", 1)[-1] if ":" in p else p, aliases) for p in _split_top(m.group(1))]
        ret = _rust_type(m.group(3), aliases) if m.group(3) else "void"
        return f"fn({', '.join(params)}) -> {ret}"
    m = re.fullmatch(r"\*\s*(const|mut)\s+(.+)", t)
    if m:
        return f"*{m.group(1)} {_rust_type(m.group(2), aliases)}"
    m = re.fullmatch(r"\[\s*(.+);\s*(\d+)\s*\]", t)
    if m:
        return f"[{_rust_type(m.group(1), aliases)}; {m.group(2)}]"
    if t in aliases:
        return _rust_type(aliases[t], aliases)
    return {"c_char": "char", "c_void": "void", "c_int": "i32"}.get(t, t)


def check_rust(header: Header, path: Path = RUST_SYS) -> list[str]:
    if not path.exists():
        return [f"{_rel(path)} is missing"]
    src = re.sub(r"//[^\n]*", "", path.read_text())
    where = _rel(path)
    errors = []
    aliases = dict(re.findall(r"pub type (\w+)\s*=\s*([^;]+);", src))
    for name, t in header.typedefs.items():
        if name in aliases and _rust_type(aliases[name], aliases) != t.render():
            errors.append(f"{where}: type {name} = {aliases[name]}, header: {t.render()}")
    fns = {}
    for block in re.findall(r'extern\s+"C"\s*\{(.*?)\n\}', src, re.S):
        for m in re.finditer(r"pub fn (\w+)\s*\((.*?)\)\s*(?:->\s*([^;]+?))?\s*;", block, re.S):
            params = [_rust_type(p.split(":", 1)[1], aliases) for p in _split_top(m.group(2))]
            ret = _rust_type(m.group(3), aliases) if m.group(3) else "void"
            fns[m.group(1)] = f"fn({', '.join(params)}) -> {ret}"
    for fn, sig in header.functions.items():
        if fn not in fns:
            errors.append(f"{where}: no extern declaration of {fn}")
        elif fns[fn] != sig:
            errors.append(f"{where}: {fn} is {fns[fn]}, header: {sig}")
    structs = {}
    for m in re.finditer(r"#\[repr\(C\)\]\s*(?:#\[[^\]]*\]\s*)*pub struct (\w+)\s*\{(.*?)\n\}", src, re.S):
        fields = []
        for f in _split_top(m.group(2)):
            fm = re.fullmatch(r"pub (\w+)\s*:\s*(.+)", f, re.S)
            if fm:
                fields.append((fm.group(1), _rust_type(fm.group(2), aliases)))
        structs[m.group(1)] = fields
    errors += _compare_structs(header, structs, where, "#[repr(C)] struct")
    consts = {n: int(v) for n, v in re.findall(r"pub const (\w+)\s*:\s*\w+\s*=\s*(-?\d+)\s*;", src)}
    errors += _compare_enums(header, consts, where)
    for name in ("KS_ABI_VERSION_MAJOR", "KS_ABI_VERSION_MINOR"):
        if consts.get(name) != int(header.defines[name]):
            errors.append(f"{where}: {name} = {consts.get(name)}, header: {header.defines[name]}")
    return errors


def _compare_structs(header: Header, structs: dict[str, list[tuple[str, str]]], where, what: str) -> list[str]:
    errors = []
    for name, fields in header.structs.items():
        if name not in structs:
            errors.append(f"{where}: no {what} {name}")
            continue
        got = structs[name]
        if [f for f, _ in got] != [f for f, _ in fields]:
            errors.append(f"{where}: {name} fields {[f for f, _ in got]}, header: {[f for f, _ in fields]}")
            continue
        for (f, t), (_, gt) in zip(fields, got):
            if t != gt:
                errors.append(f"{where}: {name}.{f} is {gt}, header: {t}")
    return errors


def _compare_enums(header: Header, consts: dict[str, int], where) -> list[str]:
    errors = []
    for name, v in header.enums.items():
        if name not in consts:
            errors.append(f"{where}: no constant {name}")
        elif consts[name] != v:
            errors.append(f"{where}: {name} = {consts[name]}, header: {v}")
    return errors


# ---- Go ----------------------------------------------------------------------------------------


def check_go(header: Header, root: Path = GO_DIR) -> list[str]:
    files = sorted(p for p in root.glob("*.go") if not p.name.endswith("_test.go")) if root.exists() else []
    if not files:
        return [f"{_rel(root)}: no Go sources"]
    src = "\n".join(re.sub(r"//[^\n]*", "", p.read_text()) for p in files)
    where = _rel(root)
    errors = []
    if not re.search(r'#include\s+"kernelset\.h"', src):
        errors.append(f"{where}: the cgo preamble does not include kernelset.h")
    for fn in header.functions:
        if not re.search(rf"\bC\.{fn}\s*\(", src):
            errors.append(f"{where}: {fn} is never called")
    for name, fields in header.structs.items():
        if name.endswith("_options"):
            for f, _ in fields:
                if f != "size" and not re.search(rf"\.{f}\s*(\[[^\]]*\])?\s*=[^=]", src):
                    errors.append(f"{where}: {name}.{f} is never set")
    for f, _ in header.structs["ks_api_t"]:
        if not re.search(rf"\.{f}\b", src):
            errors.append(f"{where}: ks_api_t.{f} is never read")
    return errors


# ---- Node (koffi) ------------------------------------------------------------------------------


# a koffi.struct member: name: 'c type' | koffi.array('c type', n[, 'hint']) | StructVariable
KOFFI_MEMBER = re.compile(r"(\w+)\s*:\s*(?:'([^']*)'|koffi\.array\(\s*'([^']*)'\s*,\s*(\d+)\s*(?:,\s*'\w+'\s*)?\)"
                          r"|(\w+))")


def check_node(header: Header, path: Path = NODE_INDEX) -> list[str]:
    if not path.exists():
        return [f"{_rel(path)} is missing"]
    src = re.sub(r"//[^\n]*", "", path.read_text())
    where = _rel(path)
    errors = []
    aliases: dict[str, str] = {}
    for name, target in re.findall(r"koffi\.alias\(\s*'(\w+)'\s*,\s*'([^']+)'\s*\)", src):
        aliases[name] = target
        if name in header.typedefs and header.ctype(target)[1].render() != header.typedefs[name].render():
            errors.append(f"{where}: koffi.alias {name} = {target}, header: {header.typedefs[name].render()}")

    def ctype(decl: str) -> tuple[str | None, str]:
        name, t = header.ctype(decl)
        return name, t.render()

    def proto(decl: str) -> tuple[str, str]:
        m = re.fullmatch(r"\s*(.+?)\b(\w+)\s*\((.*)\)\s*", decl, re.S)
        if not m:
            raise ValueError(f"not a prototype: {decl!r}")
        return m.group(2), header.fn_type(m.group(1), m.group(3))[0]

    def strings(var: str) -> list[str]:
        m = re.search(rf"const {var}\s*=\s*\[(.*?)\];", src, re.S)
        return re.findall(r"'([^']*)'", m.group(1)) if m else []

    direct = dict(proto(p) for p in strings("DIRECT_FUNCTIONS"))
    table = [header.field_decl(re.sub(r"^(.+?)\b(\w+)\s*\((.*)\)$", r"\1(*\2)(\3)", d)) if "(" in d
             else header.field_decl(d) for d in strings("API_FIELDS")]
    if [f for f, _ in table] != [f for f, _ in header.structs["ks_api_t"]]:
        errors.append(f"{where}: API_FIELDS {[f for f, _ in table]}, header ks_api_t: "
                      f"{[f for f, _ in header.structs['ks_api_t']]}")
    else:
        for (f, t), (_, gt) in zip(header.structs["ks_api_t"], table):
            if t != gt:
                errors.append(f"{where}: ks_api_t.{f} is {gt}, header: {t}")
    tfields = dict(table)
    for fn, sig in header.functions.items():
        got = direct.get(fn, tfields.get(fn[3:]))
        if got is None:
            errors.append(f"{where}: {fn} is declared neither in DIRECT_FUNCTIONS nor in API_FIELDS")
        elif got != sig:
            errors.append(f"{where}: {fn} is {got}, header: {sig}")
    structs = {}
    for m in re.finditer(r"koffi\.struct\(\s*'(\w+)'\s*,\s*\{(.*?)\}\s*\)", src, re.S):
        fields = []
        for fm in re.finditer(KOFFI_MEMBER, m.group(2)):
            f, plain, arr_t, arr_n, ident = fm.groups()
            if plain is not None:
                t = ctype(plain)[1]
            elif arr_t is not None:
                t = f"[{ctype(arr_t)[1]}; {arr_n}]"
            else:
                t = ident
            fields.append((f, t))
        structs[m.group(1)] = fields
    structs.pop("ks_api_t", None)  # built from API_FIELDS, checked above
    header_structs = {k: v for k, v in header.structs.items() if k != "ks_api_t"}
    sub = Header.__new__(Header)
    sub.structs = header_structs
    errors += _compare_structs(sub, structs, where, "koffi.struct")
    consts = {n: int(v) for n, v in re.findall(r"\b((?:KS|kDL)\w*)\s*:\s*(-?\d+)", src)}
    errors += _compare_enums(header, consts, where)
    return errors


# ---- Python (ctypes) ---------------------------------------------------------------------------


def _erase(t: str) -> str:
    """ctypes has no const and passes option structs as void pointers: '*const *mut DLTensor' ->
    '**DLTensor', '*const ks_rms_norm_options' -> '*void'."""
    if t.startswith("fn("):
        return "*void"
    stars = len(re.findall(r"\*(?:const|mut) ", t))
    base = re.sub(r"\*(?:const|mut) ", "", t)
    if stars and base not in ("DLTensor", "char", "i32", "i64", "usize", "void"):
        base = "void"
    return "*" * stars + base


def _ctype_name(ct) -> str:
    import ctypes

    if ct is None:
        return "void"
    if ct is ctypes.c_void_p:
        return "*void"
    if ct is ctypes.c_char_p:
        return "*char"
    simple = {ctypes.c_int32: "i32", ctypes.c_int64: "i64", ctypes.c_uint64: "u64", ctypes.c_uint8: "u8",
              ctypes.c_uint16: "u16", ctypes.c_size_t: "usize", ctypes.c_float: "f32", ctypes.c_double: "f64"}
    for k, v in simple.items():
        if ct is k:
            return v
    if hasattr(ct, "_type_") and issubclass(ct, ctypes._Pointer):
        return "*" + _ctype_name(ct._type_)
    return ct.__name__


def check_python(header: Header, now: dict, path: Path = PY_ABI) -> list[str]:
    """ks.capi's ctypes mirror: prototypes (types with const erased, option pointers as void *),
    struct layouts, the table's fields and the constants."""
    import importlib.util

    if not path.exists():
        return [f"{_rel(path)} is missing"]
    spec = importlib.util.spec_from_file_location("_ks_capi_abi", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    where = _rel(path)
    errors = []
    for fn, sig in header.functions.items():
        if fn not in mod.FUNCTIONS:
            errors.append(f"{where}: no prototype of {fn}")
            continue
        m = re.fullmatch(r"fn\((.*)\) -> (.+)", sig)
        want = [_erase(p) for p in _split_top(m.group(1))] + [_erase(m.group(2))]
        res, args = mod.FUNCTIONS[fn]
        got = [_ctype_name(a) for a in args] + [_ctype_name(res)]
        if got != want:
            errors.append(f"{where}: {fn} is ({', '.join(got[:-1])}) -> {got[-1]}, header (const erased): "
                          f"({', '.join(want[:-1])}) -> {want[-1]}")
    classes = {"DLDevice": mod.DLDevice, "DLDataType": mod.DLDataType, "DLTensor": mod.DLTensor,
               "ks_api_t": mod.ApiTable}
    for op, cls in mod.OPTIONS.items():
        params = re.fullmatch(r"fn\((.*)\) -> .+", header.functions[f"ks_{op}"]).group(1)
        opt = [p for p in _split_top(params) if p.endswith("_options")]
        if len(opt) != 1:
            errors.append(f"{where}: OPTIONS[{op!r}] given, but ks_{op} takes no option struct")
            continue
        cname = opt[0].split()[-1]
        if classes.setdefault(cname, cls) is not cls:
            errors.append(f"{where}: {cname} mirrored by two classes ({classes[cname].__name__}, {cls.__name__})")
    for name in header.structs:
        if name not in classes:
            errors.append(f"{where}: no ctypes mirror of {name}")
            continue
        cls, lay = classes[name], now["structs"][name]
        got = [(f, getattr(cls, f).offset, getattr(cls, f).size) for f, *_ in cls._fields_]
        want = [(f, off, size) for f, off, size, _ in lay["fields"]]
        if got != want or __import__("ctypes").sizeof(cls) != lay["size"]:
            errors.append(f"{where}: {cls.__name__} layout {got} ({__import__('ctypes').sizeof(cls)} bytes), "
                          f"{name}: {want} ({lay['size']} bytes)")
    for name, v in header.enums.items():
        if name.startswith("KS_OP_"):
            got = mod.OPS.get(name[6:].lower())
        elif name.startswith("KS_ERR_") or name == "KS_OK":
            got = {n: c for c, n in mod.STATUS.items()}.get(name)
        else:
            continue
        if got != v:
            errors.append(f"{where}: {name} = {got}, header: {v}")
    return errors


# ---- main --------------------------------------------------------------------------------------


def run_checks(header_path: Path = HEADER, cc: str = "gcc") -> list[str]:
    header = Header(header_path.read_text())
    now = snapshot(header, cc)
    return (check_layout(header, now) + check_table(header) + check_rust(header) + check_go(header)
            + check_node(header) + check_python(header, now))


def update(header_path: Path = HEADER, cc: str = "gcc") -> list[str]:
    header = Header(header_path.read_text())
    now = snapshot(header, cc)
    major, minor = header.version
    path = ABI_DIR / f"abi-{major}.json"
    if path.exists():
        frozen = json.loads(path.read_text())
        bad, added = compare_frozen(frozen, now)
        if bad:
            return [f"refusing to update ABI {major}: {b}" for b in bad]
        if added and minor <= frozen["minor"]:
            return [f"refusing to update ABI {major}: {a} needs KS_ABI_VERSION_MINOR > {frozen['minor']}"
                    for a in added]
        if minor < frozen["minor"]:
            return [f"refusing to update ABI {major}: minor {minor} < frozen {frozen['minor']}"]
    tmp = path.with_suffix(".json.tmp")
    text = json.dumps(now, indent=1)
    # one field per line: [name, offset, size, type]
    text = re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
    tmp.write_text(text + "\n")
    os.replace(tmp, path)
    print(f"wrote {_rel(path)} (ABI {major}.{minor})")
    return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--update", action="store_true", help="freeze the header's layout for its major version")
    ap.add_argument("--cc", default=os.environ.get("CC", "gcc"))
    args = ap.parse_args(argv)
    problems = update(cc=args.cc) if args.update else run_checks(cc=args.cc)
    for p in problems:
        print(p, file=sys.stderr)
    if not problems and not args.update:
        h = Header(HEADER.read_text())
        print(f"ABI {h.version[0]}.{h.version[1]}: {len(h.functions)} functions, {len(h.structs)} structs, "
              f"{len(h.enums)} constants; layout frozen; Rust, Go, Node and Python bindings agree")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
