"""FP8 under tensor and sequence parallelism: the column- and row-parallel linears with their GEMMs in FP8.

Each rank runs its shard's three GEMMs with `pylib.model.fp8.Fp8Linear`; what TP adds is where an operand is cut.
A per-tensor recipe ("delayed", "tensorwise") keeps one scale for the whole logical tensor, so a rank that holds a
piece all-reduces its amax (max) over the TP group first, and every rank quantizes with the scale a single device
would use -- Transformer Engine's `Float8CurrentScalingQuantizer(with_amax_reduction=True,
amax_reduction_group=tp_group)` (`transformer_engine/pytorch/tensor/float8_tensor.py`), and the TP-group amax
reduction of its delayed scaling. Which operands are pieces:

    linear   operand        held                         per-tensor amax      block recipes (1 x B, B x B tiles)
    column   X              whole (after f / the gather)  local                local
             W  [out/t, in]  rows                          all-reduce (max)     B | out/t, else refused
             dY [M, out/t]   columns                       all-reduce (max)     tiles along out/t: B | out/t
    row      X  [M, in/t]    columns                       all-reduce (max)     tiles along in/t: B | in/t
             W  [out, in/t]  columns                       all-reduce (max)     B | in/t, else refused
             dY [M, out]     whole                         local                local

A block recipe's tiles never straddle two ranks when B divides the shard, so its scales need no agreement.

With sequence parallelism the column-parallel input arrives as the sequence slice [b, s/t, h] and is all-gathered.
`Fp8Recipe.input_gather` picks where the quantization happens:

    False   all-gather the bf16 slice (2 bytes an element), then quantize the whole [b, s, h]
    True    quantize the slice with the agreed per-tensor scale, all-gather the FP8 bytes (1 an element): half the
            bytes; the scale is the same on every rank, so the gathered bits equal those of quantizing the whole

Either way the FP8 bits the GEMMs read equal the single-device run's. What differs from one device is the order of
fp32 additions where TP sums partial products: the row-parallel output (the all-reduce or reduce-scatter of
partials) and the column-parallel input gradient (the conjugate all-reduce or reduce-scatter) -- a few fp32 ulps,
`tests/test_fp8_modes.py` states the bound. The forward output of a column-parallel linear and both weight gradients
are the same bits.
"""

from __future__ import annotations

import types

import torch
import torch.nn as nn

from pylib.model.fp8 import Fp8Linear, Fp8ShapeError, Fp8Tensor, quantize_operand
from pylib.plan.options import Fp8Recipe
from pylib.runtime import collectives as C
from pylib.runtime.tracer import current_tag

from .linear import ColumnParallelLinear, RowParallelLinear
from .regions import SEQ_DIM, check_sequence_divisible, enter_tp_region

AMAX_TAG = "fp8.amax"


def tp_fp8_problems(recipe: Fp8Recipe, kind: str, full_shape: tuple[int, int], tp: int) -> list[str]:
    """Why `recipe` cannot run a `kind` ("column" or "row") parallel linear of full weight shape [out, in] over `tp`
    ranks: a block recipe's block must divide the dimension TP cuts (out/t for column, in/t for row), since a tile
    that straddled two ranks would need the other rank's values for its scale. Empty when it can."""
    if kind not in ("column", "row"):
        raise ValueError(f"kind={kind!r} must be 'column' or 'row'")
    out_f, in_f = full_shape
    if out_f % tp if kind == "column" else in_f % tp:
        return [f"tp={tp} does not divide the {kind}-parallel dimension of a weight [{out_f}, {in_f}]"]
    if recipe.per_tensor:
        return []
    name, size = ("out_features", out_f) if kind == "column" else ("in_features", in_f)
    shard = size // tp
    if shard % recipe.block:
        return [
            f"the {recipe.recipe} block {recipe.block} does not divide the TP shard of {name}: {size} / tp={tp} = "
            f"{shard}, and {shard} % {recipe.block} = {shard % recipe.block} (a tile would straddle two ranks)"
        ]
    return []


def _amax_over(group, role: str):
    """amax -> the max of every TP rank's amax (an all-reduce of one fp32), for `Fp8Linear.amax_reduce[role]`."""
    phase = "backward" if role == "grad_output" else None

    def reduce(amax: torch.Tensor) -> torch.Tensor:
        out = C.all_reduce_(amax.reshape(1).clone(), group, op="max", phase=phase, tag=f"{AMAX_TAG}.{role}")
        return out.reshape(())

    return reduce


def _fp8_of(owner: nn.Module, recipe: Fp8Recipe, path: str, bias: bool, reduced: tuple[str, ...]) -> Fp8Linear:
    """An Fp8Linear sharing `owner`'s weight (and bias), its per-tensor amaxes of `reduced` roles agreed over TP."""
    layer = Fp8Linear(types.SimpleNamespace(weight=owner.weight, bias=owner.bias if bias else None), recipe, path)
    if recipe.per_tensor and owner.group.size > 1:
        layer.amax_reduce = {role: _amax_over(owner.group, role) for role in reduced}
    return layer


