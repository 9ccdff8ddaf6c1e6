"""Megatron's fine-grained selective recomputation (`--recompute-modules`, `pylib.plan.recompute`) in the analysis:
each module stops saving exactly the tensors it names (`recompute.module_dropped_rows`), runs again the work its
formulas state, sends again the MLP's collectives under "mlp", and recomputing nothing (or the attention core
alone, Megatron's default) gives today's numbers exactly."""

from dataclasses import replace

import pytest

from pylib.analysis import activations as A
from pylib.analysis import efficiency as E
from pylib.analysis import planner as P
from pylib.analysis import recompute as R
from pylib.plan import RunOptions
from pylib.plan.config import MoEConfig
from pylib.plan.mesh import ParallelConfig as pc
from pylib.plan.presets import llama3_405b, megatron_gpt
from pylib.plan.recompute import modules_problems, recompute_modules

LLAMA = llama3_405b()  # SwiGLU, GQA
GPT = megatron_gpt(2048, 16, 8)  # GELU, MHA
MOE = GPT.with_(moe=MoEConfig(n_experts=8, top_k=2))
b, s, e = 1, 4096, 2


def _plan(tp=1, sequence_parallel=True, sp_regather=False, recompute="none", modules=None):
    """A plan of `tp` ranks: what `layer_saved_rows` reads (the mesh, SP, recomputation, Megatron's knobs)."""
    options = RunOptions(sequence_parallel=sequence_parallel, recompute=recompute)
    return P.Plan(pc(tp=tp), options, sp_regather=sp_regather, recompute_modules=modules)


def _rows(cfg, modules, layer=0, **kw):
    rc = "selective" if modules else "none"
    return A.layer_saved_rows(cfg, layer, b, s, _plan(recompute=rc, modules=modules, **kw), attention="flash")


def _saved(cfg, modules, **kw):
    return sum(_rows(cfg, modules, **kw).values())


def test_the_vocabulary_is_megatrons_and_the_unmodelled_modules_are_refused_by_name():
    assert recompute_modules("selective") == {"core_attn"} and recompute_modules("none", ("mlp",)) == frozenset()
    assert not modules_problems(("layernorm", "mlp", "core_attn", "moe_act", "moe", "shared_experts", "mla_up_proj"))
    assert any("'mhc' is not modelled" in p and "hyper-connections" in p for p in modules_problems(("mhc",)))
    assert any("'gdn_norm_out' is not modelled" in p for p in modules_problems(("gdn_norm_out",)))
    assert any("must be one of" in p for p in modules_problems(("attention",)))
    assert any("needs recompute='selective'" in p for p in modules_problems(("mlp",), "full"))
    assert any("twice" in p for p in modules_problems(("mlp", "mlp")))
    assert modules_problems(())
    with pytest.raises(ValueError, match="not modelled"):
        _rows(GPT, ("mhc",))
    bad = P.Plan(pc(tp=2, dp=2), RunOptions(recompute="full"), recompute_modules=("mlp",))
    assert any("needs recompute='selective'" in p for p in P.problems(GPT, bad, 4, 8, 64))


def test_recomputing_nothing_or_the_core_alone_is_todays_numbers():
    for cfg in (LLAMA, GPT, MOE):
        for kw in (dict(tp=8, sequence_parallel=True, sp_regather=True), dict(tp=2), dict()):
            assert _rows(cfg, None, **kw) == A.layer_saved_rows(cfg, 0, b, s, _plan(**kw), attention="flash")
            core = _rows(cfg, ("core_attn",), **kw)
            selective = _plan(recompute="selective", **kw)
            assert core == A.layer_saved_rows(cfg, 0, b, s, selective, attention="flash")
    plan = P.Plan(
        pc(tp=8, dp=8), RunOptions(sequence_parallel=True, n_microbatches=4, recompute="selective"), sp_regather=True
    )
    work, cluster = P.Workload(256, 4096), P.Cluster(64)
    same = replace(plan, recompute_modules=("core_attn",))
    a, c = P.predict(GPT, plan, work, cluster), P.predict(GPT, same, work, cluster)
    assert (a.step_time, a.peak_memory) == (c.step_time, c.peak_memory)
    assert P.canonical(same) == plan and same.run_options == plan.run_options


