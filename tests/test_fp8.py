"""FP8 linear layers (pylib.model.fp8) and their recipe (pylib.plan.options.Fp8Recipe): bad recipes refused by name,
each recipe's quantizer against its definition, torch._scaled_mm against the emulated path bit for bit where both
apply, and the three GEMMs of a layer close to fp32."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from pylib.model import build_model
from pylib.model import fp8 as F8
from pylib.plan.config import ModelConfig
from pylib.plan.options import FP8_RECIPES, Fp8Recipe, MixedPrecision

E4M3 = torch.float8_e4m3fn


@pytest.fixture(autouse=True)
def one_thread():
    """torch._scaled_mm on this CPU pays ~50 ms a call for its threads on a busy machine, 0.1 ms on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _layer(recipe, path="scaled_mm", n=256, k=128, seed=0):
    torch.manual_seed(seed)
    return F8.Fp8Linear(nn.Linear(k, n, bias=False), Fp8Recipe(recipe), path)


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(recipe="int8"), "recipe='int8' must be one of"),
        (dict(recipe="delayed", fmt="e5m2"), "fmt='e5m2' must be one of"),
        (dict(recipe="mxfp8", block=16), "block=16 must be 32"),
        (dict(recipe="tensorwise", block=128), "one scale per tensor"),
        (dict(recipe="delayed", amax_compute_algo="mean"), "amax_compute_algo='mean'"),
        (dict(recipe="delayed", margin=-1), "margin=-1"),
    ],
)
def test_a_bad_fp8_recipe_is_refused_naming_the_field(kw, words):
    with pytest.raises(ValueError, match=words):
        Fp8Recipe(**kw)


def test_each_recipe_takes_transformer_engines_default_format():
    assert {r: Fp8Recipe(r).fmt for r in FP8_RECIPES} == {
        "delayed": "hybrid",
        "tensorwise": "hybrid",
        "blockwise": "e4m3",
        "mxfp8": "e4m3",
    }
    assert Fp8Recipe("delayed").grad_format == "e5m2" and Fp8Recipe("blockwise").grad_format == "e4m3"
    with pytest.raises(TypeError, match="fp8=.*Fp8Recipe"):
        MixedPrecision(fp8="delayed")


def test_a_block_that_does_not_divide_a_layer_is_refused_naming_the_layer_and_numbers():
    with pytest.raises(F8.Fp8ShapeError, match="out_features=48 is not a multiple of the blockwise block 128"):
        F8.Fp8Linear(nn.Linear(128, 48, bias=False), Fp8Recipe("blockwise"))
    model = build_model(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, d_ff=64))
    with pytest.raises(F8.Fp8ShapeError, match=r"layers.0.attn.q_proj \[32, 32\]: .*in_features=32 .* block 128"):
        F8.to_fp8(model, Fp8Recipe("blockwise"))
    layer = _layer("mxfp8")
    with pytest.raises(F8.Fp8ShapeError, match="tokens=40 is not a multiple of the mxfp8 block 32"):
        layer(torch.randn(40, 128))


def test_mxfp8_runs_without_torchs_e8m0_dtype(monkeypatch):
    """torch 2.6 has E4M3 and E5M2 but not float8_e8m0fnu: MXFP8 keeps its scales as E8M0 bytes, the same bits."""
    scales = torch.exp2(torch.arange(-20.0, 21.0))
    assert torch.equal(F8.e8m0_encode(scales), scales.to(torch.float8_e8m0fnu).view(torch.uint8))
    monkeypatch.delattr(torch, "float8_e8m0fnu")
    layer = _layer("mxfp8", "emulated")
    x = torch.randn(32, 128).requires_grad_()
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight_fp8[0].scale.dtype == torch.uint8


def test_per_tensor_scaling_maps_the_amax_to_the_formats_largest_value():
    x = torch.randn(64, 96) * 3
    q = F8.quantize(x, E4M3)
    assert float(q.data.float().abs().max()) == 448.0
    assert float(q.scale) == pytest.approx(float(x.abs().max()) / 448.0, rel=1e-7)
    assert F8.relative_error(q.dequantize(), x) < 0.04  # 3 mantissa bits


def test_blockwise_scales_one_per_tile_and_block_each_tile_reaching_448():
    x = torch.randn(4, 256)
    x[:, 5] *= 1e5  # an outlier channel in the first tile only
    q = F8.quantize(x, E4M3, (1, 128))
    assert q.scale.shape == (4, 2) and q.scale.dtype == torch.float32
    assert torch.equal(q.data.float().abs().view(4, 2, 128).amax(-1), torch.full((4, 2), 448.0))
    assert F8.relative_error(q.dequantize()[:, 128:], x[:, 128:]) < 0.04  # the second tile does not see it
    w = F8.quantize(torch.randn(256, 384), E4M3, (128, 128))
    assert w.scale.shape == (2, 3)


def test_mxfp8_scales_are_powers_of_two_in_e8m0_that_keep_every_block_in_range():
    x = torch.randn(8, 64) * 7
    q = F8.quantize(x, E4M3, (1, 32), power_of_two=True)
    assert q.scale.dtype == torch.uint8 and q.scale.shape == (8, 2)  # E8M0 bytes
    s = q.scale_fp32()
    assert torch.equal(torch.exp2(torch.log2(s).round()), s)
    amax = x.abs().view(8, 2, 32).amax(-1)
    assert bool((amax / s <= 448).all()) and bool((amax / s > 224).all())  # the smallest such power of two
    assert q.nbytes == 8 * 64 + 8 * 2  # one byte per element, one per block of 32


