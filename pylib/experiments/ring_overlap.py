"""Does the ring hide its K/V transfers behind the block attention? Measured on real ranks, both ways.

`ring_overlap_timings` runs `pylib.cp.ring_attention` forward and backward on `cp` launched ranks twice per
repeat: with `overlap=True` (each step's `batch_isend_irecv` is posted *before* that step's block attention and
waited for after it) and with `overlap=False` (the blocking baseline: the transfer is waited for before the
compute starts). It returns, for each variant, the slowest rank's median over the repeats of

    wall      seconds of one forward + backward
    compute   seconds inside the block kernels and merges (`RingStats.compute_s`)
    wait      seconds blocked on a transfer (`RingStats.wait_s`): the communication that compute did not hide

and, from one traced run of each variant, the order of events on every rank: for every step that has a next
block to receive, whether the transfer was issued before the step's compute started and completed (waited for)
only after it ended (`spans_compute`), or completed before the compute started (`before_compute`). These
orderings are read from the tracer's timestamps (`CommEvent.t_start`, `t_end`) against the recorder's; they are
facts of the code path, not of the machine's speed. The seconds are the machine's: `machine()` says which.

Shapes: q [b, n_head, s/cp, d_head], k and v [b, n_kv_head, s/cp, d_head] per rank, float32, zig-zag layout.
"""

from __future__ import annotations

import os
import platform
import statistics
from contextlib import contextmanager

import torch
import torch.distributed as dist

from pylib.cp import RingStats, ring_attention, shard_sequence
from pylib.i18n import tr
from pylib.runtime import clock, launch, trace
from pylib.runtime.collectives import all_reduce_

VARIANTS = (("overlap", True), ("blocking", False))  # name, the `overlap` argument


class TimelineStats(RingStats):
    """`RingStats` that also keeps when each step's compute started and ended (host seconds, the tracer's clock)."""

    def __init__(self):
        super().__init__()
        self.intervals: list[tuple[str, int, float, float]] = []  # (phase, step, start, end)
        self._open: list[tuple[float, float]] = []

    @contextmanager
    def computing(self):
        t0 = clock.device_now()
        with super().computing():
            yield
        self._open.append((t0, clock.device_now()))

    def step_done(self, phase, step, kv_owner, plan, per_entry):
        super().step_done(phase, step, kv_owner, plan, per_entry)
        for t0, t1 in self._open:
            self.intervals.append((phase, step, t0, t1))
        self._open = []


def _orders(events, stats: TimelineStats, n: int) -> list[dict]:
    """For each forward step t < n-1: the K/V transfer for step t+1 against step t's compute interval."""
    out = []
    for phase, step, c0, c1 in stats.intervals:
        if phase != "forward" or step + 1 >= n:
            continue
        sends = [e for e in events if e.op == "send" and e.tag.endswith(f"ring.kv.{step + 1}") and e.phase == phase]
        (e,) = sends
        out.append(
            dict(
                step=step,
                spans_compute=e.t_start <= c0 and e.t_end >= c1,
                before_compute=e.t_end <= c0,
            )
        )
    return out


def _timeline(events, stats: TimelineStats, t0: float) -> dict:
    """One run on this rank, in seconds since it started: each step's compute intervals (phase, step, start, end)
    and each ring transfer from when it was issued to when it was waited for (phase, name "kv.1" / "dkv.1", start,
    end; the receive of each `batch_isend_irecv` pair: its send is issued and waited for with it)."""
    compute = [dict(phase=p, step=st, start=a - t0, end=b - t0) for p, st, a, b in stats.intervals]
    transfers = [
        dict(phase=e.phase, name=e.tag.rsplit("ring.", 1)[-1], start=e.t_start - t0, end=e.t_end - t0)
        for e in events
        if e.op == "recv" and "ring." in e.tag
    ]
    return dict(compute=compute, transfers=transfers)


def _rank(full, repeats: int, causal: bool):
    r, n = dist.get_rank(), dist.get_world_size()
    q, k, v = (shard_sequence(x, 2, r, n, "zigzag") for x in full)
    times = {True: [], False: []}
    results, orders, timelines = {}, {}, {}
    for i in range(repeats + 1):
        for overlap in (True, False) if i % 2 else (False, True):  # alternate, so drift hits both alike
            ql, kl, vl = (x.clone().requires_grad_() for x in (q, k, v))
            stats = TimelineStats()
            all_reduce_(torch.zeros(1))  # a barrier, through the traced collectives (outside the trace)
            with trace() as tr:
                t0 = clock.now()
                out = ring_attention(ql, kl, vl, causal=causal, overlap=overlap, stats=stats)
                out.sum().backward()
                wall = clock.now() - t0
            if i == 0:  # the first round warms up; keep its results and orders
                results[overlap] = [out.detach(), ql.grad, kl.grad, vl.grad]
                orders[overlap] = _orders(tr.events, stats, n)
                continue
            times[overlap].append((wall, stats.compute_s(None), stats.wait_s(None)))
            timelines[overlap] = _timeline(tr.events, stats, t0)  # the last repeat's
    return dict(times=times, results=results, orders=orders, timelines=timelines)


def machine() -> str:
    """The machine these seconds were measured on, in one line."""
    cpu = platform.processor() or platform.machine()
    return tr(
        "{system} {machine} ({cpu}), {n} CPU cores, torch {torch}, gloo over loopback TCP",
        system=platform.system(),
        machine=platform.machine(),
        cpu=cpu,
        n=os.cpu_count(),
        torch=torch.__version__,
    )


def ring_overlap_timings(
    cp: int = 2,
    b: int = 1,
    s: int = 1024,
    n_head: int = 8,
    n_kv_head: int = 8,
    d_head: int = 64,
    causal: bool = True,
    repeats: int = 5,
) -> dict:
    """Ring attention forward + backward on `cp` gloo ranks, overlapped and blocking (see the module docstring).

    Returns dict(machine, sizes, kv_message_bytes, variants={"overlap": {...}, "blocking": {...}} with the
    slowest rank's median wall / compute / wait seconds, identical (every rank's output and input gradients
    equal bit for bit between the two variants), orders={"overlap": [...], "blocking": [...]} per rank,
    timelines={"overlap": [...], "blocking": [...]}: per rank, the last repeat's compute intervals and transfers,
    `_timeline`)."""
    g = torch.Generator().manual_seed(0)
    full = [torch.randn(b, h, s, d_head, generator=g) for h in (n_head, n_kv_head, n_kv_head)]
    ranks = launch(_rank, cp, full, repeats, causal, backend="gloo", timeout=300)
    variants = {}
    for name, key in VARIANTS:
        med = [[statistics.median(col) for col in zip(*rank["times"][key])] for rank in ranks]
        variants[name] = dict(zip(("wall", "compute", "wait"), (max(m[j] for m in med) for j in range(3))))
    identical = all(
        all(torch.equal(a, c) for a, c in zip(rank["results"][True], rank["results"][False])) for rank in ranks
    )
    return dict(
        machine=machine(),
        sizes=dict(cp=cp, b=b, s=s, n_head=n_head, n_kv_head=n_kv_head, d_head=d_head, causal=causal),
        kv_message_bytes=2 * b * n_kv_head * (s // cp) * d_head * 4,
        repeats=repeats,
        variants=variants,
        identical=identical,
        orders={name: [rank["orders"][key] for rank in ranks] for name, key in VARIANTS},
        timelines={name: [rank["timelines"][key] for rank in ranks] for name, key in VARIANTS},
    )
