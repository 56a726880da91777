"""What each GPU kernelset targets can do: one table, read by ``ksctl plan`` and the dispatcher.

Two levels of data. :data:`ARCHS` holds what a compute capability implies (the features a kernel
may rely on: bf16 and fp8 tensor cores, TMA, wgmma, tcgen05, shared memory); :data:`GPUS` holds the
products (SM count, memory, bandwidth, dense tensor-core throughput from the vendor's datasheet).
A product's features are its arch's, so a kernel that needs TMA asks ``has(arch, "tma")`` and
never a list of product names: the fp8 cache checks of the attention, MLA and KV-cache
implementations, the sm_90 Gluon kernels (MLA decode, the ring forwards) and ``ksctl plan`` all
read it.

Throughputs are dense (no 2:4 sparsity) tensor-core figures with fp32 accumulation, in TFLOP/s,
rounded: they size roofline estimates, never a correctness decision. Bandwidth is the datasheet
figure in GB/s; the benchmarks measure the real copy ceiling on the machine.
"""
from __future__ import annotations

import dataclasses
import re

import torch

from .arch import Arch


@dataclasses.dataclass(frozen=True)
class ArchFeatures:
    """What a compute capability guarantees to a kernel."""

    arch: Arch
    name: str  # the architecture's name
    bf16: bool  # bf16 tensor cores (sm_80+); without them bf16 is emulated in fp32 and slow
    fp8: bool  # fp8 (e4m3/e5m2) tensor cores (sm_89+)
    fp4: bool  # fp4 tensor cores (Blackwell)
    int8: bool  # int8 tensor cores (sm_72+)
    cp_async: bool  # asynchronous global->shared copies (sm_80+): software pipelining in Triton
    tma: bool  # the Tensor Memory Accelerator (sm_90+): bulk tensor copies, Triton descriptors
    wgmma: bool  # warpgroup MMA (sm_90a only; Blackwell datacenter uses tcgen05, consumer Blackwell mma.sync)
    tcgen05: bool  # 5th-generation tensor cores with tensor memory (sm_100)
    smem_per_sm_kib: int  # shared memory per SM
    smem_per_block_kib: int  # the most one block can opt in to

    def flags(self) -> tuple[str, ...]:
        """The features this arch has, by name, in a fixed order."""
        names = ("bf16", "fp8", "fp4", "int8", "cp_async", "tma", "wgmma", "tcgen05")
        return tuple(n for n in names if getattr(self, n))


def _arch(arch: Arch, name: str, smem_sm: int, smem_block: int, *, fp4: bool = False, tcgen05: bool = False,
          wgmma: bool = False) -> ArchFeatures:
    return ArchFeatures(arch=arch, name=name, bf16=arch >= (8, 0), fp8=arch >= (8, 9), fp4=fp4, int8=arch >= (7, 2),
                        cp_async=arch >= (8, 0), tma=arch >= (9, 0), wgmma=wgmma, tcgen05=tcgen05,
                        smem_per_sm_kib=smem_sm, smem_per_block_kib=smem_block)


ARCHS: dict[Arch, ArchFeatures] = {a.arch: a for a in (
    _arch((7, 0), "Volta", 96, 96),
    _arch((7, 5), "Turing", 64, 64),
    _arch((8, 0), "Ampere (datacenter)", 164, 163),
    _arch((8, 6), "Ampere", 100, 99),
    _arch((8, 9), "Ada Lovelace", 100, 99),
    _arch((9, 0), "Hopper", 228, 227, wgmma=True),
    _arch((10, 0), "Blackwell (datacenter)", 228, 227, fp4=True, tcgen05=True),
    _arch((12, 0), "Blackwell (consumer/workstation)", 128, 99, fp4=True),
)}


@dataclasses.dataclass(frozen=True)
class GPU:
    key: str  # what --gpu takes
    name: str
    arch: Arch
    sms: int
    memory_gib: float
    bandwidth_gbs: float  # datasheet memory bandwidth
    bf16_tflops: float  # dense tensor-core bf16 (fp16 on Turing, which has no bf16), fp32 accumulation
    fp8_tflops: float | None  # dense fp8 tensor cores; None without them
    int8_tops: float | None
    aliases: tuple[str, ...] = ()
    match: str = ""  # regex on torch.cuda.get_device_name()

    @property
    def features(self) -> ArchFeatures:
        return arch_features(self.arch)

    @property
    def sm(self) -> str:
        return f"sm_{self.arch[0]}{self.arch[1]}"

    def to_dict(self) -> dict:
        f = self.features
        return {"key": self.key, "name": self.name, "sm": self.sm, "arch": f.name, "sms": self.sms,
                "memory_gib": self.memory_gib, "bandwidth_gbs": self.bandwidth_gbs, "bf16_tflops": self.bf16_tflops,
                "fp8_tflops": self.fp8_tflops, "int8_tops": self.int8_tops, "features": list(f.flags()),
                "smem_per_sm_kib": f.smem_per_sm_kib, "smem_per_block_kib": f.smem_per_block_kib}


