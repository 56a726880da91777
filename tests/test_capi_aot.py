"""The CUDA half of the C ABI (capi/aot, capi/src/cuda), on a machine without a GPU.

The generator compiles the ``test`` set of kernel variants for sm_80/89/90 (+PTX) and emits C;
that C and capi/src/cuda/*.c build into a test library with -Wall -Wextra -Werror, linked against
nothing but libc. Then, through ctypes:

- every op's generated plan (variant, grid, each argument) equals what the Python launcher
  records on meta tensors, over a sweep of shapes, dtypes, strides, SM counts, compute
  capabilities and alignments (tensors the launcher allocates for itself, split-KV partials and
  LSEs nobody asked for, sit where the C plan puts them: the caller's workspace, the discard
  buffer); the exact variant when compiled in, else the fallback;
- exact variants are compiled from the signature, constexprs and divisibility attributes that
  Triton's own JIT binder derives from the launcher's arguments (the Python path's machine code);
- each translated policy returns the Python policy's fields over a dense sweep;
- the embedded images are byte-identical to what Triton compiled, and each cubin's own ELF
  metadata (parameter count and sizes, hidden parameters included; threads per block; sm) agrees
  with the variant table the launcher uses; the image choice per compute capability;
- without libcuda every launch fails cleanly; against a fake libcuda (capi/aot/fake_cuda.c): the
  scratch is per stream when eager and graph-owned under capture, the smoke program issues every launch, and the
  whole library (core, op files, launcher) launches for every GPU case exactly what Python does;
- the hand-written driver declarations against a real cuda.h (Triton ships one).

Compilation needs Triton's NVIDIA backend (ptxas); without it the module is skipped, as in the
families' AOT tests.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AOT = os.path.join(ROOT, "capi", "aot")
CUDA_SRC = os.path.join(ROOT, "capi", "src", "cuda")
INCLUDE = os.path.join(ROOT, "capi", "include")


def _nvidia_unavailable() -> str | None:
    try:
        from triton.backends import backends
        if "nvidia" not in backends:
            return "this Triton has no NVIDIA backend"
        from triton.backends.nvidia.compiler import get_ptxas
        for arch in (80, 90):
            get_ptxas(arch).path
    except Exception as exc:
        return f"Triton NVIDIA backend/ptxas not usable: {type(exc).__name__}: {exc}"
    if not shutil.which("gcc"):
        return "no gcc to build the C library"
    return None


_reason = _nvidia_unavailable()
if _reason:
    pytest.skip(_reason, allow_module_level=True)

KS_OK, KS_ERR_UNSUPPORTED_SHAPE, KS_ERR_CUDA, KS_ERR_NOT_IMPLEMENTED = 0, 3, 7, 9
KEY_NONE = -(2**63)
CFLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-fPIC"]


def _env():
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def _generate(out: str, which: str, *extra: str) -> str:
    proc = subprocess.run([sys.executable, os.path.join(AOT, "generate.py"), "--out", out, "--set", which, *extra],
                          capture_output=True, text=True, env=_env(), timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def _build(gen: str, out: str) -> None:
    srcs = sorted(os.path.join(CUDA_SRC, f) for f in os.listdir(CUDA_SRC) if f.endswith(".c"))
    srcs += sorted(os.path.join(gen, f) for f in os.listdir(gen) if f.endswith(".c"))
    cmd = ["gcc", *CFLAGS, "-shared", f"-I{INCLUDE}", f"-I{CUDA_SRC}", f"-I{gen}", *srcs, "-o", out,
           "-ldl", "-lpthread"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("capi_aot")
    gen = str(tmp / "generated")
    log = _generate(gen, "test")
    lib = str(tmp / "libks_cuda_test.so")
    _build(gen, lib)
    cases = str(tmp / "cases.json")
    proc = subprocess.run([sys.executable, os.path.join(AOT, "generate.py"), "--dump-cases", cases],
                          capture_output=True, text=True, env=_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.load(open(os.path.join(gen, "manifest.json")))
    return dict(gen=gen, lib=lib, so=ctypes.CDLL(lib), manifest=manifest, cases=json.load(open(cases)), log=log,
                tmp=tmp)


def _json(fn, *args) -> dict:
    buf = ctypes.create_string_buffer(1 << 16)
    n = fn(*args, buf, ctypes.c_size_t(len(buf)))
    assert 0 < n < len(buf) - 1, n
    return json.loads(buf.value.decode())


# ---------------------------------------------------------------------------------------------
# the generator and the library


def test_generator_reports_and_is_incremental(built):
    m = built["manifest"]
    assert m["set"] == "test" and m["archs"] == [80, 89, 90] and m["ptx"] == [89, 90]
    assert len(m["variants"]) >= 30, "every op's test cases give at least two variants (aligned, unaligned)"
    assert "variants" in built["log"] and "compile" in built["log"]
    again = _generate(built["gen"], "test")  # same inputs: the content hash matches, nothing recompiled
    assert "up to date" in again, again
    assert open(os.path.join(built["gen"], "hash.txt")).read().strip() == m["hash"]


def test_library_links_only_libc(built):
    out = subprocess.run(["ldd", built["lib"]], capture_output=True, text=True).stdout
    libs = {re.split(r"[\s=]", line.strip())[0] for line in out.splitlines() if line.strip()}
    allowed = re.compile(r"^(linux-vdso\.so\.1|linux-gate\.so\.1|/lib\d*/ld-linux[-\w.]*\.so\.\d|"
                         r"lib(c|dl|pthread|m)\.so\.\d+)$")
    assert libs and all(allowed.match(x) for x in libs), libs
    undefined = subprocess.run(["nm", "-D", "--undefined-only", built["lib"]], capture_output=True, text=True).stdout
    assert "cuLaunchKernel" not in undefined and "cuInit" not in undefined  # only through dlsym


def test_empty_set_builds_and_refuses(tmp_path):
    gen = str(tmp_path / "gen")
    _generate(gen, "none")
    lib = str(tmp_path / "none.so")
    _build(gen, lib)
    so = ctypes.CDLL(lib)
    plan, err = ctypes.create_string_buffer(1 << 16), ctypes.create_string_buffer(2048)
    s = so.ks_cuda_softmax_fwd_plan(plan, ctypes.c_int64(132), ctypes.c_int64(90), err, ctypes.c_size_t(2048), *_c_values(
        ["bf16", "bf16", "X", "Y", 4, 4096, 4096, 4096, 1.0, 0], so, "softmax_fwd", {}))
    assert s == KS_ERR_NOT_IMPLEMENTED and b"no compiled variant of _softmax_fwd_kernel" in err.value


# ---------------------------------------------------------------------------------------------
# plans: C versus the Python launcher


def _c_values(values, so, op_name, addresses):
    """ctypes values of an op's C parameters; tensors (by name) become fake device addresses."""
    if AOT not in sys.path:
        sys.path.insert(0, AOT)
    import ops
    params = {op.name: op.c_params for op in ops.OPS}[op_name]
    assert len(params) == len(values), op_name
    return [_ctype(t.strip(), v, addresses) for (t, _), v in zip(params, values)]


