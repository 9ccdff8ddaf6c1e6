"""The rank mesh: which global ranks form each parallel group.

`rank_groups(config, world_size)` is a pure function (no processes) that returns the groups exactly as
Megatron-Core's rank generator builds them. The idea: lay the ranks out as an n-dimensional array whose axes are
the parallel sizes in the `order` string, the first axis varying fastest,

    rank = i_tp + tp * (i_cp + cp * (i_ep + ep * (i_dp + dp * i_pp)))      for order "tp-cp-ep-dp-pp",

and a group along a set of axes is every rank that shares the coordinates on all the *other* axes.

Two layouts share the same ranks ("parallel folding"):
  dense layers (attention, dense MLP):  TP x CP x DP x PP          (ep taken as 1)
  expert layers (MoE):                 ETP x EP x EDP x PP        (cp taken as 1, EDP = world / (ETP*EP*PP))
Both come from the same order string (two generators, one order); `ParallelConfig` refuses, as Megatron-Core does, an
order under which the two would disagree on PP, so a rank's pipeline stage is the same in both.

Pure arithmetic of sizes (no torch): `pylib.runtime.Mesh(config)` builds the torch process groups from these groups
inside a launched rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pylib.i18n import tr

from .fields import POSITIVE, refusal

AXES = ("tp", "cp", "ep", "dp", "pp")

# Group names returned by rank_groups. Dense groups use the dense layout, expert groups the folded one.
DENSE_GROUPS = ("tp", "cp", "dp", "pp", "dp-cp", "tp-cp", "tp-pp", "tp-dp-cp", "tp-cp-dp-pp")
EXPERT_GROUPS = {"etp": "tp", "ep": "ep", "edp": "dp", "etp-ep": "tp-ep", "etp-ep-pp": "tp-ep-pp"}


@dataclass(frozen=True)
class ParallelConfig:
    """Sizes of each parallel axis and Megatron's order string (fastest-varying axis first).

    tp: tensor parallel (also the sequence-parallel group), cp: context parallel, ep: expert parallel,
    dp: data parallel, pp: pipeline parallel, etp: tensor parallel inside each expert.

    etp defaults to 1 here: experts are split by EP only unless asked. Megatron-Core's default differs: its
    `expert_tensor_parallel_size` left unset means etp = tp (each expert cut like the dense MLP). To mirror a
    Megatron run that does not set it, pass etp=tp.

    Orders follow Megatron-Core's `initialize_model_parallel` (megatron/core/parallel_state.py at d98e8a6), which
    builds two rank generators from one order string, one for the dense layout and one for the expert layout, and
    asserts two things: with pp > 1 and an order that does not end in pp, the expert layers' data-parallel size
    edp = world / (etp ep pp) equals the dense dp = world / (tp cp pp), i.e. etp ep = tp cp; and in every case the
    two layouts have the same pipeline groups. Every order they accept is accepted here: the default
    "tp-cp-ep-dp-pp" (pp last) and Megatron's `--use-tp-pp-dp-mapping` order "tp-cp-ep-pp-dp" (dp last) among
    them. Megatron's own dp-last runs with a dense model set etp = tp cp for that reason.
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
                out.append(refusal(None, name, v, POSITIVE))
        if not isinstance(self.order, str):
            out.append(f"order={self.order!r} must be a string of axis names joined by '-', e.g. 'tp-cp-ep-dp-pp'")
            return out
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
        world = self.dense_world_size if world_size is None else world_size
        if world % (self.etp * self.ep * self.pp) == 0:
            out += self._order_problems(world)
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
            elif world_size == self.dense_world_size and self.pp > 1 and tokens[-1] != "pp":
                # As Megatron-Core asserts: a rank's pipeline stage must not depend on whether the layer is MoE.
                # (pp last: both layouts put pp slowest, stride world/pp, so the groups agree without listing them)
                dense = dict(tp=self.tp, cp=self.cp, ep=1, dp=self.dp, pp=self.pp)
                expert = dict(tp=self.etp, cp=1, ep=self.ep, dp=self.expert_dp(world_size), pp=self.pp)
                a = sorted(_groups_along(dense, self.order, ["pp"], world_size))
                b = sorted(_groups_along(expert, self.order, ["pp"], world_size))
                if a != b:
                    out.append(
                        tr(
                            "order {order!r} puts different ranks in a pipeline group for dense layers "
                            "({dense}, ...) and expert layers ({expert}, ...), which Megatron-Core's "
                            'initialize_model_parallel refuses ("Pipeline parallel groups are expected to be the '
                            'same for Non-Expert and Expert part"): the axes in front of pp span '
                            "{dense_stride} ranks in the dense layout and {expert_stride} in the expert layout; put "
                            "pp last, or where the axes in front of it span as many ranks in both",
                            order=self.order,
                            dense=a[0],
                            expert=b[0],
                            dense_stride=_stride_of("pp", dense, self.order),
                            expert_stride=_stride_of("pp", expert, self.order),
                        )
                    )
        return out

    def _order_problems(self, world_size: int) -> list[str]:
        """Megatron-Core's first assertion: with pp > 1, an order that does not end in pp needs edp == dp."""
        if self.pp == 1 or self.order.split("-")[-1] == "pp":
            return []
        dp_dense = world_size // (self.tp * self.cp * self.pp)
        edp = self.expert_dp(world_size)
        if edp == dp_dense:
            return []
        return [
            tr(
                "order {order!r} does not end in pp, so with pp={pp} the expert layers' data-parallel size edp = "
                "world/(etp*ep*pp) = {world}/({etp}*{ep}*{pp}) = {edp} must equal the dense dp = world/(tp*cp*pp) "
                "= {world}/({tp}*{cp}*{pp}) = {dp} (Megatron-Core's initialize_model_parallel asserts \"When not "
                "using pp-last rank ordering, the data parallel size of the attention and moe layers must be the "
                'same"); put pp last in the order, or make etp*ep = tp*cp',
                order=self.order,
                pp=self.pp,
                world=world_size,
                etp=self.etp,
                ep=self.ep,
                edp=edp,
                tp=self.tp,
                cp=self.cp,
                dp=dp_dense,
            )
        ]

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


