#!/usr/bin/env python3
"""Compile kernelset's Triton kernels ahead of time and emit the C tables of libkernelset.so.

    python capi/aot/generate.py [--out capi/generated] [--set test|release|full|none] [--models a,b]
                                [--jobs N] [--archs 80,89,90] [--ptx 89,90] [--force]

Steps (capi/aot/README.md has the design):
1. translate each op's launch policy (a pure Python function of the package) to C (transpile.py);
2. run each op's Python launcher on meta tensors over the set's cases and record the kernel
   launches it makes (record.py): the distinct (kernel, dtypes, None pointers, constexprs, warps,
   stages, specialization) are the variants. A variant is exact (the specialization Triton's JIT
   makes for those arguments: pointer alignment, ints equal to 1 or divisible by 16, i.e. the
   Python path's machine code) or a fallback (align16: pointers aligned and the kernel's
   align_ints divisible by 16; unaligned: no assumption). The test set compiles each case's exact
   variant (a fallback for cases marked ``generic``); the release set adds the fallback of every
   launch the known models' shapes record (ops/models.py; --models narrows the presets); the full
   set both kinds;
3. compile every variant with triton.compile for an explicit GPUTarget per arch (no GPU needed):
   a cubin per arch, and one PTX for newer GPUs to JIT: Triton's sm_90a PTX retargeted to plain
   sm_90 when ptxas accepts it that way, else (wgmma: tl.dot kernels) the sm_89 PTX;
4. emit ks_cuda_blobs.c (images, variant table), ks_cuda_ops.c/.h (translated policies, keyed
   variant lookup, ks_cuda_<op>_plan / _query / _launch): emit.py writes these C files; then
   manifest.json, and hash.txt, the content hash of everything that went in (this directory's
   sources included); when it matches, the generator stops at once ("up to date").

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

from emit import KEY_NONE, _sort_key, _write, emit  # the C files (emit.py)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SRC = os.path.join(ROOT, "src")


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
    # a kernel two ops launch (paged attention's split-KV reduce, also MLA's) is compiled once
    kernels = list(dict.fromkeys(k for op in ops_mod.OPS for k in op.kernels))
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