def _ctype(t: str, v, addresses):
    if t.endswith("*"):
        return ctypes.c_void_p(None if v is None else addresses.setdefault(v, 0x10000000 * (len(addresses) + 1)))
    if t == "int32_t":
        from record import DT_BY_NAME
        return ctypes.c_int32(DT_BY_NAME[v] if isinstance(v, str) else v)
    if t == "int64_t":
        return ctypes.c_int64(v)
    if t == "int":
        return ctypes.c_int(v)
    if t == "double":
        return ctypes.c_double(v)
    raise AssertionError(t)


@pytest.fixture(scope="module")
def plans(built):
    if AOT not in sys.path:
        sys.path.insert(0, AOT)
    return built


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _address(value, addresses, placed):
    """(kind, value) of a pointer argument: a named tensor's fake address, a launcher-internal one
    placed in another tensor (the workspace) at an offset, or an offset in the discard buffer."""
    where = placed.get(value)
    if where is None:
        return "ptr", addresses[value]
    base, offset = where
    return ("scratch", offset) if base == "scratch" else ("ptr", addresses[base] + offset)


def _int_class(v: int) -> int:
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend
    kind, attr = native_specialize_impl(CUDABackend, v, False, True, True)  # what Triton's JIT does
    return 2 if kind == "constexpr" else 1 if attr == "D" else 0


def _expected_key(ln, kernel, addresses, placed, compiled):
    """The key ks_cuda_plan_add must pick: the exact (JIT) specialization when compiled in, else the
    fallback; and whether it is the exact one."""
    from record import DT_BY_NAME
    align_ints = set(kernel["align_ints"])
    prefix, spec, aligned = [], [], 1
    for (name, is_const, kind, value, dtype), role in zip(ln["params"], [p["role"] for p in kernel["params"]]):
        if role == "ptr":
            prefix.append(KEY_NONE if kind == "none" else DT_BY_NAME[dtype])
            if kind == "none":
                spec.append(-1)
            else:
                ok = _address(value, addresses, placed)[1] % 16 == 0
                spec.append(int(ok))
                aligned &= ok
        elif role == "constexpr":
            prefix.append(KEY_NONE if value is None else int(value))
        elif role == "int":
            spec.append(_int_class(value))
            if name in align_ints and value % 16:
                aligned = 0
    tail = [ln["num_warps"], ln["num_stages"], ln["fp_fusion"]]
    exact = prefix + spec + tail + [2]
    if tuple(exact) in compiled:
        return exact, True
    return prefix + [-1] * len(spec) + tail + [int(aligned)], False


def _expected_args(ln, addresses, placed, exact):
    out = []
    for name, is_const, kind, value, dtype in ln["params"]:
        if is_const or kind == "none":
            continue
        if kind == "tensor":
            out.append(list(_address(value, addresses, placed)))
        elif kind == "int":
            if not (exact and value == 1):  # the exact variant has it as a constexpr
                out.append(["i32", value])
        else:
            out.append(["f32", _f32(value)])
    return out


