"""The rank mesh: which global ranks form each parallel group.

`rank_groups(config, world_size)` is a pure function (no processes) that returns the groups exactly as
Megatron-Core's rank generator builds them. The idea: lay the ranks out as an n-dimensional array whose axes are
the parallel sizes in the `order` string, the first axis varying fastest,

    rank = i_tp + tp * (i_cp + cp * (i_ep + ep * (i_dp + dp * i_pp)))      for order "tp-cp-ep-dp-pp",

and a group along a set of axes is every rank that shares the coordinates on all the *other* axes.

Two layouts share the same ranks ("parallel folding"):
  dense layers (attention, dense MLP):  TP x CP x DP x PP          (ep taken as 1)
  expert layers (MoE):                 ETP x EP x EDP x PP        (cp taken as 1, EDP = world / (ETP*EP*PP))
Both use the same order string and agree on PP, so a rank's pipeline stage is the same in both.

Inside a rank, `Mesh(config)` creates the torch process groups and gives each axis's group, rank and size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

AXES = ("tp", "cp", "ep", "dp", "pp")

# Group names returned by rank_groups. Dense groups use the dense layout, expert groups the folded one.
DENSE_GROUPS = ("tp", "cp", "dp", "pp", "dp-cp", "tp-cp", "tp-pp", "tp-dp-cp", "tp-cp-dp-pp")
EXPERT_GROUPS = {"etp": "tp", "ep": "ep", "edp": "dp", "etp-ep": "tp-ep", "etp-ep-pp": "tp-ep-pp"}


@dataclass(frozen=True)
class ParallelConfig:
    """Sizes of each parallel axis and Megatron's order string (fastest-varying axis first).

    tp: tensor parallel (also the sequence-parallel group), cp: context parallel, ep: expert parallel,
    dp: data parallel, pp: pipeline parallel, etp: tensor parallel inside each expert.
    """

    tp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 1
    pp: int = 1
    etp: int = 1
    order: str = "tp-cp-ep-dp-pp"

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise ValueError("invalid ParallelConfig: " + "; ".join(problems))

    def problems(self, world_size: int | None = None) -> list[str]:
        """Every violated constraint, as sentences (empty when the config is valid)."""
        out = []
        for name in (*AXES, "etp"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                out.append(f"{name}={v!r} must be a positive integer")
        tokens = self.order.split("-")
        unknown = [t for t in tokens if t not in AXES]
        if unknown:
            out.append(f"order {self.order!r} names unknown axes {unknown} (known: {'-'.join(AXES)})")
        dupes = sorted({t for t in tokens if tokens.count(t) > 1})
        if dupes:
            out.append(f"order {self.order!r} repeats {dupes}")
        for name in AXES:
            v = getattr(self, name)
            if name not in tokens and isinstance(v, int) and v != 1:
                out.append(f"order {self.order!r} omits {name} but {name}={v}")
        if out:
            return out
        if world_size is not None:
            if world_size != self.dense_world_size:
                out.append(
                    f"world_size={world_size} != tp*cp*dp*pp = {self.tp}*{self.cp}*{self.dp}*{self.pp} "
                    f"= {self.dense_world_size}"
                )
            folded = self.etp * self.ep * self.pp
            if world_size % folded:
                out.append(
                    f"etp*ep*pp = {self.etp}*{self.ep}*{self.pp} = {folded} does not divide world_size={world_size}"
                )
            elif world_size == self.dense_world_size and self.pp > 1:
                # As Megatron-Core asserts: a rank's pipeline stage must not depend on whether the layer is MoE.
                dense = dict(tp=self.tp, cp=self.cp, ep=1, dp=self.dp, pp=self.pp)
                expert = dict(tp=self.etp, cp=1, ep=self.ep, dp=self.expert_dp(world_size), pp=self.pp)
                a = sorted(_groups_along(dense, self.order, ["pp"], world_size))
                b = sorted(_groups_along(expert, self.order, ["pp"], world_size))
                if a != b:
                    out.append(
                        f"order {self.order!r} puts different ranks in a pipeline group for dense layers "
                        f"({a[0]}, ...) and expert layers ({b[0]}, ...); put pp last in the order"
                    )
        return out

    @property
    def dense_world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def world_size(self) -> int:
        return self.dense_world_size

    def expert_dp(self, world_size: int | None = None) -> int:
        """EDP, the data-parallel size of expert layers: world / (etp * ep * pp)."""
        world = self.dense_world_size if world_size is None else world_size
        return world // (self.etp * self.ep * self.pp)

    def validate(self, world_size: int) -> None:
        problems = self.problems(world_size)
        if problems:
            raise ValueError(
                f"ParallelConfig {self.describe()} cannot run on {world_size} ranks: " + "; ".join(problems)
            )

    def describe(self) -> str:
        parts = [f"{a}{getattr(self, a)}" for a in AXES if getattr(self, a) != 1]
        if self.etp != 1:
            parts.append(f"etp{self.etp}")
        return " ".join(parts) or "single rank"


def _full_order(order: str) -> list[str]:
    tokens = order.split("-")
    return tokens + [a for a in AXES if a not in tokens]


def _groups_along(sizes: dict[str, int], order: str, axes: list[str], world_size: int) -> list[list[int]]:
    """Groups of ranks that vary along `axes` and share every other coordinate.

    Ranks are the array positions of a grid with shape `sizes[order[0]], sizes[order[1]], ...`, first axis fastest.
    Groups are listed by the coordinates of the other axes (first such axis fastest); inside a group ranks are
    listed by their coordinates along `axes`, taken in `order` (first fastest) -- which is ascending rank order.
    """
    names = _full_order(order)
    shape = [sizes[n] for n in names]
    strides = [math.prod(shape[:i]) for i in range(len(shape))]
    if math.prod(shape) != world_size:
        raise ValueError(f"sizes {dict(zip(names, shape))} multiply to {math.prod(shape)}, not {world_size}")
    inside = [i for i, n in enumerate(names) if n in axes]
    outside = [i for i, n in enumerate(names) if n not in axes]

    def positions(dims):
        # every coordinate tuple over `dims`, the first dim fastest
        total = math.prod(shape[d] for d in dims)
        for flat in range(total):
            coords, rest = {}, flat
            for d in dims:
                coords[d] = rest % shape[d]
                rest //= shape[d]
            yield coords

    groups = []
    for outer in positions(outside):
        base = sum(outer[d] * strides[d] for d in outside)
        groups.append([base + sum(inner[d] * strides[d] for d in inside) for inner in positions(inside)])
    return groups


def rank_groups(config: ParallelConfig, world_size: int) -> dict[str, list[list[int]]]:
    """Every parallel group of `config` on `world_size` ranks, as Megatron-Core's rank generator builds them.

    Dense keys: "tp", "cp", "dp", "pp", "dp-cp" (Megatron's data-parallel group with CP, over which gradients are
    averaged), "tp-cp", "tp-pp" (model parallel), "tp-dp-cp", "tp-cp-dp-pp" (everything but EP).
    Expert keys (folded layout): "etp", "ep", "edp", "etp-ep", "etp-ep-pp".
    """
    config.validate(world_size)
    dense = dict(tp=config.tp, cp=config.cp, ep=1, dp=config.dp, pp=config.pp)
    expert = dict(tp=config.etp, cp=1, ep=config.ep, dp=config.expert_dp(world_size), pp=config.pp)
    out = {}
    for key in DENSE_GROUPS:
        out[key] = _groups_along(dense, config.order, key.split("-"), world_size)
    for key, token in EXPERT_GROUPS.items():
        out[key] = _groups_along(expert, config.order, token.split("-"), world_size)
    return out


def coordinates(config: ParallelConfig, world_size: int, rank: int) -> dict[str, int]:
    """This rank's index inside each of its groups, e.g. {"tp": 1, "cp": 0, ..., "ep": 1, "etp": 0, "edp": 0}."""
    out = {}
    for key, groups in rank_groups(config, world_size).items():
        for g in groups:
            if rank in g:
                out[key] = g.index(rank)
                break
    return out


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
