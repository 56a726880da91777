"""Node/TypeScript: the marked blocks of capi/bindings/node/index.js (constants, koffi structs and
prototypes, the ops whose arguments are each one tensor, integer, options or stream, their exports)
and index.d.ts (op names, option interfaces, the ops' typings)."""
from __future__ import annotations

from . import ops as D
from .c import functions
from .schema import Function, Param, lower_camel
from .text import fill

W = 120
TS_FIELD = {"float": "number", "double": "number", "int32_t": "number", "int64_t": "number | bigint"}


def generated_ops() -> list[Function]:
    return [f for f in D.OPS if "node" in f.bind]


def _koffi_decl(f: Function, name: str) -> str:
    ret = f.ret if f.ret.endswith("*") else f.ret + " "
    params = [("_Out_ " if p.out_value else "") + p.decl() for p in f.params] or ["void"]
    return f"{ret}{name}({', '.join(params)})"


def _obj(name: str, items: list[tuple[str, int]]) -> list[str]:
    return [f"const {name} = {{"] + [f"  {k}: {v}," for k, v in items] + ["};"]


def _defaulted(f: Function) -> set[str]:
    """Parameters after the last required tensor or scalar: optional tensors, options, stream default to null."""
    last = max(i for i, p in enumerate(f.params) if (p.is_tensor and not p.optional) or p.kind == "scalar")
    return {p.name for p in f.params[last + 1:]}


def _js_param(p: Param, defaulted: set[str]) -> str:
    name = {"options": "opts", "stream": "stream"}.get(p.kind, lower_camel(p.name))
    return f"{name} = null" if p.name in defaulted else name


def _js_arg(f: Function, p: Param) -> str:
    if p.is_tensor:
        return f"dl({lower_camel(p.name)}, '{p.name}')"
    if p.kind == "scalar":
        return lower_camel(p.name)
    if p.kind == "options":
        return f"options('{f.name}', opts)"
    if p.kind == "stream":
        return "stream"
    raise SystemExit(f"{f.name}: parameter {p.name} ({p.kind}) has no generated Node wrapper: bind it by hand")


def jsdoc(text: str) -> list[str]:
    """/** text */ filled to 120 columns."""
    return fill("/** ", text.split(), " */", W, " * ", sep=" ", trail=False)


def js_op(f: Function) -> list[str]:
    d = _defaulted(f)
    out = jsdoc(f.doc) + fill(f"function {lower_camel(f.name)}(", [_js_param(p, d) for p in f.params], ") {", W, "  ")
    out += fill(f"  check(f().{f.name}(", [_js_arg(f, p) for p in f.params], "));", W, "    ")
    out.append("}")
    return out


def index_js_blocks() -> dict[str, str]:
    ops = [f for f in D.OPS if f.op_id is not None]
    consts = [f"const ABI_MAJOR = {D.ABI_MAJOR};", f"const ABI_MINOR = {D.ABI_MINOR};", ""]
    consts += ["// ---- constants (kernelset.h)"] + _obj("STATUS", [(s.name, s.value) for s in D.STATUSES]) + [""]
    consts += _obj("OPS", [(f.op_const, f.op_id) for f in ops]) + [""]
    consts += _obj("OPTION_VALUES", [c for e in D.ENUMS for c in e.constants()])
    types = ["const OPTION_TYPES = {"]
    for s in D.OPTION_STRUCTS:
        members = ["size: 'size_t'"] + [
            f"{f.name}: koffi.array('{f.base}', {f.length}, 'Array')" if f.length else f"{f.name}: '{f.ctype}'"
            for f in s.fields]
        one = f"  {s.name}: koffi.struct('{s.name}', {{ {', '.join(members)} }}),"
        if len(one) <= W:
            types.append(one)
        else:
            types.append(f"  {s.name}: koffi.struct('{s.name}', {{")
            types += fill("    ", members, ",", W, "    ")
            types.append("  }),")
    types.append("};")
    fns = ["// Functions called as symbols: the table's entry point and what the table does not hold.",
           "const DIRECT_FUNCTIONS = ["]
    fns += [f"  '{_koffi_decl(f, f.c_name)}'," for f in functions() if not f.table]
    fns += ["];", "", "// ks_api_t, field by field.", "const API_FIELDS = [",
            "  'size_t size',", "  'int32_t abi_major',", "  'int32_t abi_minor',"]
    fns += [f"  '{_koffi_decl(f, f.name)}'," for f in functions() if f.table]
    fns.append("];")
    opts = ["const OPTIONS_OF = {"] + [f"  {f.name}: '{f.options.name}'," for f in ops if f.options] + ["};"]
    body = []
    for f in generated_ops():
        if body:
            body.append("")
        body += js_op(f)
    exports = [f"  {lower_camel(f.name)}," for f in generated_ops()]
    return {name: "\n".join(lines) + "\n" for name, lines in (
        ("constants", consts), ("option types", types), ("functions", fns), ("options of", opts),
        ("ops", body), ("exports", exports))}


def _ts_param(f: Function, p: Param, defaulted: set[str]) -> str:
    opt = "?" if p.name in defaulted else ""
    if p.is_tensor:
        return f"{lower_camel(p.name)}{opt}: {'OptT' if p.optional else 'T'}"
    if p.kind == "scalar":
        return f"{lower_camel(p.name)}{opt}: Int"
    if p.kind == "options":
        return f"options?: {f.options.camel} | null"
    return "stream?: Stream"


def index_dts_blocks() -> dict[str, str]:
    ops = [f for f in D.OPS if f.op_id is not None]
    names = fill("  | ", [f"'{f.name}'" for f in ops], ";", W, "  | ", sep=" | ", trail=False)
    names = ["export type OpName ="] + names
    opts = []
    for s in D.OPTION_STRUCTS:
        users = ", ".join(f.name for f in D.OPS if f.options is s)
        opts.append(f"/** {s.name}: {users} */")
        members = [f"{f.name}?: " + (f"[{', '.join(['number'] * f.length)}]" if f.length else TS_FIELD[f.base])
                   for f in s.fields]
        one = f"export interface {s.camel} {{ {'; '.join(members)} }}"
        if len(one) <= W:
            opts.append(one)
        else:
            opts.append(f"export interface {s.camel} {{")
            opts += fill("  ", members, ";", W, "  ", sep="; ")
            opts.append("}")
    opts += fill("export type AnyOptions = ", [s.camel for s in D.OPTION_STRUCTS], ";", W, "  | ", sep=" | ",
                 trail=False)
    decls = []
    for f in generated_ops():
        d = _defaulted(f)
        decls += jsdoc(f.doc)
        decls += fill(f"export declare function {lower_camel(f.name)}(", [_ts_param(f, p, d) for p in f.params],
                      "): void;", W, "  ")
    return {"op names": "\n".join(names) + "\n", "options": "\n".join(opts) + "\n", "ops": "\n".join(decls) + "\n"}


def golden_test_blocks() -> dict[str, str]:
    """test/golden.test.js: each generated op's call from a golden case (tensors by name, scalars, options)."""
    out = ["const GENERATED_CALLS = {"]
    for f in generated_ops():
        args = []
        for p in f.params:
            if p.is_tensor:
                args.append(f"t.{p.name}")
            elif p.kind == "scalar":
                args.append(f"sc.{p.name}")
            elif p.kind == "options":
                args.append("o")
        out += fill(f"  {f.name}: (t, o, sc) => ks.{lower_camel(f.name)}(", args, "),", W, "    ")
    out.append("};")
    return {"calls": "\n".join(out) + "\n"}
