"""ZeRO stages 1 and 2: shard the optimizer state (and, at stage 2, the gradients) over the data-parallel group.

Plain DDP keeps d identical copies of everything. With Adam the optimizer state is the largest part (two moments
per parameter; with mixed precision also an fp32 master copy), yet each rank could update just 1/d of the
parameters and share the result. So:

    backward   each bucket's gradient is reduce-scattered (not all-reduced): rank r receives the average of
               slice r only -- the only slice its optimizer needs.                        (d-1)/d * Psi bytes
    step       rank r runs Adam on slice r of every bucket (state exists for that slice only), then every bucket
               is all-gathered so each rank has all the updated parameters again.         (d-1)/d * Psi bytes

Reduce-scatter + all-gather is exactly what a ring all-reduce does internally, so the traffic equals DDP's
2(d-1)/d * Psi (ZeRO paper, section 7). Stage 1 keeps the full gradient buffer (its own slice overwritten with the
average); stage 2 frees each bucket once its reduce-scatter completes and keeps only the [padded/d] slice.

Layout: the parameters of each bucket live in one flat buffer, padded to a multiple of d so the d slices are
equal; every module parameter is a view into it (so the all-gather after the step updates the module in place).
Rank r's optimizer sees one tensor per bucket, flat[r * n/d : (r + 1) * n/d]. Any elementwise optimizer works
(Adam, AdamW, SGD): each element's update depends only on that element, so slicing cannot change the result.

    zero = ZeroDataParallel(model, zero_stage=2, group=mesh["dp-cp"], bucket_bytes=2**20, lr=1e-3)
    loss = model.loss(ids_mine, targets_mine); loss.backward()
    zero.finish_gradient_sync(); zero.step(); zero.zero_grad()
"""

from __future__ import annotations

import torch
import torch.nn as nn

from pylib.plan.fields import instance
from pylib.plan.options import MixedPrecision, ZeroStage
from pylib.plan.options import zero_stage as as_zero_stage

from ..runtime import collectives as C
from ..runtime import tracer
from ..runtime.sharding import ShardSpec
from .buckets import DEFAULT_BUCKET_BYTES, GradientBuckets
from .groups import GroupFor, check_divide_factor, split_by_group
from .layout import flatten, unflatten
from .memory import HeldBytes, optimizer_state_tensors, storage_bytes
from .mixed import MasterWeights, torch_dtype
from .overlap import OverlapReport


