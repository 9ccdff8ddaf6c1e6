"""Pipeline schedules as data: for each rank, the plain list of actions it performs in one training step.

    sched = one_f_one_b(p=4, n_microbatches=8)
    sched[0]            # rank 0's actions: [F mb0 c0, send act mb0 -> 1, F mb1 c0, send act mb1 -> 1, ...]
    simulate(sched)     # pylib.pp.simulate: run the lists against each other, no processes

An action is a forward (F) or backward (B) of microbatch `mb` on chunk `chunk` of this rank, or a send / recv of an
activation ("act", forward direction) or of its gradient ("grad", backward direction) to or from a neighbour.
The executor (`pylib.pp.executor.run_pipeline`) runs exactly these lists, so the figure the book draws from a
schedule *is* what the ranks do.

Compute order per rank (p ranks, m microbatches, v chunks per rank, rank r):
  GPipe        all m forwards, then all m backwards.                          in flight: m
  1F1B         p-r-1 warm-up forwards, then alternate one forward / one       in flight: min(p - r, m)
               backward, then the remaining backwards (PipeDream-Flush).
  interleaved  Megatron's order over the m·v (microbatch, chunk) pairs: microbatches in groups of N (default
               N = p), each group through chunk 0, then chunk 1, ...; 2(p-r-1) + (v-1)·N warm-up forwards, then 1F1B.
               in flight: min(2(p-r-1) + (v-1)·N + 1, m·v) chunk activations (each 1/v of a stage's).
  Megatron's constraint for interleaving: p <= N <= m and (m % N == 0 or m % N >= p); with the default N = p that
  is m % p == 0 (what older Megatron asserted as "number of microbatches must be divisible by pipeline size").

Where the communication goes, and why it cannot deadlock. gloo's blocking send waits for the matching receive
(a rendezvous; NCCL point-to-point behaves alike), so an order of sends and receives can deadlock even when the
computation could proceed: in 1F1B, rank 0 sends an activation to rank 1 while rank 1 sends a gradient to rank 0,
and both wait forever (`place_communication(..., policy="naive")` builds exactly that, for the book to show).
We place communication in three steps:
  1. Run the compute orders against their data dependencies with fixed costs (a forward costs `cost_f`, a
     backward `cost_b`; default 1 and 2) to get each compute's logical start and end.
  2. Give each message an exchange time: the first moment, from its producer's end to its consumer's start, when
     neither rank is in the middle of a compute (so that, under these costs, a blocking send waits for nobody).
  3. Each rank does its messages in one *global* order: by exchange time, then by link -- links (0,1), (2,3), ...
     before (1,2), (3,4), ...: the even/odd rule, so that disjoint neighbour pairs talk at the same time -- then
     activations before gradients.
Because every rank walks its own messages in the order of one global list, the earliest unfinished message
always has both its ends waiting for it, so it completes: no deadlock, for any p, m, v and any real timing. And
every receive comes before the compute that uses it, since the exchange time is at most the consumer's start.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from pylib.i18n import tr

from .split import virtual_stage

SCHEDULES = ("gpipe", "1f1b", "interleaved")


class ScheduleError(ValueError):
    """A schedule that cannot run: bad sizes, or a compute order whose dependencies can never be met."""


@dataclass(frozen=True)
class Action:
    """One step of one rank.

    op: "F" (forward), "B" (backward), "send" or "recv".
    mb: microbatch index, 0..m-1.
    chunk: this rank's chunk index, 0..v-1; stage: the virtual stage of that chunk (chunk·p + rank).
    what: for send / recv, "act" (an activation, forward direction) or "grad" (an activation's gradient).
    peer: for send / recv, the pp-group index of the other rank.
    For a send, (mb, stage) name the chunk that produced the tensor; for a recv, the chunk that will consume it.
    """

    op: str
    mb: int
    chunk: int
    stage: int
    what: str = ""
    peer: int | None = None

    @property
    def is_compute(self) -> bool:
        return self.op in ("F", "B")

    @property
    def is_comm(self) -> bool:
        return self.op in ("send", "recv")

    def message(self) -> tuple[str, int, int, int]:
        """(what, mb, from_stage, to_stage) of a send or recv: the same tuple on both ends of one message."""
        step = 1 if self.what == "act" else -1
        if self.op == "send":
            return (self.what, self.mb, self.stage, self.stage + step)
        if self.op == "recv":
            return (self.what, self.mb, self.stage - step, self.stage)
        raise ValueError(f"{self} is not a communication action")

    def __str__(self) -> str:
        if self.is_compute:
            return f"{self.op}{self.mb}" + (f".c{self.chunk}" if self.chunk else "")
        arrow = "->" if self.op == "send" else "<-"
        return f"{self.op} {self.what} {self.mb}" + (f".c{self.chunk}" if self.chunk else "") + f" {arrow} {self.peer}"


@dataclass
class Schedule:
    """A whole pipeline schedule: `actions[r]` is rank r's list. Index it like that list of lists: `sched[r]`.

    name: "gpipe", "1f1b" or "interleaved"; p ranks, m microbatches, v chunks per rank, N microbatches per group
    (interleaved only). `times[r]` holds, for each compute action of rank r, its logical (start, end) from the
    placement step (with costs cost_f, cost_b).
    """

    name: str
    p: int
    m: int
    v: int
    actions: list[list[Action]]
    group_size: int | None = None
    cost_f: float = 1.0
    cost_b: float = 2.0
    times: list[dict[Action, tuple[float, float]]] = field(default_factory=list, repr=False)

    def __getitem__(self, rank: int) -> list[Action]:
        return self.actions[rank]

    def __len__(self) -> int:
        return self.p

    def __iter__(self):
        return iter(self.actions)

    @property
    def n_stages(self) -> int:
        return self.p * self.v

    def compute(self, rank: int) -> list[Action]:
        """Rank `rank`'s forwards and backwards only, in order."""
        return [a for a in self.actions[rank] if a.is_compute]

    def table(self) -> str:
        """A text picture: one row per rank, its compute actions in order (F3 = forward of microbatch 3)."""
        return "\n".join(
            tr("rank {r}: {actions}", r=r, actions=" ".join(str(a) for a in self.compute(r))) for r in range(self.p)
        )


# --------------------------------------------------------------------------------------------- compute orders


def _check_sizes(p: int, n_microbatches: int, v: int) -> None:
    for name, value in (("p", p), ("m", n_microbatches), ("v", v)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ScheduleError(f"{name}={value!r} must be a positive integer")


def check_interleaved(p: int, n_microbatches: int, v: int, group_size: int | None = None) -> int:
    """Megatron's conditions for the interleaved schedule; returns N (microbatches per group, default p).

    Raises ScheduleError naming the broken condition: v >= 2, p <= N <= m, and m % N == 0 or m % N >= p (with the
    default N = p: m must be a multiple of p)."""
    _check_sizes(p, n_microbatches, v)
    n = p if group_size is None else group_size
    if v < 2:
        raise ScheduleError(tr("interleaved 1F1B needs v >= 2 chunks per rank, got v={v} (v=1 is plain 1F1B)", v=v))
    if p < 2:
        raise ScheduleError(
            tr(
                "interleaved 1F1B needs p >= 2 pipeline ranks, got p={p} (chunks pass activations round the ring of "
                "ranks)",
                p=p,
            )
        )
    if not p <= n <= n_microbatches:
        if group_size is None:
            raise ScheduleError(
                tr(
                    "interleaved 1F1B needs at least p microbatches: m={m} < p={p} "
                    "(Megatron runs microbatches in groups of N=p through each chunk)",
                    m=n_microbatches,
                    p=p,
                )
            )
        why = (
            tr(
                "fewer microbatches per group than ranks: Megatron's warm-up is not built for it, most such "
                "orders deadlock"
            )
            if n < p
            else tr("a group cannot hold more microbatches than the step has")
        )
        raise ScheduleError(
            tr(
                "interleaved 1F1B needs p <= N <= m for the group size N: p={p}, N={n}, m={m} ({why})",
                p=p,
                n=n,
                m=n_microbatches,
                why=why,
            )
        )
    rest = n_microbatches % n
    if 0 < rest < p:
        if group_size is None:
            raise ScheduleError(
                tr(
                    "interleaved 1F1B needs m divisible by p: m={m}, p={p}, m % p = {rest} "
                    "(Megatron: microbatches go through each chunk in groups of p)",
                    m=n_microbatches,
                    p=p,
                    rest=rest,
                )
            )
        raise ScheduleError(
            tr(
                "interleaved 1F1B needs m % N == 0 or m % N >= p: m={m}, N={n}, m % N = {rest} < p={p} "
                "(a short last group would stall the pipeline; Megatron rejects it)",
                m=n_microbatches,
                n=n,
                rest=rest,
                p=p,
            )
        )
    return n


def interleaved_table(n_microbatches: int, v: int, group_size: int) -> list[tuple[int, int]]:
    """Megatron's forward order of (microbatch, chunk) pairs: each group of N microbatches through chunk 0, then
    chunk 1, ... (the last group holds what is left). The k-th backward runs chunk v-1-c of the k-th pair."""
    out = []
    for lo in range(0, n_microbatches, group_size):
        hi = n_microbatches if lo + group_size >= n_microbatches else lo + group_size
        out += [(mb, c) for c in range(v) for mb in range(lo, hi)]
    return out


def _loose_group_size(p: int, v: int, group_size: int | None) -> int:
    """N for an interleaved order built without Megatron's microbatch conditions (only v >= 2 and N >= 1)."""
    if v < 2:
        raise ScheduleError(f"interleaved 1F1B needs v >= 2 chunks per rank, got v={v} (v=1 is plain 1F1B)")
    n = p if group_size is None else group_size
    if not isinstance(n, int) or n < 1:
        raise ScheduleError(f"the group size N={n!r} must be a positive integer")
    return n


def warmup_forwards(
    name: str, p: int, n_microbatches: int, rank: int, v: int = 1, group_size: int | None = None
) -> int:
    """Forwards a rank runs before its first backward (capped at its total number of forwards)."""
    if name == "gpipe":
        return n_microbatches
    if name == "1f1b":
        return min(p - rank - 1, n_microbatches)
    if name == "interleaved":
        n = p if group_size is None else group_size
        return min(2 * (p - rank - 1) + (v - 1) * n, n_microbatches * v)
    raise ScheduleError(f"unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")


def compute_order(
    name: str, p: int, n_microbatches: int, rank: int, v: int = 1, group_size: int | None = None, *, strict: bool = True
) -> list[Action]:
    """Rank `rank`'s forwards and backwards, in the order the schedule runs them (no communication yet).

    strict=False skips Megatron's microbatch conditions for the interleaved schedule (`check_interleaved`) other
    than v >= 2 and 1 <= N, so that the book can measure what a short last group of microbatches costs."""

    def f(mb, c):
        return Action("F", mb, c, virtual_stage(rank, c, p))

    def b(mb, c):
        return Action("B", mb, c, virtual_stage(rank, c, p))

    if name == "gpipe":
        return [f(i, 0) for i in range(n_microbatches)] + [b(i, 0) for i in range(n_microbatches)]
    if name == "1f1b":
        fwd = [(i, 0) for i in range(n_microbatches)]
        bwd = fwd
    elif name == "interleaved":
        n = check_interleaved(p, n_microbatches, v, group_size) if strict else _loose_group_size(p, v, group_size)
        fwd = interleaved_table(n_microbatches, v, n)
        bwd = [(mb, v - 1 - c) for mb, c in fwd]
    else:
        raise ScheduleError(f"unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")
    total = len(fwd)
    warm = warmup_forwards(name, p, n_microbatches, rank, v, group_size)
    order = [f(*fwd[i]) for i in range(warm)]
    for k in range(total - warm):
        order += [f(*fwd[warm + k]), b(*bwd[k])]
    order += [b(*bwd[k]) for k in range(total - warm, total)]
    return order


# --------------------------------------------------------------------------------------------- placement


def _dependencies(a: Action, n_stages: int) -> list[tuple[str, int, int]]:
    """(op, mb, stage) of the compute actions `a` waits for."""
    if a.op == "F":
        return [("F", a.mb, a.stage - 1)] if a.stage > 0 else []
    deps = [("F", a.mb, a.stage)]
    if a.stage < n_stages - 1:
        deps.append(("B", a.mb, a.stage + 1))
    return deps


def logical_times(orders: list[list[Action]], n_stages: int, cost_f: float = 1.0, cost_b: float = 2.0):
    """Start and end of every compute action when each rank runs its order as soon as the data is there
    (communication free). Returns {(op, mb, stage): (start, end)}; raises ScheduleError if some action's data
    never arrives (the compute orders themselves deadlock)."""
    done: dict[tuple[str, int, int], tuple[float, float]] = {}
    pos = [0] * len(orders)
    clock = [0.0] * len(orders)
    progress = True
    while progress:
        progress = False
        for r, order in enumerate(orders):
            while pos[r] < len(order):
                a = order[pos[r]]
                deps = _dependencies(a, n_stages)
                if any(d not in done for d in deps):
                    break
                start = max([clock[r]] + [done[d][1] for d in deps])
                end = start + (cost_f if a.op == "F" else cost_b)
                done[(a.op, a.mb, a.stage)] = (start, end)
                clock[r] = end
                pos[r] += 1
                progress = True
    stuck = {r: str(order[pos[r]]) for r, order in enumerate(orders) if pos[r] < len(order)}
    if stuck:
        raise ScheduleError(f"the compute orders deadlock: ranks wait forever at {stuck}")
    return done


def _link(from_stage: int, to_stage: int, p: int) -> int:
    """The link a message crosses, numbered by the rank on its forward-direction sending side: stage boundary
    (k, k+1) is link k % p, joining rank k % p to rank (k+1) % p."""
    return min(from_stage, to_stage) % p


def _messages_out(a: Action, p: int, n_stages: int) -> list[Action]:
    """The send a compute issues: a forward's activation to the next stage, a backward's gradient to the previous."""
    if a.op == "F" and a.stage < n_stages - 1:
        return [Action("send", a.mb, a.chunk, a.stage, "act", (a.stage + 1) % p)]
    if a.op == "B" and a.stage > 0:
        return [Action("send", a.mb, a.chunk, a.stage, "grad", (a.stage - 1) % p)]
    return []


def _messages_in(a: Action, p: int, n_stages: int) -> list[Action]:
    """The receive a compute needs first: its input activation, or its output's gradient."""
    if a.op == "F" and a.stage > 0:
        return [Action("recv", a.mb, a.chunk, a.stage, "act", (a.stage - 1) % p)]
    if a.op == "B" and a.stage < n_stages - 1:
        return [Action("recv", a.mb, a.chunk, a.stage, "grad", (a.stage + 1) % p)]
    return []


class _ExchangeTimes:
    """When each message can be exchanged: the first moment tau, between its producer's end and its consumer's
    start, when neither end is in the middle of a compute (so a blocking send waits for nobody)."""

    def __init__(self, orders: list[list[Action]], times: dict, p: int, n_stages: int):
        self.spans = [[times[(a.op, a.mb, a.stage)] for a in order] for order in orders]
        self.starts = [[start for start, _ in rank_spans] for rank_spans in self.spans]
        self.consumer_start = {}  # message -> (receiving rank, start of the compute that needs it)
        for r, order in enumerate(orders):
            for a in order:
                for rv in _messages_in(a, p, n_stages):
                    self.consumer_start[rv.message()] = (r, times[(a.op, a.mb, a.stage)][0])

    def free(self, r: int, t: float) -> bool:
        i = bisect.bisect_left(self.starts[r], t) - 1  # the last compute starting before t
        return i < 0 or self.spans[r][i][1] <= t

    def __call__(self, sender: int, produced: float, msg) -> float:
        receiver, needed = self.consumer_start[msg]
        points = {produced, needed}
        for r in (sender, receiver):
            lo, hi = bisect.bisect_left(self.starts[r], produced), bisect.bisect_right(self.starts[r], needed)
            spans = self.spans[r][max(lo - 1, 0) : hi]
            points.update(x for span in spans for x in span if produced <= x <= needed)
        return next((t for t in sorted(points) if self.free(sender, t) and self.free(receiver, t)), produced)


def _message_key(tau: float, msg, p: int) -> tuple:
    """The global order of the step's messages: by exchange time, then even links before odd ones, activations
    before gradients, then microbatch and sender."""
    what, mb, src, dst = msg
    link = _link(src, dst, p)
    return (tau, 0, link % 2, link, 0 if what == "act" else 1, mb, src)


def place_communication(
    orders: list[list[Action]], p: int, v: int, cost_f: float = 1.0, cost_b: float = 2.0, policy: str = "ordered"
):
    """Insert the sends and receives into each rank's compute order.

    policy "ordered": the deadlock-free placement described in the module docstring.
    policy "naive": every receive right before the compute that needs it and every send right after the compute
    that produced it -- the obvious placement, which deadlocks under blocking sends (kept for the book to show).
    Returns (actions per rank, logical times per rank)."""
    n_stages = p * v
    times = logical_times(orders, n_stages, cost_f, cost_b)
    per_rank_times = [{a: times[(a.op, a.mb, a.stage)] for a in order} for order in orders]
    if policy == "naive":
        placed = [
            [x for a in order for x in (*_messages_in(a, p, n_stages), a, *_messages_out(a, p, n_stages))]
            for order in orders
        ]
        return placed, per_rank_times
    if policy != "ordered":
        raise ValueError(f"policy must be 'ordered' or 'naive', not {policy!r}")
    exchange = _ExchangeTimes(orders, times, p, n_stages)
    events: list[list[tuple]] = [[] for _ in range(p)]
    for r, order in enumerate(orders):
        for a in order:
            start, end = times[(a.op, a.mb, a.stage)]
            events[r].append(((start, 1), a))  # a compute sorts after the messages exchanged at its start
            for snd in _messages_out(a, p, n_stages):
                msg = snd.message()
                key = _message_key(exchange(r, end, msg), msg, p)
                receiver = exchange.consumer_start[msg][0]
                events[r].append((key, snd))
                events[receiver].append((key, Action("recv", msg[1], msg[3] // p, msg[3], msg[0], r)))
    actions = [[a for _, a in sorted(ev, key=lambda e: e[0])] for ev in events]
    return actions, per_rank_times


# --------------------------------------------------------------------------------------------- the schedules


def check_schedule(
    name: str, p: int, n_microbatches: int, v: int = 1, *, group_size: int | None = None, strict: bool = True
) -> int | None:
    """Everything `build` checks before it builds, without building (a schedule of p*m*v actions and its timing
    take seconds for thousands of microbatches; this is instant). Raises the ScheduleError `build` would raise;
    returns the interleaved group size N (None for the other schedules)."""
    _check_sizes(p, n_microbatches, v)
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")
    if name == "interleaved":
        if strict:
            return check_interleaved(p, n_microbatches, v, group_size)
        return _loose_group_size(p, v, group_size)
    if v != 1:
        raise ScheduleError(f"{name} runs one chunk per rank (v=1), got v={v}; use 'interleaved' for v > 1")
    if group_size is not None:
        raise ScheduleError(f"group_size applies to the interleaved schedule only, not {name}")
    return None


def build(
    name: str,
    p: int,
    n_microbatches: int,
    v: int = 1,
    *,
    group_size: int | None = None,
    cost_f: float = 1.0,
    cost_b: float = 2.0,
    policy: str = "ordered",
    strict: bool = True,
) -> Schedule:
    """The schedule `name` ("gpipe", "1f1b" or "interleaved") for p ranks, m microbatches, v chunks per rank.

    strict=False builds an interleaved schedule that Megatron would reject (m not a multiple of N, a short last
    group): it still runs and is still correct, but its bubble exceeds (p-1)/(v·m) -- which is why Megatron
    rejects it."""
    group_size = check_schedule(name, p, n_microbatches, v, group_size=group_size, strict=strict)
    orders = [compute_order(name, p, n_microbatches, r, v, group_size, strict=strict) for r in range(p)]
    actions, times = place_communication(orders, p, v, cost_f, cost_b, policy)
    return Schedule(name, p, n_microbatches, v, actions, group_size, cost_f, cost_b, times)


def gpipe(p: int, n_microbatches: int, **kw) -> Schedule:
    """GPipe: every rank runs all m forwards, then all m backwards."""
    return build("gpipe", p, n_microbatches, 1, **kw)


def one_f_one_b(p: int, n_microbatches: int, **kw) -> Schedule:
    """1F1B (PipeDream-Flush): p-r-1 warm-up forwards, then one forward / one backward, then the cool-down."""
    return build("1f1b", p, n_microbatches, 1, **kw)


def interleaved_1f1b(p: int, n_microbatches: int, v: int, group_size: int | None = None, **kw) -> Schedule:
    """Megatron's interleaved 1F1B with v model chunks per rank (virtual pipeline size v)."""
    return build("interleaved", p, n_microbatches, v, group_size=group_size, **kw)
