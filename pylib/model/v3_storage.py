"""DeepSeek-V3's own activation storage (technical report, arXiv 2412.19437, section 3.3.3 "Low-Precision Storage
and Communication"): two of the report's choices of what a layer keeps for backward, as autograd functions whose
saved tensors are what the planner counts (`pylib.analysis.activations.storage_rows`).

    SwiGLU in FP8     "we cache the inputs of the SwiGLU operator and recompute its output in the backward pass.
                      These activations are also stored in FP8 with our fine-grained quantization method."
                      `cached_swiglu_mlp` runs down(silu(gate x) * up x) and keeps, for backward, x, gate x and up x,
                      each quantized as `Fp8Linear` keeps a linear's input (its transpose, along the tokens, in E4M3
                      with the recipe's tiles: `quantize_operand(., recipe, "input")`); the SwiGLU output, which
                      the down projection's weight gradient reads, is rebuilt in backward from the cached pair.
                      A plain SwiGLU MLP keeps x, gate x, silu(gate x), up x and their product in 16 bits (or the
                      two linears' FP8 copies beside the activation's 16-bit factors).
    W_O input, E5M6   "Inputs of the Linear after the attention operator ... We adopt a customized E5M6 data format
                      exclusively for these activations" with 1 x 128 tiles and power-of-two scales.
                      `E5M6Linear` keeps its input rounded to 5 exponent and 6 mantissa bits (12 bits, packed two
                      elements to three bytes: 1.5 bytes an element) and one int8 exponent per 1 x 128 tile
                      (the scale 2**e, exact). The report shares that copy with the attention core's backward;
                      here the linear alone keeps it.

The third choice the planner prices with them, the combine's un-permute fused so the weighted expert outputs are
not saved beside the unweighted ones, is an expert-parallel function: `pylib.ep.permute.unpermute(fused=True)`.
In an `ExpertParallelMoE` the experts take the first (`LocalExperts.swiglu_fp8 = recipe`) and the all-to-all
dispatcher the third (`AllToAllDispatcher.fused_unpermute = True`); a reference layer takes the second by swapping
`attn.o_proj` for an `E5M6Linear` (tests/test_v3_storage.py measures all three against the planner's rows).

One more choice, ours and not the report's (the report does not say how it computes the combine weights' gradient):
    gate in expert    y = sum_i g_i e_i with e_i = h_i W2_i^T (h_i the expert's hidden activation) needs, for
                      dL/dg_i = <dy, e_i>, the expert outputs e_i: 0.47 GB per layer per microbatch in DeepSeek-V3.
                      But <dy, e_i> = <dy W2_i, h_i>, and backward computes dy W2_i (the down projection's input
                      gradient, before g_i scales it) and has h_i (W2_i's weight gradient reads it, saved or
                      rebuilt) anyway: `gated_expert` applies g_i inside the expert, before the down projection, and
                      reads its gradient off that row-wise dot, so e_i is never kept. Exact algebra, not an
                      approximation. In an `ExpertParallelMoE` the weights travel with their rows
                      (`AllToAllDispatcher.gate_in_expert`); Megatron-Core's grouped experts apply the router
                      probabilities the same way (`weighted_bias_swiglu_impl`), and its `--moe-apply-probs-on-input`
                      is another thing: it scales the expert's input (top-1 only), which changes the function.

The GEMMs here run in the input's dtype: the subject is what is stored, not FP8 arithmetic (`pylib.model.fp8`).
With recipe=None `cached_swiglu_mlp` keeps the three tensors unquantized, so its hand-written backward is checked
against autograd to rounding in float64 (tests/test_v3_storage.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from pylib.plan.options import Fp8Recipe

from .fp8 import Fp8Tensor, quantize_operand

# ------------------------------------------------------------------------------------------- SwiGLU, FP8-cached


def _store(t: torch.Tensor, recipe: Fp8Recipe | None) -> tuple[torch.Tensor, ...]:
    """t [M, K] as kept for backward: itself (recipe None) or its transpose in FP8 along M and its scales."""
    if recipe is None:
        return (t.detach(),)
    q = quantize_operand(t.detach().t().contiguous(), recipe, "input")
    return q.data, q.scale


def _load(kept: tuple[torch.Tensor, ...], recipe: Fp8Recipe | None, tile: tuple[int, int] | None) -> torch.Tensor:
    """What `_store` kept, back as [M, K] (fp32 when it was quantized)."""
    if recipe is None:
        return kept[0]
    return Fp8Tensor(kept[0], kept[1], tile).dequantize().t()


def _tile(recipe: Fp8Recipe | None, tokens: int) -> tuple[int, int] | None:
    if recipe is None:
        return None
    return (tokens, tokens) if recipe.per_tensor else (1, recipe.block)


class _CachedSwiGLU(torch.autograd.Function):
    """y = down(silu(x Wg^T) * (x Wu^T)); saves x, G = x Wg^T, U = x Wu^T (in FP8 with a recipe), rebuilds
    silu(G) * U in backward."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down, recipe, gate=None):
        x2 = x.reshape(-1, x.shape[-1])
        g, u = x2 @ w_gate.t(), x2 @ w_up.t()
        h = F.silu(g) * u
        y = (h if gate is None else h * gate.unsqueeze(-1)) @ w_down.t()
        ctx.recipe, ctx.n = recipe, 1 if recipe is None else 2  # tensors `_store` keeps for each
        kept = (*_store(x2, recipe), *_store(g, recipe), *_store(u, recipe), w_gate, w_up, w_down)
        ctx.gated = gate is not None
        ctx.save_for_backward(*kept, *((gate.detach(),) if ctx.gated else ()))
        ctx.x_shape, ctx.dtype = x.shape, x.dtype
        return y.view(*x.shape[:-1], w_down.shape[0])

    @staticmethod
    def backward(ctx, dy):
        n, recipe = ctx.n, ctx.recipe
        saved = ctx.saved_tensors
        w_gate, w_up, w_down = saved[3 * n : 3 * n + 3]
        dy2 = dy.reshape(-1, dy.shape[-1])
        tile = _tile(recipe, dy2.shape[0])
        work = torch.promote_types(ctx.dtype, torch.float32) if recipe is not None else ctx.dtype
        x2, g, u = (_load(saved[i * n : (i + 1) * n], recipe, tile).to(work) for i in range(3))
        dy2 = dy2.to(work)
        sg = torch.sigmoid(g)
        act = g * sg  # silu(G), rebuilt
        h = act * u  # the SwiGLU output, the down projection's input: recomputed, never stored
        dh = dy2 @ w_down.to(work)
        d_gate = None
        if ctx.gated:  # y = (w h) W_d^T: dw = <dy W_d, h> row by row, the expert output never needed
            w = saved[-1].to(work).unsqueeze(-1)
            d_gate = (dh * h).sum(-1).to(saved[-1].dtype)
            dh, h = dh * w, h * w
        du = dh * act
        dg = dh * u * (sg * (1 + g * (1 - sg)))  # d silu(g) / dg = sigmoid(g) (1 + g (1 - sigmoid(g)))
        dx = dg @ w_gate.to(work) + du @ w_up.to(work)
        dw_gate, dw_up, dw_down = dg.t() @ x2, du.t() @ x2, dy2.t() @ h
        return (
            dx.to(ctx.dtype).view(ctx.x_shape),
            dw_gate.to(w_gate.dtype),
            dw_up.to(w_up.dtype),
            dw_down.to(w_down.dtype),
            None,
            d_gate,
        )


