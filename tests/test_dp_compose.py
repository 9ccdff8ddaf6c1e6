"""Data parallelism composed with the other modes: gradients averaged over Megatron's "dp-cp" group under context
parallelism, and expert gradients summed over "edp" and divided by the dense dp x cp size under expert
parallelism. Each composition equals the single-device gradient on the whole batch; each wrong variant is off by
the factor the chapter states."""

import pytest
import torch.distributed as dist
import torch.nn.functional as F

from pylib.dp import assemble, micro_batch, wrap
from pylib.ep import ExpertParallelMoE
from pylib.model import ModelConfig, MoEConfig, build_model, random_tokens
from pylib.runtime import Mesh, ParallelConfig, launch, trace
from tests.conftest import FLOAT64_RTOL, assert_float64_close

BATCH = 4
DENSE = ModelConfig(vocab_size=37, d_model=12, n_heads=3, d_ff=20, n_layers=2, position="rope", dtype="float64")
MOE = ModelConfig(vocab_size=37, d_model=8, n_heads=2, d_ff=12, n_layers=1, dtype="float64").with_(
    moe=MoEConfig(n_experts=4, top_k=2)
)


def _reference_grads(cfg, seq):
    model = build_model(cfg)
    ids, targets = random_tokens(cfg, BATCH, seq, seed=0)
    model.loss(ids, targets).backward()
    return {n: p.grad for n, p in model.named_parameters()}


# ------------------------------------------------------------------------------------------------ DP x CP


def _dp_cp(group_name):
    """dp=2 x cp=2: batch rows split over dp, each sequence split (zig-zag) over cp, ring attention; every rank
    backpropagates the mean loss over its own tokens and DDP averages over `group_name`."""
    from pylib.cp import CPTransformer, shard_sequence

    mesh = Mesh(ParallelConfig(dp=2, cp=2))
    model = CPTransformer.from_full(build_model(DENSE), group=mesh.cp)
    ddp = wrap(model, "ddp", mesh[group_name], bucket_bytes=4096)
    ids, targets = random_tokens(DENSE, BATCH, 16, seed=0)
    ids, targets = (shard_sequence(micro_batch(t, mesh.dp.rank, 2), 1, mesh.cp.rank, 2) for t in (ids, targets))
    with trace() as tr:
        logits = model(ids)
        F.cross_entropy(logits.reshape(-1, DENSE.vocab_size), targets.reshape(-1)).backward()
        ddp.finish_gradient_sync()
    axes = {(e.op, e.axis) for e in tr.events}
    return {n: p.grad.clone() for n, p in model.named_parameters()}, axes


def test_dp_cp_gradients_averaged_over_dp_cp_equal_the_full_batch_gradient():
    ref = _reference_grads(DENSE, 16)
    for grads, axes in launch(_dp_cp, 4, "dp-cp"):
        assert ("all_reduce", "dp-cp") in axes
        for n, g in ref.items():
            assert_float64_close(grads[n], g, rtol=FLOAT64_RTOL)


def test_averaging_over_dp_alone_leaves_the_cp_ranks_of_one_replica_with_different_gradients():
    ref = _reference_grads(DENSE, 16)
    results = launch(_dp_cp, 4, "dp")
    w = "layers.0.attn.q_proj.weight"
    # ParallelConfig(dp=2, cp=2): rank = i_cp + 2 i_dp, so ranks 0 and 1 are the two cp halves of replica 0
    assert (results[0][0][w] - results[1][0][w]).abs().max() > 1e-3
    # each holds the gradient of its half of the tokens; their mean is the full gradient
    assert_float64_close((results[0][0][w] + results[1][0][w]) / 2, ref[w], rtol=FLOAT64_RTOL)


# ------------------------------------------------------------------------------------------------ DP x EP


def _reference_name(name: str, first_expert: int) -> str:
    """layers.0.mlp.experts.experts.1.up_proj.weight on a rank holding experts 2, 3 -> layers.0.mlp.experts.3..."""
    parts = name.split(".")
    if "experts" not in parts:
        return name
    i = parts.index("experts")
    return ".".join(parts[: i + 1] + [str(first_expert + int(parts[i + 2]))] + parts[i + 3 :])


def _dp_ep(stage, divide):
    """4 ranks, each with its own quarter of the batch (dense dp = 4); experts split over ep = 2, so each expert
    lives on edp = 2 ranks. Dense gradients are averaged over "dp", expert gradients reduced over "edp"."""
    mesh = Mesh(ParallelConfig(dp=4, ep=2))
    model = build_model(MOE)
    for layer in model.layers:
        layer.mlp = ExpertParallelMoE.from_mesh(layer.mlp, mesh, aux_group=None)
    first = model.layers[0].mlp.expert_ids[0]
    factor = mesh.dp.size if divide else None
    dp = wrap(
        model,
        stage,
        mesh.dp,
        bucket_bytes=4096,
        group_for=lambda n, p: mesh.edp if ".experts." in n else None,
        gradient_divide_factor=factor,
    )
    ids, targets = random_tokens(MOE, BATCH, 4, seed=0)
    with trace() as tr:
        model.loss(micro_batch(ids, mesh.dp.rank, 4), micro_batch(targets, mesh.dp.rank, 4)).backward()
        dp.finish_gradient_sync()
    reduced = {(e.op, e.axis, e.group) for e in tr.events if e.op in ("all_reduce", "reduce_scatter")}
    return dict(first=first, layouts=dp.layouts, grads=dp.gradient_shards(), reduced=reduced, rank=dist.get_rank())


@pytest.fixture(scope="module")
def moe_reference():
    return _reference_grads(MOE, 4)


def _check_against_reference(results, ref, expert_ratio):
    for r in results:
        for lay in r["layouts"]:
            members = [results[m] for m in lay.group]
            if lay.parts == 1:
                full = assemble([lay], [r["grads"]])
            else:
                full = assemble([lay], [m["grads"] for m in members])
            for name, g in full.items():
                want = ref[_reference_name(name, r["first"])]
                assert_float64_close(g, want * (expert_ratio if ".experts." in name else 1), rtol=FLOAT64_RTOL)


@pytest.mark.parametrize("stage", ["ddp", "zero2", "zero3"])
def test_expert_gradients_summed_over_edp_and_divided_by_dp_equal_the_reference(moe_reference, stage):
    results = launch(_dp_ep, 4, stage, True)
    for r in results:  # expert buckets go to the two ranks holding the same experts, the rest to all four
        edp = (0, 2) if r["rank"] in (0, 2) else (1, 3)
        assert {(axis, group) for _, axis, group in r["reduced"]} == {("edp", edp), ("dp", (0, 1, 2, 3))}
    _check_against_reference(results, moe_reference, expert_ratio=1)


def test_expert_gradients_averaged_over_edp_are_ep_times_too_large(moe_reference):
    results = launch(_dp_ep, 4, "ddp", False)
    _check_against_reference(results, moe_reference, expert_ratio=2)  # ep = 2: each expert saw two ranks' tokens


@pytest.mark.parametrize("stage", ["ddp", "zero1", "zero3"])
def test_gradient_divide_factor_must_be_positive(stage):
    with pytest.raises(ValueError, match=r"gradient_divide_factor=0 must be > 0"):
        wrap(build_model(DENSE), stage, None, gradient_divide_factor=0)  # refused before any group is touched
