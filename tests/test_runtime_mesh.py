"""rank_groups reproduces Megatron-Core's rank generator; Mesh builds the groups inside ranks."""

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pylib.runtime import Mesh, ParallelConfig, collectives, coordinates, launch, rank_groups


def _expected_groups(sizes: dict, order: str, axes: list[str], world: int) -> list[list[int]]:
    """Independent construction from the order string's definition: ranks fill an array whose first axis in
    `order` varies fastest (Fortran order); a group fixes the coordinates of every axis not in `axes`.
    Groups are listed with the remaining axes' coordinates in order, first fastest; members ascending."""
    names = order.split("-")
    shape = [sizes[n] for n in names]
    grid = np.arange(world).reshape(shape, order="F")
    rest = [i for i, n in enumerate(names) if n not in axes]
    groups = []
    # iterate rest-coordinates with the first rest axis fastest
    for combo in itertools.product(*[range(shape[i]) for i in reversed(rest)]):
        coords = dict(zip(reversed(rest), combo))
        index = tuple(coords[i] if i in coords else slice(None) for i in range(len(shape)))
        groups.append(sorted(grid[index].reshape(-1).tolist()))
    return groups


class _MegatronRankGenerator:
    """Megatron-Core's RankGenerator (megatron/core/parallel_state.py at d98e8a6), written again from its algorithm
    as a reference: axes missing from the order are appended; the sizes in order give global strides (prefix
    products, first axis fastest); a token such as "tp-cp" masks the axes a group spans; group i takes the
    coordinates of i, decomposed over the unmasked sizes, and its j-th member the coordinates of j, decomposed over
    the masked sizes; the member's rank is the dot product of both with their strides. Groups and members are
    listed in that enumeration order (not sorted)."""

    def __init__(self, tp, ep, dp, pp, cp, order):
        assert ep == 1 or cp == 1  # as Megatron: CP only in the dense generator, EP only in the expert one
        size = {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "cp": cp}
        names = order.split("-")
        names += [n for n in size if n not in names]
        self.names, self.shape = names, [size[n] for n in names]
        self.world = math.prod(self.shape)
        self.stride = [math.prod(self.shape[:i]) for i in range(len(self.shape))]

    @staticmethod
    def _digits(index, shape):
        out = []
        for n in shape:
            out.append(index % n)
            index //= n
        return out

    def get_ranks(self, token):
        wanted = token.split("-")
        mask = [n in wanted for n in self.names]
        in_shape = [n for n, m in zip(self.shape, mask) if m]
        in_stride = [d for d, m in zip(self.stride, mask) if m]
        out_shape = [n for n, m in zip(self.shape, mask) if not m]
        out_stride = [d for d, m in zip(self.stride, mask) if not m]
        size = math.prod(in_shape)
        groups = []
        for g in range(self.world // size):
            base = sum(i * d for i, d in zip(self._digits(g, out_shape), out_stride))
            groups.append(
                [base + sum(i * d for i, d in zip(self._digits(j, in_shape), in_stride)) for j in range(size)]
            )
        return groups


def _megatron_generators(cfg, world):
    """The two generators initialize_model_parallel builds from one order string: dense (ep = 1) and expert
    (cp = 1, dp = edp)."""
    dense = _MegatronRankGenerator(cfg.tp, 1, world // (cfg.tp * cfg.cp * cfg.pp), cfg.pp, cfg.cp, cfg.order)
    expert = _MegatronRankGenerator(cfg.etp, cfg.ep, cfg.expert_dp(world), cfg.pp, 1, cfg.order)
    return dense, expert


def _megatron_accepts(cfg, world) -> bool:
    """initialize_model_parallel's two assertions on the order (parallel_state.py at d98e8a6, lines 898-907)."""
    dense, expert = _megatron_generators(cfg, world)
    edp_equal = cfg.order.endswith("pp") or cfg.pp == 1 or cfg.expert_dp(world) == world // (cfg.tp * cfg.cp * cfg.pp)
    return edp_equal and dense.get_ranks("pp") == expert.get_ranks("pp")


MEGATRON_ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")  # the default, and --use-tp-pp-dp-mapping


@pytest.mark.parametrize("order", MEGATRON_ORDERS)
@pytest.mark.parametrize(
    "sizes, world",
    [
        (dict(tp=2, cp=2, dp=2, pp=2, etp=4), 16),
        (dict(tp=2, cp=2, dp=2, pp=2, ep=4), 16),
        (dict(tp=2, dp=2, pp=2, ep=2), 8),
        (dict(tp=4, dp=2, pp=2, ep=2, etp=2), 16),
        (dict(tp=2, cp=2, dp=1, pp=2, etp=4), 8),  # Megatron's dense dp-last test: tp2 pp2 cp2 etp4
        (dict(tp=2, cp=2, dp=1, pp=2, ep=2, etp=2), 8),  # its MoE dp-last test: tp2 cp2 pp2 ep2 (etp = tp)
        (dict(tp=3, dp=2, pp=2, ep=3), 12),
    ],
)
def test_rank_groups_equal_megatrons_two_rank_generators(sizes, world, order):
    """Dense and expert groups, group by group and member by member, for the default order and the dp-last one."""
    cfg = ParallelConfig(**sizes, order=order)
    assert _megatron_accepts(cfg, world)
    got = rank_groups(cfg, world)
    dense, expert = _megatron_generators(cfg, world)
    for key in ("tp", "cp", "dp", "pp", "dp-cp", "tp-cp", "tp-pp", "tp-dp-cp", "tp-cp-dp-pp"):
        assert got[key] == dense.get_ranks(key), key
    for key, token in (("etp", "tp"), ("ep", "ep"), ("edp", "dp"), ("etp-ep", "tp-ep"), ("etp-ep-pp", "tp-ep-pp")):
        assert got[key] == expert.get_ranks(token), key


def _accepted(kwargs, world) -> bool:
    try:
        return ParallelConfig(**kwargs).problems(world) == []
    except ValueError:
        return False


def test_orders_are_accepted_exactly_when_megatron_accepts_them():
    """Every mesh of 8 ranks with sizes 1, 2, 4, several orders (pp last, dp last, pp before ep, pp first):
    ParallelConfig accepts exactly the ones initialize_model_parallel's assertions accept."""
    orders = (*MEGATRON_ORDERS, "tp-cp-pp-ep-dp", "pp-tp-cp-ep-dp", "tp-pp-cp-ep-dp")
    world, seen = 8, {True: 0, False: 0}
    for tp, cp, pp, ep, etp in itertools.product((1, 2, 4), repeat=5):
        dp, folded = world // (tp * cp * pp), etp * ep * pp
        if tp * cp * pp * dp != world or world % folded:
            continue
        for order in orders:
            kwargs = dict(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, etp=etp, order=order)
            theirs = _megatron_accepts(SimpleNamespace(**kwargs, expert_dp=lambda w, f=folded: w // f), world)
            assert _accepted(kwargs, world) == theirs, kwargs
            seen[theirs] += 1
    assert seen[True] > 50 and seen[False] > 50, seen  # both answers are exercised


def test_the_dp_last_refusals_name_megatrons_reasons():
    with pytest.raises(ValueError, match="the data parallel size of the attention and moe layers must be the same"):
        ParallelConfig(tp=2, dp=2, pp=2, order="tp-cp-ep-pp-dp")  # etp*ep = 1 != tp*cp = 2
    pc = ParallelConfig(tp=2, cp=2, dp=2, pp=2, ep=4, order="tp-cp-pp-ep-dp")  # edp = dp, but pp's strides differ
    (problem,) = pc.problems(16)
    assert "Pipeline parallel groups are expected to be the same for Non-Expert and Expert part" in problem
    assert "span 4 ranks in the dense layout and 1 in the expert layout" in problem


def test_rank_groups_match_megatron_for_world_16_tp2_cp2_dp2_pp2():
    cfg = ParallelConfig(tp=2, cp=2, dp=2, pp=2)
    got = rank_groups(cfg, 16)
    dense = dict(tp=2, cp=2, ep=1, dp=2, pp=2)
    for key in ["tp", "cp", "dp", "pp", "dp-cp", "tp-cp", "tp-pp", "tp-dp-cp"]:
        assert got[key] == _expected_groups(dense, cfg.order, key.split("-"), 16), key
    # spot values worked out by hand: rank = tp + 2 cp + 4 dp + 8 pp
    assert got["tp"][0] == [0, 1] and got["cp"][0] == [0, 2] and got["dp"][0] == [0, 4]
    assert got["pp"][0] == [0, 8] and got["dp-cp"][0] == [0, 2, 4, 6] and got["tp-pp"][0] == [0, 1, 8, 9]


@pytest.mark.parametrize("order", ["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "cp-tp-ep-dp-pp"])
def test_expert_groups_fold_onto_the_dense_ranks(order):
    cfg = ParallelConfig(tp=2, cp=2, dp=2, pp=2, ep=4, etp=1, order=order)
    got = rank_groups(cfg, 16)
    expert = dict(tp=cfg.etp, cp=1, ep=cfg.ep, dp=cfg.expert_dp(16), pp=cfg.pp)
    for key, token in [("etp", "tp"), ("ep", "ep"), ("edp", "dp"), ("etp-ep", "tp-ep")]:
        assert got[key] == _expected_groups(expert, order, token.split("-"), 16), key
    # PP groups are the same in both layouts: a rank's pipeline stage does not depend on the layer type
    dense = dict(tp=2, cp=2, ep=1, dp=2, pp=2)
    assert got["pp"] == _expected_groups(dense, order, ["pp"], 16)
    assert sorted(got["pp"]) == sorted(_expected_groups(expert, order, ["pp"], 16))
    assert cfg.expert_dp(16) == 16 // (cfg.etp * cfg.ep * cfg.pp) == 2


def test_every_rank_is_in_exactly_one_group_of_each_kind():
    cfg = ParallelConfig(tp=2, cp=2, dp=2, pp=2, ep=2, etp=2)
    for key, groups in rank_groups(cfg, 16).items():
        assert sorted(r for g in groups for r in g) == list(range(16)), key


@pytest.mark.parametrize(
    "kwargs, world, message",
    [
        (dict(tp=2, dp=2), 8, "world_size=8 != tp*cp*dp*pp"),
        (dict(tp=0), 1, "tp=0 must be a positive integer"),
        (dict(tp=2, ep=4, dp=3), 6, "etp*ep*pp = 1*4*1 = 4 does not divide world_size=6"),
        (dict(order="tp-cp-xx-dp-pp"), 1, "unknown axes"),
        (dict(tp=2, order="cp-dp-pp"), 2, "omits tp but tp=2"),
        (dict(tp=2, cp=2, pp=2, ep=2, order="tp-pp-cp-ep-dp"), 8, "put pp last in the order, or make etp*ep = tp*cp"),
    ],
)
def test_bad_configs_are_refused_naming_the_constraint(kwargs, world, message):
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        rank_groups(ParallelConfig(**kwargs), world)


def test_all_violations_are_listed_not_only_the_first():
    with pytest.raises(ValueError) as info:
        ParallelConfig(tp=0, cp=-1)
    assert "tp=0" in str(info.value) and "cp=-1" in str(info.value)


def test_coordinates_are_the_index_inside_each_group():
    cfg = ParallelConfig(tp=2, cp=2, dp=2, pp=2)
    c = coordinates(cfg, 16, 13)  # 13 = 1 + 2*0 + 4*1 + 8*1
    assert (c["tp"], c["cp"], c["dp"], c["pp"]) == (1, 0, 1, 1)


def _mesh_sums(cfg):
    mesh = Mesh(cfg)
    out = {}
    for axis in ["tp", "cp", "dp", "pp", "dp-cp", "ep", "edp", "etp"]:
        t = torch.tensor([float(mesh.global_rank)])
        collectives.all_reduce_(t, mesh[axis])
        out[axis] = (float(t), mesh[axis].size, mesh[axis].rank)
    return out


def test_mesh_groups_inside_ranks_agree_with_rank_groups():
    cfg = ParallelConfig(tp=2, cp=1, dp=2, pp=2, ep=2)
    results = launch(_mesh_sums, 8, cfg)
    groups = rank_groups(cfg, 8)
    for rank, res in enumerate(results):
        for axis, (total, size, index) in res.items():
            (group,) = [g for g in groups[axis] if rank in g]
            assert total == sum(group) and size == len(group) and index == group.index(rank), (rank, axis)
