"""V-Half and V-Min (Qi, Wan, Amar, Lin, NeurIPS 2024): the
building block of one microbatch on the V placement, repeated every 6 units, as schedule data for the one
simulator and the one executor (`pylib.plan.schedules.controlled_block`, `_controlled`). The pure part: the block
is a valid schedule, no deadlock for p = 2..8 over a range of m under both send semantics and real costs other
than the placement's, the activations and the bubble against the paper's claims, the bad input named. The real
gloo ranks run in tests/test_pp_zbv.py's V launch (one launch per p for every V schedule).

The paper's numbers (its table, arXiv 2405.15362, and the authors' demo, huggingface.co/spaces/sail/
pipeline-parallelism-with-controllable-memory): peak activations in microbatches of a stage, 1F1B p, V-Half
(p+2)//2, V-Min (p+4)//3; bubble rate at T_F = T_B = T_W about p/m for 1F1B, p/(2m) for V-Half, 2p/(3m) for V-Min,
that is an idle time of about 6p, 3p and 4p units of one chunk's F (a microbatch is 6 units of work on a rank).
Measured here at T_F = T_B = T_W, m >= p (peak in chunk activations, each half a stage; idle: the busiest rank
between its own first and last compute, `Bubble.own_idle`):

     p   V-Half peak   V-Half idle   V-Min peak   V-Min idle   1F1B peak (chunks)   1F1B idle 6(p-1)
     2     4 = 2*2          5          4 = 2*2         3              4                    6
     3     4 = 2*2          7          4 = 2*2         9              6                   12
     4     6 = 2*3         12          4 = 2*2        11              8                   18
     5     6 = 2*3         14          6 = 2*3        15             10                   24
     6     8 = 2*4         19          6 = 2*3        21             12                   30
     7     8 = 2*4         21          6 = 2*3        23             14                   36
     8    10 = 2*5         26          8 = 2*4        27             16                   42

The memory is the paper's exactly, (p+2)//2 and (p+4)//3 stages for every p here (and p = 16, 32). The idle time
is a fixed number of units whatever m (the bubble rate falls as 1/m), near the paper's 3p and 4p: V-Half's
7p/2 - 2 for even p a little above 3p (the paper's repository re-times the warm-up and cool-down, its
"squeeze"; we keep the block's order), V-Min's below 4p. The block assumes equal costs: at T_B = 2 T_F the
order's bubble grows by 2 units per microbatch for V-Half and 4 for V-Min (test below)"""

import functools

import pytest

from pylib.analysis import pp as A
from pylib.plan.schedules import CONTROLLED, ScheduleError, build, compute_order, controlled_block
from pylib.pp.simulate import simulate
from pylib.pp.timeline import bubble, peak_in_flight

# p: (V-Half peak, V-Half own idle, V-Min peak, V-Min own idle) at unit costs, m >= p (the docstring's table)
MEASURED = {
    2: (4, 5, 4, 3),
    3: (4, 7, 4, 9),
    4: (6, 12, 4, 11),
    5: (6, 14, 6, 15),
    6: (8, 19, 6, 21),
    7: (8, 21, 6, 23),
    8: (10, 26, 8, 27),
}


@functools.cache
def _sched(name, p, m):
    return build(name, p, m, 2)


@functools.cache
def _unit(name, p, m):
    return simulate(_sched(name, p, m), 1.0, 1.0, cost_w=1.0)


def _peak(order):
    live = most = 0
    for a in order:
        live += 1 if a.op == "F" else -1 if a.op == "W" else 0
        most = max(most, live)
    return most


@pytest.mark.parametrize("name", CONTROLLED)
def test_the_building_block_gives_each_unit_one_pass_and_each_pass_after_what_it_waits_for(name):
    for p in range(2, 9):
        blocks = [controlled_block(name, p, r) for r in range(p)]
        for r, (f0, f1, b1, b0) in enumerate(blocks):
            assert len({t % 6 for t in (f0, f1, b1, b0)}) == 4, (p, r)  # repeated every 6: no two in one unit
            assert f0 < f1 < b1 < b0  # the V down, back up, its backward down and back up
            if r > 0:  # chunk 0's forward and chunk 1's B come from rank r-1
                assert f0 > blocks[r - 1][0] and b1 > blocks[r - 1][2]
            if r < p - 1:  # chunk 1's forward and chunk 0's B come from rank r+1
                assert f1 > blocks[r + 1][1] and b0 > blocks[r + 1][3]
        assert blocks[p - 1][1] > blocks[p - 1][0]  # the turn: stage p after stage p-1 on rank p-1
        assert blocks[0][2] > blocks[0][1]  # the loss: B of stage 2p-1 after its forward on rank 0