def test_layernorm_drops_the_norms_outputs_where_the_norm_is_its_own_module():
    """Without SP the QKV and MLP GEMMs save the norms' outputs, e b s h each; under SP pylib's GEMMs keep the
    gathered copy and Megatron's layer fuses the norms into them: nothing; a MoE layer's second norm feeds the
    router, whose saved input it is, always."""
    h = GPT.d_model
    assert _saved(GPT, None) - _saved(GPT, ("layernorm",)) == 2 * e * b * s * h
    assert (
        _saved(GPT, None, tp=2, sequence_parallel=False) - _saved(GPT, ("layernorm",), tp=2, sequence_parallel=False)
        == 2 * e * b * s * h
    )  # TP: the same rows
    megatron = dict(tp=8, sequence_parallel=True, sp_regather=True)
    assert _saved(LLAMA, ("layernorm",), **megatron) == _saved(LLAMA, None, **megatron)
    assert _saved(GPT, ("layernorm",), tp=2, sequence_parallel=True) == _saved(GPT, None, tp=2, sequence_parallel=True)
    moe = dict(tp=2, sequence_parallel=True, sp_regather=True)
    tokens = b * s // 2  # the MoE layer works on the SP shard
    assert _saved(MOE, None, **moe) - _saved(MOE, ("layernorm",), **moe) == e * tokens * h
    assert "router input [T, h]" not in _rows(MOE, ("layernorm",), **moe)


