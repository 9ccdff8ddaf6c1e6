"""Run one rank's part of a pipeline schedule: its action list, over point-to-point ops on the pp group.

    sched = build("1f1b", p, m)                                   # pure; the same lists on every rank
    run = run_pipeline(sched, my_chunks, group=mesh.pp, inputs=ids_mbs, targets=tgt_mbs, act_shape=(b, s, h))
    run.losses, run.timeline                                       # per-microbatch losses (last stage), events

The executor is generic over the stage modules: `chunks[c]` is any nn.Module for this rank's chunk c (virtual
stage c·p + rank). The first virtual stage is called as `chunk(inputs[mb])`; the last returns the microbatch's
loss, called as `chunk(x, targets[mb])` (or `loss_fn(chunk(x), targets[mb])` when a loss_fn is given); every
other stage as `chunk(x)` with x the activation received from the previous stage. The activation entering stage
k for microbatch mb has shape `act_shape(mb, k)` (a tuple means the same shape everywhere); its gradient, sent
back, has the same shape. A stage with tensor or context parallelism inside has local shapes that differ from the
full [b, s, h] -- it passes its own function.

Loss scaling. Each microbatch's loss is a mean over its own tokens; the full batch's loss is the mean of the m
microbatch losses, so each is divided by m before its backward (`scale_loss=True`, as Megatron does). The
parameter gradients, summed over microbatches by autograd, then equal the full-batch gradient. Without the
division they are m times too large. (torch.distributed.pipelining keeps the loss unscaled and divides the
gradients by m after the last backward instead: `scale_grads=True`; same result.)

Sends. By default a send is posted (`isend`) and the rank moves on; every send is waited for at the end of the
step. `blocking_sends=True` uses gloo's blocking `send` instead, which waits for the receiver (a rendezvous):
the schedule's order is deadlock-free under both (see `pylib.pp.schedules`), but blocking sends add stalls to the
interleaved schedule when a forward and a backward cost different times (`pylib.pp.simulate` shows where).

Timing. Every forward, backward, send and receive is recorded as an `Event` with start and end in seconds since
a common start (the ranks meet in a one-element all-reduce first). A receive's interval includes the time spent
waiting for the sender; a posted send's interval is just the posting (a blocking send's includes its wait).
`compute_delay=(t_f, t_b)` pads each forward of one chunk to at least t_f seconds and each backward to t_b
(sleeping after the real compute): a measurement aid that makes every compute cost a known, noise-free amount, so
the measured bubble can be compared with the formula on a busy 2-core machine; it changes nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..model.memory import saved_activations
from ..runtime import collectives as C
from ..runtime import tracer
from ..runtime.launch import current_device
from .schedules import Action, Schedule
from .timeline import Event


@dataclass
class PipelineRun:
    """What one rank saw in one step.

    losses: each microbatch's (unscaled) loss, on the rank holding the last stage; empty elsewhere.
    loss: their mean = the full-batch mean loss (None off the last stage).
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


def microbatches(t: torch.Tensor, m: int) -> list[torch.Tensor]:
    """Split a batch along dim 0 into m equal microbatches (raises if m does not divide the batch)."""
    if not isinstance(m, int) or m < 1:
        raise ValueError(f"the number of microbatches must be a positive integer, got {m!r}")
    if t.shape[0] % m:
        raise ValueError(f"m={m} microbatches do not divide the batch size b={t.shape[0]}")
    return list(t.chunk(m, dim=0))


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


