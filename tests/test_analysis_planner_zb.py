"""The planner prices the zero-bubble schedules (zb-h1, zb-h2, zb-v, dualpipev): its bubble against the published
formulas and the simulator, the activations and W's kept gradients replayed on the schedule, the V's stages and
P2P messages, and the enumeration's rule (a schedule is a candidate only where `check_schedule` accepts it)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pylib.analysis import planner as P
from pylib.analysis.pp import p2p_bytes_per_step, peak_in_flight, split_bubble_time, split_live_counts
from pylib.plan import RunOptions
from pylib.plan.presets import llama2_7b
from pylib.plan.schedules import ZERO_BUBBLE, build
from pylib.pp.simulate import simulate
from pylib.runtime import ParallelConfig

CFG = llama2_7b()  # 32 layers: 2p stages of equal size for p = 2, 4, 8, 16
WORK = P.Workload(batch=64, seq=1024)


def zb_plan(schedule, p, m, **kw):
    v = 2 if schedule in ("zb-v", "dualpipev") else 1
    return P.Plan(ParallelConfig(pp=p), RunOptions(n_microbatches=m, v=v, **kw), zb_schedule=schedule)


def predict(plan):
    return P.predict(CFG, plan, WORK, P.Cluster(plan.par.world_size))


def costs(x: P.Prediction) -> tuple[float, float, float]:
    t = x.slowest_times()
    return t.forward, t.backward - t.wgrad, t.wgrad


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 16)])
def test_zb_h1_bubble_is_the_published_formula_with_the_planners_b_and_w(p, m):
    x = predict(zb_plan("zb-h1", p, m))
    f, b, w = costs(x)
    assert 0 < w < b + w and w <= f  # W is the weight GEMMs: a part of the backward, no longer than the forward
    assert x.bubble_time == pytest.approx(split_bubble_time("zb-h1", p, f, b, w), rel=1e-12)
    assert x.bubble_time == pytest.approx((p - 1) * (f + b - w), rel=1e-12)  # the paper's, since W <= F


@pytest.mark.parametrize("schedule", ZERO_BUBBLE)
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8)])
def test_planner_bubble_is_the_simulators_makespan_beyond_the_compute(schedule, p, m):
    x = predict(zb_plan(schedule, p, m))
    f, b, w = costs(x)
    v = x.plan.options.v
    c = dict(cost_f=f / v, cost_b=b / v, cost_w=w / v)
    events = simulate(build(schedule, p, m, v, **c), sends="eager", **c)  # the sends placed for these costs
    makespan = max(e.end for e in events)
    assert x.bubble_time == pytest.approx(makespan - m * (f + b + w), rel=1e-9)
    one_f_one_b = predict(P.Plan(x.plan.par, replace(x.plan.options, v=1)))
    assert x.bubble_time < one_f_one_b.bubble_time


def test_zero_bubble_schedules_leave_only_the_forward_ramp_at_equal_costs():
    """At T_F = T_B = T_W the published 'zero' is each rank's own idle time; the step still waits (p-1) chunk
    forwards for the last rank to start: (p-1) T_F for ZB-H2, (p-1) T_F / 2 for ZB-V (half-stage chunks)."""
    from pylib.analysis.pp import simulated_split_bubble

    for p in (2, 4, 8):
        assert simulated_split_bubble("zb-h2", p, 2 * p, 1.0, 1.0, 1.0) == pytest.approx(p - 1)
        assert simulated_split_bubble("zb-v", p, 2 * p, 1.0, 1.0, 1.0) == pytest.approx((p - 1) / 2)
        assert split_bubble_time("zb-h2", p, 1.0, 1.0, 1.0) == 0.0


@pytest.mark.parametrize("schedule", ZERO_BUBBLE)
def test_replayed_activations_hold_the_published_in_flight_count(schedule):
    p, m = 4, 10
    for r in range(p):
        states = split_live_counts(schedule, p, m, r)
        assert max(sum(saved) for saved, _ in states) == peak_in_flight(schedule, p, m, r, 2 if "v" in schedule else 1)


def test_deferred_w_keeps_output_gradients_so_zb_h1_holds_more_than_1f1b():
    one = P.Plan(ParallelConfig(pp=4, dp=1), RunOptions(n_microbatches=8))
    zb = replace(one, zb_schedule="zb-h1")
    a, b = predict(one), predict(zb)
    first = [r.memory["activations"] for r in a.ranks]
    split = [r.memory["activations"] for r in b.ranks]
    assert split[0] >= first[0] and split[-1] > first[-1]  # rank p-1 keeps p-1 microbatches' W gradients
    kept = P.wgrad_kept_bytes(CFG, zb, 1024, range(8), False)
    assert kept == 2 * 1024 * 8 * (3 * 4096 + 4096 + 2 * 11008 + 4096)  # dY of QKV, W_O, gate+up, down per layer


def test_the_v_puts_embedding_and_head_on_rank_0_and_doubles_1f1bs_p2p_traffic():
    p, m = 4, 8
    v_plan = zb_plan("zb-v", p, m)
    names = {r: {e.name for lay in P.flat_layouts(CFG, v_plan, r) for e in lay.entries} for r in (0, p - 1)}
    ends = {"embed.weight", "lm_head.weight"}
    assert ends <= names[0] and not ends & names[p - 1]

    def boundary_bytes(plan):
        rows = (P.rank_traffic_rows(CFG, plan, WORK.batch, WORK.seq, r) for r in range(p))
        return sum(x.bytes_sent for rs in rows for x in rs if x.where == "stage boundary")

    b = WORK.batch // m
    v_bytes = p2p_bytes_per_step(b, WORK.seq, CFG.d_model, 2, p, m, 2, "v")
    assert boundary_bytes(v_plan) == v_bytes
    assert v_bytes == 2 * boundary_bytes(P.Plan(v_plan.par, RunOptions(n_microbatches=m)))  # 2p - 2 boundaries


def test_enumeration_offers_a_zero_bubble_schedule_only_where_it_can_run():
    space = P.SearchSpace(zero_bubble=ZERO_BUBBLE, tp_sizes=(1,), cp_sizes=(1,), zero_stages=(0,))
    plans = P.enumerate_plans(CFG, 4, 8, 1024, space)
    zb = [x for x in plans if x.zb_schedule]
    seen = {(x.zb_schedule, x.par.pp, x.options.n_microbatches) for x in zb}
    assert ("zb-h1", 4, 4) in seen and ("zb-v", 4, 4) in seen
    assert not any(s == "zb-h2" and m < 2 * p - 1 for s, p, m in seen)
    assert not any(s == "dualpipev" and m < 2 * p for s, p, m in seen)
    assert all(x.par.pp > 1 for x in zb)
    bad = P.problems(CFG, zb_plan("zb-h2", 4, 4), 4, 8, 1024)
    assert bad and "2p-1" in bad[-1]
    with pytest.raises(ValueError, match="zb_schedule"):
        P.Plan(ParallelConfig(pp=2), zb_schedule="zb-x")
