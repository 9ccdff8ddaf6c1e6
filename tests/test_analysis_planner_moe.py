"""The planner for MoE models: Megatron's selective recomputation modules for MoE layers ("moe", "moe_act",
"shared_experts", "mla_up_proj", "layernorm") priced from the same activation rows the rank runs measure, a
routing-imbalance factor, shared experts, the dispatcher as a plan choice, and DeepSeek-V3's published layout."""

from dataclasses import replace

import pytest

from pylib.analysis import activations as A
from pylib.analysis import efficiency as E
from pylib.analysis import planner as P
from pylib.analysis import recompute as R
from pylib.plan import RunOptions
from pylib.plan.config import MoEConfig
from pylib.plan.mesh import ParallelConfig as pc
from pylib.plan.presets import megatron_gpt, tiny

GPT_MOE = megatron_gpt(2048, 16, 8).with_(moe=MoEConfig(n_experts=8, top_k=2))
SWIGLU_MOE = GPT_MOE.with_(mlp="swiglu", moe=MoEConfig(n_experts=8, top_k=2, d_ff=1024, n_shared_experts=1))
b, s = 1, 4096
WORK, CLUSTER = P.Workload(256, 4096), P.Cluster(64)


def _plan(par=None, modules=None, recompute="selective", sp_regather=True, **options):
    o = RunOptions(sequence_parallel=True, n_microbatches=4, recompute=recompute, **options)
    return P.Plan(par or pc(tp=2, ep=8, dp=32), o, sp_regather=sp_regather, recompute_modules=modules)


def _layer(cfg, modules, layer=0, **kw):
    return A.layer_saved_rows(cfg, layer, b, s, _plan(modules=modules, **kw), attention="flash")


# ------------------------------------------------------------------------------------------------ recomputation


def test_a_moe_model_is_priced_with_selective_recomputation_and_refused_with_full_by_name():
    cfg = GPT_MOE
    plan = _plan()
    assert not P.problems(cfg, plan, 64, 256, 4096)
    got = P.predict(cfg, plan, WORK, CLUSTER)
    assert got.step_time > 0 and got.fits in (True, False)
    full = _plan(recompute="full")
    bad = P.problems(cfg, full, 64, 256, 4096)
    assert any("recompute='full' with MoE layers is not priced" in p for p in bad), bad
    with pytest.raises(ValueError, match="not priced"):
        P.predict(cfg, full, WORK, CLUSTER)


