"""The vocabulary of the declaration (ops.py): option structs and their fields, enumerated option
values, status codes, and functions with their parameters. Plain frozen records; the emitters
(c.py, python.py, rust.py, go.py, node.py) read nothing else."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

# the C types a declaration may use, by spelling
FIELD_TYPES = ("float", "double", "int32_t", "int64_t")  # option fields (also arrays: "int32_t[3]")
SCALAR_TYPES = ("int32_t", "int64_t")  # integer parameters of an op


def camel(name: str) -> str:
    """'qk_norm_rope' -> 'QkNormRope'."""
    return "".join(p[:1].upper() + p[1:] for p in name.split("_"))


def lower_camel(name: str) -> str:
    """'cos_sin_cache' -> 'cosSinCache'."""
    c = camel(name)
    return c[:1].lower() + c[1:]


@dataclass(frozen=True)
class EnumGroup:
    """Values of an option field (``enum { KS_GELU_NONE = 0, KS_GELU_TANH = 1 }``)."""

    prefix: str  # "KS_GELU"
    values: tuple[tuple[str, int], ...]  # (("NONE", 0), ("TANH", 1))
    python: str  # the ctypes module's dict of them: "GELU_APPROX"
    comment: str = ""

    def constants(self) -> list[tuple[str, int]]:
        return [(f"{self.prefix}_{n}", v) for n, v in self.values]

    def constant(self, value: int) -> str:
        return next(c for c, v in self.constants() if v == value)


@dataclass(frozen=True)
class Field:
    """A field of an option struct (after its leading ``size_t size``)."""

    name: str
    ctype: str  # "float", "int32_t", "int64_t", "double", or an array "int32_t[3]"
    default: float | int | tuple
    comment: str = ""  # the header's comment, and the bindings' field doc
    enum: EnumGroup | None = None
    since: tuple[int, int] = (1, 0)

    @property
    def base(self) -> str:
        return self.ctype.split("[")[0]

    @property
    def length(self) -> int | None:
        m = re.search(r"\[(\d+)\]$", self.ctype)
        return int(m.group(1)) if m else None

    def __post_init__(self):
        if self.base not in FIELD_TYPES:
            raise ValueError(f"field {self.name}: type {self.ctype!r} is not one of {FIELD_TYPES} (or an array)")
        if (self.length is None) == isinstance(self.default, tuple):
            raise ValueError(f"field {self.name}: an array field takes a tuple default, a scalar one a number")


@dataclass(frozen=True)
class OptionStruct:
    name: str  # "ks_rms_norm_options"
    fields: tuple[Field, ...]
    since: tuple[int, int] = (1, 0)

    @property
    def stem(self) -> str:
        """'ks_rms_norm_options' -> 'rms_norm' (the bindings' 'RmsNormOptions')."""
        return self.name[len("ks_"):-len("_options")]

    @property
    def camel(self) -> str:
        return camel(self.stem) + "Options"

    def __post_init__(self):
        if not (self.name.startswith("ks_") and self.name.endswith("_options")):
            raise ValueError(f"{self.name}: option structs are named ks_<name>_options")


@dataclass(frozen=True)
class Status:
    name: str  # "KS_ERR_INVALID_ARGUMENT"
    value: int
    comment: str = ""


@dataclass(frozen=True)
class Param:
    """A parameter in C spelling, with what the bindings need to know about it.

    kind: "in" / "out" / "inout" (a tensor: const DLTensor * for "in", DLTensor * else),
    "scalar" (an integer: ctype), "options" (the op's option struct), "stream", or "raw" (anything
    else, spelled by ctype: library functions and hand-written wrappers only)."""

    name: str
    kind: str
    ctype: str = ""
    optional: bool = False
    out_value: bool = False  # a pointer the call writes a result through (koffi: _Out_)

    @property
    def is_tensor(self) -> bool:
        return self.kind in ("in", "out", "inout")

    @property
    def written(self) -> bool:
        return self.kind in ("out", "inout")

    @property
    def c(self) -> str:
        """The C type: 'const DLTensor *', 'int64_t', 'ks_stream_t' ..."""
        return self.ctype

    def decl(self, with_name: bool = True) -> str:
        t = self.ctype
        if not with_name:
            return t
        return f"{t}{self.name}" if t.endswith("*") else f"{t} {self.name}"


def In(name: str, optional: bool = False) -> Param:  # noqa: N802 (reads as a type in the declaration)
    return Param(name, "in", "const DLTensor *", optional)


def Out(name: str, optional: bool = False) -> Param:  # noqa: N802
    return Param(name, "out", "DLTensor *", optional)


def InOut(name: str, optional: bool = False) -> Param:  # noqa: N802
    return Param(name, "inout", "DLTensor *", optional)


def Scalar(name: str, ctype: str = "int64_t") -> Param:  # noqa: N802
    if ctype not in SCALAR_TYPES:
        raise ValueError(f"scalar {name}: type {ctype!r} is not one of {SCALAR_TYPES}")
    return Param(name, "scalar", ctype)


def Raw(name: str, ctype: str, out_value: bool = False) -> Param:  # noqa: N802
    return Param(name, "raw", ctype, out_value=out_value)


@dataclass(frozen=True)
class Function:
    """A KS_API function. With ``op_id`` it is an op: it has a KS_OP_* id, an entry in
    ks_query_support (tensors in signature order) and ks_options_init (with ``options``); its
    parameters are tensors, integer scalars, then its options (if any) and the stream.

    comment: the header's comment above the prototype (lines joined by newlines); section: starts
    a "/* ---- " section of the header before it. doc: one line for the bindings. bind: the
    bindings whose wrapper is generated ("rust", "go", "node"); the others are written by hand
    (their layout is not one tensor per parameter). defaults: this op's defaults where they
    differ from its struct's."""

    name: str  # without the ks_ prefix: "rms_norm"
    params: tuple[Param, ...]
    ret: str = "ks_status_t"
    op_id: int | None = None
    options: OptionStruct | None = None
    doc: str = ""
    comment: str = ""
    section: str = ""
    since: tuple[int, int] = (1, 0)
    table: bool = True  # a field of ks_api_t
    bind: frozenset[str] = frozenset({"rust", "go", "node"})
    defaults: dict = field(default_factory=dict)
    trailing: str = ""  # a comment after the prototype on the same line (library functions)

    @property
    def c_name(self) -> str:
        return "ks_" + self.name

    @property
    def op_const(self) -> str:
        return "KS_OP_" + self.name.upper()

    @property
    def camel(self) -> str:
        return camel(self.name)

    @property
    def tensors(self) -> list[Param]:
        return [p for p in self.params if p.is_tensor]

    def field_default(self, f: Field):
        return self.defaults.get(f.name, f.default)

    def __post_init__(self):
        if self.op_id is not None:
            kinds = [p.kind for p in self.params]
            if kinds[-1] != "stream":
                raise ValueError(f"{self.name}: an op's last parameter is its stream")
            if (self.options is None) != ("options" not in kinds):
                raise ValueError(f"{self.name}: options= and an options parameter go together")
            if self.options is not None and kinds[-2] != "options":
                raise ValueError(f"{self.name}: an op's options come just before its stream")
        unknown = set(self.defaults) - {f.name for f in (self.options.fields if self.options else ())}
        if unknown:
            raise ValueError(f"{self.name}: defaults for fields its options do not have: {sorted(unknown)}")


STREAM = Param("stream", "stream", "ks_stream_t")


def op(name: str, op_id: int, *params: Param, options: OptionStruct | None = None, **kw) -> Function:
    """An op: its tensors and scalars, then (given options) ``const ks_x_options *options`` and the stream."""
    tail = ((Param("options", "options", f"const {options.name} *"),) if options else ()) + (STREAM,)
    return Function(name, tuple(params) + tail, op_id=op_id, options=options, **kw)
