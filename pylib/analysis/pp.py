"""Pipeline-parallel formulas: bubble, microbatches in flight, activation memory, point-to-point traffic, weights.

Symbols: p pipeline ranks, m microbatches per step, v model chunks per rank (interleaving; v = 1 otherwise),
N microbatches per group in the interleaved schedule (Megatron's microbatch_group_size_per_vp_stage, default p),
b microbatch size, s sequence length, h hidden size, t_f / t_b the forward / backward time of one rank's whole
stage for one microbatch (a chunk takes t_f / v).

Bubble. A rank computes for m·(t_f + t_b) per step; GPipe and 1F1B both leave each rank idle for (p-1)·(t_f + t_b)
(the pipeline fills and drains once), so idle / ideal = (p-1)/m. Interleaving makes each fill-and-drain step a
chunk, v times shorter: (p-1)/(v·m). As a share of the whole step the same idle time is (p-1)/(v·m + p - 1).

In flight (activations a rank holds at its peak, counted in (microbatch, chunk) pairs):
    GPipe          m                                   every forward runs before any backward
    1F1B           min(p - r, m)                       the warm-up depth p - r - 1, plus the one in 1F1B
    interleaved    min(2(p-r-1) + (v-1)·N + 1, v·m)    Megatron's warm-up, plus one
A chunk's activations are 1/v of a stage's, so interleaving rank 0 holds (v·p + p - 1)/v = p + (p-1)/v stage
microbatches with N = p (Korthikanti et al. 2022) -- slightly more than 1F1B's p.

The group size N. Megatron accepts p <= N <= m with m % N == 0 or m % N >= p (`schedules.check_interleaved`).
Over that range the bubble stays (p-1)/(v·m) (`simulated_bubble_fraction` runs the schedule and finds it) while the
warm-up grows by v-1 forwards per unit of N: N = p holds the fewest activations. N < p is no option of Megatron's
order: with m a multiple of p its warm-up then deadlocks for every N < p (`logical_times` finds it for p 4, 8, 16
and v 2, 4, 8: a rank waits for a forward its ring neighbour runs only after a backward that waits on it).

Zero bubble (B and W split; t_b: the input gradient B, t_w: the weight gradient W, a fused backward t_b + t_w).
The bubble is the busiest rank's idle time between its own first and last compute (rank 0's, in all three):
    1F1B, GPipe    (p-1)(t_f + t_b + t_w)
    ZB-H1          (p-1)(t_b + max(t_f - t_w, 0))     = the paper's (p-1)(t_f + t_b - t_w) when t_w <= t_f
    ZB-H2          0 at equal costs, the costs its order is built for
    ZB-V           0 at equal costs once m >= 2p - 1 (two chunks per rank in a V; (2p-1-m) t_f for p <= m < 2p-1)
    DualPipeV      (p-1)(t_fb + t_b - 2 t_w), DeepSeek's (PP/2-1)(F&B + B - 3W) with PP = 2p, B = t_b + t_w, met
                   when t_f = t_b and the F&B slot t_fb = t_f + t_b + t_w (no overlap, as on a CPU)
Rank 0, ZB-H1: after its p warm-up forwards it waits (p-1) t_b for the first input gradient, with no W yet to fill
the wait; after its last forward that microbatch's gradient is (p-1)(t_f + t_b) away while (p-1)(t_b + t_w) of B's
and W's are left to run: (p-1)(t_f - t_w) more when that is positive. In 1F1B every hop back costs t_b + t_w:
(p-1)(t_b + t_w) + (p-1) t_f. In flight: ZB-H1 holds p on every rank (rank r runs the W of microbatch k after the B
of k + r: 1F1B's p - r plus r), ZB-H2 2p - 1 on every rank (its forward limit), ZB-V 2p chunk activations of
half a stage each, 1F1B's p stages on every rank; each deferred W also keeps its
output gradients (`pylib.pp.backward`).

P2P traffic. Each of the p·v - 1 stage boundaries carries, per microbatch, one activation forward and its gradient
backward, each b·s·h elements of the activation dtype (divide s by the TP size with sequence parallelism and by the
CP size with context parallelism: the caller passes the local shape).
"""

from __future__ import annotations

import functools

from pylib.plan.schedules import (
    DUAL,
    V_SHAPED,
    ZERO_BUBBLE,
    ScheduleError,
    check_schedule,
    compute_order,
    deferred_weights,
    logical_times,
    stage_ranks,
    warmup_forwards,
)
from pylib.plan.split import chunk_layers


