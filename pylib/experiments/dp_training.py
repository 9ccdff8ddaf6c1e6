"""One training run of the reference model under each data-parallel stage, and the single-device run it must equal.

    train_data_parallel(cfg, zero_stage, ...)  # inside a launched rank: steps, trace, memory, overlap
    train_reference(cfg, ...)                  # one process, the whole global batch, torch.optim.Adam

Rank r of the data-parallel group trains on `pylib.dp.micro_batch(batch, r, d)`; the mean of the d ranks' losses is
the reference loss and the average of their gradients the reference gradient. Tests, benchmarks and the book all
call these, so they measure the same thing.
"""

from __future__ import annotations

import torch

from pylib.dp import micro_batch, overlap_from_trace, wrap
from pylib.model import ModelConfig, build_model, random_tokens
from pylib.plan.options import ZeroStage
from pylib.plan.options import zero_stage as as_zero_stage
from pylib.runtime import clock, tracer
from pylib.runtime.collectives import resolve_group
from pylib.runtime.launch import current_device


def train_data_parallel(
    cfg: ModelConfig,
    zero_stage: ZeroStage,
    *,
    group=None,
    global_batch: int = 8,
    seq: int = 8,
    steps: int = 1,
    data_seed: int = 0,
    lr: float = 1e-2,
    keep_events: bool = True,
    **wrap_kw,
) -> dict:
    """Inside a launched rank: `steps` Adam steps of the reference model under `zero_stage` (a `ZeroStage`, its int
    0..3 or its name "ddp", "zero1", ...), this rank on its slice; wrap_kw: `pylib.dp.wrap`'s keywords
    (bucket_bytes, units, ...).

    Returns zero_stage (the `ZeroStage`), losses (this rank's, per step), grad_shards (what this rank holds of the
    averaged gradient after step 0, by layout key), param_shards (what it holds of the parameters after the last
    step; `params`, the module's named parameters, too, except at ZeRO-3 where the module holds none), layouts,
    events (traced ops of each step, as dicts), memory (HeldBytes after step 0's optimizer step, as a dict), overlap
    (step 0's OverlapReport from the trace, for the bucketed stages), unit_bytes and timeline (ZeRO-3: full bytes of
    each unit, and the resident parameter bytes after each gather and free of step 0,
    `FullyShardedDataParallel.timeline`), times (forward+backward, gradient sync wait, optimizer step, per step).
    The model and the batches live on the rank's device (`current_device()`: its GPU under NCCL); the returned
    tensors come back to the CPU."""
    stage = as_zero_stage(zero_stage)  # raises naming the allowed values
    g = resolve_group(group)
    device = current_device()
    model = build_model(cfg).to(device)
    dp = wrap(model, stage, g, lr=lr, **wrap_kw)
    out = dict(zero_stage=stage, d=g.size, rank=g.rank, losses=[], events=[], times=[])
    for step in range(steps):
        ids, targets = random_tokens(cfg, global_batch, seq, seed=data_seed + step)
        ids, targets = (micro_batch(t, g.rank, g.size).to(device) for t in (ids, targets))
        loss, tr, times = _timed_step(model, dp, ids, targets, out if step == 0 else None)
        out["losses"].append(loss.item())
        out["times"].append(times)
        if keep_events:
            out["events"].append([e.as_dict() for e in tr.events])
    out["param_shards"] = {k: v.detach().clone() for k, v in dp.parameter_shards().items()}
    if stage != ZeroStage.ZERO3:  # the module itself holds every parameter
        out["params"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    out["layouts"] = dp.layouts
    return out


def _timed_step(model, dp, ids, targets, first: dict | None):
    """One traced, timed training step: forward + backward, the gradient sync's wait, the optimizer step. `first`:
    the run's record, for step 0's measurements (gradient shards before the step, memory, overlap or the ZeRO-3
    timeline after it). Returns the loss, the trace and the times."""
    with tracer.trace() as tr:
        t0 = clock.device_now()
        loss = model.loss(ids, targets)
        t_backward = clock.device_now()
        loss.backward()
        t1 = clock.device_now()
        dp.finish_gradient_sync()
        t2 = clock.device_now()
        if first is not None:
            first["grad_shards"] = {k: v.detach().clone() for k, v in dp.gradient_shards().items()}
        dp.step()
        t3 = clock.device_now()
        if first is not None:
            _record_first_step(first, dp, tr, t_backward)
        dp.zero_grad()
    return loss, tr, dict(forward_backward=t1 - t0, sync_wait=t2 - t1, step=t3 - t2, total=t3 - t0)


def _record_first_step(out: dict, dp, tr, t_backward: float) -> None:
    """Step 0's memory after the optimizer step, and the overlap of communication with backward (the bucketed
    stages, from the trace: async records keep launch and completion times) or ZeRO-3's unit bytes and timeline."""
    stage = out["zero_stage"]
    out["memory"] = dp.memory().as_dict()
    if stage != ZeroStage.ZERO3:
        end = dp.overlap().backward_end
        out["overlap"] = overlap_from_trace(tr.events, end, backward_start=t_backward, tag=stage.key)
    else:
        out["unit_bytes"] = dp.unit_bytes()
        out["timeline"] = list(dp.timeline)  # resident parameter bytes through step 0


def train_reference(
    cfg: ModelConfig, *, global_batch: int = 8, seq: int = 8, steps: int = 1, data_seed: int = 0, lr: float = 1e-2
) -> dict:
    """The same steps on one device with the whole global batch and torch.optim.Adam.

    Returns losses (per step), grads (name -> gradient at step 0), params (name -> tensor after the last step)."""
    model = build_model(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    out = dict(losses=[])
    for step in range(steps):
        ids, targets = random_tokens(cfg, global_batch, seq, seed=data_seed + step)
        loss = model.loss(ids, targets)
        loss.backward()
        if step == 0:
            out["grads"] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        out["losses"].append(loss.item())
    out["params"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return out
