#!/usr/bin/env python3
"""Compile kernelset's Triton kernels ahead of time and emit the C tables of libkernelset.so.

    python capi/aot/generate.py [--out capi/generated] [--set test|full|none] [--jobs N]
                                [--archs 80,89,90] [--ptx 89,90] [--force]

Steps (capi/aot/README.md has the design):
1. translate each op's launch policy (a pure Python function of the package) to C (transpile.py);
2. run each op's Python launcher on meta tensors over the set's cases and record the kernel
   launches it makes (record.py): the distinct (kernel, dtypes, None pointers, constexprs, warps,
   stages, specialization) are the variants. A variant is exact (the specialization Triton's JIT
   makes for those arguments: pointer alignment, ints equal to 1 or divisible by 16, i.e. the
   Python path's machine code) or a fallback (align16: pointers aligned and the kernel's
   align_ints divisible by 16; unaligned: no assumption). The test set compiles each case's exact
   variant (a fallback for cases marked ``generic``); the full set both kinds;
3. compile every variant with triton.compile for an explicit GPUTarget per arch (no GPU needed):
   a cubin per arch, and one PTX for newer GPUs to JIT: Triton's sm_90a PTX retargeted to plain
   sm_90 when ptxas accepts it that way, else (wgmma: tl.dot kernels) the sm_89 PTX;
4. emit ks_cuda_blobs.c (images, variant table), ks_cuda_ops.c/.h (translated policies, keyed
   variant lookup, ks_cuda_<op>_plan / _query / _launch), manifest.json, and hash.txt, the content
   hash of everything that went in; when it matches, the generator stops at once ("up to date").

The set ``none`` compiles nothing: the tables are empty and every plan answers
KS_ERR_NOT_IMPLEMENTED (a build where Triton's NVIDIA backend is unusable).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SRC = os.path.join(ROOT, "src")

ROLE = {"ptr": 0, "int": 1, "float": 2, "constexpr": 3}
KIND = {"ptr": 0, "i32": 1, "i64": 2, "f32": 3}
KEY_NONE = "INT64_MIN"


def _setup_path() -> None:
    for p in (HERE, SRC):
        if p not in sys.path:
            sys.path.insert(0, p)


# ---------------------------------------------------------------------------------------------
# content hash

def input_hash(args) -> str:
    h = hashlib.sha256()
    files = []
    for base in (HERE, os.path.join(SRC, "kernelset", "ops"), os.path.join(SRC, "kernelset", "core"),
                 os.path.join(ROOT, "capi", "src", "cuda")):
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith((".py", ".h"))]
    for f in files:
        h.update(os.path.relpath(f, ROOT).encode())
        with open(f, "rb") as fh:
            h.update(hashlib.sha256(fh.read()).digest())
    try:
        import triton
        h.update(f"triton {triton.__version__}".encode())
        from triton.backends.nvidia.compiler import get_ptxas
        h.update(get_ptxas(90).version.encode() if hasattr(get_ptxas(90), "version") else b"")
    except Exception as exc:  # no NVIDIA backend: only --set none can run; hash what we know
        h.update(f"triton unusable: {type(exc).__name__}".encode())
    h.update(json.dumps([args.set, args.archs, args.ptx, args.models]).encode())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# recording and variants

# The key of a kernel specialization (capi/src/cuda/ks_cuda.h): one slot per pointer parameter
# (its KS_DT_*, or None), one per constexpr (its value), one "spec" slot per pointer and per int
# parameter, then num_warps, num_stages, fp_fusion and the mode:
#   MODE_EXACT: the specialization Triton's JIT makes for these very arguments (the Python path's
#     machine code): spec = 1 for a 16-byte aligned pointer (0 not, SPEC_ANY for None); for an
#     int, 2 when it equals 1 (the JIT makes it a constexpr), 1 when divisible by 16, else 0;
#   MODE_ALIGNED / MODE_UNALIGNED: the fallback when no exact variant is compiled in: every
#     pointer 16-byte aligned and the kernel's align_ints divisible by 16 (or no assumption);
#     spec slots SPEC_ANY.
MODE_UNALIGNED, MODE_ALIGNED, MODE_EXACT = 0, 1, 2
SPEC_ANY = -1


def int_class(v: int) -> int:
    """Triton's JIT specialization of an int argument (native_specialize_impl): 2 = equals 1,
    1 = divisible by 16, 0 = neither."""
    return 2 if v == 1 else 1 if v % 16 == 0 else 0


@dataclasses.dataclass
class Variant:
    kernel: int  # index into kernels
    params: list  # [name, role, value for the compiler (dtype string / None / constexpr value)]
    num_warps: int
    num_stages: int
    fp_fusion: int
    mode: int  # MODE_*
    spec_slots: tuple = ()  # per pointer and int parameter, in order (MODE_EXACT), else SPEC_ANY
    key: tuple = ()
    index: int = -1
    images: list = dataclasses.field(default_factory=list)
    kinds: list = dataclasses.field(default_factory=list)  # PTX parameter kinds, hidden included
    num_user: int = 0
    entry: str = ""
    notes: list = dataclasses.field(default_factory=list)
    stages_compiled: int = 0  # num_stages Triton used (the key's -1 is "Triton's default")
    seconds: float = 0.0  # compile time over all archs
    ptx: list = dataclasses.field(default_factory=list)  # forward-compatible PTX candidates, one per PTX arch

    def spec_of(self) -> dict:
        names = [n for n, role, _ in self.params if role in ("ptr", "int")]
        return dict(zip(names, self.spec_slots))

    def spec(self, names=None) -> str:
        """Readable, in Triton's notation for the exact mode: ``X:*bf16:16`` an aligned pointer,
        ``M:i32:16`` an int divisible by 16, ``M=1`` an int the JIT made a constexpr."""
        parts = []
        slots = self.spec_of()
        exact = self.mode == MODE_EXACT
        for name, role, v in self.params:
            if role == "ptr":
                parts.append(f"{name}:{'None' if v is None else '*' + v}" + (":16" if exact and slots[name] == 1 else ""))
            elif role == "constexpr":
                parts.append(f"{name}={v!r}")
            elif role == "int" and exact:
                parts.append(f"{name}=1" if slots[name] == 2 else f"{name}:i32" + (":16" if slots[name] else ""))
        parts.append(f"num_warps={self.num_warps}")
        parts.append(f"num_stages={'default' if self.num_stages < 0 else self.num_stages}")
        if not self.fp_fusion:
            parts.append("fp_fusion=off")
        parts.append({MODE_EXACT: "exact", MODE_ALIGNED: "align16", MODE_UNALIGNED: "unaligned"}[self.mode])
        return " ".join(parts)


def record_op(op, case: dict) -> list[dict]:
    from record import describe, recording
    modules = tuple(importlib.import_module(m) for m in op.modules)
    with recording(sms=case.get("sms", 132), modules=modules, cc=case.get("cc", 90)) as launches:
        tensors = op.python(case)
    names = {id(t): n for n, t in tensors.items() if t is not None}
    return [describe(ln, names) for ln in launches]


def launch_aligned(ln: dict, kref, case: dict) -> int:
    """The fallback mode ks_cuda_plan_add computes for this launch (test addresses: every tensor
    16-byte aligned unless the case misaligns it)."""
    bad = set(case.get("misalign", ()))
    for name, is_const, kind, value, dtype in ln["params"]:
        if kind == "tensor" and value in bad:
            return MODE_UNALIGNED
        if kind == "int" and not is_const and name in kref.align_ints and value % 16:
            return MODE_UNALIGNED
    return MODE_ALIGNED


def launch_spec(ln: dict, roles: list[tuple[str, str]], case: dict) -> tuple:
    """The exact (JIT) spec slots of this launch, for pointer and int parameters in order."""
    bad = set(case.get("misalign", ()))
    slots = []
    for (name, is_const, kind, value, dtype), (_, role) in zip(ln["params"], roles):
        if role == "ptr":
            slots.append(SPEC_ANY if kind == "none" else 0 if value in bad else 1)
        elif role == "int":
            slots.append(int_class(value))
    return tuple(slots)


def kernel_roles(recorded: list[dict]) -> dict[tuple, list[tuple[str, str]]]:
    """(module, kernel) -> [(param, role)], from every recorded launch of it (a parameter passed a
    tensor or only ever None is a pointer)."""
    seen: dict[tuple, dict] = {}
    for ln in recorded:
        k = (ln["module"], ln["kernel"])
        table = seen.setdefault(k, {"order": [p[0] for p in ln["params"]], "kinds": {}})
        if [p[0] for p in ln["params"]] != table["order"]:
            raise RuntimeError(f"{k}: parameter list changed between launches")
        for name, is_const, kind, _, _ in ln["params"]:
            table["kinds"].setdefault(name, set()).add("constexpr" if is_const else kind)
    out = {}
    for k, table in seen.items():
        roles = []
        for name in table["order"]:
            kinds = table["kinds"][name]
            if "constexpr" in kinds:
                role = "constexpr"
            elif kinds <= {"tensor", "none"}:
                role = "ptr"
            elif kinds == {"int"}:
                role = "int"
            elif kinds == {"float"}:
                role = "float"
            else:
                raise RuntimeError(f"{k[1]}.{name}: launches pass {sorted(kinds)}; the C ABI needs one type")
            roles.append((name, role))
        out[k] = roles
    return out


def constexpr_key(v) -> str | int:
    if v is None:
        return KEY_NONE
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    raise RuntimeError(f"constexpr value {v!r}: the C key holds ints, bools and None only")


def variants_of(launch: dict, kernel: int, roles: list[tuple[str, str]], modes: list[tuple[int, tuple]]) -> list[Variant]:
    """The variants of a recorded launch in the given (mode, spec slots) specializations."""
    params = []
    for (name, is_const, kind, value, dtype), (rname, role) in zip(launch["params"], roles):
        assert name == rname
        if role == "ptr":
            params.append([name, role, dtype if kind == "tensor" else None])
        elif role == "constexpr":
            params.append([name, role, value])
        else:
            params.append([name, role, None])
    n_spec = sum(1 for _, role in roles if role in ("ptr", "int"))
    out = []
    for mode, slots in modes:
        v = Variant(kernel, params, launch["num_warps"], launch["num_stages"], launch["fp_fusion"], mode,
                    slots if mode == MODE_EXACT else (SPEC_ANY,) * n_spec)
        v.key = variant_key(v)
        out.append(v)
    return out


def variant_key(v: Variant) -> tuple:
    from record import DT_BY_NAME
    key = []
    for name, role, value in v.params:
        if role == "ptr":
            key.append(KEY_NONE if value is None else DT_BY_NAME[value])
        elif role == "constexpr":
            key.append(constexpr_key(value))
    return tuple(key) + tuple(v.spec_slots) + (v.num_warps, v.num_stages, v.fp_fusion, v.mode)


def _sort_key(key: tuple) -> tuple:
    return tuple(-(2**63) if k == KEY_NONE else k for k in key)


# ---------------------------------------------------------------------------------------------
# compiling (worker processes)

def _worker_init() -> None:
    os.environ.pop("TRITON_INTERPRET", None)
    # Line info only grows the binaries: the SASS is the same with or without it (checked with
    # nvdisasm when this was written); the Python path keeps it for its profiler views.
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    _setup_path()
    try:
        from triton import knobs
        knobs.compilation.disable_line_info = True
    except (ImportError, AttributeError):  # older Triton reads the environment variable
        pass


def _ptx_params(ptx: str, entry: str) -> list[str]:
    m = re.search(r"\.entry\s+" + re.escape(entry) + r"\s*\((.*?)\)", ptx, re.S)
    if not m:
        raise RuntimeError(f"no .entry {entry} in the PTX")
    kinds = []
    for ty, ptr in re.findall(r"\.param\s+\.(\w+)((?:\s+\.ptr)?)", m.group(1)):
        if ptr.strip():
            kinds.append("ptr")
        elif ty in ("u64", "b64", "s64"):
            kinds.append("i64")
        elif ty in ("u32", "b32", "s32"):
            kinds.append("i32")
        elif ty == "f32":
            kinds.append("f32")
        else:
            raise RuntimeError(f"PTX parameter type .{ty} is not one the launcher passes")
    return kinds


def compile_inputs(task: dict) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) for triton.compile of a variant (by parameter name; attrs by
    parameter index): for MODE_EXACT, what Triton's JIT derives from the same arguments."""
    sig, consts, attrs = {}, {}, {}
    exact = task["mode"] == MODE_EXACT
    slots = dict(task["spec"])  # exact: per pointer / int parameter, as Triton's JIT specializes
    div16 = [["tt.divisibility", 16]]
    for i, (name, role, value) in enumerate(task["params"]):
        if role == "constexpr":
            sig[name] = "constexpr"
            consts[name] = value
        elif role == "ptr":
            if value is None:
                sig[name] = "constexpr"
                consts[name] = None
            else:
                sig[name] = "*" + value
                if (slots[name] == 1) if exact else task["mode"] == MODE_ALIGNED:
                    attrs[(i,)] = div16
        elif role == "int":
            if exact and slots[name] == 2:  # the JIT passes an int equal to 1 as a constexpr
                sig[name] = "constexpr"
                consts[name] = 1
                continue
            sig[name] = "i32"
            if (slots[name] == 1) if exact else (task["mode"] == MODE_ALIGNED and name in task["align_ints"]):
                attrs[(i,)] = div16
        else:
            sig[name] = "fp32"
    return sig, consts, attrs


