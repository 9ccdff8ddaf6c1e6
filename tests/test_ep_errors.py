"""Impossible expert-parallel layouts are refused up front, naming the constraint and the numbers."""

import re
from types import SimpleNamespace

import pytest
import torch

from pylib.ep import ExpertParallelMoE, expert_parallel_problems
from pylib.plan.config import MoEConfig
from pylib.runtime import Mesh, ParallelConfig, RankFailedError, launch
from pylib.runtime.mesh import AxisGroup
from tests.conftest import seeded_moe

MOE = MoEConfig(n_experts=8, top_k=2)


def _group(name, ranks, me=0):
    return AxisGroup(name, tuple(ranks), ranks.index(me), None)  # layout only: the checks run before any traffic


def test_experts_not_divisible_by_ep_is_refused():
    with pytest.raises(ValueError, match="ep=3 does not divide n_experts=8"):
        ExpertParallelMoE(seeded_moe(MOE), _group("ep", [0, 1, 2]), _group("etp", [0]), None)


def test_etp_not_dividing_the_expert_ffn_is_refused():
    with pytest.raises(ValueError, match="etp=3 does not divide expert h_ffn=16"):
        ExpertParallelMoE(seeded_moe(MOE), _group("ep", [0, 3]), _group("etp", [0, 1, 2]), None)


def test_top_k_above_the_expert_count_and_non_positive_capacity_are_refused():
    with pytest.raises(ValueError, match="top_k=9 must be between 1 and n_experts=8"):
        MoEConfig(n_experts=8, top_k=9)
    with pytest.raises(ValueError, match="capacity_factor=0 must be > 0"):
        MoEConfig(capacity_factor=0)
    with pytest.raises(ValueError, match=r"capacity_factor=-0.5 must be > 0"):
        MoEConfig(capacity_factor=-0.5)
    # the EP checker names them too (for configs built some other way), all at once
    bad = SimpleNamespace(n_experts=8, top_k=9, capacity_factor=0.0)
    assert expert_parallel_problems(bad, ep=3, etp=1, d_ff_expert=16) == [
        "ep=3 does not divide n_experts=8",
        "top_k=9 must be between 1 and n_experts=8",
        "capacity_factor=0.0 must be > 0 (or None for no dropping)",
    ]


def test_overlapping_ep_and_etp_groups_are_refused():
    with pytest.raises(
        ValueError, match=r"ep group \(0, 1\) and the etp group \(0, 1\) of rank 0 also share ranks \[1\]"
    ):
        ExpertParallelMoE(seeded_moe(MOE), _group("ep", [0, 1]), _group("etp", [0, 1]), None)


def test_tokens_of_the_wrong_width_are_refused():
    layer = ExpertParallelMoE(seeded_moe(MOE), _group("ep", [0]), _group("etp", [0]), None)
    with pytest.raises(ValueError, match="x has hidden size h=5, the MoE layer expects h=8"):
        layer(torch.zeros(1, 2, 5, dtype=torch.float64))


def test_sizes_that_do_not_match_the_mesh_are_refused():
    def bad_mesh():
        Mesh(ParallelConfig(dp=4, ep=3))

    with pytest.raises(RankFailedError, match=re.escape("etp*ep*pp = 1*3*1 = 3 does not divide world_size=4")):
        launch(bad_mesh, 4)

    def experts_vs_mesh():
        ExpertParallelMoE.from_mesh(seeded_moe(MoEConfig(n_experts=6, top_k=2)), Mesh(ParallelConfig(dp=4, ep=4)))

    with pytest.raises(RankFailedError, match="ep=4 does not divide n_experts=6"):
        launch(experts_vs_mesh, 4)
