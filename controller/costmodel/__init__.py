"""The cost model of docs/design.md §5: pure functions, one module per concern.

| paper | function |
|---|---|
| Eq. 1 (objective), Eq. 2-5 | ``controller.planner.combine``, ``controller.planner.instances`` |
| Eq. 6 (pipeline hop) | ``controller.planner.pipeline`` (``PipelinePricer.pipeline_hop_time``) |
| Eq. 10 over shared links (flows, phases) | ``network.flow_times``, ``network.compile_phase`` |
| cost mode, INA lanes, per-step latencies | ``netparams.NetParams`` |
| Eqs. 7-10 (INA) | ``ina.ina_pattern``, ``ina.ina_on_routes`` |
| Eq. 11 (ring) | ``ring.ring_pattern`` (order: ``ring.ring_order``) |
| hierarchical INA (docs/design.md §5) | ``hier.hier_pattern``, ``hier.hier_on_rails`` |
| latency matrix (Alg. 2 lines 1-3) | ``pairs.pair_times`` |
| Eqs. 12-13 (compute) | ``compute.prefill_layer_time``, ``compute.decode_layer_time`` |
| Eqs. 14-15 (KV transfer) | ``kvcache.kv_shares``, ``kvcache.kv_route``, ``kvcache.kv_time`` |
| P-K queueing | ``queueing.pk_queue_delay`` |
| prefill TTFT (FIFO pipeline) | ``queueing.pipeline_ttft_cdf``, ``queueing.pipeline_max_rate`` |
"""
