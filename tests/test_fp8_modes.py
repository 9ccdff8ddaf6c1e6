"""FP8 across the parallel modes: TP/SP linears (pylib.tp.fp8) equal the single-device FP8 run -- the same bits where
the math is the same, within fp32 summation order where TP sums partial products -- with the traced bytes equal to
the formulas of pylib.analysis.fp8 (the SP gather in bf16 and in FP8); bad inputs refused by name."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from pylib.analysis.fp8 import amax_allreduce_bytes, sp_input_gather_bytes, tp_amax_allreduces
from pylib.experiments import fp8_runs as R
from pylib.plan.options import FP8_RECIPES, Fp8Recipe
from pylib.runtime import launch
from pylib.tp.fp8 import AMAX_TAG, tp_fp8_problems

# TP over 4 ranks on the smallest MLP every recipe divides: h_ffn / 4 = 128, one blockwise tile a rank; 2 x 64 = 128
# tokens (wgrad's K), s / 4 = 16 tokens a rank under SP. fp32 activations, so "same math" means the same bits.
T, B, S, H, H_FFN = 4, 2, 64, 128, 512
# Where TP adds t partial products that one device adds inside one GEMM, the fp32 sums are associated differently:
# each output picks up at most t - 1 more roundings of 2^-24 relative to partial sums no larger than the output's
# scale. 2^-18 relative to the largest output leaves 16x room over t - 1 = 3 such roundings.
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
            assert 4 * fp8["gather"] == bf16["gather"] and fp8["amax"] == amax_allreduce_bytes(T)
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
