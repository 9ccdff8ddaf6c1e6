"""Does the EP all-to-all hide behind the other micro-batch's compute? Measured on real ranks, both ways.

`ep_overlap_timings` runs a stack of MoE layers (`pylib.ep.overlap.ExpertParallelStack`) on `ep` launched gloo
ranks, two micro-batches per step, forward and backward, with `interleave(overlap=True)` (micro-batch A's
dispatch and combine in flight while B computes, and the other way round) and `overlap=False` (the blocking
baseline: A's layers, then B's, each all-to-all waited for at once), alternating the two over the repeats. It
returns, for each variant, the slowest rank's median over the repeats of

    wall      seconds of one step (both micro-batches, forward + backward)
    forward   seconds of the forward alone
    wait      seconds the forward sat blocked in a wait for an all-to-all: the communication compute did not hide
    compute   seconds of the forward's compute segments (both micro-batches): the same work in both variants, so
              a larger number overlapped says the transfers slowed the compute down (gloo's threads share the cores)

and, from the last repeat, every rank's timeline: the recorder's compute segments (micro-batch, name, start, end)
and the tracer's forward all-to-alls (micro-batch, name, issued, waited for), in seconds since the step began;
`in_flight`: for every forward all-to-all, whether its [issue, wait] interval intersects a compute segment of
the other micro-batch (a fact of the code path); `identical`: loss and every gradient equal bit for bit between
the variants on every rank (in the run's dtype, float32 by default).

`ep_fwd_bwd_timings` measures the other pairing, Megatron-Core's combined 1F1B: micro-batch A's forward cut into
pieces (`pylib.ep.overlap.Segments`), then A's backward piece by piece with B's forward (`interleave([A's backward,
B's forward])`, overlap=True: "paired"; overlap=False: "blocking", A's whole backward, then B's forward), then B's
backward. Its times and timelines are of the pairing alone: `pair` seconds, `wait` (the scheduler's waits for the
all-to-alls of both), `compute` (both micro-batches' pieces); its transfers are A's backward all-to-alls (named
"grad.dispatch.<layer>" / "grad.combine.<layer>") and B's forward ones.
"""

from __future__ import annotations

import statistics
from contextlib import nullcontext

import torch
import torch.distributed as dist

from pylib.ep.overlap import ExpertParallelStack, OverlapRecorder, Segments, interleave
from pylib.model import build_model
from pylib.plan.config import ModelConfig, MoEConfig
from pylib.runtime import Mesh, ParallelConfig, clock, launch, trace
from pylib.runtime.collectives import all_reduce_

from .ring_overlap import machine

VARIANTS = (("overlap", True), ("blocking", False))  # name, interleave's `overlap`
TIMES = ("wall", "forward", "wait", "compute")  # per variant, seconds (see the module docstring)
FWD_BWD_VARIANTS = (("paired", True), ("blocking", False))
FWD_BWD_TIMES = ("pair", "wait", "compute")


def _timeline(rec: OverlapRecorder, events, t0: float, phases=("forward",)) -> dict:
    compute = [dict(mb=i, name=name, start=a - t0, end=b - t0) for i, name, a, b in rec.compute]
    transfers = [
        dict(
            mb=int(tags[0][2:]),
            name=("grad." if e.phase == "backward" else "") + f"{tags[3]}.{tags[2]}",
            start=e.t_start - t0,
            end=e.extra["t_wait"] - t0,
        )
        for e in events
        for tags in [e.tag.split(".")]  # "mb0.layers.1.dispatch" -> mb 0, "dispatch.1"
        if e.op == "all_to_all" and e.extra.get("is_async") and e.phase in phases
    ]
    return dict(compute=compute, transfers=transfers)


