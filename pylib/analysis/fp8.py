"""FP8 training on paper: the bytes a rank holds per parameter under each FP8 recipe and ZeRO stage.

FP8 changes the GEMMs, not the model state: the parameters stay in the compute dtype (bf16, c = 2 bytes), the
master weights and Adam's moments in fp32 (K = 12), the gradients in the reduce dtype (g = 2 or 4), as
`mixed_held_bytes` counts them. What FP8 adds, per linear weight W [N, K] that `pylib.model.fp8.Fp8Linear` runs, is
the FP8 copies its GEMMs read and their scales:

    delayed      W and W^T in FP8 (2 N K) + one fp32 scale (4) + 3 amax histories of L fp32 and 3 scales (3 (4 L + 4))
    tensorwise   W and W^T in FP8 (2 N K) + one fp32 scale (4)
    blockwise    W and W^T in FP8 (2 N K) + an fp32 scale per 128 x 128 block, for each (2 * 4 N K / 128^2)
    mxfp8        row-wise and column-wise W in FP8 (2 N K) + an E8M0 scale per 32 elements, for each (2 N K / 32)

Two copies each: a GEMM reads its operands K-major, and W is contracted along K in the forward and along N in dgrad
(Hopper's FP8 tensor cores take only the "TN" layout, so TE keeps W^T beside W; MXFP8 has row- and column-wise
scales, so even the bits differ). So about 2 bytes per FP8 parameter more: 18 + 2 with fp32 gradients, 16 + 2 with
bf16 ones, per parameter under DDP.

Under ZeRO-1 and -2 every rank still quantizes the full weights it computes with; under ZeRO-3 a rank holds a
unit's full weights only while the unit runs, and its FP8 copies with them (`Fp8Linear.cache_weights = False` frees
them after its backward), so `fp8_held_bytes` counts only the amax histories between units (the peak adds one
unit's copies, as `zero3_peak_param_bytes` does for the bf16 parameters).

The Ultra-Scale Playbook (its "FP8 pretraining" table) counts bytes per parameter differently: see `PLAYBOOK`.
"""

from __future__ import annotations

from fractions import Fraction

from pylib.i18n import N_
from pylib.plan.options import MixedPrecision, ZeroStage

from .dp import _exact, mixed_held_bytes

FP32 = 4


