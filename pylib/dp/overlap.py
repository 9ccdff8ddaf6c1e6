"""How much of the gradient communication hid behind backward.

DDP launches a bucket's all-reduce (ZeRO-1/2: its reduce-scatter) the moment the bucket's last gradient is
accumulated, asynchronously, and backward goes on computing earlier layers meanwhile. Only the communication still
running when backward ends is *exposed* (the step waits for it). From the launch and completion times of each
bucket's collective -- taken from the tracer, whose async records keep both -- and the moment backward ended:

    busy      = union of [t_launch, t_done] over buckets       (the time some gradient was on the wire)
    hidden    = the part of `busy` before backward ended
    exposed   = last t_done - backward end                     (0 when everything finished in time)
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BucketTiming:
    tag: str
    op: str
    payload_bytes: int
    t_launch: float
    t_done: float


@dataclass
class OverlapReport:
    """Bucket collectives of one backward pass against that backward's end (times from `time.perf_counter`)."""

    backward_end: float
    buckets: list[BucketTiming] = field(default_factory=list)
    backward_start: float | None = None

    @property
    def busy(self) -> float:
        return _union_length([(b.t_launch, b.t_done) for b in self.buckets])

    @property
    def hidden(self) -> float:
        end = self.backward_end
        return _union_length([(b.t_launch, min(b.t_done, end)) for b in self.buckets if b.t_launch < end])

    @property
    def hidden_fraction(self) -> float:
        """Share of the communication time that passed before backward ended (1.0 = fully overlapped)."""
        return self.hidden / self.busy if self.busy > 0 else 1.0

    @property
    def exposed(self) -> float:
        if not self.buckets:
            return 0.0
        return max(0.0, max(b.t_done for b in self.buckets) - self.backward_end)

    @property
    def launched_during_backward(self) -> int:
        return sum(b.t_launch < self.backward_end for b in self.buckets)

    def as_dict(self) -> dict:
        t0 = (
            self.backward_start
            if self.backward_start is not None
            else min([b.t_launch for b in self.buckets] + [self.backward_end])
        )
        return dict(
            backward=(0.0 if self.backward_start is not None else None, self.backward_end - t0),
            buckets=[
                dict(tag=b.tag, op=b.op, payload_bytes=b.payload_bytes, launch=b.t_launch - t0, done=b.t_done - t0)
                for b in self.buckets
            ],
            busy=self.busy,
            hidden=self.hidden,
            hidden_fraction=self.hidden_fraction,
            exposed=self.exposed,
            launched_during_backward=self.launched_during_backward,
        )


def overlap_from_trace(events, backward_end: float, *, backward_start: float | None = None, tag: str | None = None):
    """An `OverlapReport` from traced events (CommEvents or their dicts): every backward-phase all-reduce or
    reduce-scatter, optionally only those whose tag starts with `tag` (e.g. "ddp")."""
    rows = []
    for e in events:
        d = e if isinstance(e, dict) else e.as_dict()
        if d["phase"] != "backward" or d["op"] not in ("all_reduce", "reduce_scatter"):
            continue
        if tag is not None and not (d["tag"] == tag or d["tag"].startswith(tag + ".")):
            continue
        rows.append(BucketTiming(d["tag"], d["op"], d["payload_bytes"], d["t_start"], d["t_end"]))
    return OverlapReport(backward_end, rows, backward_start)


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total
