"""GPU datasheet figures (docs/design.md §4), checked against the vendors' datasheets:
dense FP16/BF16 tensor throughput (not the 2:4 sparsity figure), memory, memory bandwidth,
total NVLink bandwidth, PCIe generation and the baseboards the part ships on (their wiring is
in ``boards.py``). Units: FLOP/s, bytes, bytes/s."""

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
    # the boards (``boards.BOARDS``) a server of this part sits on, smallest first: a server
    # of n GPUs gets the first that carries n (``boards.board_for``)
    boards: tuple[str, ...] = ("PCIe",)


A100_BOARDS = ("HGX A100 4-GPU", "HGX A100 8-GPU")
V100_BOARDS = ("V100 SXM2 4-GPU", "HGX-2 V100")

GPU_SPECS: dict[str, GpuSpec] = {
    s.name: s
    for s in [
        # V100 SXM2: 125 TFLOP/s tensor, 900 GB/s HBM2, NVLink2 6 links x 50 GB/s = 300 GB/s,
        # PCIe 3.0 x16 (NVIDIA's DGX-1 V100 whitepaper). 4-GPU boards are a mesh, larger ones
        # NVSwitch (boards.py).
        GpuSpec("V100-32GB", 125e12, 32 * GB, 900 * GB, 300 * GB, 3, V100_BOARDS),
        # A100 SXM4: 312 TFLOP/s dense FP16, 12 NVLink3 links = 600 GB/s, PCIe 4.0. HGX A100
        # 4-GPU is a mesh, 8-GPU NVSwitch.
        GpuSpec("A100-40GB", 312e12, 40 * GB, 1555 * GB, 600 * GB, 4, A100_BOARDS),
        GpuSpec("A100-80GB", 312e12, 80 * GB, 2039 * GB, 600 * GB, 4, A100_BOARDS),
        # H100 SXM5: 989 TFLOP/s dense FP16 (1979 is with sparsity), NVLink4 900 GB/s, PCIe
        # 5.0. Only the NVSwitch board is modelled (docs/topology.md).
        GpuSpec("H100", 989e12, 80 * GB, 3350 * GB, 900 * GB, 5, ("HGX H100/H200 8-GPU",)),
        GpuSpec("H200", 989e12, 141 * GB, 4800 * GB, 900 * GB, 5, ("HGX H100/H200 8-GPU",)),
        # Ada and Turing PCIe cards: no NVLink. L40 and L4 are PCIe 4.0 x16 cards, T4 is
        # PCIe 3.0 x16 (NVIDIA's datasheets).
        GpuSpec("L40", 181e12, 48 * GB, 864 * GB, 0.0),
        # L40S (NVIDIA L40S datasheet): 362.05 TFLOP/s dense FP16 tensor (733 with
        # sparsity), 48 GB GDDR6 at 864 GB/s, PCIe 4.0 x16, no NVLink
        GpuSpec("L40S", 362.05e12, 48 * GB, 864 * GB, 0.0),
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
