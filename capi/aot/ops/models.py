"""The ``release`` set's shapes: what the C ABI's ops see when an engine runs a known model.

A release build cannot embed every kernel variant (the ``full`` set, one per policy bucket, is
about 5000 constexpr combinations and as many fallbacks), and most of them serve no real call.
Instead each op's ``release`` cases are derived here from the public configs of the models
kernelset knows (``kernelset.hf.presets``, through the same ``facts`` that ``ksctl plan`` reads),
for every GPU of ``kernelset.core.gpus`` that the kernels support (its SM count and arch: split
counts and flash-attention tiles depend on them), over token counts from decode to long prefill.
The generator compiles the fallback (align16, or unaligned when a shape forbids it) of every
launch those cases record, so any call with those model dimensions finds its kernel whatever its
batch, context length or pointer values.

Nothing here is per model: a new preset (or a config added to ``EXTRA_CONFIGS``) widens the set.
"""
from __future__ import annotations

import functools

# token counts per call: decode batches, prefill chunks; the policies' buckets saturate well below
# the largest (block sizes follow pow2(M) up to a cap)
TOKENS = (1, 2, 3, 4, 5, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DTYPES = ("bf16", "fp16")
BLOCK_SIZES = (16, 32)  # paged KV-cache block sizes (vLLM's default is 16; FlashInfer/SGLang often 32+)

# configs beyond the presets whose shapes a release should carry (same keys as config.json)
EXTRA_CONFIGS: list[dict] = []

_SELECTED: tuple[str, ...] | None = None  # generate.py --models: only these presets


def select(names) -> None:
    """Build for these presets only (``generate.py --models``); unknown names are refused."""
    global _SELECTED
    from kernelset.hf.presets import PRESETS
    names = tuple(n.strip() for n in names if n.strip())
    bad = [n for n in names if n not in PRESETS]
    if bad:
        raise SystemExit(f"capi/aot: unknown preset(s) {', '.join(bad)}; presets: {', '.join(sorted(PRESETS))}")
    _SELECTED = names or None
    models.cache_clear()


@functools.lru_cache(maxsize=None)
def models() -> tuple:
    """Deduplicated model facts: one per distinct combination of the fields the C ABI's ops see."""
    from kernelset.hf.planning import facts
    from kernelset.hf.presets import PRESETS
    out, seen = [], set()
    configs = [PRESETS[n] for n in _SELECTED] if _SELECTED else list(PRESETS.values()) + EXTRA_CONFIGS
    for cfg in configs:
        f = facts(cfg)
        if not f.heads:  # no attention layers (Mamba, Mamba-2): no attention, KV-cache or rope launches
            continue
        key = (f.hidden, f.heads, f.kv_heads, f.head_dim, f.rotary_dim, f.intermediate, f.moe_intermediate,
               f.shared_intermediate, f.vocab, f.activation, f.norm, f.norm_offset, f.qk_norm,
               f.sliding_window is not None, bool(f.attn_softcap), f.final_softcap, f.sinks, f.mla is not None,
               tuple(sorted(f.mla.items())) if f.mla else None, f.model_type)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return tuple(out)


@functools.lru_cache(maxsize=None)
def gpus() -> tuple:
    """(compute capability as 80/89/90..., SM count) of every known GPU the kernels run on (sm_80+)."""
    from kernelset.core.gpus import GPUS
    return tuple(sorted({(g.arch[0] * 10 + g.arch[1], g.sms) for g in GPUS if g.arch >= (8, 0)}))


def sm_counts() -> tuple:
    return tuple(sorted({s for _, s in gpus()}))


def archs() -> tuple:
    """The compute capabilities whose policies differ (the launchers read only the major/minor)."""
    return tuple(sorted({cc for cc, _ in gpus()}))


def act_kinds(f) -> tuple:
    """The C activation ops a model's MLP uses (gelu: exact erf; gelu_tanh: the tanh approximation)."""
    return {"silu": ("silu_and_mul",), "gelu": ("gelu_and_mul",), "gelu_tanh": ("gelu_tanh_and_mul",),
            "swiglu_oai": ("swiglu_oai",)}.get(f.activation, ())


def mlp_widths(f) -> tuple:
    """Every gated-MLP intermediate width of a model: dense, routed experts, shared experts."""
    return tuple(sorted({w for w in (f.intermediate, f.moe_intermediate, f.shared_intermediate) if w}))


def attention_heads(f) -> tuple | None:
    """(Hq, Hkv, D) of the paged / flash attention ops; None for MLA (its decode is ops/mla.py)."""
    if f.mla:
        return None
    return f.heads, f.kv_heads, f.head_dim
