"""DualPipeV (DeepSeek's DualPipe cut in half into a V; torch's ScheduleDualPipeV) as schedule data on the V
placement, with its overlapped F&B slots: the pure part holds the schedule against DeepSeek's published bubble
(PP/2-1)(F&B+B-3W) and activations PP+1 (PP = 2p stages) for p up to 8 and says where the formula stops being
the schedule's. Its run on gloo ranks against the single-device reference in float64 shares ZB-V's launch
(tests/test_pp_zbv.py)."""

import functools

import pytest

from pylib.analysis import pp as A
from pylib.model import build_model
from pylib.plan.presets import tiny_gqa
from pylib.plan.schedules import ScheduleError, build, dualpipe, dualpipe_v
from pylib.pp.simulate import simulate
from pylib.pp.split import rank_chunks
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


# --------------------------------------------------------------------------------------------- DualPipe proper
# Two copies of the model fed from both ends on an even p: the "dual" placement (the V's stage -> rank map, its two
# arms two pipelines: stages 0..p-1 = the first copy on ranks 0..p-1, p..2p-1 = the second on ranks p-1..0).
# Its real runs against the reference share ZB-V's launch (tests/test_pp_zbv.py).

DUAL_SWEEP = [(p, m) for p in (2, 4, 6, 8) for m in (2 * p, 2 * p + 2, 4 * p)]


@functools.cache
def _dual(p, m):
    return dualpipe(p, m)


def test_dualpipe_bubble_is_deepseeks_formula_with_pp_the_ranks_and_dualpipev_s_on_half_the_ranks():
    for p, m in DUAL_SWEEP:
        for t_f, t_b, t_w in ((1.0, 1.0, 1.0), (2.0, 2.0, 1.0), (1.0, 1.0, 0.5)):
            t_fb = t_f + t_b + t_w
            own = max(bubble(simulate(_dual(p, m), t_f, t_b, cost_w=t_w, cost_fb=t_fb)).own_idle)
            assert own == pytest.approx(A.dualpipe_bubble(p, t_fb, t_b + t_w, t_w)), (p, m, t_f, t_b, t_w)
            assert own == _own_bubble(p // 2, m // 2, t_f, t_b, t_w, t_fb)  # cut in half: the same idle


def test_dualpipe_holds_p_plus_1_stage_activations_and_every_parameter_twice():
    for p, m in DUAL_SWEEP:
        assert peak_in_flight(simulate(_dual(p, m), 1.0, 1.0, cost_w=1.0)) == [p + 1] * p  # DeepSeek's PP+1
    model = build_model(tiny_gqa().with_(n_layers=8))
    total = sum(q.numel() for q in model.parameters())
    for p in (2, 4):  # rank r holds model stage r (chunk 0) and p-1-r (chunk 1): 2x the parameters of 1F1B
        chunks = [rank_chunks(model, r, p, 2, placement="dual") for r in range(p)]
        assert [[c.stage for c in cs] for cs in chunks] == [[r, p - 1 - r] for r in range(p)]
        assert sum(q.numel() for cs in chunks for c in cs for q in c.parameters()) == 2 * total


def test_dualpipe_feeds_half_the_microbatches_from_each_end_and_mirrors_rank_r_on_rank_p_minus_1_minus_r():
    for p, m in DUAL_SWEEP:
        sched = _dual(p, m)
        assert sched.spans == {mb: (0, p - 1) if mb < m // 2 else (p, 2 * p - 1) for mb in range(m)}
        assert sched.ranks == tuple(range(p)) + tuple(reversed(range(p)))
        for r in range(p):
            mine = [(a.op, a.what, a.mb % (m // 2), a.chunk) for a in sched.compute(r)]
            mirror = [(a.op, a.what, a.mb % (m // 2), 1 - a.chunk) for a in sched.compute(p - 1 - r)]
            assert mine == mirror, (p, m, r)
        for sends in ("rendezvous", "eager"):
            simulate(sched, 1.0, 2.0, sends=sends, cost_w=1.0, cost_fb=2.5)


@pytest.mark.parametrize(
    "p, m, v, message",
    [
        (3, 6, 2, r"dualpipe needs an even number of pipeline ranks: p=3"),
        (4, 9, 2, r"dualpipe needs an even m >= 2p microbatches: m=9, p=4, 2p=8"),
        (4, 6, 2, r"dualpipe needs an even m >= 2p microbatches: m=6, p=4, 2p=8"),
        (2, 4, 1, r"dualpipe runs two chunks per rank, one per direction .* got v=1"),
    ],
)
def test_dualpipe_refuses_odd_p_and_m_it_cannot_split_naming_the_constraint(p, m, v, message):
    with pytest.raises(ScheduleError, match=message):
        build("dualpipe", p, m, v)
