"""``ks.optim.AdamW`` (a drop-in torch.optim.Optimizer) and ``ks.clip_grad_norm_``, with their
custom ops (``kernelset::adamw_``, ``kernelset::clip_grad_norm_``) for torch.compile.

Eager calls go straight to the dispatcher; under torch.compile the same code runs inside the
custom ops, which declare the tensors they mutate.
"""
from __future__ import annotations

import functools
import math
import types
import warnings
from typing import Any, Callable, Iterable, Optional

import torch

from ...core import dispatch
from ...core.autograd import mark_written
from ...core.checks import FLOAT_DTYPES
from ...core.enums import AUTO, Backend
from ...core.errors import ArgumentError, ArgumentTypeError
from . import backends  # noqa: F401  (declares the ops and registers their implementations)

_OP = "adamw"
_STATES = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "master_param")


def _adamw_run(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
               exp_avg_sqs: list[torch.Tensor], max_exp_avg_sqs: list[torch.Tensor], masters: list[torch.Tensor],
               steps: list[torch.Tensor], lr: float, lr_tensor: Optional[torch.Tensor], beta1: float, beta2: float,
               eps: float, weight_decay: float, amsgrad: bool, maximize: bool, grad_scale: Optional[torch.Tensor],
               found_inf: Optional[torch.Tensor], backend: str) -> None:
    _adamw_eager(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, lr, lr_tensor, beta1, beta2,
                 eps, weight_decay, amsgrad, maximize, grad_scale, found_inf, backend)


def _adamw_eager(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, lr, lr_tensor, beta1, beta2,
                 eps, weight_decay, amsgrad, maximize, grad_scale, found_inf, backend) -> tuple[Any, Any]:
    """The step, and (the implementation that ran, what it returned: the Triton one its plan)."""
    impl = dispatch.select(_OP, backend, (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters), {})
    res = impl.forward(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, lr, lr_tensor, beta1,
                       beta2, eps, weight_decay, amsgrad, maximize, grad_scale, found_inf)
    if not torch.compiler.is_compiling():
        mark_written(*params)  # as torch's optimizers' in-place updates do
    return impl, res


_adamw_op = torch.library.custom_op(
    "kernelset::adamw_",
    mutates_args=("params", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "masters", "steps"))(_adamw_run)


@_adamw_op.register_fake
def _(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, lr, lr_tensor, beta1, beta2, eps,
      weight_decay, amsgrad, maximize, grad_scale, found_inf, backend):
    return None


def _check_param(p: object, where: str) -> None:
    if not isinstance(p, torch.Tensor):
        raise ArgumentTypeError("AdamW", "params", "an iterable of torch.Tensor", f"{type(p).__name__} in {where}")
    if p.dtype not in FLOAT_DTYPES:
        raise ArgumentTypeError("AdamW", "params", "tensors of dtype float32, float16 or bfloat16 "
                                "(complex and float64 parameters are not supported)", f"{p.dtype} in {where}")