def _check_case(so, kernels, entry, compiled):
    addresses: dict = {}
    for name in entry["case"].get("misalign", []):  # these tensors start 2 bytes off a 16-byte boundary
        addresses[name] = 0x10000000 * (len(addresses) + 1) + 2
    values = _c_values(entry["c_args"], so, entry["op"], addresses)
    plan, err = ctypes.create_string_buffer(1 << 16), ctypes.create_string_buffer(4096)
    fn = getattr(so, f"ks_cuda_{entry['op']}_plan")
    status = fn(plan, ctypes.c_int64(entry["case"].get("sms", 132)), ctypes.c_int64(entry["case"].get("cc", 90)), err,
                ctypes.c_size_t(len(err)), *values)
    placed = entry["placed"]
    where = f"{entry['op']} {entry['case']}"
    assert status in (KS_OK, KS_ERR_NOT_IMPLEMENTED), f"{where}: status {status}: {err.value.decode()}"
    got = _json(so.ks_cuda_plan_json, plan)
    want = [ln for ln in entry["launches"] if all(g > 0 for g in ln["grid"])]  # Triton launches nothing else
    assert [g["kernel"] for g in got["launches"]] == [w["kernel"] for w in want], where
    for g, w in zip(got["launches"], want):
        kernel = kernels[w["kernel"]]
        assert g["grid"] == w["grid"], f"{where}: grid {g['grid']} != Python's {w['grid']}"
        key = [KEY_NONE if k is None else k for k in g["key"]]
        want_key, exact = _expected_key(w, kernel, addresses, placed, compiled[w["kernel"]])
        assert key == want_key, f"{where}: {w['kernel']} specialization differs"
        args = [[k, _f32(v) if k == "f32" else v] for k, v in g["args"]]  # %.9g round-trips an fp32
        assert args == _expected_args(w, addresses, placed, exact), f"{where}: {w['kernel']} arguments differ"
        assert g["variant"] >= 0 or status == KS_ERR_NOT_IMPLEMENTED, where
    assert (status == KS_ERR_NOT_IMPLEMENTED) == (got["missing"] > 0), where
    scratch = [off for base, off in placed.values() if base == "scratch"]
    assert (got["scratch_bytes"] > 0) == bool(scratch and want), f"{where}: discard buffer {got['scratch_bytes']}"
    return status


def _compiled(manifest) -> dict:
    out: dict = {}
    for v in manifest["variants"]:
        out.setdefault(v["kernel"], set()).add(tuple(KEY_NONE if k is None else k for k in v["key"]))
    return out


def test_plans_equal_the_python_launchers_on_the_test_set(plans):
    kernels = {k["name"]: k for k in plans["manifest"]["kernels"]}
    compiled = _compiled(plans["manifest"])
    entries = [e for e in plans["cases"] if e["set"] == "test"]
    assert {e["op"] for e in entries} == {op["name"] for op in plans["manifest"]["ops"]}
    for e in entries:
        # every test case is compiled in: its plan must find the variant (the exact one, unless
        # the case asks for its fallback)
        assert _check_case(plans["so"], kernels, e, compiled) == KS_OK, e
        got = _json(plans["so"].ks_cuda_plan_json, _plan(plans["so"], e))
        modes = {launch["key"][-1] for launch in got["launches"]}
        assert modes <= ({0, 1} if e["case"].get("generic") else {2}), (e["case"], modes)


def _plan(so, entry):
    plan, err = ctypes.create_string_buffer(1 << 16), ctypes.create_string_buffer(4096)
    addresses: dict = {}
    getattr(so, f"ks_cuda_{entry['op']}_plan")(plan, ctypes.c_int64(entry["case"].get("sms", 132)),
                                               ctypes.c_int64(entry["case"].get("cc", 90)), err,
                                               ctypes.c_size_t(len(err)),
                                               *_c_values(entry["c_args"], so, entry["op"], addresses))
    return plan


def test_plans_equal_the_python_launchers_over_the_sweep(plans):
    kernels = {k["name"]: k for k in plans["manifest"]["kernels"]}
    compiled = _compiled(plans["manifest"])
    entries = [e for e in plans["cases"] if e["set"] == "sweep"]
    by_op: dict[str, int] = {}
    for e in entries:
        _check_case(plans["so"], kernels, e, compiled)
        by_op[e["op"]] = by_op.get(e["op"], 0) + 1
    assert all(n >= 40 for n in by_op.values()), by_op


