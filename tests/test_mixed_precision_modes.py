"""Each parallel mode in bf16 mixed precision (bf16 compute, fp32 master weights and Adam state) against the
single-device run of the same recipe on the same batches (`SingleDeviceMixed`, one thread as every launched rank).

Each rank keeps `MasterWeights` over its own parameters (its shards, or its replicas of the replicated ones) and
steps them with the gradient the mode's float64 tests reduce. Where the mode keeps one device's rounding points the
run is equal; where it adds one (TP's bf16 partial sums before the all-reduce, CP's block-wise softmax merge and
its bf16 gradient all-reduce) it is near, within a bound stated from measurement: the loss within a relative
tolerance, each parameter within a few lr -- Adam moves every element by about lr whatever its gradient's size, so
an element whose gradient is near zero may step the other way (as the composed tp2-dp2 test in
test_dp_mixed_precision.py measures)."""

import pytest
import torch
import torch.distributed as dist

from pylib.dp import SingleDeviceMixed
from pylib.dp.mixed import MasterWeights
from pylib.model import build_model, random_tokens
from pylib.plan.config import MoEConfig
from pylib.plan.options import MixedPrecision
from pylib.plan.presets import tiny, tiny_gqa
from pylib.runtime import launch
from tests.conftest import seeded_moe

RECIPE = MixedPrecision("bfloat16", grad_reduce="float32")
STEPS, LR = 3, 1e-2


def _batches(cfg, b, s):
    return [random_tokens(cfg, b, s, seed=k) for k in range(STEPS)]