def in_flight(timeline: dict) -> list[bool]:
    """For each forward all-to-all of a timeline: is it in flight (issued before, waited for after) across some
    compute of the other micro-batch, i.e. do the intervals intersect?"""
    out = []
    for t in timeline["transfers"]:
        others = [c for c in timeline["compute"] if c["mb"] != t["mb"]]
        out.append(any(c["start"] < t["end"] and t["start"] < c["end"] for c in others))
    return out


def _rounds(cfg: ModelConfig, b: int, s: int, seed: int, repeats: int):
    """This rank's rounds of a measurement: (round, overlap, that variant's stack with its gradients zeroed, fresh
    leaf copies of the two micro-batches [b, s, h] drawn from `seed`). Round 0 warms up; the variants alternate
    which goes first, so drift hits both alike."""
    ep = dist.get_world_size()
    mesh = Mesh(ParallelConfig(dp=ep, ep=ep))
    model = build_model(cfg)
    g = torch.Generator().manual_seed(seed + dist.get_rank())
    xs = [torch.randn(b, s, cfg.d_model, generator=g, dtype=model.embed.weight.dtype) for _ in range(2)]
    stacks = {overlap: ExpertParallelStack(model.layers, ep_group=mesh.ep) for overlap in (True, False)}
    for i in range(repeats + 1):
        for overlap in (True, False) if i % 2 else (False, True):
            stacks[overlap].zero_grad(set_to_none=True)
            yield i, overlap, stacks[overlap], [x.clone().requires_grad_() for x in xs]


def _rank(cfg: ModelConfig, b: int, s: int, repeats: int):
    times = {True: [], False: []}
    results, timelines = {}, {}
    for i, overlap, stack, inputs in _rounds(cfg, b, s, 100, repeats):
        rec = OverlapRecorder()
        all_reduce_(torch.zeros(1))  # a barrier, through the traced collectives (outside the trace)
        with trace() as tr:
            t0 = clock.now()
            outs = interleave([stack.steps(x) for x in inputs], overlap=overlap, recorder=rec)
            t_forward = clock.now()
            loss = sum((o * o).mean() for o in outs)
            loss.backward()
            wall = clock.now() - t0
        if i == 0:  # the first round warms up; keep its bits
            results[overlap] = [loss.detach()] + [p.grad for p in stack.parameters()] + [x.grad for x in inputs]
            continue
        waited = sum(end - start for _, _, start, end in rec.waits)
        computed = sum(end - start for _, _, start, end in rec.compute)
        times[overlap].append((wall, t_forward - t0, waited, computed))
        timelines[overlap] = _timeline(rec, tr.events, t0)  # the last repeat's
    return dict(times=times, results=results, timelines=timelines)


def _fwd_bwd_step(stack, xs, overlap: bool, tracing: bool):
    """A's forward in pieces, [A's backward, B's forward] paired (or one after the other), B's backward. Returns
    (loss, the pairing's seconds, its recorder, its trace events, its start time)."""
    xa, xb = xs
    segments = Segments()
    (out_a,) = interleave([stack.steps(xa, cut=segments)], overlap=False)
    loss_a = (out_a * out_a).mean()
    rec = OverlapRecorder()
    all_reduce_(torch.zeros(1))  # a barrier, through the traced collectives (outside the trace)
    with trace() if tracing else nullcontext() as tr:
        t0 = clock.now()
        _, out_b = interleave([segments.backward(loss_a), stack.steps(xb)], overlap=overlap, recorder=rec)
        seconds = clock.now() - t0
    loss_b = (out_b * out_b).mean()
    loss_b.backward()
    return (loss_a + loss_b).detach(), seconds, rec, tr.events if tracing else [], t0