def _check(recipe: Fp8Recipe, kind: str, full_shape, tp: int) -> None:
    if not isinstance(recipe, Fp8Recipe):
        raise TypeError(f"recipe must be an Fp8Recipe, not {type(recipe).__name__}")
    bad = tp_fp8_problems(recipe, kind, tuple(full_shape), tp)
    if bad:
        raise Fp8ShapeError("; ".join(bad))


class _Fp8SequenceGather(torch.autograd.Function):
    """SP's entry with the activation moved in FP8. Forward: quantize my slice x [b, s/t, h] with the scale agreed
    over TP, all-gather the FP8 bytes along the sequence, hand the whole FP8 input [b s, h] (and its transpose) to
    `layer`; returns its dequantized values [b, s, h] for autograd. Backward: reduce-scatter the input gradient."""

    @staticmethod
    def forward(ctx, x, layer: Fp8Linear, g, tag):
        ctx.g, ctx.tag = g, tag
        b, s_mine, h = x.shape
        x2 = x.detach().reshape(-1, h)
        q = quantize_operand(x2, layer.recipe, "input", scale=layer.tensor_scale(x2, "input"))
        mine = q.data.view(torch.uint8).view(b, s_mine, h)  # gloo moves bytes, not float8
        data = C.all_gather_tensor(mine, SEQ_DIM, g, tag=tag).view(q.data.dtype).reshape(-1, h)
        whole = Fp8Tensor(data, q.scale, tuple(data.shape))
        layer.given_input = (whole, whole.t())
        return whole.dequantize().to(x.dtype).view(b, s_mine * g.size, h)

    @staticmethod
    def backward(ctx, dy):
        dx = C.reduce_scatter_tensor(dy.contiguous(), SEQ_DIM, ctx.g, phase="backward", tag=ctx.tag)
        return dx, None, None, None


def _copy_fields(new: nn.Module, old: nn.Module, names: tuple[str, ...]) -> None:
    nn.Module.__init__(new)
    new.group, new.weight, new.bias = old.group, old.weight, old.bias
    for name in names:
        setattr(new, name, getattr(old, name))


class Fp8ColumnParallelLinear(ColumnParallelLinear):
    """A `ColumnParallelLinear` (same parameters, same shard) whose GEMMs run in FP8 under `recipe`; with sequence
    parallelism and `recipe.input_gather` the input slice is quantized before its all-gather. `fp8` is the
    Fp8Linear that runs them (not a child module: the parameters stay this module's own)."""

    def __init__(self, column: ColumnParallelLinear, recipe: Fp8Recipe, path: str = "scaled_mm"):
        _check(recipe, "column", column.full_shape, column.group.size)
        if column.regather:
            raise ValueError(
                "regather=True keeps the bf16 sequence slice to gather again in backward; an FP8 linear keeps X^T "
                "in FP8 for its wgrad instead: build the column-parallel linear with regather=False"
            )
        _copy_fields(self, column, ("gather_output", "sequence_parallel", "regather", "full_shape", "kind", "replicas"))
        reduced = ("weight", "grad_output") + (("input",) if self.sequence_parallel and recipe.input_gather else ())
        object.__setattr__(self, "fp8", _fp8_of(self, recipe, path, True, reduced))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tag, g = current_tag(), self.group
        if self.sequence_parallel and g.size > 1 and self.fp8.recipe.input_gather:
            check_sequence_divisible(x.shape[SEQ_DIM] * g.size, g.size)
            x_full = _Fp8SequenceGather.apply(x, self.fp8, g, tag)
        else:
            x_full = enter_tp_region(x, g, self.sequence_parallel, tag=tag)
        y = self.fp8(x_full)
        return C.gather_from_group(y, -1, g, tag=tag) if self.gather_output else y


class Fp8RowParallelLinear(RowParallelLinear):
    """A `RowParallelLinear` whose partial GEMMs run in FP8 under `recipe` (the input's and the weight's per-tensor
    amax agreed over TP); the partial sums are reduced in the activation dtype and the bias added after, as in
    bf16."""

    def __init__(self, row: RowParallelLinear, recipe: Fp8Recipe, path: str = "scaled_mm"):
        _check(recipe, "row", row.full_shape, row.group.size)
        _copy_fields(self, row, ("input_is_parallel", "sequence_parallel", "full_shape"))
        object.__setattr__(self, "fp8", _fp8_of(self, recipe, path, False, ("input", "weight")))

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = C.split_to_group(x, -1, self.group)
        return self.fp8(x)


def to_fp8_tp(linear: nn.Module, recipe: Fp8Recipe, path: str = "scaled_mm") -> nn.Module:
    """The FP8 version of a column- or row-parallel linear (its parameters shared)."""
    if isinstance(linear, (Fp8ColumnParallelLinear, Fp8RowParallelLinear)):
        return linear
    if isinstance(linear, ColumnParallelLinear):
        return Fp8ColumnParallelLinear(linear, recipe, path)
    if isinstance(linear, RowParallelLinear):
        return Fp8RowParallelLinear(linear, recipe, path)
    raise TypeError(f"to_fp8_tp takes a ColumnParallelLinear or RowParallelLinear, not {type(linear).__name__}")


__all__ = ["AMAX_TAG", "Fp8ColumnParallelLinear", "Fp8RowParallelLinear", "to_fp8_tp", "tp_fp8_problems"]
