"""Translate a launch-policy function of the Python package into C, so that the C ABI picks its
kernel variant and grid from the same source as the Python launcher (never a hand-kept copy).

The policies are small pure functions of integers (``fwd_policy(m, n, sms, t)`` and the like):
integer arithmetic, ``min``/``max``, ``.bit_length()``, ``math.ceil`` of a true division, ``if``
chains, local names, calls to helper functions of the same module, and one frozen dataclass
returned. Exactly that subset is accepted; anything else raises :class:`TranspileError` naming
the construct and the line, so a policy that grows past it fails the build instead of drifting.

Parameters are int64_t in C. ``tuples={"arch": 2}`` declares a parameter that the launcher passes
as a tuple of ints, never None on a GPU (``device_arch``): it becomes ``arch_0, arch_1``,
``arch is None`` is False, and comparisons with constant tuples are lexicographic as in Python.
A defaulted parameter is bound to its default unless listed in ``keep`` (a flag the launcher
passes, e.g. ``fp8``). A policy may return a tuple instead of a dataclass when ``fields`` names
its elements.

Arguments listed in ``bind`` (the tuning dataclass instance, defaulted keywords) are constants:
their attributes are folded, ``x is None`` / ``x or y`` on them are decided at translation time,
and an ``if`` on a constant emits only the branch taken (the other may not even type-check in C,
e.g. ``splits = tuning.splits`` when that field is None).

Semantics follow Python exactly for the values policies see: ``//`` and ``%`` floor (helpers, not
C's truncating operators), ``<<`` is multiplication by a power of two, true division and
``math.ceil`` are IEEE doubles as in CPython. Integers are int64_t; a division by zero or a shift
out of range sets the error flag the C function returns (Python would have raised).
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import textwrap
from typing import Any, Callable

PRELUDE = r"""
/* Python integer semantics for the translated launch policies (capi/aot/transpile.py). */
static inline int64_t ks_pol_floordiv(int64_t a, int64_t b, int *err) {
  if (b == 0) { *err = 1; return 0; }
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
  return q;
}
static inline int64_t ks_pol_mod(int64_t a, int64_t b, int *err) {
  if (b == 0) { *err = 1; return 0; }
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
static inline int64_t ks_pol_shl(int64_t a, int64_t b, int *err) {
  if (b < 0 || b > 62) { *err = 1; return 0; }
  return a * ((int64_t)1 << b);
}
static inline int64_t ks_pol_shr(int64_t a, int64_t b, int *err) {
  if (b < 0) { *err = 1; return 0; }
  if (b > 63) return a < 0 ? -1 : 0;
  return a >= 0 ? (a >> b) : -((-a - 1) >> b) - 1;
}
static inline int64_t ks_pol_bit_length(int64_t v) {
  uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
  int64_t n = 0;
  while (u) { n++; u >>= 1; }
  return n;
}
static inline int64_t ks_pol_min(int64_t a, int64_t b) { return b < a ? b : a; }
static inline int64_t ks_pol_max(int64_t a, int64_t b) { return b > a ? b : a; }
static inline double ks_pol_fmin(double a, double b) { return b < a ? b : a; }
static inline double ks_pol_fmax(double a, double b) { return b > a ? b : a; }
static inline int64_t ks_pol_abs(int64_t a) { return a < 0 ? -a : a; }
static inline double ks_pol_div(double a, double b, int *err) {
  if (b == 0.0) { *err = 1; return 0.0; }
  return a / b;
}
static inline int64_t ks_pol_ceil(double x, int *err) {
  if (!(x > -9.2e18 && x < 9.2e18)) { *err = 1; return 0; }
  int64_t i = (int64_t)x;
  return (double)i < x ? i + 1 : i;
}
static inline int64_t ks_pol_floor(double x, int *err) {
  if (!(x > -9.2e18 && x < 9.2e18)) { *err = 1; return 0; }
  int64_t i = (int64_t)x;
  return (double)i > x ? i - 1 : i;
}
"""


class TranspileError(Exception):
    pass


_NOT = object()  # "not a compile-time constant"


@dataclasses.dataclass
class _E:
    code: str
    ty: str  # "int" | "float" | "bool" | "tuple" | "none" | "obj"
    const: Any = _NOT
    items: list | None = None  # tuple elements


def _c_literal(v: Any) -> _E:
    if v is None:
        return _E("0", "none", None)
    if isinstance(v, bool):
        return _E("1" if v else "0", "bool", v)
    if isinstance(v, int):
        if not -(2**63) < v < 2**63:
            raise TranspileError(f"integer constant {v} does not fit int64")
        return _E(f"INT64_C({v})", "int", v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise TranspileError(f"non-finite float constant {v}")
        return _E(repr(float(v)), "float", v)
    if isinstance(v, tuple):
        items = [_c_literal(x) for x in v]
        return _E("", "tuple", v, items)
    return _E("", "obj", v)


@dataclasses.dataclass
class PolicyC:
    """C text of one translated policy: the struct, the function and the helpers it calls."""
    c_name: str
    struct_name: str
    params: list[str]  # C parameter names, int64_t each, in Python order (bound ones removed)
    fields: list[tuple[str, int]]  # (field name, number of int64 slots)
    struct: str
    function: str
    returns: Any = None  # the dataclass (or tuple) returned: policies returning the same one share a struct

    @property
    def slots(self) -> int:
        return sum(n for _, n in self.fields)


class _Translator:
    def __init__(self, fn: Callable, bind: dict[str, Any], prefix: str, helper_cache: dict,
                 keep: tuple[str, ...] = (), tuples: dict[str, int] | None = None,
                 fields: tuple[str, ...] | None = None):
        self.fn = inspect.unwrap(fn)
        self.glob = self.fn.__globals__
        self.bind = dict(bind)
        self.keep = set(keep)
        self.tuples = dict(tuples or {})
        self.tuple_fields = fields
        self.prefix = prefix
        self.helper_cache = helper_cache  # python function -> (c name, C text)
        src = textwrap.dedent(inspect.getsource(self.fn))
        mod = ast.parse(src)
        self.node = mod.body[0]
        if not isinstance(self.node, ast.FunctionDef):
            raise TranspileError(f"{self.fn.__name__}: not a plain function")
        self.vars: dict[str, str] = {}  # local name -> type
        self.lines: list[str] = []
        self.indent = 1
        self.ret_class = None  # dataclass returned (top level)
        self.ret_type = None  # helper: type of the returned value

    # ---- errors
    def err(self, node: ast.AST, what: str) -> TranspileError:
        line = getattr(node, "lineno", 0) + self.fn.__code__.co_firstlineno - 1
        return TranspileError(f"{self.fn.__module__}.{self.fn.__qualname__} line {line}: {what}")

    # ---- parameters
    def params(self) -> list[str]:
        a = self.node.args
        if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs:
            raise self.err(self.node, "only plain positional parameters are supported")
        names = [x.arg for x in a.args]
        defaults = dict(zip(names[len(names) - len(a.defaults):], a.defaults))
        unknown = (self.keep | set(self.tuples)) - set(names)
        if unknown:
            raise self.err(self.node, f"keep/tuples name no parameter: {sorted(unknown)}")
        out = []
        for name in names:
            if name in self.bind:
                continue
            if name in self.tuples:
                out += [f"{name}_{i}" for i in range(self.tuples[name])]
                continue
            if name in defaults and name not in self.keep:
                # a defaulted argument the launcher never passes: bound to its default
                try:
                    self.bind[name] = ast.literal_eval(defaults[name])
                except Exception:
                    raise self.err(defaults[name], f"default of {name!r} is not a literal; bind it explicitly")
                continue
            out.append(name)
            self.vars[name] = "int"
        return out

    # ---- statements
    def emit(self, text: str) -> None:
        self.lines.append("  " * self.indent + text)

    def body(self, stmts: list[ast.stmt]) -> None:
        for s in stmts:
            self.stmt(s)

    def stmt(self, s: ast.stmt) -> None:
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str):
            return  # docstring
        if isinstance(s, ast.Pass):
            return
        if isinstance(s, ast.Assign):
            if len(s.targets) != 1 or not isinstance(s.targets[0], ast.Name):
                raise self.err(s, "only `name = expr` assignments are supported")
            self.assign(s.targets[0].id, self.expr(s.value), s)
            return
        if isinstance(s, ast.AugAssign):
            if not isinstance(s.target, ast.Name):
                raise self.err(s, "augmented assignment to a non-name")
            value = self.binop(s.op, self.name(s.target.id, s), self.expr(s.value), s)
            self.assign(s.target.id, value, s)
            return
        if isinstance(s, ast.If):
            test = self.expr(s.test)
            if test.const is not _NOT:
                self.body(s.body if test.const else s.orelse)
                return
            self.emit(f"if ({self.truth(test, s)}) {{")
            self.indent += 1
            self.body(s.body)
            self.indent -= 1
            if s.orelse:
                self.emit("} else {")
                self.indent += 1
                self.body(s.orelse)
                self.indent -= 1
            self.emit("}")
            return
        if isinstance(s, ast.Return):
            self.ret(s)
            return
        raise self.err(s, f"statement {type(s).__name__} is not supported")

    def assign(self, name: str, value: _E, node: ast.AST) -> None:
        if name in self.bind:
            raise self.err(node, f"assignment to bound name {name!r}")
        if value.ty in ("tuple", "obj", "none"):
            raise self.err(node, f"{name!r}: only int, float and bool locals are supported")
        ty = "int" if value.ty == "bool" else value.ty  # Python bools in int arithmetic are ints
        prev = self.vars.get(name)
        if prev is not None and prev != ty:
            raise self.err(node, f"{name!r} changes type ({prev} -> {ty})")
        self.vars[name] = ty
        self.emit(f"{name} = {value.code};")

    def ret(self, s: ast.Return) -> None:
        v = s.value
        if self.tuple_fields is not None and self.ret_class is not _HELPER:
            if not isinstance(v, ast.Tuple) or len(v.elts) != len(self.tuple_fields):
                raise self.err(s, f"the policy must return a tuple of {len(self.tuple_fields)} ints")
            self.ret_class = tuple
            for name, a in zip(self.tuple_fields, v.elts):
                e = self.expr(a)
                if e.ty not in ("int", "bool"):
                    raise self.err(s, f"tuple element {name}: expected an int, got {e.ty}")
                self.emit(f"out->{name} = {_cast(e, 'int')};")
            self.emit("return err_flag;")
            return
        if self.ret_class is _HELPER:
            e = self.expr(v)
            if e.ty not in ("int", "bool"):
                raise self.err(s, "helper functions must return an int")
            self.emit(f"return {e.code};")
            return
        if not (isinstance(v, ast.Call) and isinstance(v.func, ast.Name)):
            raise self.err(s, "the policy must return its dataclass, constructed in the return statement")
        cls = self.glob.get(v.func.id)
        if not dataclasses.is_dataclass(cls):
            raise self.err(s, f"{v.func.id} is not a dataclass")
        if self.ret_class is None:
            self.ret_class = cls
        elif self.ret_class is not cls:
            raise self.err(s, "all returns must build the same dataclass")
        fields = dataclasses.fields(cls)
        values: dict[str, _E] = {}
        for f, a in zip(fields, v.args):
            values[f.name] = self.expr(a)
        for kw in v.keywords:
            values[kw.arg] = self.expr(kw.value)
        for f in fields:
            if f.name not in values:
                if f.default is dataclasses.MISSING:
                    raise self.err(s, f"field {f.name} has no value")
                values[f.name] = _c_literal(f.default)
        for f in fields:
            e = values[f.name]
            n = _slots(cls, f)
            if n == 1:
                if e.ty not in ("int", "bool"):
                    raise self.err(s, f"field {f.name}: expected an int, got {e.ty}")
                self.emit(f"out->{f.name} = {e.code};")
            else:
                if e.ty != "tuple" or len(e.items) != n:
                    raise self.err(s, f"field {f.name}: expected a tuple of {n} ints")
                for i, it in enumerate(e.items):
                    if it.ty not in ("int", "bool"):
                        raise self.err(s, f"field {f.name}[{i}]: expected an int")
                    self.emit(f"out->{f.name}[{i}] = {it.code};")
        self.emit("return err_flag;")

    # ---- expressions
    def truth(self, e: _E, node: ast.AST) -> str:
        if e.ty in ("int", "bool"):
            return f"({e.code} != 0)" if e.ty == "int" else e.code
        if e.ty == "float":
            return f"({e.code} != 0.0)"
        raise self.err(node, f"truth value of a {e.ty}")

    def name(self, ident: str, node: ast.AST) -> _E:
        if ident in self.bind:
            return _c_literal(self.bind[ident])
        if ident in self.tuples:
            return _E("", "rtuple", _NOT, [_E(f"{ident}_{i}", "int") for i in range(self.tuples[ident])])
        if ident in self.vars:
            return _E(ident, self.vars[ident])
        if ident in ("True", "False", "None"):
            return _c_literal({"True": True, "False": False, "None": None}[ident])
        if ident in self.glob:
            return _c_literal(self.glob[ident])
        raise self.err(node, f"unknown name {ident!r}")

    def expr(self, n: ast.expr) -> _E:
        if isinstance(n, ast.Constant):
            return _c_literal(n.value)
        if isinstance(n, ast.Name):
            return self.name(n.id, n)
        if isinstance(n, ast.Attribute):
            base = self.expr(n.value)
            if base.const is _NOT:
                raise self.err(n, "attribute of a non-constant")
            if not hasattr(base.const, n.attr):
                raise self.err(n, f"no attribute {n.attr!r}")
            return _c_literal(getattr(base.const, n.attr))
        if isinstance(n, ast.Tuple):
            items = [self.expr(x) for x in n.elts]
            const = tuple(x.const for x in items) if all(x.const is not _NOT for x in items) else _NOT
            return _E("", "tuple", const, items)
        if isinstance(n, ast.BinOp):
            return self.binop(n.op, self.expr(n.left), self.expr(n.right), n)
        if isinstance(n, ast.UnaryOp):
            v = self.expr(n.operand)
            if isinstance(n.op, ast.USub):
                if v.ty not in ("int", "float", "bool"):
                    raise self.err(n, "negation of a non-number")
                if v.const is not _NOT:
                    return _c_literal(-v.const)
                return _E(f"(-{v.code})", "int" if v.ty == "bool" else v.ty)
            if isinstance(n.op, ast.UAdd):
                return v
            if isinstance(n.op, ast.Not):
                if v.const is not _NOT:
                    return _c_literal(not v.const)
                return _E(f"(!{self.truth(v, n)})", "bool")
            raise self.err(n, f"unary {type(n.op).__name__}")
        if isinstance(n, ast.BoolOp):
            return self.boolop(n)
        if isinstance(n, ast.Compare):
            return self.compare(n)
        if isinstance(n, ast.IfExp):
            test = self.expr(n.test)
            if test.const is not _NOT:
                return self.expr(n.body if test.const else n.orelse)
            a, b = self.expr(n.body), self.expr(n.orelse)
            ty = _unify(a, b)
            if ty is None:
                raise self.err(n, f"branches of a conditional expression differ in type ({a.ty}, {b.ty})")
            return _E(f"({self.truth(test, n)} ? {_cast(a, ty)} : {_cast(b, ty)})", ty)
        if isinstance(n, ast.Call):
            return self.call(n)
        raise self.err(n, f"expression {type(n).__name__} is not supported")

    def boolop(self, n: ast.BoolOp) -> _E:
        # Python returns an operand, not a bool: only decided (constant) operands may be non-bool.
        values = list(n.values)
        is_or = isinstance(n.op, ast.Or)
        while len(values) > 1:
            first = self.expr(values[0])
            if first.const is _NOT:
                break
            if bool(first.const) == is_or:
                return first  # `x or y` with x truthy, `x and y` with x falsy
            values.pop(0)
        if len(values) == 1:
            return self.expr(values[0])
        parts = [self.expr(v) for v in values]
        if any(p.ty != "bool" for p in parts):
            raise self.err(n, "`and`/`or` on non-bool values that are not constants")
        op = " || " if is_or else " && "
        return _E("(" + op.join(p.code for p in parts) + ")", "bool")

    def compare(self, n: ast.Compare) -> _E:
        left = self.expr(n.left)
        terms = []
        consts = []
        for op, right_node in zip(n.ops, n.comparators):
            right = self.expr(right_node)
            if isinstance(op, (ast.Is, ast.IsNot)) and "rtuple" in (left.ty, right.ty):
                other = right if left.ty == "rtuple" else left
                if other.ty != "none":
                    raise self.err(n, "`is` between a tuple parameter and something other than None")
                consts.append(isinstance(op, ast.IsNot))  # a tuple parameter is never None
                left = right
                continue
            if "rtuple" in (left.ty, right.ty):
                terms.append(self.tuple_compare(op, left, right, n))
                left = right
                continue
            if isinstance(op, (ast.Is, ast.IsNot)):
                if left.const is _NOT or right.const is _NOT:
                    raise self.err(n, "`is` only between constants (e.g. a bound tuning field and None)")
                r = (left.const is right.const) == isinstance(op, ast.Is)
                consts.append(r)
                left = right
                continue
            sym = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}.get(type(op))
            if sym is None:
                raise self.err(n, f"comparison {type(op).__name__}")
            if left.ty not in ("int", "float", "bool") or right.ty not in ("int", "float", "bool"):
                raise self.err(n, f"comparison of {left.ty} and {right.ty}")
            if left.const is not _NOT and right.const is not _NOT:
                consts.append(eval(f"a {sym} b", {}, {"a": left.const, "b": right.const}))
            else:
                ty = "float" if "float" in (left.ty, right.ty) else "int"
                terms.append(f"({_cast(left, ty)} {sym} {_cast(right, ty)})")
            left = right
        if not all(consts):
            return _c_literal(False)
        if not terms:
            return _c_literal(True)
        return _E("(" + " && ".join(terms) + ")", "bool")

    def tuple_compare(self, op: ast.cmpop, a: _E, b: _E, node: ast.AST) -> str:
        """Python's lexicographic comparison of two equally long int tuples, one of them a parameter."""
        items = []
        for x in (a, b):
            if x.ty == "rtuple":
                items.append(x.items)
            elif x.ty == "tuple" and all(i.ty in ("int", "bool") for i in x.items):
                items.append(x.items)
            else:
                raise self.err(node, f"comparison of a tuple parameter with a {x.ty}")
        xa, xb = items
        if len(xa) != len(xb):
            raise self.err(node, "comparison of tuples of different lengths")
        sym = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}.get(type(op))
        if sym is None:
            raise self.err(node, f"tuple comparison {type(op).__name__}")
        eq = " && ".join(f"({_cast(p, 'int')} == {_cast(q, 'int')})" for p, q in zip(xa, xb))
        if sym in ("==", "!="):
            return f"({eq})" if sym == "==" else f"(!({eq}))"
        strict = sym[0]  # the first differing element decides; all equal: only <= and >= hold
        chain = "1" if sym in ("<=", ">=") else "0"
        for p, q in reversed(list(zip(xa, xb))):
            pc, qc = _cast(p, "int"), _cast(q, "int")
            chain = f"(({pc} {strict} {qc}) || (({pc} == {qc}) && {chain}))"
        return chain

    def binop(self, op: ast.operator, a: _E, b: _E, node: ast.AST) -> _E:
        for x in (a, b):
            if x.ty not in ("int", "float", "bool"):
                raise self.err(node, f"arithmetic on a {x.ty}")
        if a.const is not _NOT and b.const is not _NOT:
            try:
                return _c_literal(_PYOPS[type(op)](a.const, b.const))
            except KeyError:
                raise self.err(node, f"operator {type(op).__name__}")
        fl = "float" in (a.ty, b.ty)
        if isinstance(op, ast.Div):
            return _E(f"ks_pol_div({_cast(a, 'float')}, {_cast(b, 'float')}, err)", "float")
        if fl:
            sym = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}.get(type(op))
            if sym is None:
                raise self.err(node, f"float operator {type(op).__name__}")
            return _E(f"({_cast(a, 'float')} {sym} {_cast(b, 'float')})", "float")
        ai, bi = _cast(a, "int"), _cast(b, "int")
        if isinstance(op, ast.FloorDiv):
            return _E(f"ks_pol_floordiv({ai}, {bi}, err)", "int")
        if isinstance(op, ast.Mod):
            return _E(f"ks_pol_mod({ai}, {bi}, err)", "int")
        if isinstance(op, ast.LShift):
            return _E(f"ks_pol_shl({ai}, {bi}, err)", "int")
        if isinstance(op, ast.RShift):
            return _E(f"ks_pol_shr({ai}, {bi}, err)", "int")
        sym = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^"}.get(type(op))
        if sym is None:
            raise self.err(node, f"operator {type(op).__name__}")
        return _E(f"({ai} {sym} {bi})", "int")

    def call(self, n: ast.Call) -> _E:
        if n.keywords:
            raise self.err(n, "keyword arguments in a call")
        f = n.func
        if isinstance(f, ast.Attribute) and f.attr == "bit_length" and not n.args:
            v = self.expr(f.value)
            if v.ty not in ("int", "bool"):
                raise self.err(n, ".bit_length() of a non-int")
            if v.const is not _NOT:
                return _c_literal(int(v.const).bit_length())
            return _E(f"ks_pol_bit_length({v.code})", "int")
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "math" \
                and self.glob.get("math") is math and f.attr in ("ceil", "floor") and len(n.args) == 1:
            v = self.expr(n.args[0])
            if v.const is not _NOT:
                return _c_literal(getattr(math, f.attr)(v.const))
            if v.ty != "float":
                return _E(_cast(v, "int"), "int")
            return _E(f"ks_pol_{f.attr}({v.code}, err)", "int")
        if not isinstance(f, ast.Name):
            raise self.err(n, "call of a non-name")
        args = [self.expr(a) for a in n.args]
        if f.id in ("min", "max") and f.id not in self.glob:
            if len(args) < 2:
                raise self.err(n, f"{f.id}() of one argument")
            if all(a.const is not _NOT for a in args):
                return _c_literal((min if f.id == "min" else max)(a.const for a in args))
            tys = {("int" if a.ty == "bool" else a.ty) for a in args}
            if tys - {"int", "float"} or len(tys) != 1:
                raise self.err(n, f"{f.id}() of mixed or non-numeric types {sorted(tys)}")
            ty = tys.pop()
            fname = ("ks_pol_" if ty == "int" else "ks_pol_f") + f.id
            code = args[0].code
            for a in args[1:]:
                code = f"{fname}({code}, {a.code})"
            return _E(code, ty)
        if f.id == "abs" and f.id not in self.glob and len(args) == 1 and args[0].ty in ("int", "bool"):
            return _E(f"ks_pol_abs({args[0].code})", "int")
        if f.id == "int" and f.id not in self.glob and len(args) == 1 and args[0].ty in ("int", "bool"):
            return _E(_cast(args[0], "int"), "int")
        target = self.glob.get(f.id)
        if inspect.isfunction(target) or inspect.isfunction(inspect.unwrap(target) if callable(target) else None):
            target = inspect.unwrap(target)
            if target.__module__ != self.fn.__module__:
                raise self.err(n, f"{f.id} is defined in another module ({target.__module__})")
            cname = self.helper(target)
            for a in args:
                if a.ty not in ("int", "bool"):
                    raise self.err(n, f"argument of {f.id}() must be an int")
            inner = ", ".join(_cast(a, "int") for a in args)
            return _E(f"{cname}({inner}{', ' if inner else ''}err)", "int")
        raise self.err(n, f"call of {f.id!r} is not supported")

    def helper(self, target: Callable) -> str:
        if target in self.helper_cache:
            return self.helper_cache[target][0]
        cname = f"{self.prefix}_{target.__name__.lstrip('_')}"
        self.helper_cache[target] = (cname, None, None)  # recursion guard
        t = _Translator(target, {}, self.prefix, self.helper_cache)
        t.ret_class = _HELPER
        params = t.params()
        t.body(t.node.body)
        decls = _decls(t.vars, params)
        sig = ", ".join([f"int64_t {p}" for p in params] + ["int *err"])
        proto = f"static int64_t {cname}({sig})"
        text = (f"{proto} {{\n" + decls + "\n".join(t.lines) +
                "\n  return 0; /* not reached: every path returns */\n}\n")
        self.helper_cache[target] = (cname, proto, text)
        return cname


