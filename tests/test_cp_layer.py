"""CP inside the reference model: the core drops into Attention, a CP layer equals the reference layer, and a
small CP model's loss and every parameter gradient equal the reference once gradients are all-reduced over cp."""

import copy

import pytest
import torch
import torch.distributed as dist

from pylib.cp import CPAttention, CPAttentionCore, CPTransformer, cp_block, sequence_positions, shard_sequence
from pylib.model import ModelConfig, build_model, random_hidden, random_tokens
from pylib.runtime import collectives as C
from pylib.runtime import launch, trace
from pylib.runtime.mesh import AxisGroup
from tests.conftest import assert_float64_close

CFG = ModelConfig(
    vocab_size=32,
    d_model=32,
    n_layers=2,
    n_heads=8,
    n_kv_heads=4,
    d_ff=48,
    mlp="swiglu",
    position="rope",
    causal=True,
    dtype="float64",
)
B, S = 2, 16


def _grads(module):
    return {n: p.grad.clone() for n, p in module.named_parameters()}


def test_cp_core_drops_into_the_reference_attention_in_place_of_its_core():
    attn = build_model(CFG).layers[0].attn
    x = random_hidden(B, S, CFG.d_model, seed=1, dtype=torch.float64)
    expected = attn(x)

    def rank(kind):
        r, n = dist.get_rank(), dist.get_world_size()
        mine = copy.deepcopy(attn)
        mine.core = CPAttentionCore(layout="zigzag", kind=kind, causal=CFG.causal)  # same signature as Attention.core
        return mine(shard_sequence(x, 1, r, n, "zigzag"), sequence_positions(S, r, n, "zigzag")).detach()

    for kind in ("ring", "ulysses", "allgather"):
        parts = launch(rank, 4, kind)
        for r, part in enumerate(parts):
            assert_float64_close(part, shard_sequence(expected, 1, r, 4, "zigzag"), f"{kind} rank {r}")


def _rank_layer(cases, layout, kind):
    r, n = dist.get_rank(), dist.get_world_size()
    results = []
    for block, x in cases:
        layer = cp_block(block, layout=layout, kind=kind)
        xl = shard_sequence(x, 1, r, n, layout).requires_grad_()
        y = layer(xl)
        (y * y).sum().backward()
        for p in layer.parameters():  # weights are replicated over cp; each rank saw only its own tokens
            C.all_reduce_(p.grad)
        results.append((y.detach(), xl.grad, _grads(layer)))
    return results


@pytest.mark.parametrize("kind", ["ring", "ulysses", "allgather"])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_cp_transformer_layer_equals_the_reference_layer(layout, kind):
    cases, expected = [], []
    for cfg in (CFG, CFG.with_(causal=False, position="none", mlp="gelu")):  # causal RoPE GQA SwiGLU; full GELU
        block = build_model(cfg).layers[0]
        x = random_hidden(B, S, cfg.d_model, seed=2, dtype=torch.float64).requires_grad_()
        y = block(x)
        (y * y).sum().backward()
        cases.append((block, x.detach()))
        expected.append((y.detach(), x.grad, _grads(block)))
    cp = 4
    parts = launch(_rank_layer, cp, cases, layout, kind)
    for i, (y, dx, grads) in enumerate(expected):
        for r in range(cp):
            y_r, dx_r, grads_r = parts[r][i]
            assert_float64_close(y_r, shard_sequence(y, 1, r, cp, layout), f"case {i}: output of rank {r}")
            assert_float64_close(dx_r, shard_sequence(dx, 1, r, cp, layout), f"case {i}: input grad of rank {r}")
            for name, g in grads.items():
                assert_float64_close(grads_r[name], g, f"case {i}: {name} on rank {r}")


def _rank_model(model, ids, targets, layout, kind):
    r, n = dist.get_rank(), dist.get_world_size()
    cp_model = CPTransformer.from_full(model, layout=layout, kind=kind)
    loss = cp_model.loss(shard_sequence(ids, 1, r, n, layout), shard_sequence(targets, 1, r, n, layout))
    loss.backward()
    partial = _grads(cp_model)
    with trace() as tr:
        cp_model.allreduce_gradients()
    return loss.detach(), partial, _grads(cp_model), [(e.op, e.tag) for e in tr.events]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ring", "ulysses", "allgather"])
def test_cp_model_loss_and_all_gradients_equal_the_reference_only_after_the_cp_allreduce(kind):
    model = build_model(CFG)
    ids, targets = random_tokens(CFG, B, S, seed=3)
    loss = model.loss(ids, targets)
    loss.backward()
    expected = _grads(model)
    cp = 4
    parts = launch(_rank_model, cp, model, ids, targets, "zigzag", kind)
    for name, g in expected.items():
        partials = [p[1][name] for p in parts]
        assert_float64_close(
            sum(partials), g, f"sum over ranks of the partial {name}"
        )  # each rank: its own tokens' share
        assert not torch.allclose(partials[0], g), f"{name}: rank 0 alone already had the full gradient?"
    for r, (loss_r, _, full, events) in enumerate(parts):
        assert_float64_close(loss_r, loss.detach(), f"loss on rank {r}")
        for name, g in expected.items():
            assert_float64_close(full[name], g, f"{name} on rank {r} after the all-reduce")
        assert events == [("all_reduce", "cp.grads")] * len(expected)


def test_positions_that_are_not_the_ranks_layout_positions_raise():
    core = CPAttentionCore(AxisGroup("cp", (0, 1), 1, None), layout="zigzag", kind="ring")  # checked before any comm
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(
        ValueError, match=r"positions \[0, 1, 2, 3\] are not cp rank 1's zigzag positions \[2, 3, 4, 5\]"
    ):
        core(q, q, q, torch.arange(4))  # contiguous rank-0 positions handed to a zigzag rank-1 core


def test_ulysses_layer_rejects_kv_heads_not_divisible_by_cp():
    attn = build_model(CFG.with_(n_kv_heads=2)).layers[0].attn
    group4 = AxisGroup("cp", (0, 1, 2, 3), 0, None)
    with pytest.raises(ValueError, match="cp=4 does not divide n_kv_head=2"):
        CPAttention.from_full(attn, group=group4, kind="ulysses")
    CPAttention.from_full(attn, group=group4, kind="ring")  # the ring has no such limit


def test_cp_model_states_its_layout_as_shard_specs():
    model = build_model(CFG)
    cp_model = CPTransformer.from_full(model, group=AxisGroup("cp", (0, 1, 2, 3), 2, None), layout="zigzag")
    specs = {s.name: s for s in cp_model.shard_specs(B, S)}
    assert specs["x"].local_shape == (B, S // 4, CFG.d_model) and specs["x"].dim == 1
    assert "chunks 2, 5 of 8" in specs["x"].note
    params = dict(model.named_parameters())
    assert {n for n, s in specs.items() if s.kind == "replicated"} == set(params)
    assert all(specs[n].local_shape == tuple(p.shape) for n, p in params.items())