def test_release_set_follows_the_models(plans, tmp_path):
    """The release set's cases (capi/aot/ops/models.py) for three presets whose layers differ
    (Llama GQA; gpt-oss sinks, sliding window, head size 64; Qwen3 q/k norms): every op has cases, they carry the
    models' dimensions, and the C plans equal the Python launchers on a sample of them (the test
    library lacks most of their variants: the plan then names what is missing)."""
    cases = str(tmp_path / "release.json")
    proc = subprocess.run([sys.executable, os.path.join(AOT, "generate.py"), "--dump-cases", cases, "--dump-sets",
                           "release", "--models", "llama-3.1-8b,gpt-oss-20b,qwen3-0.6b"], capture_output=True, text=True,
                          env=_env(), timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    entries = json.load(open(cases))
    by_op: dict[str, list] = {}
    for e in entries:
        by_op.setdefault(e["op"], []).append(e)
    # every op but MLA decode, which none of these presets uses (DeepSeek's shapes: below)
    assert set(by_op) == {op["name"] for op in plans["manifest"]["ops"]} - {"mla_decode"}
    from ops import mla, models
    models.select(["deepseek-v3"])
    try:
        mla_shapes = {(c["h"], c["r"], c["p"], c["bs"]) for c in mla.MLA_DECODE.cases("release")}
    finally:
        models.select([])
    assert mla_shapes == {(128, 512, 64, 64)}, mla_shapes
    norm_widths = {e["case"]["n"] for e in by_op["norm_fwd"]}
    assert norm_widths == {4096, 2880, 1024, 128}, norm_widths  # hidden sizes and Qwen3's per-head q/k norm
    assert {e["case"]["i"] for e in by_op["act_fwd"]} == {14336, 2880, 3072}
    assert {(e["case"]["hq"], e["case"]["hk"], e["case"]["d"]) for e in by_op["rope_ext"]} == {(16, 8, 128)}
    assert {(e["case"]["hq"], e["case"]["hkv"], e["case"]["d"]) for e in by_op["paged_attention"]} == \
        {(32, 8, 128), (64, 8, 64), (16, 8, 128)}
    assert any(e["case"]["sinks"] and list(e["case"]["window"]) == [127, 0] for e in by_op["paged_attention"])
    bad = subprocess.run([sys.executable, os.path.join(AOT, "generate.py"), "--dump-cases", cases, "--dump-sets",
                          "release", "--models", "no-such-model"], capture_output=True, text=True, env=_env(),
                         timeout=300)
    assert bad.returncode != 0 and "unknown preset(s) no-such-model" in bad.stderr + bad.stdout
    kernels = {k["name"]: k for k in plans["manifest"]["kernels"]}
    compiled = _compiled(plans["manifest"])
    for op, es in sorted(by_op.items()):
        for e in es[:: max(1, len(es) // 25)]:
            _check_case(plans["so"], kernels, e, compiled)


def test_exact_variants_take_the_jit_specialization(plans):
    """An exact variant is compiled from the very signature, constexprs and divisibility
    attributes Triton's JIT derives (its own binder, recorded with each launch) from the Python
    launcher's arguments: the same compiler input, so the same machine code as the Python path."""
    from generate import MODE_EXACT, compile_inputs, launch_spec
    roles = {k["name"]: [(p["name"], p["role"]) for p in k["params"]] for k in plans["manifest"]["kernels"]}
    align = {k["name"]: k["align_ints"] for k in plans["manifest"]["kernels"]}
    checked = 0
    for e in plans["cases"]:
        if e["case"].get("misalign"):  # meta tensors have no address: the JIT would see them aligned
            continue
        for ln in e["launches"]:
            if any(kind == "int" and not -(2**31) <= v < 2**31 for _, _, kind, v, _ in ln["params"]):
                continue  # the C plan refuses these (test_plan_refuses_ints_beyond_int32)
            kroles = roles[ln["kernel"]]
            params = [[name, role, dtype if role == "ptr" and kind == "tensor" else value if role == "constexpr" else None]
                      for (name, _, kind, value, dtype), (_, role) in zip(ln["params"], kroles)]
            names = [n for n, role in kroles if role in ("ptr", "int")]
            task = dict(params=params, mode=MODE_EXACT, spec=list(zip(names, launch_spec(ln, kroles, e["case"]))),
                        align_ints=align[ln["kernel"]])
            sig, consts, attrs = compile_inputs(task)
            for i, ((name, _, kind, value, _), (ty, attr)) in enumerate(zip(ln["params"], ln["jit"])):
                where = f"{e['op']} {e['case']} {ln['kernel']}.{name}"
                assert sig[name] == ty, f"{where}: {sig[name]} != the JIT's {ty}"
                if ty == "constexpr":
                    assert consts[name] == (value if kind != "none" else None), where
                else:
                    assert ((i,) in attrs) == (attr == "D"), f"{where}: divisibility {attrs.get((i,))} vs the JIT's {attr!r}"
            checked += 1
    assert checked > 1000, checked


def test_plan_refuses_ints_beyond_int32(plans):
    values = _c_values(["bf16", "bf16", "X", "Y", 3, 2**31, 2**31, 2**31, 1.0, 0], plans["so"], "softmax_fwd", {})
    plan, err = ctypes.create_string_buffer(1 << 16), ctypes.create_string_buffer(2048)
    s = plans["so"].ks_cuda_softmax_fwd_plan(plan, ctypes.c_int64(132), ctypes.c_int64(90), err, ctypes.c_size_t(2048),
                                             *values)
    assert s == KS_ERR_UNSUPPORTED_SHAPE and b"does not fit the int32" in err.value


def test_norm_plan_rejects_inconsistent_pointers(plans):
    # residual without its output h, and a mean for RMSNorm: the Python launcher never does either
    for args in (["bf16", "bf16", "X", "R", "W", None, "Y", None, None, None, 4, 64, 64, 64, 64, 0, 1e-6, 0.0, 1, 0],
                 ["bf16", "bf16", "X", None, "W", None, "Y", None, "MEAN", "RSTD", 4, 64, 64, 0, 64, 0, 1e-6, 0.0, 1, 0]):
        plan, err = ctypes.create_string_buffer(1 << 16), ctypes.create_string_buffer(2048)
        s = plans["so"].ks_cuda_norm_fwd_plan(plan, ctypes.c_int64(132), ctypes.c_int64(90), err, ctypes.c_size_t(2048),
                                              *_c_values(args, plans["so"], "norm_fwd", {}))
        assert s == 1, err.value  # KS_ERR_INVALID_ARGUMENT


# ---------------------------------------------------------------------------------------------
# translated policies versus Python


def _policy(so, c_name, n, *args):
    out = (ctypes.c_int64 * n)()
    assert getattr(so, c_name)(*[ctypes.c_int64(a) for a in args], out) == 0
    return list(out)


def _flat(obj) -> list[int]:
    import dataclasses
    if isinstance(obj, tuple):
        return [int(v) for v in obj]
    out = []
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        out += [int(x) for x in v] if isinstance(v, tuple) else [int(v)]
    return out


def test_translated_policies_equal_python(plans):
    import itertools

    from kernelset.ops.activation import launch as act
    from kernelset.ops.attention import launch as attn
    from kernelset.ops.embedding import launch as emb
    from kernelset.ops.kvcache import launch as kv
    from kernelset.ops.loss import launch as loss
    from kernelset.ops.norm import policy as norm
    from kernelset.ops.rope import launch as rope
    from kernelset.ops.softmax import launch as sm
    so = plans["so"]
    seen = set()

    def check(c_name, py, *args):
        seen.add(c_name)
        want = _flat(py(*args))
        got = _policy(so, c_name, len(want), *args)
        assert got == want, f"{c_name}{args}: C {got} != Python {want}"

    ns = sorted({*range(0, 600), *[v + d for v in (2**k for k in range(9, 27)) for d in (-1, 0, 1)], 2**31 - 1})
    for n, m, sms in itertools.product(ns, (0, 1, 7, 100000), (1, 132)):
        for plain in (0, 1):
            check("ks_pol_norm_fwd", lambda m, n, s, r: norm.fwd_policy(m, n, s, bool(r), norm.DEFAULT_TUNING), m, n,
                  sms, plain)
        t = sm.SoftmaxTuning()
        check("ks_pol_softmax", lambda m, n, s: sm.policy(m, n, t.max_block_fwd, s, t), m, n, sms)
        if m == 0:  # (the split policies do not take m)
            check("ks_pol_norm_fwd_split", lambda n, s: norm.fwd_split_policy(n, s, norm.DEFAULT_TUNING), n, sms)
            for esize in (2, 4):
                check("ks_pol_softmax_split", lambda n, e, s: sm.split_policy(
                    n, t.max_block_fwd, t.split_chunk_fwd, t.split_min_fwd, t.looped_only_fwd, e, s, t), n, esize, sms)
        if m:
            check("ks_pol_ce_fwd", lambda m, v, s: loss.ce_fwd_policy(m, v, s, False, loss.CETuning()), m, max(n, 1),
                  sms)
    for m, i in itertools.product((1, 2, 3, 5, 63, 64, 65, 4096, 10**6), ns[:300] + [4096, 14336, 2**20]):
        for a in act.ACTS.values():
            check("ks_pol_act", act.act_policy, m, i, a)
        if i:
            check("ks_pol_embedding", emb.embedding_policy, m, i)
            check("ks_pol_copy", kv.copy_policy, m, i)
    for h, d in itertools.product(range(1, 200), (1, 3, 64, 80, 96, 128, 192, 256, 512, 4096)):
        check("ks_pol_cache", kv.cache_policy, h, d)
        for hk in (0, 1, h // 4, h):
            check("ks_pol_rope_fwd", rope.rope_fwd_policy, 7, h, hk, d // 2)
        for half, norm_ in ((d // 2, 0), (d // 4, 1), (d // 2, 1)):
            for hk in (0, 1, h // 4, h):
                check("ks_pol_rope_ext", rope.ext_tiles, h, hk, d, half, norm_)
        check("ks_pol_merge", attn.merge_policy, h * 7, d)
    for splits, bd in itertools.product(range(1, 65), (16, 64, 128, 256)):
        check("ks_pol_paged_reduce", attn.paged_reduce_policy, splits, bd)
    for d, dv, arch in itertools.product((1, 16, 64, 80, 128, 192, 256), (16, 64, 128, 256),
                                         ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0))):
        check("ks_pol_flash", lambda d, dv, a, b: attn.flash_policy(d, dv, (a, b)), d, dv, *arch)
    split = attn.PagedTuning(splits=1)
    for b, hkv, g, d, q, keys, sms, fp8 in itertools.product((1, 3, 64), (1, 8), (1, 4, 7), (64, 128, 256),
                                                             (1, 2, 512), (1, 255, 4096, 10**6), (1, 108, 132), (0, 1)):
        check("ks_pol_paged", lambda *a: attn.paged_policy(*a[:-1], attn.PagedTuning(), bool(a[-1])), b, hkv, g, d,
              q, keys, sms, fp8)
        check("ks_pol_paged_nosplit", lambda *a: attn.paged_policy(*a[:-1], split, bool(a[-1])), b, hkv, g, d, q,
              keys, sms, fp8)
    from kernelset.ops.mla import launch as mla
    for b, h, r, p, keys, sms, fp8 in itertools.product((1, 3, 64, 300), (1, 16, 20, 64, 128), (64, 80, 512),
                                                        (8, 64), (0, 1, 255, 4096, 10**6), (1, 108, 132), (0, 1)):
        check("ks_pol_mla", lambda *a: mla.mla_policy(*a[:-1], bool(a[-1]), mla.MlaTuning()), b, h, r, p, keys, sms,
              fp8)
    for splits in range(1, 65):
        check("ks_pol_mla_reduce", mla.mla_reduce_policy, splits)
    translated = {pol["c_name"] for pol in plans["manifest"]["policies"]}
    assert seen == translated, f"policies without a sweep here: {sorted(translated - seen)}"


# ---------------------------------------------------------------------------------------------
# the compiled variants: metadata, bytes, image choice


def _cuobjdump():
    from triton.backends.nvidia.compiler import get_ptxas
    path = os.path.join(os.path.dirname(get_ptxas(90).path), "cuobjdump")
    return path if os.path.exists(path) else shutil.which("cuobjdump")


def test_embedded_images_match_the_compiled_kernels(plans):
    so, manifest = plans["so"], plans["manifest"]
    assert ctypes.c_int32.in_dll(so, "ks_cuda_num_variants").value == len(manifest["variants"])
    tool = _cuobjdump()
    size = {"ptr": 8, "i64": 8, "i32": 4, "f32": 4}
    kinds = {0: "ptr", 1: "i32", 2: "i64", 3: "f32"}
    for mv in manifest["variants"]:
        cv = _json(so.ks_cuda_variant_json, ctypes.c_int32(mv["index"]))
        assert cv["entry"] == mv["entry"] and cv["num_warps"] == mv["num_warps"] and cv["num_ctas"] == 1
        assert [kinds[k] for k in cv["param_kinds"]] == mv["params"] and cv["num_params"] == len(mv["params"])
        # user parameters: non-constexpr, non-None, in order; the rest are Triton's hidden scratch
        # pointers (global, profile in Triton 3.9), which the launcher passes as NULL
        tokens = mv["spec"].split()
        pointers = [p for p in tokens if ":*" in p]
        kparams = next(k["params"] for k in plans["manifest"]["kernels"] if k["name"] == mv["kernel"])
        # the exact variants take no argument for an int that was 1 (``M=1``: a constexpr)
        ints = [q["name"] for q in kparams if q["role"] == "int" and f"{q['name']}=1" not in tokens]
        floats = [q["name"] for q in kparams if q["role"] == "float"]
        assert cv["num_user_params"] == len(pointers) + len(ints) + len(floats)
        assert mv["num_hidden_params"] == cv["num_params"] - cv["num_user_params"] >= 1
        assert all(k == "ptr" for k in mv["params"][cv["num_user_params"]:])
        assert len(cv["images"]) == len(mv["images"])
        for ci, mi in zip(cv["images"], mv["images"]):
            data = ctypes.string_at(ci["address"], ci["size"])
            assert ci["size"] == mi["bytes"] and hashlib.sha256(data).hexdigest() == mi["sha256"]
            assert ci["shared"] == mi["shared"] and ci["arch"] == mi["arch"]
            if mi["kind"] == "ptx":
                text = data.decode()
                assert text.endswith("\0") and re.search(rf"^\.target sm_{mi['arch']}$", text, re.M), text[:300]
                continue
            if tool is None:
                continue
            path = os.path.join(plans["tmp"], "k.cubin")
            open(path, "wb").write(data)
            elf = subprocess.run([tool, "-elf", path], capture_output=True, text=True).stdout
            sm = re.search(r"sm=(\d+)a?", elf)
            assert sm and int(sm[1]) == mi["arch"], sm
            params = sorted((int(o, 16), int(off, 16), int(sz, 16)) for o, off, sz in re.findall(
                r"Ordinal\s*:\s*(0x[0-9a-f]+)\s+Offset\s*:\s*(0x[0-9a-f]+)\s+Size\s*:\s*(0x[0-9a-f]+)", elf))
            assert [o for o, _, _ in params] == list(range(len(mv["params"]))), (mv["spec"], params)
            assert [sz for _, _, sz in params] == [size[k] for k in mv["params"]], mv["spec"]
            threads = re.search(r"EIATTR_REQNTID\s+Format:\s+\S+\s+Value:\s+(0x[0-9a-f]+)", elf)
            assert threads and int(threads[1], 16) == 32 * mv["num_warps"]


class _Variant(ctypes.Structure):  # ks_kernel_variant of capi/src/cuda/ks_cuda.h
    _fields_ = [("index", ctypes.c_int32), ("kernel", ctypes.c_int32), ("entry", ctypes.c_char_p),
                ("spec", ctypes.c_char_p), ("num_warps", ctypes.c_int32), ("num_stages", ctypes.c_int32),
                ("num_ctas", ctypes.c_int32), ("num_params", ctypes.c_int32), ("num_user_params", ctypes.c_int32),
                ("param_kinds", ctypes.c_void_p), ("num_images", ctypes.c_int32), ("images", ctypes.c_void_p)]


class _Image(ctypes.Structure):  # ks_kernel_image
    _fields_ = [("arch", ctypes.c_int32), ("kind", ctypes.c_int32), ("data", ctypes.c_void_p),
                ("size", ctypes.c_size_t), ("shared", ctypes.c_int32)]


def _expected_image(have: set, cc: int):
    """The choice ks_cuda_select_image documents: the exact cubin; else the newest sm_8x cubin of
    the same major below cc (sm_90 and newer cubins are arch-specific); else the newest PTX <= cc."""
    if ("cubin", cc) in have:
        return ("cubin", cc)
    compatible = [im for im in have if im[0] == "cubin" and im[1] < 90 and im[1] // 10 == cc // 10 and im[1] < cc]
    if compatible:
        return max(compatible, key=lambda im: im[1])
    ptx = [im for im in have if im[0] == "ptx" and im[1] <= cc]
    return max(ptx, key=lambda im: im[1]) if ptx else None


def test_image_choice_per_compute_capability(plans):
    so, manifest = plans["so"], plans["manifest"]
    so.ks_cuda_select_image.restype = ctypes.POINTER(_Image)
    table = (_Variant * len(manifest["variants"])).in_dll(so, "ks_cuda_variants")
    seen_fp8 = False
    for mv in manifest["variants"]:
        v = table[mv["index"]]
        assert v.index == mv["index"] and v.entry.decode() == mv["entry"] and v.spec.decode() == mv["spec"]
        have = {(im["kind"], im["arch"]) for im in mv["images"]}
        for cc in (75, 80, 86, 87, 89, 90, 100, 103, 120):
            p = so.ks_cuda_select_image(ctypes.byref(v), ctypes.c_int(cc))
            got = None if not p else ("cubin" if p.contents.kind == 0 else "ptx", p.contents.arch)
            assert got == _expected_image(have, cc), (mv["spec"], cc, got)
        if "fp8e4nv" in mv["spec"]:  # Triton converts to e4m3 only from sm_89: no sm_80 image at all
            seen_fp8 = True
            assert not so.ks_cuda_select_image(ctypes.byref(v), 80) and not so.ks_cuda_select_image(ctypes.byref(v), 86)
            assert {("cubin", 89), ("cubin", 90)} <= have, mv["spec"]
        else:
            assert {("cubin", 80), ("cubin", 89), ("cubin", 90)} <= have, mv["spec"]
            assert so.ks_cuda_select_image(ctypes.byref(v), 86).contents.arch == 80  # sm_86 runs the sm_80 cubin
        # one PTX, sm_90's unless the kernel needs sm_90a (wgmma), then sm_89's: Blackwell JIT-compiles it
        ptx = [im for im in have if im[0] == "ptx"]
        assert len(ptx) == 1 and ptx[0][1] in (89, 90), (mv["spec"], have)
        assert (ptx[0][1] == 89) == any("needs sm_90a" in n for n in mv["notes"]), mv["notes"]
        assert so.ks_cuda_select_image(ctypes.byref(v), 100).contents.kind == 1
        assert so.ks_cuda_select_image(ctypes.byref(v), 75).__bool__() is False  # Turing: unsupported arch
    assert seen_fp8


# ---------------------------------------------------------------------------------------------
# no driver on this machine; the driver declarations


def _libcuda_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def test_launch_without_libcuda_fails_cleanly(plans):
    if _libcuda_present():
        pytest.skip("libcuda.so.1 is installed here; the GPU checks run the launches")
    so = plans["so"]
    err = ctypes.create_string_buffer(2048)
    values = _c_values(["bf16", "bf16", "X", None, "W", None, "Y", None, None, None, 7, 4096, 4096, 0, 4096, 0, 1e-6,
                        0.0, 1, 0], so, "norm_fwd", {})
    s = so.ks_cuda_norm_fwd_launch(ctypes.c_int(0), ctypes.c_void_p(None), err, ctypes.c_size_t(2048), *values)
    assert s == KS_ERR_CUDA and err.value.startswith(b"libcuda.so.1 not found: "), err.value
    assert so.ks_cuda_init(err, ctypes.c_size_t(2048)) == KS_ERR_CUDA  # again: same answer, no crash
    so.ks_cuda_tools_get.restype = ctypes.c_void_p
    assert so.ks_cuda_tools_get() is None


def test_smoke_program_builds_and_needs_a_gpu(plans):
    exe = str(plans["tmp"] / "smoke_gpu")
    srcs = [os.path.join(AOT, "smoke_gpu.c")] + sorted(
        os.path.join(d, f) for d in (CUDA_SRC, plans["gen"]) for f in os.listdir(d) if f.endswith(".c"))
    proc = subprocess.run(["gcc", *CFLAGS, f"-I{INCLUDE}", f"-I{CUDA_SRC}", f"-I{plans['gen']}", *srcs, "-o", exe,
                           "-ldl", "-lpthread", "-lm"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    if not _libcuda_present():
        run = subprocess.run([exe], capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and "libcuda.so.1 not found" in run.stdout, run.stdout + run.stderr
    # against the fake driver: every case plans and launches (the fake computes nothing, so each
    # comparison reports a mismatch, and no launch fails)
    fake_dir = plans["tmp"] / "fake"
    fake_dir.mkdir(exist_ok=True)
    proc = subprocess.run(["gcc", *CFLAGS, "-shared", "-Wl,-soname,libcuda.so.1", os.path.join(AOT, "fake_cuda.c"),
                           "-o", str(fake_dir / "libcuda.so.1")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    env = dict(os.environ, LD_LIBRARY_PATH=f"{fake_dir}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    run = subprocess.run([exe], capture_output=True, text=True, timeout=120, env=env)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("  ")]
    assert "sm_90, 132 SMs" in run.stdout and len(lines) >= 12, run.stdout + run.stderr
    assert not [ln for ln in lines if "FAILED" in ln or "skipped" in ln], run.stdout


def test_ops_launch_what_python_launches(plans, tmp_path):
    """The whole library (core, op files, CUDA launcher) against a fake libcuda.so.1 that records
    cuLaunchKernel (capi/aot/fake_cuda.c, a pretend H100): every GPU case through ks.capi on
    CUDA DLTensors launches the kernels, exact variants, grids and arguments the Python launcher
    does (scripts/capi_gpu_check.py --fake-driver): what the GPU check will run, checked here."""
    core, ops_dir = os.path.join(ROOT, "capi", "src", "core"), os.path.join(ROOT, "capi", "src", "ops")
    if not (os.path.isdir(core) and os.path.isdir(ops_dir)):
        pytest.skip("the core and op files of the C library are not here")
    fake = str(tmp_path / "libcuda.so.1")
    proc = subprocess.run(["gcc", *CFLAGS, "-shared", "-Wl,-soname,libcuda.so.1", os.path.join(AOT, "fake_cuda.c"),
                           "-o", fake], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lib = str(tmp_path / "libkernelset_fake.so")
    srcs = sorted(os.path.join(d, f) for d in (core, ops_dir, CUDA_SRC, plans["gen"]) for f in os.listdir(d)
                  if f.endswith(".c"))
    proc = subprocess.run(["gcc", "-std=c99", "-O1", "-fPIC", "-shared", "-DKS_VERSION_STRING=\"test\"", f"-I{INCLUDE}",
                           f"-I{core}", f"-I{CUDA_SRC}", f"-I{plans['gen']}", *srcs, "-o", lib, "-ldl", "-lpthread",
                           "-lm"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "capi_gpu_check.py"), "--fake-driver", lib,
                           fake], capture_output=True, text=True, env=_env(), timeout=600)
    results = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else proc.stderr[-4000:]
    assert isinstance(results, list), results
    bad = {r["case"]: r["problems"] for r in results if not r["ok"]}
    assert not bad and len(results) >= 20, bad


_DISCARD_CHECK = r"""
import ctypes, json, sys
fake = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
so = ctypes.CDLL(sys.argv[2])
sys.path.insert(0, sys.argv[3])
from test_capi_aot import _c_values
out = {}
def merge(t, lse, stream=None):
    err = ctypes.create_string_buffer(2048)
    args = _c_values(["bf16", "bf16", "OA", "LA", "OB", "LB", "O", lse, t, 32, 128, 32 * 128, 128, 32 * 128, 128,
                      32, 1, 32, 1], so, "merge_attn_states", {})
    s = so.ks_cuda_merge_attn_states_launch(ctypes.c_int(0), ctypes.c_void_p(stream), err, ctypes.c_size_t(2048),
                                            *args)
    return s, err.value.decode()
fake.fake_cuda_set_capturing(1)
out["capture_first"] = merge(5, None)          # LSE discarded, nothing allocated yet: graph-owned scratch
out["capture_with_lse"] = merge(5, "LSE")       # an LSE given: no scratch at all
out["capture_async"] = [fake.fake_cuda_async_allocs(), fake.fake_cuda_async_frees(), fake.fake_cuda_allocs()]
fake.fake_cuda_set_capturing(0)
out["eager"] = merge(5, None)
out["allocs"] = fake.fake_cuda_allocs()
fake.fake_cuda_set_capturing(1)
out["capture_again"] = merge(5, None)           # the stream's buffer exists: a capture still takes its own
out["capture_larger"] = merge(1 << 20, None)    # 128 MB of LSE
out["allocs_after"] = fake.fake_cuda_allocs()
out["async_after"] = [fake.fake_cuda_async_allocs(), fake.fake_cuda_async_frees()]
out["launches"] = fake.fake_cuda_launches()
fake.fake_cuda_set_capturing(0)
out["other_stream"] = merge(5, None, 0x1234)    # another stream: a buffer of its own (plans read scratch back)
out["other_stream_again"] = merge(5, None, 0x1234)
out["allocs_streams"] = fake.fake_cuda_allocs()
print(json.dumps(out))
"""


def test_scratch_is_per_stream_when_eager_and_graph_owned_under_capture(plans, tmp_path):
    fake = str(tmp_path / "libcuda.so.1")
    proc = subprocess.run(["gcc", *CFLAGS, "-shared", "-Wl,-soname,libcuda.so.1", os.path.join(AOT, "fake_cuda.c"),
                           "-o", fake], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "discard.py"
    script.write_text(_DISCARD_CHECK)
    proc = subprocess.run([sys.executable, str(script), fake, plans["lib"], os.path.dirname(os.path.abspath(__file__))],
                          capture_output=True, text=True, env=dict(_env(), PYTHONPATH=AOT), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    # captured calls: one cuMemAllocAsync and one cuMemFreeAsync each, never cuMemAlloc (refused during capture)
    assert r["capture_first"][0] == KS_OK and r["capture_with_lse"][0] == KS_OK, r
    assert r["capture_async"] == [1, 1, 0], r
    assert r["eager"][0] == KS_OK and r["allocs"] == 1, r
    assert r["capture_again"][0] == KS_OK and r["capture_larger"][0] == KS_OK, r
    assert r["allocs_after"] == 1 and r["async_after"] == [3, 3], r
    assert r["launches"] == 5, r
    assert r["other_stream"][0] == KS_OK and r["other_stream_again"][0] == KS_OK and r["allocs_streams"] == 2, r


def test_driver_declarations_match_cuda_h(tmp_path):
    from triton.backends.nvidia.compiler import get_ptxas
    inc = os.path.join(os.path.dirname(os.path.dirname(get_ptxas(90).path)), "include")
    if not os.path.exists(os.path.join(inc, "cuda.h")):
        pytest.skip("no cuda.h in this Triton's NVIDIA backend")
    src = tmp_path / "decl.c"
    src.write_text(r"""
#include <string.h>
#include <cuda.h>
#include "ks_cuda_driver.h"
#define KS_CUresult CUresult
#define KS_CUdevice CUdevice
#define KS_CUcontext CUcontext
#define KS_CUmodule CUmodule
#define KS_CUfunction CUfunction
#define KS_CUstream CUstream
#define KS_CUdeviceptr CUdeviceptr
#define KS_CUdevice_attribute CUdevice_attribute
#define KS_CUfunction_attribute CUfunction_attribute
#define KS_CUpointer_attribute CUpointer_attribute
#define KS_CUjit_option CUjit_option
#define KS_CUstreamCaptureStatus CUstreamCaptureStatus
#define KS_STR(x) #x
#define KS_XSTR(x) KS_STR(x)
/* the prototype must be exactly cuda.h's (else -Werror=incompatible-pointer-types), and the
 * symbol we dlsym must be the one cuda.h's name expands to (cuMemAlloc -> cuMemAlloc_v2) */
#define CHECK_FN(name, sym, params) \
  { CUresult (*p) params = (__typeof__(&name))0; (void)p; if (strcmp(KS_XSTR(name), sym)) return 1; }
#define CHECK_CONST(ours, theirs, value) _Static_assert((int)(theirs) == (value), #theirs);
KS_CU_CONSTS(CHECK_CONST)
int main(void) {
  KS_CU_FUNCS(CHECK_FN)
  return 0;
}
""")
    exe = str(tmp_path / "decl")
    proc = subprocess.run(["gcc", "-std=c11", "-Wall", "-Werror", f"-I{inc}", f"-I{CUDA_SRC}", str(src), "-o", exe],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert subprocess.run([exe]).returncode == 0, "a dlsym name differs from cuda.h's versioned symbol"
