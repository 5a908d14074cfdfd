"""The fidelity report's "Why the figures differ from the paper's" section, as a template.

Holds ``WHY``, whose placeholders ``fidelity._why`` fills with figures it plans on the testbed
(so the text never quotes a number the code does not compute). Kept apart from
controller/evaluation/fidelity.py, which is the report's logic.
"""

WHY = """## Why the figures differ from the paper's

- **The same search for every planner.** The paper's baselines are DistServe-style placements
  (instances kept inside a server) to which ATP or SwitchML add INA. Here all planners share
  HeroServe's role-split search, candidates and H objective (docs/design.md §6: "never handicap a
  baseline"), and DistServe's own low-affinity placement is reported beside them
  (`distserve-paper`). What remains of the ratio is not all network use: the ablation above
  splits it into the search space, each INA scheme, the placement, the lanes and the role
  split. On the testbed (chatbot, predicted H, pipelined mode: `heroserve plan --topology
  testbed` with and without `--fixed-roles`, as `_why` in controller/evaluation/fidelity.py
  plans them) the role split moves H more than any scheme, and not alike: with the paper's
  fixed split (decode on the A100 servers) DistServe plans {ds_fixed:.3f} req/s and HeroServe
  {fixed_h:.3f} ({fixed_ratio} of DistServe's); the planner's free split lifts DistServe
  {ds_lift:.2f}x (to {ds_free:.3f}) and HeroServe {hero_lift:.2f}x (to {free_h:.3f}), which
  leaves HeroServe {free_ratio} of DistServe's. HeroServe's lead under the paper's split is
  the planner's search space (cross-server TP among unequal pools), and the free split gives
  DistServe's search what that space gave HeroServe.
- **NVLink inside a server beats any NIC.** A tensor group that fits in a server all-reduces
  over NVLink (V100: 150 GB/s per direction, A100: 300) in tens of microseconds; no route
  through a 100 Gb/s NIC comes close, so INA can only pay for groups that must span servers
  (TP above the server's GPU count), and there only for messages small enough for latency to
  dominate: the ring moves 2 (P - 1) / P of the message over the NICs, INA the whole message
  per member, and hierarchical INA 1/m of it per rail.
- **INA lanes.** The project's P4 program aggregates 32-bit fixed point (SwitchML), twice the
  bytes of FP16, and each {payload}-byte vector travels with {overhead} bytes of headers and
  framing: {wire:.2f} bytes on the wire per byte of message. 16-bit lanes make INA win on more
  groups. On the testbed (chatbot, `heroserve plan --ina-lanes ...`) HeroServe's H is
  {fp16_ratio} of the baselines' with fp16 lanes (FPISA, not run here: {fp16_group}) and
  {bfp16_ratio} with bfp16, the 16-bit format the switch runs ({bfp16_group}; each of its
  all-reduces opens with a round of exponent proposals, docs/costmodel.md).
- **NVLink per direction.** The datasheets' 300 and 600 GB/s are both directions together; a
  link's capacity here is per direction, half of that.
- **TPOT charges the KV transfer once per request**, spread over its output tokens (as
  DistServe and the simulator measure it), not per token as Eq. 4 reads (`--tpot-mode eq4`).
"""
