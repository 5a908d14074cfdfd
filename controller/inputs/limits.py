"""Bounds on every input the program reads: files (topology, plan, trace) and command lines.

One table, so that every command and the controller give the same file the same answer, and
docs/topology.md can state them (a test checks that the numbers there are these). A bound is
checked before anything is allocated for the item it bounds (a file's size before it is
read, a list's length before its items are looked at, a server's GPU count before its GPUs
are made). Each bound says where its number comes from: most are "far above any real
deployment, low enough that the work stays small" and say so.
"""

from __future__ import annotations

# A bound the INA wire format sets is defined with it and only listed here.
from agents.ina.packet import MAX_AGGREGATOR_SLOTS as MAX_AGGREGATOR_SLOTS

MiB = 1 << 20

# -- documents (JSON/YAML) -------------------------------------------------------------------
# JSON parses at ~40 MB/s here, YAML (libyaml + Python objects) at ~0.5-1 MB/s: the YAML bound
# keeps a hand-written file's answer within a few seconds; machine-written files use JSON.
# The largest built-in topology exported (8tracks, 9,600 GPUs, 60,660 links) is 8.5 MB of JSON.
MAX_TOPOLOGY_JSON_BYTES = 16 * MiB
MAX_YAML_BYTES = 4 * MiB
MAX_PLAN_BYTES = 64 * MiB  # a 9,600-GPU plan lists paths and KV pairs per GPU
# Values in a plan, bounded by its commas before it is decoded: JSON decoding holds Python's
# interpreter lock, and 56 MB of small numbers stopped the controller's event loop for 7.8 s
# in a worker thread (benchmarks/bench_apply_stall.py --shape numbers). The 8tracks plan
# (9,600 GPUs, 4.9 MB) has 122,879 commas; the bound leaves 16x that.
MAX_PLAN_COMMAS = 2_000_000
# ShareGPT's public dump (ShareGPT_V3_unfiltered_cleaned_split.json) is about 0.67 GB.
MAX_TRACE_BYTES = 1024 * MiB
# Nesting: a plan is 9 levels deep (plan.decode.groups[i].rails[k].paths[gpu][j]); the bound
# also keeps the YAML composer (recursive C code that crashes on ~1e5 levels) safe.
MAX_DEPTH = 32
MAX_STRING = 4096  # characters of any free-text string (names, reasons, notes)

# -- topology --------------------------------------------------------------------------------
# 65,536 GPUs: 6.8x the paper's largest cluster (1,200 servers x 8 GPUs, §V).
MAX_GPUS = 65536
MAX_SERVERS = 16384
# One server is one NVLink domain: 8 GPUs on HGX boards, 72 in a GB200 NVL72 rack.
MAX_GPUS_PER_SERVER = 1024
MAX_NODES = 200_000  # every node: GPUs, NVLink fabrics, switches, hosts
MAX_LINKS = 1_000_000  # 8tracks has 60,660; a full mesh of 1,400 switches ~1e6
MAX_ID_CHARS = 64
ID_PATTERN = r"[A-Za-z0-9_.:-]+"  # '/' and '|' join ids into group and link names
# 1 Pb/s: about 70x NVLink 5's 1.8 TB/s per GPU (the fastest link a GPU has today).
MAX_LINK_GBPS = 1e6
MAX_LATENCY_US = 1e6  # one second per hop
MAX_MEMORY_GB = 1e4  # 10 TB per GPU; H200 has 141 GB
# MAX_AGGREGATOR_SLOTS (imported above): the INA header's aggregator index is 16 bits.
MAX_SLOT_BYTES = 9000  # a slot's payload travels in one packet: a jumbo frame's MTU

# -- plans -----------------------------------------------------------------------------------
MAX_PARALLEL = 1024  # TP or PP of one instance (no model here has more than 96 layers)
MAX_PATH_NODES = 64  # nodes on one route (a 3-tier route with NVLink relays has about 9)
MAX_LIST = 1_000_000  # items of any other list in a plan (KV pairs, groups, instances)
MAX_BATCH = 1_000_000
MAX_OPTION_ITEMS = 10_000  # values in a plan's free-form ``options``

# -- traces ----------------------------------------------------------------------------------
MAX_TRACE_REQUESTS = 2_000_000
# Tokens of one prompt or answer: 8x LLaMA-3.1's 131,072-token context (max_position_embeddings
# of its public config); every model shipped here has 2,048 (OPT) to 8,192 (LLaMA-3).
MAX_TOKENS = 1 << 20
MAX_ARRIVAL_S = 1e10  # Unix timestamps (1.7e9 today) fit

# -- command lines ---------------------------------------------------------------------------
MAX_SEED = 2**32 - 1  # numpy's and Python's generators take any non-negative int; 32 bits
MAX_SLA_S = 3600.0  # a TTFT or TPOT bound of an hour
MAX_RATE = 1e6  # requests/s offered to a simulated cluster (about 100 per GPU at 9,600 GPUs)
# Inter-arrival CV of the gamma process: its shape is 1/CV^2, and below 1e-4 numpy's gamma
# draws underflow to exactly 0 (all requests at once), which is no longer a CV.
MAX_CV = 100.0
# One simulation: requests, and tokens over them (input + output). The simulator runs about
# 1e5 events/s here and a request costs a few events per output token / batch.
MAX_SIM_REQUESTS = 1_000_000
MAX_SIM_TOKENS = 1_000_000_000
MAX_CANDIDATES = 1000  # --max-candi of Alg. 1 (the paper uses 20)
# --workers of evaluate: local simulation processes, each a Python interpreter holding the
# plan and its simulator (about 0.1-0.3 GB): 1,024 of them took a 2-core, 24 GiB machine down;
# 64 is past any single machine's useful parallelism here (a Ray cluster takes --ray instead)
MAX_SWEEP_WORKERS = 64
