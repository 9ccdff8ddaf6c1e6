"""The options of a composed run, one type, and their vocabularies, stated once.

    RunOptions(sequence_parallel=True, cp_kind="ring", cp_layout="zigzag", schedule="1f1b", n_microbatches=1, v=1,
               zero_stage=ZeroStage.DDP, recompute=Recompute("none", "uniform", 1))

`pylib.compose` runs with these options, `pylib.plan.problems` checks them, `pylib.analysis` predicts what a run
with them holds and moves, and the planner enumerates them. A field's default is the default everywhere.

ZeRO stages: one type, `ZeroStage`, an int enum (0 = DDP, 1, 2, 3 = ZeRO-1, -2, -3), and one parameter name,
`zero_stage`, everywhere in pylib; `zero_stage(x)` turns an int or a name ("ddp", "zero1", ..., the enum's `.key`)
into the enum. The recomputation choice is one value too, `pylib.plan.recompute.Recompute`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pylib.i18n import N_

from .fields import ONE_OF, choice, flag, instance, integer, number, refusal
from .recompute import RECOMPUTE, RECOMPUTE_METHODS, Recompute, as_recompute
from .schedules import ALL_SCHEDULES, SCHEDULES

# Sequence parallelism with TP on by default, as pylib.compose runs it: the activations outside the TP region are
# cut s/(cp tp) (Megatron-Core's `sequence_parallel` flag; it is off by default there, on in every large recipe).
SEQUENCE_PARALLEL = True
CP_KINDS = ("ring", "ulysses")  # the CP kinds a default planner search tries (`SearchSpace.cp_kinds`)
# every CP kind pylib builds and RunOptions accepts: all-gather CP (Llama 3's, `pylib.cp.allgather`) is priced when a
# SearchSpace names it (cp_kinds=ALL_CP_KINDS), left out of the default search so that its plans stay as they were
ALL_CP_KINDS = (*CP_KINDS, "allgather")
CP_LAYOUTS = ("contiguous", "zigzag")
CP_KIND = "ring"  # the default CP kind of RunOptions and of the CP mode's own functions, written once
CP_LAYOUT = "zigzag"  # the default token layout (causal load balance), likewise


class ZeroStage(enum.IntEnum):
    """How data parallelism keeps the model state: DDP replicates it, ZeRO-1 shards the optimizer state, ZeRO-2
    also the gradients, ZeRO-3 also the parameters."""

    DDP = 0
    ZERO1 = 1
    ZERO2 = 2
    ZERO3 = 3

    @property
    def key(self) -> str:
        """The name `pylib.dp.wrap` and `pylib.analysis.dp` take: "ddp", "zero1", "zero2", "zero3"."""
        return "ddp" if self == ZeroStage.DDP else f"zero{int(self)}"

    @property
    def label(self) -> str:
        return "DDP" if self == ZeroStage.DDP else f"ZeRO-{int(self)}"


ZERO_STAGES = tuple(int(s) for s in ZeroStage)  # (0, 1, 2, 3)
ZERO_STAGE_NAMES = tuple(s.key for s in ZeroStage)  # ("ddp", "zero1", "zero2", "zero3")


def zero_stage(value: int | str) -> ZeroStage:
    """The stage named by an int (0..3) or a name ("ddp", "zero1", ...); raises naming both vocabularies."""
    if isinstance(value, str):
        if value in ZERO_STAGE_NAMES:
            return ZeroStage(ZERO_STAGE_NAMES.index(value))
    elif isinstance(value, int) and not isinstance(value, bool) and value in ZERO_STAGES:
        return ZeroStage(value)
    raise ValueError(refusal(None, "zero_stage", value, ONE_OF, choices=ZERO_STAGES + ZERO_STAGE_NAMES))


@dataclass(frozen=True)
class RunOptions:
    """How a composed run uses its mesh (the mesh itself is a `ParallelConfig`).

    sequence_parallel: cut the activations outside the TP region over tp (needs tp > 1 to change anything);
    cp_kind: "ring", "ulysses" or "allgather" context parallelism; cp_layout: "zigzag" (2 cp chunks, causal load
    balance) or "contiguous"; schedule: "gpipe", "1f1b", "interleaved" or a zero-bubble one of `ZERO_BUBBLE` ("zb-v"
    and "dualpipev" with v=2, the V placement); n_microbatches: m per step and
    data-parallel rank; v: chunks per pipeline rank (interleaved); zero_stage: `ZeroStage` (an int 0..3 is taken
    as one); recompute: a `Recompute` (granularity "none", "selective" or "full", method and num_layers for "full":
    Megatron's recompute_granularity, recompute_method, recompute_num_layers); a granularity string is taken as
    `Recompute(granularity)`. Each field is checked when the options are built (`pylib.plan.fields`: a bad value
    raises naming it); `pylib.plan.problems` checks them against the model and the mesh."""

    sequence_parallel: bool = SEQUENCE_PARALLEL
    cp_kind: str = CP_KIND
    cp_layout: str = CP_LAYOUT
    schedule: str = "1f1b"
    n_microbatches: int = 1
    v: int = 1
    zero_stage: ZeroStage = ZeroStage.DDP
    recompute: Recompute = Recompute()

    def __post_init__(self):
        # the planner builds and replaces these by the ten thousand: one cheap test of every field, the named
        # checks (`_check_each`) only when it fails
        if type(self.recompute) is not Recompute:
            object.__setattr__(self, "recompute", as_recompute(self.recompute))
        if type(self.zero_stage) is not ZeroStage:
            object.__setattr__(self, "zero_stage", zero_stage(self.zero_stage))
        m, v = self.n_microbatches, self.v
        if not (
            type(self.sequence_parallel) is bool
            and type(self.cp_kind) is str
            and self.cp_kind in ALL_CP_KINDS
            and type(self.cp_layout) is str
            and self.cp_layout in CP_LAYOUTS
            and type(self.schedule) is str
            and self.schedule in ALL_SCHEDULES
            and type(m) is int
            and m >= 1
            and type(v) is int
            and v >= 1
        ):
            self._check_each()

    def _check_each(self) -> None:
        flag("RunOptions", "sequence_parallel", self.sequence_parallel)
        choice("RunOptions", "cp_kind", self.cp_kind, ALL_CP_KINDS)
        choice("RunOptions", "cp_layout", self.cp_layout, CP_LAYOUTS)
        choice("RunOptions", "schedule", self.schedule, ALL_SCHEDULES)
        m = integer("RunOptions", "n_microbatches", self.n_microbatches)
        v = integer("RunOptions", "v", self.v)
        object.__setattr__(self, "n_microbatches", m)
        object.__setattr__(self, "v", v)


COMPUTE_DTYPES = ("bfloat16", "float16")
GRAD_REDUCE_DTYPES = ("bfloat16", "float16", "float32")
LOSS_SCALINGS = ("none", "static", "dynamic")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}


# FP8 GEMM recipes, by Megatron-Core's `--fp8-recipe` names: "delayed" (Transformer Engine's DelayedScaling: one
# scale per tensor from an amax history), "tensorwise" (Float8CurrentScaling: one scale per tensor from the tensor's own
# amax), "blockwise" (DeepSeek-V3 / TE's Float8BlockScaling: 1 x 128 tiles for activations and gradients, 128 x 128
# blocks for weights, fp32 scales) and "mxfp8" (OCP microscaling: 1 x 32 blocks along K, E8M0 power-of-two scales).
FP8_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")
# TE's Format: "e4m3" every FP8 tensor in E4M3, "hybrid" E4M3 forward and E5M2 for the gradients (backward)
FP8_FORMATS = ("e4m3", "hybrid")
FP8_DEFAULT_FORMAT = {"delayed": "hybrid", "tensorwise": "hybrid", "blockwise": "e4m3", "mxfp8": "e4m3"}  # TE 2.x
FP8_DEFAULT_BLOCK = {"blockwise": 128, "mxfp8": 32}
AMAX_COMPUTE_ALGOS = ("max", "most_recent")
MX_BLOCK = 32  # the OCP MX specification fixes the block: 32 elements share one E8M0 scale


@dataclass(frozen=True)
class Fp8Recipe:
    """How the GEMMs of the linear layers run in FP8 (torch-free: `pylib.model.fp8` runs it).

    recipe: one of FP8_RECIPES; fmt: "e4m3" or "hybrid" (None: the recipe's Transformer Engine default,
    FP8_DEFAULT_FORMAT); amax_history_len, amax_compute_algo ("max" over the window or "most_recent") and margin (the
    scale divided by 2**margin): TE's DelayedScaling fields, read by "delayed" only (TE's defaults are 1024, "max", 0;
    ours keeps 16 so that a 30-step run sees its history roll); block: the tile length of "blockwise" (128, DeepSeek-V3)
    and "mxfp8" (32, fixed by the MX specification); None takes the default. Checked when built; `shape_problems` says
    which GEMM operands a block does not divide.

    What else stays high precision or moves in FP8 (`pylib.tp.fp8`, `pylib.dp.fp8_gather`): first_last_layers_bf16
    keeps the linears of the first and the last Transformer layer in the compute dtype (Megatron's
    `--first-last-layers-bf16`; the LM head always is); input_gather all-gathers the sequence-parallel activation in
    FP8, quantized before the gather (per-tensor recipes only); param_gather all-gathers ZeRO-3's parameters in FP8,
    quantized per shard (Megatron's `--fp8-param-gather`; not MXFP8)."""

    recipe: str = "delayed"
    fmt: str | None = None
    amax_history_len: int = 16
    amax_compute_algo: str = "max"
    margin: int = 0
    block: int | None = None
    first_last_layers_bf16: bool = False
    input_gather: bool = False
    param_gather: bool = False

    def __post_init__(self):
        choice("Fp8Recipe", "recipe", self.recipe, FP8_RECIPES)
        if self.fmt is None:
            object.__setattr__(self, "fmt", FP8_DEFAULT_FORMAT[self.recipe])
        choice("Fp8Recipe", "fmt", self.fmt, FP8_FORMATS)
        object.__setattr__(self, "amax_history_len", integer("Fp8Recipe", "amax_history_len", self.amax_history_len))
        choice("Fp8Recipe", "amax_compute_algo", self.amax_compute_algo, AMAX_COMPUTE_ALGOS)
        object.__setattr__(self, "margin", integer("Fp8Recipe", "margin", self.margin, low=0))
        block = integer("Fp8Recipe", "block", self.block, none=True)
        if self.recipe in FP8_DEFAULT_BLOCK:
            block = FP8_DEFAULT_BLOCK[self.recipe] if block is None else block
            if self.recipe == "mxfp8" and block != MX_BLOCK:
                raise ValueError(refusal("Fp8Recipe", "block", block, MX_BLOCK_RULE, mx=MX_BLOCK))
        elif block is not None:
            raise ValueError(refusal("Fp8Recipe", "block", block, PER_TENSOR_BLOCK, recipe=self.recipe))
        object.__setattr__(self, "block", block)
        flag("Fp8Recipe", "first_last_layers_bf16", self.first_last_layers_bf16)
        flag("Fp8Recipe", "input_gather", self.input_gather)
        flag("Fp8Recipe", "param_gather", self.param_gather)
        if self.input_gather and block is not None:
            # the wgrad operand X^T is tiled along the tokens: a rank would gather a row-wise and a column-wise copy
            rule = BLOCK_GATHER
            raise ValueError(refusal("Fp8Recipe", "input_gather", True, rule, recipe=self.recipe, **_two(block)))
        if self.param_gather and self.recipe == "mxfp8":
            raise ValueError(refusal("Fp8Recipe", "param_gather", True, MX_PARAM_GATHER, **_two(block)))

    @property
    def per_tensor(self) -> bool:
        """One scale per tensor ("delayed", "tensorwise"), against one per tile or block."""
        return self.block is None

    @property
    def grad_format(self) -> str:
        """The FP8 format of the gradients: "e5m2" under "hybrid", else "e4m3"."""
        return "e5m2" if self.fmt == "hybrid" else "e4m3"

    def shape_problems(self, out_features: int, in_features: int, tokens: int | None = None) -> list[str]:
        """Why this recipe cannot run a linear layer [out_features, in_features] on `tokens` rows: a block must divide
        K of each GEMM that reads the operand (in_features for the forward, out_features for dgrad, tokens for
        wgrad) and, for blockwise weights, both sides of the 128 x 128 blocks. Empty when it can."""
        if self.block is None:
            return []
        sizes = {"in_features": in_features, "out_features": out_features}
        if tokens is not None:
            sizes["tokens"] = tokens
        return [
            refusal("Fp8Recipe", name, size, BLOCK_DIVIDES, block=self.block, recipe=self.recipe)
            for name, size in sizes.items()
            if size % self.block
        ]


def _two(block: int) -> dict:
    """The bytes per element of two FP8 copies with an fp32 (or, for 32, E8M0) scale per `block` elements each."""
    scale = 1 if block == MX_BLOCK else 4
    return dict(block=block, copies=f"{2 * (1 + scale / block):g}")


BLOCK_GATHER = N_(
    "needs one scale per tensor: under {recipe!r} the wgrad operand X^T is tiled along the tokens, so a rank would "
    "gather a row-wise and a column-wise FP8 copy with a scale per {block}, {copies} bytes per element, more than "
    "bf16's 2"
)
MX_PARAM_GATHER = N_(
    "is not for mxfp8: its row-wise and column-wise copies of W hold different bits, so the gather would move "
    "{copies} bytes per element, more than bf16's 2"
)
MX_BLOCK_RULE = N_("must be {mx}: the MX specification shares one E8M0 scale among {mx} elements")
PER_TENSOR_BLOCK = N_("must be None: the {recipe!r} recipe keeps one scale per tensor, no blocks")
BLOCK_DIVIDES = N_("is not a multiple of the {recipe} block {block}: each GEMM operand is cut into blocks along it")


@dataclass(frozen=True)
class MixedPrecision:
    """A mixed-precision recipe, by dtype name (torch-free: `pylib.dp.mixed` turns it into torch dtypes).

    compute: the dtype the model's parameters, activations and autograd gradients are in ("bfloat16", "float16");
    master: the dtype of the master weights and of the optimizer state ("float32"); grad_reduce: the dtype the
    data-parallel reduction runs in and the gradient buffers are kept in ("bfloat16" = compute, as Megatron's
    default; "float32" = Megatron's `grad_reduce_in_fp32` / `accumulate_allreduce_grads_in_fp32`);
    loss_scaling: "none" (bf16 has fp32's exponent range), "static" (multiply the loss by `loss_scale`) or
    "dynamic" (start at `loss_scale`, halve it and skip the step when a gradient is inf/nan, double it after
    `growth_interval` clean steps), as fp16 needs; fp8: an `Fp8Recipe` runs the linear layers' GEMMs in FP8
    (`pylib.dp.mixed.cast_module` swaps them), None keeps them in `compute`. Each field is checked when the recipe
    is built (`pylib.plan.fields`), so a refused recipe never reaches a model."""

    compute: str = "bfloat16"
    master: str = "float32"
    grad_reduce: str = "float32"
    loss_scaling: str = "none"
    loss_scale: float = 2.0**16
    growth_interval: int = 1000
    fp8: Fp8Recipe | None = None  # the linear layers' GEMMs in FP8 (`pylib.model.fp8`); None: all in `compute`

    def __post_init__(self):
        choice("MixedPrecision", "compute", self.compute, COMPUTE_DTYPES)
        choice("MixedPrecision", "master", self.master, ("float32",))  # the master weights and optimizer state
        choice("MixedPrecision", "grad_reduce", self.grad_reduce, tuple(dict.fromkeys((self.compute, "float32"))))
        choice("MixedPrecision", "loss_scaling", self.loss_scaling, LOSS_SCALINGS)
        number("MixedPrecision", "loss_scale", self.loss_scale, above=0)
        bad = loss_scale_problems(self)
        if bad:
            raise ValueError(bad[0])
        object.__setattr__(self, "growth_interval", integer("MixedPrecision", "growth_interval", self.growth_interval))
        instance("MixedPrecision", "fp8", self.fp8, Fp8Recipe, none=True)

    @property
    def compute_bytes(self) -> int:
        return DTYPE_BYTES[self.compute]

    @property
    def grad_bytes(self) -> int:
        return DTYPE_BYTES[self.grad_reduce]

    @property
    def master_bytes(self) -> int:
        return DTYPE_BYTES[self.master]


# The loss scale's working range. Below 1 a scale shrinks the gradients toward fp16's underflow, the opposite of its
# purpose (Megatron's min_loss_scale is 1); above 2**64 it makes every gradient above 2**-48 an fp16 inf (fp16's
# largest value is 65504 < 2**16). A dynamic scale that starts at the top is halved to 1 in 64 skipped steps, so
# 64 consecutive skips mean no scale works: `pylib.dp.mixed.LossScaler` raises there.
MIN_LOSS_SCALE, MAX_LOSS_SCALE = 1.0, 2.0**64
MAX_CONSECUTIVE_SKIPS = 64


def loss_scale_problems(recipe: MixedPrecision) -> list[str]:
    """The rule a finite, positive loss scale must also meet to work at all: between MIN_LOSS_SCALE and
    MAX_LOSS_SCALE when the recipe scales the loss; `MixedPrecision` refuses a recipe that breaks it when built. A
    recipe broken here would train on zeros (a scale that underflows them) or skip every step (a scale that overflows
    every gradient) while its losses look normal."""
    scale, scaling = recipe.loss_scale, recipe.loss_scaling
    if scaling in ("static", "dynamic") and not MIN_LOSS_SCALE <= scale <= MAX_LOSS_SCALE:
        return [refusal("MixedPrecision", "loss_scale", scale, LOSS_SCALE_RANGE, low=MIN_LOSS_SCALE, scaling=scaling)]
    return []


LOSS_SCALE_RANGE = N_(
    "must be between {low:g} and 2**64 with loss_scaling={scaling!r}: below 1 it pushes the gradients toward "
    "fp16's underflow, above 2**64 it overflows every gradient above 2**-48"
)


__all__ = [
    "AMAX_COMPUTE_ALGOS",
    "COMPUTE_DTYPES",
    "FP8_DEFAULT_BLOCK",
    "FP8_DEFAULT_FORMAT",
    "FP8_FORMATS",
    "FP8_RECIPES",
    "Fp8Recipe",
    "MX_BLOCK",
    "MAX_CONSECUTIVE_SKIPS",
    "MAX_LOSS_SCALE",
    "MIN_LOSS_SCALE",
    "loss_scale_problems",
    "DTYPE_BYTES",
    "GRAD_REDUCE_DTYPES",
    "LOSS_SCALINGS",
    "MixedPrecision",
    "ALL_CP_KINDS",
    "CP_KINDS",
    "CP_LAYOUTS",
    "RECOMPUTE",
    "RECOMPUTE_METHODS",
    "Recompute",
    "SCHEDULES",
    "SEQUENCE_PARALLEL",
    "ZERO_STAGES",
    "ZERO_STAGE_NAMES",
    "RunOptions",
    "ZeroStage",
    "zero_stage",
]
