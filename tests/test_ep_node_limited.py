"""Group-limited (node-limited) top-k: the selection rule, and the bytes that cross node boundaries as the tracer
records them against the formula from the actual routing, with and without the limit."""

import itertools

import pytest
import torch
import torch.distributed as dist

from pylib.analysis.ep import dispatch_matrix, expected_inter_node_rows, node_rows
from pylib.ep import ExpertParallelMoE
from pylib.ep.traffic import node_split, traffic_matrix
from pylib.model.moe import MoE, select_experts
from pylib.plan.config import MoEConfig
from pylib.runtime import Mesh, ParallelConfig, launch, tag, trace

H, F, E, K = 8, 16, 16, 4
ROW = H * 8


def _brute_force(scores, cfg):
    """Every token: try every set of topk_groups groups, keep the best by the group-score rule, top-k inside it."""
    G, M, k = cfg.n_groups, cfg.topk_groups, cfg.top_k
    per = cfg.n_experts // G
    out = []
    for row in scores.tolist():
        group_score = [sum(sorted(row[g * per : (g + 1) * per], reverse=True)[: k // M]) for g in range(G)]
        best = max(itertools.combinations(range(G), M), key=lambda gs: (sum(group_score[g] for g in gs), -sum(gs)))
        allowed = [e for g in best for e in range(g * per, (g + 1) * per)]
        out.append(sorted(sorted(allowed, key=lambda e: -row[e])[:k]))
    return out


def test_group_limited_topk_picks_the_best_groups_then_the_best_experts_inside_them():
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(64, E, generator=g, dtype=torch.float64)
    for G, M, k in [(4, 2, 4), (8, 4, 8), (4, 1, 2), (2, 1, 3)]:
        cfg = MoEConfig(n_experts=E, top_k=k, n_groups=G, topk_groups=M)
        got = select_experts(scores, cfg).sort(-1).values.tolist()
        assert got == _brute_force(scores, cfg), (G, M, k)
    # topk_groups = n_groups (or None) is plain top-k
    plain = torch.topk(scores, 4, dim=-1).indices
    assert torch.equal(select_experts(scores, MoEConfig(n_experts=E, top_k=4, n_groups=4, topk_groups=4)), plain)
    assert torch.equal(select_experts(scores, MoEConfig(n_experts=E, top_k=4)), plain)


def test_a_group_with_one_strong_expert_loses_to_a_group_with_two_good_ones():
    # k=2, M=1: a group scores its top k // M = 2 sum (as DeepSeek-V3's k=8, M=4), so 0.9 + 0.1 loses to 0.6 + 0.6
    s = torch.tensor([[0.9, 0.1, 0.0, 0.0, 0.6, 0.6, 0.0, 0.0, 0.5, 0.5, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0]])
    cfg = MoEConfig(n_experts=E, top_k=2, n_groups=4, topk_groups=1)
    assert sorted(select_experts(s, cfg)[0].tolist()) == [4, 5]  # plain top-2 would take expert 0
    assert sorted(torch.topk(s, 2).indices[0].tolist()) == [0, 4]


def test_group_limits_are_refused_with_the_numbers():
    with pytest.raises(ValueError, match="n_groups=3 does not divide n_experts=16"):
        MoEConfig(n_experts=16, top_k=4, n_groups=3, topk_groups=1)
    with pytest.raises(ValueError, match="topk_groups=3 must be at most top_k=2"):
        MoEConfig(n_experts=16, top_k=2, n_groups=4, topk_groups=3)
    with pytest.raises(ValueError, match="top_k=8 experts do not fit in topk_groups=1 groups of 4 experts"):
        MoEConfig(n_experts=16, top_k=8, n_groups=4, topk_groups=1)


CFGS = {
    "unlimited": MoEConfig(n_experts=E, top_k=K, score="sigmoid"),
    "node-limited": MoEConfig(n_experts=E, top_k=K, score="sigmoid", n_groups=2, topk_groups=1),
}


def _run(tokens):
    mesh = Mesh(ParallelConfig(dp=4, ep=4))
    r = dist.get_rank()
    x = torch.randn(1, tokens, H, generator=torch.Generator().manual_seed(r), dtype=torch.float64)
    out = {}
    for name, cfg in CFGS.items():
        with torch.random.fork_rng():
            torch.manual_seed(0)
            layer = ExpertParallelMoE.from_full(MoE(H, F, cfg).double(), ep_group=mesh.ep)
        with trace() as tr, tag(name):
            layer(x)
        out[name] = dict(events=[e.as_dict() for e in tr.events], experts=layer.last_routing.experts)
    return out


@pytest.mark.slow
def test_inter_node_bytes_traced_equal_the_formula_with_and_without_the_node_limit():
    tokens, rpn = 32, 2  # 4 EP ranks on 2 nodes of 2; groups of 8 experts = the experts of one node
    results = launch(_run, 4, tokens)
    dedup = {}
    for name in CFGS:
        experts = [res[name]["experts"] for res in results]
        traced = traffic_matrix([res[name]["events"] for res in results], 4, tag=f"{name}.dispatch")
        assert traced == [[c * ROW for c in row] for row in dispatch_matrix(experts, E)]
        split = node_split(traced, [0, 1, 2, 3], rpn)
        rows = [node_rows(experts[r], r, E, 4, rpn) for r in range(4)]
        for r in range(4):
            assert split[r]["inter"] == rows[r]["inter"] * ROW and split[r]["intra"] == rows[r]["intra"] * ROW
        dedup[name] = sum(rw["inter_dedup"] for rw in rows)
        if name == "node-limited":  # every token's k experts on one node: at most one remote node per token
            assert all(rw["inter_dedup"] <= tokens for rw in rows)
            assert all(len({int(e) // 8 for e in row}) == 1 for x in experts for row in x.tolist())
    # the limit roughly halves the distinct (token, remote node) pairs; unlimited is near its uniform expectation
    expect = expected_inter_node_rows(tokens * 4, K, E, 4, rpn)["inter_dedup"]
    assert dedup["node-limited"] < 0.7 * dedup["unlimited"]
    limited = expected_inter_node_rows(tokens * 4, K, E, 4, rpn, topk_groups=1)["inter_dedup"]  # T M (N-1)/N
    assert abs(dedup["node-limited"] - limited) < 0.15 * limited
    assert abs(dedup["unlimited"] - expect) < 0.1 * expect
