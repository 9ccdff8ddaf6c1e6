"""All-gather CP (Llama 3's) over real gloo ranks: equal to full attention forward and backward, one all-gather of
K and V forward and its reduce-scatter backward of the formula's size, the gathered K/V kept as the memory formula
says, the block plan's work equal to its formula and balanced under zig-zag; composed with TP and SP it trains like
the reference, and the planner prices it exactly (when a search space names it)."""

from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from pylib.analysis import planner as P
from pylib.analysis.compose import per_axis
from pylib.analysis.cp import (
    allgather_gathered_bytes,
    allgather_saved_bytes,
    allgather_traffic,
    allgather_work_per_rank,
    balance_ratio,
    causal_work_per_rank,
    ring_traffic,
    ring_work_per_rank,
)
from pylib.compose import formula_traffic, traced_traffic
from pylib.cp import allgather_attention, allgather_block_plan, shard_sequence
from pylib.experiments.compose_training import compare_with_reference, train, train_reference
from pylib.experiments.plan_runs import measure_plans
from pylib.model import saved_activations
from pylib.plan import ALL_CP_KINDS, RunOptions
from pylib.plan.presets import llama2_70b, tiny, tiny_gqa
from pylib.runtime import ParallelConfig, launch, trace
from pylib.runtime.mesh import AxisGroup
from pylib.viz.planner import compare
from tests.conftest import assert_cp_attention_equals_full

B, S, D = 2, 16, 5
HEADS = {"mha": (4, 4), "gqa": (8, 2)}


def _full(heads, seed=0, dtype=torch.float64):
    h, h_kv = HEADS[heads]
    g = torch.Generator().manual_seed(seed)
    shapes = ((B, h, S, D), (B, h_kv, S, D), (B, h_kv, S, D), (B, h, S, D))
    return tuple(torch.randn(*sh, generator=g, dtype=torch.float64).to(dtype) for sh in shapes)


def _rank(cases):
    r, n = dist.get_rank(), dist.get_world_size()
    results = []
    for (q, k, v, w), causal, layout in cases:
        ql, kl, vl = (shard_sequence(x, 2, r, n, layout).requires_grad_() for x in (q, k, v))
        blocks = []
        with trace() as tr, saved_activations() as saved:
            out = allgather_attention(ql, kl, vl, causal=causal, layout=layout, blocks=blocks)
        with trace() as tr_bwd:
            (out * shard_sequence(w, 2, r, n, layout)).sum().backward()
        events = [e.as_dict() for e in tr.events + tr_bwd.events]
        results.append((out.detach(), ql.grad, kl.grad, vl.grad, events, saved.bytes, blocks))
    return results


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_allgather_attention_output_and_grads_equal_full_attention(causal, layout, cp):
    cases = [(_full(heads, seed=i), causal, layout) for i, heads in enumerate(HEADS)]
    per_rank = launch(_rank, cp, cases)
    assert_cp_attention_equals_full(cases, per_rank, cp)