def _stride_of(axis: str, sizes: dict[str, int], order: str) -> int:
    """How many ranks the axes in front of `axis` span in a layout of `sizes` (the rank distance between two
    neighbours along `axis`)."""
    names = _full_order(order)
    return math.prod(sizes[n] for n in names[: names.index(axis)])


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

    offsets = [sum(inner[d] * strides[d] for d in inside) for inner in positions(inside)]  # the same in every group
    bases = [sum(outer[d] * strides[d] for d in outside) for outer in positions(outside)]
    return [[base + o for o in offsets] for base in bases]


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


# --------------------------------------------------------------------------------------------------- HSDP

HSDP_SHARD, HSDP_REPLICATE = "dp-shard", "dp-replicate"  # HSDP's two groups, as the tracer records them


def hsdp_groups(ranks, shard_size: int) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """A data-parallel group `ranks` (d of them, in group order) cut into r = d/s replicas of s ranks: the shard
    groups are s consecutive members (one node when the group's ranks are numbered node by node), the replica
    groups the members at the same index of every shard group. FSDP2's 2-D mesh (replicate, shard), row-major.

        hsdp_groups(range(8), 4) == ([(0, 1, 2, 3), (4, 5, 6, 7)], [(0, 4), (1, 5), (2, 6), (3, 7)])"""
    ranks = tuple(ranks)
    d = len(ranks)
    if not isinstance(shard_size, int) or isinstance(shard_size, bool) or shard_size < 1 or d % shard_size:
        raise ValueError(f"shard_size={shard_size!r} must be a positive divisor of the data-parallel size d={d}")
    s = shard_size
    shards = [ranks[i : i + s] for i in range(0, d, s)]
    replicas = [tuple(g[j] for g in shards) for j in range(s)]
    return shards, replicas
