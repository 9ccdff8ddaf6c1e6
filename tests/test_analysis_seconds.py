"""The alpha-beta model of `pylib.analysis.seconds`: its formulas on hand-computed cases, and the planner's seconds
for the same traffic (the link numbers, the bytes and the latency are the planner's, so the two agree)."""

from dataclasses import replace

import pytest

from pylib.analysis import planner as P
from pylib.analysis import seconds as S
from pylib.analysis.dp import padded_numel
from pylib.analysis.efficiency import layer_gemms
from pylib.analysis.weights import parameter_counts
from pylib.plan.mesh import ParallelConfig
from pylib.plan.options import RunOptions
from pylib.plan.presets import deepseek_v3_like, llama2_7b, llama2_70b, mixtral_8x7b, tiny

LINKS = S.links()


def test_links_are_the_planners_defaults():
    c = P.Cluster(world_size=1)
    assert LINKS["nvlink"].beta == c.intra_node_bandwidth == 450e9
    assert LINKS["ib"].beta == c.inter_node_bandwidth == 50e9
    assert LINKS["nvlink"].alpha == LINKS["ib"].alpha == c.model.latency == 20e-6
    fast = S.links(P.Cluster(world_size=1, intra_node_bandwidth=900e9))
    assert fast["nvlink"].beta == 900e9


def test_a_message_costs_alpha_plus_bytes_over_beta():
    link = S.Link("test", alpha=1e-5, beta=1e9, source="hand")
    assert link.seconds(1e9) == pytest.approx(1 + 1e-5)
    assert link.seconds(2e9, messages=3) == pytest.approx(2 + 3e-5)
    assert link.seconds(0, messages=0) == 0


def test_dp_reduce_and_hiding_tokens_by_hand():
    # 1e9 parameters in bf16 on d = 4 over 50 GB/s: 2 * 3/4 * 2e9 B = 3e9 B -> 0.06 s
    assert S.dp_reduce_seconds(10**9, 4, LINKS["ib"]) == pytest.approx(0.06)
    # T* = 2 * 3/4 * 2 * 0.6 * 989e12 / (4 * 50e9) = 8901 tokens, whatever the model's size
    t_star = S.dp_hiding_tokens(4, LINKS["ib"])
    assert t_star == pytest.approx(8901)
    for n in (10**8, 10**9):
        assert S.backward_seconds(n, t_star) == pytest.approx(S.dp_reduce_seconds(n, 4, LINKS["ib"]))


def _predicted_rows(cfg, plan, workload, pp_rank, world_size) -> list:
    """The rows `predict` prices: the planner's (row, times) pairs, each row as many times as it is issued."""
    counted, _ = P._predicted_rows(cfg, plan, workload, pp_rank, world_size)
    return [r for r, times in counted for _ in range(times)]


@pytest.mark.parametrize("d, intra", [(8, True), (16, False)])
def test_dp_seconds_equal_the_planners_before_overlap(d, intra):
    cfg = llama2_7b()
    plan = P.Plan(ParallelConfig(dp=d))
    cluster = P.Cluster(d, overlap_dp=False)
    pred = P.predict(cfg, plan, P.Workload(batch=d, seq=4096), cluster)
    assert pred.intra_node["dp-cp"] is intra
    n = padded_numel(parameter_counts(cfg, plan.par)["total"], d)
    link = S.links(cluster)["nvlink" if intra else "ib"]
    rows = _predicted_rows(cfg, plan, P.Workload(batch=d, seq=4096), 0, d)
    (loss,) = [r for r in rows if r.axis == "dp-cp" and r.where == "loss"]  # the loss's scalar, 8 B in fp64
    ours = S.dp_reduce_seconds(n, d, link) + loss.bytes_sent / link.beta
    assert pred.ranks[0].exposed["dp"] == pytest.approx(ours, rel=1e-12)


def test_tp_layer_seconds_by_hand():
    cfg = tiny()  # h = 16 in float64
    b, s, t, h, e = 2, 8, 4, 16, 8
    link = S.Link("test", alpha=1e-6, beta=1e9, source="hand")
    out = S.tp_layer_seconds(cfg, b, s, t, link)
    assert out["comm"] == pytest.approx(4 * 1e-6 + 4 * 2 * (t - 1) / t * b * s * h * e / 1e9)
    assert S.tp_layer_seconds(cfg, b, s, 1, link)["comm"] == 0
    big = llama2_7b()  # compute-bound: 3 * 2 b s P_L / (t eta peak)
    g = S.tp_layer_seconds(big, 1, 4096, 8, link)["gemm"]
    assert g == pytest.approx(3 * 2 * 4096 * S.dense_layer_params(big) / 8 / (0.6 * 989e12))


