"""rank_groups reproduces Megatron-Core's rank generator; Mesh builds the groups inside ranks."""

import itertools

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
        (dict(tp=2, cp=2, pp=2, ep=2, order="tp-pp-cp-ep-dp"), 8, "put pp last in the order"),
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
