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
`cost_b` and a message `cost_comm` time units. The bubble, the in-flight microbatches and the figure the book draws
before running anything all come from this timeline.
"""

from __future__ import annotations

from collections import deque

from .schedules import Action, Schedule, ScheduleError
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
) -> list[Event]:
    """Execute the per-rank action lists against each other; return the timeline (sorted by rank, then time)."""
    if sends not in SEMANTICS:
        raise ValueError(f"sends must be one of {SEMANTICS}, not {sends!r}")
    lists = list(schedule.actions if isinstance(schedule, Schedule) else schedule)
    p = len(lists)
    pos = [0] * p
    clock = [0.0] * p
    events: list[Event] = []
    computed: list[set] = [set() for _ in range(p)]  # (op, mb, chunk) done on rank r
    received: list[set] = [set() for _ in range(p)]  # (what, mb, chunk) arrived at rank r
    in_link: dict[tuple[int, int], deque] = {}  # eager: (src, dst) -> [(send action, arrival time)]
    last_stage = max((a.stage for lst in lists for a in lst), default=0)

    def check_compute(r: int, a: Action) -> None:
        if (a.op, a.mb, a.chunk) in computed[r]:
            raise ScheduleError(f"rank {r}: {a} runs twice")
        if a.op == "F":
            if a.stage > 0 and ("act", a.mb, a.chunk) not in received[r]:
                raise ScheduleError(f"rank {r}: {a} runs before its input activation was received")
            return
        if ("F", a.mb, a.chunk) not in computed[r]:
            raise ScheduleError(f"rank {r}: {a} runs before its forward")
        if a.stage < last_stage and ("grad", a.mb, a.chunk) not in received[r]:
            raise ScheduleError(f"rank {r}: {a} runs before its output gradient was received")

    def check_send(r: int, a: Action) -> None:
        if ("F" if a.what == "act" else "B", a.mb, a.chunk) not in computed[r]:
            raise ScheduleError(f"rank {r}: {a} sends a tensor that has not been computed yet")

    def check_pair(s: Action, sr: int, rv: Action, rr: int) -> None:
        if s.message() != rv.message():
            raise ScheduleError(
                f"mismatched order: rank {sr} sends {s.what} of mb {s.mb} from stage {s.stage} but rank {rr} "
                f"receives {rv.what} of mb {rv.mb} for stage {rv.stage} (the wrong tensor would be delivered)"
            )

    def log(rank: int, a: Action, start: float, end: float) -> None:
        events.append(Event.of(rank, a, start, end))

    def finish_recv(rr: int, rv: Action, arrival: float) -> None:
        done = max(clock[rr], arrival)
        log(rr, rv, clock[rr], done)
        clock[rr] = done
        pos[rr] += 1
        received[rr].add((rv.what, rv.mb, rv.chunk))

    progress = True
    while progress:
        progress = False
        for r in range(p):
            while pos[r] < len(lists[r]):
                a = lists[r][pos[r]]
                if a.is_compute:
                    check_compute(r, a)
                    start = clock[r]
                    clock[r] += cost_f if a.op == "F" else cost_b
                    computed[r].add((a.op, a.mb, a.chunk))
                    log(r, a, start, clock[r])
                    pos[r] += 1
                    progress = True
                    continue
                q = a.peer
                if q is None or not 0 <= q < p or q == r:
                    raise ScheduleError(f"rank {r}: {a} names peer {q}, not another rank of 0..{p - 1}")
                if sends == "eager":
                    if a.op == "send":
                        check_send(r, a)
                        in_link.setdefault((r, q), deque()).append((a, clock[r] + cost_comm))
                        log(r, a, clock[r], clock[r])
                        pos[r] += 1
                        progress = True
                        continue
                    link = in_link.get((q, r))
                    if not link:
                        break  # the message is not there yet
                    s, arrival = link.popleft()
                    check_pair(s, q, a, r)
                    finish_recv(r, a, arrival)
                    progress = True
                    continue
                # rendezvous: both ends must be at the matching pair of actions
                if pos[q] >= len(lists[q]):
                    break
                b = lists[q][pos[q]]
                if not b.is_comm or b.peer != r or a.op == b.op:
                    break  # the peer is elsewhere (or also sending / receiving): wait
                (s, sr), (rv, rr) = ((a, r), (b, q)) if a.op == "send" else ((b, q), (a, r))
                check_pair(s, sr, rv, rr)
                check_send(sr, s)
                meet = max(clock[r], clock[q])
                log(sr, s, clock[sr], meet + cost_comm)
                clock[sr] = meet + cost_comm
                pos[sr] += 1
                finish_recv(rr, rv, meet + cost_comm)
                progress = True
    stuck = {r: lists[r][pos[r]] for r in range(p) if pos[r] < len(lists[r])}
    if stuck:
        where = "; ".join(f"rank {r} at {a}" for r, a in stuck.items())
        raise DeadlockError(f"deadlock ({sends} sends): {where}", stuck)
    leftover = {k: len(v) for k, v in in_link.items() if v}
    if leftover:
        raise ScheduleError(f"messages sent but never received: {leftover} (src, dst) -> count")
    return sorted(events, key=lambda e: (e.rank, e.start, e.is_compute))
