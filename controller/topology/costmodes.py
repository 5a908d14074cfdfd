"""How a path is priced, by name (docs/costmodel.md): the cost modes and the packet a pipelined
hop serialises for RDMA flows. A module of its own, importing nothing, so that the command
line's flags (``--cost-mode``) and the network options (``controller.costmodel.netparams``)
name them without importing the routes (``fabric``: networkx, numpy, scipy)."""

from __future__ import annotations

from typing import Literal

# pipelined: NICs and switches forward packet by packet (the default); paper: the HeroServe
# paper's store and forward (Eq. 10, Fig. 2)
CostMode = Literal["pipelined", "paper"]
PIPELINED, PAPER = "pipelined", "paper"
COST_MODES: tuple[str, ...] = (PIPELINED, PAPER)
# RoCE's largest path MTU: NCCL sets each queue pair's path MTU to the smaller active MTU of
# the two ports (src/transport/net_ib/connect.cc), 4096 B on a jumbo-frame RoCE fabric.
ROCE_MTU_BYTES = 4096
