"""FP8 in the planner: the GEMM roofline at the FP8 peak, only the linear layers in FP8, the quantize cost, the FP8
weight copies from `analysis.fp8`, the FP8 parameter all-gather, and the one new constant fitted on published FP8
runs with rows held out."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pylib.analysis import calibration as C
from pylib.analysis import planner as P
from pylib.analysis.efficiency import ETA_FP8, CostModel, Fp8Compute, layer_gemms
from pylib.analysis.fp8 import fp8_weight_bytes
from pylib.plan import RunOptions
from pylib.plan.options import Fp8Recipe, MixedPrecision
from pylib.plan.presets import llama2_7b
from pylib.runtime import ParallelConfig

CFG = llama2_7b()
PLAN = P.Plan(ParallelConfig(tp=2, dp=4), RunOptions(n_microbatches=4, zero_stage=1))
WORK = P.Workload(64, 4096)
FP8 = replace(WORK, fp8=Fp8Recipe("delayed"))
CLUSTER = P.Cluster(8)


def times(work, cluster=CLUSTER):
    return P.rank_times(CFG, PLAN, work, cluster, 0)


def test_fp8_makes_only_the_linear_gemms_faster_at_the_fp8_peak():
    bf16, fp8 = times(WORK), times(FP8)
    assert fp8.total < bf16.total
    assert fp8.core == bf16.core  # the attention core stays in bf16
    # At a FP8 peak no higher than the bf16 one, with FP8's own efficiency set to bf16's, FP8 is only slower: the
    # GEMMs are the same and the casts are added.
    same = replace(CLUSTER, fp8_peak_flops=CLUSTER.peak_flops, model=CostModel(eta_fp8=CostModel().eta))
    assert times(FP8, same).total > times(WORK, same).total


def test_first_and_last_layers_in_bf16_cost_two_layers_of_fp8_savings():
    fp8, ends = times(FP8), times(replace(FP8, fp8=Fp8Recipe("delayed", first_last_layers_bf16=True)))
    bf16 = times(WORK)
    per_layer = (bf16.total - fp8.total) / CFG.n_layers
    assert ends.total - fp8.total == pytest.approx(2 * per_layer, rel=1e-9)


def test_current_scaling_reads_each_cast_operand_once_more_than_delayed():
    c = Fp8Compute(Fp8Recipe("delayed"), 1.0)
    assert c.quantize_bytes(10, 2) == 10 * (2 + 2)
    assert Fp8Compute(Fp8Recipe("tensorwise"), 1.0).quantize_bytes(10, 2) == 10 * (2 * 2 + 2)
    delayed, current = times(FP8), times(replace(FP8, fp8=Fp8Recipe("tensorwise")))
    tokens = WORK.batch // (PLAN.par.dp * 4) * 4096
    extra = sum(m * k + m * n for m, n, k in layer_gemms(CFG, tokens, 2, False)) * 2 * CFG.n_layers
    assert current.total - delayed.total == pytest.approx(extra / CLUSTER.hbm_bandwidth, rel=1e-9)


def test_fp8_weight_copies_are_analysis_fp8s_bytes_of_every_linear_but_the_head():
    mem = P.rank_memory(CFG, PLAN, FP8, 0, 8)
    shapes = P.fp8_weight_shapes(CFG, PLAN, 0)
    assert len(shapes) == 4 * CFG.n_layers  # fused QKV, W_O, fused gate+up, down: the GEMMs Megatron runs
    recipe = MixedPrecision("bfloat16", grad_reduce="bfloat16", fp8=FP8.fp8)
    assert mem["fp8"] == sum(fp8_weight_bytes(n, k, recipe) for n, k in shapes)
    assert mem["total"] == P.rank_memory(CFG, PLAN, WORK, 0, 8)["total"] + mem["fp8"]
    z3 = PLAN.with_options(zero_stage=3)
    assert P.rank_memory(CFG, z3, FP8, 0, 8)["fp8"] == 3 * (4 * 16 + 4) * len(shapes)  # amax histories only


def test_fp8_param_gather_halves_the_fp8_linears_share_of_zero3s_gathers():
    z3 = PLAN.with_options(zero_stage=3)
    plain = P.predict(CFG, z3, FP8, CLUSTER).traffic_by_axis()["dp-cp"]
    in_fp8 = replace(FP8, fp8=Fp8Recipe("delayed", param_gather=True))
    gathered = P.predict(CFG, z3, in_fp8, CLUSTER).traffic_by_axis()["dp-cp"]
    assert 0.5 * plain < gathered < plain
    assert P.fp8_entry("layers.3.attn.q_proj.weight", 32) and P.fp8_entry("layers.3.mlp", 32)
    assert not P.fp8_entry("layers.3.ln1.weight", 32) and not P.fp8_entry("lm_head.weight", 32)
    assert not P.fp8_entry("layers.31.mlp", 32, first_last_layers_bf16=True)


def test_workload_refuses_fp8_without_mixed_precision():
    with pytest.raises(ValueError, match="precision='mixed'"):
        P.Workload(8, 128, precision="uniform", fp8=Fp8Recipe())


def test_fp8_rows_are_the_published_tokens_in_megatron_flops():
    run = C.FP8_RUNS[0]
    assert run.tflops == pytest.approx(16934 * C.megatron_flops(run.cfg, 1, 4096) / 4096 / 1e12)
    assert C.FP8_FIT_ROWS and C.FP8_HOLDOUT_ROWS and set(C.FP8_FIT_ROWS).isdisjoint(C.FP8_HOLDOUT_ROWS)


@pytest.mark.slow
def test_eta_fp8_is_the_fit_on_the_fit_rows_and_the_holdout_error_is_stated():
    model, worst = C.fit_fp8()
    assert model.eta_fp8 == ETA_FP8 == CostModel().eta_fp8
    assert worst < 0.05
    assert max(abs(x) for x in C.fp8_errors(model, C.FP8_HOLDOUT_ROWS)) < 0.15
