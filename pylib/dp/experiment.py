"""One training run of the reference model under each data-parallel mode, and the single-device run it must equal.

    STAGES = ("ddp", "zero1", "zero2", "zero3")
    wrap(model, stage, group, ...)             # the mode's wrapper with a common training API
    train_data_parallel(cfg, stage, ...)       # inside a launched rank: steps, trace, memory, overlap
    train_reference(cfg, ...)                  # one process, the whole global batch, torch.optim.Adam

Rank r of the data-parallel group takes rows [r*b/d, (r+1)*b/d) of every global batch [b, s]. Its loss is the mean
over its rows; the mean of the d ranks' losses is the reference loss on the whole batch, and the average of their
gradients is the reference gradient. Tests, benchmarks and the book all call these, so they measure the same thing.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from pylib.plan.options import ZERO_STAGE_NAMES

from ..model import ModelConfig, build_model, random_tokens
from ..runtime import tracer
from ..runtime.collectives import resolve_group
from ..runtime.launch import current_device
from .buckets import DEFAULT_BUCKET_BYTES
from .ddp import DistributedDataParallel
from .fsdp import FullyShardedDataParallel
from .groups import GroupFor
from .memory import HeldBytes
from .overlap import overlap_from_trace
from .zero import ZeroDataParallel

STAGES = ZERO_STAGE_NAMES  # ("ddp", "zero1", "zero2", "zero3"): the one ZeRO vocabulary, pylib.plan.options


class DDPTrainer:
    """DDP plus an ordinary optimizer on the full parameters, behind the same API as the ZeRO wrappers."""

    def __init__(self, ddp: DistributedDataParallel, optimizer: torch.optim.Optimizer):
        self.ddp, self.optimizer, self.module = ddp, optimizer, ddp.module

    def finish_gradient_sync(self) -> None:
        self.ddp.finish_gradient_sync()

    def no_sync(self):
        """Backward passes inside only accumulate (as `ZeroDataParallel.no_sync`)."""
        return self.ddp.no_sync()

    def step(self) -> None:
        with tracer.phase("optimizer"):
            self.optimizer.step()

    def zero_grad(self) -> None:
        self.ddp.zero_grad(set_to_none=True)

    @property
    def layouts(self):
        return self.ddp.layouts

    def gradient_shards(self) -> dict[str, torch.Tensor]:
        """Bucket key -> the whole averaged bucket (DDP shards nothing)."""
        return {b.layout.key: b.grad for b in self.ddp.buckets.buckets}

    def parameter_shards(self) -> dict[str, torch.Tensor]:
        """Bucket key -> the bucket's parameters laid out flat (a copy: DDP keeps parameters as they are)."""
        out = {}
        for b in self.ddp.buckets.buckets:
            out[b.layout.key] = torch.cat([p.detach().reshape(-1) for p in b.params])
        return out

    def overlap(self):
        return self.ddp.overlap()

    @property
    def tag_prefix(self) -> str:
        return self.ddp.tag_prefix

    def memory(self) -> HeldBytes:
        return self.ddp.memory(self.optimizer)


def wrap(
    module: nn.Module,
    stage: str,
    group=None,
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    group_for: GroupFor | None = None,
    units: list[str] | None = None,
    gradient_divide_factor: int | float | None = None,
    optimizer=torch.optim.Adam,
    **optim_kwargs,
):
    """`module` under data-parallel `stage` ("ddp", "zero1", "zero2", "zero3"), with its optimizer.

    Every returned object has finish_gradient_sync(), step(), zero_grad(), memory(), layouts, gradient_shards(),
    parameter_shards() and .module; the model's own forward (or `module.loss`) runs unchanged."""
    if stage == "ddp":
        ddp = DistributedDataParallel(
            module, group, bucket_bytes=bucket_bytes, group_for=group_for, gradient_divide_factor=gradient_divide_factor
        )
        return DDPTrainer(ddp, optimizer(module.parameters(), **optim_kwargs))
    if stage in ("zero1", "zero2"):
        return ZeroDataParallel(
            module,
            int(stage[-1]),
            group,
            bucket_bytes=bucket_bytes,
            group_for=group_for,
            gradient_divide_factor=gradient_divide_factor,
            optimizer=optimizer,
            **optim_kwargs,
        )
    if stage == "zero3":
        return FullyShardedDataParallel(
            module,
            group,
            units=units,
            group_for=group_for,
            gradient_divide_factor=gradient_divide_factor,
            optimizer=optimizer,
            **optim_kwargs,
        )
    raise ValueError(f"stage={stage!r} must be one of {STAGES}")