def test_the_moe_module_keeps_only_the_layers_input_and_reruns_router_experts_and_dispatch():
    cfg = GPT_MOE
    plain, whole = _layer(cfg, None), _layer(cfg, ("core_attn", "moe"))
    moe_items = set(A.moe_saved_rows(cfg, b * s // 2))
    kept = {k for k in whole if k in moe_items}
    assert kept == {"router input [T, h]"}
    assert sum(plain.values()) - sum(whole.values()) > 0
    # moe_act inside "moe" changes nothing
    assert _layer(cfg, ("core_attn", "moe", "moe_act")) == whole
    # the expert axes' forward rows sent again, at the same bytes, in phase "recompute"
    plan = _plan(modules=("core_attn", "moe"))
    rows = P.rank_traffic_rows(cfg, plan, 256, 4096, 0)
    fwd = sum(r.bytes_sent for r in rows if r.axis == "ep" and r.phase == "forward")
    again = sum(r.bytes_sent for r in rows if r.axis == "ep" and r.phase == "recompute")
    assert fwd > 0 and again == fwd
    # and it costs time: router, experts again (more than the activation alone)
    t = {m: P.rank_times(cfg, _plan(modules=("core_attn", m)), WORK, CLUSTER, 0).backward for m in ("moe", "moe_act")}
    assert t["moe"] > t["moe_act"]
    rows_one = A.expected_expert_rows(b * s // 2, 2)
    flops = R.module_extra_flops(cfg, b, s, 2, ("moe",), moe_layer=True, expert_rows=rows_one, sequence_parallel=True)
    h, f = cfg.d_model, cfg.moe.d_ff or cfg.d_ff
    assert flops == 2 * b * (s // 2) * 8 * h + 2 * rows_one * h * f * 2


def test_shared_experts_module_drops_the_shared_rows_and_resends_their_tp_collectives():
    cfg = SWIGLU_MOE
    plain = _layer(cfg, ("core_attn",), sp_regather=False)
    shared = {k: v for k, v in plain.items() if k.startswith("shared experts")}
    assert shared and all(v > 0 for v in shared.values())
    dropped = _layer(cfg, ("core_attn", "shared_experts"), sp_regather=False)
    assert sum(plain.values()) - sum(dropped.values()) == sum(shared.values())
    plan = replace(_plan(modules=("core_attn", "shared_experts")), sp_regather=False)
    rows = [r for r in P.module_traffic_rows(cfg, plan, 256, 4096, 0) if r.where == "shared_experts.recompute"]
    assert {r.op for r in rows} == {"all_gather", "reduce_scatter"}
    # a model without shared experts: the module changes nothing and the search drops it
    assert R.modules_with_effect(GPT_MOE, ("shared_experts",), True) == ()
    assert R.modules_with_effect(cfg, ("shared_experts",), True) == ("shared_experts",)


def test_mla_up_proj_drops_the_cores_q_k_v_and_reruns_the_qkv_gemm():
    cfg = GPT_MOE
    for modules in (("core_attn",), ("layernorm",)):
        a, c = _layer(cfg, modules), _layer(cfg, modules + ("mla_up_proj",))
        assert sum(a.values()) - sum(c.values()) == R.core_input_bytes(cfg, b, s, 2)
    extra = R.module_extra_flops(cfg, b, s, 2, ("mla_up_proj",))
    assert extra == 2 * b * s * cfg.d_model * 3 * (cfg.n_heads // 2) * cfg.d_head


@pytest.mark.slow
def test_selective_recomputation_of_a_moe_model_sends_what_the_planner_predicts_on_real_ranks():
    """A real composed run (ring CP recomputes its core passes in every layer, the MoE layers included): the
    tracer's bytes per axis equal the planner's on the run's own routing."""
    from pylib.experiments.plan_runs import measure_plans
    from pylib.viz.planner import compare

    cfg = tiny().with_(position="rope", moe=MoEConfig(n_experts=4, top_k=2))
    plan = P.Plan(pc(cp=2, dp=2, ep=2), RunOptions(cp_kind="ring", recompute="selective", zero_stage=1))
    assert not P.problems(cfg, plan, 4, 8, 16)
    records = measure_plans(cfg, [plan], batch=8, seq=16)[plan]
    checks = [c for c in compare(cfg, plan, records, batch=8, seq=16) if "sent on" in c.quantity]
    assert checks and all(c.predicted == c.measured for c in checks), [c for c in checks if c.predicted != c.measured]
    assert any(c.quantity == "sent on cp" and c.measured for c in checks)


# ------------------------------------------------------------------------------------------------ routing imbalance


def _ep_plan(**kw):
    return P.Plan(pc(ep=8, dp=64), RunOptions(n_microbatches=4, zero_stage=1), **kw)


def test_an_imbalance_factor_scales_the_busiest_ranks_expert_gemms_dispatch_and_rows_and_nothing_else():
    cfg, f = GPT_MOE, 1.5
    uniform, skewed = _ep_plan(), _ep_plan(routing_imbalance=f)
    work, cluster = P.Workload(512, 4096), P.Cluster(64)
    a, c = P.predict(cfg, uniform, work, cluster), P.predict(cfg, skewed, work, cluster)
    ep_a, ep_c = a.traffic_by_axis()["ep"], c.traffic_by_axis()["ep"]
    counts = [r.bytes_sent for r in P.rank_traffic_rows(cfg, uniform, 512, 4096, 0) if r.where == "counts"]
    assert ep_c - sum(counts) == pytest.approx(f * (ep_a - sum(counts)))  # the rows scale, the count exchange not
    assert c.traffic_by_axis()["dp-cp"] == a.traffic_by_axis()["dp-cp"]
    assert c.ranks[0].times.forward > a.ranks[0].times.forward
    t = 4096 * 512 // 64 // 4  # tokens per microbatch on a rank
    gemms, skew = (E.layer_gemms(cfg, t, 1, True, 8, imbalance=x) for x in (1.0, f))
    assert [g[0] for g in skew[2:-1]] == [f * g[0] for g in gemms[2:-1]] and skew[:2] == gemms[:2]
    assert c.peak_memory > a.peak_memory
    assert "imbalance=1.50" in skewed.describe()
    with pytest.raises(ValueError, match="routing_imbalance"):
        _ep_plan(routing_imbalance=0.9)
    assert P.problems(megatron_gpt(2048, 16, 8), P.Plan(pc(dp=8), routing_imbalance=1.2), 8, 8, 64)


@pytest.mark.slow
def test_the_factor_from_a_measured_training_run_is_its_worst_layers_max_over_mean():
    from pylib.ep.balance import train_balance

    run = train_balance(MoEConfig(n_experts=8, top_k=2), steps=3, batch=4, seq=8)
    f = run.routing_imbalance(last=2)
    assert f == pytest.approx(sum(run.worst()[-2:]) / 2) and 1 <= f <= 8 / 2
    plan = _ep_plan(routing_imbalance=f)
    assert P.predict(GPT_MOE, plan, WORK, P.Cluster(64)).step_time > 0
    with pytest.raises(ValueError, match="between 1 and the run's 3 steps"):
        run.routing_imbalance(last=4)


# ---------------------------------------------------------------------------------------- shared experts, dispatchers


def test_shared_experts_add_their_weights_flops_and_tp_collectives():
    plain = SWIGLU_MOE.with_(moe=replace(SWIGLU_MOE.moe, n_shared_experts=0))
    cfg = SWIGLU_MOE
    plan = _plan(par=pc(tp=2, ep=8, dp=32), recompute="none")
    assert not P.problems(cfg, plan, 64, 256, 4096)  # the composed model runs them; the planner prices them
    a, c = P.predict(plain, plan, WORK, CLUSTER), P.predict(cfg, plan, WORK, CLUSTER)
    h, f_s = cfg.d_model, R.shared_ff(cfg)
    layers = cfg.n_layers
    assert c.ranks[0].memory["params"] - a.ranks[0].memory["params"] == 2 * layers * 3 * h * (f_s // 2)
    assert c.model_flops - a.model_flops == 3 * 2 * 256 * 4096 * layers * 3 * h * f_s
    rows = P.shared_expert_rows(cfg, plan, 256, 4096, 0)
    assert {(r.phase, r.op) for r in rows} == {
        ("forward", "all_gather"),
        ("forward", "reduce_scatter"),
        ("backward", "all_gather"),
        ("backward", "reduce_scatter"),
    }
    assert c.traffic_by_axis()["tp"] == a.traffic_by_axis()["tp"] + sum(r.bytes_sent for r in rows)
    odd = cfg.with_(moe=replace(cfg.moe, d_ff=1023))
    assert any("shared experts' h_ffn=1023" in p for p in P.problems(odd, plan, 64, 256, 4096))


def test_the_dispatcher_is_a_plan_choice_priced_by_the_ep_formulas_and_the_crossover_holds():
    cfg = GPT_MOE  # k = 2
    h, e, ep = cfg.d_model, 2, 8
    T = 4096 * 512 // 64 // 4
    for k in (2, 8):
        c = cfg.with_(moe=replace(cfg.moe, top_k=k))
        sent = {}
        for d in ("alltoall", "allgather"):
            plan = _ep_plan(dispatcher=d)
            rows = [r for r in P.rank_traffic_rows(c, plan, 512, 4096, 0) if r.axis == "ep" and r.where != "counts"]
            sent[d] = sum(r.bytes_sent for r in rows)
        n = 4 * c.n_layers  # microbatches x MoE layers
        forward = P.ep_analysis.dispatcher_bytes("allgather", T, k, h, e, ep)["total"]
        ids = (ep - 1) * T * k * 8  # the int64 expert ids: gathered forward, no gradient to send back
        assert sent["allgather"] == n * (2 * forward - ids)
        cheaper = "allgather" if k > P.ep_analysis.dispatcher_crossover_top_k(h, e, ep) else "alltoall"
        assert min(sent, key=sent.get) == cheaper
    space = P.SearchSpace(meshes=(pc(ep=8, dp=64),), zero_stages=(1,), dispatchers=("alltoall", "allgather"))
    plans = P.enumerate_plans(GPT_MOE, 64, 64, 4096, space)
    assert {p.dispatcher for p in plans} == {"alltoall", "allgather"}
    assert any("allgather-dispatch" in p.describe() for p in plans)


def test_the_all_gather_dispatcher_with_etp_is_priced_on_the_etp_ep_grid_and_searched():
    """etp = 2: the gathers run over the etp x ep grid (axis "etp-ep", n = 8), priced by `ep.dispatcher_bytes` at
    the link its groups cross; a search over both dispatchers with etp 2 ranks such plans."""
    cfg, h, e, k = GPT_MOE, GPT_MOE.d_model, 2, GPT_MOE.moe.top_k
    plan = P.Plan(
        pc(tp=2, ep=4, etp=2, dp=32), RunOptions(sequence_parallel=True, n_microbatches=4), dispatcher="allgather"
    )
    assert not P.problems(cfg, plan, 64, 512, 4096)
    rows = P.rank_traffic_rows(cfg, plan, 512, 4096, 0)
    grid = [r for r in rows if r.axis == "etp-ep"]
    T = 512 // 32 // 4 * 4096 // 2  # the tokens of one microbatch on one rank: b s / tp under SP
    forward = P.ep_analysis.dispatcher_bytes("allgather", T, k, h, e, 4, 2)["total"]
    ids = (8 - 1) * T * k * 8
    assert sum(r.bytes_sent for r in grid) == 4 * cfg.n_layers * (2 * forward - ids)
    assert not [r for r in rows if r.axis in ("ep", "etp")]  # the grid's gathers replace both
    for gpus_per_node, intra in ((8, True), (4, False)):  # tp-ep spans ranks 0..7 (order tp-cp-ep-dp-pp)
        cluster = P.Cluster(64, gpus_per_node=gpus_per_node)
        got = P.predict(cfg, plan, WORK, cluster)
        assert got.intra_node["etp-ep"] is intra
        assert got.ranks[0].exposed["etp-ep"] > 0
        assert P.comm_lower_bound(cfg, plan, WORK, cluster) <= got.comm_time
    # k = 8, past the crossover (about 4 here, whatever etp): a search over both dispatchers ranks the grid's first
    wide = cfg.with_(moe=replace(cfg.moe, top_k=8))
    assert P.ep_analysis.dispatcher_crossover_top_k(h, e, 4) < 8
    space = P.SearchSpace(meshes=(plan.par,), zero_stages=(1,), dispatchers=("alltoall", "allgather"))
    plans = P.enumerate_plans(wide, 64, 64, 4096, space)
    assert {p.dispatcher for p in plans} == {"alltoall", "allgather"}
    ranked = P.rank_plans(wide, P.Workload(64, 4096), CLUSTER, top=len(plans), plans=plans)
    assert len(ranked) == len(plans) and ranked[0].plan.dispatcher == "allgather" and ranked[0].plan.par.etp == 2
    assert "allgather-dispatch" in ranked[0].plan.describe()
    assert min(r.step_time for r in ranked if r.plan.dispatcher == "alltoall") > ranked[0].step_time


@pytest.mark.slow
def test_the_all_gather_dispatcher_with_etp_sends_on_the_grid_what_the_planner_predicts_on_real_ranks():
    """A real composed run, 4 ranks, tp = etp = 2, ep = 2, the all-gather dispatcher with SP: the tracer's bytes
    per axis, "etp-ep" included, equal the planner's on every rank."""
    from pylib.experiments.plan_runs import measure_plans
    from pylib.viz.planner import compare

    cfg = tiny().with_(position="rope", moe=MoEConfig(n_experts=4, top_k=2, dispatcher="allgather"))
    plan = P.Plan(pc(tp=2, dp=2, ep=2, etp=2), RunOptions(sequence_parallel=True, zero_stage=1, n_microbatches=2))
    assert not P.problems(cfg, plan, 4, 8, 16)
    records = measure_plans(cfg, [plan], batch=8, seq=16)[plan]
    checks = [c for c in compare(cfg, plan, records, batch=8, seq=16) if "sent on" in c.quantity]
    assert checks and all(c.predicted == c.measured for c in checks), [c for c in checks if c.predicted != c.measured]
    grid = [c for c in checks if c.quantity == "sent on etp-ep"]
    assert len(grid) == 4 and all(c.measured > 0 for c in grid)
    assert not any(c.quantity in ("sent on ep", "sent on etp") and c.measured for c in checks)


# ------------------------------------------------------------------------------------------------ published MoE runs


def test_the_published_mixtral_row_is_predicted_within_20_percent_with_the_dense_constants():
    from pylib.analysis import calibration as C

    (run,) = C.MOE_RUNS
    ev = C.evaluate(run)
    assert abs(ev.error) < 0.2, ev.error
    assert ev.plan.fits and ev.plan.plan.par == pc(ep=8, dp=16, pp=4)
    assert ev.plan.plan.options.v == 8 and ev.plan.plan.micro_batch(run.batch) == 1  # the README's VP and MBS


def test_deepseek_v3s_layout_is_accepted_broken_down_and_compared_with_its_gpu_hours():
    from pylib.analysis import calibration as C
    from pylib.plan.presets import deepseek_v3

    check = C.moe_layout_check()
    lay = check.layout
    assert check.report.plan.par == lay.par and check.report.plan.ep_overlap
    assert check.report.plan.modules == {"layernorm", "mla_up_proj"}
    fit = check.fitting
    assert fit is not None and fit.fits and fit.peak_memory <= 0.9 * C.H800["gpu_memory"]
    for x in (check.report, fit):
        for r in x.ranks:
            m = r.memory
            assert m["total"] == m["params"] + m["grads"] + m["optim"] + m["activations"] + m["gathered"]
    hours = check.gpu_hours_per_trillion(fit)
    assert hours == pytest.approx(lay.gpus * fit.step_time / 3600 / (lay.batch * lay.seq) * 1e12)
    assert check.gap(fit) == pytest.approx(hours / 180e3 - 1)
    # MLA beside its stand-in, by hand: 7168 x 1536 + 1536 x 128 x 192 + 7168 x 576 + 512 x 128 x 256 + 128 x 128 x 7168
    f = C.mla_flops_per_token(deepseek_v3(), 4096)
    assert f["mla"]["projections"] == 187_105_280 and f["stand_in"]["projections"] == 4 * 7168 * 7168
    assert f["mla"]["core"] / f["stand_in"]["core"] == pytest.approx(320 / 112)


def test_ep_overlap_hides_the_all_to_alls_behind_compute_and_charges_their_contention():
    plan = P.Plan(pc(ep=8, dp=64), RunOptions(n_microbatches=4, zero_stage=1))
    cluster = P.Cluster(64, intra_node_bandwidth=5e8)  # slow links: EP longer than the compute
    a, c = (P.predict(GPT_MOE, replace(plan, ep_overlap=x), P.Workload(512, 4096), cluster) for x in (False, True))
    ea, ec = a.ranks[0].exposed, c.ranks[0].exposed
    compute = 4 * a.ranks[0].times.total
    assert ea["ep"] > compute and ec["ep"] == pytest.approx(ea["ep"] - compute)
    assert ec["contention"] > ea["contention"] and c.step_time < a.step_time
    assert "EP-overlap" in replace(plan, ep_overlap=True).describe()


def test_the_search_bound_leaves_out_the_all_to_alls_ep_overlap_can_hide():
    """`comm_lower_bound` must stay at or under what `predict` exposes, or `rank_plans` skips a plan that could win.
    With ep_overlap and links at 20 GB/s the all-to-alls (0.37 s a step) hide entirely under the other microbatch's
    compute (0.42 s): the bound counts none of them (it counted them in full: 0.37 s against the plan's whole exposed
    communication, 0.17 s)."""
    plan = P.Plan(pc(ep=8, dp=64), RunOptions(n_microbatches=4, zero_stage=1), ep_overlap=True)
    cluster = P.Cluster(64, intra_node_bandwidth=2e10, inter_node_bandwidth=2e10)
    got = P.predict(GPT_MOE, plan, P.Workload(512, 4096), cluster)
    assert got.ranks[0].exposed["ep"] == 0
    assert P.comm_lower_bound(GPT_MOE, plan, P.Workload(512, 4096), cluster) <= got.comm_time
