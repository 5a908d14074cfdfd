"""GPU datasheet figures (docs/design.md §4), checked against the vendors' datasheets:
dense FP16/BF16 tensor throughput (not the 2:4 sparsity figure), memory, memory bandwidth and
total NVLink bandwidth. Units: FLOP/s, bytes, bytes/s."""

from __future__ import annotations

from dataclasses import dataclass

from controller.errors import InputError
from controller.units import GB


@dataclass(frozen=True)
class GpuSpec:
    name: str
    fp16_flops: float  # dense tensor-core FP16, FLOP/s
    memory_bytes: float
    mem_bw: float  # HBM/GDDR bytes/s
    nvlink_bw: float  # total NVLink bytes/s; 0 for PCIe-only parts
    pcie_gen: int = 4  # the card's PCIe generation (x16): what joins NVLink-less parts


GPU_SPECS: dict[str, GpuSpec] = {
    s.name: s
    for s in [
        # V100 SXM2: 125 TFLOP/s tensor, 900 GB/s HBM2, NVLink2 6 links x 50 GB/s = 300 GB/s.
        GpuSpec("V100-32GB", 125e12, 32 * GB, 900 * GB, 300 * GB),
        # A100 SXM4: 312 TFLOP/s dense FP16, 12 NVLink3 links = 600 GB/s.
        GpuSpec("A100-40GB", 312e12, 40 * GB, 1555 * GB, 600 * GB),
        GpuSpec("A100-80GB", 312e12, 80 * GB, 2039 * GB, 600 * GB),
        # H100 SXM5: 989 TFLOP/s dense FP16 (1979 is with sparsity), NVLink4 900 GB/s.
        GpuSpec("H100", 989e12, 80 * GB, 3350 * GB, 900 * GB),
        GpuSpec("H200", 989e12, 141 * GB, 4800 * GB, 900 * GB),
        # Ada and Turing PCIe cards: no NVLink. L40 and L4 are PCIe 4.0 x16 cards, T4 is
        # PCIe 3.0 x16 (NVIDIA's datasheets).
        GpuSpec("L40", 181e12, 48 * GB, 864 * GB, 0.0),
        GpuSpec("L4", 121e12, 24 * GB, 300 * GB, 0.0),
        GpuSpec("T4", 65e12, 16 * GB, 320 * GB, 0.0, pcie_gen=3),
    ]
}


# Per direction, x16 (8 GT/s a lane for 3.0, doubling each generation, 128b/130b coding:
# 15.75, 31.5 and 63 GB/s, quoted as 16, 32 and 64)
PCIE_X16_BYTES_PER_S = {3: 16 * GB, 4: 32 * GB, 5: 64 * GB}


def pcie_per_direction(gpu_type: str) -> float:
    """Bytes/s each way over the card's PCIe x16 link (its generation's)."""
    return PCIE_X16_BYTES_PER_S[gpu_spec(gpu_type).pcie_gen]


def gpu_spec(name: str) -> GpuSpec:
    try:
        return GPU_SPECS[name]
    except KeyError:
        raise InputError(f"unknown GPU type {name!r}; known: {', '.join(GPU_SPECS)}") from None