def cached_swiglu_mlp(
    x: torch.Tensor, mlp: nn.Module, recipe: Fp8Recipe | None, gate: torch.Tensor | None = None
) -> torch.Tensor:
    """`mlp(x)` for a SwiGLU `pylib.model.MLP` (no biases), keeping for backward only its input and the SwiGLU's two
    inputs, in FP8 under `recipe` (tiles along the tokens: their count must be a multiple of the recipe's block), or
    unquantized with recipe=None; the SwiGLU output is recomputed in backward (module docstring).
    gate [tokens] (None = 1): each row's combine weight, applied inside as `gated_expert` applies it (the output is
    gate * mlp(x), and the weight's gradient is read off the down projection's input gradient)."""
    if getattr(mlp, "kind", None) != "swiglu":
        raise ValueError(f"cached_swiglu_mlp needs a SwiGLU MLP, got kind={getattr(mlp, 'kind', None)!r}")
    _check_gate(x, gate)
    gate = None if gate is None else gate.to(x.dtype)
    return _CachedSwiGLU.apply(x, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, recipe, gate)


# ------------------------------------------------------------------------- the combine weight inside the expert


def _check_gate(x: torch.Tensor, gate: torch.Tensor | None) -> None:
    rows = x.numel() // x.shape[-1]
    if gate is not None and (gate.dim() != 1 or gate.shape[0] != rows):
        raise ValueError(f"gate must hold one combine weight per row: shape ({rows},), got {tuple(gate.shape)}")


