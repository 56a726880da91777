#!/usr/bin/env python3
"""The C ABI on a GPU: every exported op through ks.capi against the Python path on the same inputs.

    python scripts/capi_gpu_check.py [--no-build] [--cases ID,...] [--reps N] [--json FILE]

1. builds libkernelset.so (scripts/build_capi.sh, kernels of the generator's ``test`` set) unless
   --no-build, then builds and runs capi/aot/smoke_gpu.c (the CUDA launcher alone, no torch);
2. runs every GPU case of the test set (capi/aot/ops: the cases carrying ``gpu``) through the
   Python API (backend="triton") and through ks.capi on the same CUDA tensors, and compares the
   outputs bit for bit (the C path runs the exact variant: the machine code Triton's JIT builds
   for the Python path, tests/test_capi_aot.py checks that on CPU);
3. times both: each call captured 10 times in a CUDA graph, the two graphs replayed alternately
   (a b b a ...) --reps times each between CUDA events, median per call (eager launches between
   events when a path cannot be captured: noted). Inputs are larger than L2 (>= 128 MB). The bar: C time <= 1.05 x Python time.

Prints a table and exits 0 when the smoke program passed and every case matched bit for bit
within the time bar; 1 otherwise; 2 when there is no CUDA GPU. tests/test_capi_gpu.py runs the
same cases under pytest (marker ``gpu``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AOT = os.path.join(ROOT, "capi", "aot")
TIME_BAR = 1.05

for p in (os.path.join(ROOT, "src"), AOT):
    if p not in sys.path:
        sys.path.insert(0, p)


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


# ---------------------------------------------------------------------------------------------
# building


def build_library(python: str = sys.executable) -> None:
    """scripts/build_capi.sh with the test set (raises with its output on failure)."""
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "build_capi.sh"), "--set", "test"], cwd=ROOT,
                          env=dict(_env(), PYTHON=python), capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/build_capi.sh failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")


def build_smoke(out_dir: str) -> str:
    """gcc capi/aot/smoke_gpu.c with the CUDA launcher and the generated tables (built by
    build_capi.sh into capi/generated); returns the executable."""
    gen = os.path.join(ROOT, "capi", "generated")
    cuda = os.path.join(ROOT, "capi", "src", "cuda")
    srcs = [os.path.join(AOT, "smoke_gpu.c")] + sorted(
        os.path.join(d, f) for d in (cuda, gen) for f in os.listdir(d) if f.endswith(".c"))
    exe = os.path.join(out_dir, "smoke_gpu")
    proc = subprocess.run(["gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror",
                           f"-I{os.path.join(ROOT, 'capi', 'include')}", f"-I{cuda}", f"-I{gen}", *srcs, "-o", exe,
                           "-ldl", "-lpthread", "-lm"], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"building smoke_gpu failed:\n{proc.stderr[-6000:]}")
    return exe


def run_smoke(exe: str, device: int = 0) -> tuple[int, str]:
    """(exit status, output): 0 all matched, 1 a mismatch or failed launch, 2 no usable GPU."""
    try:
        proc = subprocess.run([exe, str(device)], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as exc:
        return 1, f"smoke_gpu timed out after {exc.timeout} s\n{exc.stdout or ''}"
    return proc.returncode, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------------
# cases: each GPU case of the generator's test set, built on the device


@dataclasses.dataclass
class Run:
    case_id: str
    c_op: str  # the kernelset.h function
    python: Callable[[], tuple]  # the Python path (backend="triton"); returns the outputs
    capi: Callable[[], tuple]  # the same op through ks.capi
    reset: Callable[[], None] | None  # restores the inputs an in-place op modifies
    bytes: int  # the op's minimal traffic (read inputs, write outputs)


def gpu_cases() -> list[tuple[str, dict]]:
    """(op name of the generator, case) for every case of the test set that carries ``gpu``."""
    import ops
    return [(op.name, c) for op in ops.OPS for c in op.cases("test") if "gpu" in c]


_DT = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp8e4nv": "float8_e4m3fn", "i32": "int32",
       "i64": "int64"}


def _dt(name: str):
    import torch
    return getattr(torch, _DT[name])


def _nbytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


class _Rand:
    """Random inputs on a device, or empty meta tensors (the fake-driver check needs only shapes)."""

    def __init__(self, device):
        import torch
        self.device = device
        self.meta = torch.device(device).type == "meta"
        self.g = None if self.meta else torch.Generator(device=device).manual_seed(0)

    def randn(self, *shape, dtype="bf16"):
        import torch
        if self.meta:
            return torch.empty(shape, device="meta", dtype=_dt(dtype))
        return torch.randn(shape, generator=self.g, device=self.device, dtype=torch.float32).to(_dt(dtype))

    def randint(self, hi: int, shape, dtype: str):
        import torch
        if self.meta:
            return torch.empty(shape, device="meta", dtype=_dt(dtype))
        return torch.randint(0, hi, shape, generator=self.g, device=self.device, dtype=_dt(dtype))

    def randperm(self, n: int):
        import torch
        if self.meta:
            return torch.empty((n,), device="meta", dtype=torch.int64)
        return torch.randperm(n, generator=self.g, device=self.device)


def make_run(op: str, c: dict, device) -> Run:
    """Inputs of one case (the shapes and dtypes the generator compiled it for) and both calls."""
    import torch

    import kernelset as ks
    from kernelset import capi
    rnd = _Rand(device)
    randn = rnd.randn
    cid = c.get("gpu", "?")
    if op == "norm_fwd":
        m, n, dt = c["m"], c["n"], c["x"]
        x, w = randn(m, n, dtype=dt), randn(n, dtype=dt)
        nk = dict(eps=c["eps"], offset=c.get("offset", 0.0), cast="gemma" if c.get("gemma") else "llama")
        if c["res"]:
            r0 = randn(m, n, dtype=dt)
            r = r0.clone()

            def reset():
                r.copy_(r0)
            return Run(cid, "ks_fused_add_rms_norm",
                       lambda: tuple(ks.fused_add_rms_norm(x, r0, w, **nk, backend="triton")),
                       lambda: capi.fused_add_rms_norm(x, r, w, **nk), reset, _nbytes(x, x, x, x, w))
        if not c["rms"]:
            b = randn(n, dtype=dt)
            return Run(cid, "ks_layer_norm", lambda: (ks.layer_norm(x, w, b, eps=c["eps"], backend="triton"),),
                       lambda: (capi.layer_norm(x, w, b, eps=c["eps"]),), None, _nbytes(x, x, w, b))
        return Run(cid, "ks_rms_norm", lambda: (ks.rms_norm(x, w, **nk, backend="triton"),),
                   lambda: (capi.rms_norm(x, w, **nk),), None, _nbytes(x, x, w))
    if op == "act_fwd":
        m, i, dt, kind = c["m"], c["i"], c["dtype"], c["op"]
        if kind == "swiglu":
            gate, up = randn(m, i, dtype=dt), randn(m, i, dtype=dt)
            return Run(cid, "ks_swiglu", lambda: (ks.swiglu(gate, up, backend="triton"),),
                       lambda: (capi.swiglu(gate, up),), None, 3 * _nbytes(gate))
        approx = "tanh" if "tanh" in kind else "none"
        if kind in ("gelu", "gelu_tanh"):
            x = randn(m, i, dtype=dt)
            return Run(cid, "ks_gelu", lambda: (ks.gelu(x, approximate=approx, backend="triton"),),
                       lambda: (capi.gelu(x, approximate=approx),), None, 2 * _nbytes(x))
        x = randn(m, 2 * i, dtype=dt)
        if kind == "swiglu_oai":
            return Run(cid, "ks_swiglu_oai", lambda: (ks.swiglu_oai(x, backend="triton"),),
                       lambda: (capi.swiglu_oai(x),), None, _nbytes(x) * 3 // 2)
        if kind == "silu_and_mul":
            return Run(cid, "ks_silu_and_mul", lambda: (ks.silu_and_mul(x, backend="triton"),),
                       lambda: (capi.silu_and_mul(x),), None, _nbytes(x) * 3 // 2)
        return Run(cid, "ks_gelu_and_mul", lambda: (ks.gelu_and_mul(x, approximate=approx, backend="triton"),),
                   lambda: (capi.gelu_and_mul(x, approximate=approx),), None, _nbytes(x) * 3 // 2)
    if op == "softmax_fwd":
        x = randn(c["m"], c["n"], dtype=c["dtype"])
        t = c["temperature"]
        if c["log"]:
            return Run(cid, "ks_log_softmax", lambda: (ks.log_softmax(x, temperature=t, backend="triton"),),
                       lambda: (capi.log_softmax(x, temperature=t),), None, 2 * _nbytes(x))
        return Run(cid, "ks_softmax", lambda: (ks.softmax(x, temperature=t, backend="triton"),),
                   lambda: (capi.softmax(x, temperature=t),), None, 2 * _nbytes(x))
    if op == "rope_fwd":
        t, hq, hk, d, rot = c["t"], c["hq"], c["hk"], c["d"], c["rot"]
        q0 = randn(t, hq, d, dtype=c["dtype"])
        k0 = randn(t, hk, d, dtype=c["dtype"]) if hk else None
        cache = randn(c["max_pos"], rot, dtype=c["cache"])
        pos = rnd.randint(c["max_pos"], (t,), c["pos"])
        qs = [q0.clone(), q0.clone()]
        kk = [k0.clone(), k0.clone()] if hk else [None, None]

        def reset():
            for q_, k_ in zip(qs, kk):
                q_.copy_(q0)
                if k_ is not None:
                    k_.copy_(k0)
        rk = dict(interleaved=c["interleaved"], rotary_dim=rot)
        return Run(cid, "ks_rotary_embedding",
                   lambda: tuple(ks.rotary_embedding(pos, qs[0], kk[0], cache, **rk, backend="triton")),
                   lambda: (capi.rotary_embedding(pos, qs[1], kk[1], cache, **rk), qs[1], kk[1])[1:], reset,
                   2 * _nbytes(q0, k0))
    if op == "rope_ext":
        t, hq, hk, d, rot = c["t"], c["hq"], c["hk"], c["d"], c["rot"]
        q0, k0 = randn(t, hq, d, dtype=c["dtype"]), randn(t, hk, d, dtype=c["dtype"])
        cache = randn(c["max_pos"], rot, dtype=c["cache"])
        pos = rnd.randint(c["max_pos"], (3, t) if c["pos2d"] else (t,), c["pos"])
        qs = [q0.clone(), q0.clone()]
        kk = [k0.clone(), k0.clone()]

        def reset():
            for q_, k_ in zip(qs, kk):
                q_.copy_(q0), k_.copy_(k0)
        if c["norm"]:
            qw, kw = randn(d, dtype=c["wdt"]), randn(d, dtype=c["wdt"])
            kw_ = dict(eps=c["eps"], offset=c["offset"], cast=c["cast"])
            return Run(cid, "ks_qk_norm_rope",
                       lambda: tuple(ks.qk_norm_rope(qs[0], kk[0], qw, kw, cache, pos, **kw_, backend="triton")),
                       lambda: tuple(capi.qk_norm_rope(qs[1], kk[1], qw, kw, cache, pos, **kw_)), reset,
                       2 * _nbytes(q0, k0))
        sec = list(c["sections"])
        return Run(cid, "ks_mrope",
                   lambda: tuple(ks.mrope(pos, qs[0], kk[0], cache, sec, backend="triton")),
                   lambda: tuple(capi.mrope(pos, qs[1], kk[1], cache, mrope_section=sec)), reset, 2 * _nbytes(q0, k0))
    if op == "reshape_and_cache":
        t, h, d, bs, nb = c["t"], c["h"], c["d"], c["bs"], c["nb"]
        key, value = randn(t, h, d, dtype=c["kv"]), randn(t, h, d, dtype=c["kv"])
        slots = rnd.randperm(nb * bs)[:t].to(_dt(c["slot"]))
        fp8 = c["cache"] == "fp8e4nv"
        ks_, vs_ = ((torch.tensor(0.05, device=device), torch.tensor(0.07, device=device)) if fp8 else (None, None))
        caches = [torch.zeros(nb, bs, h, d, device=device, dtype=_dt(c["cache"])) for _ in range(4)]

        def reset():
            for x in caches:
                x.zero_()
        return Run(cid, "ks_reshape_and_cache",
                   lambda: (ks.reshape_and_cache(key, value, caches[0], caches[1], slots, k_scale=ks_, v_scale=vs_,
                                                 check_slots=False, backend="triton"), caches[0], caches[1])[1:],
                   lambda: (capi.reshape_and_cache(key, value, caches[2], caches[3], slots, ks_, vs_),
                            caches[2], caches[3])[1:], reset,
                   2 * _nbytes(key) + 2 * t * h * d * caches[0].element_size())
    if op == "copy_blocks":
        nb, bs, h, d, n = c["nb"], c["bs"], c["h"], c["d"], c["n"]
        k0, v0 = randn(nb, bs, h, d, dtype=c["dtype"]), randn(nb, bs, h, d, dtype=c["dtype"])
        perm = rnd.randperm(nb)
        pairs = torch.stack([perm[:n], perm[n:2 * n]], 1).contiguous()  # sources and destinations disjoint
        caches = [k0.clone(), v0.clone(), k0.clone(), v0.clone()]

        def reset():
            for x, y in zip(caches, (k0, v0, k0, v0)):
                x.copy_(y)
        return Run(cid, "ks_copy_blocks",
                   lambda: (ks.copy_blocks([caches[0]], [caches[1]], pairs, check_blocks=False, backend="triton"),
                            caches[0], caches[1])[1:],
                   lambda: (capi.copy_blocks([caches[2]], [caches[3]], pairs), caches[2], caches[3])[1:], reset,
                   4 * n * bs * h * d * k0.element_size())
    if op == "embedding_fwd":
        w = randn(c["v"], c["d"], dtype=c["w"])
        ids = rnd.randint(c["v"], (c["m"],), c["ids"])
        return Run(cid, "ks_embedding", lambda: (ks.embedding(ids, w, check_ids=False, backend="triton"),),
                   lambda: (capi.embedding(ids, w),), None, 2 * c["m"] * c["d"] * w.element_size())
    if op == "ce_fwd":
        x = randn(c["m"], c["v"], dtype=c["x"])
        tgt = rnd.randint(c["v"], (c["m"],), c["t"])
        kw_ = dict(ignore_index=c["ignore_index"], label_smoothing=c["smoothing"], z_loss=c["z_loss"],
                   softcap=c["softcap"] or None, reduction=c.get("reduction", "none"))
        return Run(cid, "ks_cross_entropy", lambda: (ks.cross_entropy(x, tgt, **kw_, backend="triton"),),
                   lambda: (capi.cross_entropy(x, tgt, **kw_),), None, _nbytes(x))
    if op == "paged_attention":
        return _paged_run(c, device, rnd)
    if op == "mla_decode":
        return _mla_run(c, device, rnd)
    if op == "merge_attn_states":
        t, h, d = c["t"], c["h"], c["d"]
        oa, ob = randn(t, h, d, dtype=c["a"]), randn(t, h, d, dtype=c["b"])
        la, lb = randn(t, h, dtype="fp32") * 4, randn(t, h, dtype="fp32") * 4
        return Run(cid, "ks_merge_attn_states", lambda: tuple(ks.merge_attn_states(oa, la, ob, lb, backend="triton")),
                   lambda: tuple(capi.merge_attn_states(oa, la, ob, lb, return_lse=True)), None, 3 * _nbytes(oa))
    if op == "flash_fwd":
        hq, hkv, d, dv = c["hq"], c["hkv"], c["d"], c["dv"]
        wl, wr = c.get("window", (-1, -1))
        sinks = randn(hq, dtype="fp32") if c.get("sinks") else None
        kw_ = dict(causal=c["causal"], softcap=c["softcap"], return_lse=True, sinks=sinks)
        pw = dict(window=(wl, wr))
        cw = dict(window_left=wl, window_right=wr)
        if c["varlen"]:
            tq, tk = sum(c["qlens"]), sum(c["klens"])
            q, k, v = randn(tq, hq, d), randn(tk, hkv, d), randn(tk, hkv, dv)
            cuq = torch.tensor([0, *torch.tensor(c["qlens"]).cumsum(0).tolist()], device=device, dtype=torch.int32)
            cuk = torch.tensor([0, *torch.tensor(c["klens"]).cumsum(0).tolist()], device=device, dtype=torch.int32)
            mq, mk = max(c["qlens"]), max(c["klens"])
            return Run(cid, "ks_flash_attention_varlen",
                       lambda: tuple(ks.flash_attention_varlen(q, k, v, cuq, cuk, mq, mk, check_bounds=False, **kw_,
                                                               **pw, backend="triton")),
                       lambda: tuple(capi.flash_attention_varlen(q, k, v, cuq, cuk, mq, mk, **kw_, **cw)), None,
                       2 * _nbytes(q) + _nbytes(k, v))
        b, sq, sk = c["b"], c["sq"], c["sk"]
        q, k, v = randn(b, sq, hq, d), randn(b, sk, hkv, d), randn(b, sk, hkv, dv)
        return Run(cid, "ks_flash_attention",
                   lambda: tuple(ks.flash_attention(q, k, v, **kw_, **pw, backend="triton")),
                   lambda: tuple(capi.flash_attention(q, k, v, **kw_, **cw)), None, 2 * _nbytes(q) + _nbytes(k, v))
    raise KeyError(f"no GPU runner for the generator's op {op!r}")


def _paged_run(c: dict, device, rnd: _Rand) -> Run:
    import torch

    import kernelset as ks
    from kernelset import capi
    b, hq, hkv, d, bs, nb, width = c["b"], c["hq"], c["hkv"], c["d"], c["bs"], c["nb"], c["width"]
    cap = width * bs
    kc, vc = rnd.randn(nb, bs, hkv, d, dtype=c["cache"]), rnd.randn(nb, bs, hkv, d, dtype=c["cache"])
    table = rnd.randperm(nb)[:b * width].reshape(b, width).to(torch.int32).contiguous()
    lens = torch.full((b,), cap, device=device, dtype=torch.int32)  # every sequence at full context
    wl, wr = c.get("window", (-1, -1))
    sinks = rnd.randn(hq, dtype="fp32") if c.get("sinks") else None
    fp8 = c["cache"] == "fp8e4nv"
    ks_, vs_ = ((torch.full((), 0.05, device=device), torch.full((), 0.07, device=device)) if fp8 else (None, None))
    kw_ = dict(check_bounds=False, return_lse=True, backend="triton", window=(wl, wr), softcap=c.get("softcap", 0.0),
               sinks=sinks, k_scale=ks_, v_scale=vs_)
    opts = dict(window_left=wl, window_right=wr, softcap=c.get("softcap", 0.0), sinks=sinks, k_scale=ks_,
                v_scale=vs_)
    if c["varlen"]:
        t = sum(c["qlens"])
        cu = torch.tensor([0, *torch.tensor(c["qlens"]).cumsum(0).tolist()], device=device, dtype=torch.int32)
        kw_.update(cu_seqlens_q=cu, max_seqlen_q=c["max_q"])
        cargs = dict(cu_seqlens_q=cu, max_seqlen_q=c["max_q"])
    else:
        t = b
        cargs = {}
    q = rnd.randn(t, hq, d, dtype=c["dtype"])
    ws = None
    if c["ws"]:
        ws = torch.empty(capi.paged_attention_workspace_size(q, kc, cap), device=device, dtype=torch.uint8)
    kv_bytes = 2 * b * cap * hkv * d * kc.element_size()
    return Run(c.get("gpu", "?"), "ks_paged_attention",
               lambda: tuple(ks.paged_attention(q, kc, vc, table, lens, **kw_)),
               lambda: tuple(capi.paged_attention(q, kc, vc, table, lens, max_seq_len=cap, workspace=ws,
                                                  return_lse=True, **cargs, **opts)),
               None, kv_bytes + 2 * _nbytes(q))


def _mla_run(c: dict, device, rnd: _Rand) -> Run:
    import torch

    import kernelset as ks
    from kernelset import capi
    from ops.mla import SCALE
    b, h, r, p, bs, nb, width = c["b"], c["h"], c["r"], c["p"], c["bs"], c["nb"], c["width"]
    cap = width * bs
    kv = rnd.randn(nb, bs, r + p, dtype=c["cache"])
    table = rnd.randperm(nb)[:b * width].reshape(b, width).to(torch.int32).contiguous()
    lens = torch.full((b,), cap, device=device, dtype=torch.int32)  # every sequence at full context
    kvs = torch.full((), 0.05, device=device) if c["cache"] == "fp8e4nv" else None
    qn, qp = rnd.randn(b, h, r, dtype=c["dtype"]), rnd.randn(b, h, p, dtype=c["dtype"])
    from kernelset.ops.mla import launch as mla_launch
    kw_ = dict(scale=SCALE, kv_lora_rank=r, rope_dim=p)

    def python_path():
        # the C ABI serves mla_decode with the Triton kernel on every arch (the Gluon wgmma kernel
        # the Python path takes on sm_90 is not in libkernelset yet): compare like with like
        with mla_launch.TUNING.use(mla_launch.MlaTuning(wgmma=False)):
            return tuple(ks.mla_decode(qn, qp, kv, table, lens, kv_scale=kvs, max_seq_len=cap, return_lse=True,
                                       check_bounds=False, backend="triton", **kw_))
    return Run(c.get("gpu", "?"), "ks_mla_decode", python_path,
               lambda: tuple(capi.mla_decode(qn, qp, kv, table, lens, cap, kvs, return_lse=True, **kw_)),
               None, b * cap * (r + p) * kv.element_size() + 2 * _nbytes(qn, qp))


# ---------------------------------------------------------------------------------------------
# comparing and timing


def bitwise_equal(a, b) -> tuple[bool, float]:
    """(same bits, max |a - b| over finite elements) of two tensors of one dtype and shape."""
    import torch
    if a.dtype != b.dtype or a.shape != b.shape:
        return False, math.inf
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    same = torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))
    diff = (a.float() - b.float()).abs()
    diff = diff[torch.isfinite(diff)]
    return same, float(diff.max()) if diff.numel() else 0.0


def compare(run: Run) -> tuple[bool, str]:
    """Both paths once on fresh inputs; (bitwise equal, detail)."""
    import torch
    if run.reset:
        run.reset()
    want = [t for t in run.python() if t is not None]
    got = [t for t in run.capi() if t is not None]
    if any(t.is_cuda for t in want):
        torch.cuda.synchronize()
    if len(want) != len(got):
        return False, f"{len(got)} outputs, Python {len(want)}"
    details, ok = [], True
    for i, (w, g_) in enumerate(zip(want, got)):
        same, worst = bitwise_equal(w, g_)
        ok &= same
        if not same:
            details.append(f"output {i}: max |diff| {worst:.3g}")
    return ok, "; ".join(details) or "bitwise"


def _replayer(fn: Callable[[], object], inner: int) -> tuple[Callable[[], None], str]:
    """``inner`` calls of ``fn`` captured in a CUDA graph (its replay), or eager calls if capture fails."""
    import torch
    fn()  # warm-up: compiles the Python path's kernels, grows kernelset's discard buffer
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            for _ in range(inner):
                fn()
        return graph.replay, "graph"
    except Exception as exc:  # a path that cannot be captured is timed eagerly (noted in the table)
        torch.cuda.synchronize()

        def replay():
            for _ in range(inner):
                fn()
        return replay, f"eager ({type(exc).__name__})"


def time_pair(fa: Callable[[], object], fb: Callable[[], object], reps: int,
              inner: int = 10) -> tuple[float, str, float, str]:
    """Median microseconds per call of ``fa`` and ``fb``: each one's ``inner`` calls captured in a
    CUDA graph, the two graphs replayed alternately ``reps`` times between CUDA events (GPU time
    only, no host overhead; alternating keeps clock and thermal drift from favouring the one timed
    first, which matters for compute-bound kernels)."""
    import torch
    ra, how_a = _replayer(fa, inner)
    rb, how_b = _replayer(fb, inner)
    ra()
    rb()
    torch.cuda.synchronize()
    times: tuple[list, list] = ([], [])
    for i in range(2 * reps):
        which = i % 2 if (i // 2) % 2 == 0 else 1 - i % 2  # a b b a a b ...
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        (ra, rb)[which]()
        end.record()
        end.synchronize()
        times[which].append(start.elapsed_time(end) * 1000.0 / inner)
    return statistics.median(times[0]), how_a, statistics.median(times[1]), how_b


@dataclasses.dataclass
class Result:
    case_id: str
    c_op: str
    status: str  # "ok", "mismatch", "slow", "error", "skipped"
    detail: str
    python_us: float = math.nan
    capi_us: float = math.nan
    gbytes: float = 0.0
    timing: str = ""

    @property
    def ratio(self) -> float:
        return self.capi_us / self.python_us if self.python_us > 0 else math.nan


def device_fits_test_set(device) -> str | None:
    """Why the test set's variants may not cover this GPU (their cases were recorded for 132 SMs
    and sm_90: the H100/H200), or None."""
    import torch
    p = torch.cuda.get_device_properties(device)
    if (p.major, p.minor) != (9, 0) or p.multi_processor_count != 132:
        return (f"this GPU is sm_{p.major}{p.minor} with {p.multi_processor_count} SMs; the test set was recorded for "
                f"sm_90 with 132 SMs (H100/H200): cases whose variant depends on either may be missing")
    return None


def run_case(op: str, case: dict, reps: int, device) -> Result:
    import torch

    from kernelset import capi
    try:
        run = make_run(op, case, device)
    except torch.cuda.OutOfMemoryError as exc:
        return Result(case["gpu"], "?", "skipped", f"out of memory building inputs: {exc}")
    try:
        ok, detail = compare(run)
        py_us, py_how, c_us, c_how = time_pair(run.python, run.capi, reps)
    except capi.KsError as exc:
        # a variant recorded for 132 SMs / sm_90 that this GPU's policy does not pick: not a failure here
        status = "skipped" if exc.status_name == "KS_ERR_NOT_IMPLEMENTED" and device_fits_test_set(device) else "error"
        return Result(case["gpu"], run.c_op, status, str(exc))
    except Exception as exc:  # noqa: BLE001 - reported in the table, the other cases still run
        return Result(case["gpu"], run.c_op, "error", f"{type(exc).__name__}: {exc}")
    finally:
        torch.cuda.synchronize()
    res = Result(case["gpu"], run.c_op, "ok", detail, py_us, c_us, run.bytes / 1e9,
                 py_how if py_how == c_how else f"python {py_how}, capi {c_how}")
    if not ok:
        res.status = "mismatch"
    elif res.ratio > TIME_BAR:
        res.status = "slow"
    del run
    torch.cuda.empty_cache()
    return res


def table(results: list[Result]) -> str:
    head = f"{'case':28s} {'C function':28s} {'GB':>6s} {'python us':>10s} {'capi us':>10s} {'ratio':>6s} {'TB/s':>6s}  result"
    lines = [head, "-" * len(head)]
    for r in results:
        tbs = r.gbytes / (r.capi_us * 1e-6) / 1e3 if r.capi_us > 0 else math.nan
        lines.append(f"{r.case_id:28s} {r.c_op:28s} {r.gbytes:6.2f} {r.python_us:10.1f} {r.capi_us:10.1f} "
                     f"{r.ratio:6.3f} {tbs:6.2f}  {r.status}: {r.detail}" + (f" [{r.timing}]" if r.timing else ""))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# without a GPU: the same ks.capi calls against a fake libcuda (capi/aot/fake_cuda.c)


class _FakeLaunch:
    @staticmethod
    def struct():
        import ctypes

        class L(ctypes.Structure):  # fake_launch of capi/aot/fake_cuda.c
            _fields_ = [("name", ctypes.c_char * 128), ("image", ctypes.c_void_p), ("grid", ctypes.c_uint * 3),
                        ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
                        ("num_args", ctypes.c_int), ("args", ctypes.c_uint64 * 64)]
        return L


def fake_driver_check(library: str, fake_cuda: str) -> list[dict]:
    """Every GPU case through ks.capi on meta tensors handed to ``library`` (libkernelset built
    with default visibility) as CUDA DLTensors at fake addresses, ``fake_cuda`` loaded as
    libcuda.so.1; each launch the fake driver records is compared with the Python launcher's
    recording (generate.record_op) for the case: kernel, exact variant, grid, warps and every
    argument (ints and floats by value, tensors by consistent address). Returns one dict per case
    ({"case", "ok", "problems"}). Run it in a process of its own (it replaces ks.capi's loader)."""
    import ctypes
    import struct

    import torch

    import generate
    from kernelset import capi
    from kernelset.capi import _abi
    fake = ctypes.CDLL(fake_cuda, mode=ctypes.RTLD_GLOBAL)  # the library's dlopen("libcuda.so.1") finds it
    lib = ctypes.CDLL(library)
    for name, (restype, argtypes) in _abi.FUNCTIONS.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    capi._lib = lib
    capi.load = lambda: lib
    L = _FakeLaunch.struct()
    assert fake.fake_cuda_launch_size() == ctypes.sizeof(L)
    addresses: dict[int, int] = {}
    alive: list = []

    def fake_dltensor(t):
        base = t._base if t._base is not None else t
        alive.append(base)
        addr = addresses.setdefault(id(base), 0x100000000 * (len(addresses) + 1))
        nd = t.dim()
        shape = (ctypes.c_int64 * max(nd, 1))(*t.shape)
        strides = (ctypes.c_int64 * max(nd, 1))(*t.stride())
        code, bits = capi._DTYPES[t.dtype]
        dl = capi.DLTensor()
        dl.data = addr
        dl.byte_offset = t.storage_offset() * t.element_size()
        dl.device = _abi.DLDevice(_abi.KDL_CUDA, 0)
        dl.ndim = nd
        dl.dtype = capi.DLDataType(code, bits, 1)
        dl.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        dl.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
        dl._keep = (t, shape, strides)
        return dl

    capi.to_dltensor = fake_dltensor
    # the compiled variants: which images are exact specializations
    num = ctypes.c_int32.in_dll(lib, "ks_cuda_num_variants").value
    exact_images, image_names = set(), {}

    class Image(ctypes.Structure):
        _fields_ = [("arch", ctypes.c_int32), ("kind", ctypes.c_int32), ("data", ctypes.c_void_p),
                    ("size", ctypes.c_size_t), ("shared", ctypes.c_int32)]

    class Variant(ctypes.Structure):
        _fields_ = [("index", ctypes.c_int32), ("kernel", ctypes.c_int32), ("entry", ctypes.c_char_p),
                    ("spec", ctypes.c_char_p), ("num_warps", ctypes.c_int32), ("num_stages", ctypes.c_int32),
                    ("num_ctas", ctypes.c_int32), ("num_params", ctypes.c_int32),
                    ("num_user_params", ctypes.c_int32), ("param_kinds", ctypes.c_void_p),
                    ("num_images", ctypes.c_int32), ("images", ctypes.POINTER(Image))]
    for v in (Variant * max(num, 1)).in_dll(lib, "ks_cuda_variants")[:num]:
        for i in range(v.num_images):
            image_names[v.images[i].data] = v.spec.decode()
            if v.spec.decode().endswith(" exact"):
                exact_images.add(v.images[i].data)
    results = []
    for op, case in gpu_cases():
        problems: list[str] = []
        fake.fake_cuda_reset()
        run = make_run(op, case, torch.device("meta"))
        try:
            run.capi()
        except capi.KsError as exc:
            results.append(dict(case=case["gpu"], ok=False, problems=[f"ks.capi: {exc}"]))
            continue
        got = []
        for i in range(fake.fake_cuda_launches()):
            entry = L()
            fake.fake_cuda_launch(i, ctypes.byref(entry))
            got.append(entry)
        want = [ln for ln in generate.record_op(_op(op), case) if all(g_ > 0 for g_ in ln["grid"])]
        if [g_.name.decode() for g_ in got] != [w["kernel"] for w in want]:
            problems.append(f"launched {[g_.name.decode() for g_ in got]}, Python {[w['kernel'] for w in want]}")
        by_name: dict[str, int] = {}
        for g_, w in zip(got, want):
            where = w["kernel"]
            if g_.image not in exact_images:
                problems.append(f"{where}: not an exact variant ({image_names.get(g_.image, 'unknown image')})")
            if list(g_.grid) != w["grid"] or g_.block[0] != 32 * w["num_warps"]:
                problems.append(f"{where}: grid {list(g_.grid)} x {g_.block[0]} threads, Python {w['grid']} x "
                                f"{32 * w['num_warps']}")
            args = list(g_.args[:g_.num_args])
            k = 0
            for name, is_const, kind, value, _ in w["params"]:
                if is_const or kind == "none" or (kind == "int" and value == 1):
                    continue  # constexprs, None pointers and ints equal to 1 take no argument
                if k >= len(args):
                    problems.append(f"{where}: {g_.num_args} arguments, too few at {name}")
                    break
                a = args[k]
                k += 1
                if kind == "tensor":
                    if a == 0 or by_name.setdefault(value, a) != a:
                        problems.append(f"{where}.{name}: address {a:#x}, {value} was {by_name.get(value, 0):#x}")
                elif kind == "int" and (a & 0xFFFFFFFF) != (value & 0xFFFFFFFF):
                    problems.append(f"{where}.{name}: {ctypes.c_int32(a & 0xFFFFFFFF).value}, Python {value}")
                elif kind == "float" and (a & 0xFFFFFFFF) != struct.unpack("<I", struct.pack("<f", value))[0]:
                    problems.append(f"{where}.{name}: {struct.unpack('<f', struct.pack('<I', a & 0xFFFFFFFF))[0]}, "
                                    f"Python {value}")
            if any(args[k:]):  # Triton's hidden scratch pointers: NULL
                problems.append(f"{where}: nonzero hidden arguments {args[k:]}")
        results.append(dict(case=case["gpu"], ok=not problems, problems=problems))
    return results


def _op(name: str):
    import ops
    return next(op for op in ops.OPS if op.name == name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-build", action="store_true", help="use the library and capi/generated as they are")
    ap.add_argument("--cases", help="comma-separated case ids (default: all)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--fake-driver", nargs=2, metavar=("LIBRARY", "FAKE_LIBCUDA"),
                    help="no GPU: check what LIBRARY launches for every case against FAKE_LIBCUDA "
                         "(capi/aot/fake_cuda.c built as libcuda.so.1); prints JSON")
    args = ap.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    if args.fake_driver:
        results = fake_driver_check(*args.fake_driver)
        print(json.dumps(results))
        return 0 if all(r["ok"] for r in results) else 1
    wanted = set(args.cases.split(",")) if args.cases else None
    unknown = sorted((wanted or set()) - {c["gpu"] for _, c in gpu_cases()})
    if unknown:  # before any build: a misspelt (or not yet merged) case id must not pass as "all ok"
        print(f"capi_gpu_check: unknown case id(s) {', '.join(unknown)}; the test set's GPU cases: "
              f"{', '.join(c['gpu'] for _, c in gpu_cases())}")
        return 1
    import torch
    if not torch.cuda.is_available():
        print("capi_gpu_check: no CUDA GPU here (run it on the GPU machine)")
        return 2
    if not args.no_build:
        print("capi_gpu_check: building libkernelset.so (scripts/build_capi.sh --set test) ...", flush=True)
        build_library()
    with tempfile.TemporaryDirectory() as tmp:
        smoke_rc, smoke_out = run_smoke(build_smoke(tmp), args.device)
    print(smoke_out.rstrip())
    from kernelset import capi
    print(f"capi_gpu_check: {capi.build_info()}")
    device = torch.device("cuda", args.device)
    torch.cuda.set_device(device)
    why = device_fits_test_set(device)
    if why:
        print(f"capi_gpu_check: note: {why}")
    results = []
    for op, case in gpu_cases():
        if wanted and case["gpu"] not in wanted:
            continue
        r = run_case(op, case, args.reps, device)
        print(f"  {r.case_id}: {r.status} ({r.detail})", flush=True)
        results.append(r)
    print(table(results))
    bad = [r for r in results if r.status not in ("ok", "skipped")]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(smoke_rc=smoke_rc, device=torch.cuda.get_device_name(device),
                           results=[dataclasses.asdict(r) | {"ratio": r.ratio} for r in results]), f, indent=1)
    print(f"capi_gpu_check: smoke {'ok' if smoke_rc == 0 else f'FAILED ({smoke_rc})'}; "
          f"{len(results) - len(bad)}/{len(results)} cases ok (bitwise, time <= {TIME_BAR:.2f} x Python)")
    return 0 if smoke_rc == 0 and not bad else 1


if __name__ == "__main__":
    sys.exit(main())
