"""DualPipeV (DeepSeek's DualPipe cut in half into a V; torch's ScheduleDualPipeV) as schedule data on the V
placement, with its overlapped F&B slots: the pure part holds the schedule against DeepSeek's published bubble
(PP/2-1)(F&B+B-3W) and activations PP+1 (PP = 2p stages) for p up to 8 and says where the formula stops being
the schedule's. Its run on gloo ranks against the single-device reference in float64 shares ZB-V's launch
(tests/test_pp_zbv.py)."""

import functools

import pytest

from pylib.analysis import pp as A
from pylib.plan.schedules import ScheduleError, build, dualpipe_v
from pylib.pp.simulate import simulate
from pylib.pp.timeline import bubble, peak_in_flight

pytestmark = pytest.mark.timeout(180)

SWEEP = [(p, m) for p in (2, 3, 4, 5, 8) for m in (2 * p, 2 * p + 3)]


@functools.cache
def _dpv(p, m):
    return dualpipe_v(p, m)


def _own_bubble(p, m, t_f, t_b, t_w, t_fb):
    return max(bubble(simulate(_dpv(p, m), t_f, t_b, cost_w=t_w, cost_fb=t_fb)).own_idle)


def test_dualpipev_bubble_is_deepseeks_formula_when_f_equals_b_and_the_f_and_b_slot_does_not_overlap():
    # DeepSeek's B is the full backward (our t_b + t_w); PP = 2p stages on p ranks
    for p, m in SWEEP:
        for t_f, t_b, t_w in ((1.0, 1.0, 1.0), (2.0, 2.0, 1.0), (1.0, 1.0, 0.5)):
            t_fb = t_f + t_b + t_w
            published = A.dualpipe_bubble(2 * p, t_fb, t_b + t_w, t_w)
            assert _own_bubble(p, m, t_f, t_b, t_w, t_fb) == pytest.approx(published), (p, m, t_f, t_b, t_w)
            assert A.split_bubble_time("dualpipev", p, t_f, t_b, t_w) == pytest.approx(published)


def test_with_a_real_overlap_the_schedule_idles_less_than_the_formula_says_from_p_6_on():
    # t_fb = 2 at unit costs: the slot saves one unit; up to p = 5 the formula is still exact, beyond it the
    # cool-down's W's fill more than the formula's 3W per rank pair, and it overstates the bubble
    for p in (2, 3, 4, 5, 6, 8):
        own = _own_bubble(p, 2 * p, 1.0, 1.0, 1.0, 2.0)
        published = A.dualpipe_bubble(2 * p, 2.0, 2.0, 1.0)
        assert (own == published) if p <= 5 else (own < published), (p, own, published)
    with pytest.raises(ValueError, match="t_f = t_b and t_fb = t_f \\+ t_b \\+ t_w"):
        A.split_bubble_time("dualpipev", 4, 1.0, 1.0, 1.0, t_fb=2.0)


def test_dualpipev_holds_2p_plus_1_chunk_activations_deepseeks_pp_plus_1_one_more_than_zb_v():
    for p, m in SWEEP:
        peaks = peak_in_flight(simulate(_dpv(p, m), 1.0, 1.0, cost_w=1.0))
        assert peaks == [2 * p + 1] * p == [A.peak_in_flight("dualpipev", p, m, r, 2) for r in range(p)], (p, m)


def test_dualpipev_never_deadlocks_and_keeps_each_f_and_b_slot_together():
    for p, m in SWEEP:
        sched = _dpv(p, m)
        for r in range(p):
            acts = sched[r]
            pairs = [i for i, a in enumerate(acts) if a.overlapped]
            assert pairs and all(acts[i + 1].op == "B" for i in pairs), (p, m, r)  # no message inside a slot
            for c in (0, 1):
                for op in "FB":
                    assert [a.mb for a in acts if a.op == op and a.chunk == c] == list(range(m)), (p, m, r, c, op)
            ws = [(a.mb, a.chunk) for a in acts if a.op == "W"]
            assert len(ws) == len(set(ws)) == len(sched.deferred(r))
        for sends in ("rendezvous", "eager"):
            for t_f, t_b, t_w, t_fb in ((1.0, 1.0, 1.0, 2.0), (1.0, 2.0, 1.0, 2.5), (3.0, 1.0, 0.5, 4.0)):
                simulate(sched, t_f, t_b, sends=sends, cost_w=t_w, cost_fb=t_fb)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(p=4, n_microbatches=7, v=2), r"dualpipev needs m >= 2p microbatches: m=7, p=4, 2p=8"),
        (dict(p=2, n_microbatches=4, v=1), r"dualpipev runs two chunks per rank in a V .* got v=1"),
    ],
)
def test_dualpipev_refuses_sizes_it_cannot_run_naming_the_constraint(kw, message):
    with pytest.raises(ScheduleError, match=message):
        build("dualpipev", **kw)
