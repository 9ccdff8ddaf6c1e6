"""Pipeline schedules as pure data: order, matching, in-flight depth, bubble, deadlock freedom, the stage split.

Nothing here starts a process: the schedules are lists, the simulator runs them against each other with blocking
(rendezvous) or posted (eager) sends, and the formulas in pylib.analysis.pp are checked against the simulation.
"""

import functools
import itertools
from collections import defaultdict

import pytest
import torch

from pylib.analysis import pp as A
from pylib.model import ModelConfig, build_model, random_tokens
from pylib.plan.presets import tiny
from pylib.plan.schedules import (
    ZERO_BUBBLE,
    ScheduleError,
    build,
    compute_order,
    interleaved_table,
    place_communication,
)
from pylib.pp.simulate import DeadlockError, simulate
from pylib.pp.split import check_split, shard_specs, split_model, stage_layers
from pylib.pp.timeline import bubble, peak_in_flight

pytestmark = pytest.mark.timeout(60)


def _configs():
    """(name, p, m, v, group_size) over a sweep; interleaved only where Megatron accepts it."""
    out = []
    for p, m in itertools.product([1, 2, 3, 4, 8], [1, 2, 3, 4, 6, 8, 16]):
        out += [("gpipe", p, m, 1, None), ("1f1b", p, m, 1, None)]
        for v in (2, 3):
            if p >= 2 and m >= p and m % p == 0:
                out.append(("interleaved", p, m, v, None))
    out += [("interleaved", 2, 5, 2, 3), ("interleaved", 2, 6, 2, 4), ("interleaved", 4, 12, 2, 8)]
    return out


CONFIGS = _configs()


@functools.cache
def _build(cfg, cost_f=1.0, cost_b=2.0):
    name, p, m, v, n = cfg
    return build(name, p, m, v, group_size=n, cost_f=cost_f, cost_b=cost_b)


def test_every_forward_precedes_its_backward_and_every_microbatch_runs_once_per_chunk():
    for cfg in CONFIGS:
        sched = _build(cfg)
        name, p, m, v, _ = cfg
        for r in range(p):
            seen = []
            for a in sched.compute(r):
                if a.op == "B":
                    assert ("F", a.mb, a.chunk) in seen, (cfg, r, str(a))
                seen.append((a.op, a.mb, a.chunk))
            assert sorted(seen) == sorted((op, i, c) for op in "FB" for i in range(m) for c in range(v)), (cfg, r)


def test_every_send_has_its_receive_on_the_peer_in_the_same_order():
    for cfg in CONFIGS:
        sched = _build(cfg)
        sent, received = defaultdict(list), defaultdict(list)
        for r, actions in enumerate(sched):
            for a in actions:
                if a.op == "send":
                    sent[(r, a.peer)].append(a.message())
                elif a.op == "recv":
                    received[(a.peer, r)].append(a.message())
        assert sent == received, cfg
        name, p, m, v, _ = cfg
        assert sum(len(x) for x in sent.values()) == 2 * (p * v - 1) * m, cfg


def test_receives_come_before_the_compute_that_uses_them_and_sends_after_the_compute_that_made_them():
    for cfg in CONFIGS:
        for r, actions in enumerate(_build(cfg)):
            done = set()
            for a in actions:
                if a.op == "F" and a.stage > 0:
                    assert ("recv", "act", a.mb, a.chunk) in done, (cfg, r, str(a))
                if a.op == "B" and a.stage < cfg[1] * cfg[3] - 1:
                    assert ("recv", "grad", a.mb, a.chunk) in done, (cfg, r, str(a))
                if a.op == "send":
                    assert ("F" if a.what == "act" else "B", "", a.mb, a.chunk) in done, (cfg, r, str(a))
                done.add((a.op, a.what, a.mb, a.chunk))