def test_delayed_scaling_uses_the_history_max_or_the_most_recent_amax_and_the_margin():
    for algo, want in (("max", 4.0), ("most_recent", 1.0)):
        h = F8.AmaxHistory(Fp8Recipe(amax_history_len=4, amax_compute_algo=algo), E4M3)
        assert float(h.scale) == 1.0  # TE starts at scale 1
        h.record(torch.tensor(4.0))
        h.record(torch.tensor(1.0))
        assert float(h.scale) == pytest.approx(want / 448)
    h = F8.AmaxHistory(Fp8Recipe(amax_history_len=2, margin=1), E4M3)
    for a in (8.0, 1.0, 1.0):
        h.record(torch.tensor(a))
    assert float(h.scale) == pytest.approx(2 * 1.0 / 448)  # 8 left the window of two; margin 1 doubles it


def test_delayed_scaling_quantizes_with_the_scale_of_the_steps_before():
    layer = _layer("delayed")
    x = torch.randn(32, 128)
    layer(x)
    first = float(layer.amax["input"].scale)
    assert first == pytest.approx(float(x.abs().max()) / 448)
    q, _ = layer.quantize_input(x * 2)  # a larger input is clipped at the old scale
    assert float(q.data.float().abs().max()) == 448.0
    assert float(q.scale) == first


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_scaled_mm_and_the_emulated_path_give_the_same_bits_per_tensor(recipe):
    outs = {}
    for path in F8.PATHS:
        layer = _layer(recipe, path, n=64)
        x = torch.randn(32, 128, generator=torch.Generator().manual_seed(1)).requires_grad_()
        for _ in range(2):  # the second step uses the history of the first
            y = layer(x)
            x.grad = layer.weight.grad = None
            y.backward(torch.randn(32, 64, generator=torch.Generator().manual_seed(2)) * 1e-3)
        outs[path] = y.detach(), x.grad, layer.weight.grad
    for a, b in zip(outs["scaled_mm"], outs["emulated"]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("recipe, tile, wtile", [("blockwise", (1, 128), (128, 128)), ("mxfp8", (1, 32), (1, 32))])
def test_block_scaled_mm_equals_the_emulated_path_in_one_block_and_to_fp32_rounding_across_blocks(recipe, tile, wtile):
    mx = recipe == "mxfp8"
    g = torch.Generator().manual_seed(3)
    for k, exact in ((tile[1], True), (4 * tile[1], False)):
        a = F8.quantize(torch.randn(32, k, generator=g), E4M3, tile, power_of_two=mx)
        b = F8.quantize(torch.randn(tile[1] if mx else 128, k, generator=g), E4M3, wtile, power_of_two=mx)
        got, want = F8.fp8_mm(a, b, "scaled_mm"), F8.fp8_mm(a, b, "emulated")
        if exact:
            assert torch.equal(got, want)
        else:  # the same products, the fp32 partial sums added in another order
            assert F8.relative_error(got, want) < 1e-6


@pytest.mark.parametrize("recipe", FP8_RECIPES)
def test_the_three_gemms_of_an_fp8_layer_stay_within_fp8_rounding_of_fp32(recipe):
    layer = _layer(recipe, "emulated")
    w = layer.weight.detach().clone()
    x = torch.randn(128, 128).requires_grad_()  # 128 tokens: one blockwise tile along wgrad's K
    dy = torch.randn(128, 256) * 1e-3
    layer(x).backward(dy)
    # rounding to 3 (E4M3) or 2 (E5M2) mantissa bits moves an element by at most 2**-4 or 2**-3 of itself, about a
    # third of that on average: a product's relative error near 0.03 or 0.06; a wrong scale or tile is off by far more
    bound = 0.09 if Fp8Recipe(recipe).grad_format == "e5m2" else 0.045
    assert F8.relative_error(layer(x.detach()), x.detach() @ w.t()) < 0.045
    assert F8.relative_error(x.grad, dy @ w) < bound
    assert F8.relative_error(layer.weight.grad, dy.t() @ x.detach()) < bound
    assert F8.relative_error(x.grad, dy @ w) > 1e-3  # quantized: not the fp32 product


def test_to_fp8_keeps_the_lm_head_and_mixed_precision_applies_the_recipe():
    from pylib.dp.mixed import cast_module

    cfg = ModelConfig(vocab_size=128, d_model=128, n_layers=1, n_heads=2, d_ff=256)
    model = cast_module(build_model(cfg), MixedPrecision(grad_reduce="float32", fp8=Fp8Recipe("blockwise")))
    names = {n for n, m in model.named_modules() if isinstance(m, F8.Fp8Linear)}
    assert names == {f"layers.0.{m}" for m in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj")} | {
        "layers.0.mlp.up_proj",
        "layers.0.mlp.down_proj",
    }
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight.dtype == torch.bfloat16
    ids = torch.randint(0, 128, (2, 64))
    model.loss(ids, ids).backward()
    assert all(p.grad is not None and p.grad.dtype == torch.bfloat16 for p in model.parameters())
