"""FP8 linear layers: the three GEMMs of a linear in FP8, under the four recipes large runs use.

A linear y = x W^T (x [M, K] with M = b s tokens, W [N, K]) runs three GEMMs, each an A B^T with K its contraction:

    fprop   Y  [M, N] = X   [M, K] . W   [N, K]^T         K = in_features
    dgrad   dX [M, K] = dY  [M, N] . W^T [K, N]^T         K = out_features
    wgrad   dW [N, K] = dY^T [N, M] . X^T [K, M]^T        K = tokens

Every operand is quantized along its GEMM's K: `quantize(x, dtype, tile)` keeps one decode scale s per tile
(x ~ q s, q in FP8, |x / s| <= the format's largest value), and `fp8_mm(a, b)` multiplies two quantized operands:

    recipe       operand tiles                              scale                         formats (TE's defaults)
    delayed      one per tensor                             amax of a history / max       E4M3 fwd, E5M2 grads
    tensorwise   one per tensor                             this tensor's amax / max      E4M3 fwd, E5M2 grads
    blockwise    1 x 128 activations and gradients,         amax / max, fp32              E4M3 everywhere
                 128 x 128 weights (DeepSeek-V3 3.3.2)
    mxfp8        1 x 32 every operand (OCP MX)               2**ceil(log2(amax / max)),    E4M3 everywhere
                                                            stored as its E8M0 byte

Two paths give the product. "scaled_mm": real FP8 tensors into `torch._scaled_mm`, which on this torch (2.13, CPU)
takes one scale per tensor or one per row of A and column of B; the block recipes run it once per K-block of 128 (32)
and add the fp32 partial products, DeepSeek-V3's promotion to fp32 every 128 elements of K. "emulated": dequantize
each operand to fp32 and run one matmul. Per tensor the two give the same bits (torch's CPU kernel dequantizes first);
with blocks they differ only in the order the fp32 sums are added (`tests/test_fp8.py` checks both).

This CPU has no FP8 tensor cores: the paths compute FP8 numerics, not FP8 speed.

`Fp8Linear` holds the high-precision weight (the model's parameter, which `pylib.dp.mixed` updates from its fp32
master) and, between its forward and the next, the FP8 copies the GEMMs read (`fp8_state_tensors`): the weight in
FP8, its transpose or column-wise copy where a recipe needs one, their scales and, for "delayed", the amax histories.
`to_fp8(module, recipe)` swaps every `nn.Linear` but the ones named in `keep` (the LM head by default, as Megatron-Core
keeps the output layer in bf16).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from pylib.plan.options import Fp8Recipe

PATHS = ("scaled_mm", "emulated")
FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}  # both in every torch pylib supports (2.6+)
E8M0_BIAS = 127  # an E8M0 scale is one byte, the exponent of a power of two plus 127 (OCP MX; 255 is NaN)


class Fp8ShapeError(ValueError):
    """A recipe's block does not divide an operand of a GEMM it must cut into blocks."""


def fp8_dtype(fmt: str) -> torch.dtype:
    """The torch dtype of an FP8 data format name ("e4m3", "e5m2")."""
    return FP8_DTYPES[fmt]


def e8m0_encode(scale: torch.Tensor) -> torch.Tensor:
    """Powers of two as their E8M0 bytes (uint8: the exponent + 127). torch.float8_e8m0fnu holds the same byte;
    storing the byte keeps MXFP8 on torch 2.6, which lacks that dtype (`pylib.runtime.compat`)."""
    return (torch.log2(scale).round() + E8M0_BIAS).clamp(0, 254).to(torch.uint8)