_HELPER = object()

_PYOPS = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b, ast.Div: lambda a, b: a / b,
    ast.LShift: lambda a, b: a << b, ast.RShift: lambda a, b: a >> b, ast.BitAnd: lambda a, b: a & b,
    ast.BitOr: lambda a, b: a | b, ast.BitXor: lambda a, b: a ^ b,
}


def _unify(a: _E, b: _E) -> str | None:
    ta = "int" if a.ty == "bool" else a.ty
    tb = "int" if b.ty == "bool" else b.ty
    if ta == tb and ta in ("int", "float"):
        return ta
    if {ta, tb} == {"int", "float"}:
        return "float"
    return None


def _cast(e: _E, ty: str) -> str:
    if ty == "float" and e.ty != "float":
        return f"(double)({e.code})"
    if ty == "int" and e.ty == "bool":
        return f"(int64_t)({e.code})"
    return e.code


def _decls(vars_: dict[str, str], params: list[str]) -> str:
    out = []
    for name, ty in vars_.items():
        if name in params:
            continue
        out.append(f"  {'double' if ty == 'float' else 'int64_t'} {name} = 0;\n")
    return "".join(out)


def _slots(cls: type, f: dataclasses.Field) -> int:
    ann = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    ann = ann.replace(" ", "")
    if ann in ("int", "bool"):
        return 1
    if ann.startswith("tuple[") and ann.endswith("]"):
        parts = ann[len("tuple["):-1].split(",")
        if all(p == "int" for p in parts):
            return len(parts)
    raise TranspileError(f"{cls.__name__}.{f.name}: field type {ann!r} is not int, bool or tuple[int, ...]")


