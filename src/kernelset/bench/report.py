"""Terminal table and PNG plot of a benchmark run."""
from __future__ import annotations

from typing import Any

from .harness import OURS, CaseResult, summarize


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


HEADER = (f"{'op':<20} {'shape':<13} {'mode':<8} {'impl':<16} {'ms':>8} {'GB/s':>7} {'%ceil':>6} {'vs best':>8}  note "
          "(%ceil: of copy bandwidth, or of the bf16 matmul rate where marked)")


def case_rows(c: CaseResult) -> list[str]:
    """The table rows of one case: one per implementation."""
    shape = "x".join(map(str, c.shape))
    peer = c.best_peer()
    lines = []
    for r in c.results:
        vs = ""
        if r.impl == OURS and c.speedup():
            vs = f"{c.speedup():.2f}x"
        elif peer is not None and r is peer:
            vs = "best"
        note = r.note if r.note else ""
        if r.impl == OURS and c.bar_pct is not None:
            # the bar is a share of copy (whatever %ceil is) and judged unrounded: 89.96% shows
            # as 89.96, never as a met 90
            got = "" if r.copy_pct is None else f" ({r.copy_pct:.2f}%)"
            note = (f"bar {c.bar_pct:g}% of copy " + ("met" if c.bar_met() else "NOT met") + got
                    + (f"; {note}" if note else ""))
        if not r.correct and r.ms is None and not note:
            note = "not run"
        if r.tflops is not None and c.ceiling == "matmul":
            note = f"{r.tflops:.0f} TFLOP/s, % of matmul" + (f"; {note}" if note else "")
        lines.append(f"{c.op:<20} {shape:<13} {c.mode:<8} {r.impl:<16} {_fmt(r.ms, '8.3f')} "
                     f"{_fmt(r.gbs, '7.0f')} {_fmt(r.pct, '6.1f')} {vs:>8}  {note}")
    return lines


def table(cases: list[CaseResult], ceilings: dict[str, float]) -> str:
    lines = [f"ceilings: copy {ceilings['copy_gbs']:.0f} GB/s, bf16 matmul {ceilings['matmul_tflops']:.0f} TFLOP/s"]
    lines += [HEADER, "-" * len(HEADER)]
    for c in cases:
        lines += case_rows(c)
    return "\n".join(lines)


def summary_line(cases: list[CaseResult]) -> str:
    s = summarize(cases)
    fast = "-" if s["fast_1"] is None else f"{100 * s['fast_1']:.0f}%"
    geo = "-" if s["geomean_speedup"] is None else f"{s['geomean_speedup']:.2f}x"
    return (f"fast_1 {fast} of {s['cases_with_peer']} cases with a peer (correct and >= the strongest peer); "
            f"geomean speedup vs strongest peer {geo}; bars met {s['bars_met']}/{s['bars']}; "
            f"all kernelset outputs correct: {s['all_correct']}")


def plot(cases: list[CaseResult], path: str, env: dict[str, Any]) -> bool:
    """% of copy bandwidth vs hidden size per implementation, one panel per (op, mode) with sweep cases."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return False
    groups: dict[tuple[str, str], list[CaseResult]] = {}
    for c in cases:
        if c.sweep:
            groups.setdefault((c.op, c.mode), []).append(c)
    if not groups:
        return False
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.2), squeeze=False)
    for ax, ((op, mode), cs) in zip(axes[0], sorted(groups.items())):
        cs = sorted(cs, key=lambda c: c.shape[-1])
        impls = sorted({r.impl for c in cs for r in c.results}, key=lambda n: (n != OURS, n))
        for impl in impls:
            xs, ys = [], []
            for c in cs:
                r = next((r for r in c.results if r.impl == impl), None)
                if r is not None and r.correct and r.pct is not None:
                    xs.append(c.shape[-1])
                    ys.append(r.pct)
            if xs:
                ax.plot(xs, ys, marker="o", linewidth=2.5 if impl == OURS else 1.2, label=impl)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 105)
        ax.set_xlabel("hidden size (rows x hidden = 2^27 elements)")
        ax.set_ylabel("% of measured copy bandwidth")
        ax.set_title(f"{op} {mode}, {cs[0].dtype}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{env.get('device', '?')} ({env.get('date', '')}, torch {env.get('torch')}, "
                 f"triton {env.get('triton')})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