def _nonneg(name: str, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < math.inf:
        raise ArgumentError("AdamW", name, "a finite number >= 0", repr(value))


def _hyper(key: str, value: Any, name: str) -> Any:
    """``lr``, ``betas``, ``eps`` or ``weight_decay`` checked (``name``: what the error calls it);
    returns lr as a 0-dim tensor where a tensor, betas as a pair of floats."""
    if key == "betas":
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise ArgumentError("AdamW", name, "a pair (beta1, beta2)", repr(value))
        betas = []
        for i, b in enumerate(value):
            try:
                f = float(b)
            except (TypeError, ValueError, RuntimeError):
                f = math.nan
            if not 0.0 <= f < 1.0:
                raise ArgumentError("AdamW", f"{name}[{i}]", "in [0, 1)", repr(b))
            betas.append(f)
        return tuple(betas)
    if key == "lr" and isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ArgumentError("AdamW", name, "a float or a 1-element tensor",
                                f"a tensor of shape {tuple(value.shape)}")
        if not value.is_floating_point():
            raise ArgumentTypeError("AdamW", name, "a floating-point tensor", str(value.dtype))
        if not 0.0 <= float(value) < math.inf:  # (read once, here: torch.optim.AdamW reads it too)
            raise ArgumentError("AdamW", name, "a finite number >= 0", repr(value))
        return value.reshape(()) if value.dim() else value
    _nonneg(name, value)
    return value


class AdamW(torch.optim.Optimizer):
    """AdamW with decoupled weight decay, multi-tensor: a drop-in torch.optim.AdamW.

    Same hyper-parameters, same ``param_groups`` keys and per-parameter state (``step`` a float32
    scalar tensor on the parameter's device, ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq`` with
    ``amsgrad``), so state dicts move both ways. States are float32 whatever the parameter dtype
    (fp32, fp16, bf16) by default; ``state_dtype=None`` keeps them in each parameter's dtype, as
    torch.optim.AdamW does (half the state memory of a bf16 model; each state is then rounded once
    per step, where torch's op-by-op update rounds it two or three times). Math is fp32, params
    rounded once per step. ``master_weights=True`` keeps
    an fp32 copy of each fp16/bf16 parameter in ``state["master_param"]``: the update runs on it
    and the parameter becomes its rounding. GradScaler-aware (``_step_supports_amp_scaling``):
    ``step(grad_scale=, found_inf=)`` (or GradScaler's attributes) unscale the grads in the
    kernel and skip the step on the device when found_inf != 0. No host synchronization per step.

    ``foreach``, ``fused`` and ``capturable`` are accepted for compatibility (the update is always
    fused, multi-tensor and capturable); ``differentiable=True`` and complex/float64 parameters
    are refused. ``backend`` picks the implementation (``KS_BACKEND=adamw:reference`` too).
    """

    _step_supports_amp_scaling = True

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1e-3,
                 betas: tuple[float | torch.Tensor, float | torch.Tensor] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None, master_weights: bool = False,
                 state_dtype: torch.dtype | None = torch.float32, backend: Backend | str = AUTO) -> None:
        lr = _hyper("lr", lr, "lr")
        betas = _hyper("betas", betas, "betas")
        eps = _hyper("eps", eps, "eps")
        weight_decay = _hyper("weight_decay", weight_decay, "weight_decay")
        if differentiable:
            raise ArgumentError("AdamW", "differentiable", "False (kernelset's AdamW updates in place outside "
                                "autograd; use torch.optim.AdamW(differentiable=True))", True)
        if fused and foreach:
            raise ArgumentError("AdamW", "fused", "not True together with foreach=True", "both True")
        if state_dtype is not None and state_dtype not in FLOAT_DTYPES:
            raise ArgumentTypeError("AdamW", "state_dtype", "torch.float32, torch.bfloat16, torch.float16 or None "
                                    "(the parameter's dtype)", repr(state_dtype))
        self.state_dtype = state_dtype
        self.master_weights = bool(master_weights)
        self.backend = _parse_backend(backend)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=bool(amsgrad),
                        maximize=bool(maximize), foreach=foreach, capturable=capturable, differentiable=False,
                        fused=fused, decoupled_weight_decay=True)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's, with the group's own hyper-parameters checked as the constructor checks the
        defaults (torch's AdamW checks only those: a group's lr=-1 or betas=(2, 0.9) ran), and
        nothing added when a check fails."""
        where = f"param_groups[{len(self.param_groups)}]"
        if isinstance(param_group, dict):  # (torch's own check refuses anything else)
            for key in ("lr", "betas", "eps", "weight_decay"):
                if key in param_group:
                    _hyper(key, param_group[key], f"{where}['{key}']")
        self._forget_steps()
        super().add_param_group(param_group)
        try:
            for p in self.param_groups[-1]["params"]:
                _check_param(p, where)
        except ArgumentError:
            self.param_groups.pop()
            raise

    def __getstate__(self) -> dict[str, Any]:
        # torch's keeps defaults, state and param_groups only: a deepcopy or pickle of the
        # optimizer then came back without master weights, in fp32 states and on AUTO
        return {**super().__getstate__(), "master_weights": self.master_weights, "state_dtype": self.state_dtype,
                "backend": self.backend}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._forget_steps()
        self.__dict__.setdefault("master_weights", False)
        self.__dict__.setdefault("state_dtype", torch.float32)
        self.__dict__.setdefault("backend", AUTO)
        for group in self.param_groups:
            for key, value in (("amsgrad", False), ("maximize", False), ("foreach", None), ("capturable", False),
                               ("differentiable", False), ("fused", None), ("decoupled_weight_decay", True)):
                group.setdefault(key, value)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's loader, then states re-cast to the state dtype (torch casts them to the param dtype) and
        ``step`` made a float32 scalar on the param's device, from the saved values (copies)."""
        saved = state_dict["state"]
        self._forget_steps()
        super().load_state_dict(state_dict)
        ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for pid, p in zip(ids, params):
            if pid not in saved:
                continue
            st = self.state[p]
            for key, value in saved[pid].items():
                if not isinstance(value, torch.Tensor):
                    continue
                if key == "step":
                    st[key] = value.detach().to(device=p.device, dtype=torch.float32, copy=True).reshape(())
                elif key == "master_param":
                    st[key] = value.detach().to(device=p.device, dtype=torch.float32, copy=True)
                elif key in _STATES:
                    st[key] = value.detach().to(device=p.device, dtype=self._state_dtype(p), copy=True)

    def _state_dtype(self, p: torch.Tensor) -> torch.dtype:
        return self.state_dtype if self.state_dtype is not None else p.dtype

    def _state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, Any]:
        """The parameter's state, created on first use (zeros, step 0) and kept in the state dtype
        on its device."""
        st = self.state[p]
        sdt = self._state_dtype(p)
        if len(st) == 0:
            st["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            st["exp_avg"] = torch.zeros_like(p, dtype=sdt, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, dtype=sdt, memory_format=torch.preserve_format)
        step = st["step"]
        if not isinstance(step, torch.Tensor) or step.dtype != torch.float32 or step.device != p.device \
                or step.dim() != 0:
            st["step"] = torch.as_tensor(step).to(device=p.device, dtype=torch.float32).reshape(())
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            t = st.get(key)
            if t is not None and (t.dtype != sdt or t.device != p.device):
                st[key] = t.to(device=p.device, dtype=sdt)
        if group["amsgrad"] and "max_exp_avg_sq" not in st:
            st["max_exp_avg_sq"] = torch.zeros_like(p, dtype=sdt, memory_format=torch.preserve_format)
        if self.master_weights and p.dtype != torch.float32 and "master_param" not in st:
            st["master_param"] = p.detach().to(torch.float32, memory_format=torch.preserve_format, copy=True)
        return st

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None, *, grad_scale: torch.Tensor | None = None,
             found_inf: torch.Tensor | None = None) -> Any:
        """One AdamW step over every parameter with a grad. ``grad_scale``/``found_inf`` default to
        the attributes torch.amp.GradScaler sets on optimizers with ``_step_supports_amp_scaling``."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if grad_scale is None:
            grad_scale = getattr(self, "grad_scale", None)
        if found_inf is None:
            found_inf = getattr(self, "found_inf", None)
        for group in self.param_groups:
            self._step_group(group, grad_scale, found_inf)
        return loss

    def _forget_steps(self) -> None:
        """Drop the step caches (param groups or states were replaced wholesale)."""
        self.__dict__["_steps_cache"] = {}

    def _step_group(self, group: dict[str, Any], grad_scale: torch.Tensor | None,
                    found_inf: torch.Tensor | None) -> None:
        compiling = torch.compiler.is_compiling()
        if not compiling:  # (the step cache is eager only)
            cache = self.__dict__.setdefault("_steps_cache", {})
            hit = cache.pop(id(group), None)
            if hit is not None and hit.replay(self, group, grad_scale, found_inf):
                cache[id(group)] = hit
                return
        amsgrad = bool(group["amsgrad"])
        parts: dict[tuple, tuple[list, ...]] = {}
        for p in group["params"]:
            g = p.grad
            if g is None:
                continue
            if g.is_sparse:
                raise RuntimeError("AdamW does not support sparse gradients")
            st = self._state(p, group)
            master = st.get("master_param") if self.master_weights and p.dtype != torch.float32 else None
            lists = parts.setdefault((p.device, master is not None), ([], [], [], [], [], [], []))
            lists[0].append(p)
            lists[1].append(g)
            lists[2].append(st["exp_avg"])
            lists[3].append(st["exp_avg_sq"])
            if amsgrad:
                lists[4].append(st["max_exp_avg_sq"])
            if master is not None:
                lists[5].append(master)
            lists[6].append(st["step"])
        if not parts:
            return
        beta1, beta2 = (float(b) for b in group["betas"])
        ran = {}  # part -> (implementation, its result), for the step cache
        for key, (ps, gs, ms, vs, vms, ws, steps) in parts.items():
            device = key[0]
            lr, lr_t = _lr(group["lr"], device)
            scale = _on(grad_scale, device)
            inf = _on(found_inf, device)
            args = (ps, gs, ms, vs, vms, ws, steps, lr, lr_t, beta1, beta2, float(group["eps"]),
                    float(group["weight_decay"]), amsgrad, bool(group["maximize"]), scale, inf, str(self.backend))
            if compiling:
                torch.ops.kernelset.adamw_(*args)
            else:
                ran[key] = _adamw_eager(*args)
        if not compiling:
            step = _GroupStep.build(self, group, parts, ran)
            if step is not None:
                self._steps_cache[id(group)] = step


class _GroupStep:
    """What the next eager step of one param group can reuse: the tensor lists, the Triton plan
    and the dispatcher's choice. A step of 2000 tensors otherwise spends ~13 ms of host time (this
    CPU) re-validating every state, re-deriving the dispatch key and re-hashing every address.

    ``replay`` runs the step on it only when the group holds the same parameter objects in the
    same order (an entry of ``group["params"]`` replaced or the list reordered: the cached lists
    would pair a param with another's grad and size) and, for every parameter: the same ones
    have a grad; each param still has the address it had (a ``.data`` swap, a move or a cast
    changes it); each state entry is the same tensor object; each grad is dense, contiguous and
    of the dtype it had (its address may move: the tables are rebuilt then); the group's
    amsgrad, the optimizer's backend, master_weights and state_dtype are unchanged; and every part ran on
    the Triton implementation. Anything else (and torch.compile) takes the full path, which
    rebuilds the cache. ``load_state_dict``, ``add_param_group`` and unpickling drop it."""

    __slots__ = ("params", "none", "amsgrad", "backend", "master", "state_dtype", "parts")

    @classmethod
    def build(cls, opt: "AdamW", group: dict[str, Any], parts: dict, ran: dict) -> "_GroupStep | None":
        """From a full step: its parts' tensor lists and what each part ran (implementation,
        plan); None where a part did not run on the Triton implementation."""
        params = group["params"]
        index = {id(p): i for i, p in enumerate(params)}
        self = cls()
        self.params = list(params)
        self.none = [p.grad is None for p in params]
        self.amsgrad = bool(group["amsgrad"])
        self.backend, self.master, self.state_dtype = opt.backend, opt.master_weights, opt.state_dtype
        self.parts = []
        for (device, master), (ps, gs, ms, vs, vms, ws, steps) in parts.items():
            impl, prep = ran[(device, master)]
            if impl.backend is not Backend.TRITON or not all(p.is_contiguous() and g.is_contiguous()
                                                              for p, g in zip(ps, gs)):
                return None
            self.parts.append(_PartStep([index[id(p)] for p in ps], ps, ms, vs, vms, ws, steps,
                                        [g.dtype for g in gs], prep, device, master))
        return self

    def replay(self, opt: "AdamW", group: dict[str, Any], grad_scale: torch.Tensor | None,
               found_inf: torch.Tensor | None) -> bool:
        params = group["params"]
        if (len(params) != len(self.params) or bool(group["amsgrad"]) != self.amsgrad or opt.backend != self.backend
                or opt.master_weights != self.master or opt.state_dtype != self.state_dtype
                or any(p is not q for p, q in zip(params, self.params))):
            return False
        grads = [p.grad for p in params]
        if [g is None for g in grads] != self.none:
            return False
        runs = []
        for part in self.parts:  # every check before any launch: a refused replay has written nothing
            gs = [grads[i] for i in part.idx]
            if not part.valid(opt.state, gs):
                return False
            runs.append((part, gs))
        beta1, beta2 = (float(b) for b in group["betas"])
        eps, wd, maximize = float(group["eps"]), float(group["weight_decay"]), bool(group["maximize"])
        from .launch import adamw_prepared
        for part, gs in runs:
            lr, lr_t = _lr(group["lr"], part.device)
            adamw_prepared(part.prep, part.ps, gs, part.ms, part.steps, lr, lr_t, beta1, beta2, eps, wd, self.amsgrad,
                           maximize, part.master, _on(grad_scale, part.device), _on(found_inf, part.device))
            mark_written(*part.ps)
        return True


class _PartStep:
    """One (device, master) part of a cached group step: its tensors, grads' dtypes and plan."""

    __slots__ = ("idx", "ps", "ms", "vs", "vms", "ws", "steps", "p_ptrs", "g_dtypes", "prep", "device", "master")

    def __init__(self, idx, ps, ms, vs, vms, ws, steps, g_dtypes, prep, device, master):
        self.idx, self.ps, self.ms, self.vs, self.vms, self.ws, self.steps = idx, ps, ms, vs, vms, ws, steps
        self.p_ptrs = [p.data_ptr() for p in ps]
        self.g_dtypes, self.prep, self.device, self.master = g_dtypes, prep, device, master

    def valid(self, state, gs: list[torch.Tensor]) -> bool:
        if [p.data_ptr() for p in self.ps] != self.p_ptrs or [g.dtype for g in gs] != self.g_dtypes:
            return False
        for g in gs:
            if g.is_sparse or not g.is_contiguous():
                return False
        vms, ws = self.vms or None, self.ws or None
        for i, p in enumerate(self.ps):
            st = state[p]
            if (st.get("exp_avg") is not self.ms[i] or st.get("exp_avg_sq") is not self.vs[i]
                    or st.get("step") is not self.steps[i]
                    or (vms is not None and st.get("max_exp_avg_sq") is not vms[i])
                    or (ws is not None and st.get("master_param") is not ws[i])):
                return False
        gcol = [g.data_ptr() for g in gs]
        if gcol != self.prep.cols[1]:
            try:
                self.prep.regrad(gcol)
            except ValueError:  # a grad changed alignment: another bucket
                return False
        return True


