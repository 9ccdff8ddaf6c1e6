"""DeepSeek-V3's activation storage (`pylib.model.v3_storage`, `pylib.ep.permute.unpermute(fused=True)`): each
function's backward is checked against autograd, what autograd saves is measured with saved-tensor hooks and held
equal to the planner's count (`pylib.analysis.activations`), and the gradients' error from the low-precision copies
is bounded (each bound justified where it is asserted)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from pylib.analysis import activations as A
from pylib.analysis import planner as P
from pylib.ep.permute import permute, unpermute
from pylib.model import MLP, saved_activations
from pylib.model.fp8 import relative_error
from pylib.model.v3_storage import (
    E5M6_MAX,
    E5M6Linear,
    cached_swiglu_mlp,
    dequantize_e5m6,
    quantize_e5m6,
    round_e5m6,
)
from pylib.plan.options import Fp8Recipe
from pylib.plan.presets import tiny_moe
from pylib.runtime import ParallelConfig

H, F, TOKENS = 128, 256, 256  # two 1 x 128 tiles along the tokens
RECIPES = [Fp8Recipe(r) for r in ("delayed", "tensorwise", "blockwise", "mxfp8")]
E4M3_U = 2.0**-4  # E4M3 keeps 3 mantissa bits: round to nearest is off by at most half an ulp, 2**-4 of the value
E5M6_U = 2.0**-7  # E5M6 keeps 6: 2**-7


def _mlp(dtype) -> MLP:
    torch.manual_seed(0)
    mlp = MLP(H, F, "swiglu").to(dtype)
    for p in mlp.parameters():
        nn.init.normal_(p, std=H**-0.5)
    return mlp


def _grads(fn, mlp, x):
    x = x.detach().clone().requires_grad_()
    y = fn(x)
    dy = torch.linspace(-1, 1, y.numel(), dtype=torch.float64).reshape(y.shape).to(y.dtype)
    grads = torch.autograd.grad(y, [x, *mlp.parameters()], dy)
    return y, grads


def test_cached_swiglu_backward_equals_autograd_in_float64():
    mlp = _mlp(torch.float64)
    x = torch.randn(2, TOKENS // 2, H, dtype=torch.float64)
    y_ref, g_ref = _grads(mlp, mlp, x)
    y, g = _grads(lambda t: cached_swiglu_mlp(t, mlp, None), mlp, x)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-12)
    for a, b in zip(g, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.recipe)
def test_cached_swiglu_saves_what_the_planner_counts(recipe):
    mlp = _mlp(torch.bfloat16)
    x = torch.randn(TOKENS, H, dtype=torch.bfloat16, requires_grad=True)
    with saved_activations(exclude=list(mlp.parameters())) as saved:
        cached_swiglu_mlp(x, mlp, recipe)
    want = A.fp8_saved_input_bytes(TOKENS, H, recipe) + A.swiglu_cached_bytes(TOKENS, F, recipe)
    assert saved.bytes == want
    with saved_activations(exclude=list(mlp.parameters())) as plain:
        mlp(x)
    assert plain.bytes == (H + 4 * F) * TOKENS * 2  # x, gate x, silu(gate x), up x, their product: 16 bits each


def test_cached_swiglu_gradient_error_is_bounded():
    mlp64 = _mlp(torch.float64)
    mlp16 = copy.deepcopy(mlp64).to(torch.bfloat16)
    x = torch.randn(TOKENS, H, dtype=torch.float64)
    _, ref = _grads(mlp64, mlp64, x)
    _, bf16 = _grads(mlp16, mlp16, x.bfloat16())
    _, fp8 = _grads(lambda t: cached_swiglu_mlp(t, mlp16, Fp8Recipe("blockwise")), mlp16, x.bfloat16())
    for name, a, b, r in zip(("x", "gate", "up", "down"), fp8, bf16, ref, strict=True):
        e_fp8, e_bf16 = relative_error(a, r), relative_error(b, r)
        # every gradient is a product of at most three quantized factors (x, gate x, up x), each within 2**-4 of
        # its value elementwise: to first order at most 3 * 2**-4 relative, elementwise and so in norm when no
        # sum cancels; the errors' signs vary, so the measured error sits well below it (about 0.04 here)
        assert e_fp8 < 3 * E4M3_U, (name, e_fp8)
        # and above bf16's own (8 mantissa bits, 2**-9 per rounding, a few roundings per gradient)
        assert e_bf16 < 8 * 2.0**-9 < e_fp8, (name, e_bf16, e_fp8)


def test_round_e5m6_is_the_nearest_e5m6_value():
    codes = torch.arange(0, 1 << 12, dtype=torch.int32) << 4  # every E5M6 code as fp16's top 12 bits
    values = torch.where(codes >= 1 << 15, codes - (1 << 16), codes).to(torch.int16).view(torch.float16).float()
    grid = values[torch.isfinite(values)].unique()
    assert grid.numel() == 2 * (31 * 64) - 1  # 31 exponents of 64 mantissas each sign, one zero
    assert torch.equal(round_e5m6(grid), grid)
    torch.manual_seed(1)
    v = torch.randn(20000) * torch.exp2(torch.randint(-24, 15, (20000,)).float())
    v = v.clamp(-E5M6_MAX, E5M6_MAX)
    r = round_e5m6(v)
    assert torch.isin(r, grid).all()
    i = torch.searchsorted(grid, v.contiguous()).clamp(1, grid.numel() - 1)
    nearest = torch.minimum((grid[i] - v).abs(), (grid[i - 1] - v).abs())
    assert torch.equal((r - v).abs(), nearest)


def test_e5m6_round_trip_and_its_error():
    torch.manual_seed(2)
    x = torch.randn(64, 300) * torch.exp2(torch.randint(-6, 6, (64, 1)).float())  # 300: a partial last tile
    q = quantize_e5m6(x)
    assert q.nbytes == A.e5m6_saved_bytes(64, 300) == 64 * 300 * 3 // 2 + 64 * 3
    d = dequantize_e5m6(q)
    assert torch.equal(dequantize_e5m6(quantize_e5m6(d)), d)  # E5M6 values stay put
    scale = torch.exp2(q.exponent.float()).repeat_interleave(128, 1)[:, :300]
    # a value at or above the tile's 2**-14 scale is normal in E5M6: within half an ulp, 2**-7 of it; below,
    # a multiple of 2**-20 scale: within 2**-21 scale
    assert ((d - x).abs() <= torch.maximum(E5M6_U * x.abs(), 2.0**-21 * scale)).all()


def test_e5m6_linear_saves_what_the_planner_counts_and_bounds_the_weight_gradient():
    torch.manual_seed(3)
    lin = nn.Linear(H, 64, bias=True).double()
    x = torch.randn(96, H, dtype=torch.float64, requires_grad=True)
    e5m6 = E5M6Linear(lin)
    with saved_activations(exclude=list(lin.parameters())) as saved:
        y = e5m6(x)
    assert saved.bytes == A.e5m6_saved_bytes(96, H)
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, lin.weight, lin.bias], dy)
    want = torch.autograd.grad(lin(x), [x, lin.weight, lin.bias], dy)
    torch.testing.assert_close(y, lin(x), rtol=0, atol=0)  # the forward reads x itself
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)  # dX = dY W: no stored input in it
    torch.testing.assert_close(got[2], want[2], rtol=0, atol=0)
    # dW = dY^T X^ with every element of X^ within 2**-7 of X's (the tiles' scales keep these normal): to first
    # order at most 2**-7 relative wherever no sum cancels
    assert relative_error(got[1], want[1]) < E5M6_U


def _routed(dtype, tokens=24, h=16, n_experts=4, k=2):
    torch.manual_seed(4)
    x = torch.randn(tokens, h, dtype=dtype)
    experts = torch.stack([torch.randperm(n_experts)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k, dtype=dtype).requires_grad_()
    rows, plan = permute(x, experts, n_experts)
    return (rows * 1.5).detach().requires_grad_(), plan, weights


def test_fused_unpermute_equals_unpermute_in_float64():
    rows, plan, weights = _routed(torch.float64)
    out = {}
    for fused in (False, True):
        y = unpermute(rows, plan, weights, fused=fused)
        dy = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)
        out[fused] = (y, *torch.autograd.grad(y, [rows, weights], dy))
    for a, b in zip(out[True], out[False], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


def test_fused_unpermute_keeps_the_expert_outputs_once():
    rows, plan, weights = _routed(torch.bfloat16, tokens=64, h=32)
    kept = {}
    for fused in (False, True):
        with saved_activations() as saved:
            unpermute(rows, plan, weights, fused=fused)
        kept[fused] = saved.bytes
    assignments, h = rows.shape
    # the planner's row "expert outputs, weighted [T k, h] x 2" becomes one [T k, h]: the difference is one copy
    assert kept[False] - kept[True] == assignments * h * 2
    cfg_rows = {"expert outputs, weighted [T k, h] x 2": 2 * assignments * h * 2, "expert x": 0}
    plan = P.Plan(ParallelConfig())
    fused_rows = A.storage_rows(cfg_rows, tiny_moe(), plan, (0, 0, 0), None, ("fused_unpermute",))
    assert sum(cfg_rows.values()) - sum(fused_rows.values()) == kept[False] - kept[True]
    # the rows and their weights, and the token and slot indices that gather the weights (the plan's own vectors)
    assert kept[True] == assignments * (h + 1) * 2 + 2 * assignments * 8


def _ep_fused_worker(fused: bool):
    import torch.distributed as dist

    from pylib.ep import ExpertParallelMoE
    from pylib.plan.config import MoEConfig
    from pylib.runtime import Mesh
    from tests.conftest import seeded_forward_saving, seeded_moe

    mesh = Mesh(ParallelConfig(dp=2, ep=2))
    layer = ExpertParallelMoE.from_full(seeded_moe(MoEConfig(n_experts=4, top_k=2), 8, 16, "swiglu"), ep_group=mesh.ep)
    layer.dispatcher.fused_unpermute = fused
    saved, g, x, params, y = seeded_forward_saving(layer, seed=5 + dist.get_rank())
    grads = torch.autograd.grad(y, [x, *params], torch.randn(y.shape, generator=g, dtype=torch.float64))
    return saved.bytes, y.detach(), [t.detach() for t in grads]


@pytest.mark.slow
def test_the_all_to_all_combine_fused_keeps_one_copy_less_and_the_same_gradients_on_two_ranks():
    from pylib.runtime import launch

    plain, fused = (launch(_ep_fused_worker, 2, f) for f in (False, True))
    for (b0, y0, g0), (b1, y1, g1) in zip(plain, fused, strict=True):
        # T k assignments of h float64 each: the weighted rows the unfused index_add keeps
        assert b0 - b1 == 6 * 2 * 8 * 8
        torch.testing.assert_close(y1, y0, rtol=1e-13, atol=1e-13)
        for a, b in zip(g1, g0, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("recipe", [None, Fp8Recipe("blockwise")], ids=["bf16", "blockwise"])
def test_a_layer_with_w_o_in_e5m6_saves_what_layer_saved_rows_counts(recipe):
    """A whole reference layer (its linears in FP8 or not), W_O swapped for `E5M6Linear`: autograd's saved bytes
    plus the FP8 linears' kept X^T equal `layer_saved_rows` with storage ("attn_out_e5m6",)."""
    from pylib.model import ModelConfig, build_model, random_hidden
    from pylib.model.fp8 import to_fp8
    from tests.test_analysis_planner_fp8act import _fp8_kept_bytes

    cfg = ModelConfig(d_model=128, n_heads=2, d_ff=256, mlp="swiglu", n_layers=1, dtype="bfloat16", position="rope")
    block = build_model(cfg).layers[0]
    if recipe is not None:
        to_fp8(block, recipe, keep=())
    block.attn.o_proj = E5M6Linear(block.attn.o_proj)
    x = random_hidden(1, 128, cfg.d_model, dtype=torch.bfloat16).detach().requires_grad_()
    with saved_activations(exclude=list(block.parameters())) as saved:
        y = block(x)
    measured = saved.bytes + _fp8_kept_bytes(y)
    rows = A.layer_saved_rows(cfg, 0, 1, 128, P.Plan(ParallelConfig()), attention="math", fp8=recipe,
                              fp8_fused=False, storage=("attn_out_e5m6",))  # fmt: skip
    assert rows["W_O input (attention output) [E5M6]"] == A.e5m6_saved_bytes(128, 128)
    assert measured == sum(rows.values())


