"""The book's profiled pipeline run: the trace holds every action the schedule lists, the bubble the recorder
measured, and at least the activation bytes the analysis predicts (one launch, `slow`)."""

import pytest

from pylib.analysis import planner as P
from pylib.analysis.activations import chunk_saved_bytes, peak_saved_bytes
from pylib.experiments.profile_runs import BATCH, CFG, PP_M, SEQ, profiled_run
from pylib.plan.mesh import ParallelConfig
from pylib.plan.options import RunOptions
from pylib.plan.schedules import build
from pylib.pp.timeline import Event, bubble
from pylib.runtime.profile import held_peak, load, spans, within

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
P_PP = 2


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    run = profiled_run("pp_1f1b", tmp_path_factory.mktemp("pp"))
    return run, load(run["trace"])


def _own_step(trace, r):
    found = spans(trace)
    step = next(s for s in found if s.rank == r and s.what == "step")
    return within(found, step)


def test_every_pipeline_action_is_a_range_named_after_it_in_the_schedules_order(pipeline):
    _, trace = pipeline
    sched = build("1f1b", P_PP, PP_M)
    for r in range(P_PP):
        ran = [s.op for s in _own_step(trace, r) if s.axis == "pp"]
        assert ran == [str(a) for a in sched[r]], r


def test_the_bubble_read_from_the_trace_is_the_recorders(pipeline):
    run, trace = pipeline
    events = []
    for r in range(P_PP):
        for s in _own_step(trace, r):
            if s.kind in ("F", "B"):
                events.append(Event(r, s.op[0], int(s.op[1:]), 0, int(s.tag.removeprefix("pp.stage")), s.start, s.end))
    from_trace = bubble(events)
    from_recorder = bubble([e for rank in run["ranks"] for e in rank["timeline"]])
    for r in range(P_PP):
        # the same actions timed by two clocks a few microseconds apart (the range opens just outside the recorder's)
        assert from_trace.busy[r] == pytest.approx(from_recorder.busy[r], rel=0.05)
        assert from_trace.idle[r] == pytest.approx(from_recorder.idle[r], rel=0.1, abs=2e-3)


def test_the_allocator_holds_at_least_the_activation_peak_the_analysis_predicts(pipeline):
    run, trace = pipeline
    plan = P.Plan(ParallelConfig(pp=P_PP), RunOptions(schedule="1f1b", n_microbatches=PP_M))
    for r in range(P_PP):
        predicted = peak_saved_bytes(chunk_saved_bytes(CFG, BATCH // PP_M, SEQ, plan, r), "1f1b", P_PP, PP_M, 1, r)
        seen = held_peak(trace, r, [s for s in spans(trace) if s.rank == r and s.kind == "F"])
        # saved tensors (the prediction), plus each forward's output and temporaries not yet freed
        assert predicted <= run["ranks"][r]["peak_activation_bytes"] <= seen <= 1.2 * predicted, r
