"""Every environment flag kernelset reads, declared once, typed and documented.

Flags are read from the environment at import and can be overridden for a block:

    with ks.config.override(disable={"triton"}):
        ...

Changing a flag clears the dispatch cache, so the next call decides again.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Callable, Iterator

from .enums import Backend


def _parse_bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false), got {text!r}")


def _parse_disable(text: str) -> frozenset[Backend]:
    items = [s for s in (p.strip() for p in text.split(",")) if s]
    out = frozenset(Backend.parse(s, what="KS_DISABLE entry") for s in items)
    if Backend.REFERENCE in out:
        raise ValueError("KS_DISABLE cannot disable the reference backend: it is the one that always works")
    return out


def _forced_backend(op: str, name: Any) -> Backend | str:
    """A core Backend, or another name kept as a lowercase string: an op family may register
    backends of its own (attention: ``sdpa_cudnn``...), which the dispatcher checks against the
    op's implementations when it reads the entry (the registry is not loaded yet here)."""
    if isinstance(name, Backend):
        return name
    text = str(getattr(name, "value", name)).strip().lower()
    try:
        return Backend.parse(text)
    except ValueError:
        if not text.replace("_", "").isalnum():
            raise ValueError(f"KS_BACKEND backend for {op!r} must be a backend name, got {name!r}") from None
        return text


def _parse_backend_map(text: str) -> dict[str, Backend | str]:
    """``rms_norm:triton,flash_attention:sdpa_cudnn`` -> {op: Backend or family backend name}."""
    out: dict[str, Backend | str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        op, sep, name = part.partition(":")
        if not sep or not op.strip():
            raise ValueError(f"KS_BACKEND entries are OP:BACKEND, got {part!r}")
        out[op.strip()] = _forced_backend(op.strip(), name)
    return out


@dataclasses.dataclass(frozen=True)
class Flag:
    name: str  # environment variable
    field: str  # attribute on Config
    parse: Callable[[str], Any]
    default: Any
    doc: str


FLAGS: tuple[Flag, ...] = (
    Flag("KS_BACKEND", "backend", _parse_backend_map, {},
         "Force a backend per op, e.g. 'rms_norm:triton,flash_attention:sdpa_cudnn' (a core backend or one the "
         "op's family registers). Forced backends run or raise."),
    Flag("KS_DISABLE", "disable", _parse_disable, frozenset(),
         "Comma-separated backends AUTO must not pick, e.g. 'triton'. Asking for one explicitly raises."),
    Flag("KS_LOG_DISPATCH", "log_dispatch", _parse_bool, False,
         "Print each new dispatch decision (op, problem, chosen backend, rejections) to stderr."),
    Flag("KS_POISON_OUTPUTS", "poison_outputs", _parse_bool, False,
         "Fill every output kernelset allocates with NaN before the kernel runs (tests: unwritten elements fail)."),
    Flag("KS_DIRECT_LAUNCH", "direct_launch", _parse_bool, True,
         "Launch a cached Triton kernel through its C launcher with raw addresses (0: Triton's own launch path)."),
    Flag("TRITON_INTERPRET", "triton_interpret", _parse_bool, False,
         "Triton's own flag: run Triton kernels in the interpreter, on CPU tensors too (slow; used by CI)."),
)


@dataclasses.dataclass(frozen=True)
class Config:
    backend: dict[str, Backend | str]  # a str: a family backend name, checked by the dispatcher
    disable: frozenset[Backend]
    log_dispatch: bool
    poison_outputs: bool
    direct_launch: bool
    triton_interpret: bool
    # where ``disable`` came from (not a flag): the dispatcher's reason names it, so a backend
    # disabled by an override is not blamed on an environment variable nobody set
    disable_source: str = "KS_DISABLE"

    def disabled_reason(self, backend: Any) -> str | None:
        """Why AUTO must not pick ``backend`` and a request for it raises; None if it is not disabled."""
        if backend not in self.disable:
            return None
        return "disabled (KS_DISABLE)" if self.disable_source == "KS_DISABLE" else f"disabled by {self.disable_source}"


def _from_env(environ: os._Environ | dict[str, str] = os.environ) -> Config:
    values = {}
    for flag in FLAGS:
        raw = environ.get(flag.name)
        if raw is None:
            values[flag.field] = flag.default
            continue
        try:
            values[flag.field] = flag.parse(raw)
        except ValueError as exc:
            raise ValueError(f"environment variable {flag.name}={raw!r}: {exc}") from None
    return Config(**values)


_current: Config = _from_env()
_generation = 0
_listeners: list[Callable[[], None]] = []


def get() -> Config:
    return _current


def generation() -> int:
    """How many times the configuration has changed. Caches of decisions key on it, so a decision
    made under an older configuration is never reused: clearing alone is not enough when another
    thread stores a decision it made before the change after the listeners ran."""
    return _generation


def on_change(fn: Callable[[], None]) -> None:
    """Register a callback run whenever the configuration changes (the dispatcher clears its cache)."""
    _listeners.append(fn)


def _set(cfg: Config) -> None:
    global _current, _generation
    _current = cfg
    _generation += 1  # after the new config is visible: a reader of the new generation sees it
    for fn in _listeners:
        fn()


def reload() -> Config:
    """Re-read every flag from the environment (after changing os.environ at run time)."""
    _set(_from_env())
    return _current


def _interpreter_env() -> bool:
    try:
        return _parse_bool(os.environ.get("TRITON_INTERPRET", ""))
    except ValueError:
        return False


def _coerce(field: str, value: Any) -> Any:
    flag = next((f for f in FLAGS if f.field == field), None)
    if flag is None:
        valid = ", ".join(f.field for f in FLAGS)
        raise ValueError(f"unknown config field {field!r}; valid fields: {valid}")
    if isinstance(value, str):
        value = flag.parse(value)
    elif field == "disable":
        value = _parse_disable(",".join(str(Backend.parse(v)) for v in value))
    elif field == "backend":
        value = {str(k): _forced_backend(str(k), v) for k, v in dict(value).items()}
    else:
        value = type(flag.default)(value)
    if field == "triton_interpret" and value and not _interpreter_env():
        # The flag only tells the dispatcher that Triton runs CPU tensors; Triton itself reads the
        # environment variable when its kernels are defined. Turned on here alone, AUTO picked
        # Triton for CPU tensors and the launch failed ("0 active drivers").
        raise ValueError("triton_interpret=True needs TRITON_INTERPRET=1 in the environment before Triton's kernels "
                         "are defined (Triton reads it itself); an override can only turn it off")
    return value


@contextlib.contextmanager
def override(**fields: Any) -> Iterator[Config]:
    """Override flags for a block: ``with override(backend={"rms_norm": "reference"}): ...``."""
    previous = _current
    values = {k: _coerce(k, v) for k, v in fields.items()}
    if "disable" in values:
        values["disable_source"] = "config.override(disable=...)"
    _set(dataclasses.replace(previous, **values))
    try:
        yield _current
    finally:
        _set(previous)


def describe() -> list[tuple[str, str, str]]:
    """(variable, current value, documentation) for each flag, for ``ksctl env``."""
    cfg = get()
    rows = []
    for flag in FLAGS:
        value = getattr(cfg, flag.field)
        if isinstance(value, dict):
            shown = ",".join(f"{k}:{v}" for k, v in value.items()) or "-"
        elif isinstance(value, frozenset):
            shown = ",".join(sorted(str(v) for v in value)) or "-"
        else:
            shown = str(value)
        rows.append((flag.name, shown, flag.doc))
    return rows
