"""The planner's inputs checked when they are built: `Cluster`, `Workload` and `SearchSpace` (`pylib.analysis.planner`)
call these from their `__post_init__`, and `enumerate_plans` checks its sizes with `check_sizes`.

Every field is checked for its type, finiteness and range with `pylib.plan.fields` (the message names the field, the
value and the rule), and a choice list of the search (CP kinds, ZeRO stages, recomputation choices, schedules' group
sizes) refuses an unknown name rather than dropping it. Sizes are held to `MAX_WORLD_SIZE` ranks and `MAX_SIZE`
sequences or tokens: beyond them a search would enumerate for minutes, so the planner refuses at once, naming the
limit.
"""

from __future__ import annotations

from pylib.plan.fields import MAX_SIZE, choice, flag, instance, integer, names, number, sequence
from pylib.plan.mesh import ParallelConfig
from pylib.plan.options import ALL_CP_KINDS, ZERO_STAGES, zero_stage
from pylib.plan.recompute import RECOMPUTE, RECOMPUTE_MODULES, as_recompute

from .activations import ATTENTION_KERNELS
from .efficiency import CostModel

PRECISIONS = ("uniform", "mixed")
GRAD_REDUCE = ("bfloat16", "float32")  # with bf16 compute: 2-byte or 4-byte gradients (`Workload.grad_reduce`)
GROUP_SIZE_CHOICES = ("default", "megatron")
MAX_WORLD_SIZE = 2**20  # ranks: 1,048,576, some sixty times the largest published run the book models (16,384)


def check_sizes(**sizes) -> None:
    """world_size (1..MAX_WORLD_SIZE), batch and seq (1..MAX_SIZE): integers, named when refused."""
    for name, n in sizes.items():
        integer(None, name, n, high=MAX_WORLD_SIZE if name == "world_size" else MAX_SIZE)


def check_cluster(c) -> None:
    owner = "Cluster"
    integer(owner, "world_size", c.world_size, high=MAX_WORLD_SIZE)
    integer(owner, "gpus_per_node", c.gpus_per_node)
    for name in ("gpu_memory", "intra_node_bandwidth", "inter_node_bandwidth", "peak_flops", "hbm_bandwidth"):
        number(owner, name, getattr(c, name), above=0)
    number(owner, "usable_fraction", c.usable_fraction, above=0, high=1)
    flag(owner, "overlap_dp", c.overlap_dp)
    flag(owner, "tp_comm_overlap", c.tp_comm_overlap)
    instance(owner, "model", c.model, CostModel)


def check_workload(w) -> None:
    owner = "Workload"
    integer(owner, "batch", w.batch, high=MAX_SIZE)
    integer(owner, "seq", w.seq, high=MAX_SIZE)
    choice(owner, "precision", w.precision, PRECISIONS)
    choice(owner, "attention", w.attention, ATTENTION_KERNELS)
    integer(owner, "optimizer_states", w.optimizer_states, low=0)
    choice(owner, "grad_reduce", w.grad_reduce, GRAD_REDUCE)


def _sizes(owner, name, values) -> None:
    if values is not None:
        for v in sequence(owner, name, values, "positive integers"):
            integer(owner, name, v)


def _recompute_choice(owner, rc) -> None:
    """A name, a `Recompute`, its (granularity, method, num_layers) triple, or ("selective", modules)."""
    if isinstance(rc, tuple) and len(rc) == 2 and rc[0] == "selective":
        names(owner, "recompute_modules", rc[1], RECOMPUTE_MODULES)  # gdn_*, mhc: not modelled
    else:
        as_recompute(rc)  # raises naming the granularity, method or num_layers


def check_search_space(s) -> None:
    """Every field of a `SearchSpace`; the choice lists refuse an unknown name instead of dropping it."""
    owner = "SearchSpace"
    instance(owner, "order", s.order, str)
    ParallelConfig(order=s.order)  # raises naming an unknown or repeated axis
    for name in ("micro_batch_sizes", "virtual_stages", "expert_tp", "tp_sizes", "cp_sizes", "hsdp_shards"):
        _sizes(owner, name, getattr(s, name))
    for z in sequence(owner, "zero_stages", s.zero_stages, ZERO_STAGES):
        zero_stage(z)  # raises naming both spellings
    names(owner, "cp_kinds", s.cp_kinds, ALL_CP_KINDS)
    names(owner, "sequence_parallel", s.sequence_parallel, (True, False))
    for rc in sequence(owner, "recompute", s.recompute, RECOMPUTE):
        _recompute_choice(owner, rc)
    if s.meshes is not None:
        for m in sequence(owner, "meshes", s.meshes, "ParallelConfig"):
            instance(owner, "meshes", m, ParallelConfig)
    flag(owner, "sp_regather", s.sp_regather)
    flag(owner, "balance_ends", s.balance_ends)
    if isinstance(s.group_sizes, str) or s.group_sizes is None:
        choice(owner, "group_sizes", s.group_sizes, GROUP_SIZE_CHOICES)
    else:
        _sizes(owner, "group_sizes", s.group_sizes)


__all__ = ["MAX_WORLD_SIZE", "PRECISIONS", "check_cluster", "check_search_space", "check_sizes", "check_workload"]