def test_mlp_drops_the_hidden_rows_and_in_megatrons_layer_the_fused_norms_output_and_statistics():
    h, t = LLAMA.d_model, 8
    f = LLAMA.d_ff // t
    megatron = dict(tp=t, sequence_parallel=True, sp_regather=True)
    kept = _rows(LLAMA, ("mlp",), **megatron)
    dropped = _saved(LLAMA, None, **megatron) - sum(kept.values())
    # fc1's [s, 2f] output and fc2's [s, f] input, fc1's saved input [s/t, h], LN2's mean and 1/std [s/t] x 2
    assert dropped == 3 * e * b * s * f + e * b * (s // t) * h + 2 * e * b * (s // t)
    assert "MLP hidden" not in kept and "MLP input (LN2 output)" not in kept
    assert kept["LayerNorm inputs (LN1, LN2)"] == 2 * e * b * (s // t) * h  # LN2's input: the checkpoint's
    # pylib's layer: GELU's input and output [s, 4h/t]; the MLP's input (LN2's output) is the checkpoint's
    assert (
        _saved(GPT, None, tp=2, sequence_parallel=False) - _saved(GPT, ("mlp",), tp=2, sequence_parallel=False)
        == 2 * e * b * s * GPT.d_ff // 2
    )
    assert _saved(MOE, ("mlp",), layer=0) == _saved(MOE, None, layer=0)  # a MoE layer has no dense MLP


def test_moe_act_drops_the_activations_outputs_and_keeps_fc1s():
    rows = A.expected_expert_rows(b * s, MOE.moe.top_k)
    assert _saved(MOE, None) - _saved(MOE, ("moe_act",)) == e * rows * MOE.d_ff  # GELU: its output of 2
    swiglu = MOE.with_(mlp="swiglu")
    assert _saved(swiglu, None) - _saved(swiglu, ("moe_act",)) == 2 * e * rows * MOE.d_ff  # silu(gate x), product
    assert _saved(GPT, ("moe_act",)) == _saved(GPT, None)


def test_the_modules_rerun_their_forward_and_mlp_its_collectives():
    t, T = 8, b * s
    f = LLAMA.d_ff // t
    assert R.module_extra_flops(LLAMA, b, s, t, {"core_attn"}) == R.extra_forward_flops(LLAMA, b, s, t, "selective")
    assert R.module_extra_flops(LLAMA, b, s, t, {"mlp"}) == 2 * T * LLAMA.d_model * f * 3  # fc1 [h, 2f], fc2
    assert R.module_extra_flops(LLAMA, b, s, t, {"mlp"}, moe_layer=True) == 0
    norm = 2 * e * (T // t) * LLAMA.d_model  # read the input, write the output, [s/t, h]
    kw = dict(sequence_parallel=True, sp_regather=True)
    assert R.module_extra_hbm_bytes(LLAMA, b, s, t, {"mlp"}, **kw) == norm  # Megatron's fused LN2
    assert R.module_extra_hbm_bytes(LLAMA, b, s, t, {"layernorm"}, **kw) == 0
    assert R.module_extra_hbm_bytes(GPT, b, s, 1, {"layernorm"}) == 2 * 2 * e * T * GPT.d_model
    ops = R.module_extra_collectives(LLAMA, b, s, t, {"mlp"}, sequence_parallel=True)
    assert [(c.op, c.where) for c in ops] == [("all_gather", "mlp"), ("reduce_scatter", "mlp")]
    assert [c.op for c in R.module_extra_collectives(LLAMA, b, s, t, {"mlp"})] == ["all_reduce"]


def test_a_plan_with_mlp_recomputed_costs_its_formulas_in_time_and_traffic():
    work, cluster = P.Workload(256, 4096), P.Cluster(64)
    base = P.Plan(pc(tp=8, dp=8), RunOptions(sequence_parallel=True, n_microbatches=4), sp_regather=True)
    mlp = replace(base.with_options(recompute="selective"), recompute_modules=("mlp",))
    t0, t1 = (P.rank_times(GPT, p, work, cluster, 0) for p in (base, mlp))
    bs = base.micro_batch(work.batch)
    flops = GPT.n_layers * R.module_extra_flops(GPT, bs, 4096, 8, {"mlp"})
    hbm = GPT.n_layers * R.module_extra_hbm_bytes(GPT, bs, 4096, 8, {"mlp"}, sequence_parallel=True, sp_regather=True)
    model = E.CostModel()
    assert t1.backward - t0.backward == pytest.approx(flops / (model.eta * 989e12) + hbm / 3.35e12)
    assert t1.forward == t0.forward
    again = P.module_traffic_rows(GPT, mlp, work.batch, work.seq, 0)
    assert {(r.phase, r.op, r.count) for r in again} == {
        ("recompute", o, 4 * GPT.n_layers) for o in ("all_gather", "reduce_scatter")
    }
    rows0, rows1 = (P.rank_traffic_rows(GPT, p, work.batch, work.seq, 0) for p in (base, mlp))
    assert rows1 == rows0 + again and not P.module_traffic_rows(GPT, base, work.batch, work.seq, 0)
    assert mlp.run_options.recompute.granularity == "none" and mlp.describe().endswith("recompute=selective/mlp")
    a0, a1 = (P.rank_memory(GPT, p, work, 0)["activations"] for p in (base, mlp))
    assert a1 < a0


def test_the_search_varies_only_the_modules_that_change_something():
    one = P.SearchSpace(micro_batch_sizes=(1,), zero_stages=(0,), sequence_parallel=(True,))
    choices = (
        "none",
        ("selective", ("layernorm",)),
        ("selective", ("mlp",)),
        ("selective", ("layernorm", "core_attn")),
    )
    plans = P.enumerate_plans(GPT, 8, 8, 256, replace(one, meshes=(pc(tp=8),), recompute=choices, sp_regather=True))
    # under Megatron's SP a dense layer's norms are fused: "layernorm" is the plan without it
    assert sorted(p.describe() for p in plans) == sorted(
        [
            "tp8 SP regather m=8",
            "tp8 SP regather m=8 recompute=selective/mlp",
            "tp8 SP regather m=8 recompute=selective",
        ]
    )
    flat = P.enumerate_plans(
        GPT, 8, 8, 256, P.SearchSpace(meshes=(pc(dp=8),), recompute=choices, micro_batch_sizes=(1,))
    )
    assert {p.recompute_modules for p in flat} == {None, ("layernorm",), ("mlp",), ("layernorm", "core_attn")}
