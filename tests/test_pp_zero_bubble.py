"""Zero-bubble schedules (ZB-H1, ZB-H2) run by the executor on real gloo ranks: the loss and every gradient of the
single-device reference in float64, the same bits as 1F1B's, exactly the schedule's action lists, and the
microbatches in flight and the bubble the schedule promises."""

import pytest
import torch

from pylib.model import build_model, random_tokens
from pylib.plan.presets import tiny_gqa
from pylib.plan.schedules import build
from pylib.pp.pipeline import PipelineParallel
from pylib.pp.timeline import bubble, peak_in_flight, replay
from tests.conftest import assert_float64_close, merge_stage_dicts, one_device_step, pipeline_grads, pipeline_suite

pytestmark = pytest.mark.timeout(180)

CFG = tiny_gqa().with_(n_layers=8)
B, S = 8, 8
RUNS = {
    2: [("1f1b", 4), ("zb-h1", 2), ("zb-h1", 4), ("zb-h2", 4)],
    4: [("1f1b", 8), ("zb-h1", 4), ("zb-h1", 8), ("zb-h2", 8)],
}


def _suite(pp):
    model = build_model(CFG)
    ids, targets = random_tokens(CFG, B, S, seed=1)
    out = []
    for name, m in RUNS[pp]:
        pipe = PipelineParallel(model)
        run = pipe.step(ids, targets, schedule=name, n_microbatches=m)
        out.append((run, pipeline_grads(pipe)))
    return out


suite = pipeline_suite(_suite)


@pytest.fixture(scope="module")
def reference():
    return one_device_step(CFG, B, S)


def test_zero_bubble_schedules_give_the_reference_loss_and_every_gradient_in_float64(suite, reference):
    pp, results = suite
    loss, grads = reference
    for i, (name, m) in enumerate(RUNS[pp]):
        assert results[-1][i][0].loss == pytest.approx(loss, abs=1e-12), (name, m)
        mine = merge_stage_dicts([r[i][1] for r in results])
        assert set(mine) == set(grads)
        for k, g in grads.items():
            assert_float64_close(mine[k], g, f"{name} p={pp} m={m}: {k}")


def test_zero_bubble_gradients_are_the_same_bits_as_1f1b_with_the_same_microbatches(suite):
    # each rank runs its W's in microbatch order, as 1F1B runs its backwards: the same sums in the same order
    pp, results = suite
    base = merge_stage_dicts([r[0][1] for r in results])
    for i, (name, m) in enumerate(RUNS[pp]):
        if m == RUNS[pp][0][1]:
            mine = merge_stage_dicts([r[i][1] for r in results])
            assert all(torch.equal(mine[k], g) for k, g in base.items()), name


def test_executor_runs_the_zero_bubble_action_lists_and_holds_what_they_promise(suite):
    pp, results = suite
    for i, (name, m) in enumerate(RUNS[pp]):
        sched = build(name, pp, m)
        for r, res in enumerate(results):
            run = res[i][0]
            assert [(e.kind, e.mb, e.what, e.peer) for e in run.timeline] == [
                (a.op, a.mb, a.what, a.peer) for a in sched[r]
            ], (name, m, r)
            assert peak_in_flight(run.timeline) == [run.peak_in_flight]
            expected = {"1f1b": min(pp - r, m), "zb-h1": pp}.get(name)
            if expected is not None:
                assert run.peak_in_flight == expected, (name, m, r)
            else:
                assert run.peak_in_flight <= 2 * pp - 1
        if name == "zb-h2":
            assert results[0][i][0].peak_in_flight == 2 * pp - 1
        timeline = [e for res in results for e in res[i][0].timeline]
        own = max(bubble(replay(timeline, 1.0, 1.0, 1.0)).own_idle)
        assert own == {"1f1b": 3 * (pp - 1), "zb-h1": pp - 1, "zb-h2": 0}[name], (name, m)


def test_w_keeps_the_activations_alive_and_adds_the_kept_output_gradients_to_the_bytes(suite):
    pp, results = suite
    for i, (name, m) in enumerate(RUNS[pp]):
        for r, res in enumerate(results):
            run = res[i][0]
            per_mb = run.activation_bytes[(0, 0)]
            if name == "1f1b":
                assert run.peak_activation_bytes == run.peak_in_flight * per_mb
            elif r > 0:  # the kept output gradients come on top of the peak's activations
                assert run.peak_activation_bytes > run.peak_in_flight * per_mb, (name, m, r)