def e8m0_decode(code: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes as the fp32 powers of two they stand for."""
    return torch.exp2(code.float() - E8M0_BIAS)


def fp8_max(dtype: torch.dtype) -> float:
    """The largest finite value of an FP8 dtype (448 for E4M3, 57344 for E5M2), from torch.finfo."""
    return float(torch.finfo(dtype).max)


@dataclass
class Fp8Tensor:
    """An operand in FP8: data [R, C] (C the contraction axis of the GEMM that reads it), one decode scale per tile
    (x ~ data * scale): scale [] for one tile (the whole tensor), [R, C/t] for 1 x t tiles, [R/t, C/t] for t x t
    blocks; fp32, or E8M0 bytes (uint8, `e8m0_encode`) for MXFP8."""

    data: torch.Tensor
    scale: torch.Tensor
    tile: tuple[int, int]

    @property
    def per_tensor(self) -> bool:
        return self.scale.dim() == 0

    def scale_fp32(self) -> torch.Tensor:
        """The decode scales in fp32 (E8M0 bytes decoded)."""
        return e8m0_decode(self.scale) if self.scale.dtype == torch.uint8 else self.scale.float()

    def _scale_grid(self) -> torch.Tensor:
        """The fp32 scale of every element's tile as a [R/tr, 1, C/tc, 1] grid (broadcasts over the tiles)."""
        s = self.scale_fp32()
        if self.per_tensor:
            return s
        return s[:, None, :, None]  # [R, C/t] for 1 x t tiles, [R/t, C/t] for t x t blocks

    def dequantize(self) -> torch.Tensor:
        """The fp32 values this FP8 tensor stands for, [R, C]."""
        r, c = self.data.shape
        q = self.data.float()
        if self.per_tensor:
            return q * self.scale_fp32()
        tr, tc = self.tile
        return (q.view(r // tr, tr, c // tc, tc) * self._scale_grid()).view(r, c)

    def t(self) -> Fp8Tensor:
        """The transpose with the same FP8 bits: for one scale per tensor or square blocks (a 128 x 128 block of W is
        a block of W^T); 1 x t tiles of a transpose need a new quantization."""
        if not self.per_tensor and self.tile[0] != self.tile[1]:
            raise ValueError(f"the transpose of {self.tile[0]} x {self.tile[1]} tiles is not a tiling along K")
        scale = self.scale if self.per_tensor else self.scale.t().contiguous()
        return Fp8Tensor(self.data.t().contiguous(), scale, self.tile[::-1])

    def row_scales(self, k: int, tk: int) -> torch.Tensor:
        """The fp32 scale of each row for K-block k (of length tk): [R, 1], as `torch._scaled_mm` takes row-wise."""
        s = self.scale_fp32()
        tr = self.tile[0]
        col = s[:, k * tk // self.tile[1]]
        return (col if tr == 1 else col.repeat_interleave(tr)).reshape(-1, 1).contiguous()

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size() + self.scale.numel() * self.scale.element_size()


def _amax(x: torch.Tensor) -> torch.Tensor:
    return x.detach().abs().amax().float()


def _decode_scale(amax: torch.Tensor, top: float, power_of_two: bool) -> torch.Tensor:
    """s with amax / s <= top; 1 where amax is 0. power_of_two: the smallest power of two (MXFP8's E8M0)."""
    amax = amax.float()
    if power_of_two:
        s = torch.exp2(torch.ceil(torch.log2(amax / top)))
    else:
        s = amax / top
    return torch.where(amax > 0, s, torch.ones_like(s))


def scale_from_amax(amax: torch.Tensor, dtype: torch.dtype, power_of_two: bool = False) -> torch.Tensor:
    """The decode scale(s) `quantize` takes for amax(es) `amax` in FP8 `dtype`: amax / max (1 where amax is 0)."""
    return _decode_scale(amax, fp8_max(dtype), power_of_two)


def quantize(
    x: torch.Tensor,
    dtype: torch.dtype,
    tile: tuple[int, int] | None = None,
    *,
    scale: torch.Tensor | None = None,
    power_of_two: bool = False,
    recipe: str = "",
) -> Fp8Tensor:
    """x [R, C] in FP8 `dtype` with one decode scale per tile: tile None = the whole tensor (its scale given, as
    delayed scaling gives it, or from x's amax), (1, t) tiles along C, (t, t) blocks. Values beyond the format's
    largest are clipped to it (saturation, as TE and torchao cast). power_of_two: E8M0 scales (MXFP8)."""
    top = fp8_max(dtype)
    x = x.detach().float()
    if tile is None:
        s = _decode_scale(_amax(x), top, power_of_two) if scale is None else scale.float()
        q = (x / s).clamp(-top, top).to(dtype)
        return Fp8Tensor(q, s.reshape(()), tuple(x.shape))
    r, c = x.shape
    tr, tc = tile
    if r % tr or c % tc:
        raise Fp8ShapeError(
            f"{recipe or 'FP8'} tiles of {tr} x {tc} do not divide an operand of shape [{r}, {c}]: "
            f"{r} % {tr} = {r % tr}, {c} % {tc} = {c % tc}"
        )
    blocks = x.view(r // tr, tr, c // tc, tc)
    s = _decode_scale(blocks.abs().amax(dim=(1, 3)), top, power_of_two)  # [R/tr, C/tc]
    q = (blocks / s[:, None, :, None]).clamp(-top, top).to(dtype).view(r, c)
    if power_of_two:
        s = e8m0_encode(s)  # exact: a power of two
    if tr == 1:
        return Fp8Tensor(q, s.reshape(r, c // tc), tile)
    return Fp8Tensor(q, s, tile)


def fp8_mm(a: Fp8Tensor, b: Fp8Tensor, path: str = "scaled_mm") -> torch.Tensor:
    """A B^T in fp32 from two quantized operands a [M, K], b [N, K] (tiled along K alike).

    "scaled_mm": `torch._scaled_mm` on the FP8 data, per tensor in one call, with tiles once per K-block with
    row-wise scales and the fp32 partial products added in K order; "emulated": both dequantized to fp32, one matmul."""
    if path == "emulated":
        return a.dequantize() @ b.dequantize().t()
    if path != "scaled_mm":
        raise ValueError(f"path={path!r} must be one of {PATHS}")
    if a.per_tensor and b.per_tensor:
        return torch._scaled_mm(a.data, b.data.t(), scale_a=a.scale, scale_b=b.scale, out_dtype=torch.float32)
    if a.per_tensor or b.per_tensor or a.tile[1] != b.tile[1]:
        raise ValueError(f"operands tiled {a.tile} and {b.tile}: both must be cut alike along K")
    tk = a.tile[1]
    m, k = a.data.shape
    out = torch.zeros(m, b.data.shape[0], dtype=torch.float32)
    for i in range(k // tk):
        cols = slice(i * tk, (i + 1) * tk)
        out += torch._scaled_mm(
            a.data[:, cols].contiguous(),
            b.data[:, cols].contiguous().t(),
            scale_a=a.row_scales(i, tk),
            scale_b=b.row_scales(i, tk).t().contiguous(),
            out_dtype=torch.float32,
        )
    return out


ROLES = ("input", "weight", "grad_output")


def quantize_operand(x: torch.Tensor, recipe: Fp8Recipe, role: str, *, scale: torch.Tensor | None = None) -> Fp8Tensor:
    """x [R, C] quantized along C as `recipe` quantizes an operand of `role` ("input", "weight", "grad_output"):
    E4M3, or the recipe's gradient format for "grad_output"; one scale per tensor (`scale` given: delayed scaling's),
    1 x block tiles, or 128 x 128 blocks for a blockwise weight; E8M0 power-of-two scales for MXFP8."""
    dtype = fp8_dtype(recipe.grad_format if role == "grad_output" else "e4m3")
    if recipe.per_tensor:
        return quantize(x, dtype, scale=scale)
    t = recipe.block
    tile = (t, t) if role == "weight" and recipe.recipe == "blockwise" else (1, t)
    return quantize(x, dtype, tile, power_of_two=recipe.recipe == "mxfp8", recipe=recipe.recipe)


class AmaxHistory:
    """Transformer Engine's delayed scaling for one tensor role of one layer: the decode scale of this step comes from
    the amaxes of earlier ones. `scale` is what the next quantization uses; `record(amax)` writes this step's amax,
    then the scale is recomputed (amax_compute_algo "max" over the window, or "most_recent"; divided by 2**margin)
    and the window rolls. Starts at scale 1 with an empty (zero) history, as TE does."""

    def __init__(self, recipe: Fp8Recipe, dtype: torch.dtype):
        self.recipe, self.top = recipe, fp8_max(dtype)
        self.history = torch.zeros(recipe.amax_history_len, dtype=torch.float32)
        self.scale = torch.ones((), dtype=torch.float32)

    def record(self, amax: torch.Tensor) -> None:
        self.history[0] = amax
        window = self.history.max() if self.recipe.amax_compute_algo == "max" else self.history[0]
        if window > 0:
            self.scale = (window * 2.0**self.recipe.margin / self.top).reshape(())
        self.history = torch.roll(self.history, 1)
        self.history[0] = 0.0

    def tensors(self) -> list[torch.Tensor]:
        return [self.history, self.scale]


class Fp8Linear(nn.Module):
    """`linear` (same weight and bias parameters) with its three GEMMs in FP8 under `recipe`. x [..., K] -> [..., N]
    in x's dtype; the gradients come back in x's and the weight's dtypes."""

    def __init__(self, linear: nn.Linear, recipe: Fp8Recipe, path: str = "scaled_mm"):
        super().__init__()
        if not isinstance(recipe, Fp8Recipe):
            raise TypeError(f"recipe must be an Fp8Recipe, not {type(recipe).__name__}")
        if path not in PATHS:
            raise ValueError(f"path={path!r} must be one of {PATHS}")
        n, k = linear.weight.shape
        bad = recipe.shape_problems(n, k)
        if bad:
            raise Fp8ShapeError("; ".join(bad))
        self.in_features, self.out_features = k, n
        self.weight, self.bias = linear.weight, linear.bias
        self.recipe, self.path = recipe, path
        self.fwd_dtype = fp8_dtype("e4m3")
        self.grad_dtype = fp8_dtype(recipe.grad_format)
        self.amax = (
            {
                "input": AmaxHistory(recipe, self.fwd_dtype),
                "weight": AmaxHistory(recipe, self.fwd_dtype),
                "grad_output": AmaxHistory(recipe, self.grad_dtype),
            }
            if recipe.recipe == "delayed"
            else {}
        )
        self.weight_fp8: tuple[Fp8Tensor, ...] = ()  # the FP8 copies of the weight the last forward made
        # Across ranks (set by a parallel mode; the layer itself knows no ranks): amax_reduce[role] turns this rank's
        # amax of a per-tensor operand into the amax of the whole logical tensor (an all-reduce max over the group
        # that holds its pieces), so every rank quantizes its piece with the one scale a single device would use.
        self.amax_reduce: dict[str, object] = {}
        # FP8 operands a communication already moved in FP8 (SP's FP8 all-gather of the input, ZeRO-3's FP8
        # parameter gather): the next forward uses them instead of quantizing its own input or weight
        self.given_input: tuple[Fp8Tensor, Fp8Tensor] | None = None
        self.given_weight: tuple[Fp8Tensor, Fp8Tensor] | None = None
        # ZeRO-3's FP8 gather frees the FP8 weight after the forward and gathers it again before the backward: the
        # backward then reads `weight_fp8` (the copy handed back) instead of keeping the forward's alive
        self.regathers_weight = False
        # keep them after backward (TE caches a step's FP8 weights across micro-batches); False frees them when the
        # backward is done, as ZeRO-3 frees a unit's gathered weights
        self.cache_weights = True

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, recipe={self.recipe.recipe}"

    # -- quantization of each operand, by role -------------------------------------------------------------------
    def _quantize(self, x: torch.Tensor, role: str) -> Fp8Tensor:
        if not self.recipe.per_tensor:
            return quantize_operand(x, self.recipe, role)
        return quantize_operand(x, self.recipe, role, scale=self.tensor_scale(x, role))

    def tensor_scale(self, x: torch.Tensor, role: str) -> torch.Tensor:
        """The one decode scale a per-tensor recipe quantizes `x` (this rank's piece of the operand `role`) with:
        "tensorwise" from the amax of the whole operand (`amax_reduce[role]` agrees it across the ranks holding
        pieces); "delayed" the history's scale, after which the whole operand's amax is recorded."""
        amax = _amax(x)
        reduce = self.amax_reduce.get(role)
        if reduce is not None:
            amax = reduce(amax)
        return self.scale_for(amax, role)

    def scale_for(self, amax: torch.Tensor, role: str) -> torch.Tensor:
        """The per-tensor decode scale for an operand of `role` whose whole amax is `amax` (delayed: the history's
        scale, then `amax` recorded)."""
        if self.recipe.recipe == "delayed":
            history = self.amax[role]
            scale = history.scale
            history.record(amax)
            return scale
        dtype = self.grad_dtype if role == "grad_output" else self.fwd_dtype
        return _decode_scale(amax, fp8_max(dtype), False)

    def quantize_weight(self) -> tuple[Fp8Tensor, Fp8Tensor]:
        """W for fprop (tiled along in_features) and W^T for dgrad (tiled along out_features)."""
        if self.given_weight is not None:
            given, self.given_weight = self.given_weight, None
            return given
        w = self.weight
        if self.recipe.per_tensor or self.recipe.recipe == "blockwise":
            q = self._quantize(w, "weight")
            return (
                q,
                q.t(),
            )  # per tensor: the FP8 transpose TE keeps for Hopper; blockwise: a 128 x 128 block serves both
        return quantize_operand(w, self.recipe, "weight"), quantize_operand(w.t(), self.recipe, "weight")  # MXFP8

    def quantize_input(self, x2: torch.Tensor) -> tuple[Fp8Tensor, Fp8Tensor]:
        """X for fprop (along in_features) and X^T for wgrad (along tokens)."""
        if self.given_input is not None:
            given, self.given_input = self.given_input, None
            return given
        if self.recipe.per_tensor:
            q = self._quantize(x2, "input")
            return q, q.t()
        return quantize_operand(x2, self.recipe, "input"), quantize_operand(x2.t(), self.recipe, "input")

    def quantize_grad(self, dy: torch.Tensor) -> tuple[Fp8Tensor, Fp8Tensor]:
        """dY for dgrad (along out_features) and dY^T for wgrad (along tokens)."""
        if self.recipe.per_tensor:
            q = self._quantize(dy, "grad_output")
            return q, q.t()
        return quantize_operand(dy, self.recipe, "grad_output"), quantize_operand(dy.t(), self.recipe, "grad_output")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.numel() // self.in_features
        bad = self.recipe.shape_problems(self.out_features, self.in_features, tokens)
        if bad:
            raise Fp8ShapeError("; ".join(bad) + f" (input of shape {list(x.shape)})")
        return _Fp8LinearFunction.apply(x, self.weight, self.bias, self)

    def fp8_state_tensors(self) -> list[torch.Tensor]:
        """What the layer holds beside its parameters: the FP8 weight copies and their scales, the amax histories."""
        out = []
        seen = set()
        for q in self.weight_fp8:
            for t in (q.data, q.scale):
                if id(t) not in seen:
                    seen.add(id(t))
                    out.append(t)
        for history in self.amax.values():
            out += history.tensors()
        return out


class _Fp8LinearFunction(torch.autograd.Function):
    """fprop, dgrad and wgrad of `Fp8Linear`, each from FP8 operands; the saved activation is X^T in FP8."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer: Fp8Linear):
        x2 = x.reshape(-1, layer.in_features)
        qx, qxt = layer.quantize_input(x2)
        qw, qwt = layer.quantize_weight()
        layer.weight_fp8 = (qw, qwt)
        y = fp8_mm(qx, qw, layer.path)
        if bias is not None:
            y = y + bias.float()
        ctx.layer, ctx.qxt, ctx.qwt = layer, qxt, None if layer.regathers_weight else qwt
        ctx.x_shape, ctx.x_dtype, ctx.has_bias = x.shape, x.dtype, bias is not None
        return y.to(x.dtype).view(*x.shape[:-1], layer.out_features)

    @staticmethod
    def backward(ctx, dy):
        layer = ctx.layer
        dy2 = dy.reshape(-1, layer.out_features)
        qdy, qdyt = layer.quantize_grad(dy2)
        qwt = ctx.qwt
        if qwt is None:  # ZeRO-3: the copy gathered again for this backward
            if len(layer.weight_fp8) != 2:
                raise RuntimeError(f"{layer!r}: its FP8 weight was not gathered again before its backward")
            qwt = layer.weight_fp8[1]
        dx = fp8_mm(qdy, qwt, layer.path)  # [M, K]
        dw = fp8_mm(qdyt, ctx.qxt, layer.path)  # [N, K]
        db = dy2.float().sum(0).to(layer.bias.dtype) if ctx.has_bias else None
        ctx.qxt = ctx.qwt = None
        if not layer.cache_weights:
            layer.weight_fp8 = ()
        return dx.to(ctx.x_dtype).view(ctx.x_shape), dw.to(layer.weight.dtype), db, None


KEEP = ("lm_head",)  # the linears `to_fp8` leaves in high precision by default (Megatron-Core's output layer)


def high_precision_layers(module: nn.Module, recipe: Fp8Recipe) -> tuple[str, ...]:
    """The Transformer layers whose linears `recipe` keeps in the compute dtype: with `first_last_layers_bf16`
    the first and the last of `module.layers` ("layers.0", "layers.{L-1}", Megatron's `--first-last-layers-bf16`
    with one layer at each end), else none."""
    layers = getattr(module, "layers", None)
    if not recipe.first_last_layers_bf16 or layers is None or len(layers) == 0:
        return ()
    return tuple(dict.fromkeys((f"layers.{0}", f"layers.{len(layers) - 1}")))


def keeps_high_precision(name: str, keep: tuple[str, ...], layers: tuple[str, ...] = ()) -> bool:
    """Whether the linear at qualified `name` stays in high precision: named in `keep` (whole or its last part) or
    inside one of `layers`."""
    return name in keep or name.rpartition(".")[2] in keep or any(name.startswith(p + ".") for p in layers)


def to_fp8(module: nn.Module, recipe: Fp8Recipe, *, path: str = "scaled_mm", keep: tuple[str, ...] = KEEP):
    """Swap every nn.Linear of `module` whose qualified name is not in `keep` (and whose last part is not either)
    for an Fp8Linear sharing its parameters (in place; returns the module); with the recipe's
    `first_last_layers_bf16` the linears of the first and last Transformer layer stay too
    (`high_precision_layers`). Raises Fp8ShapeError naming the layer when a recipe's block does not divide its
    shape."""
    layers = high_precision_layers(module, recipe)
    for name, child in list(module.named_modules()):
        for attr, sub in list(child.named_children()):
            full = f"{name}.{attr}" if name else attr
            if type(sub) is nn.Linear and not keeps_high_precision(full, keep, layers):
                try:
                    setattr(child, attr, Fp8Linear(sub, recipe, path))
                except Fp8ShapeError as error:
                    raise Fp8ShapeError(f"{full} [{sub.out_features}, {sub.in_features}]: {error}") from None
    return module


def fp8_layers(module: nn.Module) -> list[Fp8Linear]:
    return [m for m in module.modules() if isinstance(m, Fp8Linear)]


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| (Frobenius), in float64."""
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / want.norm().clamp_min(math.ulp(0.0)))


__all__ = [
    "E8M0_BIAS",
    "FP8_DTYPES",
    "KEEP",
    "PATHS",
    "AmaxHistory",
    "Fp8Linear",
    "Fp8ShapeError",
    "Fp8Tensor",
    "e8m0_decode",
    "e8m0_encode",
    "fp8_dtype",
    "fp8_layers",
    "fp8_max",
    "fp8_mm",
    "high_precision_layers",
    "keeps_high_precision",
    "ROLES",
    "quantize",
    "quantize_operand",
    "relative_error",
    "scale_from_amax",
    "to_fp8",
]
