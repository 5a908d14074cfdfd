"""GPU baseboards (docs/topology.md "Server fabrics"): how a server's GPUs are wired to each
other, which the topology builder turns into NVLink (or PCIe) edges.

Holds :class:`Board` (one baseboard: its fabric, how many GPUs it carries, its NVLink links
and their rate), :data:`BOARDS` (every board by name, each with its source) and
:func:`board_for` (the board a server of ``n`` GPUs of one type sits on: the first of the GPU's
``GpuSpec.boards`` that carries ``n``).

Three fabrics:

``nvswitch``  every GPU's links go to NVSwitch chips that join all GPUs of the board; any pair
    may use a GPU's whole NVLink bandwidth (HGX A100 8-GPU, HGX H100 8-GPU, HGX-2).
``mesh``      point to point: every pair of GPUs is joined by ``links_per_peer`` of each GPU's
    NVLink links and nothing else, so a pair gets ``links_per_peer * link_bw`` each way (HGX
    A100 4-GPU, 4-GPU V100 SXM2 boards).
``pcie``      parts without NVLink: each card's PCIe x16 link to the host's PCIe fabric at its
    generation's rate (``gpus.pcie_per_direction``).
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.errors import InputError
from controller.models.gpus import gpu_spec
from controller.units import GB

NVSWITCH, MESH, PCIE = "nvswitch", "mesh", "pcie"
FABRICS = (NVSWITCH, MESH, PCIE)

# NVLink2 (V100) and NVLink3 (A100): 25 GB/s per link in each direction (NVIDIA's DGX-1 V100
# whitepaper: "a peak bandwidth of 25 GB/s in each direction"; A100: 12 links, 600 GB/s over
# both directions, so 600 / 2 / 12 = 25).
NVLINK_LINK_BW = 25 * GB


@dataclass(frozen=True)
class Board:
    name: str
    fabric: str  # nvswitch | mesh | pcie
    max_gpus: int  # GPUs the board carries; 0: any number (an NVSwitch domain)
    links_per_peer: int = 0  # mesh: NVLink links joining each pair of GPUs
    link_bw: float = NVLINK_LINK_BW  # bytes/s per link per direction
    source: str = ""

    def carries(self, n_gpus: int) -> bool:
        return self.max_gpus == 0 or n_gpus <= self.max_gpus

    def pair_bw(self) -> float:
        """Bytes/s each way between two GPUs of a mesh board."""
        return self.links_per_peer * self.link_bw


BOARDS: dict[str, Board] = {
    b.name: b
    for b in [
        Board(
            "HGX A100 4-GPU",
            MESH,
            4,
            links_per_peer=4,
            source="NVIDIA, 'Introducing NVIDIA HGX A100' (developer blog, 2020): the 4-GPU "
            "board is 'connected with NVLink', the 8-GPU one with NVSwitch; 4 links a pair is "
            "each A100's 12 NVLink3 ports over its 3 peers (12 = 3 x 4)",
        ),
        Board(
            "HGX A100 8-GPU",
            NVSWITCH,
            0,
            source="NVIDIA, 'Introducing NVIDIA HGX A100': 8 A100 and 6 NVSwitch chips, any "
            "GPU talks to any other at the full 600 GB/s (two boards back to back: 16 GPUs)",
        ),
        Board(
            "V100 SXM2 4-GPU",
            MESH,
            4,
            links_per_peer=2,
            source="NVIDIA DGX Station whitepaper (WP-V01, section 3.1): 4 V100 SXM2 joined "
            "GPU to GPU by NVLink2; 2 links a pair is each V100's 6 links over its 3 peers "
            "(6 = 3 x 2)",
        ),
        Board(
            "HGX-2 V100",
            NVSWITCH,
            0,
            source="NVIDIA HGX-2 / DGX-2: 16 V100 joined by NVSwitch, every GPU's 6 NVLink2 "
            "links to the switches (the 8-GPU DGX-1 hybrid cube-mesh is not modelled: "
            "docs/topology.md)",
        ),
        Board(
            "HGX H100/H200 8-GPU",
            NVSWITCH,
            0,
            source="NVIDIA, 'Introducing NVIDIA HGX H100' (developer blog, 2022): 8 H100 (H200 "
            "on the same board) and 4 NVSwitch chips, any pair at the full 900 GB/s",
        ),
        Board(
            "PCIe",
            PCIE,
            0,
            source="NVLink-less cards: the x16 PCIe link of the card's generation "
            "(models.gpus.PCIE_X16_BYTES_PER_S)",
        ),
    ]
}


def board_for(gpu_type: str, n_gpus: int) -> Board:
    """The board a server of ``n_gpus`` GPUs of ``gpu_type`` sits on: the first of the GPU's
    boards (``GpuSpec.boards``, smallest first) that carries that many."""
    spec = gpu_spec(gpu_type)
    for name in spec.boards:
        b = BOARDS[name]
        if b.carries(n_gpus):
            return b
    raise InputError(f"no {gpu_type} board carries {n_gpus} GPUs")