def compile_task(task: dict) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    t0 = time.time()
    fn = getattr(importlib.import_module(task["module"]), task["kernel"])
    sig, consts, attrs = compile_inputs(task)
    opts = {"num_warps": task["num_warps"]}
    if task["num_stages"] >= 0:
        opts["num_stages"] = task["num_stages"]
    opts["enable_fp_fusion"] = bool(task["fp_fusion"])  # explicit, as FastKernel passes it
    out = dict(arch=task["arch"], variant=task["variant"], error=None)
    try:
        k = triton.compile(ASTSource(fn, signature=sig, constexprs=consts, attrs=attrs),
                           target=GPUTarget("cuda", task["arch"], 32), options=opts)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        out["seconds"] = time.time() - t0
        return out
    md = k.metadata
    bad = {f: getattr(md, f, 0) for f in ("global_scratch_size", "profile_scratch_size", "tmem_size")
           if getattr(md, f, 0)}
    if getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_cooperative_grid", False) or \
            getattr(md, "launch_pdl", False) or getattr(md, "tensordesc_meta", None) or bad:
        raise RuntimeError(f"{task['kernel']}: needs a launch feature the C launcher does not implement "
                           f"(clusters, cooperative/PDL launch, TMA descriptors or scratch {bad})")
    ptx = k.asm["ptx"]
    out.update(entry=md.name, shared=int(md.shared), num_warps=int(md.num_warps), num_stages=int(md.num_stages),
               cubin=bytes(k.asm["cubin"]), params=_ptx_params(ptx, md.name),
               triton=getattr(md, "triton_version", triton.__version__))
    if task["arch"] in task["ptx_archs"]:
        if task["arch"] >= 90:
            # Triton targets sm_90a (arch-specific, not forward compatible); plain sm_90 PTX can be
            # JIT-compiled by any newer GPU, and ptxas proves the kernel needs nothing of sm_90a.
            plain = re.sub(r"^(\.target\s+sm_\d+)a\b", r"\1", ptx, count=1, flags=re.M)
            ok, why = _ptxas_accepts(plain, task["arch"])
            out["ptx"] = plain if ok else None
            out["ptx_note"] = None if ok else f"sm_{task['arch']} PTX dropped: needs sm_{task['arch']}a ({why})"
        else:
            out["ptx"] = ptx
    out["seconds"] = time.time() - t0
    return out


