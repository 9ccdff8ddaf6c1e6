"""Run every rank under torch.profiler with the tracer's names on the timeline, and merge the ranks' traces into one.

    prof = Profile("runs/tp", profile_memory=True)
    launch(worker, 4, profile=prof)        # runs/tp/rank0.json ... rank3.json, merged into runs/tp/trace.json
    trace = load(prof.merged_path)         # open it in https://ui.perfetto.dev: one process row per rank
    spans(trace)                           # the named ranges below, every rank, in seconds on one clock
    allocated(trace, rank=0)               # the CPU allocator's live bytes over time (profile_memory=True)

What a rank records. `torch.profiler.profile` with CPU activities (and CUDA activities on a CUDA rank), over the
whole of the rank's function. While it records, every collective and point-to-point op of
`pylib.runtime.collectives` runs inside a `record_function` range named as the tracer names it
(`pylib.runtime.tracer.span_name`: "all_reduce@tp | layers.0.mlp | forward", i.e. op@axis, tag, phase; an async
op's launch and its wait are two ranges, "all_reduce_async@dp" and "wait all_reduce@dp"), and every pipeline action
inside one named after the action ("F0@pp | pp.stage1 | forward", `action_span`). On a CUDA rank each range is also
an NVTX range (`torch.cuda.nvtx`), which Nsight Systems shows on its NVTX row. With no profile open the collectives
open no range at all: they read one attribute (`tracer.active_span()`), and nothing else runs.

What a CPU trace shows, and does not. Host time only: each aten operator as a slice, our ranges around them, and with
`profile_memory=True` an instant per allocation and free of the CPU allocator carrying its running total
("Total Allocated": every live tensor the allocator handed out since the profile started, activations, gradients,
receive buffers and temporaries alike; nothing allocated before it started, such as the weights, is counted). There
are no kernels and no streams: gloo's transfers run on its own threads and appear only as the time a rank's thread
spends inside the collective's range. On a GPU rank the same trace adds the kernels on their streams, NCCL's kernels
included, and the CUDA caching allocator's events.

How the clocks are aligned. Each rank's trace has timestamps of its own clock. Right after its profiler starts,
every rank makes two all-reduces of one element over the world, the second inside a range named `SYNC` (the first
gathers the ranks, so that they enter the second together and its ranges are short). Nobody leaves an all-reduce
before the last rank has entered it, so on a true common clock the ranks' `SYNC` ranges share a moment. `merge`
shifts rank r's events by the offset closest to zero that makes its `SYNC` range meet rank 0's: any d in
[start_r - end_0, end_r - start_0]. On one machine the processes read one clock and the offsets are 0 (a shift
fitted to the ends of the ranges would instead add the milliseconds by which a busy machine's scheduler lets each
rank out); across machines they absorb the clocks' difference, to within the two ranges' lengths (`offsets_us` in
the merged trace says what was applied). On CUDA the range also waits for the device (the all-reduce runs on
NCCL's stream).
"""

from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
import torch.profiler

from pylib.plan.fields import flag

from . import collectives as C
from . import tracer
from .agreement import agreement_check

SYNC = tracer.span_name("clock-sync@world", "profile", "clock-sync")  # the range whose end aligns the clocks
MERGED = "trace.json"
_NAME = re.compile(r"^(?P<what>.+?) \| (?P<tag>.*?) \| (?P<phase>[^|]+)$")


