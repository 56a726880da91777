"""MLA decode: the Gluon wgmma kernel (sm_90) against the fp32 reference and the Triton kernel.

Correctness first (ragged lengths incl. 0 / 1 / page boundaries, forced splits, 96 heads, page
size 128, fp16, a bad block id), then CUDA-graph replay times at the bench shapes for every
variant (tokens per tile, stages, PV overlap) and the Triton kernel, as % of copy bandwidth
(latent cache bytes) and TFLOP/s. Usage (GPU machine): python scripts/mla_wgmma_check.py [--quick]
"""
from __future__ import annotations

import sys

import torch

import kernelset as ks
from kernelset.bench import timing
from kernelset.ops.mla import launch as L
from kernelset.ops.mla import reference as R
from kernelset.ops.mla.bench import ADAPTERS

# eager calls below the work threshold would take the Triton kernel: the Gluon variants force it
VARIANTS = {"ws": L.MlaTuning(wgmma_eager_min_work=0),
            "wg64": L.MlaTuning(wgmma_ws=False, wgmma_eager_min_work=0),
            "triton": L.MlaTuning(wgmma=False)}
BENCH = ("ws", "wg64", "triton")


def debug(dev) -> None:
    """One sequence at a time: where do NaNs appear (tail-only programs, tails after full tiles)."""
    gen = torch.Generator(device=dev).manual_seed(1)
    for lens, splits in (([64], 1), ([128], 1), ([65], 1), ([1], 1), ([63], 1), ([200], 1), ([200], 2), ([0, 5], 1)):
        qn, qp, cache, table, sl = _case(len(lens), 64, lens, 64, torch.bfloat16, dev, None, gen)
        ref_out, _ = R.mla_decode(qn, qp, cache, table, sl, 0.1)
        for vname in ("ws", "wg64"):
            t = L.MlaTuning(**{**VARIANTS[vname].__dict__, "splits": splits})
            with L.TUNING.use(t):
                o = ks.mla_decode(qn, qp, cache, table, sl, scale=0.1, check_bounds=False).float()
            bad = ~torch.isfinite(o)
            err = ((o - ref_out).norm() / ref_out.norm().clamp_min(1e-30)).item()
            where = ""
            if bad.any():
                idx = bad.nonzero()
                where = f" nonfinite {int(bad.sum())} heads {idx[:, 1].unique().tolist()[:6]} cols {idx[:, 2].unique().tolist()[:8]}"
            print(f"  debug lens {lens} splits {splits} {vname}: rel_err {err:.2e}{where}", flush=True)


