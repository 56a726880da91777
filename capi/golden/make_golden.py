#!/usr/bin/env python3
"""Golden data for the language bindings: every op of kernelset.h on small seeded inputs, with the
expected outputs of the Python package's fp32 references (``ks.<op>(..., backend="reference")``
on CPU).

    python capi/golden/make_golden.py            # rewrite capi/golden/golden.json
    python capi/golden/make_golden.py --check    # exit 1 if golden.json is stale

Inputs come from a seeded splitmix64 generator written here (not torch's RNG), rounded to their
storage dtype by torch's round-to-nearest-even cast, so they are the same bits on every machine
and torch version; ``--check`` compares them bitwise and the expected outputs within the case's
tolerance (the reference's own arithmetic may differ in the last bits across torch versions).

golden.json: {"format", "tolerances": {class: {dtype: tol}}, "cases": [case]}, where a case is
- "op": the header's op (ks_<op>), "name": a readable id, "tolerance_class" (registry's class);
- "options": {field: value} set on top of ks_options_init's defaults, or null (pass NULL);
- "scalars": the op's integer arguments by name (max_seqlen_q, max_seq_len, num_layers, ...);
- "tensors": the op's tensor arguments in signature order (copy_blocks: k_caches.0.., v_caches..,
  block_mapping, the order ks_query_support takes), each {"name", "dtype" (null: absent, pass
  NULL), "shape", "strides" (elements; null: compact row-major), "data" (little-endian bytes in hex,
  covering every element the strides reach; outputs are poisoned with NaN)};
- "expected": {tensor name: float32 values in hex, row-major over the logical shape} for every
  tensor the op writes (outputs and in-place arguments).
A binding passes if, per expected tensor, the elements where the expected value is not finite
match it exactly (NaN, +-inf) and ||out - expected|| / ||expected|| over the rest (in float64) is
at most tolerances[class][dtype of that tensor].
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

import kernelset as ks  # noqa: E402
from kernelset.core import registry  # noqa: E402
from kernelset.core.tolerance import TOLERANCES  # noqa: E402

OUT = Path(__file__).resolve().parent / "golden.json"
HEADER = ROOT / "capi" / "include" / "kernelset.h"
REF = "reference"
FP8 = torch.float8_e4m3fn
DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", FP8: "float8_e4m3fn",
          torch.int32: "int32", torch.int64: "int64", torch.uint8: "uint8"}
# fp8 caches are judged by the step of e4m3 (3 mantissa bits: half a step is 2^-4 relative)
FP8_TOL = 2.0 ** -4


class Rng:
    """splitmix64: the same stream on every platform."""

    def __init__(self, seed: int):
        self.s = seed & (2**64 - 1)

    def next(self) -> int:
        self.s = (self.s + 0x9E3779B97F4A7C15) & (2**64 - 1)
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
        return z ^ (z >> 31)

    def uniform(self, n: int, lo: float = -1.0, hi: float = 1.0) -> list[float]:
        return [lo + (hi - lo) * (self.next() >> 11) / 2.0**53 for _ in range(n)]

    def ints(self, n: int, lo: int, hi: int) -> list[int]:
        return [lo + self.next() % (hi - lo) for _ in range(n)]


def rand(rng: Rng, shape, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    n = math.prod(shape)
    return torch.tensor(rng.uniform(n, -scale, scale), dtype=torch.float64).reshape(shape).to(dtype)


def rope_cache(max_pos: int, rot: int) -> torch.Tensor:
    """[max_pos, rot] = [cos | sin] of NeoX frequencies (base 10000), float32."""
    half = rot // 2
    rows = []
    for p in range(max_pos):
        ang = [p * 10000.0 ** (-2.0 * i / rot) for i in range(half)]
        rows.append([math.cos(a) for a in ang] + [math.sin(a) for a in ang])
    return torch.tensor(rows, dtype=torch.float64).to(torch.float32)


def nan_like(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype)


# ---- cases -------------------------------------------------------------------------------------


class Case:
    def __init__(self, name: str, op: str, options: dict | None = None, scalars: dict | None = None):
        self.name, self.op = name, op
        self.options = options
        self.scalars = scalars or {}
        self.tensors: list[tuple[str, torch.Tensor | None]] = []
        self.expected: dict[str, torch.Tensor] = {}

    def arg(self, name: str, t: torch.Tensor | None) -> torch.Tensor | None:
        self.tensors.append((name, t))
        return t

    def clone(self, name: str) -> torch.Tensor:
        """A contiguous copy of an argument, for the reference to run on (in-place ops write it)."""
        return dict(self.tensors)[name].clone().contiguous()

    def expect(self, **outs: torch.Tensor | None) -> None:
        for k, v in outs.items():
            if v is not None:
                self.expected[k] = v


def _hex(t: torch.Tensor) -> str:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes().hex()


def _span(t: torch.Tensor) -> torch.Tensor:
    """The storage elements a (non-negatively) strided tensor reaches, from its first element."""
    if t.numel() == 0:
        return t.reshape(0)
    if any(s < 0 for s in t.stride()):
        raise ValueError("golden tensors use non-negative strides")
    extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return torch.as_strided(t, (extent,), (1,))


def tensor_json(name: str, t: torch.Tensor | None) -> dict:
    if t is None:
        return {"name": name, "dtype": None}
    strided = not t.is_contiguous()
    return {"name": name, "dtype": DTYPES[t.dtype], "shape": list(t.shape),
            "strides": list(t.stride()) if strided else None, "data": _hex(_span(t) if strided else t)}


def opt(cast: int) -> str:
    return {0: "llama", 1: "gemma"}[cast]


def build_cases() -> list[Case]:
    rng = Rng(20240601)
    cases: list[Case] = []
    f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16

    # ---- norms
    for dt, cast, offset, tag in ((f32, 0, 0.0, "f32"), (bf16, 1, 1.0, "bf16.gemma"), (f16, 0, 0.0, "f16")):
        c = Case(f"rms_norm.{tag}", "rms_norm", {"eps": 1e-6, "offset": offset, "cast": cast})
        x = c.arg("x", rand(rng, (3, 5, 48), dt, 2.0))
        w = c.arg("weight", rand(rng, (48,), dt))
        c.arg("out", nan_like((3, 5, 48), dt))
        c.expect(out=ks.rms_norm(x, w, eps=1e-6, offset=offset, cast=opt(cast), backend=REF))
        cases.append(c)
    # rows of a wider buffer (stride 80): the strides travel through the binding's tensor view
    c = Case("rms_norm.f32.strided_rows.no_weight.default_options", "rms_norm", None)
    base = rand(rng, (6, 80), f32, 3.0)
    x = c.arg("x", base[:, 8:72])
    c.arg("weight", None)
    c.arg("out", nan_like((6, 64), f32))
    c.expect(out=ks.rms_norm(x.contiguous(), None, backend=REF))
    cases.append(c)

    for dt, tag in ((f32, "f32"), (f16, "f16")):
        c = Case(f"fused_add_rms_norm.{tag}", "fused_add_rms_norm", {"eps": 1e-5, "offset": 0.0, "cast": 0})
        x = c.arg("x", rand(rng, (7, 40), dt))
        r = c.arg("residual", rand(rng, (7, 40), dt))
        w = c.arg("weight", rand(rng, (40,), dt))
        c.arg("out", nan_like((7, 40), dt))
        y, h = ks.fused_add_rms_norm(x, r.clone(), w, eps=1e-5, backend=REF)
        c.expect(out=y, residual=h)
        cases.append(c)

    for dt, tag in ((f32, "f32"), (bf16, "bf16")):
        c = Case(f"layer_norm.{tag}", "layer_norm", {"eps": 1e-5})
        x = c.arg("x", rand(rng, (4, 3, 56), dt, 2.0) + 0.5)
        w = c.arg("weight", rand(rng, (56,), dt))
        b = c.arg("bias", rand(rng, (56,), dt))
        c.arg("out", nan_like((4, 3, 56), dt))
        c.expect(out=ks.layer_norm(x, w, b, eps=1e-5, backend=REF))
        cases.append(c)
    c = Case("layer_norm.f32.no_affine", "layer_norm", None)
    x = c.arg("x", rand(rng, (5, 33), f32, 4.0))
    c.arg("weight", None)
    c.arg("bias", None)
    c.arg("out", nan_like((5, 33), f32))
    c.expect(out=ks.layer_norm(x, backend=REF))
    cases.append(c)

    # ---- activations
    for dt, tag in ((f32, "f32"), (f16, "f16")):
        c = Case(f"silu_and_mul.{tag}", "silu_and_mul")
        x = c.arg("x", rand(rng, (2, 5, 64), dt, 4.0))
        c.arg("out", nan_like((2, 5, 32), dt))
        c.expect(out=ks.silu_and_mul(x, backend=REF))
        cases.append(c)
    for approx, tag in ((0, "none"), (1, "tanh")):
        c = Case(f"gelu_and_mul.f32.{tag}", "gelu_and_mul", {"approximate": approx})
        x = c.arg("x", rand(rng, (6, 48), f32, 4.0))
        c.arg("out", nan_like((6, 24), f32))
        c.expect(out=ks.gelu_and_mul(x, approximate=tag, backend=REF))
        cases.append(c)
    c = Case("swiglu.f32", "swiglu")
    g = c.arg("gate", rand(rng, (5, 36), f32, 4.0))
    u = c.arg("up", rand(rng, (5, 36), f32, 2.0))
    c.arg("out", nan_like((5, 36), f32))
    c.expect(out=ks.swiglu(g, u, backend=REF))
    cases.append(c)
    for dt, approx, tag in ((f32, 0, "f32.none"), (bf16, 1, "bf16.tanh")):
        c = Case(f"gelu.{tag}", "gelu", {"approximate": approx})
        x = c.arg("x", rand(rng, (4, 50), dt, 4.0))
        c.arg("out", nan_like((4, 50), dt))
        c.expect(out=ks.gelu(x, approximate=("none", "tanh")[approx], backend=REF))
        cases.append(c)
    c = Case("swiglu_oai.f32", "swiglu_oai", {"alpha": 1.702, "limit": 7.0})
    x = c.arg("x", rand(rng, (5, 64), f32, 10.0))  # beyond the clamp limit
    c.arg("out", nan_like((5, 32), f32))
    c.expect(out=ks.swiglu_oai(x, alpha=1.702, limit=7.0, backend=REF))
    cases.append(c)

    # ---- softmax
    for op, fn in (("softmax", ks.softmax), ("log_softmax", ks.log_softmax)):
        for dt, temp, tag in ((f32, 0.7, "f32"), (bf16, 1.0, "bf16")):
            c = Case(f"{op}.{tag}", op, {"temperature": temp})
            x = c.arg("x", rand(rng, (3, 4, 70), dt, 5.0))
            c.arg("out", nan_like((3, 4, 70), dt))
            c.expect(out=fn(x, temperature=temp, backend=REF))
            cases.append(c)

    # ---- cross entropy
    for tdt, red, ls, zl, cap, tag in ((torch.int64, 1, 0.1, 1e-3, 0.0, "mean.smooth.zloss"),
                                       (torch.int32, 0, 0.0, 0.0, 30.0, "none.softcap"),
                                       (torch.int64, 2, 0.0, 0.0, 0.0, "sum")):
        c = Case(f"cross_entropy.f32.{tag}", "cross_entropy",
                 {"ignore_index": -100, "label_smoothing": ls, "z_loss": zl, "softcap": cap, "reduction": red})
        logits = c.arg("logits", rand(rng, (6, 40), f32, 6.0))
        tgt = torch.tensor(rng.ints(6, 0, 40), dtype=tdt)
        tgt[2] = -100
        c.arg("target", tgt)
        shape = (6,) if red == 0 else ()
        c.arg("loss", nan_like(shape, f32))
        c.expect(loss=ks.cross_entropy(logits, tgt, ignore_index=-100, label_smoothing=ls, z_loss=zl,
                                       softcap=cap or None, reduction=("none", "mean", "sum")[red], backend=REF))
        cases.append(c)

    # ---- embedding
    for idt, dt, tag in ((torch.int32, f32, "i32.f32"), (torch.int64, bf16, "i64.bf16")):
        c = Case(f"embedding.{tag}", "embedding")
        ids = c.arg("ids", torch.tensor(rng.ints(6, 0, 11), dtype=idt).reshape(2, 3))
        w = c.arg("weight", rand(rng, (11, 24), dt))
        c.arg("out", nan_like((2, 3, 24), dt))
        c.expect(out=ks.embedding(ids, w, backend=REF))
        cases.append(c)

    # ---- RoPE (in place on q and k)
    t, hq, hk, d = 5, 4, 2, 16
    for pdt, q3, inter, rot, tag in ((torch.int64, True, 0, 16, "f32.neox.3d"),
                                     (torch.int32, False, 1, 8, "f32.gptj.2d.partial")):
        opts = {"interleaved": inter, "rotary_dim": rot, "head_size": d}
        c = Case(f"rotary_embedding.{tag}", "rotary_embedding", opts)
        pos = c.arg("positions", torch.tensor(rng.ints(t, 0, 32), dtype=pdt))
        shape_q, shape_k = ((t, hq, d), (t, hk, d)) if q3 else ((t, hq * d), (t, hk * d))
        c.arg("q", rand(rng, shape_q, f32))
        c.arg("k", rand(rng, shape_k, f32))
        cache = c.arg("cos_sin_cache", rope_cache(32, rot))
        q, k = c.clone("q"), c.clone("k")
        ks.rotary_embedding(pos, q, k, cache, interleaved=bool(inter), rotary_dim=rot, head_size=d, backend=REF)
        c.expect(q=q, k=k)
        cases.append(c)
    c = Case("rotary_embedding.bf16.no_k.default_options", "rotary_embedding", None)
    pos = c.arg("positions", torch.tensor(rng.ints(t, 0, 32), dtype=torch.int64))
    c.arg("q", rand(rng, (t, hq, d), bf16))
    c.arg("k", None)
    cache = c.arg("cos_sin_cache", rope_cache(32, d))
    q = c.clone("q")
    ks.rotary_embedding(pos, q, None, cache, backend=REF)
    c.expect(q=q)
    cases.append(c)

    for minter, sec, tag in ((0, [2, 3, 3], "sections"), (1, [4, 2, 2], "interleaved")):
        c = Case(f"mrope.f32.{tag}", "mrope", {"interleaved": 0, "rotary_dim": 16, "head_size": d,
                                                "mrope_section": sec, "mrope_interleaved": minter})
        pos = c.arg("positions", torch.tensor(rng.ints(3 * t, 0, 32), dtype=torch.int64).reshape(3, t))
        c.arg("q", rand(rng, (t, hq, d), f32))
        c.arg("k", rand(rng, (t, hk, d), f32))
        cache = c.arg("cos_sin_cache", rope_cache(32, 16))
        q, k = c.clone("q"), c.clone("k")
        ks.mrope(pos, q, k, cache, sec, mrope_interleaved=bool(minter), backend=REF)
        c.expect(q=q, k=k)
        cases.append(c)

    for dt, cast, offset, sec, tag in ((f32, 0, 0.0, None, "f32.rope"), (bf16, 0, 0.0, None, "bf16.llama"),
                                       (f32, 1, 1.0, [2, 3, 3], "f32.gemma.mrope")):
        opts = {"eps": 1e-6, "offset": offset, "cast": cast, "interleaved": 0, "rotary_dim": 16, "head_size": d,
                "mrope_section": sec or [0, 0, 0], "mrope_interleaved": 0}
        c = Case(f"qk_norm_rope.{tag}", "qk_norm_rope", opts)
        # q and k as views into one fused [T, (Hq + Hk) * D] qkv buffer (token stride > width)
        qkv = rand(rng, (t, (hq + 2 * hk) * d), dt, 2.0)
        c.arg("q", qkv[:, :hq * d].view(t, hq, d))
        c.arg("k", qkv[:, hq * d:(hq + hk) * d].view(t, hk, d))
        qw = c.arg("q_weight", rand(rng, (d,), dt))
        kw = c.arg("k_weight", rand(rng, (d,), dt))
        cache = c.arg("cos_sin_cache", rope_cache(32, 16))
        pos_t = torch.tensor(rng.ints(3 * t if sec else t, 0, 32), dtype=torch.int64)
        pos = c.arg("positions", pos_t.reshape(3, t) if sec else pos_t)
        q, k = c.clone("q"), c.clone("k")
        ks.qk_norm_rope(q, k, qw, kw, cache, pos, eps=1e-6, offset=offset, cast=opt(cast), mrope_section=sec,
                        backend=REF)
        c.expect(q=q, k=k)
        cases.append(c)

    # ---- paged KV cache
    nb, bs, hkv, dh = 4, 4, 2, 8
    for kdt, cdt, tag in ((f32, f32, "f32"), (bf16, bf16, "bf16"), (f16, FP8, "fp8")):
        c = Case(f"reshape_and_cache.{tag}", "reshape_and_cache")
        key = c.arg("key", rand(rng, (5, hkv, dh), kdt, 3.0))
        val = c.arg("value", rand(rng, (5, hkv, dh), kdt, 3.0))
        c.arg("k_cache", rand(rng, (nb, bs, hkv, dh), f32).to(cdt))
        c.arg("v_cache", rand(rng, (nb, bs, hkv, dh), f32).to(cdt))
        c.arg("slot_mapping", torch.tensor([3, 9, -1, 14, 0], dtype=torch.int64 if kdt == f32 else torch.int32))
        scales = (torch.tensor([0.5]), torch.tensor(0.25)) if cdt == FP8 else (None, None)
        c.arg("k_scale", scales[0])
        c.arg("v_scale", scales[1])
        kc, vc = c.clone("k_cache"), c.clone("v_cache")
        ks.reshape_and_cache(key, val, kc, vc, dict(c.tensors)["slot_mapping"], k_scale=scales[0],
                             v_scale=scales[1], backend=REF)
        c.expect(k_cache=kc, v_cache=vc)
        cases.append(c)

    c = Case("copy_blocks.f32.two_layers", "copy_blocks", scalars={"num_layers": 2})
    shapes = [(5, 4, 2, 8), (5, 2, 1, 4)]  # layers may differ in block shape
    for kind in ("k_caches", "v_caches"):
        for i, s in enumerate(shapes):
            c.arg(f"{kind}.{i}", rand(rng, s, f32))
    # (no destination is a source, none repeats: such pairs race and are refused; a source may repeat)
    mapping = c.arg("block_mapping", torch.tensor([[0, 3], [4, 1], [0, 2]], dtype=torch.int64))
    kcs, vcs = [c.clone(f"k_caches.{i}") for i in range(2)], [c.clone(f"v_caches.{i}") for i in range(2)]
    ks.copy_blocks(kcs, vcs, mapping, backend=REF)
    c.expect(**{f"k_caches.{i}": kcs[i] for i in range(2)}, **{f"v_caches.{i}": vcs[i] for i in range(2)})
    cases.append(c)

    # ---- attention
    nb, bs, hkv, hq, d = 8, 4, 2, 4, 16
    for dt, tag, chunked, opts in (
            (f32, "f32.decode", False, None),
            (bf16, "bf16.decode.softcap", False, {"scale": 0.3, "causal": 1, "window_left": -1, "window_right": -1,
                                                  "softcap": 20.0}),
            (f32, "f32.chunked.window.sinks", True, {"scale": 0.0, "causal": 1, "window_left": 5,
                                                     "window_right": -1, "softcap": 0.0})):
        b = 3
        seq_lens = torch.tensor([7, 10, 3], dtype=torch.int32)
        qlens = [2, 3, 1] if chunked else [1, 1, 1]
        tq = sum(qlens)
        cu = torch.tensor([0, 2, 5, 6], dtype=torch.int32) if chunked else None
        c = Case(f"paged_attention.{tag}", "paged_attention", opts,
                 {"max_seqlen_q": max(qlens), "max_seq_len": 12})
        q = c.arg("q", rand(rng, (tq, hq, d), dt, 2.0))
        kc = c.arg("k_cache", rand(rng, (nb, bs, hkv, d), dt))
        vc = c.arg("v_cache", rand(rng, (nb, bs, hkv, d), dt))
        bt = c.arg("block_table", torch.tensor([[3, 1, 0], [5, 2, 7], [6, 4, 4]], dtype=torch.int32))
        sl = c.arg("seq_lens", seq_lens)
        c.arg("cu_seqlens_q", cu)
        sinks = c.arg("sinks", rand(rng, (hq,), f32) if chunked else None)
        c.arg("k_scale", None)
        c.arg("v_scale", None)
        c.arg("out", nan_like((tq, hq, d), dt))
        c.arg("lse", nan_like((tq, hq), f32))
        c.arg("workspace", None)
        o = opts or {"scale": 0.0, "causal": 1, "window_left": -1, "window_right": -1, "softcap": 0.0}
        res = ks.paged_attention(q, kc, vc, bt, sl, cu_seqlens_q=cu, max_seqlen_q=max(qlens), causal=bool(o["causal"]),
                                 scale=o["scale"] or None, window=(o["window_left"], o["window_right"]),
                                 softcap=o["softcap"], sinks=sinks, max_seq_len=12, return_lse=True, backend=REF)
        c.expect(out=res.out, lse=res.lse)
        cases.append(c)

    c = Case("merge_attn_states.f32", "merge_attn_states")
    oa = c.arg("out_a", rand(rng, (5, 3, 16), f32))
    la = rand(rng, (5, 3), f32, 3.0)
    lb = rand(rng, (5, 3), f32, 3.0)
    la[1, 2] = -math.inf  # an empty part contributes nothing
    la[4, 0] = lb[4, 0] = -math.inf  # both empty: out 0, lse -inf
    c.arg("lse_a", la)
    ob = c.arg("out_b", rand(rng, (5, 3, 16), f32))
    c.arg("lse_b", lb)
    c.arg("out", nan_like((5, 3, 16), f32))
    c.arg("lse", nan_like((5, 3), f32))
    res = ks.merge_attn_states(oa, la, ob, lb, backend=REF)
    c.expect(out=res.out, lse=res.lse)
    cases.append(c)

    for dt, tag, dv, opts, with_sinks in (
            (f32, "f32.causal", 16, {"scale": 0.0, "causal": 1, "window_left": -1, "window_right": -1,
                                     "softcap": 0.0}, False),
            (f16, "f16.window.softcap.sinks.dv8", 8, {"scale": 0.2, "causal": 0, "window_left": 2, "window_right": 1,
                                                      "softcap": 15.0}, True),
            (f32, "f32.default_options", 16, None, False)):
        c = Case(f"flash_attention.{tag}", "flash_attention", opts)
        q = c.arg("q", rand(rng, (2, 5, 4, 16), dt, 2.0))
        k = c.arg("k", rand(rng, (2, 7, 2, 16), dt))
        v = c.arg("v", rand(rng, (2, 7, 2, dv), dt))
        sinks = c.arg("sinks", rand(rng, (4,), f32) if with_sinks else None)
        c.arg("out", nan_like((2, 5, 4, dv), dt))
        c.arg("lse", nan_like((2, 4, 5), f32))
        o = opts or {"scale": 0.0, "causal": 0, "window_left": -1, "window_right": -1, "softcap": 0.0}
        res = ks.flash_attention(q, k, v, causal=bool(o["causal"]), scale=o["scale"] or None,
                                 window=(o["window_left"], o["window_right"]), softcap=o["softcap"], sinks=sinks,
                                 return_lse=True, backend=REF)
        c.expect(out=res.out, lse=res.lse)
        cases.append(c)

    for dt, tag, causal in ((f32, "f32.causal", 1), (bf16, "bf16", 0)):
        opts = {"scale": 0.0, "causal": causal, "window_left": -1, "window_right": -1, "softcap": 0.0}
        cu_q = torch.tensor([0, 3, 3, 7], dtype=torch.int32)  # the middle sequence is empty
        cu_k = torch.tensor([0, 4, 6, 11], dtype=torch.int32)
        c = Case(f"flash_attention_varlen.{tag}", "flash_attention_varlen", opts,
                 {"max_seqlen_q": 4, "max_seqlen_k": 5})
        q = c.arg("q", rand(rng, (7, 4, 16), dt, 2.0))
        k = c.arg("k", rand(rng, (11, 2, 16), dt))
        v = c.arg("v", rand(rng, (11, 2, 16), dt))
        c.arg("cu_seqlens_q", cu_q)
        c.arg("cu_seqlens_k", cu_k)
        c.arg("sinks", None)
        c.arg("out", nan_like((7, 4, 16), dt))
        c.arg("lse", nan_like((4, 7), f32))
        res = ks.flash_attention_varlen(q, k, v, cu_q, cu_k, 4, 5, causal=bool(causal), return_lse=True, backend=REF)
        c.expect(out=res.out, lse=res.lse)
        cases.append(c)

    # ---- MLA decode: a ragged batch (one empty sequence) over a paged latent cache [C | K_pe]
    nb, bs, h, r, p = 6, 4, 3, 16, 8
    for qdt, cdt, tag in ((f32, f32, "f32"), (bf16, FP8, "fp8")):
        opts = {"scale": 0.25, "kv_lora_rank": r, "rope_dim": p}
        c = Case(f"mla_decode.{tag}", "mla_decode", opts, {"max_seq_len": 0})
        qn = c.arg("q_nope", rand(rng, (3, h, r), qdt, 2.0))
        qp = c.arg("q_pe", rand(rng, (3, h, p), qdt, 2.0))
        kv = c.arg("kv_cache", rand(rng, (nb, bs, r + p), f32).to(cdt))
        bt = c.arg("block_table", torch.tensor([[4, 1, 0], [5, 2, 3], [0, 0, 0]], dtype=torch.int32))
        sl = c.arg("seq_lens", torch.tensor([9, 12, 0], dtype=torch.int32))
        kv_scale = c.arg("kv_scale", torch.tensor(0.5) if cdt == FP8 else None)
        c.arg("out", nan_like((3, h, r), qdt))
        c.arg("lse", nan_like((3, h), f32))
        res = ks.mla_decode(qn, qp, kv, bt, sl, scale=0.25, kv_lora_rank=r, rope_dim=p, kv_scale=kv_scale,
                            return_lse=True, backend=REF)
        c.expect(out=res.out, lse=res.lse)
        cases.append(c)
    return cases


# ---- checks and output -------------------------------------------------------------------------


def header_ops() -> list[str]:
    """The op names of kernelset.h's KS_OP_* constants, in id order."""
    ops = re.findall(r"KS_OP_(\w+)\s*=\s*(\d+)", HEADER.read_text())
    return [n.lower() for n, _ in sorted(ops, key=lambda p: int(p[1]))]