def run_pipeline(
    schedule: Schedule,
    chunks: Sequence[nn.Module],
    *,
    group=None,
    inputs: Sequence[torch.Tensor] | None = None,
    targets: Sequence | None = None,
    act_shape: tuple | Callable[[int, int], tuple],
    act_dtype: torch.dtype | None = None,
    loss_fn: Callable | None = None,
    scale_loss: bool = True,
    blocking_sends: bool = False,
    compute_delay: tuple[float, float] | None = None,
    measure_memory: bool = True,
    backward_context: Callable[[int, int], AbstractContextManager] | None = None,
    device: torch.device | str | None = None,
) -> PipelineRun:
    """Run this rank's actions of `schedule` (one training step's forwards and backwards, no optimizer step).

    group: the pipeline AxisGroup (None = every rank); its size must be schedule.p and this rank's index in it
    picks the action list. chunks: this rank's v stage modules. inputs / targets: the m microbatches' inputs and
    targets (needed only on the ranks holding the first / the last virtual stage). Gradients accumulate into the
    chunks' parameters' .grad (zero them before the step).

    backward_context(mb, chunk), if given, returns a context manager each backward runs inside: how a data-parallel
    wrapper is told to only accumulate (`no_sync()`) in every backward of a chunk but its last, so its gradients
    are reduced once per step, after the last microbatch (as Megatron's schedules do with their no_sync_func).

    device: where received activations and gradients are allocated (`pipeline_device`; pass it when the chunks
    hold no parameters of their own, as under ZeRO-3)."""
    g = C.resolve_group(group)
    p, m, v = schedule.p, schedule.m, schedule.v
    if g.size != p:
        raise ValueError(f"the schedule is for p={p} ranks but the pipeline group has {g.size}")
    if len(chunks) != v:
        raise ValueError(f"the schedule runs v={v} chunks per rank but this rank holds {len(chunks)}")
    me = g.rank
    n_stages = p * v
    holds_first, holds_last = me == 0, me == (n_stages - 1) % p
    if holds_first and (inputs is None or len(inputs) != m):
        raise ValueError(f"rank {me} holds the first stage and needs m={m} microbatch inputs")
    if holds_last and (targets is None or len(targets) != m):
        raise ValueError(f"rank {me} holds the last stage and needs m={m} microbatch targets")
    shape_of = act_shape if callable(act_shape) else (lambda mb, stage: tuple(act_shape))
    dtype = act_dtype or _first_float_dtype(chunks)
    device = pipeline_device(chunks, device)
    excluded = [list(chunk.parameters()) for chunk in chunks]

    stage_in: dict[tuple[int, int], torch.Tensor] = {}  # (mb, chunk) -> received activation (requires grad)
    stage_out: dict[tuple[int, int], torch.Tensor] = {}  # (mb, chunk) -> output (the scaled loss on the last stage)
    grad_out: dict[tuple[int, int], torch.Tensor] = {}  # (mb, chunk) -> received gradient of the output
    grad_in: dict[tuple[int, int], torch.Tensor] = {}  # (mb, chunk) -> gradient of the input, to send back
    run = PipelineRun(rank=me)
    losses: dict[int, float] = {}
    pending_sends: list[C.P2PWork] = []
    live_bytes = 0
    live = 0

    # A common time origin: every rank leaves this all-reduce at about the same moment.
    C.all_reduce_(torch.zeros(1, device=device), g, phase="pp-sync")
    t0 = time.perf_counter()

    def record(a: Action, start: float) -> None:
        run.timeline.append(Event.of(me, a, start - t0, time.perf_counter() - t0))

    def pad(start: float, seconds: float) -> None:
        left = start + seconds - time.perf_counter()
        if left > 0:
            time.sleep(left)

    for a in schedule[me]:
        key = (a.mb, a.chunk)
        start = time.perf_counter()
        if a.op == "F":
            chunk = chunks[a.chunk]
            x = inputs[a.mb] if a.stage == 0 else stage_in[key]
            with saved_activations(exclude=excluded[a.chunk]) if measure_memory else nullcontext() as saved:
                if a.stage == n_stages - 1:
                    if loss_fn is None:
                        loss = chunk(x, targets[a.mb])
                    else:
                        loss = loss_fn(chunk(x), targets[a.mb])
                    if loss.dim() != 0:
                        raise ValueError(f"the last stage must return a scalar loss, got shape {tuple(loss.shape)}")
                    losses[a.mb] = float(loss.detach())
                    y = loss / m if scale_loss else loss
                else:
                    y = chunk(x)
            stage_out[key] = y
            run.activation_bytes[key] = saved.bytes if measure_memory else 0
            live_bytes += run.activation_bytes[key]
            live += 1
            run.peak_activation_bytes = max(run.peak_activation_bytes, live_bytes)
            run.peak_in_flight = max(run.peak_in_flight, live)
            if compute_delay:
                pad(start, compute_delay[0])
        elif a.op == "B":
            y = stage_out.pop(key)
            with backward_context(a.mb, a.chunk) if backward_context is not None else nullcontext():
                if a.stage == n_stages - 1:
                    torch.autograd.backward(y)
                else:
                    torch.autograd.backward(y, grad_tensors=grad_out.pop(key))
            if a.stage > 0:
                x = stage_in.pop(key)
                grad_in[key] = x.grad
            live_bytes -= run.activation_bytes[key]
            live -= 1
            if compute_delay:
                pad(start, compute_delay[1])
        elif a.op == "send":
            t = (stage_out[key].detach() if a.what == "act" else grad_in.pop(key)).contiguous()
            phase = "forward" if a.what == "act" else "backward"
            with tracer.tag(f"pp.stage{a.stage}"):
                if blocking_sends:
                    C.send(t, a.peer, g, phase=phase)
                else:
                    pending_sends.append(C.isend(t, a.peer, g, phase=phase))
        elif a.op == "recv":
            stage = a.stage + 1 if a.what == "grad" else a.stage
            buf = torch.empty(shape_of(a.mb, stage), dtype=dtype, device=device)
            phase = "forward" if a.what == "act" else "backward"
            with tracer.tag(f"pp.stage{a.stage}"):
                C.recv(buf, a.peer, g, phase=phase)
            if a.what == "act":
                stage_in[key] = buf.requires_grad_()
            else:
                grad_out[key] = buf
        else:
            raise ValueError(f"unknown action {a}")
        record(a, start)
    for work in pending_sends:
        work.wait()
    if stage_out or stage_in or grad_out or grad_in:
        raise RuntimeError(
            f"rank {me}: the schedule left tensors behind (outputs {sorted(stage_out)}, inputs {sorted(stage_in)}, "
            f"gradients {sorted(grad_out)} / {sorted(grad_in)}): some forward has no backward or send"
        )
    if holds_last:
        run.losses = [losses[i] for i in range(m)]
        run.loss = sum(run.losses) / m
    return run
