"""The rank runtime: launch ranks, the rank mesh, traced collectives.

launch(fn, world_size, *args, backend="auto", timeout=60.0, **kwargs) -> list     # one result per rank
ParallelConfig(tp, cp, ep, dp, pp, etp, order="tp-cp-ep-dp-pp"); rank_groups(config, world_size)   # pylib.plan
Mesh(config)                      # inside a rank: mesh.tp.size, mesh.tp.rank, mesh["dp-cp"], ...
trace(), tag(name), phase(name)   # record every op issued through pylib.runtime.collectives
agreement_check(False)            # inside a rank: stop checking that the ranks agree before each collective
"""

from . import collectives
from .agreement import agreement_check
from .launch import LaunchTimeout, RankFailedError, current_device, launch, profile_launches
from .mesh import AXES, DENSE_GROUPS, EXPERT_GROUPS, AxisGroup, Mesh, ParallelConfig, coordinates, rank_groups
from .sharding import ShardSpec, require_divisible, shard
from .tracer import CommEvent, Tracer, phase, tag, trace

__all__ = [
    "AXES",
    "DENSE_GROUPS",
    "EXPERT_GROUPS",
    "AxisGroup",
    "agreement_check",
    "CommEvent",
    "LaunchTimeout",
    "Mesh",
    "ParallelConfig",
    "RankFailedError",
    "ShardSpec",
    "Tracer",
    "collectives",
    "coordinates",
    "current_device",
    "launch",
    "phase",
    "profile_launches",
    "rank_groups",
    "require_divisible",
    "shard",
    "tag",
    "trace",
]
