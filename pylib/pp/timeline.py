"""Timelines and what is measured from them: the bubble and the microbatches in flight.

A timeline is a list of `Event`s, one per forward, backward, send and receive of every rank. `simulate` makes one
in logical time units from a pure schedule; the executor records one in seconds from a real run. The same
functions measure both, so the book can set the formula, the simulation and the real run side by side.

Bubble: with T the step time (first compute start to last compute end, over all ranks) and busy_r the time rank r
spent computing, rank r idled T - busy_r. The textbook figure is that idle time *relative to the ideal* time,
(T - busy_r) / busy_r, which is (p-1)/m for GPipe and 1F1B and (p-1)/(v·m) for interleaved 1F1B (see
`pylib.analysis.pp`); as a share of the step it is (T - busy_r) / T = (p-1)/(m+p-1) for GPipe.

Own idle: the time rank r idles between its own first compute and its own last, the bubble the zero-bubble paper
counts (ranks that need not wait for each other at the optimizer step start and end at different times: ZB-H2's
parallelogram has none). For 1F1B and ZB-H1 the busiest rank, rank 0, starts first and ends last, so its own
idle is the step's bubble.

A zero-bubble timeline has W events (the weight gradient, `pylib.plan.schedules`): a microbatch stays in flight
from its F to its W; a B with no W of its own ends it, as before.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pylib.plan.schedules import Action, compute_cost, deferred_weights, logical_times


@dataclass(frozen=True)
class Event:
    """One interval of one rank's timeline (logical units from `simulate`, seconds from the executor).

    rank: pp-group index; kind: "F", "B", "W", "send" or "recv"; mb, chunk, stage: the microbatch, this rank's chunk and
    its virtual stage; what: "act" / "grad" for communication; peer: the other rank. A communication interval runs
    from the moment the rank reached the op to the moment it completed (so it includes waiting for the peer)."""

    rank: int
    kind: str
    mb: int
    chunk: int
    stage: int
    start: float
    end: float
    what: str = ""
    peer: int | None = None

    @classmethod
    def of(cls, rank: int, a, start: float, end: float) -> Event:
        """The interval rank `rank` spent on action `a` (a `pylib.plan.schedules.Action`)."""
        comm = a.is_comm  # a compute's `what` is "" or "&" (a forward overlapped with the next B: DualPipe's F&B)
        return cls(rank, a.op, a.mb, a.chunk, a.stage, start, end, a.what, a.peer if comm else None)

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def is_compute(self) -> bool:
        return self.kind in ("F", "B", "W")

    def as_dict(self) -> dict:
        return asdict(self)


def as_events(timeline) -> list[Event]:
    """Accept Events or their dicts (what a launched rank returns after pickling)."""
    return [e if isinstance(e, Event) else Event(**e) for e in timeline]


@dataclass(frozen=True)
class Bubble:
    """Bubble measured from a timeline. Per-rank lists are indexed by rank."""

    step_time: float
    busy: list[float]  # compute time of each rank
    idle: list[float]  # step_time - busy
    relative: list[float]  # idle / busy: the bubble relative to the ideal time, the textbook's (p-1)/m
    share: list[float]  # idle / step_time: the share of the step the rank idles
    own_idle: list[float]  # idle between the rank's own first compute start and its own last compute end

    @property
    def mean_relative(self) -> float:
        return sum(self.relative) / len(self.relative)

    @property
    def mean_share(self) -> float:
        return sum(self.share) / len(self.share)


def bubble(timeline) -> Bubble:
    """Step time, busy and idle time per rank, and the bubble fraction (relative to ideal, and as a share)."""
    compute = [e for e in as_events(timeline) if e.is_compute]
    if not compute:
        raise ValueError("the timeline has no forward or backward")
    t0, t1 = min(e.start for e in compute), max(e.end for e in compute)
    step = t1 - t0
    ranks = sorted({e.rank for e in compute})
    if ranks != list(range(len(ranks))):
        raise ValueError(f"the timeline covers ranks {ranks}; every rank 0..{ranks[-1]} must be present")
    busy = [sum(e.duration for e in compute if e.rank == r) for r in ranks]
    idle = [step - b for b in busy]
    span = [max(e.end for e in compute if e.rank == r) - min(e.start for e in compute if e.rank == r) for r in ranks]
    own = [s - b for s, b in zip(span, busy)]
    return Bubble(step, busy, idle, [i / b for i, b in zip(idle, busy)], [i / step for i in idle], own)


def peak_in_flight(timeline) -> list[int]:
    """Per rank: the most (microbatch, chunk) activations held at once -- forwards done whose backward (W, where
    the backward is split) is not."""
    events = sorted((e for e in as_events(timeline) if e.is_compute), key=lambda e: (e.rank, e.start))
    split = {(e.rank, e.mb, e.chunk) for e in events if e.kind == "W"}
    peak: dict[int, int] = {}
    live: dict[int, int] = {}
    for e in events:
        ends = e.kind == "W" or (e.kind == "B" and (e.rank, e.mb, e.chunk) not in split)
        live[e.rank] = live.get(e.rank, 0) + (1 if e.kind == "F" else -1 if ends else 0)
        peak[e.rank] = max(peak.get(e.rank, 0), live[e.rank])
    return [peak[r] for r in sorted(peak)]


def idle_intervals(timeline, rank: int) -> list[tuple[float, float]]:
    """The gaps between rank `rank`'s computes inside the step (what a figure shades as bubble)."""
    events = as_events(timeline)
    compute = [e for e in events if e.is_compute]
    t0, t1 = min(e.start for e in compute), max(e.end for e in compute)
    mine = sorted((e for e in compute if e.rank == rank), key=lambda e: e.start)
    gaps, t = [], t0
    for e in mine:
        if e.start > t:
            gaps.append((t, e.start))
        t = max(t, e.end)
    if t < t1:
        gaps.append((t, t1))
    return gaps


def replay(
    timeline, cost_f: float = 1.0, cost_b: float = 2.0, cost_w: float = 0.0, cost_fb: float | None = None
) -> list[Event]:
    """Re-time a recorded run in logical units: each rank's forwards and backwards in the order it actually ran
    them, a forward costing `cost_f` and a backward `cost_b` (a B `cost_b` and a W `cost_w` where split, an F&B
    slot `cost_fb`), each
    starting as soon as its rank is free and its input exists (messages free). Wall-clock noise drops out; the
    order the executor really followed stays, so the bubble of the replay is the schedule's own."""
    compute = [e for e in as_events(timeline) if e.is_compute]
    ranks = sorted({e.rank for e in compute})
    orders = [
        [
            Action(e.kind, e.mb, e.chunk, e.stage, e.what)
            for e in sorted((e for e in compute if e.rank == r), key=lambda e: e.start)
        ]
        for r in ranks
    ]
    n_stages = max(e.stage for e in compute) + 1
    times = logical_times(orders, n_stages, cost_f, cost_b, cost_w, cost_fb)
    out = []
    for r, order in zip(ranks, orders):
        deferred = deferred_weights(order)
        for i, a in enumerate(order):
            start, end = times[(a.op, a.mb, a.stage)]
            if a.overlapped or (i and order[i - 1].overlapped):  # an F&B slot: drawn as `simulate` draws it
                f, b = (a, order[i + 1]) if a.overlapped else (order[i - 1], a)
                own_b = compute_cost(b, deferred, cost_f, cost_b, cost_w)
                mid = start + (end - start) * cost_f / (cost_f + own_b)
                start, end = (start, mid) if a is f else (mid, end)
            out.append(Event.of(r, a, start, end))
    return out
