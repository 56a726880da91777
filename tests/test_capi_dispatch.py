"""CUDA dispatch of the RoPE, KV-cache and attention ops of the C ABI, planned on this machine (no
GPU): for each case, the kernels, grids, specializations and arguments the library would launch
(ks_cuda_<op>_plan, recorded by a spy linked in place of ks_cuda_<op>_launch) against what the
Python launcher launches on meta tensors of the same shapes and strides (capi/aot/record.py).

Needs gcc and capi/generated (scripts/build_capi.sh); the numerical tests of the same ops are
tests/test_capi_ops2.py.
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys

import pytest
import torch

from kernelset import capi
from kernelset.core import config
from kernelset.ops.attention import launch as attn_launch
from kernelset.ops.kvcache import launch as kv_launch
from kernelset.ops.mla import launch as mla_launch
from kernelset.ops.rope import launch as rope_launch


# the cases call the library at collection (options, workspace sizes): build it first
# (tests/conftest.py); a failed build fails here with its log
from conftest import build_capi  # noqa: E402
from capi_helpers import on_cuda  # noqa: E402

if build_capi() == "no gcc to build the C library":
    pytest.skip(build_capi(), allow_module_level=True)
elif build_capi():
    raise RuntimeError(build_capi())

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FP8 = torch.float8_e4m3fn


# ---- CUDA dispatch, planned on this machine: the op files' arguments against the Python launchers
#
# A test build of the library whose op files call, instead of ks_cuda_<op>_launch, a spy that
# plans the launch (ks_cuda_<op>_plan, 132 SMs, sm_90) and records the plan. Descriptors claim
# CUDA memory over host tensors (nothing is launched or read). The Python launcher runs on meta
# tensors of the same shapes and strides under capi/aot/record.py's recording; each kernel launch
# must agree: kernel, grid, specialization (dtypes, constexprs, warps, stages) and every argument
# (tensors by identity, ints, floats as fp32).

GEN = f"{ROOT}/capi/generated"
SPY_SMS, SPY_CC = 132, 90


def _spy_source(header: str) -> tuple[str, list[str]]:
    protos = re.findall(r"ks_status_t ks_cuda_(\w+)_launch\(int device, ks_stream_t stream, char \*err, size_t errlen,"
                        r"\s*(.*?)\);", header, re.S)
    out = ['#include <string.h>\n#include "ks_cuda_ops.h"\n',
           "__attribute__((visibility(\"default\"))) char ks_spy_buf[1 << 20];\n",
           "__attribute__((visibility(\"default\"))) size_t ks_spy_len;\n",
           "static void spy_add(const ks_cuda_plan *p) {\n"
           "  if (ks_spy_len) ks_spy_buf[ks_spy_len++] = ',';\n"
           "  int n = ks_cuda_plan_json(p, ks_spy_buf + ks_spy_len, sizeof ks_spy_buf - ks_spy_len - 1);\n"
           "  if (n > 0) ks_spy_len += (size_t)n;\n}\n"]
    for op, params in protos:
        names = ", ".join(re.findall(r"(\w+)\s*(?:,|$)", " ".join(params.split())))
        out.append(f"ks_status_t ks_spy_{op}_launch(int device, ks_stream_t stream, char *err, size_t errlen,\n"
                   f"    {params}) {{\n"
                   f"  static ks_cuda_plan plan;\n  (void)device; (void)stream;\n"
                   f"  ks_status_t s = ks_cuda_{op}_plan(&plan, {SPY_SMS}, {SPY_CC}, err, errlen, {names});\n"
                   f"  if (s != KS_OK && s != KS_ERR_NOT_IMPLEMENTED) return s;\n"
                   f"  spy_add(&plan);\n  return KS_OK;\n}}\n")
    return "".join(out), [op for op, _ in protos]


@pytest.fixture(scope="module")
def spy(tmp_path_factory):
    if shutil.which("gcc") is None or not os.path.exists(f"{GEN}/ks_cuda_ops.h"):
        pytest.skip("needs gcc and capi/generated (scripts/build_capi.sh)")
    tmp = tmp_path_factory.mktemp("capi_spy")
    src, ops = _spy_source(open(f"{GEN}/ks_cuda_ops.h").read())
    (tmp / "spy.c").write_text(src)
    inc = [f"-I{ROOT}/capi/include", f"-I{ROOT}/capi/src/core", f"-I{ROOT}/capi/src/cuda", f"-I{GEN}"]
    flags = ["gcc", "-std=c99", "-O0", "-fPIC", "-w", *inc, "-c"]
    renames = [f"-Dks_cuda_{op}_launch=ks_spy_{op}_launch" for op in ops]
    objs, jobs = [], []
    for f in sorted(glob.glob(f"{ROOT}/capi/src/*/*.c") + glob.glob(f"{GEN}/*.c") + [str(tmp / "spy.c")]):
        o = str(tmp / (f.replace("/", "_") + ".o"))
        extra = renames if "/capi/src/ops/" in f else []
        jobs.append(subprocess.Popen([*flags, *extra, f, "-o", o], stderr=subprocess.PIPE, text=True))
        objs.append(o)
    for j in jobs:
        assert j.wait() == 0, j.stderr.read()
    lib = str(tmp / "libks_spy.so")
    subprocess.run(["gcc", "-shared", "-Wl,-Bsymbolic", "-o", lib, *objs, "-ldl", "-lpthread", "-lm"], check=True)
    so = ctypes.CDLL(lib)
    for name, (restype, argtypes) in capi._abi.FUNCTIONS.items():
        fn = getattr(so, name)
        fn.restype, fn.argtypes = restype, argtypes
    aot = f"{ROOT}/capi/aot"
    if aot not in sys.path:
        sys.path.insert(0, aot)
    manifest = json.load(open(f"{GEN}/manifest.json"))
    kernels = {k["name"]: k for k in manifest["kernels"]}
    compiled: dict = {}  # kernel -> the variant keys compiled in
    for v in manifest["variants"]:
        compiled.setdefault(v["kernel"], set()).add(tuple(v["key"]))
    return so, kernels, compiled


class _Case:
    """Host tensors for the C call and meta twins (same shape, strides, dtype) for the launcher."""

    def __init__(self):
        self.host, self.meta = {}, {}

    def t(self, name, shape, dtype, strides=None):
        strides = strides or torch.empty(shape).stride()
        self.host[name] = torch.empty_strided(shape, strides, dtype=dtype)
        self.meta[name] = torch.empty_strided(shape, strides, dtype=dtype, device="meta")
        return self.meta[name]

    def dl(self, name):
        return None if name is None else on_cuda(self.host[name])


def _spy_plans(so) -> list[dict]:
    n = ctypes.c_size_t.in_dll(so, "ks_spy_len").value
    text = ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(so, "ks_spy_buf")), n).decode()
    ctypes.c_size_t.in_dll(so, "ks_spy_len").value = 0
    return json.loads("[" + text + "]")


def _python_launches(fn, case: _Case, modules=()) -> list[dict]:
    from record import describe, recording
    # as on a GPU: the launchers pick fp32 paths for the Triton interpreter these tests may run under
    with config.override(triton_interpret=False), recording(sms=SPY_SMS, modules=modules, cc=SPY_CC) as launches:
        fn(case.meta)
    names = {id(t): n for n, t in case.meta.items()}
    return [describe(ln, names) for ln in launches]


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _int_class(v: int) -> int:
    """Triton's own JIT specialization of an int argument: 2 = equals 1 (a constexpr), 1 =
    divisible by 16, 0 = neither (the key's spec slot)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend
    kind, attr = native_specialize_impl(CUDABackend, v, False, True, True)
    return 2 if kind == "constexpr" else 1 if attr == "D" else 0


def _compare(plans, py, case: _Case, kernels, compiled, internal: dict) -> None:
    """internal: what the launcher allocates for itself ("~PARAM" names) -> (tensor name, byte
    offset) the C call passed instead, or "scratch" (the plan's discard buffer).

    The key (capi/aot/README.md): pointer dtypes and constexprs, a spec slot per pointer (16-byte
    aligned 1, not 0, None -1) and per int (_int_class), warps, stages, fp_fusion, then the mode:
    2 (Triton's exact JIT specialization) when that key is compiled in, else the fallback: spec
    slots -1 and mode 1 if the pointers are aligned and the kernel's align_ints divisible by 16,
    else 0. An exact variant takes no argument for an int equal to 1 (a constexpr there)."""
    from record import DT_BY_NAME
    got = [ln for p in plans for ln in p["launches"]]
    want = [ln for ln in py if all(g > 0 for g in ln["grid"])]
    assert [g["kernel"] for g in got] == [w["kernel"] for w in want]
    ptr = {n: t.data_ptr() for n, t in case.host.items()}
    for g, w in zip(got, want):
        where = w["kernel"]
        assert g["grid"] == w["grid"], where
        kernel = kernels[w["kernel"]]
        align_ints = set(kernel["align_ints"])
        prefix, spec, aligned, args = [], [], 1, []  # args: (value, dropped by an exact variant)
        for (name, is_const, kind, value, dtype), role in zip(w["params"], [p["role"] for p in kernel["params"]]):
            if role == "ptr":
                prefix.append(None if kind == "none" else DT_BY_NAME[dtype])
            elif role == "constexpr":
                prefix.append(None if value is None else int(value))
            if kind == "tensor":
                where_ = internal.get(value, (value, 0))
                if where_ == "scratch":  # the discard buffer: 256-byte aligned offsets
                    address, arg = 0, ["scratch"]
                else:
                    address = ptr[where_[0]] + where_[1]
                    arg = ["ptr", address]
                if role == "ptr":
                    spec.append(int(address % 16 == 0))
                    aligned &= address % 16 == 0
            elif kind == "none" and role == "ptr":
                spec.append(-1)
            elif role == "int":
                spec.append(_int_class(value))
                if name in align_ints and value % 16:
                    aligned = 0
            if is_const or kind == "none":
                continue
            if kind in ("int", "bool"):
                args.append((["int", int(value)], kind == "int" and value == 1))
            elif kind != "tensor":
                args.append((["f32", _f32(value)], False))
            else:
                args.append((arg, False))
        tail = [w["num_warps"], w["num_stages"], w["fp_fusion"]]
        key = prefix + spec + tail + [2]
        exact = tuple(key) in compiled.get(w["kernel"], ())
        if not exact:
            key = prefix + [-1] * len(spec) + tail + [int(aligned)]
        assert g["key"] == key, f"{where}: specialization {g['key']} != {key}"
        args = [a for a, one in args if not (exact and one)]
        have = [["scratch"] if k == "scratch" else ["int", v] if k in ("i32", "i64") else
                ["f32", _f32(v)] if k == "f32" else [k, v] for k, v in g["args"]]
        assert have == args, f"{where}: arguments differ"


def _rope_spy_cases():
    launch = rope_launch

    def rotary(token_stride, interleaved, pos_dtype, dtype, cache_dtype):
        c = _Case()
        t, hq, hk, d, rot = 5, 8, 2, 128, 64
        c.t("pos", (t,), pos_dtype)
        c.t("q", (t, hq * d), dtype, (token_stride, 1))
        c.t("k", (t, hk, d), dtype, (token_stride, d, 1))
        c.t("cache", (300, rot), cache_dtype)
        o = capi.options("rotary_embedding", interleaved=interleaved, head_size=d)
        return ("ks_rotary_embedding", lambda so: so.ks_rotary_embedding(c.dl("pos"), c.dl("q"), c.dl("k"),
                                                                          c.dl("cache"), ctypes.byref(o), None),
                lambda m: launch.rope_fwd(m["pos"], m["q"], m["k"], m["cache"], interleaved, d), c, {})

    def ext(op, sections, pos2d, mi, norm, cast, wdt, dtype=torch.bfloat16):
        c = _Case()
        t, hq, hk, d = 4, 16, 4, 128
        c.t("pos", (3, t) if pos2d else (t,), torch.int64)
        c.t("q", (t, hq, d), dtype)
        c.t("k", (t, hk * d), dtype, (3 * hk * d, 1))
        c.t("cache", (500, d), torch.float32)
        if norm:
            c.t("qw", (d,), wdt)
            c.t("kw", (d,), wdt)
        sec = sections or (0, 0, 0)
        if op == "mrope":
            o = capi.options("mrope", mrope_section=sec, mrope_interleaved=mi, head_size=d)
            call = lambda so: so.ks_mrope(c.dl("pos"), c.dl("q"), c.dl("k"), c.dl("cache"), ctypes.byref(o), None)
            py = lambda m: launch.rope_ext(m["pos"], m["q"], m["k"], m["cache"], d, False, list(sec), mi)
        else:
            offset = 1.0 if cast == "gemma" else 0.0
            o = capi.options("qk_norm_rope", eps=1e-6, offset=offset, cast=cast, head_size=d, mrope_section=sec,
                             mrope_interleaved=mi)
            call = lambda so: so.ks_qk_norm_rope(c.dl("q"), c.dl("k"), c.dl("qw"), c.dl("kw"), c.dl("cache"),
                                                 c.dl("pos"), ctypes.byref(o), None)
            py = lambda m: launch.rope_ext(m["pos"], m["q"], m["k"], m["cache"], d, False,
                                           list(sec) if sections else None, mi, m["qw"], m["kw"], 1e-6, offset, cast)
        return (f"ks_{op}", call, py, c, {})

    yield "rotary_bf16", rotary(8 * 128, False, torch.int64, torch.bfloat16, torch.bfloat16)
    yield "rotary_fp32_gptj_strided", rotary(12 * 128, True, torch.int32, torch.float32, torch.float32)
    yield "mrope_bands", ext("mrope", (16, 24, 24), True, False, False, None, None)
    yield "mrope_interleaved", ext("mrope", (24, 20, 20), True, True, False, None, None)
    yield "mrope_text_positions", ext("mrope", (16, 24, 24), False, False, False, None, None)
    yield "qk_norm_rope_qwen3", ext("qk_norm_rope", None, False, False, True, "llama", torch.bfloat16)
    yield "qk_norm_rope_gemma", ext("qk_norm_rope", None, False, False, True, "gemma", torch.float32)
    yield "qk_norm_rope_vl", ext("qk_norm_rope", (24, 20, 20), True, True, True, "llama", torch.bfloat16)


def _kv_spy_cases():
    launch = kv_launch

    def cache(kv_dtype, cache_dtype, slot_dtype):
        c = _Case()
        t, h, d, nb, bs = 6, 4, 128, 64, 16
        c.t("key", (t, h, d), kv_dtype, (3 * h * d, d, 1))
        c.t("value", (t, h, d), kv_dtype, (3 * h * d, d, 1))
        c.t("kc", (nb, bs, h, d), cache_dtype)
        c.t("vc", (nb, bs, h, d), cache_dtype, (2 * bs * h * d, h * d, d, 1))
        c.t("slots", (t,), slot_dtype)
        fp8 = cache_dtype == FP8
        if fp8:
            c.t("ks", (), torch.float32)
            c.t("vs", (1,), torch.float32)
        names = ["key", "value", "kc", "vc", "slots", "ks" if fp8 else None, "vs" if fp8 else None]
        return ("ks_reshape_and_cache", lambda so: so.ks_reshape_and_cache(*[c.dl(n) for n in names], None),
                lambda m: launch.reshape_and_cache(*[m[n] if n else None for n in names]), c, {})

    def copy():
        c = _Case()
        c.t("k0", (64, 16, 8, 128), torch.bfloat16)
        c.t("v0", (64, 16, 8, 128), torch.bfloat16, (2 * 16 * 8 * 128, 8 * 128, 128, 1))
        c.t("k1", (64, 32, 2, 64), torch.bfloat16)
        c.t("v1", (64, 32, 2, 64), torch.bfloat16)
        c.t("map", (3, 2), torch.int64)
        ks_ = (ctypes.POINTER(capi.DLTensor) * 2)()
        vs_ = (ctypes.POINTER(capi.DLTensor) * 2)()

        def call(so):
            keep = [c.dl(n) for n in ("k0", "k1", "v0", "v1")]
            for i in range(2):
                ks_[i], vs_[i] = ctypes.pointer(keep[i]), ctypes.pointer(keep[2 + i])
            return so.ks_copy_blocks(ks_, vs_, 2, c.dl("map"), None)
        return ("ks_copy_blocks", call, lambda m: launch.copy_blocks([m["k0"], m["k1"]], [m["v0"], m["v1"]], m["map"]),
                c, {})

    yield "reshape_and_cache_bf16", cache(torch.bfloat16, torch.bfloat16, torch.int64)
    yield "reshape_and_cache_fp8", cache(torch.float16, FP8, torch.int32)
    yield "copy_blocks", copy()


def _attn_spy_cases():
    launch = attn_launch

    def paged(dtype, cache_dtype, varlen, ws, lse, window=(-1, -1), softcap=0.0, sinks=False, causal=True):
        c = _Case()
        b, hq, hkv, d, bs, nb, width = 3, 32, 8, 128, 16, 256, 64
        qlens = (9, 1, 4)
        t = sum(qlens) if varlen else b
        c.t("q", (t, hq, d), dtype, (3 * hq * d, d, 1))
        c.t("kc", (nb, bs, hkv, d), cache_dtype)
        c.t("vc", (nb, bs, hkv, d), cache_dtype)
        c.t("bt", (b, width), torch.int32)
        c.t("seq", (b,), torch.int32)
        c.t("out", (t, hq, d), dtype)
        fp8 = cache_dtype == FP8
        for name, shape, dt, on in (("cu", (b + 1,), torch.int32, varlen), ("sinks", (hq,), torch.float32, sinks),
                                    ("ks", (), torch.float32, fp8), ("vs", (), torch.float32, fp8),
                                    ("lse", (t, hq), torch.float32, lse)):
            if on:
                c.t(name, shape, dt)
        if ws:
            q_ = torch.empty(t, hq, d)
            c.t("ws", (capi.paged_attention_workspace_size(q_, torch.empty(1, bs, hkv, d), 0),), torch.uint8)
        max_q = max(qlens) if varlen else 0
        o = capi.options("paged_attention", causal=causal, window_left=window[0], window_right=window[1],
                         softcap=softcap)
        g = lambda n: c.dl(n) if n in c.host else None

        def call(so):
            return so.ks_paged_attention(g("q"), g("kc"), g("vc"), g("bt"), g("seq"), g("cu"), max_q, 0, g("sinks"),
                                         g("ks"), g("vs"), g("out"), g("lse"), g("ws"), ctypes.byref(o), None)

        def py(m):
            tuning = contextlib.nullcontext() if ws else launch.TUNING.use(launch.PagedTuning(splits=1))
            with tuning:
                launch.paged_attention(m["q"], m["kc"], m["vc"], m["bt"], m["seq"], m.get("cu"), max_q or 1, causal,
                                       1.0 / math.sqrt(d), window, softcap, m.get("sinks"), m.get("ks"), m.get("vs"),
                                       width * bs)
        internal = {"~O": ("out", 0), "~LSE": ("lse", 0) if lse else "scratch", "~PO": ("ws", 0)}
        internal["~PLSE"] = ("ws", -1)  # placed after the partial outputs: filled in by the test
        return ("ks_paged_attention", call, py, c, internal)

    def merge(dtype, lse):
        c = _Case()
        t, h, d = 5, 32, 128
        c.t("oa", (t, h, d), dtype, (3 * h * d, d, 1))
        c.t("la", (t, h), torch.float32)
        c.t("ob", (t, h, d), dtype)
        c.t("lb", (t, h), torch.float32, (1, t))
        c.t("out", (t, h, d), dtype)
        if lse:
            c.t("lse", (t, h), torch.float32)
        return ("ks_merge_attn_states",
                lambda so: so.ks_merge_attn_states(c.dl("oa"), c.dl("la"), c.dl("ob"), c.dl("lb"), c.dl("out"),
                                                   c.dl("lse") if lse else None, None),
                lambda m: launch.merge_attn_states(m["oa"], m["la"], m["ob"], m["lb"]), c,
                {"~O": ("out", 0), "~LSE": ("lse", 0) if lse else "scratch"})

    def flash(dtype, varlen, lse, causal=True, window=(-1, -1), softcap=0.0, sinks=False, dv=128):
        c = _Case()
        b, s, hq, hkv, d = 2, 100, 32, 8, 128
        if varlen:
            c.t("q", (200, hq, d), dtype)
            c.t("k", (220, hkv, d), dtype, (2 * hkv * d, d, 1))
            c.t("v", (220, hkv, dv), dtype)
            c.t("cu_q", (b + 1,), torch.int32)
            c.t("cu_k", (b + 1,), torch.int32)
            c.t("out", (200, hq, dv), dtype)
            if lse:
                c.t("lse", (hq, 200), torch.float32)
        else:
            c.t("q", (b, s, hq, d), dtype, (hq * s * d, d, s * d, 1))  # a [B, S, H, D] view of [B, H, S, D]
            c.t("k", (b, s + 20, hkv, d), dtype)
            c.t("v", (b, s + 20, hkv, dv), dtype)
            c.t("out", (b, s, hq, dv), dtype)
            if lse:
                c.t("lse", (b, hq, s), torch.float32)
        if sinks:
            c.t("sinks", (hq,), torch.float32)
        o = capi.options("flash_attention_varlen" if varlen else "flash_attention", causal=causal,
                         window_left=window[0], window_right=window[1], softcap=softcap)
        g = lambda n: c.dl(n) if n in c.host else None
        if varlen:
            call = lambda so: so.ks_flash_attention_varlen(g("q"), g("k"), g("v"), g("cu_q"), g("cu_k"), 150, 170,
                                                           g("sinks"), g("out"), g("lse"), ctypes.byref(o), None)
        else:
            call = lambda so: so.ks_flash_attention(g("q"), g("k"), g("v"), g("sinks"), g("out"), g("lse"),
                                                    ctypes.byref(o), None)

        def py(m):
            launch.flash_attention_fwd(m["q"], m["k"], m["v"], m.get("cu_q"), m.get("cu_k"), 150 if varlen else s,
                                       170 if varlen else s + 20, causal, 1.0 / math.sqrt(d), window, softcap,
                                       m.get("sinks"), lse)
        return ("ks_flash_attention", call, py, c, {"~O": ("out", 0), "~LSE": ("lse", 0) if lse else "scratch"})

    yield "paged_decode_split", paged(torch.bfloat16, torch.bfloat16, False, True, True)
    yield "paged_decode_one_pass", paged(torch.bfloat16, torch.bfloat16, False, False, False)
    yield "paged_prefill", paged(torch.float16, torch.float16, True, False, True, (100, 0), 30.0, True)
    yield "paged_prefill_split_noncausal", paged(torch.float16, torch.float16, True, True, True, (5, 3), 0.0, False,
                                                 False)
    yield "paged_fp8", paged(torch.bfloat16, FP8, False, False, True)
    yield "merge_bf16", merge(torch.bfloat16, True)
    yield "merge_fp32_no_lse", merge(torch.float32, False)
    yield "flash_dense_causal", flash(torch.bfloat16, False, True)
    yield "flash_dense_dv", flash(torch.float32, False, False, False, (16, 4), 0.0, True, dv=64)
    yield "flash_varlen", flash(torch.float16, True, False, True, (16, 0), 20.0, True)
    yield "flash_varlen_lse", flash(torch.bfloat16, True, True, False)


def _mla_spy_cases():
    def mla(dtype, cache_dtype, lse, b=3, h=16, q_strided=False, max_seq_len=0):
        c = _Case()
        r, p, bs, nb, width = 512, 64, 64, 64, 16
        c.t("qn", (b, h, r), dtype, (h * (r + p), r + p, 1) if q_strided else None)  # a view of [B, H, R + P]
        c.t("qp", (b, h, p), dtype)
        c.t("kv", (nb, bs, r + p), cache_dtype)
        c.t("bt", (b, width), torch.int32)
        c.t("seq", (b,), torch.int32)
        fp8 = cache_dtype == FP8
        if fp8:
            c.t("kvs", (), torch.float32)
        c.t("out", (b, h, r), dtype)
        if lse:
            c.t("lse", (b, h), torch.float32)
        o = capi.options("mla_decode", scale=192 ** -0.5)
        g = lambda n: c.dl(n) if n in c.host else None

        def call(so):
            return so.ks_mla_decode(g("qn"), g("qp"), g("kv"), g("bt"), g("seq"), max_seq_len, g("kvs"), g("out"),
                                    g("lse"), ctypes.byref(o), None)

        def py(m):
            mla_launch.mla_decode(m["qn"], m["qp"], m["kv"], m["bt"], m["seq"], 192 ** -0.5, m.get("kvs"),
                                  max_seq_len or width * bs)
        # the partials follow the LSE when the LSE is discarded too: all of them in the discard buffer
        return ("ks_mla_decode", call, py, c, {"~O": ("out", 0), "~LSE": ("lse", 0) if lse else "scratch",
                                               "~PO": "scratch", "~PLSE": "scratch"})

    yield "mla_split", mla(torch.bfloat16, torch.bfloat16, True)  # 3 sequences on 132 SMs: 4 splits + reduce
    yield "mla_fp8_no_lse", mla(torch.bfloat16, FP8, False)
    yield "mla_one_pass_strided_q", mla(torch.float16, torch.float16, True, b=300, q_strided=True)
    yield "mla_max_seq_len", mla(torch.bfloat16, torch.bfloat16, False, b=64, h=128, max_seq_len=700)


def _spy_cases():
    return [*_rope_spy_cases(), *_kv_spy_cases(), *_attn_spy_cases(), *_mla_spy_cases()]


@pytest.mark.parametrize("case", [name for name, _ in _spy_cases()])
def test_cuda_dispatch_matches_the_python_launcher(spy, case):
    so, kernels, compiled = spy
    fn_name, call, py, c, internal = dict(_spy_cases())[case]
    modules = (attn_launch, rope_launch, kv_launch, mla_launch)
    _spy_plans(so)
    status = call(so)
    assert status == 0, so.ks_last_error().decode()
    plans = _spy_plans(so)
    launches = _python_launches(py, c, modules)
    if internal.get("~PLSE") == ("ws", -1):
        splits = [dict((p[0], p[3]) for p in ln["params"])["num_splits"] for ln in launches
                  if ln["kernel"] == "_paged_attn_fwd_kernel"][0]
        t, hq, d = c.host["q"].shape
        internal["~PLSE"] = ("ws", -(-(t * hq * splits * d * 4) // 256) * 256)
    _compare(plans, launches, c, kernels, compiled, internal)