def test_tp_crossover_is_where_bytes_equal_gemms():
    cfg = llama2_7b()
    assert S.dense_layer_params(cfg) == 4 * 4096**2 + 3 * 4096 * 11008
    b, s, h, e = 1, 4096, 4096, 2
    for link in LINKS.values():
        t = S.tp_crossover(cfg, link)  # at t*, the bytes' seconds equal the compute-bound GEMMs'
        comm = 4 * 2 * (t - 1) / t * b * s * h * e / link.beta
        gemm = 3 * 2 * b * s * S.dense_layer_params(cfg) / (t * 0.6 * 989e12)
        assert comm == pytest.approx(gemm)
    big = llama2_70b()  # t* = 4.3 across nodes: t = 4 still GEMM-bound, t = 8 not (alpha and roofline included)
    assert 4 < S.tp_crossover(big, LINKS["ib"]) < 5 and S.tp_crossover(big, LINKS["nvlink"]) > 8
    four, eight = (S.tp_layer_seconds(big, 1, 4096, t, LINKS["ib"]) for t in (4, 8))
    assert four["comm"] < four["gemm"] and eight["comm"] > eight["gemm"]


def test_tp_layer_seconds_equal_the_planners_layer_rows():
    cfg, t = llama2_7b(), 4
    plan = P.Plan(ParallelConfig(tp=t), RunOptions(sequence_parallel=False))
    cluster = P.Cluster(t)
    rows = _predicted_rows(cfg, plan, P.Workload(batch=1, seq=4096), 0, t)
    layer = [r for r in rows if r.axis == "tp" and r.where in ("attn", "mlp")]
    assert len(layer) == 4 * cfg.n_layers
    link = S.links(cluster)["nvlink"]
    planner_seconds = sum(r.bytes_sent for r in layer) / cluster.intra_node_bandwidth
    planner_latency = cluster.model.latency * sum(r.count for r in layer)
    ours = cfg.n_layers * S.tp_layer_seconds(cfg, 1, 4096, t, link)["comm"]
    assert ours == pytest.approx(planner_seconds + planner_latency, rel=1e-12)


def test_sp_layer_seconds_by_hand():
    cfg = tiny()  # h = 16 in float64
    b, s, t, h, e = 2, 8, 4, 16, 8
    link = S.Link("test", alpha=1e-6, beta=1e9, source="hand")
    plain, regather = (S.sp_layer_seconds(cfg, b, s, t, link, regather=r) for r in (False, True))
    assert plain["comm_tp"] == S.tp_layer_seconds(cfg, b, s, t, link)["comm"]
    assert plain["comm_sp"] - plain["comm_tp"] == pytest.approx(4 * 1e-6)  # the same bytes in 8 messages, not 4
    gathered = 2 * (1e-6 + (t - 1) / t * b * s * h * e / 1e9)  # the backward's two all-gathers
    assert regather["comm_sp"] - plain["comm_sp"] == pytest.approx(gathered)
    cluster = P.Cluster(1)
    assert plain["elem_tp"] == pytest.approx(2 * e * b * s * h * cluster.model.c_rep / cluster.hbm_bandwidth)
    assert plain["elem_sp"] == pytest.approx(plain["elem_tp"] / t)
    assert plain["gemm"] == S.tp_layer_seconds(cfg, b, s, t, link)["gemm"]