def bubble_fraction(p: int, n_microbatches: int, v: int = 1) -> float:
    """Idle time relative to the ideal (compute-only) time: (p-1)/(v·m)."""
    return (p - 1) / (v * n_microbatches)


@functools.lru_cache(maxsize=1024)
def simulated_bubble_fraction(
    schedule: str,
    p: int,
    n_microbatches: int,
    v: int = 1,
    group_size: int | None = None,
    cost_f: float = 1.0,
    cost_b: float = 2.0,
) -> float:
    """The bubble measured on the schedule itself: every rank's compute order (`schedules.compute_order`, N =
    `group_size` microbatches per group when interleaved) run against its data dependencies with a chunk's forward
    costing cost_f and its backward cost_b (`schedules.logical_times`); idle time relative to the ideal m v (cost_f
    + cost_b). Raises ScheduleError for a schedule Megatron rejects (`schedules.check_schedule`). Equal to
    `bubble_fraction` for every N Megatron accepts (tests/test_analysis_group_size.py)."""
    group = check_schedule(schedule, p, n_microbatches, v, group_size=group_size)
    orders = [compute_order(schedule, p, n_microbatches, r, v, group) for r in range(p)]
    times = logical_times(orders, p * v, cost_f, cost_b)
    ideal = n_microbatches * v * (cost_f + cost_b)
    return (max(end for _, end in times.values()) - ideal) / ideal


def bubble_share(p: int, n_microbatches: int, v: int = 1) -> float:
    """Idle time as a share of the step: (p-1)/(v·m + p - 1)."""
    return (p - 1) / (v * n_microbatches + p - 1)


def bubble_time(p: int, t_f: float, t_b: float, v: int = 1) -> float:
    """Idle time per rank per step: (p-1)·(t_f + t_b)/v (t_f, t_b: one whole stage, one microbatch)."""
    return (p - 1) * (t_f + t_b) / v


def dualpipe_bubble(pp_stages: int, f_and_b: float, b: float, w: float) -> float:
    """DeepSeek's published bubble of DualPipe and DualPipeV, in their notation: (PP/2 - 1)(F&B + B - 3W), with PP
    the number of pipeline stages (DualPipeV: 2p stages on p ranks), B the *full* backward (input and weight
    gradient, our t_b + t_w), W the weight gradient alone and F&B one overlapped forward-and-backward slot."""
    return (pp_stages / 2 - 1) * (f_and_b + b - 3 * w)


def split_bubble_time(schedule: str, p: int, t_f: float, t_b: float, t_w: float, t_fb: float | None = None) -> float:
    """The busiest rank's idle time per step (inside its own span) with the backward's B costing t_b and W t_w (a
    fused backward t_b + t_w); see the module docstring for the derivation. ZB-H2 and ZB-V are zero at equal costs
    only: their orders are built for them, so other costs raise. DualPipeV (t_fb: one F&B slot, default t_f + t_b
    + t_w, the two back to back): DeepSeek's `dualpipe_bubble` with PP = 2p and B = t_b + t_w, which its schedule
    meets exactly when t_f = t_b and t_fb = t_f + t_b + t_w (tests/test_pp_dualpipe.py); other costs raise."""
    if schedule in ("gpipe", "1f1b"):
        return bubble_time(p, t_f, t_b + t_w)
    if schedule == "zb-h1":
        return (p - 1) * (t_b + max(t_f - t_w, 0.0))
    if schedule == "dualpipev":
        t_fb = t_f + t_b + t_w if t_fb is None else t_fb
        if not (t_f == t_b and t_fb == t_f + t_b + t_w):
            raise ValueError(
                f"dualpipev meets DeepSeek's (p-1)(F&B + B - 3W) when t_f = t_b and t_fb = t_f + t_b + t_w; got "
                f"t_f={t_f}, t_b={t_b}, t_w={t_w}, t_fb={t_fb} (simulate the schedule for these costs)"
            )
        return dualpipe_bubble(2 * p, t_fb, t_b + t_w, t_w)
    if schedule in ("zb-h2", "zb-v"):
        if not t_f == t_b == t_w:
            raise ValueError(f"{schedule}'s zero bubble holds at equal costs; got t_f={t_f}, t_b={t_b}, t_w={t_w}")
        return 0.0
    raise ScheduleError(
        f"no split-backward bubble formula for {schedule!r}; known: gpipe, 1f1b, {', '.join(ZERO_BUBBLE)}"
    )


