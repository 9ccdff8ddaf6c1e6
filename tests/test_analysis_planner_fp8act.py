"""The planner's saved activations under FP8: each FP8 linear keeps its input as `Fp8Linear` keeps it (X^T in E4M3
with its scales), measured byte for byte on pylib's reference layer, and what that changes for DeepSeek-V3."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from pylib.analysis import activations as A
from pylib.analysis import calibration as C
from pylib.analysis import planner as P
from pylib.model import ModelConfig, build_model, random_hidden, saved_activations, torch_dtype
from pylib.model.fp8 import quantize_operand, to_fp8
from pylib.plan import RunOptions
from pylib.plan.options import Fp8Recipe
from pylib.plan.presets import llama2_7b
from pylib.runtime import ParallelConfig

RECIPES = [Fp8Recipe(r) for r in ("delayed", "tensorwise", "blockwise", "mxfp8")]
B, S = 1, 128  # 128 tokens: a whole 1 x 128 tile along the tokens


def _fp8_kept_bytes(out: torch.Tensor) -> int:
    """Bytes the FP8 linears of out's graph keep for their weight gradients: each `_Fp8LinearFunction` node (the
    custom Function's ctx) holds X^T in FP8 as ctx.qxt, outside autograd's saved-tensor hooks."""
    seen, stack, total = set(), [out.grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        q = getattr(node, "qxt", None)
        if q is not None:
            total += q.nbytes
        stack += [f for f, _ in node.next_functions]
    return total


def _measured(cfg: ModelConfig, recipe: Fp8Recipe | None) -> int:
    block = build_model(cfg).layers[0]
    if recipe is not None:
        to_fp8(block, recipe, keep=())
    x = random_hidden(B, S, cfg.d_model, dtype=torch_dtype(cfg.dtype)).detach().requires_grad_()
    with saved_activations(exclude=list(block.parameters())) as saved:
        y = block(x)
    return saved.bytes + _fp8_kept_bytes(y)


def _cfg(mlp: str, **kw) -> ModelConfig:
    return ModelConfig(d_model=128, n_heads=2, d_ff=256, mlp=mlp, n_layers=1, dtype="bfloat16", **kw)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.recipe)
@pytest.mark.parametrize("mlp", ["swiglu", "gelu"])
def test_fp8_layer_saved_bytes_equal_what_pylibs_fp8_linears_keep(recipe, mlp):
    cfg = _cfg(mlp, position="rope") if mlp == "swiglu" else _cfg(mlp, causal=False)
    plan = P.Plan(ParallelConfig())
    bf16 = A.layer_saved_rows(cfg, 0, B, S, plan, attention="math")
    fp8 = A.layer_saved_rows(cfg, 0, B, S, plan, attention="math", fp8=recipe, fp8_fused=False)
    assert sum(bf16.values()) == _measured(cfg, None)
    assert sum(fp8.values()) == _measured(cfg, recipe)
    assert sum(fp8.values()) < sum(bf16.values())


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.recipe)
def test_fp8_saved_input_bytes_are_the_quantized_transpose_with_its_scales(recipe):
    x = torch.randn(256, 64)
    assert A.fp8_saved_input_bytes(256, 64, recipe) == quantize_operand(x.t(), recipe, "input").nbytes


def test_fused_qkv_and_fc1_keep_one_fp8_copy_of_their_input():
    cfg, recipe, plan = _cfg("swiglu"), Fp8Recipe("tensorwise"), P.Plan(ParallelConfig())
    apart = sum(A.layer_saved_rows(cfg, 0, B, S, plan, fp8=recipe, fp8_fused=False).values())
    fused = sum(A.layer_saved_rows(cfg, 0, B, S, plan, fp8=recipe).values())
    copy = A.fp8_saved_input_bytes(B * S, cfg.d_model, recipe)
    assert apart - fused == (2 + 1) * copy  # q, k, v: two copies more; gate, up: one


def test_planner_prices_fp8_activations_and_keeps_the_bf16_ends_in_16_bits():
    cfg = llama2_7b()
    plan = P.Plan(ParallelConfig(tp=2, pp=2, dp=2), RunOptions(n_microbatches=4, zero_stage=1, sequence_parallel=True))
    work = P.Workload(16, 4096)
    acts = {
        name: P.rank_memory(cfg, plan, replace(work, fp8=r), 0, 8)["activations"]
        for name, r in [
            ("bf16", None),
            ("fp8", Fp8Recipe("blockwise")),
            ("ends", Fp8Recipe("blockwise", first_last_layers_bf16=True)),
        ]
    }
    assert acts["fp8"] < acts["ends"] < acts["bf16"]
    # the first layer sits on rank 0: its peak holds it once per microbatch in flight, 16-bit with the ends option
    b = plan.micro_batch(work.batch)
    one = {
        r: sum(A.layer_saved_rows(cfg, 0, b, 4096, plan, fp8=f).values())
        for r, f in [("bf16", None), ("fp8", Fp8Recipe("blockwise"))]
    }
    in_flight = 2  # 1F1B, pp 2, rank 0: min(p - r, m) microbatches
    assert acts["ends"] - acts["fp8"] == in_flight * (one["bf16"] - one["fp8"])


def test_deepseek_v3_fp8_run_stores_less_and_computes_faster_than_its_bf16_pricing():
    check = C.moe_layout_check()
    fp8 = check.fp8_report
    assert check.workload.fp8 is None and check.fp8_workload.fp8 == C.DEEPSEEK_V3_FP8
    assert fp8.plan == check.report.plan
    acts = [x.worst_rank().memory["activations"] for x in (check.report, fp8)]
    assert acts[1] < acts[0]
    assert fp8.compute_time < check.report.compute_time


def test_fp8_weight_shapes_leave_out_the_router_and_keep_the_shared_experts():
    check = C.moe_layout_check()
    cfg, plan = check.cfg, check.report.plan
    shapes = P.fp8_weight_shapes(cfg, plan, 1)
    h, n_experts, f_s = cfg.d_model, cfg.moe.n_experts, cfg.moe.n_shared_experts * cfg.moe.d_ff
    assert (n_experts, h) not in shapes  # the router, [E, h], in 16 bits
    assert shapes.count((h, f_s)) == shapes.count((2 * f_s, h)) > 0  # the shared experts' down and fc1, in FP8