def tolerance_of(cls: str, dtype: torch.dtype) -> float:
    return FP8_TOL if dtype == FP8 else TOLERANCES[cls][dtype][0]


def build() -> dict:
    cases = build_cases()
    ops = header_ops()
    exported = sorted(e.name for e in registry.catalog() if e.spec.c_abi)
    if sorted(ops) != exported:
        raise SystemExit(f"kernelset.h ops {sorted(ops)} != the registry's c_abi ops {exported}")
    missing = set(ops) - {c.op for c in cases}
    if missing:
        raise SystemExit(f"no golden case for {sorted(missing)}")
    classes = sorted({registry.op(c.op).tolerance for c in cases})
    tolerances = {cls: {DTYPES[dt]: tolerance_of(cls, dt) for dt in (torch.float32, torch.float16, torch.bfloat16, FP8)}
                  for cls in classes}
    out = []
    for c in cases:
        names = [n for n, _ in c.tensors]
        for n, v in c.expected.items():
            shape = dict(c.tensors)[n].shape
            if tuple(v.shape) != tuple(shape):
                raise SystemExit(f"{c.name}: expected {n} has shape {tuple(v.shape)}, the argument {tuple(shape)}")
        out.append({"name": c.name, "op": c.op, "tolerance_class": registry.op(c.op).tolerance,
                    "options": c.options, "scalars": c.scalars,
                    "tensors": [tensor_json(n, t) for n, t in c.tensors],
                    "expected": {n: _hex(c.expected[n].to(torch.float32)) for n in names if n in c.expected}})
    return {"format": 1, "generator": "capi/golden/make_golden.py", "ops": ops, "tolerances": tolerances,
            "cases": out}