@dataclass(frozen=True)
class Profile:
    """Profile every rank of a launch (`launch(fn, n, profile=Profile(...))`). The rank's function must not open
    a torch.profiler of its own: kineto records one profile per process at a time.

    out_dir: where rank r writes `rank{r}.json` (its Chrome trace) and the caller the merged `trace.json`.
    record_shapes: record each operator's input shapes. profile_memory: record every allocation and free (the
    allocator's running total, `allocated`). window: the name of a `region` the ranks open ("step"): the merged
    trace keeps only what happened from the first rank's entry into it to the last rank's exit (the ranks' own
    traces keep everything); None keeps everything."""

    out_dir: str
    record_shapes: bool = False
    profile_memory: bool = False
    window: str | None = None

    def __post_init__(self):
        if not isinstance(self.out_dir, (str, os.PathLike)):
            raise TypeError(f"Profile.out_dir is a folder path, not {type(self.out_dir).__name__} {self.out_dir!r}")
        object.__setattr__(self, "out_dir", os.fspath(self.out_dir))
        flag("Profile", "record_shapes", self.record_shapes)
        flag("Profile", "profile_memory", self.profile_memory)
        if self.window is not None and not isinstance(self.window, str):
            raise TypeError(f"Profile.window names a region, a str or None, not {type(self.window).__name__}")

    def numbered(self, k: int) -> Profile:
        """This profile for a process's k-th launch: the same options, out_dir/launch{k} (`profile_launches`)."""
        return replace(self, out_dir=os.path.join(self.out_dir, f"launch{k}"))

    def rank_path(self, rank: int) -> str:
        return os.path.join(self.out_dir, f"rank{rank}.json")

    @property
    def merged_path(self) -> str:
        return os.path.join(self.out_dir, MERGED)

    @contextmanager
    def session(self, rank: int, device: torch.device):
        """Inside rank `rank` (launch calls this around the rank's function): record, align, write the trace."""
        cuda = device.type == "cuda"
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(
            activities=activities, record_shapes=self.record_shapes, profile_memory=self.profile_memory
        )
        with _quiet():
            prof.start()
        tracer._state.span = _cuda_span if cuda else _span
        try:
            _align(device)
            yield
        finally:
            tracer._state.span = None
            with _quiet():
                prof.stop()
            os.makedirs(self.out_dir, exist_ok=True)
            prof.export_chrome_trace(self.rank_path(rank))

    def merge(self, world_size: int) -> str:
        """In the caller, after the ranks returned: one trace of every rank's, written to `merged_path`."""
        traces = []
        for r in range(world_size):
            with open(self.rank_path(r)) as f:
                traces.append(json.load(f))
        with open(self.merged_path, "w") as f:
            json.dump(merge(traces, self.window), f)
        return self.merged_path


@contextmanager
def _quiet():
    """Kineto writes a line to the process's stdout/stderr at each start and stop ("USDT: ... profiler_start"), which
    launch would print under every rank: send both file descriptors to /dev/null for that moment."""
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            os.dup2(null, fd)
        yield
    finally:
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)
        os.close(null)


def _span(name: str):
    return torch.profiler.record_function(name)


@contextmanager
def _cuda_span(name: str):
    with torch.profiler.record_function(name), torch.cuda.nvtx.range(name):
        yield


def _align(device: torch.device) -> None:
    """Two all-reduces every rank makes together; the second, inside `SYNC`, is the moment the clocks must agree on.
    (Unchecked by the agreement: they are the same one-element all-reduce on every rank by construction.)"""
    with agreement_check(False):
        C.all_reduce_(torch.zeros(1, device=device), None, phase="clock-sync", tag="profile")
        with tracer.active_span()(SYNC):
            C.all_reduce_(torch.zeros(1, device=device), None, phase="clock-sync", tag="profile")
            if device.type == "cuda":
                torch.cuda.synchronize(device)


@contextmanager
def _null():
    yield


def region(name: str):
    """A range around a part of the rank's work ("step"), while a profile is recorded; otherwise nothing. Its name
    has the tracer's form with phase "region" ("step |  | region"), so `spans` reads it back."""
    span = tracer.active_span()
    return _null() if span is None else span(tracer.span_name(name, "", "region"))


def action_span(a, phase: str | None = None):
    """The range a pipeline action runs in while a profile is recorded ("F0@pp | pp.stage1 | forward"); otherwise
    a context that does nothing. `a` is a `pylib.plan.schedules.Action`."""
    span = tracer.active_span()
    if span is None:
        return _null()
    if phase is None:
        phase = "forward" if a.op == "F" or a.what == "act" else "backward"
    return span(tracer.span_name(f"{a}@pp", f"pp.stage{a.stage}", phase))


# ------------------------------------------------------------------------------------------------ merging, reading


