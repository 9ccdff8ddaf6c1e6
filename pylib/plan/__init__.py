"""The planning layer: pure arithmetic of sizes that every other part of pylib asks, and no torch.

    ModelConfig(...), MoEConfig(...), expert_capacity(T, moe)  (config); llama2_70b(), tiny(), ...      (presets)
    ParallelConfig(tp, cp, ep, dp, pp, etp, order)   rank_groups(config, world_size)   coordinates(...)   (mesh)
    RunOptions(sequence_parallel, cp_kind, ...)      ZeroStage, zero_stage(x)                            (options)
    Recompute(granularity, method, num_layers): the recomputation choice RunOptions holds              (recompute)
    FlatEntry, FlatLayout, padded_numel, plan_buckets, single_flat                                       (layout)
    check_split, virtual_stage, layers_of_stage, chunk_layers, stage_layers                              (split)
    HeadLayout, head_layout, kv_heads_per_rank                                                           (heads)
    layout_chunks, token_positions: which tokens a cp rank holds                                         (sequence)
    the pipeline schedules as data: build, compute_order, check_schedule, ...                            (schedules)
    problems(cfg, par, world_size, batch=, seq=, options=)  -- the one validity model                    (problems)
    megatron_args(par, options, global_batch=), from_megatron_args(argv, world_size): Megatron-LM's flags (megatron)

Layering: `plan` imports nothing of the project outside itself, and neither torch nor numpy; `pylib.analysis`
imports only `plan`; the modes, `compose`, `runtime` and `viz` take their arithmetic from here.
"""

from . import schedules
from .heads import HeadLayout, head_layout, kv_heads_per_rank
from .layout import FlatEntry, FlatLayout, layout_table, padded_numel, plan_buckets, single_flat
from .mesh import AXES, DENSE_GROUPS, EXPERT_GROUPS, ParallelConfig, coordinates, rank_groups
from .options import (
    ALL_CP_KINDS,
    CP_KINDS,
    CP_LAYOUTS,
    SEQUENCE_PARALLEL,
    ZERO_STAGE_NAMES,
    ZERO_STAGES,
    RunOptions,
    ZeroStage,
    zero_stage,
)
from .problems import ComposeConfigError, check, problems, size_problems
from .recompute import Recompute
from .sequence import layout_chunks, token_positions
from .split import check_split, chunk_layers, layers_of_stage, stage_layers, virtual_stage

__all__ = [
    "ALL_CP_KINDS",
    "AXES",
    "CP_KINDS",
    "CP_LAYOUTS",
    "DENSE_GROUPS",
    "EXPERT_GROUPS",
    "SEQUENCE_PARALLEL",
    "ZERO_STAGES",
    "ZERO_STAGE_NAMES",
    "ComposeConfigError",
    "FlatEntry",
    "FlatLayout",
    "HeadLayout",
    "ParallelConfig",
    "Recompute",
    "RunOptions",
    "ZeroStage",
    "check",
    "check_split",
    "chunk_layers",
    "coordinates",
    "head_layout",
    "kv_heads_per_rank",
    "layers_of_stage",
    "layout_chunks",
    "layout_table",
    "padded_numel",
    "plan_buckets",
    "problems",
    "rank_groups",
    "schedules",
    "single_flat",
    "size_problems",
    "stage_layers",
    "token_positions",
    "virtual_stage",
    "zero_stage",
]
