"""What the harness needs from an op family to benchmark one case; each family's ``bench.py``
defines ``ADAPTERS = {op_name: BenchAdapter(...)}``."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import torch

Outputs = tuple[torch.Tensor, ...]
Runner = Callable[[], Outputs]


@dataclasses.dataclass(frozen=True)
class ShapeGrammar:
    """What a shape means to an op: its benchmark cases and ``ksctl explain OP --shape``.

    ``full`` names the dims ``inputs()`` reads, in order, joined by "x" (``"BxSxHqxHkvxDxCAUSAL"``);
    ``short`` lists shorter forms a user may type, each ``full``'s names with some left out (in
    ``full``'s order), a left-out dim taking its value from ``defaults`` (a number, or the name of
    the dim whose value it copies: ``{"Hkv": "Hq"}``); ``choices`` limits a dim's values; ``legend``
    says what each name means. A shape is read by the one form of its length, or refused with
    every form and the legend: never guessed."""
    full: str
    legend: str
    short: tuple[str, ...] = ()
    defaults: dict[str, int | str] = dataclasses.field(default_factory=dict, hash=False)
    choices: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        names = self.full.split("x")
        if len(set(names)) != len(names):
            raise ValueError(f"shape grammar {self.full!r}: a dim named twice")
        arities = {len(names)}
        for form in self.short:
            dims = form.split("x")
            it = iter(names)
            if not all(d in it for d in dims):  # a subsequence of full, in full's order
                raise ValueError(f"shape grammar {self.full!r}: form {form!r} is not its names in order")
            missing = [n for n in names if n not in dims and n not in self.defaults]
            if missing:
                raise ValueError(f"shape grammar {self.full!r}: form {form!r} leaves out {missing} without a default")
            if len(dims) in arities:  # a shape of that length could be read two ways
                raise ValueError(f"shape grammar {self.full!r}: form {form!r} has the length of another form")
            arities.add(len(dims))
        for name, value in self.defaults.items():
            if name not in names or (isinstance(value, str) and value not in names):
                raise ValueError(f"shape grammar {self.full!r}: default {name}={value!r} names no dim")

    @property
    def forms(self) -> tuple[str, ...]:
        """Every accepted form, shortest first."""
        return tuple(sorted((*self.short, self.full), key=lambda f: f.count("x")))

    def describe(self) -> str:
        """One line: the forms, the legend and the defaults (what ``ksctl explain`` prints on a refusal)."""
        forms, defaults = self.forms, ", ".join(f"{k}={v}" for k, v in self.defaults.items())
        listed = f"{', '.join(forms[:-1])} or {forms[-1]}" if len(forms) > 1 else forms[0]
        return f"{listed}: {self.legend}" + (f"; left out: {defaults}" if defaults else "")

    def parse(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """``shape`` in the form of its length, as the full shape ``inputs()`` reads; ValueError
        naming every form when no form has that length or a value is not allowed."""
        form = next((f for f in self.forms if f.count("x") + 1 == len(shape)), None)
        if form is None:
            raise ValueError(f"{len(shape)} dim{'s' * (len(shape) != 1)}, where the op takes {self.describe()}")
        given = dict(zip(form.split("x"), shape))
        for name, value in given.items():
            allowed = self.choices.get(name)
            if allowed is not None and value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}, got {value}; the op "
                                 f"takes {self.describe()}")
        values = {**{k: v for k, v in self.defaults.items() if isinstance(v, int)}, **given}
        for name, value in self.defaults.items():
            if isinstance(value, str) and name not in given:
                values[name] = values[value]
        return tuple(values[n] for n in self.full.split("x"))


ROWS_HIDDEN = ShapeGrammar("ROWSxHIDDEN", "ROWS rows (tokens) of HIDDEN elements")


@dataclasses.dataclass(frozen=True)
class BenchAdapter:
    # (shape, dtype, device, mode) -> inputs: a dict the other callables understand, with "names",
    # the names of the outputs every closure returns in order (gradients start with "d")
    inputs: Callable[[tuple[int, ...], torch.dtype, torch.device, str], dict[str, Any]]
    # (inputs, mode, backend) -> a closure running kernelset's op (forward, or forward+backward)
    ours: Callable[[dict[str, Any], str, str], Runner]
    # (inputs, mode) -> {peer name: closure, or a string saying why it is not available}
    peers: Callable[[dict[str, Any], str], dict[str, Runner | str]]
    # (inputs, mode) -> fp32 reference outputs, in the order the closures return them
    reference: Callable[[dict[str, Any], str], Outputs]
    # inputs -> the op's positional tensor arguments (for ks.explain / ksctl explain and plan)
    args: Callable[[dict[str, Any]], tuple] = lambda inp: (inp["x"],)
    # inputs -> the keyword arguments of that call that decide the dispatch (flash_attention's causal)
    kwargs: Callable[[dict[str, Any]], dict[str, Any]] = lambda inp: {}
    # what inputs()'s shape means; its benchmark cases are in the full form (a 2-D shape given
    # straight to inputs() outside the grammar is ``ksctl verify``'s small example of the op)
    shape: ShapeGrammar = ROWS_HIDDEN


def runner(fn: Callable[[], torch.Tensor | tuple[torch.Tensor, ...]], inputs: dict[str, Any], mode: str) -> Runner:
    """The closure for one mode: fn's outputs ("fwd"), or its outputs and the gradients to
    ``inputs["wrt"]`` against ``inputs["cot"]`` ("fwd+bwd")."""
    if mode == "fwd":
        def run():
            out = fn()
            return out if isinstance(out, tuple) else (out,)
        return run
    return grads_runner(fn, inputs["wrt"], inputs["cot"])


@functools.lru_cache(maxsize=None)
def compiled(fn: Callable) -> Callable:
    """torch.compile of a peer, one per function for every benchmark shape (static shapes, one
    graph each); dynamo's recompile limit is raised so it never falls back to eager after 8."""
    import torch._dynamo.config as dcfg
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dcfg, name):
            setattr(dcfg, name, max(getattr(dcfg, name), 256))
    return torch.compile(fn, dynamic=False)


def grads_runner(fn: Callable[[], torch.Tensor | tuple[torch.Tensor, ...]], wrt: tuple[torch.Tensor, ...],
                 cotangents: tuple[torch.Tensor, ...]) -> Runner:
    """A closure running fn's forward and its backward to ``wrt`` (no .grad accumulation)."""
    def run():
        out = fn()
        outs = out if isinstance(out, tuple) else (out,)
        grads = torch.autograd.grad(outs, wrt, cotangents[: len(outs)])
        return tuple(outs) + tuple(grads)
    return run
