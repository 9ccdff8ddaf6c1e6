"""Mixed precision under DDP and ZeRO-1/2/3: bf16 compute, fp32 master weights and Adam state, gradients reduced
in bf16 or fp32. A d = 2 run equals the single-device run of the same recipe bit for bit (same rounding points; a
sum of two numbers rounds the same in either order), stays near a float64 run, and holds exactly the bytes the
mixed-precision formulas say; fp16 with a dynamic loss scale skips an overflowing step and halves the scale."""

import pytest
import torch
import torch.distributed as dist

from pylib.analysis.dp import STAGES, mixed_held_bytes, mixed_traffic_by_op
from pylib.analysis.planner import model_state_bytes
from pylib.dp import SingleDeviceMixed, micro_batch, wrap
from pylib.model import ModelConfig, build_model, random_tokens
from pylib.plan import RunOptions
from pylib.plan.options import MixedPrecision
from pylib.plan.presets import tiny_odd
from pylib.runtime import ParallelConfig, launch, trace

CFG = tiny_odd()  # built in float64, then cast to the recipe's compute dtype
BATCH, SEQ, STEPS, LR = 8, 8, 4, 1e-2
BF16_FP32 = MixedPrecision("bfloat16", grad_reduce="float32")
BF16_BF16 = MixedPrecision("bfloat16", grad_reduce="bfloat16")


def _batches():
    return [random_tokens(CFG, BATCH, SEQ, seed=s) for s in range(STEPS)]


def _train(stage, recipe):
    rank, d = dist.get_rank(), dist.get_world_size()
    model = build_model(CFG)
    trainer = wrap(model, stage, precision=recipe, lr=LR)
    losses = []
    for ids, targets in _batches():
        with trace() as tr:
            loss = model.loss(micro_batch(ids, rank, d), micro_batch(targets, rank, d))
            trainer.scale_loss(loss).backward()
            trainer.finish_gradient_sync()
            trainer.step()
        sent = {}
        for e in tr.events:
            sent[e.op] = sent.get(e.op, 0) + e.bytes_sent
        memory = trainer.memory()  # after the step, before zero_grad frees ZeRO-3's gradient shards
        trainer.zero_grad()
        losses.append(float(loss.detach()))
    if stage == "zero3":
        from pylib.dp import assemble

        shards = {k: v.detach() for k, v in trainer.parameter_shards().items()}
        gathered = [None] * d
        dist.all_gather_object(gathered, shards)
        params = assemble(trainer.layouts, gathered)
    else:
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
    padded = sum(lay.padded_numel for lay in trainer.layouts)
    return dict(
        losses=losses, params=params, memory=memory.as_dict(), padded=padded, layouts=trainer.layouts, sent=sent
    )