@pytest.mark.parametrize("sends", ["rendezvous", "eager"])
def test_no_schedule_deadlocks_when_ranks_run_their_lists_against_each_other(sends):
    for cfg in CONFIGS:
        events = simulate(_build(cfg), sends=sends)
        assert len([e for e in events if e.is_compute]) == 2 * cfg[2] * cfg[3] * cfg[1], cfg


def test_the_naive_placement_deadlocks_with_blocking_sends_and_the_simulator_says_where():
    sched = build("1f1b", 2, 4, policy="naive")
    with pytest.raises(DeadlockError) as err:
        simulate(sched, sends="rendezvous")
    stuck = err.value.stuck
    # rank 0 sends an activation to rank 1 while rank 1 sends a gradient to rank 0: each waits for the other
    assert stuck[0].op == "send" and stuck[0].what == "act" and stuck[0].peer == 1
    assert stuck[1].op == "send" and stuck[1].what == "grad" and stuck[1].peer == 0
    simulate(sched, sends="eager")  # posted sends get past it: why Megatron posts sends and receives together


def test_the_simulator_rejects_orders_that_would_move_the_wrong_tensor():
    sched = build("gpipe", 2, 3)
    assert [str(a) for a in sched[0][:4]] == ["F0", "send act 0 -> 1", "F1", "send act 1 -> 1"]
    assert [str(a) for a in sched[1][:3]] == ["recv act 0 <- 0", "F0", "recv act 1 <- 0"]
    early = [list(a) for a in sched]
    early[0][2], early[0][3] = early[0][3], early[0][2]  # send microbatch 1's activation before computing it
    with pytest.raises(ScheduleError, match="not been computed"):
        simulate(early)
    swapped = [list(a) for a in sched]
    swapped[1][0], swapped[1][2] = swapped[1][2], swapped[1][0]  # rank 1 expects microbatch 1 first
    with pytest.raises(ScheduleError, match="mismatched order"):
        simulate(swapped)
    with pytest.raises(ScheduleError, match="mismatched order"):
        simulate(swapped, sends="eager")


def test_peak_in_flight_microbatches_per_rank_match_the_formulas():
    for cfg in CONFIGS:
        name, p, m, v, n = cfg
        measured = peak_in_flight(simulate(_build(cfg)))
        assert measured == [A.peak_in_flight(name, p, m, r, v, n) for r in range(p)], cfg
    # the textbook values, independent of the helper: GPipe m; 1F1B p - r; interleaved rank 0 p + (p-1)/v stages
    assert peak_in_flight(simulate(build("gpipe", 4, 8))) == [8, 8, 8, 8]
    assert peak_in_flight(simulate(build("1f1b", 4, 8))) == [4, 3, 2, 1]
    for p, v in [(2, 2), (4, 2), (4, 3), (8, 2)]:
        assert peak_in_flight(simulate(build("interleaved", p, 4 * p, v)))[0] / v == p + (p - 1) / v


@pytest.mark.parametrize("cost", [(1, 1), (1, 2), (2, 3)])
def test_bubble_of_the_simulated_schedule_equals_the_formula(cost):
    for cfg in CONFIGS:
        name, p, m, v, _ = cfg
        sched = _build(cfg, cost_f=cost[0], cost_b=cost[1])
        b = bubble(simulate(sched, *cost, sends="eager"))
        assert b.relative == pytest.approx([A.bubble_fraction(p, m, v)] * p, abs=1e-12), cfg
        assert b.share == pytest.approx([A.bubble_share(p, m, v)] * p, abs=1e-12), cfg
        # a chunk costs cost_f / cost_b, so a whole stage costs v times that
        assert b.step_time == pytest.approx(A.step_time(p, m, v * cost[0], v * cost[1], v), abs=1e-9), cfg
        if name != "interleaved" or cost[0] == cost[1]:
            rdv = bubble(simulate(sched, *cost, sends="rendezvous"))
            assert rdv.relative == pytest.approx([A.bubble_fraction(p, m, v)] * p, abs=1e-12), cfg