def _prefix(fn: Callable) -> str:
    parts = inspect.unwrap(fn).__module__.split(".")
    return "ks_pol_" + (parts[-2] if len(parts) >= 2 else parts[-1])


def translate(fn: Callable, c_name: str, bind: dict[str, Any] | None = None,
              helper_cache: dict | None = None, keep: tuple[str, ...] = (), tuples: dict[str, int] | None = None,
              fields: tuple[str, ...] | None = None) -> PolicyC:
    """C translation of ``fn``: ``int c_name(int64_t p..., c_name_t *out)`` returning 0, or 1
    where Python would have raised (division by zero, bad shift)."""
    cache = helper_cache if helper_cache is not None else {}
    t = _Translator(fn, bind or {}, prefix=_prefix(fn), helper_cache=cache, keep=keep, tuples=tuples, fields=fields)
    params = t.params()
    t.body(t.node.body)
    if t.ret_class is None:
        raise TranspileError(f"{fn.__qualname__}: no return of a dataclass")
    cls = t.ret_class
    if cls is tuple:
        out_fields = [(n, 1) for n in fields]
        what = f"the tuple {fn.__qualname__} returns ({', '.join(fields)})"
    else:
        out_fields = [(f.name, _slots(cls, f)) for f in dataclasses.fields(cls)]
        what = f"{fn.__module__}.{cls.__name__}"
    struct_name = f"{c_name}_t"
    members = "".join(f"  int64_t {n};\n" if k == 1 else f"  int64_t {n}[{k}];\n" for n, k in out_fields)
    struct = (f"/* {what}: every field widened to int64_t (bool: 0/1) */\n"
              f"typedef struct {{\n{members}}} {struct_name};\n")
    fields = out_fields
    sig = ", ".join([f"int64_t {p}" for p in params] + [f"{struct_name} *out"])
    bound = ", ".join(f"{k}={v!r}" for k, v in (bind or {}).items())
    unused = "".join(f"  (void){n};\n" for n in params + [v for v in t.vars if v not in params])
    body = (f"/* Translated from {fn.__module__}.{fn.__qualname__}" + (f" with {bound}" if bound else "") +
            " (capi/aot/transpile.py). Returns 0, or 1 where Python would raise. */\n"
            f"int {c_name}({sig}) {{\n  int err_flag = 0;\n  int *err = &err_flag;\n  (void)err;\n" + _decls(t.vars, params) +
            unused + "\n".join(t.lines) +
            "\n  return 1; /* not reached: every path returns */\n}\n")
    return PolicyC(c_name, struct_name, params, fields, struct, body, None if cls is tuple else cls)


def helpers_c(helper_cache: dict) -> str:
    """Prototypes, then bodies, of every helper the translated policies call (shared cache)."""
    protos = "".join(f"{proto};\n" for _, proto, _ in helper_cache.values())
    return protos + "\n" + "\n".join(text for _, _, text in helper_cache.values())
