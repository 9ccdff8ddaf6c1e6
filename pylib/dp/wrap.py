"""Any data-parallel stage behind one training API.

    STAGES = ("ddp", "zero1", "zero2", "zero3")
    wrap(model, zero_stage, group, ...)        # the stage's wrapper: finish_gradient_sync, step, zero_grad, memory
                                               # (zero_stage: a ZeroStage, its int 0..3 or its name "zero1", ...)

Rank r of the data-parallel group takes rows [r*b/d, (r+1)*b/d) of every global batch [b, s]
(`pylib.dp.batch.micro_batch`). Its loss is the mean over its rows; the mean of the d ranks' losses is the reference
loss on the whole batch, and the average of their gradients is the reference gradient. `pylib.compose` and
`pylib.experiments.dp_training` both train through these.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from pylib.plan.fields import instance, integer
from pylib.plan.options import ZERO_STAGE_NAMES, MixedPrecision, ZeroStage
from pylib.plan.options import zero_stage as as_zero_stage

from ..runtime import tracer
from .buckets import DEFAULT_BUCKET_BYTES
from .ddp import DistributedDataParallel
from .fsdp import FullyShardedDataParallel
from .groups import GroupFor, check_divide_factor
from .memory import HeldBytes, storage_bytes
from .mixed import MasterWeights, cast_module, torch_dtype
from .zero import ZeroDataParallel

STAGES = ZERO_STAGE_NAMES  # ("ddp", "zero1", "zero2", "zero3"): the one ZeRO vocabulary, pylib.plan.options


class DDPTrainer:
    """DDP plus an ordinary optimizer on the full parameters, behind the same API as the ZeRO wrappers; or, with
    `weights` (mixed precision), the optimizer on fp32 master copies of every parameter, fed the reduced buckets."""

    def __init__(
        self, ddp: DistributedDataParallel, optimizer: torch.optim.Optimizer, weights: MasterWeights | None = None
    ):
        self.ddp, self.optimizer, self.module, self.weights = ddp, optimizer, ddp.module, weights

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward on: multiplied by the loss scale of the recipe (fp16), else itself."""
        return loss if self.weights is None else self.weights.scale_loss(loss)

    def _bucket_views(self) -> list[torch.Tensor]:
        return [b.grad_view(i) for b in self.ddp.buckets.buckets for i in range(len(b.params))]

    def finish_gradient_sync(self) -> None:
        self.ddp.finish_gradient_sync()

    def no_sync(self):
        """Backward passes inside only accumulate (as `ZeroDataParallel.no_sync`)."""
        return self.ddp.no_sync()

    def step(self) -> None:
        with tracer.phase("optimizer"):
            if self.weights is None:
                self.optimizer.step()
            else:
                self.weights.step(self._bucket_views())

    def zero_grad(self) -> None:
        # mixed precision: gradients are added into the buckets (p.grad of another dtype cannot view them)
        self.ddp.zero_grad(set_to_none=self.weights is None)

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
        if self.weights is None:
            return self.ddp.memory(self.optimizer)
        held = self.ddp.memory(None)
        held.optim = storage_bytes(self.weights.state_tensors())
        return held


def wrap(
    module: nn.Module,
    zero_stage: ZeroStage,
    group=None,
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    group_for: GroupFor | None = None,
    units: list[str] | None = None,
    gradient_divide_factor: int | float | None = None,
    optimizer=torch.optim.Adam,
    precision=None,
    replicate=None,
    **optim_kwargs,
):
    """`module` under data-parallel `zero_stage` (a `ZeroStage`, or its int 0..3 or name "ddp", "zero1", "zero2",
    "zero3", converted here), with its optimizer.

    Every returned object has finish_gradient_sync(), step(), zero_grad(), memory(), scale_loss(), layouts,
    gradient_shards(), parameter_shards() and .module; the model's own forward (or `module.loss`) runs unchanged.
    precision: a `pylib.plan.options.MixedPrecision` recipe -- the module is cast to its compute dtype here, the
    gradients reduced in its reduce dtype, the optimizer run on fp32 masters (`pylib.dp.mixed`); None: one dtype.
    Call backward on `trainer.scale_loss(loss)` (the loss times the fp16 loss scale; the loss itself otherwise).
    replicate: with ZeRO-3, HSDP's replica group (`group` is then the shard group; `hybrid_groups`)."""
    # every argument checked before the module is touched: a refusal leaves it as it was
    stage = as_zero_stage(zero_stage)  # raises naming the allowed values
    instance("wrap", "module", module, nn.Module)
    instance("wrap", "precision", precision, MixedPrecision, none=True)
    check_divide_factor(gradient_divide_factor)
    integer("wrap", "bucket_bytes", bucket_bytes)
    if replicate is not None and stage != ZeroStage.ZERO3:
        raise ValueError(f"replicate= (HSDP) shards the parameters over `group`: needs zero_stage 3, got {stage.key}")
    if precision is not None and precision.fp8 is not None and precision.fp8.param_gather and stage != ZeroStage.ZERO3:
        raise ValueError(
            f"Fp8Recipe(param_gather=True) all-gathers ZeRO-3's parameter shards in FP8: needs zero_stage 3, got "
            f"{stage.key} (whose ranks hold every parameter and gather none before a forward)"
        )
    if precision is not None:
        cast_module(module, precision)
    if stage == ZeroStage.DDP:
        ddp = DistributedDataParallel(
            module,
            group,
            bucket_bytes=bucket_bytes,
            group_for=group_for,
            gradient_divide_factor=gradient_divide_factor,
            grad_dtype=None if precision is None else torch_dtype(precision.grad_reduce),
        )
        if precision is None:
            return DDPTrainer(ddp, optimizer(module.parameters(), **optim_kwargs))
        params = [p for b in ddp.buckets.buckets for p in b.params]
        weights = MasterWeights(params, precision, optimizer, (), **optim_kwargs)
        return DDPTrainer(ddp, weights.optimizer, weights)
    if stage in (ZeroStage.ZERO1, ZeroStage.ZERO2):
        return ZeroDataParallel(
            module,
            stage,
            group,
            bucket_bytes=bucket_bytes,
            group_for=group_for,
            gradient_divide_factor=gradient_divide_factor,
            optimizer=optimizer,
            precision=precision,
            **optim_kwargs,
        )
    assert stage == ZeroStage.ZERO3
    return FullyShardedDataParallel(
        module,
        group,
        units=units,
        group_for=group_for,
        gradient_divide_factor=gradient_divide_factor,
        optimizer=optimizer,
        precision=precision,
        replicate=replicate,
        **optim_kwargs,
    )
