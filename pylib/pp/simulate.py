"""Run every rank's action list against the others, in one process, with the blocking semantics of a real
process group.

Two semantics for a send (a receive always blocks until its message is there):

  "rendezvous"  (gloo's blocking `send`, and any NCCL send) the send completes only when the peer is at the
                matching receive. The strictest rule: an order that survives it survives every backend.
  "eager"       (`isend` posted and waited at the end of the step, what the executor does by default) the send
                completes at once; the message waits in the link until the peer receives it.

The simulator reports

  * a deadlock (`DeadlockError`): no rank can move, with where each one is stuck;
  * a mismatch (`ScheduleError`): a receive meets a send from its peer for a *different* message -- on a real
    process group that silently delivers the wrong tensor (point-to-point ops match by order, not by content);
  * a compute whose input is not there (a forward before its activation's receive, a backward before its forward
    or its gradient's receive), a compute done twice, or a tensor sent before it was computed;

and otherwise returns the logical timeline: each action's start and end when a forward costs `cost_f`, a backward
`cost_b` and a message `cost_comm` time units. Zero-bubble schedules split a backward into B and W
(`pylib.plan.schedules`): there a B costs `cost_b`, a W `cost_w`, and a B with no W of its own (the fused backward)
`cost_b + cost_w`; a W before its B is reported like a backward before its forward. The bubble, the in-flight
microbatches and the figure the book draws before running anything all come from this timeline.
"""

from __future__ import annotations

from collections import deque

from pylib.i18n import tr
from pylib.plan.schedules import (
    Action,
    Schedule,
    ScheduleError,
    compute_cost,
    deferred_weights,
    microbatch_spans,
    overlap_partner,
    slot_cost,
)

from .timeline import Event

SEMANTICS = ("rendezvous", "eager")


class DeadlockError(ScheduleError):
    """No rank can make progress; `.stuck` maps rank -> the action it is blocked at."""

    def __init__(self, message: str, stuck: dict[int, Action]):
        super().__init__(message)
        self.stuck = stuck


def simulate(
    schedule: Schedule | list[list[Action]],
    cost_f: float = 1.0,
    cost_b: float = 2.0,
    cost_comm: float = 0.0,
    sends: str = "rendezvous",
    cost_w: float = 0.0,
    cost_fb: float | None = None,
) -> list[Event]:
    """Execute the per-rank action lists against each other; return the timeline (sorted by rank, then time).

    cost_fb: what an overlapped F&B slot (DualPipeV) costs; None: its forward and its B back to back. The slot's
    two events split its time in proportion to their own costs (a drawing convention: on a GPU they overlap); its
    outputs are sent after the whole slot."""
    if sends not in SEMANTICS:
        raise ValueError(f"sends must be one of {SEMANTICS}, not {sends!r}")
    lists = list(schedule.actions if isinstance(schedule, Schedule) else schedule)
    sim = _Simulation(lists, cost_f, cost_b, cost_comm, sends, cost_w, cost_fb)
    while True:
        moved = [sim.advance(r) for r in range(sim.p)]  # each rank in turn, as far as it can go
        if not any(moved):  # a whole round in which nobody moved: done, or deadlocked
            return sim.timeline()