def _ptxas_accepts(ptx: str, arch: int) -> tuple[bool, str]:
    from triton.backends.nvidia.compiler import get_ptxas
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        r = subprocess.run([get_ptxas(arch).path, f"--gpu-name=sm_{arch}", src, "-o", os.path.join(d, "k.o")],
                           capture_output=True, text=True)
    return r.returncode == 0, (r.stderr.strip().splitlines() or [""])[0]


# ---------------------------------------------------------------------------------------------
# C emission

def c_bytes(data: bytes, width: int = 100) -> str:
    """A C string literal (split in lines) holding data; 3-digit octal escapes, no '?' (trigraphs)."""
    lines, cur = [], []
    n = 0
    for b in data:
        if 32 <= b < 127 and b not in (34, 92, 63):
            s = chr(b)
        else:
            s = "\\%03o" % b
        cur.append(s)
        n += len(s)
        if n >= width:
            lines.append('"' + "".join(cur) + '"')
            cur, n = [], 0
    if cur or not lines:
        lines.append('"' + "".join(cur) + '"')
    return "\n    ".join(lines)


HEADER = "/* Generated by capi/aot/generate.py from kernelset's Python sources. Do not edit. */\n"


def c_ident(name: str) -> str:
    return re.sub(r"\W", "_", name).strip("_")