def dumps(doc: dict) -> str:
    return json.dumps(doc, indent=None, separators=(",", ":")).replace('{"name"', '\n{"name"') + "\n"


def _f32(hexs: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(bytes.fromhex(hexs)), dtype=torch.float32)


def stale(old: dict, new: dict) -> list[str]:
    """What differs: inputs and options bitwise, expected outputs beyond the case's tolerance."""
    problems = []
    for k in ("format", "ops", "tolerances"):
        if old.get(k) != new[k]:
            problems.append(f"{k} differs")
    oc = {c["name"]: c for c in old.get("cases", [])}
    if list(oc) != [c["name"] for c in new["cases"]]:
        problems.append(f"case list differs: {sorted(set(oc) ^ {c['name'] for c in new['cases']})}")
    for c in new["cases"]:
        o = oc.get(c["name"])
        if o is None:
            continue
        for k in ("op", "tolerance_class", "options", "scalars", "tensors"):
            if o[k] != c[k]:
                problems.append(f"{c['name']}: {k} differs")
        if set(o["expected"]) != set(c["expected"]):
            problems.append(f"{c['name']}: expected outputs differ")
            continue
        dtypes = {t["name"]: t["dtype"] for t in c["tensors"]}
        for n, h in c["expected"].items():
            want, got = _f32(h).double(), _f32(o["expected"][n]).double()
            fin = torch.isfinite(want)
            same_specials = torch.equal(got[~fin].nan_to_num(), want[~fin].nan_to_num())
            if not torch.equal(torch.isfinite(got), fin) or not same_specials:
                problems.append(f"{c['name']}: {n}: non-finite elements differ")
                continue
            den = float(want[fin].norm())
            err = float((got[fin] - want[fin]).norm()) / (den or 1.0)
            tol = new["tolerances"][c["tolerance_class"]][dtypes[n]]
            if err > tol:
                problems.append(f"{c['name']}: {n}: relative error {err:.3g} > {tol:g}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="capi golden data")
    ap.add_argument("--check", action="store_true", help="exit 1 if golden.json is out of date")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    doc = build()
    if args.check:
        if not args.out.exists():
            print(f"{args.out} is missing: run capi/golden/make_golden.py", file=sys.stderr)
            return 1
        problems = stale(json.loads(args.out.read_text()), doc)
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            print("golden.json is stale: run capi/golden/make_golden.py", file=sys.stderr)
        return 1 if problems else 0
    text = dumps(doc)
    args.out.write_text(text)
    print(f"wrote {args.out.relative_to(ROOT)}: {len(doc['cases'])} cases, {len(text) / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
