"""The tracer: one record per collective or point-to-point op issued through `pylib.runtime.collectives`.

Usage, inside a rank::

    with trace() as tr, tag("layers.0.mlp"):
        y = model(x)
        y.sum().backward()
    tr.events            # list[CommEvent]
    tr.total("bytes_sent", op="all_reduce", phase="forward")

Byte counts. `payload_bytes` is the size S that textbook formulas are written in (the all-reduced tensor, the
all-gather's *output*, the reduce-scatter's *input*, the all-to-all's input, the sent tensor). `bytes_sent` and
`bytes_recv` are what this rank moves under the bandwidth-optimal algorithm for the op on a group of n ranks
(the convention of nccl-tests' "bus bandwidth"):

    all_reduce       2(n-1)/n * S   each way     (reduce-scatter then all-gather, ring)
    all_gather       (n-1)/n * S    each way     (S = gathered output)
    reduce_scatter   (n-1)/n * S    each way     (S = input before scattering)
    all_to_all       exactly the chunks addressed to / arriving from the other ranks
    send / recv      exactly the tensor

All-to-all and point-to-point counts are exact from the split sizes actually used; the collective counts follow
from the tensors and the group actually used. Ops on a group of one rank move nothing and are not recorded.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field

import torch


@dataclass
class CommEvent:
    """One traced communication op, as seen by one rank."""

    op: str  # all_reduce | all_gather | reduce_scatter | all_to_all | send | recv
    axis: str  # mesh axis name ("tp", "cp", ...) or "world"
    group: tuple[int, ...]  # global ranks of the group, in group order
    rank: int  # this rank's global rank
    payload_bytes: int  # S in the textbook formula (see module docstring)
    bytes_sent: int
    bytes_recv: int
    shapes: tuple  # input shape(s) as tuples
    dtype: str
    phase: str  # "forward", "backward", or a name set with `phase(...)` (e.g. "optimizer")
    tag: str  # dotted name of the caller, e.g. "layers.0.attention"
    peer: int | None = None  # for send / recv: the global rank on the other end
    t_start: float = 0.0  # perf_counter() when issued
    t_end: float = 0.0  # perf_counter() when complete (for async ops: when waited on)
    extra: dict = field(default_factory=dict)

    @property
    def group_size(self) -> int:
        return len(self.group)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["group_size"] = self.group_size
        return d


class Tracer:
    """Collects `CommEvent`s while active. Several tracers may be active at once (nested `trace()` blocks)."""

    def __init__(self):
        self.events: list[CommEvent] = []

    def select(self, **match) -> list[CommEvent]:
        """Events whose attributes equal every given value, e.g. `select(op="all_reduce", phase="forward")`.
        `tag` matches as a prefix (so `tag="layers.0"` selects every op under that layer)."""
        out = []
        for e in self.events:
            ok = True
            for k, v in match.items():
                if v is None:
                    continue
                got = getattr(e, k)
                if k == "tag":
                    ok = got == v or got.startswith(v + ".")
                else:
                    ok = got == v
                if not ok:
                    break
            if ok:
                out.append(e)
        return out

    def count(self, **match) -> int:
        return len(self.select(**match))

    def total(self, field_name: str = "bytes_sent", **match) -> int:
        """Sum of one byte field over the selected events."""
        return sum(getattr(e, field_name) for e in self.select(**match))

    def summary(self) -> list[dict]:
        """One row per (phase, tag, op, axis): count, payload and bytes sent/received, in first-seen order."""
        rows: dict[tuple, dict] = {}
        for e in self.events:
            key = (e.phase, e.tag, e.op, e.axis)
            r = rows.setdefault(
                key,
                dict(
                    phase=e.phase, tag=e.tag, op=e.op, axis=e.axis, count=0, payload_bytes=0, bytes_sent=0, bytes_recv=0
                ),
            )
            r["count"] += 1
            r["payload_bytes"] += e.payload_bytes
            r["bytes_sent"] += e.bytes_sent
            r["bytes_recv"] += e.bytes_recv
        return list(rows.values())

    def by_axis(self, field_name: str = "bytes_sent") -> dict[str, int]:
        """Total of one byte field per mesh axis."""
        out: dict[str, int] = defaultdict(int)
        for e in self.events:
            out[e.axis] += getattr(e, field_name)
        return dict(out)


class _State:
    """Process-wide, not per thread: on CUDA the autograd engine runs backward on a device thread, and the
    collectives issued there (every conjugate backward, DDP's bucket hooks) must reach the same tracers."""

    def __init__(self):
        self.tracers: list[Tracer] = []
        self.tags: list[str] = []
        self.phases: list[str] = []
        # set by `pylib.runtime.profile` while a profile is recorded: name -> a context manager (a named
        # record_function range); None otherwise, and then the collectives open no range at all
        self.span = None


_state = _State()


def _tracers() -> list[Tracer]:
    return _state.tracers


@contextlib.contextmanager
def trace():
    """Record every op issued through `pylib.runtime.collectives` in this process while the block runs."""
    tracer = Tracer()
    _tracers().append(tracer)
    try:
        yield tracer
    finally:
        _tracers().remove(tracer)


@contextlib.contextmanager
def tag(name: str):
    """Name the ops issued inside the block; nested tags join with dots ("layers.0" + "mlp")."""
    _state.tags.append(name)
    try:
        yield
    finally:
        _state.tags.pop()


@contextlib.contextmanager
def phase(name: str):
    """Label the ops issued inside the block with a phase other than forward/backward (e.g. "optimizer")."""
    _state.phases.append(name)
    try:
        yield
    finally:
        _state.phases.pop()


def current_tag() -> str:
    return ".".join(t for t in _state.tags if t)


def current_phase() -> str:
    """An explicit `phase(...)` wins; otherwise "backward" inside the autograd engine, else "forward"."""
    if _state.phases:
        return _state.phases[-1]
    return "backward" if torch._C._current_graph_task_id() != -1 else "forward"


def is_tracing() -> bool:
    return bool(_tracers())


def record(event: CommEvent) -> None:
    for t in _tracers():
        t.events.append(event)


def now() -> float:
    return time.perf_counter()


def active_span():
    """The range opener of the profile being recorded in this process (name -> context manager), or None."""
    return _state.span


def span_name(what: str, tag: str, phase: str) -> str:
    """The name of a profiler range: what ran ("all_reduce@tp", a pipeline action "F0"), the tracer's tag and
    phase, e.g. "all_reduce@tp | layers.0.mlp | forward" (`pylib.runtime.profile` reads the three back)."""
    return f"{what} | {tag} | {phase}"