@pytest.mark.parametrize("cp", [2, 4])
def test_allgather_moves_one_all_gather_of_the_kv_heads_and_its_reduce_scatter_of_the_formula_size(cp):
    h, h_kv = HEADS["gqa"]
    f = allgather_traffic(B, S, h_kv, D, cp, 8)
    for r, results in enumerate(launch(_rank, cp, [(_full("gqa"), True, "zigzag")])):
        events, blocks = results[0][4], results[0][6]
        assert blocks == allgather_block_plan(r, cp, S // cp, causal=True, layout="zigzag")  # what the rank computed
        assert sum(b.computed for b in blocks) == allgather_work_per_rank(S, cp, "zigzag")[r]
        assert [(e["op"], e["phase"]) for e in events] == [("all_gather", "forward"), ("reduce_scatter", "backward")]
        gather, scatter = events
        assert gather["shapes"] == ((2, B, h_kv, S // cp, D),)  # K and V, the K/V heads only (not the query heads)
        assert gather["payload_bytes"] == f["gathered_bytes"] == allgather_gathered_bytes(B, S, h_kv, D, 8)
        assert gather["bytes_sent"] == f["forward_bytes_sent"]
        assert scatter["payload_bytes"] == f["reduce_scatter_bytes"]
        assert scatter["bytes_sent"] == f["backward_bytes_sent"]
        assert gather["tag"] == scatter["tag"] == "allgather.kv"
    ring = ring_traffic(B, S, h_kv, D, cp, 8)
    assert f["forward_bytes_sent"] == ring["forward_bytes_sent"]  # the same bytes, one collective
    assert f["backward_bytes_sent"] < ring["backward_bytes_sent"]


@pytest.mark.slow
def test_allgather_keeps_the_gathered_kv_for_backward_as_the_formula_says():
    h, h_kv = HEADS["gqa"]
    for dtype, size in ((torch.float64, 8), (torch.bfloat16, 2)):
        for cp in (1, 2, 4):
            for r, res in enumerate(launch(_rank, cp, [(_full("gqa", dtype=dtype), True, "zigzag")])):
                want = allgather_saved_bytes(B, S, h, h_kv, D, cp, size)
                assert res[0][5] == want, (dtype, cp, r, res[0][5], want)
    gathered = allgather_gathered_bytes(B, S, h_kv, D, 2)  # the same at every cp: only q, out, LSE shrink
    one, four = (allgather_saved_bytes(B, S, h, h_kv, D, cp, 2) - gathered for cp in (1, 4))
    assert one == 4 * four


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cp", [1, 2, 4, 8])
def test_allgather_work_formula_sums_the_block_plan(cp, causal, layout):
    s = 32
    for what in ("computed", "unmasked"):
        plans = [allgather_block_plan(r, cp, s // cp, causal=causal, layout=layout) for r in range(cp)]
        assert [sum(getattr(b, what) for b in p) for p in plans] == allgather_work_per_rank(s, cp, layout, causal, what)
    if causal:
        assert allgather_work_per_rank(s, cp, layout, True, "unmasked") == causal_work_per_rank(s, cp, layout)


def test_zigzag_allgather_is_balanced_and_evaluates_one_quarter_block_less_than_the_ring():
    s, cp = 64, 4
    c = s // (2 * cp)
    ag = allgather_work_per_rank(s, cp, "zigzag")
    assert balance_ratio(ag) == 1.0 and ag[0] == (2 * cp + 1) * c * c
    assert ring_work_per_rank(s, cp, "zigzag")[0] - ag[0] == c * c
    assert balance_ratio(allgather_work_per_rank(s, cp, "contiguous")) == cp


def test_allgather_rejects_a_zigzag_shard_of_odd_length_naming_the_numbers():
    group4 = AxisGroup("cp", (0, 1, 2, 3), 0, None)  # the checks run before any communication
    q = torch.zeros(1, 4, 3, 8)
    with pytest.raises(ValueError, match=r"allgather_attention: .*s_local=3 is odd \(s=12 is not divisible by 8\)"):
        allgather_attention(q, q, q, group=group4, layout="zigzag")


# ------------------------------------------------------------------------------------------------ composed and priced

TP_CP = ParallelConfig(tp=2, cp=2)
ALLGATHER = RunOptions(sequence_parallel=True, cp_kind="allgather", zero_stage=1, n_microbatches=2)


@pytest.mark.slow
def test_allgather_cp_composed_with_tp_and_sp_trains_like_the_reference_and_sends_what_the_formulas_say():
    cfg, batch, seq = tiny_gqa(), 8, 16
    results = launch(train, 4, cfg, TP_CP, ALLGATHER, steps=3, batch=batch, seq=seq, data="pattern", timeout=200)
    err = compare_with_reference(results, train_reference(cfg, steps=3, batch=batch, seq=seq, data="pattern"))
    assert err["missing"] == [] and err["loss_err"] <= 1e-12 and err["param_err"] <= 1e-12, err
    for r in results:
        assert traced_traffic(r) == per_axis(formula_traffic(cfg, TP_CP, r, ALLGATHER, batch=batch, seq=seq))


@pytest.mark.slow
def test_planner_predicts_allgather_plans_memory_and_traffic_exactly():
    cfg = tiny().with_(position="rope")
    plans = [
        P.Plan(TP_CP, ALLGATHER),
        P.Plan(ParallelConfig(cp=2, dp=2), RunOptions(cp_kind="allgather")),
        P.Plan(ParallelConfig(cp=2, dp=2), RunOptions(cp_kind="allgather", zero_stage=2, recompute="selective")),
        P.Plan(ParallelConfig(cp=2, dp=2), RunOptions(cp_kind="allgather", recompute="full")),
    ]
    records = measure_plans(cfg, plans, batch=8, seq=16)
    checks = [c for plan in plans for c in compare(cfg, plan, records[plan], batch=8, seq=16)]
    assert {"sent on cp", "saved activations, chunk 0", "activation peak"} <= {c.quantity for c in checks}
    assert [c for c in checks if c.predicted != c.measured] == []


def test_the_default_search_leaves_allgather_out_and_a_search_space_naming_it_prices_it():
    cfg, work, cluster = llama2_70b(), P.Workload(batch=16, seq=131072), P.Cluster(world_size=64)
    mesh = ParallelConfig(tp=8, cp=8)
    plain = P.enumerate_plans(cfg, 64, 16, 131072, P.SearchSpace(meshes=(mesh,)))
    every = P.enumerate_plans(cfg, 64, 16, 131072, P.SearchSpace(meshes=(mesh,), cp_kinds=ALL_CP_KINDS))
    assert {p.options.cp_kind for p in plain} == {"ring"}  # Ulysses: one K/V head per TP rank cannot split over cp
    assert {p.options.cp_kind for p in every} == {"ring", "allgather"}
    ring = RunOptions(cp_kind="ring", n_microbatches=16)
    by_kind = {k: P.predict(cfg, P.Plan(mesh, replace(ring, cp_kind=k)), work, cluster) for k in ("ring", "allgather")}
    sent = {k: p.ranks[0].traffic["cp"]["bytes_sent"] for k, p in by_kind.items()}
    assert sent["allgather"] < sent["ring"]  # the ring's backward sends K/V again and one dK/dV hop more
    assert by_kind["allgather"].peak_memory > by_kind["ring"].peak_memory  # the gathered K/V of the whole sequence


@pytest.mark.parametrize("causal", [False, True])
def test_the_shape_table_lists_the_score_blocks_the_allgather_plan_computes(causal):
    from pylib.analysis.shapes import score_blocks

    cfg, cp, s = tiny().with_(causal=causal), 4, 32
    for layout in ("contiguous", "zigzag"):
        options = RunOptions(cp_kind="allgather", cp_layout=layout)
        for r in range(cp):
            blocks = allgather_block_plan(r, cp, s // cp, causal=causal, layout=layout)
            want = [(2, cfg.n_heads, b.n_q, b.n_kv) for b in blocks]
            assert score_blocks(cfg, ParallelConfig(cp=cp), 2, s, options, cp_rank=r) == want