@pytest.mark.parametrize("p", range(2, 9))
@pytest.mark.parametrize("name", CONTROLLED)
def test_v_half_and_v_min_never_deadlock_for_any_m_semantics_or_real_costs(name, p):
    for m in sorted({1, 2, p, 2 * p + 1}):
        sched = _sched(name, p, m)
        for r in range(p):
            for c in (0, 1):
                for op in "FBW":  # each chunk's F, B and W in microbatch order, each once
                    assert [a.mb for a in sched.compute(r) if a.op == op and a.chunk == c] == list(range(m))
        for sends, costs in (("rendezvous", (1.0, 2.0, 0.5)), ("eager", (3.0, 1.0, 2.0))):
            simulate(sched, costs[0], costs[1], sends=sends, cost_w=costs[2])


def test_v_half_holds_the_papers_p_plus_2_over_2_stages_and_v_min_its_p_plus_4_over_3():
    # a chunk activation is half a stage's: the paper's (p+2)//2 and (p+4)//3 stages are twice that in chunks
    for p, (half, _, third, _) in MEASURED.items():
        assert half == 2 * ((p + 2) // 2) and third == 2 * ((p + 4) // 3), p
        for m in (p, 2 * p + 1):
            assert max(peak_in_flight(_unit("v-half", p, m))) == half, (p, m)
            assert max(peak_in_flight(_unit("v-min", p, m))) == third, (p, m)
            assert max(A.peak_in_flight("1f1b", p, m, r) for r in range(p)) == p  # 1F1B: p stages on rank 0
    # larger p: the peak follows the order alone (forwards done, W's not), no timing needed
    for p in (16, 32):
        for name, stages in (("v-half", (p + 2) // 2), ("v-min", (p + 4) // 3)):
            assert max(_peak(compute_order(name, p, 3 * p, r, 2)) for r in range(p)) == 2 * stages, (name, p)


def test_their_bubble_is_a_fixed_number_of_units_near_the_papers_and_below_1f1bs_whatever_m():
    for p, (_, half, _, third) in MEASURED.items():
        for m in (p, 2 * p + 1):
            assert max(bubble(_unit("v-half", p, m)).own_idle) == half, (p, m)
            assert max(bubble(_unit("v-min", p, m)).own_idle) == third, (p, m)
        assert max(half, third) < 6 * (p - 1)  # 1F1B's (p-1)(T_F+T_B+T_W), a stage pass two units
        assert half <= 7 * p / 2 and third <= 4 * p  # the paper's about 3p and 4p


def test_the_block_assumes_equal_costs_at_t_b_twice_t_f_the_bubble_grows_with_m():
    # a microbatch is 8 units of work on a rank (2 F, 2 B of 2, 2 W) in a block timed for 6: the order's chains
    # stretch, V-Min's (every pass one unit a rank behind its neighbour) twice as much as V-Half's
    for name, per_microbatch in (("v-half", 2), ("v-min", 4)):
        own = [max(bubble(simulate(_sched(name, 4, m), 1.0, 2.0, cost_w=1.0)).own_idle) for m in (4, 8)]
        assert own[1] - own[0] == per_microbatch * 4, (name, own)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(p=4, n_microbatches=8, v=1), r"v-half runs two chunks per rank in a V .* v must be 2, got v=1"),
        (dict(p=4, n_microbatches=0, v=2), r"m=0 must be a positive integer"),
        (dict(p=2, n_microbatches=4, v=2, group_size=2), r"group_size applies to the interleaved schedule only"),
    ],
)
def test_v_half_refuses_sizes_it_cannot_run_naming_the_constraint(kw, message):
    with pytest.raises(ScheduleError, match=message):
        build("v-half", **kw)
    with pytest.raises(ScheduleError, match=message.replace("v-half", "v-min")):
        build("v-min", **kw)