def test_blocking_sends_add_bubble_to_interleaving_when_a_backward_costs_more_than_a_forward():
    sched = build("interleaved", 2, 8, 2)  # placed for t_b = 2 t_f
    eager = bubble(simulate(sched, 1, 2, sends="eager")).mean_relative
    blocking = bubble(simulate(sched, 1, 2, sends="rendezvous")).mean_relative
    assert eager == pytest.approx(A.bubble_fraction(2, 8, 2))
    assert blocking > eager + 0.05


def test_interleaved_order_is_megatrons_schedule_table():
    # Megatron-Core's own example (schedules.py, PP2 N3 M5 VP2): virtual microbatch 0..9 ->
    #   microbatch 0 1 2 0 1 2 3 4 3 4, chunk 0 0 0 1 1 1 0 0 1 1
    table = interleaved_table(5, 2, 3)
    assert [mb for mb, _ in table] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [c for _, c in table] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    order = compute_order("interleaved", 2, 4, 0, 2)
    # rank 0, p=2, v=2: 2(p-1) + (v-1)p = 4 warm-up forwards, then one forward / one backward
    assert [str(a) for a in order[:6]] == ["F0", "F1", "F0.c1", "F1.c1", "F2", "B0.c1"]


@pytest.mark.parametrize(
    "p, m, v, n, message",
    [
        (2, 3, 2, None, "m divisible by p: m=3, p=2"),
        (4, 2, 2, None, "at least p microbatches: m=2 < p=4"),
        (2, 4, 1, None, "v >= 2"),
        (1, 4, 2, None, "p >= 2"),
        (2, 7, 2, 3, "m % N == 0 or m % N >= p: m=7, N=3"),
        (4, 8, 2, 3, "p <= N <= m"),
    ],
)
def test_interleaved_rejects_microbatch_counts_megatron_rejects(p, m, v, n, message):
    with pytest.raises(ScheduleError, match=message.replace("(", r"\(")):
        build("interleaved", p, m, v, group_size=n)


def test_schedule_sizes_are_checked():
    with pytest.raises(ScheduleError, match="v=2"):
        build("1f1b", 2, 4, 2)
    with pytest.raises(ScheduleError, match="unknown schedule"):
        build("zero-bubble", 2, 4)
    with pytest.raises(ScheduleError, match="m=0"):
        build("gpipe", 2, 0)


def test_layers_not_divisible_by_stages_times_chunks_is_an_error():
    with pytest.raises(ValueError, match=r"n_layers=6 is not divisible by pp × v = 2 × 2 = 4"):
        check_split(6, 2, 2)
    with pytest.raises(ValueError, match=r"n_layers=6 is not divisible by pp × v = 4 × 1 = 4"):
        split_model(build_model(ModelConfig(n_layers=6)), 4)


def test_chunk_c_of_rank_r_holds_layer_block_c_times_p_plus_r():
    assert [[list(rg) for rg in row] for row in stage_layers(8, 2, 2)] == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    assert [[list(rg) for rg in row] for row in stage_layers(8, 4, 1)] == [[[0, 1]], [[2, 3]], [[4, 5]], [[6, 7]]]
    chunks = split_model(build_model(ModelConfig(n_layers=8)), 2, 2)
    assert chunks[0][0].embed is not None and chunks[1][1].lm_head is not None
    assert [c.layer_ids for row in chunks for c in row] == [[0, 1], [4, 5], [2, 3], [6, 7]]


def test_the_stage_chunks_run_in_stage_order_are_the_reference_model():
    cfg = tiny().with_(n_layers=6)
    ref = build_model(cfg)
    ids, targets = random_tokens(cfg, 2, 8)
    chunks = split_model(ref, 3, 2)
    stages = sorted((c for row in chunks for c in row), key=lambda c: c.stage)
    x = ids
    for c in stages:
        x = c(x)
    torch.testing.assert_close(x, ref(ids), rtol=0, atol=0)
    x = ids
    for c in stages[:-1]:
        x = c(x)
    torch.testing.assert_close(stages[-1](x, targets), ref.loss(ids, targets), rtol=0, atol=0)
    names = sorted(n for row in chunks for c in row for n, _ in c.named_parameters())
    assert names == sorted(n for n, _ in ref.named_parameters())


