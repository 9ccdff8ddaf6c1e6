"""FP8 across the parallel modes: TP/SP linears (pylib.tp.fp8) equal the single-device FP8 run -- the same bits where
the math is the same, within fp32 summation order where TP sums partial products -- with the traced bytes equal to
the formulas of pylib.analysis.fp8 (the SP gather in bf16 and in FP8); bad inputs refused by name."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from pylib.analysis.fp8 import (
    amax_allreduce_bytes,
    fp8_param_gather_bytes,
    sp_input_gather_bytes,
    tp_amax_allreduces,
)
from pylib.experiments import fp8_runs as R
from pylib.plan.options import FP8_RECIPES, Fp8Recipe, MixedPrecision
from pylib.runtime import launch
from pylib.tp.fp8 import AMAX_TAG, tp_fp8_problems

# TP over 2 ranks on the smallest MLP every recipe divides: h_ffn / 2 = 128, one blockwise tile a rank; 2 x 64 = 128
# tokens (wgrad's K), s / 2 = 32 tokens a rank under SP. fp32 activations, so "same math" means the same bits.
T, B, S, H, H_FFN = 2, 2, 64, 128, 256
# Where TP adds t partial products that one device adds inside one GEMM, the fp32 sums are associated differently:
# each output picks up at most t - 1 more roundings of 2^-24 relative to partial sums no larger than the output's
# scale. 2^-18 relative to the largest output leaves 16x room over 4 such roundings (t up to 5).
SUM_ORDER_RTOL = 2.0**-18


def _cases():
    out = []
    for name in FP8_RECIPES:
        out += [(Fp8Recipe(name), False), (Fp8Recipe(name), True)]
        if name in ("delayed", "tensorwise"):
            out.append((Fp8Recipe(name, input_gather=True), True))
    return out


CASES = _cases()


def _case_id(case) -> str:
    recipe, sp = case
    return f"{recipe.recipe}-{'sp' if sp else 'tp'}{'-fp8gather' if recipe.input_gather else ''}"


@pytest.fixture(scope="module")
def tp_runs():
    inputs = R.mlp_inputs(B, S, H, steps=2)
    ranks = launch(R.tp_fp8_mlp, T, CASES, H, H_FFN, inputs, backend="gloo", timeout=300)
    refs = {c[0]: R.fp8_mlp_reference(c[0], H, H_FFN, inputs) for c in CASES if not c[1]}  # SP changes no math
    return refs, ranks


def _whole(ranks, i, sp):
    per = [r[i] for r in ranks]
    cat = (lambda k: torch.cat([p[k] for p in per], 1)) if sp else (lambda k: per[0][k])
    return dict(
        y=cat("y"),
        dx=cat("dx"),
        up_w=torch.cat([p["up_w"] for p in per], 0),
        up_b=torch.cat([p["up_b"] for p in per], 0),
        down_w=torch.cat([p["down_w"] for p in per], 1),
        events=per[0]["events"],
    )


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(CASES)), ids=[_case_id(c) for c in CASES])
def test_fp8_tp_mlp_equals_the_single_device_fp8_run(tp_runs, i):
    refs, ranks = tp_runs
    recipe, sp = CASES[i]
    got, want = _whole(ranks, i, sp), refs[Fp8Recipe(recipe.recipe)]
    # the FP8 operands of both weight gradients are the single device's bits: the same products
    for k in ("up_w", "up_b", "down_w"):
        assert torch.equal(got[k], want[k]), k
    # the row-parallel output and the column-parallel dx add t partial products in another order
    for k in ("y", "dx"):
        err = float((got[k] - want[k]).abs().max() / want[k].abs().max())
        assert err <= SUM_ORDER_RTOL, (k, err)


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(CASES)), ids=[_case_id(c) for c in CASES])
def test_fp8_tp_traced_bytes_equal_the_formulas(tp_runs, i):
    _, ranks = tp_runs
    recipe, sp = CASES[i]
    events = _whole(ranks, i, sp)["events"]
    amax = [e for e in events if e[1].startswith(AMAX_TAG)]
    assert len(amax) == tp_amax_allreduces(recipe, sp)
    assert all(e[0] == "all_reduce" and e[3] == amax_allreduce_bytes(T) for e in amax)
    gathers = Counter()
    for op, _, dtype, sent in events:
        gathers[dtype] += sent if op == "all_gather" else 0
    gathers = {k: v for k, v in gathers.items() if v}
    if sp:  # forward: the input gather (fp32 here, or FP8 bytes); backward: the row's conjugate gather of dY
        bf16 = sp_input_gather_bytes(B, S, H, T, 4)
        fp8 = sp_input_gather_bytes(B, S, H, T, 4, recipe)
        if recipe.input_gather:
            assert gathers == {"uint8": fp8["gather"], "float32": bf16["gather"]}
            assert 4 * fp8["gather"] == bf16["gather"] and fp8["amax"] == amax_allreduce_bytes(T)  # 1 byte vs fp32
        else:
            assert gathers == {"float32": 2 * bf16["gather"]}
    else:
        assert not gathers


def test_a_block_that_does_not_divide_the_tp_shard_is_refused_naming_the_numbers():
    bad = tp_fp8_problems(Fp8Recipe("blockwise"), "column", (256, 128), 4)
    assert "256 / tp=4 = 64" in bad[0] and "64 % 128 = 64" in bad[0]
    assert "in_features: 512 / tp=2 = 256" not in " ".join(tp_fp8_problems(Fp8Recipe("mxfp8"), "row", (128, 512), 2))
    assert tp_fp8_problems(Fp8Recipe("mxfp8"), "row", (128, 96), 2)[0].endswith("(a tile would straddle two ranks)")
    assert tp_fp8_problems(Fp8Recipe("tensorwise"), "row", (128, 96), 2) == []  # one scale, agreed by all-reduce
    assert "tp=3 does not divide" in tp_fp8_problems(Fp8Recipe("tensorwise"), "column", (128, 128), 3)[0]


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(recipe="blockwise", input_gather=True), "2.0625 bytes per element, more than bf16's 2"),
        (dict(recipe="mxfp8", input_gather=True), "a scale per 32"),
        (dict(recipe="mxfp8", param_gather=True), "param_gather=True is not for mxfp8"),
        (dict(recipe="tensorwise", first_last_layers_bf16="yes"), "first_last_layers_bf16='yes'"),
    ],
)
def test_an_fp8_gather_the_recipe_cannot_do_is_refused_naming_why(kw, words):
    with pytest.raises((TypeError, ValueError), match=words):
        Fp8Recipe(**kw)


def test_the_fp8_sp_gather_moves_half_the_bf16_bytes():
    bf16 = sp_input_gather_bytes(2, 4096, 8192, 8, 2)
    fp8 = sp_input_gather_bytes(2, 4096, 8192, 8, 2, Fp8Recipe("tensorwise", input_gather=True))
    assert 2 * fp8["gather"] == bf16["gather"] == 7 * 2 * 512 * 8192 * 2 and fp8["amax"] == 7


# ------------------------------------------------------------------------------------------------ ZeRO-3 FP8 gather
D = 3  # the FP8 flat (131,072 elements, padded to 131,073) is cut inside v_proj and inside up_proj: those
# weights' amaxes, and blockwise's blocks there, are agreed between two ranks
# delayed twice (bf16 gather, FP8 gather): one device cannot replay its amax histories (below); the others once
Z3_CASES = [(Fp8Recipe("delayed"), 1)] + [(Fp8Recipe(r, param_gather=True), 1) for r in FP8_RECIPES[:3]]
Z3_CASES.append((Fp8Recipe("tensorwise", param_gather=True, first_last_layers_bf16=True), 3))
# Against one device running the d micro-batches in turn (SingleDeviceMixed, the d ranks' rounding points), the
# only change is the order of the fp32 gradient sum: reduce-scatter over d ranks against d sequential adds, at most
# d - 1 roundings of 2^-24 each relative to the largest gradient; 2^-20 leaves 8x room.
GRAD_SUM_RTOL = 2.0**-20


@pytest.fixture(scope="module")
def z3_runs():
    return launch(R.zero3_fp8_run, D, Z3_CASES, backend="gloo", timeout=300)


def _z3(ranks, i):
    per = [r[i] for r in ranks]
    grads = {}
    for key, entries in per[0]["layouts"].items():
        flat = torch.cat([p["grads"][key] for p in per])
        grads.update({name: flat[off : off + n].view(shape) for name, off, n, shape in entries})
    losses = [sum(p["losses"][s] for p in per) / D for s in range(len(per[0]["losses"]))]
    return dict(losses=losses, grads=grads, events=per[0]["events"], padded=per[0]["padded"])


@pytest.mark.slow
def test_the_fp8_parameter_gather_is_the_bf16_gather_run_bit_for_bit_under_delayed_scaling(z3_runs):
    """One device runs the d micro-batches in turn, so its delayed amax histories record d amaxes a step where each
    rank records one: delayed scaling is checked against its own bf16-gather ZeRO-3 run instead (the forward's
    weight scales, recorded once and reused by the backward's gather, must be the bf16 run's)."""
    fp8, bf16 = _z3(z3_runs, 1), _z3(z3_runs, 0)
    assert fp8["losses"] == bf16["losses"]
    assert all(torch.equal(fp8["grads"][n], g) for n, g in bf16["grads"].items())


@pytest.mark.slow
@pytest.mark.parametrize("i", [2, 3, 4], ids=["tensorwise", "blockwise", "first-last-bf16"])
def test_zero3_with_the_fp8_gather_equals_the_single_device_fp8_run(z3_runs, i):
    recipe, n_layers = Z3_CASES[i]
    got = _z3(z3_runs, i)
    losses, grads = R.fp8_single_device(recipe, n_layers, D)
    assert got["losses"] == losses  # the same FP8 bits each micro-batch; Adam's step from sums within fp32 order
    for name, want in grads.items():
        err = float((got["grads"][name] - want).abs().max() / want.abs().max())
        assert err <= GRAD_SUM_RTOL, (name, err)


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(Z3_CASES)))
def test_zero3_fp8_gather_bytes_equal_the_formula_and_half_the_bf16_gather(z3_runs, i):
    recipe, n_layers = Z3_CASES[i]
    run = _z3(z3_runs, i)
    precision = MixedPrecision(grad_reduce="float32", fp8=recipe)
    kept = {f"layers.{j}" for j in ((0, n_layers - 1) if recipe.first_last_layers_bf16 else ())}
    for j in range(n_layers):
        unit = f"layers.{j}"
        fp8_key = f"{unit}.fp8"
        gathers = [e for e in run["events"] if e[0] == "all_gather" and e[1] == f"zero3.{fp8_key}"]
        amax = [e for e in run["events"] if e[1] == f"fp8.amax.param.zero3.{fp8_key}"]
        if unit in kept or not recipe.param_gather:
            assert not gathers and fp8_key not in run["padded"]  # the unit's linears gather in bf16
            continue
        shapes = [(128, 128)] * 4 + [(256, 128), (128, 256)]  # q, k, v, o; up, down
        want = fp8_param_gather_bytes(shapes, run["padded"][fp8_key], D, precision)
        assert [(e[2], e[3], e[4]) for e in gathers] == [
            ("uint8", "forward", want["gather"]),
            ("uint8", "backward", want["gather"]),
        ]
        assert [e[4] for e in amax] == [want["amax"]] and 2 * want["gather"] == want["bf16"]


# ------------------------------------------------------------------------------------------ what stays high precision
def test_first_last_layers_bf16_keeps_the_first_and_last_layer_and_the_lm_head_out_of_fp8():
    from pylib.model import build_model
    from pylib.model.fp8 import fp8_layers, to_fp8

    def fp8_names(recipe):
        model = to_fp8(build_model(R.fp8_layers_model(3)), recipe)
        return {n.rpartition(".")[0].rpartition(".")[0] for n, m in model.named_modules() if m in fp8_layers(model)}

    assert fp8_names(Fp8Recipe("tensorwise")) == {"layers.0", "layers.1", "layers.2"}  # the LM head: never
    assert fp8_names(Fp8Recipe("tensorwise", first_last_layers_bf16=True)) == {"layers.1"}


def test_the_fp8_parameter_gather_outside_zero3_is_refused_before_the_model_is_touched():
    from pylib.dp import wrap
    from pylib.model import build_model

    model = build_model(R.fp8_test_model())
    precision = MixedPrecision(fp8=Fp8Recipe("tensorwise", param_gather=True))
    with pytest.raises(ValueError, match="needs zero_stage 3, got zero1"):
        wrap(model, "zero1", precision=precision)
    assert model.lm_head.weight.dtype == torch.float32  # not cast


def test_the_fp8_parameter_gather_formula_is_half_the_bf16_gather_plus_the_scales():
    precision = MixedPrecision(fp8=Fp8Recipe("blockwise", param_gather=True))
    got = fp8_param_gather_bytes([(256, 128), (128, 256)], 65536, 4, precision)
    assert got == dict(gather=49152, amax=amax_allreduce_bytes(4, 4), bf16=98304) and got["amax"] == 24
