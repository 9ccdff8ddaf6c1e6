"""Distributed data parallel: every rank holds the whole model, runs its own micro-batch, and gradients are
averaged over the data-parallel group with bucketed all-reduces that overlap backward.

    ddp = DistributedDataParallel(model, group=mesh["dp-cp"], bucket_bytes=2**20)
    opt = torch.optim.Adam(model.parameters())        # an ordinary optimizer on the full parameters
    loss = model.loss(ids_mine, targets_mine)         # this rank's slice of the global batch [b/d, s]
    loss.backward()                                   # buckets all-reduce while backward runs
    ddp.finish_gradient_sync()                        # wait for the last ones: p.grad is now the average
    opt.step(); opt.zero_grad()

Why the average is right: the global loss is the mean over d equal micro-batches, L = (1/d) sum_r L_r, so
dL/dW = (1/d) sum_r dL_r/dW -- the average of the ranks' gradients. Each rank then takes the same optimizer step on
the same parameters and the replicas stay identical without ever exchanging weights.

Traffic per step and rank: one all-reduce of every gradient, 2(d-1)/d * Psi bytes for Psi parameter bytes
(`pylib.analysis.dp.traffic_per_step`). Memory per rank: parameters Psi, gradients Psi (the buckets; each p.grad
is a view into one), optimizer state K*Psi.

Composition: `group_for(name, param) -> group` sends a parameter's gradient to another group (expert parameters to
"edp", with `gradient_divide_factor` = the dp x cp size: see `pylib.dp.groups`); parameters already sharded by
another mode are just smaller tensors here.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..runtime.sharding import ShardSpec
from .buckets import DEFAULT_BUCKET_BYTES, GradientBuckets
from .groups import GroupFor, check_divide_factor, split_by_group
from .memory import HeldBytes, optimizer_state_tensors, storage_bytes
from .overlap import OverlapReport


class DistributedDataParallel(nn.Module):
    """Wrap `module` (its parameters identical on every rank of each reduction group) so that gradients are
    averaged over `group` (None = every rank), or over `group_for(name, param)` where that returns a group.

    Gradients are reduced in buckets of at most `bucket_bytes`, in reverse parameter order, each launched as an
    asynchronous all-reduce the moment its last gradient is ready; call `finish_gradient_sync()` after backward.
    Forward is the module's own (`ddp(x)` or `ddp.module.loss(...)` alike): DDP touches only gradients.
    gradient_divide_factor: None averages each gradient over its group; a number divides every group's sum by it.
    grad_dtype: the buckets' dtype, what the all-reduce runs in (None: the parameters'; mixed precision's reduce
    dtype, e.g. float32 under bfloat16 parameters: each p.grad is then added into the bucket and set to None).
    """

    tag_prefix = "ddp"

    def __init__(
        self,
        module: nn.Module,
        group=None,
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        group_for: GroupFor | None = None,
        gradient_divide_factor: int | float | None = None,
        grad_dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.module = module
        self._params = list(module.parameters())  # zero_grad's, walked once (parameters() walks the module tree)
        divide_by = check_divide_factor(gradient_divide_factor)
        self.param_sets = split_by_group(list(module.named_parameters()), group, group_for)
        self.buckets = GradientBuckets(
            self.param_sets,
            bucket_bytes=bucket_bytes,
            mode="all_reduce",
            tag_prefix=self.tag_prefix,
            divide_by=divide_by,
            grad_dtype=grad_dtype,
        )

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # -------------------------------------------------------------------------------------------- gradients

    def finish_gradient_sync(self) -> None:
        """Block until every bucket's all-reduce is done; afterwards each p.grad is the group average."""
        self.buckets.finish()

    def no_sync(self):
        """Context manager: backward passes inside only accumulate (gradient accumulation over micro-batches)."""
        return self.buckets.no_sync()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As `nn.Module.zero_grad`. The buckets keep their storage either way (the next backward writes into it)."""
        self.buckets.finish()
        if set_to_none:
            for p in self._params:
                p.grad = None
        else:
            self.buckets.zero_grad()

    # -------------------------------------------------------------------------------------------- reports

    @property
    def layouts(self):
        return self.buckets.layouts

    def overlap(self) -> OverlapReport:
        return self.buckets.overlap()

    def memory(self, optimizer: torch.optim.Optimizer | None = None) -> HeldBytes:
        """Bytes this rank holds: the module's parameters, the gradient buckets, `optimizer`'s state."""
        params = storage_bytes(self.module.parameters())
        grads = storage_bytes([b.grad for b in self.buckets.buckets] + [p.grad for p in self.module.parameters()])
        optim = storage_bytes(optimizer_state_tensors(optimizer))
        return HeldBytes(params, grads, optim, params, grads)

    def shard_specs(self) -> list[ShardSpec]:
        """Every parameter: replicated over its reduction group (the gradient is averaged over it)."""
        out = []
        for g, _, named in self.param_sets:
            for name, p in named:
                out.append(
                    ShardSpec(
                        name,
                        g.name,
                        None,
                        "replicated",
                        tuple(p.shape),
                        tuple(p.shape),
                        "gradient averaged by bucketed all-reduce",
                    )
                )
        return out