def test_point_to_point_messages_of_a_schedule_match_the_traffic_formula():
    b, s, h, nbytes = 2, 8, 16, 8
    for cfg in CONFIGS:
        name, p, m, v, _ = cfg
        sched = _build(cfg)
        per_rank = [sum(a.op == "send" for a in actions) * A.p2p_message_bytes(b, s, h, nbytes) for actions in sched]
        assert per_rank == [A.p2p_bytes_per_rank(b, s, h, nbytes, p, m, r, v) for r in range(p)], cfg
        assert sum(per_rank) == A.p2p_bytes_per_step(b, s, h, nbytes, p, m, v)


def test_placement_puts_each_message_where_both_ends_are_between_computes():
    # under the costs the schedule was placed for, a blocking send never waits for its receiver (1F1B, GPipe)
    for name in ("gpipe", "1f1b"):
        events = simulate(build(name, 4, 8), 1, 2, sends="rendezvous")
        assert all(e.duration == 0 for e in events if e.kind == "send"), name
    orders = [compute_order("1f1b", 2, 4, r) for r in range(2)]
    actions, _ = place_communication(orders, 2, 1)
    # rank 1 takes microbatch 1's activation *before* its first backward (rank 0 finished it at the same moment),
    # so rank 0's second send and rank 1's first gradient send never face each other as in the naive order
    assert [str(a) for a in actions[1][:5]] == ["recv act 0 <- 0", "F0", "recv act 1 <- 0", "B0", "send grad 0 -> 0"]


def test_shard_specs_give_every_reference_weight_to_exactly_one_rank_whole():
    model = build_model(ModelConfig(n_layers=8))
    specs = [s for r in range(2) for s in shard_specs(model, r, 2, 2)]
    assert sorted(s.name for s in specs) == sorted(n for n, _ in model.named_parameters())
    assert all(s.axis == "pp" and s.kind == "stage" and s.dim is None and s.fraction == 1.0 for s in specs)
    rank1 = {s.name.split(".")[1] for s in shard_specs(model, 1, 2, 2) if s.name.startswith("layers.")}
    assert rank1 == {"2", "3", "6", "7"}


def test_weights_per_rank_from_shard_specs_equal_the_formula():
    cfg = tiny().with_(n_layers=8, dtype="float32")
    model = build_model(cfg)
    layer = sum(q.numel() for q in model.layers[0].parameters())
    embed = model.embed.weight.numel()
    head = sum(q.numel() for q in model.ln_f.parameters()) + model.lm_head.weight.numel()
    for p, v in [(1, 1), (2, 1), (4, 1), (2, 2), (4, 2), (8, 1)]:
        held = [sum(torch.Size(s.local_shape).numel() for s in shard_specs(model, r, p, v)) for r in range(p)]
        assert held == [A.params_per_rank(p, r, cfg.n_layers, layer, embed, head, v) for r in range(p)], (p, v)
        assert sum(held) == sum(q.numel() for q in model.parameters())
    with pytest.raises(ValueError, match="n_layers=8 is not divisible by pp × v = 3 × 1 = 3"):
        A.params_per_rank(3, 0, 8, layer, embed, head)


