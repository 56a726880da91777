"""What the generator needs to know of one op (see ops/__init__.py)."""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class KernelRef:
    module: str
    name: str
    # int parameters the aligned specialization assumes divisible by 16 (row strides and the
    # contiguous extent: what lets Triton vectorize loads), besides every pointer 16-byte aligned
    align_ints: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class PolicyRef:
    """A pure policy function of the package, translated to ``int c_name(int64_t ..., c_name_t *)``.
    bind: parameters fixed at translation (tuning instances); keep: defaulted parameters the
    launcher passes (stay C parameters); tuples: tuple parameters (``{"arch": 2}``); fields:
    element names when the function returns a tuple instead of a dataclass."""
    module: str
    name: str
    c_name: str
    bind: Callable[[Any], dict] = lambda mod: {}
    keep: tuple[str, ...] = ()
    tuples: dict | None = None
    fields: tuple[str, ...] | None = None


@dataclasses.dataclass
class Op:
    name: str  # ks_cuda_<name>_plan / _query / _launch
    launcher: str  # the Python function mirrored
    doc: str
    kernels: list[KernelRef]
    policies: list[PolicyRef]
    c_params: list[tuple[str, str]]  # (C type, name) after the common leading parameters
    c_body: str  # body of the plan: glue from the policies' fields to each launch, after the launcher
    cases: Callable[[str], list[dict]]  # "test" | "full" | "sweep" -> cases
    python: Callable[[dict], dict]  # case -> {name: tensor}, running the launcher (which is recorded)
    c_args: Callable[[dict], list]  # case -> values for c_params (tensors as names, dtypes as Triton names)
    modules: tuple[str, ...] = ()  # launch modules whose sm_count / device_arch are patched while recording
    # tensors the launcher allocates for itself, as the C plan places them: (case, recorded
    # launches) -> {"~PO": ("WS", byte offset) | ("scratch", byte offset)}; a named tensor the C
    # call leaves NULL (an LSE not asked for) is listed under its name
    placed: Callable[[dict, list], dict] = lambda case, launches: {}
    # the full set compiles both alignments of every recorded launch (cheap kernels), or only the
    # one each case has (attention: a second alignment per variant doubles the build); the test set
    # always compiles only what its cases have
    both_aligns: bool = True
    # extra declarations for ks_cuda_ops.h (documented there) and their definitions; functions,
    # so that they can read constants of the package (tuning defaults) at generation time
    c_decls: Callable[[], str] = lambda: ""
    c_defs: Callable[[], str] = lambda: ""


def mod(name: str):
    return importlib.import_module(name)


def pow2s(lo: int, hi: int) -> list[int]:
    out, v = [], lo
    while v <= hi:
        out.append(v)
        v *= 2
    return out


def pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def align256(n: int) -> int:
    return (n + 255) // 256 * 256