def test_sp_elementwise_saving_is_the_planners():
    cfg, t, seq = llama2_7b(), 4, 4096
    cluster = P.Cluster(t)
    on, off = (
        P.rank_times(
            cfg, P.Plan(ParallelConfig(tp=t, pp=2), RunOptions(sequence_parallel=sp)), P.Workload(1, seq), cluster, 1
        )
        for sp in (True, False)
    )  # pipeline rank 1: half the layers and the LM head, no embedding
    x = S.sp_layer_seconds(cfg, 1, seq, t, S.links(cluster)["nvlink"], cluster)
    assert off.total - on.total == pytest.approx(cfg.n_layers // 2 * (x["elem_tp"] - x["elem_sp"]), rel=1e-12)


def test_sp_crossover_is_where_the_saving_pays_the_extra_messages():
    big = llama2_70b()
    for t in (2, 4, 8):
        tokens = S.sp_crossover_tokens(big, t, LINKS["nvlink"])
        x = S.sp_layer_seconds(big, 1, tokens, t, LINKS["nvlink"])
        assert x["comm_sp"] - x["comm_tp"] == pytest.approx(x["elem_tp"] - x["elem_sp"], rel=1e-9)
    assert 800 < S.sp_crossover_tokens(big, 8, LINKS["nvlink"]) < 900  # Llama-2-70B at t = 8: from ~850 tokens on
    with pytest.raises(ValueError, match="SP needs TP"):
        S.sp_crossover_tokens(big, 1, LINKS["nvlink"])


def test_pp_microbatches_and_seconds():
    assert S.pp_microbatches_for(8, 0.1) == 70 and S.pp_microbatches_for(8, 0.1, v=2) == 35
    assert S.pp_microbatches_for(4, 1.0) == 3 and S.pp_microbatches_for(1, 0.5) == 1
    with pytest.raises(ValueError, match="bubble=0"):
        S.pp_microbatches_for(8, 0)
    cfg = llama2_7b()
    assert S.pp_send_seconds(cfg, 1, 4096, LINKS["ib"]) == pytest.approx(20e-6 + 4096 * 4096 * 2 / 50e9)
    one = S.tp_layer_seconds(cfg, 1, 4096, 1, LINKS["nvlink"])["gemm"]
    assert S.pp_stage_seconds(cfg, 1, 4096, 4) == pytest.approx(cfg.n_layers / 4 * one)


def test_cp_ring_step_by_hand():
    cfg = llama2_70b()  # 64 query heads, 8 K/V heads of 128, bf16, causal
    link = S.Link("test", alpha=1e-6, beta=1e9, source="hand")
    out = S.cp_ring_step_seconds(cfg, 1, 8192, 4, link)
    assert out["comm"] == pytest.approx(1e-6 + 2 * 8 * 2048 * 128 * 2 / 1e9)
    assert out["core"] == pytest.approx(4 * 64 * 2048**2 * 128 / 2 / (0.6 * 989e12))
    eight = S.cp_ring_step_seconds(cfg, 1, 8192, 4, link, t=8)  # one K/V head and 8 query heads per GPU
    assert eight["core"] == pytest.approx(out["core"] / 8) and eight["comm"] == pytest.approx(
        1e-6 + 2 * 2048 * 256 / 1e9
    )


def test_cp_hiding_tokens_is_where_the_step_hides():
    cfg = llama2_70b()
    for link in LINKS.values():
        free = S.Link("no alpha", 0.0, link.beta, "")
        for t in (1, 8):
            x = S.cp_hiding_tokens(cfg, link, t=t)
            assert x == pytest.approx(8 * 2 * 0.6 * 989e12 / (64 * link.beta))
            for cp, hidden in ((int(65536 / x) + 1, False), (int(65536 / x), True)):  # s/cp just under, just over x
                step = S.cp_ring_step_seconds(cfg, 1, 65536 // cp * cp, cp, free, t=t)
                assert (step["core"] >= step["comm"]) is hidden, (link.name, cp, step)
    assert S.cp_hiding_tokens(cfg, LINKS["ib"], t=16) == pytest.approx(2 * S.cp_hiding_tokens(cfg, LINKS["ib"]))


def test_cp_core_is_the_planners():
    cfg, cp = llama2_7b(), 4
    plan = P.Plan(ParallelConfig(cp=cp), RunOptions(n_microbatches=1))
    work = P.Workload(batch=1, seq=16384)
    t = P.predict(cfg, plan, work, P.Cluster(cp)).ranks[0].times
    step = S.cp_ring_step_seconds(cfg, 1, 16384, cp, S.links()["nvlink"])
    # the planner's core: every layer's forward core (all cp steps) and its backward, twice the forward
    assert t.core == pytest.approx(3 * cfg.n_layers * cp * step["core"], rel=1e-9)


def test_ep_layer_seconds_by_hand_and_the_planners_expert_gemms():
    cfg = mixtral_8x7b()  # h = 4096, 8 experts of h_ffn = 14336, top-2, SwiGLU, bf16
    link = S.Link("test", alpha=1e-6, beta=1e9, source="hand")
    out = S.ep_layer_seconds(cfg, 4096, 8, link)
    assert out["comm"] == pytest.approx(4e-6 + 4 * 4096 * 2 * 4096 * 2 * 7 / 8 / 1e9)
    assert out["gemm"] == pytest.approx(3 * 2 * 4096 * 2 * 3 * 4096 * 14336 / (0.6 * 989e12))
    gemms = layer_gemms(cfg, 4096, 1, True, 8)  # QKV, output, the one local expert's two, the router
    flops = sum(2 * m * n * k for m, n, k in gemms[2:-1])
    assert 3 * flops / (0.6 * 989e12) == pytest.approx(out["gemm"])


def test_ep_crossover_is_where_bytes_equal_gemms():
    for cfg in (mixtral_8x7b(), deepseek_v3_like()):
        for link in LINKS.values():
            f = S.ep_crossover_ffn(cfg, 64, link)
            free = S.Link("no alpha", 0.0, link.beta, "")
            at = S.ep_layer_seconds(cfg.with_(moe=replace(cfg.moe, d_ff=round(f))), 4096, 64, free)
            assert at["comm"] == pytest.approx(at["gemm"], rel=1e-3)
    assert S.ep_crossover_ffn(deepseek_v3_like(), 64, LINKS["ib"]) > deepseek_v3_like().moe.d_ff  # comm-bound


def test_ep_bytes_and_messages_are_the_planners():
    cfg, ep = mixtral_8x7b(), 8
    plan = P.Plan(ParallelConfig(dp=ep, ep=ep), RunOptions(n_microbatches=1))
    rows = _predicted_rows(cfg, plan, P.Workload(batch=ep, seq=4096), 0, ep)
    moved = [r for r in rows if r.axis == "ep" and r.where == "dispatch+combine"]
    link = S.links()["nvlink"]
    planner_seconds = sum(r.bytes_sent for r in moved) / link.beta + link.alpha * sum(r.count for r in moved)
    ours = cfg.n_layers * S.ep_layer_seconds(cfg, 4096, ep, link)["comm"]
    assert ours == pytest.approx(planner_seconds, rel=1e-12)