def test_an_interleaved_order_megatron_rejects_still_runs_but_its_bubble_exceeds_the_formula():
    # p=4, v=2, m=6 in groups of N=4: the last group holds 2 < p microbatches
    with pytest.raises(ScheduleError, match="m divisible by p: m=6, p=4"):
        build("interleaved", 4, 6, 2)
    loose = build("interleaved", 4, 6, 2, strict=False)
    for r in range(4):
        done = sorted((a.op, a.mb, a.chunk) for a in loose.compute(r))
        assert done == sorted((op, i, c) for op in "FB" for i in range(6) for c in range(2))
    for sends in ("rendezvous", "eager"):
        simulate(loose, sends=sends)  # no deadlock
    short = bubble(simulate(loose, 1, 2, sends="eager")).mean_relative
    assert short > 1.5 * A.bubble_fraction(4, 6, 2)
    # a group size Megatron accepts (N = 6: p <= N <= m, m % N == 0) gives the formula back
    fine = bubble(simulate(build("interleaved", 4, 6, 2, group_size=6), 1, 2, sends="eager")).mean_relative
    assert fine == pytest.approx(A.bubble_fraction(4, 6, 2), abs=1e-12)
    # strict=True orders are unchanged by the switch
    assert build("interleaved", 4, 8, 2, strict=False).actions == build("interleaved", 4, 8, 2).actions
    with pytest.raises(ScheduleError, match="v >= 2"):
        build("interleaved", 4, 6, 1, strict=False)


# ------------------------------------------------------------------------------------------- zero bubble


def _zb_configs(ps):
    """(name, p, m) for the zero-bubble schedules over every p in `ps` and m from the smallest allowed to 3p+1."""
    out = []
    for p in ps:
        for m in range(p, 3 * p + 2):
            out.append(("zb-h1", p, m))
            if m >= 2 * p - 1:
                out.append(("zb-h2", p, m))
    return out


@pytest.mark.parametrize("ps", [pytest.param(range(1, 5)), pytest.param(range(5, 9), marks=pytest.mark.slow)])
def test_zero_bubble_lists_hold_one_f_b_and_w_per_microbatch_w_after_its_b_and_cannot_deadlock(ps):
    for name, p, m in _zb_configs(ps):
        sched = build(name, p, m)
        for r in range(p):
            order = [(a.op, a.mb) for a in sched.compute(r)]
            assert sorted(order) == sorted((op, i) for op in "FBW" for i in range(m)), (name, p, m, r)
            assert all(order.index(("W", i)) > order.index(("B", i)) for i in range(m)), (name, p, m, r)
            assert sched.deferred(r) == {(i, 0) for i in range(m)}
        for sends in ("rendezvous", "eager"):  # the placement argument of the module docstring, checked
            events = simulate(sched, 1.0, 1.0, sends=sends, cost_w=1.0)
            assert len([e for e in events if e.is_compute]) == 3 * m * p, (name, p, m)


COSTS = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1.5, 1.25, 0.5), (1, 1, 0.25)]  # T_W <= T_F and T_W <= T_B


@pytest.mark.parametrize("cost", COSTS, ids=str)
def test_bubbles_of_1f1b_and_zb_h1_are_the_published_formulas_on_the_busiest_rank(cost):
    t_f, t_b, t_w = cost
    for p, m in [(2, 2), (2, 5), (3, 3), (3, 7), (4, 4), (4, 9), (8, 8), (8, 17)]:
        for name, formula in [("1f1b", (p - 1) * (t_f + t_b + t_w)), ("zb-h1", (p - 1) * (t_f + t_b - t_w))]:
            sched = build(name, p, m, cost_f=t_f, cost_b=t_b, cost_w=t_w)
            b = bubble(simulate(sched, t_f, t_b, cost_w=t_w))
            assert max(b.own_idle) == pytest.approx(formula), (name, p, m)
            assert b.idle[0] == pytest.approx(formula)  # rank 0 starts first and ends last: the step's bubble


def test_zb_h1_bubble_exceeds_its_formula_when_a_w_costs_more_than_a_forward():
    b = bubble(simulate(build("zb-h1", 4, 8, cost_f=1, cost_b=1, cost_w=2), 1, 1, cost_w=2))
    formula = (4 - 1) * (1 + 1 - 2)
    assert formula == 0 and max(b.own_idle) == 3.0  # the formula's condition T_W <= T_F matters


