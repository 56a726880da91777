"""Compile the norm kernels for real NVIDIA targets on this CPU machine (no GPU needed).

The interpreter runs the kernels as numpy and misses what only the real compiler rejects:
type and layout errors, register pressure, spills. Here each curated case calls the real
launcher (``launch.norm_fwd`` / ``norm_bwd``) on ``meta`` tensors of real sizes, with the
policy's H100 values (132 SMs); the kernel launches are recorded instead of run, specialized
the way ``@triton.jit`` would specialize them (alignment, None and 1 as constexpr), compiled
through Triton's NVIDIA backend to a cubin (ptxas included), and the PTX / ptxas log checked.

conftest sets TRITON_INTERPRET=1 before Triton is imported, which turns every @triton.jit
function (tl.sum and the rest of Triton's own library included) into an interpreter object that
the compiler cannot take; so the recording and compiling run in one child process without it.
"""
from __future__ import annotations

import contextlib
import inspect
import io
import json
import os
import re
import subprocess
import sys

import pytest


def _nvidia_unavailable() -> str | None:
    try:
        from triton.backends import backends
        if "nvidia" not in backends:
            return "this Triton has no NVIDIA backend"
        from triton.backends.nvidia.compiler import get_ptxas
        for arch in (80, 90):
            get_ptxas(arch).path  # raises when the bundled ptxas is missing
    except Exception as exc:  # any broken install: skip with the reason
        return f"Triton NVIDIA backend/ptxas not usable: {type(exc).__name__}: {exc}"
    return None


_reason = _nvidia_unavailable()
if _reason:
    pytest.skip(_reason, allow_module_level=True)

SMS = 132  # H100 SXM
M = 32768  # a prefill-sized batch, so the policy picks its multi-row / persistent shapes


def fwd(n, dtype="bf16", rms=True, res=False, w=True, b=False, gemma=False, stats=True, wdtype=None, arch=90,
        split=None):
    # split: None the default tuning; True the split forward at any width past the block kernel;
    # False the tuning without it (what the C ABI runs for wide rows)
    return dict(dir="fwd", n=n, dtype=dtype, rms=rms, res=res, w=w, b=b, gemma=gemma, stats=stats,
                wdtype=wdtype or dtype, arch=arch, split=split)


def bwd(n, dtype="bf16", rms=True, w=True, b=False, dres=False, gemma=False, arch=90, split=None):
    # split: None the default tuning (the split backward past the block kernel); False the looped
    # backward (split_chunk_bwd=0)
    return dict(dir="bwd", n=n, dtype=dtype, rms=rms, w=w, b=b, dres=dres, gemma=gemma, arch=arch, split=split)