class _Simulation:
    """The state of p ranks walking their lists: where each is (`pos`), its logical clock, what it computed and
    received, and (eager sends) the messages waiting in each link."""

    def __init__(
        self,
        lists: list[list[Action]],
        cost_f: float,
        cost_b: float,
        cost_comm: float,
        sends: str,
        cost_w: float,
        cost_fb: float | None = None,
    ):
        self.lists, self.sends = lists, sends
        self.cost_f, self.cost_b, self.cost_w, self.cost_comm = cost_f, cost_b, cost_w, cost_comm
        self.cost_fb = cost_fb
        self.deferred = [deferred_weights(lst) for lst in lists]
        self.p = p = len(lists)
        self.pos = [0] * p
        self.clock = [0.0] * p
        self.events: list[Event] = []
        self.computed: list[set] = [set() for _ in range(p)]  # (op, mb, chunk) done on rank r
        self.received: list[set] = [set() for _ in range(p)]  # (what, mb, chunk) arrived at rank r
        self.in_link: dict[tuple[int, int], deque] = {}  # eager: (src, dst) -> [(send action, arrival time)]
        self.spans = microbatch_spans(lists)  # mb -> (first, last) stage (DualPipe: one copy of the model each)
        # where each stage lives, read off the computes: (rank, chunk); a neighbour stage on the same rank (the
        # V's turn) hands its tensor over in memory, with no message
        self.home = {a.stage: (r, a.chunk) for r, lst in enumerate(lists) for a in lst if a.is_compute}

    def advance(self, r: int) -> bool:
        """Move rank r as far as it can go now; True if it moved at all."""
        moved = False
        while self.pos[r] < len(self.lists[r]):
            a = self.lists[r][self.pos[r]]
            if a.is_compute:
                self.compute(r, a)
            elif not self.communicate(r, a):
                break
            moved = True
        return moved

    def compute(self, r: int, a: Action) -> None:
        if a.overlapped:
            return self.slot(r, a)
        self.check_compute(r, a)
        start = self.clock[r]
        self.clock[r] += compute_cost(a, self.deferred[r], self.cost_f, self.cost_b, self.cost_w)
        self.computed[r].add((a.op, a.mb, a.chunk))
        self.log(r, a, start, self.clock[r])
        self.pos[r] += 1

    def slot(self, r: int, f: Action) -> None:
        """An overlapped F&B: the forward and the B right after it in the list, one slot of `slot_cost`."""
        i = self.pos[r]
        b = overlap_partner(self.lists[r], i, r)
        if self.lists[r][i + 1] is not b:
            raise ScheduleError(f"rank {r}: {self.lists[r][i + 1]} comes between {f} and {b}, which share one slot")
        self.check_compute(r, f)
        self.check_compute(r, b)
        d = self.deferred[r]
        total = slot_cost(f, b, d, self.cost_f, self.cost_b, self.cost_w, self.cost_fb)
        own_f, own_b = self.cost_f, compute_cost(b, d, self.cost_f, self.cost_b, self.cost_w)
        start, mid = self.clock[r], self.clock[r] + total * own_f / (own_f + own_b)
        self.clock[r] = start + total
        for a, t0, t1 in ((f, start, mid), (b, mid, self.clock[r])):
            self.computed[r].add((a.op, a.mb, a.chunk))
            self.log(r, a, t0, t1)
        self.pos[r] += 2

    def communicate(self, r: int, a: Action) -> bool:
        """Rank r at a send or receive: complete it if the semantics allow now; False if r must wait."""
        q = a.peer
        if q is None or not 0 <= q < self.p or q == r:
            raise ScheduleError(f"rank {r}: {a} names peer {q}, not another rank of 0..{self.p - 1}")
        if self.sends == "eager":
            return self.eager(r, a, q)
        return self.rendezvous(r, a, q)

    def eager(self, r: int, a: Action, q: int) -> bool:
        if a.op == "send":
            self.check_send(r, a)
            self.in_link.setdefault((r, q), deque()).append((a, self.clock[r] + self.cost_comm))
            self.log(r, a, self.clock[r], self.clock[r])
            self.pos[r] += 1
            return True
        link = self.in_link.get((q, r))
        if not link:
            return False  # the message is not there yet
        s, arrival = link.popleft()
        self.check_pair(s, q, a, r)
        self.finish_recv(r, a, arrival)
        return True

    def rendezvous(self, r: int, a: Action, q: int) -> bool:
        """Both ends must be at the matching pair of actions."""
        if self.pos[q] >= len(self.lists[q]):
            return False
        b = self.lists[q][self.pos[q]]
        if not b.is_comm or b.peer != r or a.op == b.op:
            return False  # the peer is elsewhere (or also sending / receiving): wait
        (s, sr), (rv, rr) = ((a, r), (b, q)) if a.op == "send" else ((b, q), (a, r))
        self.check_pair(s, sr, rv, rr)
        self.check_send(sr, s)
        done = max(self.clock[r], self.clock[q]) + self.cost_comm
        self.log(sr, s, self.clock[sr], done)
        self.clock[sr] = done
        self.pos[sr] += 1
        self.finish_recv(rr, rv, done)
        return True

    def finish_recv(self, rr: int, rv: Action, arrival: float) -> None:
        done = max(self.clock[rr], arrival)
        self.log(rr, rv, self.clock[rr], done)
        self.clock[rr] = done
        self.pos[rr] += 1
        self.received[rr].add((rv.what, rv.mb, rv.chunk))

    def log(self, rank: int, a: Action, start: float, end: float) -> None:
        self.events.append(Event.of(rank, a, start, end))

    def check_compute(self, r: int, a: Action) -> None:
        if (a.op, a.mb, a.chunk) in self.computed[r]:
            raise ScheduleError(f"rank {r}: {a} runs twice")
        if a.op == "F":
            if a.stage > self.spans[a.mb][0] and not self.arrived(r, "act", a.mb, a.chunk, a.stage - 1, "F"):
                raise ScheduleError(f"rank {r}: {a} runs before its input activation was received")
            return
        if a.op == "W":
            if ("B", a.mb, a.chunk) not in self.computed[r]:
                raise ScheduleError(f"rank {r}: {a} runs before its B (the weight gradient needs the output's)")
            return
        if ("F", a.mb, a.chunk) not in self.computed[r]:
            raise ScheduleError(f"rank {r}: {a} runs before its forward")
        if a.stage < self.spans[a.mb][1] and not self.arrived(r, "grad", a.mb, a.chunk, a.stage + 1, "B"):
            raise ScheduleError(f"rank {r}: {a} runs before its output gradient was received")

    def arrived(self, r: int, what: str, mb: int, chunk: int, neighbour: int, op: str) -> bool:
        """The input of (mb, chunk) from stage `neighbour` is on rank r: received, or computed there (op)."""
        home = self.home.get(neighbour)
        if home is not None and home[0] == r:
            return (op, mb, home[1]) in self.computed[r]
        return (what, mb, chunk) in self.received[r]

    def check_send(self, r: int, a: Action) -> None:
        if ("F" if a.what == "act" else "B", a.mb, a.chunk) not in self.computed[r]:
            raise ScheduleError(f"rank {r}: {a} sends a tensor that has not been computed yet")

    @staticmethod
    def check_pair(s: Action, sr: int, rv: Action, rr: int) -> None:
        if s.message() != rv.message():
            raise ScheduleError(
                f"mismatched order: rank {sr} sends {s.what} of mb {s.mb} from stage {s.stage} but rank {rr} "
                f"receives {rv.what} of mb {rv.mb} for stage {rv.stage} (the wrong tensor would be delivered)"
            )

    def timeline(self) -> list[Event]:
        """The events, once every list ran to its end; otherwise the deadlock, or the messages never received."""
        stuck = {r: self.lists[r][self.pos[r]] for r in range(self.p) if self.pos[r] < len(self.lists[r])}
        if stuck:
            where = tr("; ").join(tr("rank {r} at {action}", r=r, action=a) for r, a in stuck.items())
            raise DeadlockError(tr("deadlock ({sends} sends): {where}", sends=self.sends, where=where), stuck)
        leftover = {k: len(v) for k, v in self.in_link.items() if v}
        if leftover:
            raise ScheduleError(f"messages sent but never received: {leftover} (src, dst) -> count")
        return sorted(self.events, key=lambda e: (e.rank, e.start, e.is_compute))