def _reference(recipe, d):
    """The single-device run, on one thread as every launched rank is: a bf16 matrix product on the CPU splits its
    sums by thread, so two threads round differently from one (the same recipe, other rounding points)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = SingleDeviceMixed(build_model(CFG), recipe, parts=d, lr=LR)
        losses = [ref.train_step(ids, targets) for ids, targets in _batches()]
    finally:
        torch.set_num_threads(threads)
    return ref, losses


@pytest.mark.parametrize(
    "stage,recipe",
    [
        ("ddp", BF16_FP32),
        ("ddp", BF16_BF16),
        ("zero1", BF16_FP32),
        ("zero2", BF16_FP32),
        ("zero2", BF16_BF16),
        ("zero3", BF16_BF16),
        ("zero3", BF16_FP32),
    ],
)
def test_two_ranks_equal_the_single_device_recipe_bit_for_bit(stage, recipe):
    d = 2
    results = launch(_train, d, stage, recipe)
    ref, ref_losses = _reference(recipe, d)
    mean = [sum(r["losses"][i] for r in results) / d for i in range(STEPS)]
    assert mean == ref_losses  # every rank's bf16 loss, every step, exactly
    for n, p in ref.module.named_parameters():
        assert p.dtype == torch.bfloat16
        for r in results:
            assert torch.equal(r["params"][n], p), n
    # the bf16 parameters are the fp32 masters rounded: the masters themselves moved by less than 1 bf16 ulp more
    for p, m in zip(ref.params, ref.weights.master):
        assert torch.equal(m.to(torch.bfloat16), p)


def test_memory_is_the_mixed_precision_formula_byte_for_byte():
    d = 2
    for stage in ("ddp", "zero1", "zero2", "zero3"):
        for recipe in (BF16_FP32, BF16_BF16):
            r = launch(_train, d, stage, recipe)[0]
            n = sum(p.numel() for p in build_model(CFG).parameters())
            want = mixed_held_bytes(n, d, stage, recipe, padded_params=r["padded"])
            got = {k: r["memory"][k] for k in ("params", "grads", "optim")}
            assert got == want, (stage, recipe.grad_reduce, got, want)
            # and the traffic: gradients in the reduce dtype, parameters gathered in bf16
            elems = n if stage == "ddp" else r["padded"]
            assert r["sent"] == mixed_traffic_by_op(elems, d, stage, recipe), (stage, recipe.grad_reduce)
            if recipe is BF16_FP32:  # the planner's "mixed" with fp32 gradients (Megatron's default for bf16)
                assert model_state_bytes(r["layouts"], STAGES.index(stage), "mixed", grad_bytes=4) == got
            if recipe is BF16_BF16:  # the ZeRO paper's 2 + 2 + 12 bytes per parameter, sharded per stage
                # and the planner's "mixed" precision, from the run's own layouts
                assert model_state_bytes(r["layouts"], STAGES.index(stage), "mixed") == got
                psi = r["padded"] if stage != "ddp" else n
                total = {"ddp": 16 * psi, "zero1": 4 * psi + 12 * psi // d, "zero2": 2 * psi + 14 * psi // d}
                total["zero3"] = 16 * psi // d
                assert sum(got.values()) == total[stage]


def test_mixed_loss_curve_stays_near_float64():
    ref, mixed = _reference(BF16_FP32, 2)
    model = build_model(CFG)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    exact = []
    for ids, targets in _batches():
        loss = model.loss(ids, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        exact.append(float(loss.detach()))
    # bf16 weights carry 8 significant bits (relative rounding 2**-9 = 0.2%), but the errors of the weights
    # average out in the loss: measured 1.8e-4 relative over these steps; the bound leaves a factor of ~5
    for a, b in zip(mixed, exact):
        assert abs(a - b) < 1e-3 * abs(b), (mixed, exact)


def test_fp16_dynamic_loss_scale_skips_an_overflow_and_halves_the_scale():
    # 2**20 times a loss of ~3.6 overflows fp16 (max 65504) already; the scaled gradients first fit at 2**18, so the
    # run skips twice and then steps (from 2**40 it took 22 skips, each a float16 step on the CPU: ~10 s of the suite)
    recipe = MixedPrecision("float16", grad_reduce="float32", loss_scaling="dynamic", loss_scale=2.0**20)
    ref = SingleDeviceMixed(build_model(CFG), recipe, parts=2, lr=LR)
    before = [p.detach().clone() for p in ref.params]
    ids, targets = _batches()[0]
    ref.train_step(ids, targets)  # overflow: step skipped, scale halved
    assert ref.scaler.skipped == 1 and ref.scaler.scale == 2.0**19
    assert all(torch.equal(a, p) for a, p in zip(before, ref.params))
    for _ in range(20):  # halve until the scaled gradients fit in fp16, then it steps
        skipped = ref.scaler.skipped
        ref.train_step(ids, targets)
        if ref.scaler.skipped == skipped:
            break
    assert ref.scaler.skipped == 2 and ref.scaler.scale == 2.0**18 and ref.scaler.clean_steps == 1
    assert not all(torch.equal(a, p) for a, p in zip(before, ref.params))


def _fp16_overflow():
    rank, d = dist.get_rank(), dist.get_world_size()
    model = build_model(CFG)
    recipe = MixedPrecision("float16", grad_reduce="float16", loss_scaling="dynamic", loss_scale=2.0**40)
    trainer = wrap(model, "zero2", precision=recipe, lr=LR)
    ids, targets = _batches()[0]
    before = [p.detach().clone() for p in model.parameters()]
    trainer.scale_loss(model.loss(micro_batch(ids, rank, d), micro_batch(targets, rank, d))).backward()
    trainer.finish_gradient_sync()
    trainer.step()
    same = all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    return same, trainer.weights.scaler.scale


def test_fp16_overflow_is_agreed_over_the_group_under_zero2():
    assert launch(_fp16_overflow, 2) == [(True, 2.0**39)] * 2


def test_bad_recipes_are_refused_with_the_values():
    with pytest.raises(ValueError, match=r"grad_reduce='float16' must be one of \('bfloat16', 'float32'\)"):
        MixedPrecision("bfloat16", grad_reduce="float16")  # the compute dtype or float32
    with pytest.raises(ValueError, match="master='bfloat16'"):
        MixedPrecision(master="bfloat16")


# ------------------------------------------------------------------------------------------------ composed model

COMPOSE_CFG = ModelConfig(vocab_size=38, d_model=12, n_heads=2, d_ff=22, n_layers=2, dtype="bfloat16")


def _compose_train(pc, zero_stage, recipe):
    from pylib.compose import ParallelTransformer
    from pylib.runtime import Mesh

    mesh = Mesh(pc)
    model = ParallelTransformer.from_full(
        build_model(COMPOSE_CFG), mesh, RunOptions(zero_stage=zero_stage), precision=recipe, lr=LR
    )
    losses = []
    for ids, targets in _batches():
        losses.append(model.step(ids, targets, measure_memory=False).loss)
    held = model.memory()
    return dict(losses=losses, params=model.parameter_pieces(), layouts=model.layouts, held=held.as_dict())


def _compose_reference(d, recipe):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = SingleDeviceMixed(build_model(COMPOSE_CFG), recipe, parts=d, lr=LR)
        losses = [ref.train_step(ids, targets) for ids, targets in _batches()]
    finally:
        torch.set_num_threads(threads)
    return dict(ref.module.named_parameters()), losses


def _compose_errors(pc, zero_stage, recipe):
    results = launch(_compose_train, pc.world_size, pc, zero_stage, recipe)
    params, losses = _compose_reference(pc.dp, recipe)
    loss_err = max(abs(a - b) / b for r in results for a, b in zip(r["losses"], losses))
    param_err, covered = 0.0, set()
    for r in results:
        for name, index, lo, hi, t in r["params"]:
            want = params[name][index].reshape(-1)[lo:hi].detach()
            assert t.dtype == torch.bfloat16
            param_err = max(param_err, float((t.float() - want.float()).abs().max()) if t.numel() else 0.0)
            covered.add(name)
    assert covered == set(params)
    stage = STAGES[zero_stage]
    for r in results:  # the held bytes of the composed rank: the formula per flat buffer, summed
        want = dict(params=0, grads=0, optim=0)
        for lay in r["layouts"]:
            n, d = lay.numel, (lay.parts if zero_stage else 1)
            for k, v in mixed_held_bytes(n, d, stage, recipe, padded_params=lay.padded_numel).items():
                want[k] += v
        assert {k: r["held"][k] for k in want} == want
        if recipe is BF16_BF16:
            assert model_state_bytes(r["layouts"], zero_stage, "mixed") == want
    return loss_err, param_err


@pytest.mark.parametrize("zero_stage,recipe", [(1, BF16_FP32), (3, BF16_BF16), (3, BF16_FP32)])
def test_composed_dp2_equals_the_single_device_recipe(zero_stage, recipe):
    """Through pylib.compose (stages, pipeline executor, reductions) the parameters are bit for bit the reference's;
    the loss differs only by the fp32 rounding of averaging the replicas' losses (measured 9e-8 relative)."""
    loss_err, param_err = _compose_errors(ParallelConfig(dp=2), zero_stage, recipe)
    assert param_err == 0.0
    assert loss_err < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("zero_stage,recipe", [(1, BF16_FP32), (3, BF16_BF16)])