def _parse_backend(backend: Backend | str) -> Backend | str:
    if isinstance(backend, str) and backend.strip().lower() == AUTO:
        return AUTO
    try:
        return Backend.parse(backend)
    except ValueError:
        valid = ", ".join([AUTO] + [b.value for b in Backend])
        raise ArgumentError("AdamW", "backend", f"one of {valid}", repr(backend)) from None


def _on(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    if t is None or t.device == device:
        return t
    return t.to(device, non_blocking=True)


def _lr(lr: float | torch.Tensor, device: torch.device) -> tuple[float, torch.Tensor | None]:
    """(float lr, None), or (0, the lr tensor on the params' device). A CPU tensor lr with device
    params is read on the host (no device sync), as torch's fused AdamW does."""
    if not isinstance(lr, torch.Tensor):
        return float(lr), None
    if lr.device.type == "cpu" and device.type != "cpu":
        return float(lr), None
    return 0.0, _on(lr.reshape(()), device)


# clip_grad_norm_

def _clip_run(grads: list[torch.Tensor], max_norm: float, norm_type: float, out_dtype: torch.dtype, apply: bool,
              backend: str) -> torch.Tensor:
    impl = dispatch.select("clip_grad_norm", backend, (grads, norm_type), {})
    return impl.forward(grads, max_norm, norm_type, out_dtype, apply)


_clip_op = torch.library.custom_op("kernelset::clip_grad_norm_", mutates_args=("grads",))(_clip_run)


@_clip_op.register_fake
def _(grads, max_norm, norm_type, out_dtype, apply, backend):
    return grads[0].new_empty((), dtype=out_dtype)


def clip_grad_norm_(parameters: torch.Tensor | Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None, *,
                    backend: Backend | str = AUTO) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_: total = ||concat(grads)||_p, g *= min(max_norm / (total + 1e-6), 1).

    Multi-tensor, one pass for the norm (fp32 accumulation) and one for the scaling, no host
    sync (unless ``error_if_nonfinite``, which must read the norm, as torch does). Returns the
    total norm as a 0-dim tensor of the grads' promoted dtype on the first grad's device;
    ``torch.tensor(0.)`` when no parameter has a grad. ``foreach`` is accepted and ignored.
    """
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    else:
        is_generator = isinstance(parameters, types.GeneratorType)
        parameters = list(parameters)
        if is_generator and not parameters:
            warnings.warn("`parameters` is an empty generator, no gradient clipping will occur.", stacklevel=2)
    grads = [p.grad for p in parameters if p.grad is not None]
    max_norm = float(max_norm)
    norm_type = float(norm_type)
    if not grads:
        return torch.tensor(0.0)
    for g in grads:
        if not g.is_floating_point() or g.is_sparse:
            raise ArgumentTypeError("clip_grad_norm_", "parameters", "grads that are dense floating-point tensors",
                                    f"a {'sparse' if g.is_sparse else g.dtype} grad")
    out_dtype = functools.reduce(torch.promote_types, (g.dtype for g in grads))
    backend = str(backend)
    run = torch.ops.kernelset.clip_grad_norm_ if torch.compiler.is_compiling() else _clip_run
    if not error_if_nonfinite:
        return run(grads, max_norm, norm_type, out_dtype, True, backend)
    total = run(grads, max_norm, norm_type, out_dtype, False, backend)
    if torch.logical_or(total.isnan(), total.isinf()):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it cannot be "
            "clipped. To disable this error and scale the gradients by the non-finite norm anyway, set "
            "`error_if_nonfinite=False`")
    coef = torch.clamp(max_norm / (total.float() + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.to(g.device))
    return total