GPUS: tuple[GPU, ...] = (
    GPU("t4", "NVIDIA T4", (7, 5), 40, 16, 320, 65, None, 130, match=r"\bT4\b"),
    GPU("a10", "NVIDIA A10", (8, 6), 72, 24, 600, 125, None, 250, aliases=("a10g",), match=r"\bA10G?\b"),
    GPU("a100", "NVIDIA A100 80GB SXM", (8, 0), 108, 80, 2039, 312, None, 624, aliases=("a100-80gb",),
        match=r"A100.*80"),
    GPU("a100-40gb", "NVIDIA A100 40GB", (8, 0), 108, 40, 1555, 312, None, 624, match=r"A100"),
    GPU("l4", "NVIDIA L4", (8, 9), 58, 24, 300, 121, 242, 485, match=r"\bL4\b"),
    GPU("l40s", "NVIDIA L40S", (8, 9), 142, 48, 864, 362, 733, 733, match=r"L40S"),
    GPU("rtx4090", "NVIDIA GeForce RTX 4090", (8, 9), 128, 24, 1008, 165, 330, 660, aliases=("4090",),
        match=r"RTX 4090"),
    GPU("h100", "NVIDIA H100 SXM", (9, 0), 132, 80, 3350, 989, 1979, 1979, aliases=("h100-sxm",),
        match=r"H100(?!.*PCIe)"),
    GPU("h100-pcie", "NVIDIA H100 PCIe", (9, 0), 114, 80, 2000, 756, 1513, 1513, match=r"H100.*PCIe"),
    GPU("h200", "NVIDIA H200", (9, 0), 132, 141, 4800, 989, 1979, 1979, match=r"H200"),
    GPU("b200", "NVIDIA B200", (10, 0), 148, 180, 8000, 2250, 4500, 4500, match=r"B200"),
    GPU("rtx5090", "NVIDIA GeForce RTX 5090", (12, 0), 170, 32, 1792, 209, 419, 838, aliases=("5090",),
        match=r"RTX 5090"),
    GPU("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell", (12, 0), 188, 96, 1792, 500, 1000, 1000,
        aliases=("rtxpro6000", "pro6000"), match=r"RTX PRO 6000"),
)


def arch_features(arch: Arch) -> ArchFeatures:
    """Features of a compute capability; an unlisted minor version takes its major's listed arch
    (sm_87 -> sm_86, sm_103 -> sm_100, sm_121 -> sm_120)."""
    if arch in ARCHS:
        return ARCHS[arch]
    same_major = [a for a in ARCHS if a[0] == arch[0] and a <= arch]
    if same_major:
        base = ARCHS[max(same_major)]
        return dataclasses.replace(base, arch=arch)
    older = [a for a in ARCHS if a <= arch]
    if not older:
        raise ValueError(f"sm_{arch[0]}{arch[1]} is older than any architecture kernelset knows (sm_70+)")
    return dataclasses.replace(ARCHS[max(older)], arch=arch, name=f"sm_{arch[0]}{arch[1]}")


def has(arch: Arch | None, feature: str) -> bool:
    """Whether a compute capability has ``feature`` (an :class:`ArchFeatures` flag: "fp8", "tma",
    "wgmma" ...): the dispatcher's hardware checks read this table. False for None (not a CUDA
    device) and for archs older than any listed."""
    if arch is None:
        return False
    try:
        return bool(getattr(arch_features(arch), feature))
    except ValueError:
        return False


def first_arch(feature: str) -> str:
    """The oldest listed arch with ``feature``, as "sm_89" (for messages)."""
    a = min(a for a, f in ARCHS.items() if getattr(f, feature))
    return f"sm_{a[0]}{a[1]}"


def gpu(name: str) -> GPU:
    """A GPU by key or alias, case- and punctuation-insensitive ('H100', 'rtx 4090', 'RTX-PRO-6000')."""
    want = re.sub(r"[^a-z0-9]", "", name.lower())
    for g in GPUS:
        for k in (g.key, *g.aliases):
            if re.sub(r"[^a-z0-9]", "", k) == want:
                return g
    raise ValueError(f"unknown GPU {name!r}; known: {', '.join(g.key for g in GPUS)}")


def for_device(device: torch.device | int | None = None) -> GPU | None:
    """The table's entry for a CUDA device (by its name), None if it is not listed or not CUDA."""
    if not torch.cuda.is_available():
        return None
    if isinstance(device, torch.device):
        if device.type != "cuda":
            return None
        device = device.index
    name = torch.cuda.get_device_name(device)
    return next((g for g in GPUS if g.match and re.search(g.match, name)), None)