def test_zb_h2_has_no_bubble_on_any_rank_at_equal_costs_and_1f1b_keeps_its_trapezoid():
    for p, m in [(2, 3), (2, 8), (3, 5), (4, 7), (4, 12), (8, 15), (8, 24)]:
        for scale in (1.0, 2.5):
            c = dict(cost_f=scale, cost_b=scale, cost_w=scale)
            zb = bubble(simulate(build("zb-h2", p, m, **c), scale, scale, cost_w=scale))
            assert zb.own_idle == pytest.approx([0.0] * p), (p, m)
            # the parallelogram: rank r starts r forwards late and ends as late, so the step still spans
            # (p-1) T_F more than one rank's work -- what the optimizer step's synchronization costs
            assert zb.step_time == pytest.approx(3 * m * scale + (p - 1) * scale)
            one = bubble(simulate(build("1f1b", p, m, **c), scale, scale, cost_w=scale))
            assert max(one.own_idle) == pytest.approx(3 * (p - 1) * scale)


def test_microbatches_in_flight_1f1b_p_minus_r_zb_h1_p_on_every_rank_zb_h2_up_to_2p_minus_1():
    for p, m in [(2, 4), (4, 8), (4, 13), (8, 16)]:
        one = peak_in_flight(simulate(build("1f1b", p, m), 1.0, 2.0))
        h1 = peak_in_flight(simulate(build("zb-h1", p, m), 1.0, 1.0, cost_w=1.0))
        h2 = peak_in_flight(simulate(build("zb-h2", p, m), 1.0, 1.0, cost_w=1.0))
        assert one == [p - r for r in range(p)]
        assert h1 == [p] * p
        assert max(h2) == h2[0] == 2 * p - 1 and all(x <= 2 * p - 1 for x in h2)


@pytest.mark.parametrize(
    "name, p, m, v, message",
    [
        ("zb-h1", 4, 3, 1, r"zb-h1 needs at least as many microbatches as ranks: m=3 < p=4"),
        ("zb-h2", 4, 6, 1, r"zb-h2 needs m >= 2p-1 microbatches: m=6, p=4, 2p-1=7"),
        ("zb-h1", 2, 4, 2, r"zb-h1 runs one chunk per rank \(v=1\), got v=2"),
        ("zb-h3", 2, 4, 1, r"unknown schedule 'zb-h3'"),
    ],
)
def test_zero_bubble_schedules_refuse_sizes_they_cannot_run_naming_the_constraint(name, p, m, v, message):
    with pytest.raises(ScheduleError, match=message):
        build(name, p, m, v)
    assert name not in ZERO_BUBBLE or build(name, p, 2 * p, 1).name == name


def test_a_w_before_its_b_is_reported_by_the_simulator():
    sched = build("zb-h1", 2, 2)
    bad = [list(x) for x in sched]
    i = next(k for k, a in enumerate(bad[1]) if a.op == "W")
    j = next(k for k, a in enumerate(bad[1]) if a.op == "B" and a.mb == bad[1][i].mb)
    bad[1][i], bad[1][j] = bad[1][j], bad[1][i]
    with pytest.raises(ScheduleError, match="runs before its B"):
        simulate(bad)


def test_zb_h1_bubble_rate_is_p_minus_1_over_3m_of_the_work_and_p_minus_1_over_3m_plus_p_minus_1_of_the_step():
    # the two ways of quoting ZB-H1's bubble at T_F = T_B = T_W: idle / busy (the textbook's ratio, as (p-1)/m for
    # 1F1B) and idle / step time; the zero-bubble repository's (p-1)/3m is the first
    for p, m in [(2, 2), (4, 8), (8, 8), (8, 24)]:
        b = bubble(simulate(build("zb-h1", p, m), 1.0, 1.0, cost_w=1.0))
        assert b.relative[0] == pytest.approx((p - 1) / (3 * m))
        assert b.share[0] == pytest.approx((p - 1) / (3 * m + p - 1))
