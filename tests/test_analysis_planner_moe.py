"""The planner for MoE models: Megatron's selective recomputation modules for MoE layers ("moe", "moe_act",
"shared_experts", "mla_up_proj", "layernorm") priced from the same activation rows the rank runs measure, a
routing-imbalance factor, shared experts, the dispatcher as a plan choice, and DeepSeek-V3's published layout."""

from dataclasses import replace

import pytest

from pylib.analysis import activations as A
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