def _reference(cfg, batches):
    """The recipe on one device (one micro-batch: no data parallelism here), on one thread as every rank is."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = SingleDeviceMixed(build_model(cfg), RECIPE, parts=1, lr=LR)
        losses = [ref.train_step(ids, targets) for ids, targets in batches]
    finally:
        torch.set_num_threads(threads)
    for p, m in zip(ref.params, ref.weights.master):
        assert p.dtype == torch.bfloat16 and m.dtype == torch.float32
    return losses, {n: p.detach() for n, p in ref.module.named_parameters()}


def _train(model, batches, loss_of, reduce):
    """bf16 forward and backward on this rank, `reduce()` the gradients as the mode requires, fp32 master step."""
    params = list(model.parameters())
    assert all(p.dtype == torch.bfloat16 for p in params)
    weights = MasterWeights(params, RECIPE, torch.optim.Adam, lr=LR)
    losses = []
    for ids, targets in batches:
        loss = loss_of(ids, targets)
        loss.backward()
        reduce()
        weights.step([p.grad for p in params])
        for p in params:
            p.grad = None
        losses.append(float(loss.detach()))
    return losses


def _errors(losses, params, ref_losses, ref_params):
    assert sorted(params) == sorted(ref_params)
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    param_err = 0.0
    for n, p in ref_params.items():
        assert params[n].dtype == torch.bfloat16, n
        param_err = max(param_err, float((params[n].float() - p.float()).abs().max()))
    return loss_err, param_err


# ------------------------------------------------------------------------------------------------ TP + SP

TP_CFG = tiny().with_(n_layers=2, dtype="bfloat16")


def _tp_rank(batches, sp, reduced=True):
    from pylib.tp import TPTransformer, gather_full

    tp = TPTransformer.from_full(build_model(TP_CFG), sequence_parallel=sp)
    losses = _train(
        tp, batches, tp.loss, tp.finalize_grads if reduced else lambda: None
    )  # finalize: the SP LayerNorm grads summed over tp
    return losses, {n: p.detach() for n, p in gather_full(tp).items()}


@pytest.mark.parametrize("sp", [True, False], ids=["sp", "no-sp"])
def test_tp_and_tp_sp_bf16_mixed_precision_stay_within_5e_4_loss_and_3_lr_of_the_single_device_recipe(sp):
    """tp = 2, with SP and without: each rank's bf16 partial product of a row-parallel linear is rounded before
    the all-reduce / reduce-scatter (one device rounds the whole sum once), so the run is near, not equal. Measured
    over 3 steps, both ways: loss 8.6e-5 relative, parameters 0.023 = 2.3 lr (the largest element)."""
    batches = _batches(TP_CFG, 4, 8)
    results = launch(_tp_rank, 2, batches, sp)
    ref_losses, ref_params = _reference(TP_CFG, batches)
    assert results[0][0] == results[1][0]  # the vocab-parallel loss is the same number on both ranks
    for losses, params in results:
        loss_err, param_err = _errors(losses, params, ref_losses, ref_params)
        assert loss_err < 5e-4, loss_err
        assert param_err < 3 * LR, param_err


# ------------------------------------------------------------------------------------------------ CP

CP_CFG = tiny_gqa().with_(n_layers=2, dtype="bfloat16")  # causal, RoPE, GQA, SwiGLU


def _cp_rank(batches, kind, reduced=True):
    from pylib.cp import CPTransformer, shard_sequence

    r, n = dist.get_rank(), dist.get_world_size()
    cp = CPTransformer.from_full(build_model(CP_CFG), layout="zigzag", kind=kind)

    def loss_of(ids, targets):
        return cp.loss(shard_sequence(ids, 1, r, n, "zigzag"), shard_sequence(targets, 1, r, n, "zigzag"))

    losses = _train(
        cp, batches, loss_of, cp.allreduce_gradients if reduced else lambda: None
    )  # replicated weights: grads summed over cp
    return losses, {n: p.detach().clone() for n, p in cp.named_parameters()}


@pytest.mark.parametrize("kind", ["ring", "ulysses"])
def test_cp_zigzag_bf16_mixed_precision_stays_within_7e_4_loss_and_3_lr_of_the_single_device_recipe(kind):
    """cp = 2, zig-zag: the ring merges the attention of each K/V block by its log-sum-exp (Ulysses attends whole
    sequences, but the projections run on the all-to-all'd halves), and each rank's bf16 gradient of the replicated
    weights is summed in bf16 over cp: rounding points one device does not have. Measured over 3 steps: loss
    1.3e-4 (ring) and 1.4e-4 (Ulysses) relative, parameters 0.0205 = 2 lr. Both ranks hold the same replicas."""
    batches = _batches(CP_CFG, 4, 16)
    results = launch(_cp_rank, 2, batches, kind)
    ref_losses, ref_params = _reference(CP_CFG, batches)
    (losses0, params0), (losses1, params1) = results
    assert losses0 == losses1  # the loss is the all-reduced mean over the whole sequence
    assert all(torch.equal(params0[n], params1[n]) for n in params0)
    loss_err, param_err = _errors(losses0, params0, ref_losses, ref_params)
    assert loss_err < 7e-4, loss_err
    assert param_err < 3 * LR, param_err


def test_the_tp_and_cp_bounds_catch_a_missing_gradient_reduction():
    """The bounds are tight enough to see a wrong recipe: without the SP LayerNorm all-reduce (TP) or the cp
    all-reduce of the replicated weights, a parameter moves 0.055 / 0.059 (> 3 lr) from the single-device run
    (measured; the CP loss 6.1e-3 relative, > 7e-4)."""
    batches = _batches(TP_CFG, 4, 8)
    ref_losses, ref_params = _reference(TP_CFG, batches)
    losses, params = launch(_tp_rank, 2, batches, True, False)[0]
    assert _errors(losses, params, ref_losses, ref_params)[1] > 3 * LR
    batches = _batches(CP_CFG, 4, 16)
    ref_losses, ref_params = _reference(CP_CFG, batches)
    losses, params = launch(_cp_rank, 2, batches, "ring", False)[0]
    loss_err, param_err = _errors(losses, params, ref_losses, ref_params)
    assert loss_err > 7e-4 and param_err > 3 * LR


# ------------------------------------------------------------------------------------------------ EP

MOE_CFG, H, F, B, S = MoEConfig(n_experts=4, top_k=2), 8, 16, 4, 8


def _moe():
    return seeded_moe(MOE_CFG, H, F, "swiglu", dtype="bfloat16")


def _moe_data():
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(B, S, H, generator=g).bfloat16(), torch.randn(B, S, H, generator=g).bfloat16())
        for _ in range(STEPS)
    ]


def _moe_train(layer, params, inputs):
    """(y * dy).sum() as the loss, its gradients `reduce()`d, the fp32 master step; returns the outputs."""
    weights = MasterWeights(params, RECIPE, torch.optim.Adam, lr=LR)
    outs = []
    for x, dy, reduce in inputs:
        y = layer(x)
        (y * dy).sum().backward()
        reduce()
        outs.append(y.detach())
        weights.step([p.grad for p in params])
        for p in params:
            p.grad = None
    return outs


def _ep_rank():
    from pylib.ep import ExpertParallelMoE

    r, n = dist.get_rank(), dist.get_world_size()
    layer = ExpertParallelMoE.from_full(_moe())  # ep = every rank: this rank's 2 of the 4 experts
    pieces = layer.param_map()
    params = [p for _, p, _, _ in pieces]
    inputs = [(x.chunk(n, 0)[r], dy.chunk(n, 0)[r], layer.reduce_router_grad) for x, dy in _moe_data()]
    outs = _moe_train(layer, params, inputs)  # each rank a different micro-batch; the router's grad summed over ep
    return outs, [(ref, index, p.detach().clone()) for _, p, ref, index in pieces]


def test_ep_bf16_mixed_precision_experts_and_outputs_equal_the_single_device_recipe_bit_for_bit():
    """ep = 2, each rank a micro-batch: an expert computes on the tokens routed to it, in the same order as one
    device, so its outputs and its updated weights are the single-device recipe's bit for bit (all 3 steps). The
    router adds one rounding point: each rank's bf16 gradient over its own tokens, summed in bf16 over ep, where one
    device rounds the matrix product over all tokens once -- measured 4.9e-4 (0.05 lr) after 3 steps, bounded at
    2.5e-3; the routing it makes stays the same, hence the exact outputs."""
    results = launch(_ep_rank, 2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        moe = _moe()
        params = [p for p in moe.parameters()]
        outs = _moe_train(moe, params, [(x, dy, lambda: None) for x, dy in _moe_data()])
    finally:
        torch.set_num_threads(threads)
    full = dict(moe.named_parameters())
    for k in range(STEPS):
        assert torch.equal(torch.cat([res[0][k] for res in results], 0), outs[k]), k
    held = set()
    for _, pieces in results:
        for ref, index, p in pieces:
            want = full[ref].detach()[index]
            assert p.dtype == torch.bfloat16
            if ref.startswith("router."):
                assert float((p.float() - want.float()).abs().max()) < 2.5e-3, ref
            else:
                assert torch.equal(p, want), ref
            held.add(ref)
    assert held == set(full)


# ------------------------------------------------------------------------------------------------ PP

PP_CFG = tiny_gqa().with_(dtype="bfloat16")  # 4 layers: 2 per stage
BF16_BF16 = MixedPrecision("bfloat16", grad_reduce="bfloat16")


def _pp_rank(batches):
    from pylib.pp.pipeline import PipelineParallel

    pipe = PipelineParallel(build_model(PP_CFG))
    params = list(pipe.parameters())
    weights = MasterWeights(params, BF16_BF16, torch.optim.Adam, lr=LR)
    losses = []
    for ids, targets in batches:
        pipe.zero_grad()
        losses.append(pipe.step(ids, targets, schedule="1f1b", n_microbatches=2).loss)  # None except the last stage
        weights.step([p.grad for p in params])
    return losses, {n: p.detach().clone() for n, p in pipe.named_parameters()}


def test_pp_1f1b_bf16_mixed_precision_equals_the_single_device_recipe_bit_for_bit():
    """pp = 2, 1F1B, m = 2: each stage runs its layers as one device does and sends its bf16 activations as they
    are; each micro-batch's loss is scaled by 1/m (exact: a power of two) and the two bf16 gradients accumulate in
    .grad -- a bf16 sum, so the same recipe on one device is 2 micro-batches with the gradients summed in bf16
    (grad_reduce="bfloat16"). Losses and every parameter after 3 steps: bit for bit. (With grad_reduce="float32"
    the one-device recipe sums in fp32 and the pipeline's bf16 accumulation differs: measured 7.8e-3 in a
    parameter after 3 steps.)"""
    batches = _batches(PP_CFG, 4, 8)
    results = launch(_pp_rank, 2, batches)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = SingleDeviceMixed(build_model(PP_CFG), BF16_BF16, parts=2, lr=LR)
        ref_losses = [ref.train_step(ids, targets) for ids, targets in batches]
    finally:
        torch.set_num_threads(threads)
    assert results[0][0] == [None] * STEPS
    assert results[1][0] == ref_losses
    params = {**results[0][1], **results[1][1]}
    assert len(params) == len(results[0][1]) + len(results[1][1])  # no parameter on both stages
    ref_params = dict(ref.module.named_parameters())
    assert sorted(params) == sorted(ref_params)
    for n, p in ref_params.items():
        assert params[n].dtype == torch.bfloat16 and torch.equal(params[n], p), n