def test_composed_tp2_dp2_stays_near_the_single_device_recipe(zero_stage, recipe):
    """TP adds rounding points one device does not have: each rank's bf16 partial product is rounded before the
    all-reduce (and the all-reduce sums in bf16). So the run is near, not equal: the loss within 1e-3 relative
    (measured 1.0e-4 and 1.7e-4 over 4 steps), each parameter within 3 lr -- Adam moves every element by about lr
    whatever its gradient's size, so an element whose gradient is near zero may step the other way (measured
    0.023 = 2.3 lr, the largest over all elements)."""
    loss_err, param_err = _compose_errors(ParallelConfig(tp=2, dp=2), zero_stage, recipe)
    assert loss_err < 1e-3
    assert param_err < 3 * LR


def test_composed_model_refuses_a_recipe_it_cannot_run():
    from pylib.compose import ParallelTransformer
    from pylib.runtime import Mesh

    def bad(cfg, recipe):
        ParallelTransformer.from_full(build_model(cfg), Mesh(ParallelConfig()), precision=recipe)

    from pylib.runtime.launch import RankFailedError

    with pytest.raises(RankFailedError, match="build the full model in the compute dtype"):
        launch(bad, 1, COMPOSE_CFG.with_(dtype="float32"), BF16_FP32)
    fp16 = MixedPrecision("float16", loss_scaling="dynamic")
    with pytest.raises(RankFailedError, match="loss_scaling='dynamic'"):
        launch(bad, 1, COMPOSE_CFG.with_(dtype="float16"), fp16)