def step_time(p: int, n_microbatches: int, t_f: float, t_b: float, v: int = 1) -> float:
    """Ideal pipelined step time: m·(t_f + t_b) of compute plus the bubble."""
    return n_microbatches * (t_f + t_b) + bubble_time(p, t_f, t_b, v)


def peak_in_flight(
    schedule: str, p: int, n_microbatches: int, rank: int, v: int = 1, group_size: int | None = None
) -> int:
    """Most (microbatch, chunk) activations rank `rank` holds at once under `schedule`: its warm-up forwards
    (`schedules.warmup_forwards`, the one warm-up formula) plus the one of its first steady 1F1B step, at most its
    v·m forwards. A zero-bubble schedule holds an activation until its W: ZB-H1 p on every rank, ZB-H2 2p - 1,
    ZB-V 2p chunk activations (each half a stage: 1F1B's p stages), min(2p, m + 1 + r) when m < 2p - 1;
    DualPipeV 2p + 1 (DeepSeek's PP + 1 with PP = 2p stages)."""
    if schedule in ZERO_BUBBLE:
        check_schedule(schedule, p, n_microbatches, v, group_size=group_size)
        if schedule == "zb-v":
            return min(2 * p, n_microbatches + 1 + rank)
        if schedule == "dualpipev":
            return 2 * p + 1
        return p if schedule == "zb-h1" else 2 * p - 1
    return min(warmup_forwards(schedule, p, n_microbatches, rank, v, group_size) + 1, v * n_microbatches)


def activation_memory(
    schedule: str,
    p: int,
    n_microbatches: int,
    rank: int,
    bytes_per_microbatch: float,
    v: int = 1,
    group_size: int | None = None,
) -> float:
    """Peak activation bytes of rank `rank`: in-flight (microbatch, chunk) pairs x the bytes one chunk saves for
    one microbatch (`bytes_per_microbatch`, e.g. measured with `pylib.model.saved_activations`)."""
    return peak_in_flight(schedule, p, n_microbatches, rank, v, group_size) * bytes_per_microbatch


def p2p_message_bytes(b: int, s: int, h: int, dtype_bytes: int) -> int:
    """One activation (or its gradient) crossing one stage boundary: b·s·h elements."""
    return b * s * h * dtype_bytes


def p2p_bytes_per_step(
    b: int, s: int, h: int, dtype_bytes: int, p: int, n_microbatches: int, v: int = 1, placement: str = "loop"
) -> int:
    """Bytes sent over all links in one step, both directions: 2·(p·v - 1)·m·b·s·h·dtype_bytes. In the V placement
    (ZB-V, DualPipeV: v = 2) the boundary between stages p-1 and p lies inside rank p-1 and sends nothing:
    2·(2p - 2)·m·b·s·h·dtype_bytes, twice 1F1B's."""
    if placement == "v":
        ranks = stage_ranks(p, v, placement)
        boundaries = sum(ranks[k] != ranks[k + 1] for k in range(p * v - 1))
    else:
        boundaries = p * v - 1
    return 2 * boundaries * n_microbatches * p2p_message_bytes(b, s, h, dtype_bytes)


def p2p_bytes_per_rank(
    b: int,
    s: int,
    h: int,
    dtype_bytes: int,
    p: int,
    n_microbatches: int,
    rank: int,
    v: int = 1,
    placement: str = "loop",
) -> int:
    """Bytes rank `rank` sends in one step (it receives the same amount): for each of its chunks, m activations
    forward unless it holds the last stage, and m gradients backward unless it holds the first; in the V placement
    (`schedules.stage_ranks`) none across the turn, where the next stage is on the same rank."""
    ranks = stage_ranks(p, v, placement)
    n_stages = p * v
    messages = 0
    for k in (k for k in range(n_stages) if ranks[k] == rank):
        messages += (k < n_stages - 1 and ranks[k + 1] != rank) + (k > 0 and ranks[k - 1] != rank)
    return messages * n_microbatches * p2p_message_bytes(b, s, h, dtype_bytes)


# ------------------------------------------------------------------------------------------------ the planner's ZB