def micro_batch(ids: torch.Tensor, index: int, parts: int) -> torch.Tensor:
    """Rows [index*b/parts, (index+1)*b/parts) of a global batch [b, s]."""
    if ids.shape[0] % parts:
        raise ValueError(f"dp={parts} does not divide the global batch size {ids.shape[0]}")
    return ids.chunk(parts, dim=0)[index]


def train_data_parallel(
    cfg: ModelConfig,
    stage: str,
    *,
    group=None,
    global_batch: int = 8,
    seq: int = 8,
    steps: int = 1,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    units: list[str] | None = None,
    data_seed: int = 0,
    lr: float = 1e-2,
    keep_events: bool = True,
) -> dict:
    """Inside a launched rank: `steps` Adam steps of the reference model under `stage`, this rank on its slice.

    Returns losses (this rank's, per step), grad_shards (what this rank holds of the averaged gradient after step
    0, by layout key), param_shards (what it holds of the parameters after the last step; `params`, the module's
    named parameters, too, except at ZeRO-3 where the module holds none), layouts, events (traced ops of each
    step, as dicts), memory (HeldBytes after step 0's optimizer step, as a dict), overlap (step 0's OverlapReport
    from the trace, for the bucketed stages), unit_bytes and timeline (ZeRO-3: full bytes of each unit, and the
    resident parameter bytes after each gather and free of step 0, `FullyShardedDataParallel.timeline`), times
    (forward+backward, gradient sync wait, optimizer step, per step). The model and the batches live on the
    rank's device (`current_device()`: its GPU under NCCL); the returned tensors come back to the CPU."""
    g = resolve_group(group)
    device = current_device()
    model = build_model(cfg).to(device)
    dp = wrap(model, stage, g, bucket_bytes=bucket_bytes, units=units, lr=lr)
    out = dict(stage=stage, d=g.size, rank=g.rank, losses=[], events=[], times=[])
    for step in range(steps):
        ids, targets = random_tokens(cfg, global_batch, seq, seed=data_seed + step)
        ids, targets = (micro_batch(t, g.rank, g.size).to(device) for t in (ids, targets))
        with tracer.trace() as tr:
            t0 = tracer.now()
            loss = model.loss(ids, targets)
            t_backward = tracer.now()
            loss.backward()
            t1 = tracer.now()
            dp.finish_gradient_sync()
            t2 = tracer.now()
            if step == 0:
                out["grad_shards"] = {k: v.detach().clone() for k, v in dp.gradient_shards().items()}
            dp.step()
            t3 = tracer.now()
            if step == 0:
                out["memory"] = dp.memory().as_dict()
                if stage != "zero3":  # from the trace: async records keep launch and completion times
                    end = dp.overlap().backward_end
                    out["overlap"] = overlap_from_trace(tr.events, end, backward_start=t_backward, tag=stage)
                else:
                    out["unit_bytes"] = dp.unit_bytes()
                    out["timeline"] = list(dp.timeline)  # resident parameter bytes through step 0
            dp.zero_grad()
        out["losses"].append(loss.item())
        out["times"].append(dict(forward_backward=t1 - t0, sync_wait=t2 - t1, step=t3 - t2, total=t3 - t0))
        if keep_events:
            out["events"].append([e.as_dict() for e in tr.events])
    out["param_shards"] = {k: v.detach().clone() for k, v in dp.parameter_shards().items()}
    if stage != "zero3":  # the module itself holds every parameter
        out["params"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    out["layouts"] = dp.layouts
    return out


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