def _case(b, h, lens, bs, dtype, dev, bad=None, gen=None, nan_fill=False):
    r, p = 512, 64
    per = [-(-n // bs) for n in lens]
    nb = sum(per) + 3
    cache = torch.randn(nb, bs, r + p, device=dev, dtype=dtype, generator=gen)
    perm = torch.randperm(nb, device=dev, generator=gen)
    width = max(max(per), 1) + 1
    table = torch.full((b, width), -1, dtype=torch.int32, device=dev)
    k = 0
    for i, n in enumerate(per):
        table[i, :n] = perm[k:k + n].int()
        k += n
    if nan_fill:  # the unused rows of each last page hold NaN bytes (a never-written page)
        for i, n in enumerate(lens):
            if n % bs:
                cache[table[i, n // bs].long(), n % bs:] = float("nan")
    if bad is not None:
        table[bad, 0] = nb + 5
    qn = torch.randn(b, h, r, device=dev, dtype=dtype, generator=gen)
    qp = torch.randn(b, h, p, device=dev, dtype=dtype, generator=gen)
    return qn, qp, cache, table, torch.tensor(lens, dtype=torch.int32, device=dev)


def check(dev) -> bool:
    gen = torch.Generator(device=dev).manual_seed(0)
    ok = True
    cases = [("ragged h128", 6, 128, [0, 1, 63, 64, 65, 1000], 64, torch.bfloat16, None, None),
             ("ragged h128 splits3", 6, 128, [0, 1, 63, 64, 65, 1000], 64, torch.bfloat16, None, 3),
             ("h96 bs128", 3, 96, [300, 129, 7], 128, torch.bfloat16, None, None),
             ("fp16 h64", 2, 64, [517, 64], 64, torch.float16, None, None),
             ("bad page", 3, 128, [200, 200, 200], 64, torch.bfloat16, 1, None),
             ("long splits", 2, 128, [9000, 4097], 64, torch.bfloat16, None, 5),
             ("nan past the end", 4, 128, [1, 70, 129, 4000], 64, torch.bfloat16, None, None)]
    for name, b, h, lens, bs, dtype, bad, splits in cases:
        qn, qp, cache, table, sl = _case(b, h, lens, bs, dtype, dev, bad, gen, nan_fill=name.startswith("nan"))
        scale = 192 ** -0.5
        good = [i for i in range(b) if i != bad]
        ref_out, ref_lse = R.mla_decode(qn[good], qp[good], cache, table[good], sl[good], scale)
        for vname, t in VARIANTS.items():
            t = L.MlaTuning(**{**t.__dict__, "splits": splits})
            with L.TUNING.use(t):
                reason = L.wgmma_reason(qn, qp, cache, L.TUNING.active())
                out = torch.full((b, h, 512), float("nan"), device=dev, dtype=dtype)
                res = ks.mla_decode(qn, qp, cache, table, sl, scale=scale, return_lse=True, check_bounds=False)
                out.copy_(res.out)
            o, lse = out[good].float(), res.lse[good]
            err = ((o - ref_out).norm() / ref_out.norm().clamp_min(1e-30)).item()
            fin = torch.isfinite(ref_lse)
            lerr = (lse[fin] - ref_lse[fin]).abs().max().item() if fin.any() else 0.0
            lse_inf_ok = bool((lse[~fin] == float("-inf")).all())
            nan_ok = True
            if bad is not None:
                nan_ok = bool(torch.isnan(out[bad].float()).all())
            finite = bool(torch.isfinite(o).all())
            good_case = err < 1e-2 and lerr < 1e-2 and lse_inf_ok and nan_ok and finite
            ok &= good_case
            print(f"  {name:22s} {vname:9s} {'wgmma' if reason is None else 'triton'} rel_err {err:.2e} "
                  f"lse_err {lerr:.1e} empty_lse {lse_inf_ok} bad_nan {nan_ok} {'OK' if good_case else 'FAIL'}",
                  flush=True)
    return ok


def bench(dev, quick: bool) -> None:
    copy = timing.copy_bandwidth_gbs(dev)
    print(f"{torch.cuda.get_device_name()} copy {copy:.0f} GB/s", flush=True)
    spec = ks.core.registry.op("mla_decode")
    shapes = [(64, 4096, 128, 512, 64, 64, 16), (4, 32768, 128, 512, 64, 64, 16), (128, 2048, 128, 512, 64, 64, 16),
              (64, 4096, 64, 512, 64, 64, 16)]
    if quick:
        shapes = shapes[:1]
    for shape in shapes:
        inp = ADAPTERS["mla_decode"].inputs(shape, torch.bfloat16, dev, "fwd")
        ref = ADAPTERS["mla_decode"].reference(inp, "fwd")[0]
        cost = spec.cost(shape, torch.bfloat16, "fwd")
        rows = []
        for rounds in range(2):  # interleaved: each variant measured twice
            for vname in BENCH:
                t = VARIANTS[vname]
                with L.TUNING.use(t):
                    fn = ADAPTERS["mla_decode"].ours(inp, "fwd", "triton")
                    out = fn()[0]
                    err = ((out.float() - ref).norm() / ref.norm()).item()
                    graph = timing.capture(fn, 20)
                    us = timing.cuda_time_ms(graph.replay, warmup=2, reps=10, min_ms=30.0) * 1e3 / 20
                rows.append((vname, rounds, us, err))
        print(f"shape {shape}:", flush=True)
        for vname in BENCH:
            uss = [u for v, _, u, _ in rows if v == vname]
            err = max(e for v, _, _, e in rows if v == vname)
            us = min(uss)
            print(f"  {vname:9s} {us:8.1f} us (rounds {', '.join(f'{u:.1f}' for u in uss)})  "
                  f"{100 * cost.bytes / us / 1e3 / copy:5.1f}% copy  {cost.flops / us / 1e6:5.0f} TFLOP/s  err {err:.1e}",
                  flush=True)


def main() -> None:
    dev = torch.device("cuda")
    debug(dev)
    ok = check(dev)
    print("correctness:", "OK" if ok else "FAIL", flush=True)
    bench(dev, "--quick" in sys.argv)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