def _sync_range(trace: dict, rank: int) -> tuple[float, float]:
    found = [
        (e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("name") == SYNC
    ]
    if len(found) != 1:
        raise ValueError(
            f"rank {rank}'s trace holds {len(found)} ranges named {SYNC!r}, not 1: was it recorded by Profile.session?"
        )
    return found[0]


def clock_offsets(traces: list[dict]) -> list[float]:
    """Microseconds to subtract from each rank's timestamps: the d closest to 0 that makes its `SYNC` range meet
    rank 0's, d in [start_r - end_0, end_r - start_0] (see the module docstring)."""
    ranges = [_sync_range(t, r) for r, t in enumerate(traces)]
    (s0, e0) = ranges[0]
    return [min(max(0.0, s - e0), e - s0) for s, e in ranges]


def merge(traces: list[dict], window: str | None = None) -> dict:
    """One Chrome/Perfetto trace of the ranks' traces (rank r = traces[r]): each rank's processes renumbered
    (rank r's host process is pid r, named "rank r"; a CUDA rank's device rows follow after the world's; the
    profiler's own marks, on the rows kineto names "Spans" and "Traces", are left out), its
    timestamps shifted by `clock_offsets`, flow ids kept apart, and the origin set to the earliest
    event (so times read from 0). window: keep only the events inside the `region` of that name, from its
    earliest start on any rank to its latest end, and read times from its start."""
    n = len(traces)
    offsets = clock_offsets(traces)
    events, extra_pid = [], n
    for r, t in enumerate(traces):
        host = next(e["pid"] for e in t["traceEvents"] if e.get("ph") == "X" and e.get("name") == SYNC)
        pids = {host: r}
        own = [e for e in t["traceEvents"] if not isinstance(e.get("pid", 0), str)]  # not the profiler's own marks
        for e in own:
            if "pid" in e and e["pid"] not in pids:
                pids[e["pid"]], extra_pid = extra_pid, extra_pid + 1
        for e in own:
            e = dict(e)
            if "pid" in e:
                e["pid"] = pids[e["pid"]]
            if "ts" in e:
                e["ts"] = e["ts"] - offsets[r]
            if e.get("ph") in ("s", "f", "t") and "id" in e:
                e["id"] = f"{r}:{e['id']}"
            if e.get("ph") == "M" and e.get("name") in ("process_name", "process_labels", "process_sort_index"):
                continue
            events.append(e)
        for orig, pid in pids.items():
            label = f"rank {r}" if pid == r else f"rank {r}: {orig}"
            events.append(dict(ph="M", name="process_name", pid=pid, tid=0, args=dict(name=label)))
            events.append(dict(ph="M", name="process_sort_index", pid=pid, tid=0, args=dict(sort_index=pid)))
    timed = [e for e in events if not _untimed(e)]
    origin = min(e["ts"] for e in timed)
    if window is not None:
        name = tracer.span_name(window, "", "region")
        marks = [e for e in timed if e.get("ph") == "X" and e.get("name") == name and e.get("pid") in range(n)]
        if len(marks) != n:
            raise ValueError(f"window={window!r}: {len(marks)} ranges named {name!r} in {n} ranks' traces, not 1 each")
        origin, end = min(e["ts"] for e in marks), max(e["ts"] + e["dur"] for e in marks)
        events = [e for e in events if _untimed(e) or origin <= e["ts"] and e["ts"] + e.get("dur", 0) <= end]
    for e in events:
        if "ts" in e and e.get("ph") != "M":
            e["ts"] = round(e["ts"] - origin, 3)
    return dict(
        traceEvents=events,
        displayTimeUnit="ms",
        otherData=dict(ranks=n, offsets_us=offsets, alignment=f"the ranges named {SYNC!r} meet rank 0's"),
    )


def _untimed(e: dict) -> bool:
    return "ts" not in e or e.get("ph") == "M"


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


@dataclass(frozen=True)
class Span:
    """One named range of a merged trace: rank, what ran ("all_reduce@tp", "F0@pp"), the tracer's tag and phase,
    start and end in seconds from the trace's origin."""

    rank: int
    what: str
    tag: str
    phase: str
    start: float
    end: float

    @property
    def op(self) -> str:
        return self.what.partition("@")[0]

    @property
    def axis(self) -> str:
        return self.what.partition("@")[2]

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def kind(self) -> str:
        """ "F" (a pipeline forward), "B" (a backward or W), "wait" (a wait for an async op, a pipeline receive),
        "comm" (a collective, a transfer's launch, a pipeline send) or "region" (a `region`)."""
        if self.phase == "region":
            return "region"
        if self.axis == "pp" and self.op[:1] in ("F", "B", "W") and self.op[1:2].isdigit():
            return "F" if self.op[0] == "F" else "B"
        if self.op.startswith("wait") or (self.axis == "pp" and self.op.startswith("recv")):
            return "wait"
        return "comm"


def spans(trace: dict) -> list[Span]:
    """Every range named by `pylib.runtime.tracer.span_name` in a merged trace, by start time."""
    n = trace["otherData"]["ranks"]
    found = [
        _span_of(e["pid"], e)
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and e.get("pid") in range(n) and _NAME.match(e.get("name", ""))
    ]
    return sorted(found, key=lambda s: (s.start, s.rank))


def _span_of(rank: int, e: dict) -> Span:
    m = _NAME.match(e["name"])
    return Span(rank, m["what"], m["tag"], m["phase"], e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6)


def operators(trace: dict, rank: int) -> list[tuple[float, float]]:
    """(start, end) seconds when rank `rank`'s thread was computing, as the trace shows it: its operator slices
    (kineto's "cpu_op": aten ops, autograd nodes) on the thread that ran its named ranges, leaving out a slice that
    holds a named range (a wrapper, such as the autograd node of a function whose backward communicates) and a
    slice inside a communication range (the op's own bookkeeping); what is left, merged where it touches."""
    named = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("pid") == rank and _NAME.match(e["name"])]
    if not named:
        return []
    tid = named[0]["tid"]
    ranges = [(e["ts"], e["ts"] + e["dur"], _span_of(rank, e).kind) for e in named if e["tid"] == tid]
    comm = [(a, b) for a, b, k in ranges if k in ("comm", "wait")]
    slices = []
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e.get("pid") == rank and e.get("tid") == tid:
            a, b = e["ts"], e["ts"] + e["dur"]
            if any(a <= x and y <= b for x, y, _ in ranges) or any(x <= a and b <= y for x, y in comm):
                continue
            slices.append((a, b))
    out: list[list[float]] = []
    for a, b in sorted(slices):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a / 1e6, b / 1e6) for a, b in out]


