"""The planner's `Workload.storage`: DeepSeek-V3's own activation storage (technical report 3.3.3) priced in memory
(`activations.storage_rows`, the rows `pylib.model.v3_storage` and `unpermute(fused=True)` measure in
tests/test_v3_storage.py) and in time (`efficiency.storage_hbm_bytes`), DualPipe's in-flight count beside the
planner's 1F1B, and what it all says of DeepSeek-V3's published layout; and one choice of ours beside the report's,
"gate_in_expert" (the combine weights applied in the experts, tests/test_v3_gate.py), priced the same ways."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pylib.analysis import activations as A
from pylib.analysis import calibration as C
from pylib.analysis import planner as P
from pylib.analysis.efficiency import gate_hbm_bytes, storage_hbm_bytes
from pylib.analysis.pp import split_live_counts
from pylib.plan.options import Fp8Recipe
from pylib.plan.presets import deepseek_v3

BLOCKWISE = Fp8Recipe("blockwise")


def test_the_workload_refuses_unknown_repeated_or_fp8_less_storage_by_name():
    with pytest.raises(ValueError, match="storage"):
        P.Workload(8, 128, storage=("e5m6_everything",))
    with pytest.raises(ValueError, match="storage"):
        P.Workload(8, 128, storage=("fused_unpermute", "fused_unpermute"))
    with pytest.raises(ValueError, match="needs Workload.fp8"):
        P.Workload(8, 128, storage=("swiglu_fp8",))
    assert P.Workload(8, 128, storage=["fused_unpermute"]).storage == ("fused_unpermute",)
    with pytest.raises(ValueError, match="not among"):
        A.layer_saved_rows(deepseek_v3(), 5, 1, 4096, C.moe_layout_check().report.plan, storage=("x",))


def _rows(storage, fp8=BLOCKWISE):
    check = C.moe_layout_check()
    return A.layer_saved_rows(check.cfg, 5, 1, 4096, check.report.plan, attention="flash", fp8=fp8, storage=storage)


def test_each_choice_replaces_exactly_its_rows():
    cfg = deepseek_v3()
    base = _rows(())
    T, k, h = 4096, cfg.moe.top_k, cfg.d_model
    R, f, f_s = T * k, cfg.moe.d_ff, cfg.moe.n_shared_experts * cfg.moe.d_ff
    # the weighted copy of the expert outputs goes
    fused = _rows(("fused_unpermute",))
    assert sum(base.values()) - sum(fused.values()) == T * k * h * 2
    # W_O's input: its FP8 copy becomes E5M6, 1.5 bytes an element and a byte per 1 x 128 tile
    e5m6 = _rows(("attn_out_e5m6",))
    assert e5m6["W_O input (attention output) [E5M6]"] == T * h * 3 // 2 + T * h // 128
    assert "W_O input (attention output) [FP8]" not in e5m6
    # the experts' hidden rows (16-bit SwiGLU factors and fc2's FP8 input) become two FP8 copies of fc1's output
    swiglu = _rows(("swiglu_fp8",))
    hidden = {r: v for r, v in base.items() if "hidden" in r}
    cached = {r: v for r, v in swiglu.items() if "hidden" in r}
    assert cached == {
        "expert hidden: SwiGLU inputs cached [FP8]": A.swiglu_cached_bytes(R, f, BLOCKWISE),
        "shared experts hidden: SwiGLU inputs cached [FP8]": A.swiglu_cached_bytes(T, f_s, BLOCKWISE),
    }
    assert sum(base.values()) - sum(swiglu.values()) == sum(hidden.values()) - sum(cached.values())
    # all three: the sum of the three changes
    both = _rows(C.DEEPSEEK_V3_STORAGE)
    changes = [sum(base.values()) - sum(x.values()) for x in (fused, e5m6, swiglu)]
    assert sum(base.values()) - sum(both.values()) == sum(changes)
    # a 16-bit layer (no recipe) takes E5M6 and the fused un-permute, not the FP8 cache
    bf16 = _rows(C.DEEPSEEK_V3_STORAGE, fp8=None)
    assert not any("SwiGLU inputs cached" in r for r in bf16) and "W_O input (attention output) [E5M6]" in bf16


def test_swiglu_fp8_costs_its_hbm_bytes_per_moe_layer_and_nothing_else():
    check = C.moe_layout_check()
    plan, cluster, cfg = check.report.plan, check.cluster, check.cfg
    work = check.fp8_workload
    plain = P.rank_times(cfg, plan, work, cluster, 1)
    fused = P.rank_times(cfg, plan, replace(work, storage=("fused_unpermute", "attn_out_e5m6")), cluster, 1)
    assert fused == plain  # storage alone, no work priced
    cached = P.rank_times(cfg, plan, replace(work, storage=("swiglu_fp8",)), cluster, 1)
    fwd, bwd = storage_hbm_bytes(cfg, plan, 4096, 2)
    layers = 4  # rank 1's four MoE layers (62 layers and two ends in 16 stages)
    hbm = cluster.hbm_bandwidth
    assert cached.forward - plain.forward == pytest.approx(layers * fwd / hbm)
    assert cached.backward - plain.backward == pytest.approx(layers * bwd / hbm)
    n = 4096 * 8 * 2048 + 4096 * 2048  # R f of the routed experts and T f_s of the shared one
    assert (fwd, bwd) == (2 * n * 3, n * 4)


def test_dualpipe_holds_p_plus_one_stages_on_every_rank_more_than_the_planners_1f1b():
    p, m = 16, 120
    for r in (0, 1, 8, 15):
        assert max(sum(a) for a, _ in split_live_counts("dualpipe", p, m, r)) == p + 1
    check = C.moe_layout_check()
    x, work = check.v3_report, check.v3_workload
    one_f_one_b = next(r for r in x.ranks if r.pp_rank == 1).memory
    dual = check.dualpipe_memory(x, work, 1)
    # rank 1 holds four layers a stage either way: 15 microbatches in 1F1B, 17 in DualPipe
    assert dual["activations"] >= one_f_one_b["activations"] * 17 / 15
    assert dual["total"] > one_f_one_b["total"]


def test_deepseek_v3s_own_storage_cuts_the_busiest_rank_but_not_into_80_gb():
    check = C.moe_layout_check()
    fp8, v3 = check.fp8_report, check.v3_report
    assert v3.plan == fp8.plan == check.report.plan
    assert check.v3_workload == replace(check.fp8_workload, storage=C.DEEPSEEK_V3_STORAGE)
    a_fp8, a_v3 = (x.worst_rank().memory["activations"] for x in (fp8, v3))
    assert a_v3 < 0.6 * a_fp8  # the three choices take more than 40% of what FP8 left
    # the new truth: still over, on the planner's 1F1B, which holds fewer microbatches than DualPipe
    assert not v3.fits and v3.peak_memory > C.H800["gpu_memory"]
    assert v3.step_time == pytest.approx(fp8.step_time, rel=0.01)  # the SwiGLU rerun is memory-bound and small


def test_the_gate_in_the_experts_drops_the_expert_outputs_and_keeps_one_weight_a_row():
    cfg = deepseek_v3()
    T, k, h = 4096, cfg.moe.top_k, cfg.d_model
    for before in ((), ("fused_unpermute",), C.DEEPSEEK_V3_STORAGE):
        base, gated = _rows(before), _rows((*before, "gate_in_expert"))
        outputs = sum(v for r, v in base.items() if r.startswith("expert outputs"))
        assert outputs == T * k * h * 2 * (1 if "fused_unpermute" in before else 2)
        assert not any(r.startswith("expert outputs") or r == "combine weights [T k, 1]" for r in gated)
        assert gated["combine weights at the experts [R]"] == T * k * 2  # R = T k rows, one 16-bit weight each
        assert sum(base.values()) - sum(gated.values()) == outputs  # T k weights leave home, R arrive
    # the all-gather dispatcher does not run it: its rows stay
    check = C.moe_layout_check()
    gather = replace(check.report.plan, dispatcher="allgather")
    kw = dict(attention="flash", fp8=BLOCKWISE)
    assert A.layer_saved_rows(cfg, 5, 1, 4096, gather, storage=("gate_in_expert",), **kw) == A.layer_saved_rows(
        cfg, 5, 1, 4096, gather, **kw
    )


def test_the_gate_in_the_experts_costs_its_hbm_bytes_per_moe_layer():
    check = C.moe_layout_check()
    plan, cluster, cfg = check.report.plan, check.cluster, check.cfg
    work = check.v3_workload
    plain = P.rank_times(cfg, plan, work, cluster, 1)
    gated = P.rank_times(cfg, plan, check.gate_workload, cluster, 1)
    fwd, bwd = gate_hbm_bytes(cfg, plan, 4096, 2)
    n = 4096 * 8 * 2048  # R f of the routed experts (the shared one applies no combine weight)
    assert (fwd, bwd) == (2 * n * 2, 4 * n * 2)
    layers, hbm = 4, cluster.hbm_bandwidth
    assert gated.forward - plain.forward == pytest.approx(layers * fwd / hbm)
    assert gated.backward - plain.backward == pytest.approx(layers * bwd / hbm)


def test_deepseek_v3_with_the_gate_in_the_experts_fits_1f1b_and_dualpipe_only_without_the_margin():
    check = C.moe_layout_check()
    v3, gate = check.v3_report, check.gate_report
    assert gate.plan == v3.plan and check.gate_workload == replace(check.v3_workload, storage=C.GATE_IN_EXPERT_STORAGE)
    busiest = gate.worst_rank()
    dual = check.dualpipe_memory(gate, check.gate_workload, busiest.pp_rank)
    gpu, usable = check.cluster.gpu_memory, check.cluster.usable_memory
    # the new truth: the planner's 1F1B fits inside the usable limit; DualPipe's replayed order, with its two
    # parameter copies, under 80 GB but over the usable limit the planner keeps for fragmentation and workspace
    assert gate.fits and gate.peak_memory < usable < v3.peak_memory
    assert usable < dual["total"] < gpu
    assert dual["activations"] > busiest.memory["activations"]
