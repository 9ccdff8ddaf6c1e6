"""The reference model: runs forward and backward for every option, deterministic weights, clear errors."""

import itertools

import pytest
import torch

from pylib.model import (
    SEED_A,
    ModelConfig,
    MoEConfig,
    attention_core,
    build_model,
    random_tokens,
    saved_activations,
)

GRID = list(
    itertools.product(
        ["gelu", "swiglu"],  # mlp
        [None, 2],  # n_kv_heads: MHA, GQA
        [True, False],  # causal
        ["none", "rope"],  # position
        [
            None,
            MoEConfig(n_experts=4, top_k=2),
            MoEConfig(n_experts=4, top_k=1, capacity_factor=1.0, aux_loss_coef=0.01, z_loss_coef=0.001),
        ],
    )
)
DEFAULT = GRID[0]  # gelu, MHA, causal, no position encoding, dense MLP


def _marked(option):
    """The whole grid runs in the full suite; the inner loop (-m "not slow") runs the default and each option
    changed on its own."""
    alone = sum(a != b for a, b in zip(option, DEFAULT)) <= 1
    return pytest.param(*option) if alone else pytest.param(*option, marks=pytest.mark.slow)


OPTIONS = [_marked(option) for option in GRID]


@pytest.mark.parametrize("mlp, kv, causal, position, moe", OPTIONS)
def test_forward_and_backward_run_for_every_option(mlp, kv, causal, position, moe):
    cfg = ModelConfig(
        vocab_size=32,
        d_model=16,
        n_layers=2,
        n_heads=4,
        n_kv_heads=kv,
        d_ff=32,
        mlp=mlp,
        causal=causal,
        position=position,
        moe=moe,
        dtype="float64",
    )
    model = build_model(cfg)
    ids, targets = random_tokens(cfg, 2, 8)
    loss = model.loss(ids, targets)
    loss.backward()
    assert torch.isfinite(loss)
    routed = set()
    for i, layer in enumerate(model.layers):
        if cfg.is_moe_layer(i):
            routing = layer.mlp.last_routing
            routed |= {f"layers.{i}.mlp.experts.{e}." for e in routing.experts[layer.mlp.last_keep].tolist()}
    for name, p in model.named_parameters():
        is_idle_expert = ".experts." in name and not any(name.startswith(r) for r in routed)
        if is_idle_expert:  # an expert that received no token gets no gradient
            assert p.grad is None, name
        else:
            assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_weights_are_a_function_of_config_and_seed_only():
    cfg = ModelConfig(dtype="float64")
    torch.manual_seed(123)
    a = build_model(cfg).state_dict()
    torch.manual_seed(456)
    b = build_model(cfg).state_dict()
    c = build_model(cfg.with_(seed=1)).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["embed.weight"], c["embed.weight"])


def test_building_a_model_leaves_the_callers_random_state_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    build_model(ModelConfig())
    assert torch.equal(torch.rand(3), expected)


def test_seed_a_config_embeds_the_seed_rows():
    # Seed A: torch.manual_seed(0); torch.randn(4, 4) are the rows of "The cat sat here".
    torch.manual_seed(0)
    rows = torch.randn(4, 4)
    model = build_model(SEED_A)
    assert torch.equal(model.embed.weight[:4].detach(), rows)


def test_causal_attention_matches_an_explicit_loop():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 3, generator=g, dtype=torch.float64) for _ in range(3))
    out = attention_core(q, k, v, causal=True)
    for t in range(5):
        w = torch.softmax((q[:, :, t : t + 1] @ k[:, :, : t + 1].transpose(-1, -2)) / 3**0.5, -1)
        torch.testing.assert_close(out[:, :, t : t + 1], w @ v[:, :, : t + 1])


def test_gqa_equals_mha_with_repeated_kv_heads():
    cfg = ModelConfig(n_heads=4, n_kv_heads=2, dtype="float64")
    model = build_model(cfg)
    attn = model.layers[0].attn
    x = torch.randn(2, 6, cfg.d_model, dtype=torch.float64)
    q, k, v = attn.project(x)
    assert q.shape == (2, 4, 6, 4) and k.shape == (2, 2, 6, 4)
    mha = attention_core(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), causal=True)
    torch.testing.assert_close(attention_core(q, k, v, causal=True), mha)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(d_model=16, n_heads=3), "n_heads=3 does not divide d_model=16"),
        (dict(n_heads=4, n_kv_heads=3), "n_kv_head=3 does not divide n_head=4"),
        (dict(mlp="relu"), "mlp='relu'"),
        (dict(d_model=12, n_heads=4, position="rope"), "rope needs an even d_head, got 3"),
    ],
)
def test_bad_model_configs_are_refused_naming_the_constraint(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        ModelConfig(**kwargs)


def test_bad_moe_configs_are_refused():
    with pytest.raises(ValueError, match="top_k=9 must be between 1 and n_experts=8"):
        MoEConfig(n_experts=8, top_k=9)
    with pytest.raises(ValueError, match="capacity_factor=0"):
        MoEConfig(capacity_factor=0)


def test_auxiliary_losses_add_gradient_without_changing_the_output():
    base = ModelConfig(moe=MoEConfig(n_experts=4, top_k=2), dtype="float64", n_layers=1)
    with_aux = base.with_(moe=MoEConfig(n_experts=4, top_k=2, aux_loss_coef=0.1, z_loss_coef=0.01))
    ids, _ = random_tokens(base, 2, 8)
    m0, m1 = build_model(base), build_model(with_aux)
    y0, y1 = m0(ids), m1(ids)
    torch.testing.assert_close(y0, y1, rtol=0, atol=0)
    y0.sum().backward()
    y1.sum().backward()
    g0 = m0.layers[0].mlp.router.gate.weight.grad
    g1 = m1.layers[0].mlp.router.gate.weight.grad
    assert (g0 - g1).abs().max() > 1e-6


def test_capacity_drops_exactly_the_assignments_over_capacity():
    cfg = MoEConfig(n_experts=4, top_k=2, capacity_factor=0.5)
    model = build_model(ModelConfig(moe=cfg, n_layers=1, dtype="float64"))
    ids, _ = random_tokens(model.cfg, 2, 8)
    model(ids)
    moe = model.layers[0].mlp
    kept = torch.bincount(moe.last_routing.experts[moe.last_keep], minlength=4)
    wanted = torch.bincount(moe.last_routing.experts.reshape(-1), minlength=4)
    capacity = 4  # ceil(0.5 * 16 tokens * 2 / 4)
    assert torch.equal(kept, wanted.clamp(max=capacity))


def test_saved_activations_counts_activations_not_weights():
    cfg = ModelConfig(n_layers=1, dtype="float64")
    model = build_model(cfg)
    weight_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    measured = {}
    for batch in (2, 4, 6):
        ids, targets = random_tokens(cfg, batch, 8)
        with saved_activations(model.parameters()) as saved:
            model.loss(ids, targets)
        measured[batch] = saved.bytes
        assert not weight_ptrs & set(saved._seen)
    # activations grow linearly with the batch; what does not (a few scalars) is tiny
    per_two_sequences = measured[4] - measured[2]
    assert per_two_sequences == measured[6] - measured[4] > 0
    assert 0 <= measured[2] - per_two_sequences < 0.01 * measured[2]
    with saved_activations() as with_weights:
        model.loss(*random_tokens(cfg, 2, 8))
    weight_bytes = sum(p.numel() * 8 for p in model.parameters())
    assert 0 < with_weights.bytes - measured[2] <= weight_bytes
