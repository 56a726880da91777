"""rope_cache: the rotary tables (inv_freq, attention scaling, cos/sin) of every RoPE scaling type.

The formulas are transformers' ``ROPE_INIT_FUNCTIONS`` (and the models' default init), written
with the same fp32 torch operations in the same order, so the tables are bit-equal to theirs on
the same device. inv_freq is computed on the CPU (transformers computes it at init, on the CPU,
then moves the buffer); the cos/sin table is computed on the target device (transformers
computes cos/sin on the activations' device). Host-side; deterministic; any device.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import torch

from ...core.errors import ArgumentError

_OP = "rope_cache"
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")


@dataclasses.dataclass(frozen=True)
class RopeCache:
    """The tables of one rotary embedding.

    inv_freq ``[R/2]`` fp32; attention_scaling multiplies cos and sin (yarn, longrope);
    cos_sin_cache ``[max_positions, R]`` fp32 = ``[cos | sin] * attention_scaling`` at positions
    0..max_positions-1, the layout :func:`rotary_embedding`, :func:`mrope` and
    :func:`qk_norm_rope` take. ``seq_len`` is the sequence length the table was built for
    (dynamic and longrope tables depend on it; None: transformers' table at init).
    mrope_section / mrope_interleaved: the config's multimodal split, what :func:`mrope` takes.
    """

    inv_freq: torch.Tensor
    attention_scaling: float
    cos_sin_cache: torch.Tensor
    rope_type: str
    rotary_dim: int
    head_dim: int
    seq_len: int | None = None
    mrope_section: tuple[int, ...] | None = None  # from the config (Qwen2/2.5/3-VL), for mrope()
    mrope_interleaved: bool = False

    def cos_sin(self, positions: torch.Tensor, *, dtype: torch.dtype | None = None, interleaved: bool = False,
                mrope_section: Sequence[int] | None = None,
                mrope_interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' rotary module output for ``positions`` ``[S]`` or ``[B, S]`` (``[3, ...]``
        with ``mrope_section``): cos, sin ``[..., R]``, halves duplicated (GPT-J: pairs, with
        ``interleaved``), times attention_scaling, cast to ``dtype`` as transformers casts them to
        the activations' dtype. What :func:`apply_rotary` takes."""
        if not isinstance(positions, torch.Tensor) or positions.is_floating_point() or positions.is_complex():
            raise ArgumentError("RopeCache.cos_sin", "positions", "an integer tensor",
                                type(positions).__name__ if not isinstance(positions, torch.Tensor)
                                else positions.dtype)
        freqs = positions[..., None].float() * self.inv_freq.to(device=positions.device, dtype=torch.float)
        cos = freqs.cos() * self.attention_scaling
        sin = freqs.sin() * self.attention_scaling
        if mrope_section is not None:
            if positions.dim() < 2 or positions.shape[0] != 3:
                raise ArgumentError("RopeCache.cos_sin", "positions", "[3, S] or [3, B, S] with mrope_section",
                                    f"shape {tuple(positions.shape)}")
            sec = mrope_sections(mrope_section, self.rotary_dim, "RopeCache.cos_sin")
            idx = section_index(sec, mrope_interleaved, device=positions.device)
            cos = _pick(cos, idx)
            sin = _pick(sin, idx)
        if interleaved:
            cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
        else:
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        if dtype is not None:
            cos, sin = cos.to(dtype), sin.to(dtype)
        return cos, sin


def mrope_sections(mrope_section: Any, rotary_dim: int, op: str) -> tuple[int, int, int]:
    """Validated (temporal, height, width) frequency counts; they sum to rotary_dim / 2."""
    try:
        sec = tuple(int(s) for s in mrope_section)
        ok = len(sec) == 3 and all(s >= 0 and s == v for s, v in zip(sec, mrope_section))
    except (TypeError, ValueError):
        ok = False
    if not ok or sum(sec) != rotary_dim // 2:
        raise ArgumentError(op, "mrope_section", f"3 non-negative ints (temporal, height, width) summing to "
                            f"rotary_dim / 2 = {rotary_dim // 2}", repr(mrope_section))
    return sec  # type: ignore[return-value]


def section_index(sec: tuple[int, int, int], interleaved: bool, device: torch.device | str = "cpu") -> torch.Tensor:
    """For each frequency i < R/2, which position row (0 temporal, 1 height, 2 width) rotates it.

    Qwen2-VL: contiguous bands [0, s0), [s0, s0+s1), [s0+s1, R/2). Qwen3-VL (interleaved):
    i % 3 == 1 and i < 3 s1 -> height, i % 3 == 2 and i < 3 s2 -> width, else temporal.
    """
    i = torch.arange(sum(sec), device=device)
    if interleaved:
        return torch.where((i % 3 == 1) & (i < 3 * sec[1]), 1, torch.where((i % 3 == 2) & (i < 3 * sec[2]), 2, 0))
    return (i >= sec[0]).long() + (i >= sec[0] + sec[1]).long()


def _pick(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t ``[3, ..., R/2]`` -> ``[..., R/2]`` taking row idx[i] for column i."""
    return torch.gather(t, 0, idx.expand(*t.shape[1:])[None])[0]


def _field(src: Any, name: str) -> Any:
    if src is None:
        return None
    if isinstance(src, Mapping):
        return src.get(name)
    return getattr(src, name, None)


def _params(config: Any, layer_type: str | None) -> dict[str, Any]:
    """The flat rope parameter dict of a config: rope_parameters (transformers 5.x, possibly
    nested per layer type) or rope_scaling (older), with rope_theta / partial_rotary_factor
    from the top level when the dict lacks them."""
    raw = _field(config, "rope_parameters") or _field(config, "rope_scaling") or {}
    if not isinstance(raw, Mapping):
        raise ArgumentError(_OP, "config", "rope_parameters / rope_scaling given as a dict", type(raw).__name__)
    nested = [k for k, v in raw.items() if isinstance(v, Mapping)]
    if nested:
        if layer_type not in nested:
            raise ArgumentError(_OP, "layer_type", f"one of {nested} (the config has per-layer rope parameters)",
                                repr(layer_type))
        raw = raw[layer_type]
    elif layer_type is not None:
        raise ArgumentError(_OP, "layer_type", "None: the config's rope parameters are not per layer type",
                            repr(layer_type))
    params = dict(raw)
    for key in ("rope_theta", "partial_rotary_factor"):
        if params.get(key) is None and _field(config, key) is not None:
            params[key] = _field(config, key)
    return params


def _float(name: str, value: Any, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not -math.inf < value < math.inf \
            or (positive and not value > 0):
        raise ArgumentError(_OP, name, "a finite number" + (" > 0" if positive else ""), repr(value))
    return float(value)


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(_OP, name, "an int >= 1", repr(value))
    return value


def rope_cache(config: Any = None, *, rope_type: str | None = None, rope_theta: float | None = None,
               head_dim: int | None = None, partial_rotary_factor: float | None = None,
               rotary_dim: int | None = None, max_position_embeddings: int | None = None,
               original_max_position_embeddings: int | None = None, factor: float | None = None,
               low_freq_factor: float | None = None, high_freq_factor: float | None = None,
               beta_fast: float | None = None, beta_slow: float | None = None, mscale: float | None = None,
               mscale_all_dim: float | None = None, attention_factor: float | None = None,
               truncate: bool | None = None, short_factor: Sequence[float] | None = None,
               long_factor: Sequence[float] | None = None, seq_len: int | None = None,
               max_positions: int | None = None, layer_type: str | None = None,
               device: torch.device | str | None = None) -> RopeCache:
    """Rotary tables equal to transformers' ``ROPE_INIT_FUNCTIONS[rope_type](config, seq_len=...)``.

    ``config``: a transformers config (``get_text_config()`` is used when present) or a dict in
    config.json form (rope_theta, rope_scaling or rope_parameters, head_dim or hidden_size /
    num_attention_heads, partial_rotary_factor, max_position_embeddings,
    original_max_position_embeddings); keyword arguments override it (or replace it: all
    keywords, no config). ``layer_type`` picks one entry of per-layer rope parameters (Gemma 3).

    Sequence-length dependence, as transformers' rotary modules: ``dynamic`` recomputes the base
    for ``seq_len`` = max(position) + 1 when it exceeds max_position_embeddings (None: the table
    at init, the unscaled one); ``longrope`` uses long_factor when ``seq_len`` >
    original_max_position_embeddings, short_factor otherwise. The cos/sin table covers
    ``max_positions`` positions (default: max_position_embeddings, or seq_len if larger).
    """
    if config is not None and callable(getattr(config, "get_text_config", None)):
        config = config.get_text_config()
    if config is not None and not isinstance(config, Mapping) and not hasattr(config, "__dict__"):
        raise ArgumentError(_OP, "config", "a transformers config, a dict or None", type(config).__name__)
    p = _params(config, layer_type) if config is not None else {}
    explicit = dict(factor=factor, low_freq_factor=low_freq_factor, high_freq_factor=high_freq_factor,
                    beta_fast=beta_fast, beta_slow=beta_slow, mscale=mscale, mscale_all_dim=mscale_all_dim,
                    attention_factor=attention_factor, truncate=truncate, short_factor=short_factor,
                    long_factor=long_factor, rope_theta=rope_theta, partial_rotary_factor=partial_rotary_factor)
    p.update({k: v for k, v in explicit.items() if v is not None})
    kind = rope_type if rope_type is not None else p.get("rope_type", p.get("type", "default"))
    if kind == "mrope":  # Qwen2-VL's config.json name for the default frequencies split in sections
        kind = "default"
    if kind not in ROPE_TYPES:
        raise ArgumentError(_OP, "rope_type", f"one of {', '.join(map(repr, ROPE_TYPES))}", repr(kind))

    theta = p.get("rope_theta")
    if theta is None:  # transformers' class default (10000 for almost every model)
        theta = 10000.0 if config is None or isinstance(config, Mapping) else getattr(config, "default_theta", 10000.0)
    base = _float("rope_theta", theta)
    hd = head_dim if head_dim is not None else _field(config, "head_dim")
    if hd is None and _field(config, "hidden_size") and _field(config, "num_attention_heads"):
        hd = _field(config, "hidden_size") // _field(config, "num_attention_heads")
    if hd is None:
        raise ArgumentError(_OP, "head_dim", "given, or in the config (head_dim or hidden_size / "
                            "num_attention_heads)", None)
    hd = _int("head_dim", hd)
    prf = _float("partial_rotary_factor", p.get("partial_rotary_factor", 1.0) or 1.0)
    dim = int(hd * prf)
    if rotary_dim is not None:
        if kind == "proportional" or _int("rotary_dim", rotary_dim) > hd:
            raise ArgumentError(_OP, "rotary_dim", f"<= head_dim ({hd}) and not with rope_type 'proportional'",
                                rotary_dim)
        dim = rotary_dim
    if dim < 2 or dim % 2:
        raise ArgumentError(_OP, "rotary_dim", "even and >= 2 (head_dim * partial_rotary_factor)", dim)
    max_pe = max_position_embeddings if max_position_embeddings is not None else _field(
        config, "max_position_embeddings")
    if max_pe is not None:
        max_pe = _int("max_position_embeddings", max_pe)
    orig = original_max_position_embeddings
    if orig is None and kind in ("llama3", "yarn", "longrope"):
        # transformers gives a top-level original_max_position_embeddings priority (Phi-3)
        orig = _field(config, "original_max_position_embeddings") or p.get("original_max_position_embeddings") \
            or max_pe
        if orig is None:
            raise ArgumentError(_OP, "original_max_position_embeddings", f"given for rope_type {kind!r}", None)
    if orig is not None:
        orig = _int("original_max_position_embeddings", orig)
    if seq_len is not None:
        seq_len = _int("seq_len", seq_len)

    def need(name: str) -> float:
        if p.get(name) is None:
            raise ArgumentError(_OP, name, f"given for rope_type {kind!r}", None)
        return _float(name, p[name])

    def need_max() -> int:
        if max_pe is None:
            raise ArgumentError(_OP, "max_position_embeddings", f"given for rope_type {kind!r}", None)
        return max_pe

    scaling = 1.0
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    if kind == "default":
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    elif kind == "linear":
        inv_freq = 1.0 / (base ** exponents)
        inv_freq /= need("factor")
    elif kind == "dynamic":
        mp = need_max()
        f = need("factor")
        n = max(seq_len, mp) if seq_len is not None else mp
        dyn_base = base * ((f * n / mp) - (f - 1)) ** (dim / (dim - 2))
        inv_freq = 1.0 / (dyn_base ** exponents)
    elif kind == "llama3":
        inv_freq = _llama3(1.0 / (base ** exponents), need("factor"), need("low_freq_factor"),
                           need("high_freq_factor"), orig)
    elif kind == "yarn":
        inv_freq, scaling = _yarn(p, base, dim, orig, max_pe)
    elif kind == "longrope":
        inv_freq, scaling = _longrope(p, base, dim, orig, max_pe, seq_len)
    else:  # proportional: only the first partial_rotary_factor of the angles rotate; rotary_dim = head_dim
        angles = int(prf * hd // 2)
        rotated = 1.0 / (base ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).float() / hd))
        inv_freq = torch.cat((rotated, torch.zeros(hd // 2 - angles))) if hd // 2 > angles else rotated
        inv_freq /= _float("factor", p.get("factor", 1.0) or 1.0)
        dim = 2 * inv_freq.numel()

    n_pos = max_positions
    if n_pos is None:
        if max_pe is None and seq_len is None:
            raise ArgumentError(_OP, "max_positions", "given (or max_position_embeddings / seq_len)", None)
        n_pos = max(max_pe or 0, seq_len or 0)
    if isinstance(n_pos, bool) or not isinstance(n_pos, int) or n_pos < 0:
        raise ArgumentError(_OP, "max_positions", "an int >= 0", repr(n_pos))
    dev = torch.device(device) if device is not None else torch.device("cpu")
    inv_freq = inv_freq.to(dev)
    freqs = torch.arange(n_pos, device=dev)[:, None].float() * inv_freq
    table = torch.cat((freqs.cos() * scaling, freqs.sin() * scaling), dim=-1)
    sections = p.get("mrope_section")
    return RopeCache(inv_freq, float(scaling), table, kind, dim, hd,
                     seq_len if kind in ("dynamic", "longrope") else None,
                     mrope_sections(sections, dim, _OP) if sections is not None else None,
                     bool(p.get("mrope_interleaved", False)))


def _llama3(inv_freq: torch.Tensor, factor: float, low: float, high: float, old_len: int) -> torch.Tensor:
    """Llama 3.1: wavelengths above old_len / low scale by 1/factor, below old_len / high stay,
    between blend smoothly."""
    low_wavelen = old_len / low
    high_wavelen = old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(p: dict, base: float, dim: int, orig: int, max_pe: int | None) -> tuple[torch.Tensor, float]:
    """YaRN: blend interpolated (1/factor) and extrapolated frequencies with a linear ramp over the
    dimensions between beta_fast and beta_slow rotations; cos/sin scale by 0.1 ln(factor) + 1."""
    factor = p.get("factor")
    if factor is None:
        if max_pe is None:
            raise ArgumentError(_OP, "factor", "given for rope_type 'yarn' (or max_position_embeddings)", None)
        factor = max_pe / orig
    factor = _float("factor", factor)

    def mscale_of(scale: float, m: float = 1) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    att = p.get("attention_factor")
    if att is None:
        ms, ms_all = p.get("mscale"), p.get("mscale_all_dim")
        att = float(mscale_of(factor, ms) / mscale_of(factor, ms_all)) if ms and ms_all else mscale_of(factor)
    att = _float("attention_factor", att)
    beta_fast = p.get("beta_fast") or 32
    beta_slow = p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    extra_weight = 1 - ramp.float()
    return interpolation * (1 - extra_weight) + extrapolation * extra_weight, att


def _longrope(p: dict, base: float, dim: int, orig: int, max_pe: int | None,
              seq_len: int | None) -> tuple[torch.Tensor, float]:
    """LongRoPE (Phi-3): per-frequency rescale factors, the long set past the original context."""
    for name in ("short_factor", "long_factor"):
        v = p.get(name)
        if v is None or len(v) != dim // 2:
            raise ArgumentError(_OP, name, f"a list of rotary_dim / 2 = {dim // 2} numbers", repr(v))
    factor = p.get("factor")
    if factor is None:
        if max_pe is None:
            raise ArgumentError(_OP, "factor", "given for rope_type 'longrope' (or max_position_embeddings)", None)
        factor = max_pe / orig
    att = p.get("attention_factor")
    if att is None:
        att = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    att = _float("attention_factor", att)
    ext = torch.tensor(p["long_factor"] if seq_len and seq_len > orig else p["short_factor"], dtype=torch.float32)
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (ext * base ** shape), att