def _ep_storage_worker(storage: tuple[str, ...]):
    import torch.distributed as dist

    from pylib.ep import ExpertParallelMoE
    from pylib.model import ModelConfig
    from pylib.plan.config import MoEConfig
    from pylib.runtime import Mesh
    from tests.conftest import seeded_moe

    mesh = Mesh(ParallelConfig(dp=2, ep=2))
    moe = MoEConfig(n_experts=2, top_k=2)  # one expert a rank: one FP8 scale per cached tensor, as the planner counts
    cfg = ModelConfig(d_model=8, d_ff=16, n_heads=2, n_layers=1, mlp="swiglu", dtype="float32", moe=moe)
    layer = ExpertParallelMoE.from_full(seeded_moe(moe, 8, 16, "swiglu").float(), ep_group=mesh.ep)
    recipe = Fp8Recipe("tensorwise")
    layer.experts.swiglu_fp8 = recipe if "swiglu_fp8" in storage else None
    layer.dispatcher.fused_unpermute = "fused_unpermute" in storage
    g = torch.Generator().manual_seed(5 + dist.get_rank())
    x = torch.randn(1, 6, 8, generator=g, requires_grad=True)
    with saved_activations(exclude=list(layer.parameters())) as saved:
        layer(x)
    R = int(sum(layer.last_state.rows_per_local_expert))
    plan = P.Plan(ParallelConfig())
    rows = A.moe_saved_rows(cfg, 6, expert_rows=R)
    if storage:  # the experts' input and hidden rows in FP8 (the cached function keeps x too), then the storage
        rows = A.fp8_rows(rows, cfg, recipe, plan, 1, 6, expert_rows=R)
        rows = A.storage_rows(rows, cfg, plan, (6, R, 6), recipe, storage)
    return saved.bytes, sum(rows.values())


@pytest.mark.slow
def test_an_ep_moe_layer_with_v3_storage_saves_what_the_planner_counts_on_two_ranks():
    from pylib.runtime import launch

    for storage in ((), ("swiglu_fp8", "fused_unpermute")):
        for measured, counted in launch(_ep_storage_worker, 2, storage):
            assert measured == counted, storage
