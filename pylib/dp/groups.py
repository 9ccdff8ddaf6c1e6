"""Which gradient-reduction group each parameter belongs to.

Plain data parallelism averages every gradient over one group. Composed with other modes it does not: in
Megatron-Core dense parameters are averaged over the data-parallel group with CP folded in ("dp-cp"), expert
parameters over the expert-data-parallel group ("edp"), and a parameter that TP replicates under SP needs an extra
TP reduction (done by TP, not here). So every wrapper in `pylib.dp` takes a default `group` and an optional
`group_for(name, param) -> group` that overrides it per parameter; parameters are then handled one reduction group
(and one dtype) at a time.

An extra reduction that another mode owns (SP's TP all-reduce of LayerNorm gradients) composes if it is a tensor
hook on the parameter (`p.register_hook`): autograd runs those before accumulating the gradient, and the bucket
hooks here (`register_post_accumulate_grad_hook`) after, so the buckets receive the already TP-reduced gradient.

What the reduction divides by. By default every gradient is *averaged* over its group: summed, then divided by the
group's size. That is right when each member of the group computed the gradient of its own equal share of the
batch. It is wrong for expert parameters under EP: an expert's gradient on a rank already sums the contributions
of the tokens of every rank in its EP group (the all-to-all brought them there), so over "edp" it must be summed
and divided by the *dense* data-parallel size dp x cp, not by edp. Megatron-Core divides every gradient by the
dp x cp size (`gradient_scaling_factor = 1 / dp_cp_size`, for dense and expert buffers alike); the wrappers here
take `gradient_divide_factor` (PyTorch FSDP2's name for the same knob) for that.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

from pylib.plan.fields import number
from pylib.plan.mesh import HSDP_REPLICATE as REPLICATE
from pylib.plan.mesh import HSDP_SHARD as SHARD
from pylib.plan.mesh import hsdp_groups

from ..runtime.collectives import resolve_group
from ..runtime.mesh import AxisGroup

GroupFor = Callable[[str, nn.Parameter], object]


def group_key(g: AxisGroup) -> tuple[str, tuple[int, ...]]:
    return g.name, g.ranks


def split_by_group(
    named_params: list[tuple[str, nn.Parameter]], group=None, group_for: GroupFor | None = None
) -> list[tuple[AxisGroup, torch.dtype, list[tuple[str, nn.Parameter]]]]:
    """Partition parameters into (reduction group, dtype) sets, keeping the given order inside each set and
    ordering the sets by first appearance. Parameters that do not require grad are left out (nothing to reduce)."""
    default = resolve_group(group)
    sets: dict[tuple, tuple[AxisGroup, torch.dtype, list]] = {}
    for name, p in named_params:
        if not p.requires_grad:
            continue
        g = default if group_for is None else group_for(name, p)
        g = default if g is None else resolve_group(g)
        key = (*group_key(g), p.dtype)
        if key not in sets:
            sets[key] = (g, p.dtype, [])
        sets[key][2].append((name, p))
    return list(sets.values())


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_divide_factor(factor) -> int | float | None:
    """None (average over each group) or a positive, finite number to divide every summed gradient by."""
    return number(None, "gradient_divide_factor", factor, above=0, none=True)


def hybrid_groups(shard_size: int, dp_groups=None) -> tuple[AxisGroup, AxisGroup]:
    """HSDP's two groups of this rank: (shard group of s consecutive members of its data-parallel group, named
    "dp-shard"; replica group of the r = d/s members at its index in every shard group, "dp-replicate"), cut by
    `pylib.analysis.dp.hsdp_groups`. dp_groups: every data-parallel group of the world as rank lists (e.g.
    `mesh.groups["dp-cp"]`), or None for one group of every rank. Collective: every rank calls it, and creates every
    group in the same order (torch's `new_group` requires it), whether or not it belongs to it."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("hybrid_groups(...) must be called inside a launched rank")
    world, me = dist.get_world_size(), dist.get_rank()
    groups = [tuple(range(world))] if dp_groups is None else [tuple(g) for g in dp_groups]
    mine: dict[str, AxisGroup] = {}
    for ranks in groups:
        shards, replicas = hsdp_groups(ranks, shard_size)
        for name, cut in ((SHARD, shards), (REPLICATE, replicas)):
            for members in cut:
                pg = None
                if len(members) == world:
                    pg = dist.group.WORLD
                elif len(members) > 1:
                    pg = dist.new_group(list(members))
                if me in members:
                    mine[name] = AxisGroup(name, members, members.index(me), pg)
    if set(mine) != {SHARD, REPLICATE}:
        raise ValueError(f"rank {me} is in none of the data-parallel groups {groups}")
    return mine[SHARD], mine[REPLICATE]