# id -> launcher call; why each case exists is in the comment after it. Backward cases with
# n > 8192 launch the split kernel, or with split=False two kernels (looped dx, then the dw/db
# column reduction).
CASES = {
    "fwd-rms-res-bf16-4096": fwd(4096, res=True),  # Llama-8B fused add+norm, 8 warps
    "fwd-rms-x-only-bf16-4096": fwd(4096, w=False),  # x is the only tensor loaded (two-pass: 2 chunks of 2048)
    "fwd-rms-nostats-bf16-4096": fwd(4096, stats=False),  # inference path, no rstd store (two-pass)
    "fwd-rms-ragged-bf16-5120": fwd(5120),  # two-pass with a masked last chunk (2 x 4096 for 5120)
    "fwd-rms-nostats-bf16-2048": fwd(2048, stats=False),  # the widest plain-RMSNorm block kernel
    "fwd-ln-bias-bf16-4096": fwd(4096, rms=False, b=True),  # LayerNorm: mean, centred variance
    "fwd-rms-fp32w-bf16-8192": fwd(8192, wdtype="fp32"),  # mixed precision: fp32 weight (two-pass, 2 x 4096)
    "fwd-ln-fp32-8192": fwd(8192, "fp32", rms=False, w=False),  # fp32 rows
    "fwd-rms-gemma-fp16-16384": fwd(16384, "fp16", gemma=True),  # widest block kernel, 16 warps
    "fwd-rms-rows16-bf16-128": fwd(128),  # many rows per program (ROWS=16)
    "fwd-looped-rms-res-bf16-65536": fwd(65536, res=True, split=False),  # looped; h written, then re-read
    "fwd-looped-ln-bias-fp32-65536": fwd(65536, "fp32", rms=False, b=True, split=False),  # Chan merge of stats
    "fwd-looped-rms-bf16-65536": fwd(65536),  # the default at 65536: looped (pass 2 still in L2)
    "fwd-split-rms-res-bf16-65536": fwd(65536, res=True, split=True),  # split: h stored, the barrier's atomics
    "fwd-split-ln-bias-fp32-65536": fwd(65536, "fp32", rms=False, b=True, split=True),  # fp32 chunk in registers
    "fwd-split-rms-bf16-262144": fwd(262144, stats=False),  # default: 32 programs per row (SPLIT_P2 = 32)
    "bwd-rms-dres-bf16-4096": bwd(4096, dres=True),  # backward of fused add, 16 warps
    "bwd-rms-noweight-bf16-4096": bwd(4096, w=False),  # no dw accumulator
    "bwd-ln-bias-bf16-8192": bwd(8192, rms=False, b=True, gemma=True),  # the most registers
    "bwd-ln-bias-fp32-8192": bwd(8192, "fp32", rms=False, b=True, gemma=True),  # fp32 rows
    "bwd-rms-rows8-bf16-128": bwd(128),  # persistent multi-row backward (ROWS=8)
    "bwd-looped-rms-dres-bf16-65536": bwd(65536, dres=True, split=False),  # long-row dx, dw with Llama rounding
    "bwd-looped-ln-bias-bf16-65536": bwd(65536, rms=False, b=True, gemma=True, split=False),  # dw and db tiles
    "bwd-looped-ln-bias-only-fp32-16384": bwd(16384, "fp32", rms=False, w=False, b=True, split=False),  # db only
    "bwd-split-rms-dres-bf16-65536": bwd(65536, dres=True),  # the default past 8192: 8 x 1024 tiles, 64 per row
    "bwd-split-ln-bias-bf16-65536": bwd(65536, rms=False, b=True, gemma=True),  # two slots, dw and db partials
    "bwd-split-ln-bias-only-fp32-16384": bwd(16384, "fp32", rms=False, w=False, b=True),  # fp32 tiles, db only
    "bwd-split-rms-bf16-262144": bwd(262144),  # wider chunks (2048, 4 rows): split <= SMs
    # sm_80 (A100): the other ptxas, no Hopper instructions; each kernel once.
    "sm80-fwd-rms-res-bf16-4096": fwd(4096, res=True, arch=80),
    "sm80-fwd-looped-ln-bias-bf16-65536": fwd(65536, rms=False, b=True, arch=80, split=False),
    "sm80-fwd-split-ln-bias-bf16-65536": fwd(65536, rms=False, b=True, arch=80, split=True),
    "sm80-bwd-ln-bias-bf16-8192": bwd(8192, rms=False, b=True, gemma=True, arch=80),
    "sm80-bwd-looped-ln-bias-bf16-65536": bwd(65536, rms=False, b=True, gemma=True, arch=80, split=False),
    "sm80-bwd-split-ln-bias-bf16-65536": bwd(65536, rms=False, b=True, gemma=True, arch=80),
}


