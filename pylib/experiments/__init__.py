"""Runs that produce the book's evidence: training loops checked against one device, pitfalls measured, the
multi-rank runs behind figures and tables. Each stands on the modes, `compose` and the runtime; no mode imports
this package, and `pylib.viz` only draws what these return.

    dp_training        train_data_parallel (inside a rank, any ZeRO stage), train_reference (one device)
    compose_training   train (the composed model inside a rank), train_reference, compare_with_reference
    ring_merge_drift   merge_precision_drift: bf16 vs float32 merge accumulators on real rings
    seed_a_routing     article A's 8 tokens routed by the real router and dispatched over EP = 4
    split_check        is a module token-local? the whole sequence here vs pieces on real ranks
    tp_runs            column_row_example, layer_traces: TP and SP on real ranks, for `pylib.viz.tp`
    mode_probes        probe_modes, probe_compose, sp_without_tp: every mode's local shapes for article B's tables
    plan_runs          measure_plans: the planner's plans, one real step each
    moe_balance_training  balance_during_training: expert load per step of the composed model, four routers

Import from the module: `from pylib.experiments.compose_training import train`.
"""