def emit(out_dir: str, ops, policies, helper_cache, prelude: str, kernels, roles_by_kernel, variants, enums,
         meta: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
    # ---- ks_cuda_ops.h
    h = [HEADER, "#ifndef KS_CUDA_OPS_H_\n#define KS_CUDA_OPS_H_\n\n#include \"ks_cuda.h\"\n\n",
         "/* Every op has three entry points taking the same parameters after the leading ones:\n"
         " *   _plan(plan, sms, cc, err, errlen, ...): what the Python launcher would launch on a GPU with\n"
         " *     `sms` multiprocessors and compute capability `cc` (no CUDA call);\n"
         " *   _query(device, err, errlen, ...): the dry run of ks_query_support (plan for the device, then\n"
         " *     ks_cuda_plan_check: compiled variant, image for its arch, shared memory);\n"
         " *   _launch(device, stream, err, errlen, ...): plan and launch on `stream` (NULL: legacy stream).\n"
         " * Pointers are device addresses (NULL: an absent optional tensor); dtypes are KS_DT_*; strides in\n"
         " * elements. capi/aot/README.md documents each op's parameters and the Python op it serves. */\n\n"]
    for mod, attr, prefix, values in enums:
        h.append(f"/* {mod}.{attr} */\nenum {{\n")
        h += [f"  {prefix}{c_ident(k).upper()} = {v},\n" for k, v in values.items()]
        h.append("};\n\n")
    structs: dict = {}  # dataclass -> the struct of the first policy returning it (the others alias it)
    for p in policies:
        first = structs.setdefault(p.returns, p) if p.returns is not None else p
        if first is p:
            h.append(p.struct + "\n")
        else:
            h.append(f"typedef {first.struct_name} {p.struct_name}; /* {p.returns.__name__} */\n")
        h.append(f"int {p.c_name}({', '.join(['int64_t ' + x for x in p.params] + [p.struct_name + ' *out'])});\n\n")
    for op in ops:
        params = ", ".join(f"{t}{'' if t.endswith('*') else ' '}{n}" for t, n in op.c_params)
        h.append(f"/* {op.doc}\n * Mirrors {op.launcher}; kernels: {', '.join(k.name for k in op.kernels)}. */\n")
        h.append(f"ks_status_t ks_cuda_{op.name}_plan(ks_cuda_plan *plan, int64_t sms, int64_t cc, char *err,\n"
                 f"    size_t errlen, {params});\n")
        h.append(f"ks_status_t ks_cuda_{op.name}_query(int device, char *err, size_t errlen,\n    {params});\n")
        h.append(f"ks_status_t ks_cuda_{op.name}_launch(int device, ks_stream_t stream, char *err, size_t errlen,\n"
                 f"    {params});\n")
        if op.c_decls():
            h.append(op.c_decls().strip("\n") + "\n")
        h.append("\n")
    h.append("#endif /* KS_CUDA_OPS_H_ */\n")
    _write(os.path.join(out_dir, "ks_cuda_ops.h"), "".join(h))

    # ---- ks_cuda_ops.c
    c = [HEADER, "#include <string.h>\n\n#include \"ks_cuda_ops.h\"\n", prelude, "\n"]
    from transpile import helpers_c
    c.append(helpers_c(helper_cache).replace("int *err) {\n", "int *err) {\n  (void)err;\n") + "\n")
    for p in policies:
        c.append(p.function + "\n")
    c.append(r"""static ks_status_t ks_gen_invalid(char *err, size_t errlen, const char *what) {
  ks_cuda_errorf(err, errlen, "%s", what);
  return KS_ERR_INVALID_ARGUMENT;
}
static ks_status_t ks_gen_policy_failed(char *err, size_t errlen, const char *policy) {
  ks_cuda_errorf(err, errlen, "internal: the launch policy %s divided by zero (Python would raise)", policy);
  return KS_ERR_INTERNAL;
}
static int64_t ks_gen_cdiv(int64_t a, int64_t b) { return b > 0 ? (a + b - 1) / b : 0; }
static int64_t ks_gen_align256(int64_t n) { return (n + 255) / 256 * 256; }
static int64_t ks_gen_pow2(int64_t n) { /* Python's 1 << max(0, (n - 1).bit_length()) */
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

""")
    # kernel infos
    by_kernel: dict[int, list[Variant]] = {}
    for v in variants:
        by_kernel.setdefault(v.kernel, []).append(v)
    infos = []
    for ki, kref in enumerate(kernels):
        roles = roles_by_kernel[(kref.module, kref.name)]
        ident = c_ident(kref.name)
        names = ", ".join(f'"{n}"' for n, _ in roles)
        c.append(f"static const char *const ks_pn_{ident}[] = {{{names}}};\n")
        c.append(f"static const uint8_t ks_pr_{ident}[] = {{{', '.join(str(ROLE[r]) for _, r in roles)}}};\n")
        al = ", ".join("1" if (r == "int" and n in kref.align_ints) else "0" for n, r in roles)
        c.append(f"static const uint8_t ks_pa_{ident}[] = {{{al}}};\n")
        vs = sorted(by_kernel.get(ki, []), key=lambda v: _sort_key(v.key))
        key_len = sum(1 for _, r in roles if r in ("ptr", "constexpr")) + sum(1 for _, r in roles if r in ("ptr", "int")) + 4
        if vs:
            rows = ",\n  ".join(", ".join(str(k) for k in v.key) for v in vs)
            c.append(f"static const int64_t ks_keys_{ident}[] = {{\n  {rows}}};\n")
            c.append(f"static const int32_t ks_var_{ident}[] = {{{', '.join(str(v.index) for v in vs)}}};\n")
        infos.append(f'  {{"{kref.name}", "{kref.module}", {len(roles)}, ks_pn_{ident}, ks_pr_{ident}, ks_pa_{ident}, '
                     f'{key_len}, {len(vs)}, {"ks_keys_" + ident if vs else "NULL"}, '
                     f'{"ks_var_" + ident if vs else "NULL"}}}')
        # typed helper: one C parameter per Python parameter, in the kernel's order
        cparams = []
        inits = []
        for n, r in roles:
            if r == "ptr":
                cparams.append(f"const void *{n}, int32_t {n}_dt")
                inits.append(f"{{KS_ROLE_PTR, {n}_dt, {n}, 0, 0.0}}")
            elif r == "int":
                cparams.append(f"int64_t {n}")
                inits.append(f"{{KS_ROLE_INT, 0, NULL, {n}, 0.0}}")
            elif r == "float":
                cparams.append(f"double {n}")
                inits.append(f"{{KS_ROLE_FLOAT, 0, NULL, 0, {n}}}")
            else:
                cparams.append(f"int64_t {n}")
                inits.append(f"{{KS_ROLE_CONSTEXPR, 0, NULL, {n}, 0.0}}")
        c.append(f"\n/* {kref.module}.{kref.name}({', '.join(n for n, _ in roles)}) */\n"
                 f"static inline ks_status_t ks_k_{ident}(ks_cuda_plan *plan, char *err, size_t errlen, int64_t g0, "
                 f"int64_t g1, int64_t g2,\n    int64_t num_warps, int64_t num_stages, int64_t fp_fusion, "
                 f"{', '.join(cparams)}) {{\n"
                 f"  const ks_cuda_param p[{len(roles)}] = {{\n    " + ",\n    ".join(inits) + "};\n"
                 f"  return ks_cuda_plan_add(plan, {ki}, g0, g1, g2, num_warps, num_stages, fp_fusion, p, {len(roles)}, "
                 f"err, errlen);\n}}\n\n")
    c.append("const ks_kernel_info ks_cuda_kernels[] = {\n" + ",\n".join(infos) + "};\n")
    c.append(f"const int32_t ks_cuda_num_kernels = {len(kernels)};\n\n")
    for op in ops:
        params = ", ".join(f"{t}{'' if t.endswith('*') else ' '}{n}" for t, n in op.c_params)
        names = ", ".join(n for _, n in op.c_params)
        c.append(f"static ks_status_t ks_gen_{op.name}(ks_cuda_plan *plan, int64_t sms, int64_t cc, char *err,\n"
                 f"    size_t errlen, {params}) {{\n  (void)sms;\n  (void)cc;\n{op.c_body.strip(chr(10))}\n}}\n\n")
        c.append(f"ks_status_t ks_cuda_{op.name}_plan(ks_cuda_plan *plan, int64_t sms, int64_t cc, char *err,\n"
                 f"    size_t errlen, {params}) {{\n  memset(plan, 0, sizeof *plan);\n"
                 f"  ks_status_t s = ks_gen_{op.name}(plan, sms, cc, err, errlen, {names});\n"
                 f"  if (s == KS_OK && plan->missing) s = KS_ERR_NOT_IMPLEMENTED;\n  return s;\n}}\n\n")
        c.append(f"ks_status_t ks_cuda_{op.name}_query(int device, char *err, size_t errlen,\n"
                 f"    {params}) {{\n  ks_cuda_device_info dev;\n"
                 f"  ks_status_t s = ks_cuda_device(device, &dev, err, errlen);\n  if (s != KS_OK) return s;\n"
                 f"  ks_cuda_plan plan;\n"
                 f"  s = ks_cuda_{op.name}_plan(&plan, dev.sm_count, dev.cc, err, errlen, {names});\n"
                 f"  if (s != KS_OK) return s;\n  return ks_cuda_plan_check(&plan, &dev, err, errlen);\n}}\n\n")
        c.append(f"ks_status_t ks_cuda_{op.name}_launch(int device, ks_stream_t stream, char *err, size_t errlen,\n"
                 f"    {params}) {{\n  ks_cuda_device_info dev;\n"
                 f"  ks_status_t s = ks_cuda_device(device, &dev, err, errlen);\n  if (s != KS_OK) return s;\n"
                 f"  ks_cuda_plan plan;\n"
                 f"  s = ks_cuda_{op.name}_plan(&plan, dev.sm_count, dev.cc, err, errlen, {names});\n"
                 f"  if (s != KS_OK) return s;\n  return ks_cuda_plan_run(&plan, device, stream, err, errlen);\n}}\n\n")
        extra = op.c_defs()
        if extra:
            c.append(extra.strip("\n") + "\n\n")
    c.append(f'const char ks_cuda_build_archs[] = "{meta["archs_text"]}";\n')
    c.append(f'const char ks_cuda_build_hash[] = "{meta["hash"]}";\n')
    _write(os.path.join(out_dir, "ks_cuda_ops.c"), "".join(c))

    # ---- ks_cuda_blobs.c
    b = [HEADER, "#include \"ks_cuda.h\"\n\n"]
    blob_ids: dict[bytes, int] = {}
    for v in variants:
        for im in v.images:
            data = im["data"]
            if data not in blob_ids:
                blob_ids[data] = len(blob_ids)
                b.append(f"static const unsigned char ks_blob_{blob_ids[data]}[] =\n    {c_bytes(data)};\n")
            im["blob"] = blob_ids[data]
    rows = []
    for v in variants:
        ims = ", ".join(f"{{{im['arch']}, {im['kind']}, ks_blob_{im['blob']}, {len(im['data'])}, {im['shared']}}}"
                        for im in v.images)
        b.append(f"static const ks_kernel_image ks_im_{v.index}[] = {{{ims}}};\n")
        b.append(f"static const uint8_t ks_kind_{v.index}[] = {{{', '.join(str(KIND[k]) for k in v.kinds)}}};\n")
        spec = v.spec(None).replace("\\", "\\\\").replace('"', '\\"')
        rows.append(f'  {{{v.index}, {v.kernel}, "{v.entry}", "{spec}", {v.num_warps}, '
                    f'{v.stages_compiled}, 1, {len(v.kinds)}, {v.num_user}, ks_kind_{v.index}, {len(v.images)}, ks_im_{v.index}}}')
    if rows:
        b.append("\nconst ks_kernel_variant ks_cuda_variants[] = {\n" + ",\n".join(rows) + "};\n")
    else:
        b.append("\nconst ks_kernel_variant ks_cuda_variants[1] = {{0, 0, \"\", \"\", 0, 0, 0, 0, 0, NULL, 0, NULL}};\n")
    b.append(f"const int32_t ks_cuda_num_variants = {len(variants)};\n")
    _write(os.path.join(out_dir, "ks_cuda_blobs.c"), "".join(b))


def _write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "capi", "generated"))
    ap.add_argument("--set", default="test", choices=("test", "release", "full", "none"),
                    help="variants to compile: what the tests, the GPU check and the smoke program run (default); "
                         "release: the test set plus every shape of the known models (ops/models.py) on every known "
                         "GPU; full: every policy bucket (about 10k variants, impractical); none")
    ap.add_argument("--models", default="",
                    help="release set only: comma-separated preset names (kernelset.hf.presets) to build for, "
                         "instead of every preset")
    ap.add_argument("--archs", default="80,89,90", help="cubin architectures (sm_XY as XY)")
    ap.add_argument("--ptx", default="89,90",
                    help="PTX architectures: each variant embeds the PTX of the newest one that compiles to plain "
                         "(not sm_90a) PTX, which GPUs newer than every cubin JIT-compile")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--force", action="store_true", help="regenerate even if the content hash matches")
    ap.add_argument("--dump-cases", metavar="FILE",
                    help="only record: write every op's cases of --dump-sets with their C arguments and the Python "
                         "launcher's launches to FILE (JSON), then exit (tests compare these with the C plans)")
    ap.add_argument("--dump-sets", default="test,sweep")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET"):
        # Triton decides at import whether kernels are compiled or interpreted
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)] + (argv or sys.argv[1:]), env)
    _setup_path()
    if args.models:
        from ops import models as models_mod
        models_mod.select(args.models.split(","))
    if args.dump_cases:
        import ops as ops_mod
        dump = []
        for op in ops_mod.OPS:
            for which in args.dump_sets.split(","):
                for case in op.cases(which):
                    launches = record_op(op, case)
                    dump.append(dict(op=op.name, set=which, case=case, c_args=op.c_args(case), launches=launches,
                                     placed=op.placed(case, launches)))
        _write(args.dump_cases, json.dumps(dump))
        return 0
    t_start = time.time()
    archs = sorted({int(a) for a in args.archs.split(",") if a})
    ptx_archs = sorted({int(a) for a in args.ptx.split(",") if a})
    digest = input_hash(args)
    hash_file = os.path.join(args.out, "hash.txt")
    if not args.force and os.path.exists(hash_file) and open(hash_file).read().strip() == digest and \
            all(os.path.exists(os.path.join(args.out, f)) for f in ("ks_cuda_ops.c", "ks_cuda_ops.h", "ks_cuda_blobs.c")):
        print(f"capi/aot: {args.out} up to date ({digest[:12]})")
        return 0

    import ops as ops_mod
    from transpile import PRELUDE, translate

    # 1. policies
    helper_cache: dict = {}
    policies = []
    for op in ops_mod.OPS:
        for pref in op.policies:
            mod = importlib.import_module(pref.module)
            policies.append(translate(getattr(mod, pref.name), pref.c_name, pref.bind(mod), helper_cache,
                                      keep=pref.keep, tuples=pref.tuples, fields=pref.fields))
    enums = []
    for mod, attr, prefix in ops_mod.ENUMS:
        enums.append((mod, attr, prefix, dict(getattr(importlib.import_module(mod), attr))))

    # 2. record every set (roles), keep the chosen set's launches (variants)
    kernels = [k for op in ops_mod.OPS for k in op.kernels]
    kernel_index = {(k.module, k.name): i for i, k in enumerate(kernels)}
    recorded_all, chosen = [], []
    t0 = time.time()
    for op in ops_mod.OPS:
        for which in ("test", "full", "sweep") + (("release",) if args.set == "release" else ()):
            for case in op.cases(which):
                lns = record_op(op, case)
                for ln in lns:
                    if (ln["module"], ln["kernel"]) not in kernel_index:
                        raise RuntimeError(f"{op.launcher} launched {ln['kernel']}, not listed in ops.{op.name}.kernels")
                recorded_all += lns
                if which == args.set or (args.set == "release" and which == "test"):
                    chosen += [(ln, case, op, which) for ln in lns]
    roles = kernel_roles(recorded_all)
    for k in kernels:
        if (k.module, k.name) not in roles:
            raise RuntimeError(f"{k.name}: no case of any set launches it")
        names = {n for n, r in roles[(k.module, k.name)] if r == "int"}
        if set(k.align_ints) - names:
            raise RuntimeError(f"{k.name}: align_ints {sorted(set(k.align_ints) - names)} are not int parameters")
    t_record = time.time() - t0

    variants: dict[tuple, Variant] = {}
    for ln, case, op, which in chosen:
        ki = kernel_index[(ln["module"], ln["kernel"])]
        kroles = roles[(ln["module"], ln["kernel"])]
        # test set: each case's exact (JIT) specialization, or with "generic" the fallback its
        # alignment selects; full set: the exact one, and both fallbacks (any alignment)
        fallback = launch_aligned(ln, kernels[ki], case)
        if which == "release":
            # a model shape: the fallback its alignment allows (aligned model dimensions: align16),
            # which serves the same shapes at any batch, context and pointer (16-byte aligned)
            modes = [(fallback, ())]
        elif args.set == "full":
            modes = [(MODE_EXACT, launch_spec(ln, kroles, case)), (MODE_ALIGNED, ())]
            modes += [(MODE_UNALIGNED, ())] if op.both_aligns or fallback == MODE_UNALIGNED else []
        elif case.get("generic"):
            modes = [(fallback, ())]
        else:
            modes = [(MODE_EXACT, launch_spec(ln, kroles, case))]
        for v in variants_of(ln, ki, kroles, modes):
            variants.setdefault((ki, v.key), v)
    order = sorted(variants.values(), key=lambda v: (v.kernel, _sort_key(v.key)))
    for i, v in enumerate(order):
        v.index = i

    # 3. compile
    compile_archs = sorted(set(archs) | set(ptx_archs))
    tasks = []
    for v in order:
        kref = kernels[v.kernel]
        for arch in compile_archs:
            tasks.append(dict(module=kref.module, kernel=kref.name, params=v.params, mode=v.mode,
                              spec=list(v.spec_of().items()),
                              align_ints=list(kref.align_ints), num_warps=v.num_warps, num_stages=v.num_stages,
                              fp_fusion=v.fp_fusion, arch=arch, ptx_archs=ptx_archs, variant=v.index))
    t0 = time.time()
    results = []
    if tasks:
        if args.jobs > 1:
            import multiprocessing as mp
            with cf.ProcessPoolExecutor(max_workers=args.jobs, mp_context=mp.get_context("spawn"),
                                        initializer=_worker_init) as pool:
                results = list(pool.map(compile_task, tasks, chunksize=4))
        else:
            _worker_init()
            results = [compile_task(t) for t in tasks]
    t_compile = time.time() - t0
    cpu_seconds = sum(r["seconds"] for r in results)

    failures = []
    for r in results:
        v = order[r["variant"]]
        if r["error"]:
            v.notes.append(f"sm_{r['arch']}: {r['error']}")
            continue
        slots = v.spec_of()
        user = [("ptr" if role == "ptr" else "i32" if role == "int" else "f32")
                for name, role, val in v.params if role == "float" or (role == "ptr" and val is not None)
                or (role == "int" and not (v.mode == MODE_EXACT and slots[name] == 2))]
        kinds = r["params"]
        if kinds[:len(user)] != user or any(k != "ptr" for k in kinds[len(user):]):
            raise RuntimeError(f"{v.spec(None)}: PTX parameters {kinds} do not start with the expected {user} "
                               f"followed by hidden pointers")
        if v.kinds and v.kinds != kinds:
            raise RuntimeError(f"{v.spec(None)}: parameters differ between archs ({v.kinds} vs {kinds})")
        if r["num_warps"] != v.num_warps:
            raise RuntimeError(f"{v.spec(None)}: compiled with {r['num_warps']} warps")
        v.kinds, v.num_user, v.entry = kinds, len(user), r["entry"]
        v.seconds += r["seconds"]
        v.stages_compiled = r["num_stages"]
        if r["arch"] in archs:
            v.images.append(dict(arch=r["arch"], kind=0, data=r["cubin"], shared=r["shared"]))
        if r.get("ptx"):
            v.ptx.append(dict(arch=r["arch"], kind=1, data=r["ptx"].encode() + b"\0", shared=r["shared"]))
        if r.get("ptx_note"):
            v.notes.append(r["ptx_note"])
    for v in order:
        # one PTX per variant, of the newest PTX arch that compiled to plain (forward-compatible)
        # PTX: sm_90's when the kernel needs nothing of sm_90a, else sm_89's (tl.dot kernels, whose
        # sm_90 code is wgmma): what GPUs newer than every cubin JIT-compile
        if v.ptx:
            v.images.append(max(v.ptx, key=lambda im: im["arch"]))
        if args.set == "release" and any(im["kind"] == 0 and im["arch"] == 80 for im in v.images):
            # the release set keeps an sm_89 cubin only where there is no sm_80 one (fp8): Ada runs
            # the sm_80 cubin (same major), and the duplicate was a fifth of the library's bytes
            v.images = [im for im in v.images if not (im["kind"] == 0 and im["arch"] == 89)]
        if not v.images:
            failures.append(f"{kernels[v.kernel].name} {v.spec(None)}: " + "; ".join(v.notes))
        v.images.sort(key=lambda im: (im["kind"], im["arch"]))
    if failures:
        print("capi/aot: variants that compiled for no architecture:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1

    # 4. emit
    archs_text = " ".join(f"sm_{a}" for a in archs) + " ptx:" + ",".join(f"sm_{a}" for a in ptx_archs)
    try:
        import triton
        tver = triton.__version__
    except Exception:
        tver = "?"
    emit(args.out, ops_mod.OPS, policies, helper_cache, PRELUDE, kernels, roles, order, enums,
         dict(archs_text=archs_text, hash=digest))
    total_bytes = sum(len(im["data"]) for v in order for im in v.images)
    unique = {hashlib.sha256(im["data"]).digest(): len(im["data"]) for v in order for im in v.images}
    manifest = dict(
        hash=digest, set=args.set, triton=tver, archs=archs, ptx=ptx_archs, jobs=args.jobs,
        seconds=dict(record=round(t_record, 2), compile_wall=round(t_compile, 2), compile_cpu=round(cpu_seconds, 2),
                     total=round(time.time() - t_start, 2)),
        image_bytes=total_bytes, unique_image_bytes=sum(unique.values()),
        kernels=[dict(index=i, module=k.module, name=k.name, params=[dict(name=n, role=r) for n, r in
                                                                     roles[(k.module, k.name)]],
                      align_ints=list(k.align_ints)) for i, k in enumerate(kernels)],
        variants=[dict(index=v.index, kernel=kernels[v.kernel].name, spec=v.spec(None), key=[
            None if k == KEY_NONE else k for k in v.key], num_warps=v.num_warps, num_stages=v.num_stages,
            fp_fusion=v.fp_fusion, mode=v.mode, entry=v.entry, params=v.kinds, num_user_params=v.num_user,
            num_hidden_params=len(v.kinds) - v.num_user, notes=v.notes, seconds=round(v.seconds, 2),
            images=[dict(arch=im["arch"], kind="cubin" if im["kind"] == 0 else "ptx", bytes=len(im["data"]),
                         shared=im["shared"], sha256=hashlib.sha256(im["data"]).hexdigest()) for im in v.images])
            for v in order],
        policies=[dict(c_name=p.c_name, params=p.params, fields=[n for n, _ in p.fields]) for p in policies],
        ops=[dict(name=op.name, launcher=op.launcher, kernels=[k.name for k in op.kernels], doc=op.doc,
                  c_params=[dict(type=t, name=n) for t, n in op.c_params]) for op in ops_mod.OPS],
    )
    _write(os.path.join(args.out, "manifest.json"), json.dumps(manifest, indent=1))
    _write(hash_file, digest + "\n")
    print(f"capi/aot: {len(order)} variants ({len(tasks)} compiles, {len(unique)} distinct images, "
          f"{sum(unique.values()) / 1e6:.1f} MB) into {args.out} in {time.time() - t_start:.1f} s "
          f"(record {t_record:.1f} s, compile {t_compile:.1f} s wall / {cpu_seconds:.1f} s CPU on {args.jobs} jobs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
