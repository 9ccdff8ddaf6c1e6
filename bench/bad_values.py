"""The bad field values every public value must refuse by name, as plain data (no pylib import, so the reliability
bench can measure any checkout's pylib with them): {owner class name: {field: values}}. Read by
bench/reliability.py (which counts the outcomes) and tests/test_validation.py (which requires each refusal)."""

NAN, INF = float("nan"), float("inf")

BAD_FIELDS = {
    "ModelConfig": {
        "vocab_size": (0, -1, 64.0, True, "64"),
        "d_model": (0, 16.5),
        "n_layers": (0, True, None),
        "n_heads": (0, 2.0),
        "n_kv_heads": (0, 1.5),
        "d_ff": (-1, NAN),
        "mlp": ("relu", None),
        "position": ("alibi",),
        "causal": ("yes", 1),
        "norm_eps": (0, NAN, -1e-5, INF),
        "rope_base": (0, NAN),
        "dtype": ("int8", "fp32"),
        "seed": (-1, 1.5),
        "moe": ("yes",),
        "tie_embeddings": ("no",),
    },
    "MoEConfig": {
        "n_experts": (0, 4.5, True),
        "top_k": (0, 9, 1.0),
        "d_ff": (0, 2.5),
        "score": ("relu",),
        "topk_then_softmax": ("yes",),
        "capacity_factor": (0, -1, NAN, INF),
        "drop_policy": ("random",),
        "aux_loss_coef": (-1, NAN),
        "z_loss_coef": (INF,),
        "bias_update_rate": (-0.1, NAN),
        "every": (0, True),
    },
    "RunOptions": {
        "sequence_parallel": ("yes", 1, None),
        "cp_kind": ("hybrid", None),
        "cp_layout": ("striped",),
        "schedule": ("zb",),
        "n_microbatches": (0, -1, 2.0, True, "4"),
        "v": (0, 1.5),
        "zero_stage": (4, "zero4", True, -1),
        "recompute": ("partial", ("full", "uniform", 0)),
    },
    "Recompute": {"granularity": ("partial",), "method": ("every",), "num_layers": (0, 1.5, True)},
    "MixedPrecision": {
        "compute": ("float32", "fp16"),
        "master": ("bfloat16",),
        "grad_reduce": ("float16",),
        "loss_scaling": ("auto",),
        "loss_scale": (0, -1, NAN, INF),
        "growth_interval": (0, 1.5, True),
    },
    "ParallelConfig": {"tp": (True, 2.0, -1), "order": ("tp-xx",), "etp": (0,)},
    "CostModel": {
        "eta": (0, 1.5, NAN),
        "c_elem": (-1, INF),
        "tp_overlap": (2, -0.1),
        "latency": (-1, NAN),
        "contention": (-0.5, INF),
        "eta_fp8": (0, 1.5, NAN),
    },
    "Cluster": {  # built with world_size=8 and the field
        "world_size": (0, -1, 2.0, True, "8", None, 2**40),
        "gpus_per_node": (0, 1.5),
        "gpu_memory": (NAN, INF, -1, "80e9"),
        "usable_fraction": (0, 1.5, NAN),
        "intra_node_bandwidth": (0, INF),
        "inter_node_bandwidth": (-1,),
        "peak_flops": (NAN,),
        "hbm_bandwidth": (0,),
        "overlap_dp": ("yes",),
        "tp_comm_overlap": (1,),
        "model": ("fit",),
        "fp8_peak_flops": (0, NAN),
    },
    "Workload": {  # built with batch=8, seq=16 and the field
        "batch": (0, -8, 8.0, True, 10**12, "8"),
        "seq": (0, 2.5, 2**40),
        "precision": ("fp8",),
        "attention": ("sdpa",),
        "optimizer_states": (-1, 2.0),
        "grad_reduce": ("float16", "fp32"),
        "fp8": ("delayed",),
    },
    "SearchSpace": {
        "cp_kinds": (("ring", "striped"), ()),
        "zero_stages": ((0, 4), ("zero5",)),
        "recompute": (("partial",), (("selective", ("mhc",)),), (("selective", ("attention",)),)),
        "micro_batch_sizes": ((0,),),
        "virtual_stages": ((1.5,),),
        "sequence_parallel": (("yes",),),
        "group_sizes": ("all", None),
        "order": ("tp-xx", 3),
        "meshes": (("tp2",),),
        "expert_tp": ((-1,),),
        "tp_sizes": ((0,),),
        "zero_bubble": (("zb-x",), ("zb-v", "zb-v")),
    },
}

# The name a refusal uses where it is not the field's own (a SearchSpace list names its element: cp_kinds -> cp_kind).
NAMED_AS = {
    ("Recompute", "granularity"): "recompute",
    ("Recompute", "method"): "recompute_method",
    ("Recompute", "num_layers"): "recompute_num_layers",
}


def named_as(owner: str, field: str) -> str:
    """The word a refusal of `owner(field=...)` must hold."""
    if owner == "SearchSpace":
        return field.rstrip("s")
    return NAMED_AS.get((owner, field), field)