def _record(case: dict) -> list:
    """Child process: run the launcher on meta tensors; return its kernel launches, specialized."""
    import torch
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend

    import dataclasses

    from kernelset.ops.norm import launch, policy

    dt = lambda name: getattr(torch, {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[name])
    t = lambda *shape, d=case["dtype"]: torch.randn(*shape, dtype=dt(d), device="meta")
    n, calls = case["n"], []

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((self.kernel, args, kwargs))

    from kernelset.ops.common.fast_launch import FastKernel

    # The launcher calls kernels through FastKernel wrappers; swap each wrapped kernel for a
    # recorder (meta tensors always take FastKernel's ordinary fn[grid](...) path).
    from kernelset.ops.common import row_barrier

    wrappers = [v for v in vars(launch).values() if isinstance(v, FastKernel)]
    saved_fns = [w.fn for w in wrappers]
    saved = {"sm_count": launch.sm_count}
    for wrapper in wrappers:
        wrapper.fn = Recorder(wrapper.fn)
    # the split kernel's counter zeroing (a store loop, not a norm kernel) is left out
    zero_fn, row_barrier._zero.fn = row_barrier._zero.fn, type("Skip", (), {"__getitem__": lambda self, g: lambda *a, **k: None})()
    launch.sm_count = lambda device: SMS
    if case["dir"] == "fwd":
        tuning = {None: policy.DEFAULT_TUNING, True: dataclasses.replace(policy.DEFAULT_TUNING, split_min_fwd=0),
                  False: dataclasses.replace(policy.DEFAULT_TUNING, split_chunk_fwd=0)}[case.get("split")]
    else:
        tuning = (dataclasses.replace(policy.DEFAULT_TUNING, split_chunk_bwd=0) if case.get("split") is False
                  else policy.DEFAULT_TUNING)
    try:
        w = t(n, d=case["wdtype"] if case["dir"] == "fwd" else case["dtype"]) if case["w"] else None
        b = t(n) if case["b"] else None
        if case["dir"] == "fwd":
            launch.norm_fwd(t(M, n), w, b, eps=1e-6, is_rms=case["rms"], gemma_cast=case["gemma"],
                            stats=case["stats"], residual=t(M, n) if case["res"] else None, tuning=tuning)
        else:
            stat = torch.empty(M, dtype=torch.float32, device="meta")
            launch.norm_bwd(t(M, n), t(M, n), w, None if case["rms"] else stat, stat, is_rms=case["rms"],
                            gemma_cast=case["gemma"], has_bias=case["b"], dres=t(M, n) if case["dres"] else None,
                            tuning=tuning)
    finally:
        for wrapper, fn in zip(wrappers, saved_fns):
            wrapper.fn = fn
        row_barrier._zero.fn = zero_fn
        for k, v in saved.items():
            setattr(launch, k, v)
    out = []
    for kernel, args, kwargs in calls:
        kwargs = dict(kwargs)
        num_warps = kwargs.pop("num_warps")
        fp_fusion = kwargs.pop("enable_fp_fusion", True)
        bound = inspect.signature(kernel.fn).bind(*args, **kwargs).arguments
        sig, consts, aligned = {}, {}, []
        for i, p in enumerate(kernel.params):
            v = bound[p.name]
            if p.is_constexpr:
                sig[p.name], consts[p.name] = "constexpr", v
                continue
            ty, attr = native_specialize_impl(CUDABackend, v, False, True, True)  # as @triton.jit does
            sig[p.name] = ty
            if ty == "constexpr":  # None pointers and ints equal to 1
                consts[p.name] = attr
            elif attr == "D":  # 16-byte aligned pointer / int divisible by 16
                aligned.append(i)
        out.append(dict(kernel=kernel.fn.__name__, sig=sig, consts=consts, aligned=aligned, num_warps=num_warps,
                        fp_fusion=fp_fusion))
    return out


def _compile_all(cases: dict) -> dict:
    """Child process: record and compile every case; summarize each compiled kernel."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernelset.ops.norm import kernels

    knobs.nvidia.dump_ptxas_log = True  # ptxas -v output (registers, spills) printed to stdout
    results = {}
    for name, case in cases.items():
        results[name] = []
        for ln in _record(case):
            attrs = {(i,): [["tt.divisibility", 16]] for i in ln["aligned"]}
            src = ASTSource(getattr(kernels, ln["kernel"]), signature=ln["sig"], constexprs=ln["consts"], attrs=attrs)
            log, r = io.StringIO(), dict(ln, error=None)
            try:
                with contextlib.redirect_stdout(log):
                    k = triton.compile(src, target=GPUTarget("cuda", case["arch"], 32),
                                       options=dict(num_warps=ln["num_warps"], enable_fp_fusion=ln["fp_fusion"]))
            except Exception as exc:
                results[name].append(dict(r, error=f"{type(exc).__name__}: {exc}"))
                continue
            ptx, text = k.asm["ptx"], log.getvalue()
            spill = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", text)
            regs = re.search(r"Used (\d+) registers", text)
            r.update(cubin=len(k.asm.get("cubin", b"")), shared=k.metadata.shared,
                     ptx_local=len(re.findall(r"\b(?:ld|st)\.local", ptx)),
                     v4_loads=len(re.findall(r"ld\.global[\w.:]*\.v4\.", ptx)),
                     scalar16_loads=len(re.findall(r"ld\.global[\w.:]*\.[bu]16\b", ptx)),
                     spills=[int(g) for g in spill.groups()] if spill else None,
                     regs=int(regs[1]) if regs else None)
            results[name].append(r)
    return results


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("aot")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp / "cache")  # empty cache: ptxas runs and logs every case
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import json, sys; sys.path.insert(0, {here!r}); import test_aot_compile as t; "
            f"json.dump(t._compile_all(t.CASES), open({str(tmp / 'out.json')!r}, 'w'))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"compile worker failed:\n{proc.stderr[-4000:]}"
    return json.loads((tmp / "out.json").read_text())


SMEM_LIMIT = {80: 163 * 1024, 90: 227 * 1024}  # shared memory one block may have
EXPECTED_KERNELS = {("fwd", False): ["_norm_fwd_kernel"], ("fwd", True): ["_norm_fwd_looped_kernel"],
                    ("fwd", "two_pass"): ["_rms_fwd_two_pass_kernel"],
                    ("fwd", "split"): ["_norm_fwd_split_kernel"],
                    ("bwd", False): ["_norm_bwd_kernel"],
                    ("bwd", True): ["_norm_bwd_looped_kernel", "_norm_bwd_dwdb_kernel"],
                    ("bwd", "split"): ["_norm_bwd_split_kernel"]}


@pytest.mark.parametrize("name", list(CASES))
def test_compiles_without_spills(compiled, name):
    case = CASES[name]
    runs = compiled[name]
    looped = case["n"] > (16384 if case["dir"] == "fwd" else 8192)
    if case["dir"] == "fwd" and case["rms"] and not case["res"] and 4096 <= 1 << (case["n"] - 1).bit_length() <= 8192:
        looped = "two_pass"  # plain RMSNorm of 2049-8192: two chunks per pass (NormTuning.rms_two_pass_*)
    if looped and case["dir"] == "fwd" and (case["split"] or case["split"] is None and case["n"] > 65536):
        looped = "split"
    if looped and case["dir"] == "bwd" and case["split"] is not False:
        looped = "split"
    assert [r["kernel"] for r in runs] == EXPECTED_KERNELS[case["dir"], looped]
    for r in runs:
        assert r["error"] is None, f"{r['kernel']}: {r['error']}"
        assert r["cubin"] > 0 and r["shared"] <= SMEM_LIMIT[case["arch"]], r
        # ptxas caps registers so num_warps * 32 threads fit; past that cap it spills.
        assert r["regs"] is not None and r["regs"] * 32 * r["num_warps"] <= 65536, r
        assert r["spills"] == [0, 0, 0], f"{r['kernel']}: ptxas stack/spill bytes {r['spills']}"
        assert r["ptx_local"] == 0, f"{r['kernel']}: local-memory traffic in the PTX"


def _row_tensors(r):
    """Tensors of a full row tile the kernel reads (x, residual, dy, dres)."""
    c = r["consts"]
    if r["kernel"] == "_rms_fwd_two_pass_kernel":
        return 1
    if r["kernel"].startswith("_norm_fwd"):
        return 1 + c["HAS_RESIDUAL"]
    if r["kernel"] == "_norm_bwd_dwdb_kernel":
        return 1 + c["HAS_WEIGHT"]
    return 2 + c["HAS_DRES"]


@pytest.mark.parametrize("name", list(CASES))
def test_row_loads_are_vectorized(compiled, name):
    for r in compiled[name]:
        assert r["error"] is None, r["error"]
        c = r["consts"]
        size = 4 if r["sig"]["X"] == "*fp32" else 2
        # Each thread's share of one row tile in 16-byte vectors; every row tensor needs at
        # least that many 128-bit loads.
        per_thread = c.get("ROWS", c.get("BLOCK_M", 1)) * c.get("BLOCK_N", c.get("CHUNK")) * size // (32 * r["num_warps"])
        need = _row_tensors(r) * max(1, per_thread // 16)
        assert r["v4_loads"] >= need, f"{r['kernel']}: {r['v4_loads']} 128-bit loads, expected >= {need}: {r}"
        if size == 2 and (r["kernel"].startswith("_norm_fwd") or r["kernel"] == "_rms_fwd_two_pass_kernel"):
            # 16-bit forward: no element-wise loads of x or residual. With ROWS > 1 the weight and
            # bias ([BLOCK_N], once per program) get a 1-D layout of one element per thread and
            # go to the row layout through shared memory: one scalar load each, allowed.
            allowed = (c["HAS_WEIGHT"] + c["HAS_BIAS"]) if c.get("ROWS", 1) > 1 else 0
            assert r["scalar16_loads"] <= allowed, f"{r['kernel']}: {r['scalar16_loads']} scalar loads: {r}"
