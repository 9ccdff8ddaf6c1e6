"""Run one rank's part of a pipeline schedule: its action list, over point-to-point ops on the pp group.

    sched = build("1f1b", p, m)                                   # pure; the same lists on every rank
    run = run_pipeline(sched, my_chunks, Boundary((b, s, h)), group=mesh.pp, inputs=ids_mbs, targets=tgt_mbs)
    run.losses, run.timeline                                       # per-microbatch losses (last stage), events

The executor is generic over the stage modules: `chunks[c]` is any nn.Module for this rank's chunk c (virtual
stage c·p + rank). The first virtual stage is called as `chunk(inputs[mb])`; the last returns the microbatch's
loss, called as `chunk(x, targets[mb])`; every other stage as `chunk(x)` with x the activation received from the
previous stage. What crosses a stage boundary is a `Boundary`: the activation entering stage k for microbatch mb
has shape `boundary.shape(mb, k)` (a tuple means the same shape everywhere); its gradient, sent back, has the same
shape. A stage with tensor or context parallelism inside has local shapes that differ from the full [b, s, h] --
it passes its own function.

Loss scaling. Each microbatch's loss is a mean over its own tokens; the full batch's loss is the mean of the m
microbatch losses, so each is divided by m before its backward (`scale_loss=True`, as Megatron does). The
parameter gradients, summed over microbatches by autograd, then equal the full-batch gradient. Without the
division they are m times too large. (torch.distributed.pipelining keeps the loss unscaled and divides the
gradients by m after the last backward instead: `scale_grads=True`; same result.)

Sends and receives. By default a send is posted (`isend`) and the rank moves on; every send is waited for at the
end of the step. The rank keeps its next `RECVS_AHEAD` (3) receives posted (`irecv`, in its list's order: two
receives from one peer are matched in the order the sender sends them), so their data comes in while it computes,
as torch's schedules post receives ahead; the recv action then waits for the first. Measured with
`bench/peers.py --rows pp` (30 cycles, two runs each, ours over torch's): one receive ahead 0.99-1.02 (1F1B),
0.85-0.93 (interleaved), 0.93-0.96 (zb-v), 1.05-1.07 (dualpipev); three ahead 0.81-0.85, 0.75-0.76, 0.82,
0.88-0.93; two or eight ahead about as three. `blocking_sends=True` uses gloo's blocking `send` instead, which
waits for the receiver (a rendezvous): the schedule's order is deadlock-free under both (see
`pylib.plan.schedules`), but blocking sends add stalls to the interleaved schedule when a forward and a backward
cost different times (`pylib.pp.simulate` shows where).

Agreement. Before its first send, each step's ranks agree on the schedule, m, v, the boundary dtype and every
boundary's shape, compared between the two ranks on either side of it (`pylib.runtime.agreement.agree_pipeline`):
a stage built with another activation shape, or given another microbatch count, is refused naming both ranks,
instead of gloo aborting with "Received data size doesn't match". One small untraced all-reduce (max) of a hash
of all of it in the first step and after a change; a step the same as the verified one is predicted, at no
communication; the two all-gathers that name a disagreement run only when the hashes differ.

Split backward. A rank whose list holds a W for (mb, chunk) runs that B as the input gradient only and the W later
(`pylib.pp.backward`: the same float64 bits as the fused backward); what W needs -- the forward's graph and the
output gradients kept at the frontier nodes -- stays alive, and counted, from the B to the W.

Timing and memory are observed, not threaded through: a `PipelineRecorder` (`pylib.pp.recorder`) records every
forward, backward, send and receive as an `Event` with start and end in seconds since a common start (the ranks
meet in a one-element all-reduce first), and the bytes autograd saved for each forward. Its `compute_delay` pads
compute to fixed costs (a measurement aid for comparing the measured bubble with the formula);
`record_timeline=False` records no Event and makes no all-reduce.

What a step costs beyond its sends, receives and compute -- what torch.distributed.pipelining's schedules also
pay -- is the agreement's one all-reduce (while `checks_each_step()`, once verified none) and the recorder's time
origin (while it records a timeline); the losses are read to the host once, at the end of the step (a read per
microbatch would wait for a GPU m times). `tests/test_pp_executor.py` counts the torch.distributed calls of a step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from pylib.plan.schedules import Action, Schedule

from ..runtime import collectives as C
from ..runtime import profile, tracer
from ..runtime.agreement import agree_pipeline
from ..runtime.launch import current_device
from .backward import backward_input
from .recorder import PipelineRecorder
from .timeline import Event


@dataclass
class PipelineRun:
    """What one rank saw in one step.

    losses: each microbatch's (unscaled) loss, on the rank holding the last stage; empty elsewhere. Under DualPipe
    the two end ranks each hold one copy's half (microbatches 0..m/2-1 on rank p-1, m/2..m-1 on rank 0).
    loss: their mean = the full-batch mean loss (None off the last stage; DualPipe: the mean of its half).
    timeline: this rank's Events (seconds from the common start).
    peak_in_flight: most (microbatch, chunk) activations held at once.
    activation_bytes: bytes autograd saved in each forward, by (mb, chunk); peak_activation_bytes: most held at once.
    """

    rank: int
    losses: list[float] = field(default_factory=list)
    loss: float | None = None
    timeline: list[Event] = field(default_factory=list)
    peak_in_flight: int = 0
    activation_bytes: dict[tuple[int, int], int] = field(default_factory=dict)
    peak_activation_bytes: int = 0


def microbatches(t: torch.Tensor, n_microbatches: int) -> list[torch.Tensor]:
    """Split a batch along dim 0 into m equal microbatches (raises if m does not divide the batch)."""
    if not isinstance(n_microbatches, int) or n_microbatches < 1:
        raise ValueError(f"the number of microbatches must be a positive integer, got {n_microbatches!r}")
    if t.shape[0] % n_microbatches:
        raise ValueError(f"m={n_microbatches} microbatches do not divide the batch size b={t.shape[0]}")
    return list(t.chunk(n_microbatches, dim=0))


def _first_float_dtype(chunks: Sequence[nn.Module]) -> torch.dtype:
    for chunk in chunks:
        for p in chunk.parameters():
            if p.is_floating_point():
                return p.dtype
    return torch.get_default_dtype()


def pipeline_device(chunks: Sequence[nn.Module], device=None) -> torch.device:
    """Where this rank's receive buffers go: `device` if given, else the device of the chunks' first parameter
    (or buffer), else the rank's device (`pylib.runtime.current_device()`: its GPU under NCCL).

    A chunk may hold no parameters at all: under ZeRO-3 (`pylib.dp.FullyShardedDataParallel`) the wrapper owns
    them and the modules keep only placeholders, so the caller that knows the device should pass it."""
    if device is not None:
        return torch.device(device)
    for chunk in chunks:
        for t in (*chunk.parameters(), *chunk.buffers()):
            return t.device
    return current_device()


@dataclass(frozen=True)
class Boundary:
    """The tensors that cross a stage boundary (an activation forward, its gradient back): their shape, a tuple or
    shape(mb, stage) for the activation entering `stage`; their dtype (None: the chunks' first floating dtype); the
    device their receive buffers are allocated on (None: `pipeline_device`; pass it when the chunks hold no
    parameters of their own, as under ZeRO-3)."""

    shape: tuple | Callable[[int, int], tuple]
    dtype: torch.dtype | None = None
    device: torch.device | str | None = None

    def shape_of(self, mb: int, stage: int) -> tuple:
        return self.shape(mb, stage) if callable(self.shape) else tuple(self.shape)


def run_pipeline(
    schedule: Schedule,
    chunks: Sequence[nn.Module],
    boundary: Boundary,
    *,
    group=None,
    inputs: Sequence[torch.Tensor] | None = None,
    targets: Sequence | None = None,
    scale_loss: bool = True,
    blocking_sends: bool = False,
    backward_context: Callable[[int, int], AbstractContextManager] | None = None,
    recorder: PipelineRecorder | None = None,
) -> PipelineRun:
    """Run this rank's actions of `schedule` (one training step's forwards and backwards, no optimizer step).

    group: the pipeline AxisGroup (None = every rank); its size must be schedule.p and this rank's index in it
    picks the action list. chunks: this rank's v stage modules. inputs / targets: the m microbatches' inputs and
    targets (needed only on the ranks holding the first / the last virtual stage). Gradients accumulate into the
    chunks' parameters' .grad (zero them before the step).

    backward_context(mb, chunk), if given, returns a context manager each backward runs inside: how a data-parallel
    wrapper is told to only accumulate (`no_sync()`) in every backward of a chunk but its last, so its gradients
    are reduced once per step, after the last microbatch (as Megatron's schedules do with their no_sync_func).

    boundary: the shape, dtype and device of what crosses a stage boundary (`Boundary`). recorder: what observes
    the run (`PipelineRecorder`: the timeline, the activations held; its measure_memory and compute_delay
    options); a fresh one by default."""
    g = C.resolve_group(group)
    _check_run(schedule, chunks, g, inputs, targets)
    dtype = boundary.dtype or _first_float_dtype(chunks)
    # once per step, before any send: the schedule, m and every boundary's shape agreed by its two ends
    agree_pipeline(g, schedule, dtype, boundary.shape_of)
    rec = PipelineRecorder() if recorder is None else recorder
    device = pipeline_device(chunks, boundary.device)
    step = RankStep(
        chunks,
        g,
        inputs,
        targets,
        m=schedule.m,
        ranks=schedule.ranks,
        spans=schedule.spans,
        shape_of=boundary.shape_of,
        dtype=dtype,
        device=device,
        scale_loss=scale_loss,
        blocking_sends=blocking_sends,
        backward_context=backward_context,
        rec=rec,
        deferred=schedule.deferred(g.rank),
    )
    rec.start(g.rank, g, device)
    actions = schedule[g.rank]
    recvs = iter([a for a in actions if a.op == "recv"])
    for _ in range(RECVS_AHEAD):
        step.post_recv(next(recvs, None))
    for a in actions:
        with profile.action_span(a), rec.action(a):  # a named range only while a profile is recorded
            step.do(a)
        if a.op == "recv":  # one more receive posted ahead, to arrive while this rank computes
            step.post_recv(next(recvs, None))
    losses = step.finish()  # empty off the last stage
    return PipelineRun(
        rank=g.rank,
        losses=losses,
        loss=sum(losses) / len(losses) if losses else None,
        timeline=rec.timeline,
        peak_in_flight=rec.peak_in_flight,
        activation_bytes=rec.activation_bytes,
        peak_activation_bytes=rec.peak_activation_bytes,
    )


def _check_run(schedule: Schedule, chunks, g, inputs, targets) -> None:
    """The group, the chunks and the microbatches fit the schedule (checked before any communication)."""
    p, m, v = schedule.p, schedule.m, schedule.v
    if g.size != p:
        raise ValueError(f"the schedule is for p={p} ranks but the pipeline group has {g.size}")
    if len(chunks) != v:
        raise ValueError(f"the schedule runs v={v} chunks per rank but this rank holds {len(chunks)}")
    me = g.rank
    firsts = {schedule.rank_of(lo) for lo, _ in schedule.spans.values()}
    lasts = {schedule.rank_of(hi) for _, hi in schedule.spans.values()}
    if me in firsts and (inputs is None or len(inputs) != m):
        raise ValueError(f"rank {me} holds the first stage and needs m={m} microbatch inputs")
    if me in lasts and (targets is None or len(targets) != m):
        raise ValueError(f"rank {me} holds the last stage and needs m={m} microbatch targets")


RECVS_AHEAD = 3  # receives posted ahead of the one the rank waits for next, in its list's order


@dataclass
class RankStep:
    """One rank's step: one method per action of the schedule, and what each (microbatch, chunk) holds between
    its actions. `do(a)` runs action `a`; `finish()` waits for the posted sends and returns the losses."""

    chunks: Sequence[nn.Module]
    g: object  # the pipeline AxisGroup
    inputs: Sequence[torch.Tensor] | None
    targets: Sequence | None
    m: int
    ranks: tuple[int, ...]  # ranks[k]: the rank holding stage k (the schedule's placement)
    spans: dict  # mb -> (first, last) stage it runs through (`Schedule.spans`: DualPipe's two copies)
    shape_of: Callable[[int, int], tuple]
    dtype: torch.dtype
    device: torch.device
    scale_loss: bool
    blocking_sends: bool
    backward_context: Callable[[int, int], AbstractContextManager] | None
    rec: PipelineRecorder
    deferred: set = field(default_factory=set)  # (mb, chunk) whose weight gradient runs as a separate W
    weight_grads: dict = field(default_factory=dict)  # (mb, chunk) -> the WeightGrad its W runs
    stage_in: dict = field(default_factory=dict)  # (mb, chunk) -> received activation (requires grad)
    stage_out: dict = field(default_factory=dict)  # (mb, chunk) -> output (the scaled loss on the last stage)
    grad_out: dict = field(default_factory=dict)  # (mb, chunk) -> received gradient of the output
    grad_in: dict = field(default_factory=dict)  # (mb, chunk) -> gradient of the input, to send back
    losses: dict = field(default_factory=dict)  # mb -> its unscaled loss, detached (last stage)
    pending_sends: list = field(default_factory=list)  # posted sends, waited for at the end of the step
    posted_recvs: list = field(default_factory=list)  # [(action, posted receive)]: the next recvs, in list order

    def __post_init__(self):
        self.excluded = [list(chunk.parameters()) for chunk in self.chunks]  # not activations
        self.ops = {"F": self.forward, "B": self.backward, "W": self.weight, "send": self.send, "recv": self.recv}

    def do(self, a: Action) -> None:
        if a.op not in self.ops:
            raise ValueError(f"unknown action {a}")
        self.ops[a.op](a)

    def forward(self, a: Action) -> None:
        key, chunk = (a.mb, a.chunk), self.chunks[a.chunk]
        first, last = self.spans[a.mb]
        if a.stage > first and self.ranks[a.stage - 1] == self.g.rank:  # the V's turn: the previous stage is here
            self.stage_in[key] = self.stage_out[(a.mb, (a.stage - 1) // self.g.size)].detach().requires_grad_()
        x = self.inputs[a.mb] if a.stage == first else self.stage_in[key]
        with self.rec.forward(key, self.excluded[a.chunk]):
            if a.stage == last:
                y = self.loss(chunk, x, a.mb)
            else:
                y = chunk(x)
        self.stage_out[key] = y

    def loss(self, chunk, x, mb: int) -> torch.Tensor:
        """The last stage: the microbatch's loss, kept unscaled, returned divided by m when scale_loss."""
        loss = chunk(x, self.targets[mb])
        if loss.dim() != 0:
            raise ValueError(f"the last stage must return a scalar loss, got shape {tuple(loss.shape)}")
        self.losses[mb] = loss.detach()  # read once, in finish(): a float() here would wait for a GPU each time
        return loss / self.m if self.scale_loss else loss

    def backward(self, a: Action) -> None:
        key = (a.mb, a.chunk)
        y = self.stage_out.pop(key)
        first, last = self.spans[a.mb]
        if a.stage == last:
            dy = None
        elif self.ranks[a.stage + 1] == self.g.rank:  # the V's turn: the next stage's B ran here
            dy = self.grad_in.pop((a.mb, (a.stage + 1) // self.g.size))
        else:
            dy = self.grad_out.pop(key)
        if key in self.deferred:  # B: the input gradient only; W comes later
            x = self.stage_in.pop(key) if a.stage > first else None
            dx, self.weight_grads[key] = backward_input(y, dy, x, self.excluded[a.chunk])
            if a.stage > first:
                self.grad_in[key] = dx
            self.rec.input_grad_done(key, self.weight_grads[key].stash_bytes)
            return
        with self.backward_context(a.mb, a.chunk) if self.backward_context is not None else nullcontext():
            torch.autograd.backward(y, grad_tensors=dy)
        if a.stage > first:
            self.grad_in[key] = self.stage_in.pop(key).grad
        self.rec.backward_done(key)

    def weight(self, a: Action) -> None:
        """W: the weight gradient of (mb, chunk), accumulated into .grad as the fused backward would."""
        key = (a.mb, a.chunk)
        if key not in self.weight_grads:
            raise RuntimeError(f"rank {self.g.rank}: {a} runs before its B")
        with self.backward_context(a.mb, a.chunk) if self.backward_context is not None else nullcontext():
            self.weight_grads.pop(key).run()
        self.rec.backward_done(key)

    def send(self, a: Action) -> None:
        key = (a.mb, a.chunk)
        t = (self.stage_out[key].detach() if a.what == "act" else self.grad_in.pop(key)).contiguous()
        phase = "forward" if a.what == "act" else "backward"
        with tracer.tag(f"pp.stage{a.stage}"):
            if self.blocking_sends:
                C.send(t, a.peer, self.g, phase=phase)
            else:
                self.pending_sends.append(C.isend(t, a.peer, self.g, phase=phase))

    def post_recv(self, a: Action | None) -> None:
        """Post the receive of recv action `a` now (an irecv into a fresh buffer), so that its data can arrive
        while this rank computes the actions before it. Posted in the list's order (`RECVS_AHEAD` at a time): two
        receives from one peer are matched in the order the sender sends them, as with blocking receives."""
        if a is None:
            return
        stage = a.stage + 1 if a.what == "grad" else a.stage
        buf = torch.empty(self.shape_of(a.mb, stage), dtype=self.dtype, device=self.device)
        phase = "forward" if a.what == "act" else "backward"
        with tracer.tag(f"pp.stage{a.stage}"):
            self.posted_recvs.append((a, C.irecv(buf, a.peer, self.g, phase=phase)))

    def recv(self, a: Action) -> None:
        if not self.posted_recvs or self.posted_recvs[0][0] != a:
            raise RuntimeError(f"rank {self.g.rank}: {a} was not the receive posted next")
        buf = self.posted_recvs.pop(0)[1].wait()
        if a.what == "act":
            self.stage_in[(a.mb, a.chunk)] = buf.requires_grad_()
        else:
            self.grad_out[(a.mb, a.chunk)] = buf

    def finish(self) -> list[float]:
        """Wait for the posted sends; check nothing was left behind; the losses in microbatch order (last stage)."""
        for work in self.pending_sends:
            work.wait()
        if self.stage_out or self.stage_in or self.grad_out or self.grad_in or self.weight_grads:
            raise RuntimeError(
                f"rank {self.g.rank}: the schedule left tensors behind (outputs {sorted(self.stage_out)}, inputs "
                f"{sorted(self.stage_in)}, gradients {sorted(self.grad_out)} / {sorted(self.grad_in)}, weight "
                f"gradients {sorted(self.weight_grads)}): some forward has no backward, W or send"
            )
        if not self.losses:
            return []
        # the microbatches whose loss this rank computed, in order (all m but under DualPipe, where each end rank
        # holds one copy's half); one device-to-host read a step
        return torch.stack([self.losses[i] for i in sorted(self.losses)]).tolist()
