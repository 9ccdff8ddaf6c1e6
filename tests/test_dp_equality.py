"""DDP and ZeRO-1/2/3 on d = 2 and 4 ranks train exactly like one device on the whole batch; what they send is
what the formulas say, and what they hold is what the formulas say.

One launch per d runs every stage for five Adam steps (float64). The reference runs in this process on the whole
global batch with torch.optim.Adam. The model's sizes are odd on purpose (h=9, V=37, h_ffn=22) so ZeRO's flat
buffers need padding at both d = 2 and d = 4.
"""

import pytest
import torch

from pylib.analysis.dp import held_bytes, padded_numel, traffic_by_op, traffic_per_step, zero3_peak_param_bytes
from pylib.dp import STAGES, assemble
from pylib.experiments.dp_training import train_data_parallel, train_reference
from pylib.model import build_model
from pylib.plan.presets import tiny_odd
from pylib.runtime import launch
from tests.conftest import FLOAT64_RTOL, assert_float64_close

CFG = tiny_odd()
STEPS, BATCH, SEQ, LR, BUCKET = 5, 8, 8, 1e-2, 2048
E = 8  # bytes per float64 element


def _every_stage(cfg):
    return [
        train_data_parallel(cfg, stage, global_batch=BATCH, seq=SEQ, steps=STEPS, bucket_bytes=BUCKET, lr=LR)
        for stage in STAGES
    ]


@pytest.fixture(scope="module")
def reference():
    return train_reference(CFG, global_batch=BATCH, seq=SEQ, steps=STEPS, lr=LR)


@pytest.fixture(
    scope="module", params=[pytest.param(d, marks=pytest.mark.slow) for d in (2, 4)], ids=lambda d: f"dp{d}"
)
def runs(request, reference):
    d = request.param
    per_rank = launch(_every_stage, d, CFG, timeout=240)
    return d, {stage: [per_rank[r][i] for r in range(d)] for i, stage in enumerate(STAGES)}


def _n_params():
    return sum(p.numel() for p in build_model(CFG).parameters())


@pytest.mark.parametrize("stage", STAGES)
def test_mean_loss_over_ranks_equals_the_reference_loss_at_every_step(runs, reference, stage):
    d, by_stage = runs
    for step in range(STEPS):
        mean = sum(r["losses"][step] for r in by_stage[stage]) / d
        assert mean == pytest.approx(reference["losses"][step], rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("stage", STAGES)
def test_averaged_gradient_equals_the_full_batch_gradient(runs, reference, stage):
    d, by_stage = runs
    results = by_stage[stage]
    layouts = results[0]["layouts"]
    if stage == "ddp":  # every rank holds the whole average
        holdings = [assemble(layouts, [r["grad_shards"]]) for r in results]
    else:  # each rank holds one slice of every flat buffer; together they are the average
        holdings = [assemble(layouts, [r["grad_shards"] for r in results])]
    for grads in holdings:
        assert set(grads) == set(reference["grads"])
        for name, g in reference["grads"].items():
            assert_float64_close(grads[name], g, rtol=FLOAT64_RTOL)


@pytest.mark.parametrize("stage", STAGES)
def test_five_adam_steps_give_the_reference_parameters(runs, reference, stage):
    d, by_stage = runs
    results = by_stage[stage]
    if stage != "zero3":  # every rank's module holds every parameter (ZeRO-1/2: after the step's all-gather)
        for r in results:
            for name, p in reference["params"].items():
                assert_float64_close(r["params"][name], p, rtol=FLOAT64_RTOL)
    if stage != "ddp":  # the optimizer's slices, put together, are the same parameters
        layouts = results[0]["layouts"]
        params = assemble(layouts, [r["param_shards"] for r in results])
        for name, p in reference["params"].items():
            assert_float64_close(params[name], p, rtol=FLOAT64_RTOL)
        for lay in layouts:  # padding is still zero: Adam moves nothing that never has a gradient
            flat = torch.cat([r["param_shards"][lay.key] for r in results])
            assert torch.count_nonzero(flat[lay.numel :]) == 0


def _psi(layouts, padded: bool) -> int:
    return sum((lay.padded_bytes if padded else lay.bytes) for lay in layouts)


def test_model_has_padding_to_exercise(runs):
    d, by_stage = runs
    psi = _n_params() * E
    for stage in ("zero1", "zero2", "zero3"):
        layouts = by_stage[stage][0]["layouts"]
        assert _psi(layouts, padded=False) == psi  # every parameter is in exactly one flat buffer
        padded = sum(padded_numel(lay.numel, d) for lay in layouts) * E  # the analysis' own padding
        assert _psi(layouts, padded=True) == padded > psi


@pytest.mark.parametrize("stage", STAGES)
def test_traced_bytes_per_step_equal_the_formula(runs, stage):
    d, by_stage = runs
    expected_phase = {
        "ddp": {("all_reduce", "backward")},
        "zero1": {("reduce_scatter", "backward"), ("all_gather", "optimizer")},
        "zero2": {("reduce_scatter", "backward"), ("all_gather", "optimizer")},
        "zero3": {("all_gather", "forward"), ("all_gather", "backward"), ("reduce_scatter", "backward")},
    }[stage]
    for r in by_stage[stage]:
        layouts = r["layouts"]
        psi = _psi(layouts, padded=stage != "ddp")
        if stage == "ddp":
            assert psi == _n_params() * E  # DDP pads nothing: Psi is the model's parameter bytes
        for events in r["events"]:
            sent: dict[str, int] = {}
            for e in events:
                sent[e["op"]] = sent.get(e["op"], 0) + e["bytes_sent"]
            assert sent == traffic_by_op(psi, d, stage)
            assert sum(sent.values()) == traffic_per_step(psi, d, stage)
            assert {(e["op"], e["phase"]) for e in events} == expected_phase
            # one collective per flat buffer and pass, each tagged with its buffer
            passes = 3 if stage == "zero3" else (1 if stage == "ddp" else 2)
            assert len(events) == passes * len(layouts)
            assert {e["tag"] for e in events} == {f"{stage}.{lay.key}" for lay in layouts}


@pytest.mark.parametrize("stage", STAGES)
def test_held_parameter_gradient_and_optimizer_bytes_equal_the_formula(runs, stage):
    d, by_stage = runs
    for r in by_stage[stage]:
        phi_pad = sum(lay.padded_numel for lay in r["layouts"])
        expected = held_bytes(_n_params(), E, d, stage, padded_params=phi_pad)
        mem = r["memory"]
        assert {k: mem[k] for k in ("params", "grads", "optim")} == expected


def test_zero_stages_hold_less_in_the_order_the_paper_gives(runs):
    d, by_stage = runs
    totals = [by_stage[s][0]["memory"]["total"] for s in STAGES]
    assert totals == sorted(totals, reverse=True) and len(set(totals)) == 4


def test_zero3_gathers_one_unit_at_a_time(runs):
    d, by_stage = runs
    for r in by_stage["zero3"]:
        mem, units = r["memory"], r["unit_bytes"]
        shards = mem["params"]  # after the step nothing is gathered: the shards alone
        assert shards * d == sum(units.values())
        assert mem["peak_params"] == zero3_peak_param_bytes(shards, list(units.values()), resident_units=1)
        assert mem["peak_params"] < sum(units.values())  # the full model is never resident
        assert mem["peak_params"] - shards == max(units.values())
        assert set(units) == {"embed", "layers.0", "layers.1", "ln_f", "lm_head"}
