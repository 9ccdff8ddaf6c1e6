"""Data parallelism: bucketed DDP whose all-reduces overlap backward, and ZeRO stages 1, 2 and 3.

    DistributedDataParallel(module, group=None, *, bucket_bytes=..., group_for=None, gradient_divide_factor=None)
    ZeroDataParallel(module, zero_stage=1|2, group=None, *, bucket_bytes=..., group_for=None, optimizer=Adam, **kw)
    FullyShardedDataParallel(module, group=None, *, units=None, group_for=None, optimizer=Adam, **kw)   # ZeRO-3
    FullyShardedDataParallel(module, shard, replicate=replica, ...)   # HSDP: (shard, replica) = hybrid_groups(s)
    FullyShardedDataParallel(module, reshard_after_forward=None)   # FSDP2's default: the root unit kept for backward
    fsdp.set_reshard_after_forward(False, ["layers.3"])            # or unit by unit (one all-gather fewer each)
    wrap(module, zero_stage, group, ...)   # any of them behind one training API; zero_stage: a ZeroStage, 0..3
                                           # or "ddp" | "zero1" | "zero2" | "zero3"
    wrap(..., precision=MixedPrecision("bfloat16", grad_reduce="float32"))  # 16-bit compute, fp32 master + state
    wrap(..., "zero3", precision=MixedPrecision(fp8=Fp8Recipe("tensorwise", param_gather=True)))  # FP8 gather

`group` is the gradient-averaging group (Megatron's "dp-cp" when CP is on); `group_for(name, param)` overrides it
per parameter (expert parameters over "edp", with `gradient_divide_factor=` the dp x cp size, since an expert's
gradient already sums its EP group's tokens). Layouts of the flat buffers are data (`FlatLayout`), memory is
measured (`HeldBytes`, ZeRO-3's `timeline`), overlap of communication with backward is measured (`OverlapReport`).
"""

from .batch import micro_batch
from .buckets import DEFAULT_BUCKET_BYTES, Bucket, GradientBuckets
from .ddp import DistributedDataParallel
from .fsdp import FullyShardedDataParallel, default_units
from .groups import hybrid_groups, split_by_group
from .layout import (
    FlatEntry,
    FlatLayout,
    assemble,
    flatten,
    join_shards,
    layout_table,
    padded_numel,
    plan_buckets,
    single_flat,
    unflatten,
)
from .memory import HeldBytes, optimizer_state_tensors, storage_bytes
from .mixed import LossScaleError, LossScaler, MasterWeights, SingleDeviceMixed, ZeroGradientsWarning, cast_module
from .overlap import BucketTiming, OverlapReport, overlap_from_trace
from .wrap import STAGES, DDPTrainer, wrap
from .zero import ZeroDataParallel

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "STAGES",
    "SingleDeviceMixed",
    "Bucket",
    "BucketTiming",
    "DDPTrainer",
    "DistributedDataParallel",
    "FlatEntry",
    "FlatLayout",
    "FullyShardedDataParallel",
    "GradientBuckets",
    "HeldBytes",
    "LossScaleError",
    "LossScaler",
    "ZeroGradientsWarning",
    "MasterWeights",
    "OverlapReport",
    "ZeroDataParallel",
    "assemble",
    "cast_module",
    "default_units",
    "flatten",
    "hybrid_groups",
    "join_shards",
    "layout_table",
    "micro_batch",
    "optimizer_state_tensors",
    "overlap_from_trace",
    "padded_numel",
    "plan_buckets",
    "single_flat",
    "split_by_group",
    "storage_bytes",
    "unflatten",
    "wrap",
]
