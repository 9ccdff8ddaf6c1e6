"""The rank mesh inside a launched rank: `Mesh(config)` creates the torch process groups of a `ParallelConfig`
and gives each axis's group, rank and size.

Which global ranks form each group is pure arithmetic of sizes and lives in `pylib.plan.mesh` (`ParallelConfig`,
`rank_groups`, `coordinates`; no torch), re-exported here so `from pylib.runtime.mesh import ParallelConfig` works.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pylib.plan.mesh import AXES, DENSE_GROUPS, EXPERT_GROUPS, ParallelConfig, coordinates, rank_groups

__all__ = [
    "AXES",
    "DENSE_GROUPS",
    "EXPERT_GROUPS",
    "AxisGroup",
    "Mesh",
    "ParallelConfig",
    "coordinates",
    "rank_groups",
]


@dataclass
class AxisGroup:
    """One process group as seen from one rank: its name, members, this rank's index and the torch group.

    `pg` is None when the group has a single member (nothing to communicate). `pg` is torch's WORLD group when
    the axis spans every rank.
    """

    name: str
    ranks: tuple[int, ...]
    rank: int  # index of this rank inside `ranks`
    pg: object = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def global_rank(self) -> int:
        return self.ranks[self.rank]

    def global_of(self, index: int) -> int:
        """Global rank of the group member at `index`."""
        return self.ranks[index]


class Mesh:
    """Inside a launched rank: every group of `config` that contains this rank.

    `mesh.tp` (or `mesh["tp"]`) is an `AxisGroup` with `.size`, `.rank`, `.ranks` and `.pg`; pass it as the `group=`
    of any collective in `pylib.runtime.collectives`. Every rank must construct the mesh (group creation is
    collective). Groups of one rank create no process group; identical groups share one process group.
    """

    def __init__(self, config: ParallelConfig):
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("Mesh(...) must be built inside a launched rank (torch.distributed is not initialised)")
        world, me = dist.get_world_size(), dist.get_rank()
        self.config = config
        self.world_size = world
        self.global_rank = me
        self.groups = rank_groups(config, world)
        made: dict[tuple[int, ...], object] = {}
        self._axes: dict[str, AxisGroup] = {}
        # Creation is collective: every rank walks the same groups in the same order.
        for key, groups in self.groups.items():
            for ranks in groups:
                ranks_t = tuple(ranks)
                if len(ranks_t) > 1 and len(ranks_t) < world and ranks_t not in made:
                    made[ranks_t] = dist.new_group(list(ranks_t))
                if me in ranks_t:
                    if len(ranks_t) == 1:
                        pg = None
                    elif len(ranks_t) == world:
                        pg = dist.group.WORLD
                    else:
                        pg = made[ranks_t]
                    self._axes[key] = AxisGroup(key, ranks_t, ranks_t.index(me), pg)
        self._axes["world"] = AxisGroup("world", tuple(range(world)), me, dist.group.WORLD if world > 1 else None)

    def __getitem__(self, key: str) -> AxisGroup:
        try:
            return self._axes[key]
        except KeyError:
            raise KeyError(f"no group {key!r}; known: {sorted(self._axes)}") from None

    def __getattr__(self, key: str) -> AxisGroup:
        if key.startswith("_"):
            raise AttributeError(key)
        axes = self.__dict__.get("_axes", {})
        if key in axes:
            return axes[key]
        alias = key.replace("_", "-")
        if alias in axes:
            return axes[alias]
        raise AttributeError(f"Mesh has no group {key!r}; known: {sorted(axes)}")

    def coords(self) -> dict[str, int]:
        return {k: g.rank for k, g in self._axes.items()}

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={g.rank}/{g.size}" for k, g in self._axes.items() if k in (*AXES, "etp", "edp"))
        return f"Mesh(rank {self.global_rank}: {parts})"