class ZeroDataParallel(nn.Module):
    """ZeRO-1 (`zero_stage=1`) or ZeRO-2 (`zero_stage=2`; a `ZeroStage`, its int or its name) over `group`
    (None = every rank) or per-parameter `group_for`.

    The wrapper owns the sharded optimizer: `optimizer(list_of_slices, **optim_kwargs)`, torch.optim.Adam unless
    another elementwise optimizer is given. After backward call `finish_gradient_sync()`, then `step()`.
    max_buckets_in_flight (stage 2): at most this many full buckets on the wire at once (DeepSpeed double-buffers,
    hence 2); None lets every bucket overlap backward and, on a slow network, be alive at once.
    gradient_divide_factor: None averages each gradient over its group; a number divides every group's sum by it.
    precision: a `MixedPrecision` recipe (the module already in its compute dtype: `pylib.dp.wrap` casts it), or
    None for one dtype throughout. With a recipe the gradient buckets are in its reduce dtype, and this rank's
    slices get fp32 master copies that the optimizer updates (`MasterWeights`: Megatron's distributed optimizer);
    after the step each slice is cast back and the 16-bit buckets all-gathered.
    """

    def __init__(
        self,
        module: nn.Module,
        zero_stage: ZeroStage,
        group=None,
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        group_for: GroupFor | None = None,
        max_buckets_in_flight: int | None = 2,
        gradient_divide_factor: int | float | None = None,
        optimizer=torch.optim.Adam,
        precision=None,
        **optim_kwargs,
    ):
        super().__init__()
        stage = as_zero_stage(zero_stage)  # raises naming the allowed values
        if stage not in (ZeroStage.ZERO1, ZeroStage.ZERO2):
            raise ValueError(
                f"ZeroDataParallel does stages 1 and 2, got zero_stage={int(stage)} "
                "(stage 0: DistributedDataParallel, stage 3: FullyShardedDataParallel)"
            )
        self.module, self.zero_stage = module, stage
        divide_by = check_divide_factor(gradient_divide_factor)
        self.tag_prefix = stage.key  # "zero1" or "zero2"
        self.param_sets = split_by_group(list(module.named_parameters()), group, group_for)
        self.buckets = GradientBuckets(
            self.param_sets,
            bucket_bytes=bucket_bytes,
            mode="reduce_scatter",
            keep_full_grad=stage == 1,
            tag_prefix=self.tag_prefix,
            max_in_flight=max_buckets_in_flight if stage == 2 else None,
            divide_by=divide_by,
            grad_dtype=None
            if precision is None
            else torch_dtype(instance("ZeroDataParallel", "precision", precision, MixedPrecision).grad_reduce),
        )
        self.flats: list[torch.Tensor] = []  # one padded parameter buffer per bucket
        self.shards: list[torch.Tensor] = []  # this rank's slice of each, what the optimizer updates
        with torch.no_grad():
            for b in self.buckets.buckets:
                flat = flatten(b.layout, b.params)
                for p, view in zip(b.params, unflatten(b.layout, flat).values()):
                    p.data = view  # the module now reads the buffer
                lo, hi = b.shard_range
                shard = flat[lo:hi]
                if precision is None:
                    shard.grad = b.held_grad
                self.flats.append(flat)
                self.shards.append(shard)
        self.weights: MasterWeights | None = None
        if precision is None:
            self.optimizer = optimizer(self.shards, **optim_kwargs)
        else:
            groups = [b.group for b in self.buckets.buckets]
            self.weights = MasterWeights(self.shards, precision, optimizer, groups, **optim_kwargs)
            self.optimizer = self.weights.optimizer

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward on: multiplied by the loss scale of the recipe (fp16), else itself."""
        return loss if self.weights is None else self.weights.scale_loss(loss)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # -------------------------------------------------------------------------------------------- training

    def finish_gradient_sync(self) -> None:
        """Block until every bucket's reduce-scatter is done: this rank's slices now hold the averaged gradient."""
        self.buckets.finish()

    def no_sync(self):
        """Gradient accumulation without communication (stage 1 only: stage 2 keeps no full gradient)."""
        return self.buckets.no_sync()

    def step(self) -> None:
        """Update this rank's slices, then all-gather every bucket so all ranks hold the new parameters
        (traced with phase "optimizer")."""
        self.buckets.finish()
        if self.weights is None:
            for b, shard in zip(self.buckets.buckets, self.shards):  # even if someone set them to None meanwhile
                shard.grad = b.held_grad
        with tracer.phase("optimizer"):
            if self.weights is None:
                self.optimizer.step()
            elif not self.weights.step([b.held_grad for b in self.buckets.buckets]):
                return  # overflow on some rank: every rank skips, the parameters are unchanged
            with torch.no_grad():
                for b, flat, shard in zip(self.buckets.buckets, self.flats, self.shards):
                    full = C.all_gather_tensor(shard, 0, b.group, tag=f"{self.tag_prefix}.{b.layout.key}")
                    if full is not shard:
                        flat.copy_(full)

    def zero_grad(self) -> None:
        self.buckets.zero_grad()
        for p in self.module.parameters():
            p.grad = None

    # -------------------------------------------------------------------------------------------- reports

    @property
    def layouts(self):
        return self.buckets.layouts

    def gradient_shards(self) -> dict[str, torch.Tensor]:
        """Bucket key -> this rank's slice of the averaged gradient [padded/d]."""
        return {b.layout.key: b.held_grad for b in self.buckets.buckets}

    def parameter_shards(self) -> dict[str, torch.Tensor]:
        """Bucket key -> this rank's slice of the parameters [padded/d]."""
        return {b.layout.key: s for b, s in zip(self.buckets.buckets, self.shards)}

    def overlap(self) -> OverlapReport:
        return self.buckets.overlap()

    def memory(self) -> HeldBytes:
        params = storage_bytes(list(self.module.parameters()) + self.flats)
        grads = self.buckets.grad_bytes_held()
        state = optimizer_state_tensors(self.optimizer) if self.weights is None else self.weights.state_tensors()
        optim = storage_bytes(state)
        return HeldBytes(params, grads, optim, params, max(grads, self.buckets.peak_grad_bytes))

    def shard_specs(self) -> list[ShardSpec]:
        """Parameters replicated over their group; optimizer state (and at stage 2 the gradient) of each bucket
        split into equal slices of its padded flat buffer."""
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
                        "parameter: every rank holds it",
                    )
                )
        for b in self.buckets.buckets:
            lay = b.layout
            what = "optimizer state" if self.zero_stage == 1 else "optimizer state and gradient"
            out.append(
                ShardSpec(
                    f"{lay.key} (flat)",
                    lay.axis,
                    0,
                    "zero",
                    (lay.padded_numel,),
                    (lay.shard_numel,),
                    f"{what}: slice {b.group.rank} of {lay.parts}, {lay.padding} padding elements",
                )
            )
        return out