class _GatedDown(torch.autograd.Function):
    """y = (w h) W^T for the down projection W [h, f] of an expert, its input h [R, f] and one combine weight per
    row w [R]. Saves h and w (not w h, not y): dw_r = <dy_r W, h_r>, dh = w (dy W), dW = dy^T (w h)."""

    @staticmethod
    def forward(ctx, h, w, weight):
        ctx.save_for_backward(h, w, weight)
        return (h * w.unsqueeze(-1)) @ weight.t()

    @staticmethod
    def backward(ctx, dy):
        h, w, weight = ctx.saved_tensors
        dh = dy @ weight  # the down projection's input gradient before the weight scales it
        d_w = (dh * h).sum(-1)  # the combine weight's gradient: a row-wise dot of two tensors backward has anyway
        return dh * w.unsqueeze(-1), d_w, dy.t() @ (h * w.unsqueeze(-1))


def gated_expert(
    x: torch.Tensor, mlp: nn.Module, gate: torch.Tensor, swiglu_fp8: Fp8Recipe | None = None
) -> torch.Tensor:
    """gate[:, None] * mlp(x) for an expert `pylib.model.MLP` (no biases) and its rows x [R, h], the combine weight
    applied inside the expert, before the down projection: y = (gate h) W_down^T with h the expert's hidden
    activation. Equal to scaling the output (the down projection is linear), but the weight's gradient
    dL/dgate_r = <dy_r, e_r> = <dy_r W_down, h_r> (e_r = h_r W_down^T the unweighted output) is a row-wise dot of the
    down projection's input gradient and its input, both of which the backward has anyway: the expert outputs e are
    never kept. (Our derivation; Megatron-Core's grouped experts apply the router probabilities the same way,
    `weighted_bias_swiglu_impl`.) swiglu_fp8: also cache the SwiGLU's inputs in FP8 (`cached_swiglu_mlp`)."""
    if swiglu_fp8 is not None:
        return cached_swiglu_mlp(x, mlp, swiglu_fp8, gate)  # checks the gate itself
    _check_gate(x, gate)
    return _GatedDown.apply(mlp.hidden(x), gate.to(x.dtype), mlp.down_proj.weight)


class CachedSwiGLUMLP(nn.Module):
    """A SwiGLU `MLP` run through `cached_swiglu_mlp` (sharing its parameters)."""

    def __init__(self, mlp: nn.Module, recipe: Fp8Recipe | None):
        super().__init__()
        self.mlp, self.recipe = mlp, recipe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cached_swiglu_mlp(x, self.mlp, self.recipe)


# ------------------------------------------------------------------------------------------------------ E5M6

E5M6_MANTISSA = 6
E5M6_MAX = (2 - 2.0**-E5M6_MANTISSA) * 2.0**15  # 65024: fp16's exponent range, 6 mantissa bits
E5M6_MIN_NORMAL = 2.0**-14
E5M6_TILE = 128  # 1 x 128 tiles along the features, the report's


@dataclass
class E5M6Tensor:
    """x [R, C] in E5M6: `packed` uint8, two 12-bit codes (sign, 5 exponent bits, 6 mantissa bits: fp16's top 12
    bits) in three bytes; `exponent` int8 [R, ceil(C / tile)], each tile's scale 2**exponent (x ~ value * scale)."""

    packed: torch.Tensor
    exponent: torch.Tensor
    shape: tuple[int, int]
    tile: int

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.exponent.numel()