def _fwd_bwd_rank(cfg: ModelConfig, b: int, s: int, repeats: int):
    times = {True: [], False: []}
    results, timelines = {}, {}
    for i, overlap, stack, inputs in _rounds(cfg, b, s, 200, repeats):
        loss, seconds, rec, events, t0 = _fwd_bwd_step(stack, inputs, overlap, tracing=i == repeats)
        if i == 0:  # the first round warms up; keep its bits
            results[overlap] = [loss] + [p.grad for p in stack.parameters()] + [x.grad for x in inputs]
            continue
        waited = sum(end - start for _, _, start, end in rec.waits)
        computed = sum(end - start for _, _, start, end in rec.compute)
        times[overlap].append((seconds, waited, computed))
        if events:
            timelines[overlap] = _timeline(rec, events, t0, phases=("forward", "backward"))
    return dict(times=times, results=results, timelines=timelines)


def ep_fwd_bwd_timings(ep: int = 2, b: int = 2, s: int = 128, d_model: int = 128, repeats: int = 3) -> dict:
    """A's backward paired with B's forward, and one after the other, on `ep` gloo ranks (the module docstring).

    Returns dict(machine, sizes, repeats, variants={"paired": {...}, "blocking": {...}} with the slowest rank's
    median pair / wait / compute seconds, identical, timelines and in_flight per variant and rank, as
    `ep_overlap_timings` gives them; the last repeat is traced)."""
    cfg = overlap_config(d_model)
    ranks = launch(_fwd_bwd_rank, ep, cfg, b, s, repeats, backend="gloo", timeout=300)
    return _summary(ranks, cfg, dict(ep=ep, b=b, s=s, h=d_model), repeats, FWD_BWD_VARIANTS, FWD_BWD_TIMES)


def _summary(ranks: list, cfg: ModelConfig, sizes: dict, repeats: int, variants: tuple, columns: tuple) -> dict:
    """What both measurements return from their ranks' dicts: for each (name, key) of `variants`, the slowest rank's
    median of each of `columns`; whether the two variants' bits are identical on every rank; each rank's timeline
    and what was in flight on it."""
    medians = {}
    for name, key in variants:
        med = [[statistics.median(col) for col in zip(*rank["times"][key])] for rank in ranks]
        medians[name] = dict(zip(columns, (max(m[j] for m in med) for j in range(len(columns)))))
    identical = all(
        all(torch.equal(a, c) for a, c in zip(rank["results"][True], rank["results"][False], strict=True))
        for rank in ranks
    )
    timelines = {name: [rank["timelines"][key] for rank in ranks] for name, key in variants}
    return dict(
        machine=machine(),
        sizes=dict(sizes, n_experts=cfg.moe.n_experts, top_k=cfg.moe.top_k, layers=cfg.n_layers),
        repeats=repeats,
        variants=medians,
        identical=identical,
        timelines=timelines,
        in_flight={name: [in_flight(tl) for tl in timelines[name]] for name, _ in variants},
    )


def overlap_config(d_model: int = 128, n_experts: int = 4, top_k: int = 2, n_layers: int = 2) -> ModelConfig:
    """The measured stack: every layer an MoE of `n_experts` experts (h_ffn = 2h each), top-k, float32."""
    moe = MoEConfig(n_experts=n_experts, top_k=top_k, every=1)
    return ModelConfig(
        vocab_size=32, d_model=d_model, n_layers=n_layers, n_heads=4, d_ff=2 * d_model, moe=moe, dtype="float32"
    )


def ep_overlap_timings(ep: int = 2, b: int = 2, s: int = 128, d_model: int = 128, repeats: int = 5) -> dict:
    """Both variants on `ep` gloo ranks, micro-batches of [b, s, h] tokens per rank (see the module docstring).

    Returns dict(machine, sizes, repeats, variants={"overlap": {...}, "blocking": {...}} with the slowest rank's
    median wall / forward / wait / compute seconds, identical, timelines={"overlap": [...], "blocking": [...]} per rank,
    in_flight={"overlap": [...], "blocking": [...]} per rank)."""
    cfg = overlap_config(d_model)
    ranks = launch(_rank, ep, cfg, b, s, repeats, backend="gloo", timeout=300)
    return _summary(ranks, cfg, dict(ep=ep, b=b, s=s, h=d_model), repeats, VARIANTS, TIMES)
