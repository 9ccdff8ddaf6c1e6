"""The split-backward formulas of pylib.analysis.pp (B costs t_b, W t_w) against the simulator: the busiest rank's
idle time per step and the microbatches in flight of 1F1B, ZB-H1 and ZB-H2."""

import itertools

import pytest

from pylib.analysis import pp as A
from pylib.plan.schedules import ScheduleError, build
from pylib.pp.simulate import simulate
from pylib.pp.timeline import bubble, peak_in_flight

COSTS = [(1, 1, 1), (1, 2, 1), (2, 1, 1), (3, 2, 1), (1, 1, 2), (1, 2, 2), (2, 1, 2), (3, 1, 2), (1, 1, 0.5)]


def _own_idle(name, p, m, t_f, t_b, t_w):
    cost_b, cost_w = (t_b + t_w, 0.0) if name == "1f1b" else (t_b, t_w)
    sched = build(name, p, m, cost_f=t_f, cost_b=cost_b, cost_w=cost_w)
    return bubble(simulate(sched, t_f, cost_b, sends="eager", cost_w=cost_w)).own_idle


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (8, 16)])
def test_split_bubble_time_is_the_simulated_idle_of_rank_0_the_busiest_rank(p, m):
    for name, (t_f, t_b, t_w) in itertools.product(("1f1b", "zb-h1"), COSTS):
        own = _own_idle(name, p, m, t_f, t_b, t_w)
        formula = A.split_bubble_time(name, p, t_f, t_b, t_w)
        assert own[0] == pytest.approx(formula) and max(own) == pytest.approx(formula), (name, t_f, t_b, t_w, own)
    assert max(_own_idle("zb-h2", p, m, 1, 1, 1)) == A.split_bubble_time("zb-h2", p, 1, 1, 1) == 0


def test_zb_h1_is_the_papers_formula_exactly_when_w_is_no_longer_than_f():
    for t_f, t_b, t_w in COSTS:
        paper = 3 * (t_f + t_b - t_w)
        assert (A.split_bubble_time("zb-h1", 4, t_f, t_b, t_w) == paper) == (t_w <= t_f), (t_f, t_b, t_w)
    # the counterexample: W twice F and B, the paper's formula says 0, rank 0 idles (p-1) t_b
    assert A.split_bubble_time("zb-h1", 4, 1, 1, 2) == 3 == max(_own_idle("zb-h1", 4, 8, 1, 1, 2))


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "zb-h2"])
def test_in_flight_formula_is_what_the_simulated_schedule_holds_on_every_rank(name):
    for p in (2, 4, 8):
        for m in (2 * p - 1, 2 * p, 3 * p):
            held = peak_in_flight(simulate(build(name, p, m), sends="eager"))
            assert held == [A.peak_in_flight(name, p, m, r) for r in range(p)], (name, p, m)


def test_split_formulas_refuse_what_they_do_not_cover():
    with pytest.raises(ValueError, match="equal costs"):
        A.split_bubble_time("zb-h2", 4, 1, 2, 1)
    with pytest.raises(ScheduleError, match="interleaved"):
        A.split_bubble_time("interleaved", 4, 1, 1, 1)
    with pytest.raises(ScheduleError, match="2p-1"):
        A.peak_in_flight("zb-h2", 4, 6, 0)