@pytest.mark.parametrize(
    "kw, text",
    [
        (dict(loss_scaling="dynamic", loss_scale=float("inf")), "loss_scale=inf must be finite"),
        (dict(loss_scaling="static", loss_scale=float("nan")), "must be finite"),
        (dict(loss_scaling="dynamic", loss_scale=1e-30), "must be between 1 and 2\\*\\*64"),
        (dict(loss_scaling="static", loss_scale=2.0**70), "overflows every gradient above 2\\*\\*-48"),
    ],
)
def test_a_loss_scale_that_cannot_work_is_refused_when_the_recipe_is_built(kw, text):
    with pytest.raises(ValueError, match=text):
        MixedPrecision("float16", grad_reduce="float32", **kw)


def test_consecutive_skipped_fp16_steps_raise_with_the_scale_history():
    from pylib.dp import LossScaleError, LossScaler

    scaler = LossScaler(MixedPrecision("float16", loss_scaling="dynamic", loss_scale=8.0), max_skips=4)
    scaler.update(True)
    scaler.update(False)  # a clean step starts the count again
    for _ in range(3):
        scaler.update(True)
    with pytest.raises(LossScaleError, match="4 consecutive steps skipped .* at scales 4, 2, 1, 0.5"):
        scaler.update(True)


@pytest.mark.slow
def test_a_nan_loss_stops_dynamic_loss_scaling_instead_of_skipping_forever():
    from pylib.dp import LossScaleError

    recipe = MixedPrecision("float16", grad_reduce="float32", loss_scaling="dynamic", loss_scale=2.0**10)
    ref = SingleDeviceMixed(build_model(CFG), recipe, parts=1, lr=LR)
    ref.weights.scaler.max_skips = 3
    ids, targets = _batches()[0]
    ref.module.lm_head.weight.data[0, 0] = float("nan")
    with pytest.raises(LossScaleError, match="3 consecutive steps skipped .* scales 1024, 512, 256"):
        for _ in range(3):
            ref.train_step(ids, targets)


def test_all_zero_gradients_after_unscaling_are_reported():
    from pylib.dp import MasterWeights, ZeroGradientsWarning

    recipe = MixedPrecision("float16", grad_reduce="float32", loss_scaling="dynamic", loss_scale=2.0**10)
    low = [torch.ones(3, dtype=torch.float16), torch.ones(2, dtype=torch.float16)]
    weights = MasterWeights(low, recipe, torch.optim.SGD, lr=0.1)
    assert weights.step([torch.zeros(3), torch.tensor([0.0, 2.0**10])])  # one non-zero gradient: a normal step
    assert weights.scaler.zero_steps == 0
    with pytest.warns(ZeroGradientsWarning, match="every gradient is zero after unscaling \\(loss scale 1024, float16"):
        weights.step([torch.zeros(3), torch.zeros(2)])  # e.g. gradients that underflowed in fp16
    assert weights.scaler.zero_steps == 1