def lanes(trace: dict) -> tuple[list[Span], list[list[tuple[float, float]]]]:
    """What `pylib.viz.profile.plot_profile` draws of a merged trace: its named ranges and each rank's operators."""
    return spans(trace), [operators(trace, r) for r in range(trace["otherData"]["ranks"])]


def within(found: list[Span], outer: Span) -> list[Span]:
    """The spans of `outer`'s rank that lie inside it (a rank's own `region("step")`: in a merged window other
    ranks may still be finishing what came before)."""
    return [s for s in found if s.rank == outer.rank and outer.start <= s.start and s.end <= outer.end]


def held_peak(trace: dict, rank: int, intervals: list[Span]) -> int:
    """The most bytes rank `rank` held at once of what it allocated inside `intervals` (its forwards, say): each
    allocation made inside one counts from then until its free, wherever that happens (profile_memory=True). For a
    pipeline's forwards that is what the forwards leave for their backwards, as the CPU allocator saw it."""
    live, held, peak = {}, 0, 0
    for e in sorted(_memory_events(trace, rank), key=lambda e: e["ts"]):
        t, a = e["ts"] / 1e6, e["args"]
        if a["Bytes"] > 0 and any(s.start <= t <= s.end for s in intervals):
            live[a["Addr"]] = a["Bytes"]
            held += a["Bytes"]
            peak = max(peak, held)
        elif a["Bytes"] < 0 and a["Addr"] in live:
            held -= live.pop(a["Addr"])
    return peak


def _memory_events(trace: dict, rank: int) -> list[dict]:
    """The CPU allocator's events of rank `rank` ("Device Type" 0; 1 is CUDA's)."""
    return [
        e
        for e in trace["traceEvents"]
        if e.get("ph") == "i"
        and e.get("name") == "[memory]"
        and e.get("pid") == rank
        and e["args"].get("Device Type", 0) == 0
    ]


def allocated(trace: dict, rank: int) -> list[tuple[float, int]]:
    """(seconds, bytes) of rank `rank`'s CPU allocator after each allocation and free the profile recorded
    (profile_memory=True): its "Total Allocated", the bytes live since the profile started."""
    return sorted((e["ts"] / 1e6, int(e["args"]["Total Allocated"])) for e in _memory_events(trace, rank))
