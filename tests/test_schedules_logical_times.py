"""`schedules.logical_times` to the bit: what the planner's simulated bubbles and the book's schedule figures read.

Every compute's start is the latest of its rank's previous end (0.0 first) and the ends of the computes it waits for,
its end that start plus its cost; an overlapped F&B slot gives both halves the slot's start and end. Those equalities
fix every number, so checking them with `==` on costs that are not whole numbers pins the simulator's floats (a
faster sweep must add and compare the same floats in the same order), without a second simulator."""

import pytest

from pylib.plan.schedules import (
    ALL_SCHEDULES,
    DUAL,
    V_SHAPED,
    compute_cost,
    compute_order,
    deferred_weights,
    logical_times,
    microbatch_spans,
    slot_cost,
)

COSTS = (0.7, 1.3, 0.45, 2.1)  # F, B, W, an F&B slot: sums of these round, so the order of the additions shows


def _inputs(a, spans) -> list[tuple[str, int, int]]:
    """What compute `a` waits for: its input activation (F), its own F and the next stage's B (B), its B (W)."""
    first, last = spans[a.mb]
    if a.op == "W":
        return [("B", a.mb, a.stage)]
    if a.op == "F":
        return [("F", a.mb, a.stage - 1)] if a.stage > first else []
    return [("F", a.mb, a.stage)] + ([("B", a.mb, a.stage + 1)] if a.stage < last else [])


def _cases():
    out = [("interleaved", 4, 12, 2, None), ("interleaved", 4, 14, 3, 5), ("interleaved", 3, 8, 2, 5)]
    out += [(name, 4, 8, 2 if name in V_SHAPED + DUAL else 1, None) for name in ALL_SCHEDULES if name != "interleaved"]
    return out


@pytest.mark.parametrize("name, p, m, v, n", _cases(), ids=lambda x: str(x))
def test_every_start_is_the_latest_of_its_rank_and_its_inputs_and_every_end_adds_its_cost(name, p, m, v, n):
    orders = [compute_order(name, p, m, r, v, n) for r in range(p)]
    cost_f, cost_b, cost_w, cost_fb = COSTS
    times = logical_times(orders, p * v, *COSTS)
    spans = microbatch_spans(orders)
    assert len(times) == sum(map(len, orders))
    for order in orders:
        deferred, clock, i = deferred_weights(order), 0.0, 0
        while i < len(order):
            a = order[i]
            slot = [a, order[i + 1]] if a.overlapped else [a]
            waits = [times[d][1] for x in slot for d in _inputs(x, spans)]
            if a.overlapped:
                cost = slot_cost(a, slot[1], deferred, cost_f, cost_b, cost_w, cost_fb)
            else:
                cost = compute_cost(a, deferred, cost_f, cost_b, cost_w)
            start = max([clock, *waits])
            for x in slot:
                assert times[(x.op, x.mb, x.stage)] == (start, start + cost), (name, str(x))
            clock = start + cost
            i += len(slot)
    assert any(a.overlapped for order in orders for a in order) == (name in ("dualpipev", "dualpipe"))