def fp8_weight_bytes(out_features: int, in_features: int, precision: MixedPrecision) -> int:
    """The bytes `Fp8Linear` holds for one weight [out_features, in_features] beside the parameter: its FP8 copies,
    their scales and (delayed) the amax histories with their scales (module docstring's table). 0 without FP8."""
    recipe = precision.fp8
    if recipe is None:
        return 0
    nk = out_features * in_features
    if recipe.recipe in ("delayed", "tensorwise"):
        return 2 * nk + FP32 + fp8_history_bytes(precision)
    t = recipe.block
    if recipe.recipe == "blockwise":
        return 2 * nk + 2 * FP32 * (out_features // t) * (in_features // t)
    return 2 * nk + 2 * nk // t  # mxfp8: one E8M0 byte per block of t


def fp8_history_bytes(precision: MixedPrecision) -> int:
    """Delayed scaling's state per layer: an amax history of L fp32 and an fp32 scale for each of the input, the
    weight and the output gradient. 0 for the other recipes (they keep no state between steps)."""
    recipe = precision.fp8
    if recipe is None or recipe.recipe != "delayed":
        return 0
    return 3 * (FP32 * recipe.amax_history_len + FP32)


def fp8_held_bytes(
    n_params: int,
    fp8_shapes: list[tuple[int, int]],
    d: int,
    zero_stage: ZeroStage,
    precision: MixedPrecision,
    *,
    padded_params: int | None = None,
) -> dict[str, int | float]:
    """`mixed_held_bytes` (params, grads, optim) plus "fp8": the FP8 copies and scales of the weights in `fp8_shapes`
    ([out, in] of each FP8 linear) one rank holds between steps: all of them for DDP and ZeRO-1/2; for ZeRO-3 only
    the amax histories (the copies live with the gathered unit)."""
    out = mixed_held_bytes(n_params, d, zero_stage, precision, padded_params=padded_params)
    if ZeroStage(zero_stage) == ZeroStage.ZERO3:
        out["fp8"] = len(fp8_shapes) * fp8_history_bytes(precision)
    else:
        out["fp8"] = sum(fp8_weight_bytes(n, k, precision) for n, k in fp8_shapes)
    return out


def bytes_per_parameter(held: dict[str, int | float], n_params: int) -> float | int:
    """The total of `held` per parameter (exact where it is a whole number)."""
    return _exact(Fraction(sum(Fraction(v) for v in held.values())) / n_params)


# The Ultra-Scale Playbook's table of FP8 approaches (section "FP8 pretraining"): bytes per parameter as
# master weights + accumulated gradients + model weights + gradients + optimizer states. Its counting differs from
# ours: it counts a model-weight copy of 1 byte for FP8 weights (no transposed or column-wise copy, no scales), a
# separate fp32 accumulation buffer beside the 16-bit gradients, and no master copy where the model weights are
# fp32 (Transformer Engine's row).
PLAYBOOK = {  # row names are labels, translated where shown
    N_("bf16 + fp32 mixed precision"): dict(master=4, accumulated=4, weights=2, grads=2, optimizer=8, total=20),
    N_("the same without fp32 gradient accumulation"): dict(
        master=4, accumulated=0, weights=2, grads=2, optimizer=8, total=16
    ),
    N_("Transformer Engine"): dict(master=0, accumulated=0, weights=4, grads=4, optimizer=8, total=16),
    N_("FP8-LM O3"): dict(master=2, accumulated=2, weights=1, grads=1, optimizer=3, total=9),
    N_("DeepSeek-V3"): dict(master=4, accumulated=4, weights=1, grads=2, optimizer=4, total=15),
    N_("nanotron FP8"): dict(master=2, accumulated=4, weights=1, grads=1, optimizer=2, total=10),
}


def playbook_total(row: dict) -> int:
    """A Playbook row's total from its parts (the table's own sum, checked)."""
    return sum(v for k, v in row.items() if k != "total")


# ------------------------------------------------------------------------------------ FP8 across the modes
# Per-rank bytes sent, as the tracer counts them (`pylib.runtime.tracer`): an all-gather of S output bytes over n
# ranks sends (n-1)/n S, an all-reduce of S bytes 2(n-1)/n S (integer division, as the tracer rounds).


def amax_allreduce_bytes(n: int, values: int = 1) -> int:
    """One all-reduce (max) of `values` fp32 amaxes over n ranks: what agreeing on per-tensor scales costs."""
    return 2 * (n - 1) * FP32 * values // n if n > 1 else 0


def sp_input_gather_bytes(b: int, s: int, h: int, t: int, compute_bytes: int, recipe=None) -> dict[str, int]:
    """The sequence-parallel all-gather of one column-parallel input [b, s/t, h] -> [b, s, h] over t ranks, per rank:
    "gather" the activation bytes sent ((t-1) b s/t h elements: `compute_bytes` each, 1 when `recipe.input_gather`
    quantizes the slice first), "amax" the all-reduce that agrees the input's scale (FP8 gather only)."""
    fp8 = recipe is not None and recipe.input_gather
    elements = (t - 1) * b * (s // t) * h
    return dict(gather=elements * (1 if fp8 else compute_bytes), amax=amax_allreduce_bytes(t) if fp8 else 0)


def tp_amax_allreduces(recipe, sequence_parallel: bool = False) -> int:
    """How many one-scale all-reduces a column-then-row pair of FP8 linears makes per step under TP
    (`pylib.tp.fp8`): the column's W and dY and the row's X and W for a per-tensor recipe, plus the column's X when
    the SP gather is in FP8; 0 for block recipes (their tiles never straddle two ranks)."""
    if recipe is None or not recipe.per_tensor:
        return 0
    return 4 + (1 if sequence_parallel and recipe.input_gather else 0)


def fp8_param_gather_bytes(weights: list[tuple[int, int]], padded: int, d: int, precision: MixedPrecision) -> dict:
    """ZeRO-3's gather of one unit's FP8 flat (the weights [out, in] of its FP8 linears, `padded` elements with the
    padding to a multiple of d) over d ranks, per rank and gather: "gather" the bytes sent ((d-1)/d of the flat, 1
    byte an element with `fp8.param_gather`, else the compute dtype's), "amax" the forward's all-reduce that agrees
    the scales (one fp32 per weight, or per 128 x 128 block for blockwise; none in the backward, which reuses
    them), "bf16" what the same weights cost gathered in the compute dtype (`pylib.dp.fp8_gather`)."""
    recipe = precision.fp8
    bf16 = (d - 1) * padded // d * precision.compute_bytes
    if recipe is None or not recipe.param_gather:
        return dict(gather=bf16, amax=0, bf16=bf16)
    if recipe.per_tensor:
        scales = len(weights)
    else:
        scales = sum((n // recipe.block) * (k // recipe.block) for n, k in weights)
    return dict(gather=(d - 1) * padded // d, amax=amax_allreduce_bytes(d, scales), bf16=bf16)


__all__ = [
    "fp8_param_gather_bytes",
    "amax_allreduce_bytes",
    "sp_input_gather_bytes",
    "tp_amax_allreduces",
    "PLAYBOOK",
    "bytes_per_parameter",
    "fp8_held_bytes",
    "fp8_history_bytes",
    "fp8_weight_bytes",
    "playbook_total",
]