@functools.lru_cache(maxsize=64)
def split_orders(schedule: str, p: int, n_microbatches: int) -> tuple[tuple, ...]:
    """Every rank's compute order of a zero-bubble schedule or DualPipe (`schedules.compute_order`, v = 2 for the
    V-shaped ones and DualPipe's two copies), remembered: ZB-H2's list scheduling builds all ranks at once and takes
    a second at p = 16, m = 128."""
    v = 2 if schedule in V_SHAPED + DUAL else 1
    check_schedule(schedule, p, n_microbatches, v)
    return tuple(tuple(compute_order(schedule, p, n_microbatches, r, v)) for r in range(p))


@functools.lru_cache(maxsize=4096)
def simulated_split_bubble(schedule: str, p: int, n_microbatches: int, t_f: float, t_b: float, t_w: float) -> float:
    """The seconds a step of `schedule` lasts beyond its compute, m (t_f + t_b + t_w), when every rank's whole stage
    costs t_f forward, t_b for the input gradient B and t_w for the weight gradient W per microbatch (a chunk of the
    V's two: half of each): its compute orders run against their data dependencies (`schedules.logical_times`,
    what `pylib.pp.simulate` runs, communication free; DualPipeV's F&B slot its two halves back to back) and the
    last action's end taken. This is the makespan, not one rank's own idle time (`split_bubble_time`): a schedule
    with no idle time inside any rank's span still starts its last rank (p - 1) chunk forwards after its first,
    (p - 1) t_f for ZB-H2, (p - 1) t_f / 2 for ZB-V at equal costs, and the optimizer step waits for every rank.
    For 1F1B and ZB-H1 the two agree (tests/test_analysis_planner_zb.py)."""
    v = 2 if schedule in V_SHAPED else 1
    if schedule in ("gpipe", "1f1b"):
        return bubble_time(p, t_f, t_b + t_w)
    orders = [list(o) for o in split_orders(schedule, p, n_microbatches)]
    times = logical_times(orders, p * v, t_f / v, t_b / v, t_w / v)
    return max(end for _, end in times.values()) - n_microbatches * (t_f + t_b + t_w)


@functools.lru_cache(maxsize=4096)
def split_live_counts(schedule: str, p: int, n_microbatches: int, rank: int) -> tuple[tuple[tuple, tuple], ...]:
    """What rank `rank` of a zero-bubble schedule holds for its backward after each of its actions, as (saved, kept)
    vectors over its chunks: `saved[c]` microbatches whose forward ran and whose W (or fused backward) has not,
    `kept[c]` of those whose B ran before a deferred W, each keeping the output gradients W needs
    (`pylib.pp.backward`); only the pairs no other pair dominates. Replayed on the compute order alone. DualPipe
    ("dualpipe") too: its chunk 0 the rank's model stage r, chunk 1 stage p - 1 - r (`schedules._dualpipe`)."""
    order = split_orders(schedule, p, n_microbatches)[rank]
    deferred = deferred_weights(order)
    v = 2 if schedule in V_SHAPED + DUAL else 1
    saved, kept = [0] * v, [0] * v
    seen = set()
    for a in order:
        if a.op == "F":
            saved[a.chunk] += 1
        elif a.op == "B" and (a.mb, a.chunk) in deferred:
            kept[a.chunk] += 1
        else:  # a W, or a backward that runs whole: the microbatch's tensors go
            saved[a.chunk] -= 1
            kept[a.chunk] -= a.op == "W"
        seen.add((tuple(saved), tuple(kept)))
    return tuple(x for x in seen if not any(y != x and _dominates(y, x) for y in seen))


def _dominates(y: tuple, x: tuple) -> bool:
    return all(a >= b for a, b in zip(y[0] + y[1], x[0] + x[1], strict=True))


def params_per_rank(
    p: int, rank: int, n_layers: int, layer_params: int, embed_params: int, head_params: int, v: int = 1
) -> int:
    """Parameters rank `rank` holds: its L/p layers (v chunks of L/(p·v)), plus the embedding on rank 0 (virtual
    stage 0) and the final norm and LM head (`head_params`) on rank p-1 (virtual stage p·v-1). Every tensor is held
    whole: PP distributes the weights, it does not cut them."""
    held = sum(len(c) for c in chunk_layers(n_layers, p, v, rank))  # the one layer split (pylib.plan.split)
    return held * layer_params + (rank == 0) * embed_params + (rank == p - 1) * head_params