def round_e5m6(v: torch.Tensor) -> torch.Tensor:
    """fp32 values (|v| <= E5M6_MAX) rounded to the nearest E5M6 value, ties to even: normal values keep 6 of
    fp32's 23 mantissa bits (rounded on the bits), values below 2**-14 the multiples of 2**-20 (E5M6's subnormals)."""
    v = v.float().contiguous()
    bits = v.view(torch.int32)
    drop = 23 - E5M6_MANTISSA
    odd = (bits >> drop) & 1
    normal = ((bits + (1 << (drop - 1)) - 1 + odd) & ~((1 << drop) - 1)).view(torch.float32)
    step = 2.0 ** (-14 - E5M6_MANTISSA)
    small = torch.round(v / step) * step
    return torch.where(v.abs() < E5M6_MIN_NORMAL, small, normal)


def quantize_e5m6(x: torch.Tensor, tile: int = E5M6_TILE) -> E5M6Tensor:
    """x [R, C] in E5M6 with a power-of-two scale per 1 x `tile` tile (the smallest with amax / scale <= E5M6_MAX),
    so the only error is E5M6's rounding: at most 2**-7 of each value above the tile's 2**-14 scale, 2**-21 scale
    below it."""
    r, c = x.shape
    n_tiles = -(-c // tile)
    xf = F.pad(x.detach().float(), (0, n_tiles * tile - c)).view(r, n_tiles, tile)
    amax = xf.abs().amax(-1)
    e = torch.where(amax > 0, torch.ceil(torch.log2(amax / E5M6_MAX)), torch.zeros_like(amax)).clamp(-128, 127)
    v = round_e5m6(xf / torch.exp2(e)[..., None]).view(r, -1)[:, :c].reshape(-1)
    codes = (v.half().view(torch.int16).to(torch.int32) >> 4) & 0xFFF  # the low 4 of fp16's 10 mantissa bits are 0
    if codes.numel() % 2:
        codes = torch.cat([codes, codes.new_zeros(1)])
    a, b = codes[0::2], codes[1::2]
    packed = torch.stack([a >> 4, ((a & 0xF) << 4) | (b >> 8), b & 0xFF], -1).reshape(-1).to(torch.uint8)
    return E5M6Tensor(packed, e.to(torch.int8), (r, c), tile)


def dequantize_e5m6(q: E5M6Tensor) -> torch.Tensor:
    """The fp32 values an `E5M6Tensor` stands for, [R, C]."""
    r, c = q.shape
    p = q.packed.to(torch.int32).view(-1, 3)
    a = (p[:, 0] << 4) | (p[:, 1] >> 4)
    b = ((p[:, 1] & 0xF) << 8) | p[:, 2]
    codes = torch.stack([a, b], -1).reshape(-1)[: r * c]
    bits = codes << 4
    bits = torch.where(bits >= 1 << 15, bits - (1 << 16), bits).to(torch.int16)  # fp16's bits, signed
    v = bits.view(torch.float16).float().view(r, c)
    scale = torch.exp2(q.exponent.float()).repeat_interleave(q.tile, dim=1)[:, :c]
    return v * scale


class _E5M6Linear(torch.autograd.Function):
    """y = x W^T (+ b), keeping x in E5M6 for the weight gradient (the input gradient needs only W)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        q = quantize_e5m6(x.reshape(-1, x.shape[-1]))
        ctx.save_for_backward(q.packed, q.exponent, weight)
        ctx.shape, ctx.x_shape, ctx.dtype, ctx.has_bias = q.shape, x.shape, x.dtype, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        packed, exponent, weight = ctx.saved_tensors
        x2 = dequantize_e5m6(E5M6Tensor(packed, exponent, ctx.shape, E5M6_TILE))
        dy2 = dy.reshape(-1, dy.shape[-1])
        work = torch.promote_types(ctx.dtype, torch.float32)
        dw = dy2.to(work).t() @ x2.to(work)
        dx = dy2 @ weight.to(dy2.dtype)
        db = dy2.sum(0) if ctx.has_bias else None
        return dx.view(ctx.x_shape).to(ctx.dtype), dw.to(weight.dtype), db


class E5M6Linear(nn.Module):
    """An `nn.Linear` (sharing its parameters) that keeps its input in E5M6 for backward: DeepSeek-V3's W_O."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _E5M6Linear.apply(x, self.weight, self.bias)


__all__ = [
    "E5M6_MAX",
    "E5M6_TILE",
    "CachedSwiGLUMLP",
    "E5M6Linear",
    "E5M6Tensor",
    "cached_swiglu_mlp",
    "dequantize_e5m6",
    "gated_expert",
    "quantize_e5m6",
    "round_e5m6",
]
