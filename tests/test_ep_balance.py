"""Load balance under training (pylib.ep.balance), drops vs capacity against the formula, and the figures the book
draws from them."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from pylib.analysis.ep import dropped_assignments  # noqa: E402
from pylib.ep import ExpertParallelMoE  # noqa: E402
from pylib.ep.balance import (  # noqa: E402
    dropped_share,
    load_imbalance,
    moe_input,
    moe_layers,
    structured_tokens,
    train_balance,
)
from pylib.model.moe import MoE, grouped_keep_mask, tokens_per_expert  # noqa: E402
from pylib.plan.config import MoEConfig, expert_capacity  # noqa: E402
from pylib.viz.ep import expert_holdings, plot_dropped, plot_expert_placement, plot_load_balance  # noqa: E402


def test_structured_tokens_are_deterministic_next_token_pairs_in_the_vocabulary():
    ids, targets = structured_tokens(16, 4, 10, seed=3)
    again, _ = structured_tokens(16, 4, 10, seed=3)
    assert ids.shape == targets.shape == (4, 10) and torch.equal(ids, again)
    assert torch.equal(ids[:, 1:], targets[:, :-1])  # targets are the stream shifted by one
    assert 0 <= int(ids.min()) and int(ids.max()) < 16
    follows = (targets == (3 * ids + 1) % 16).double().mean().item()
    assert follows > 0.7  # mostly the deterministic rule: learnable


def test_dropped_assignments_sums_the_overflow_of_every_expert_in_every_group():
    counts = [[5, 1, 0], [2, 2, 4]]
    assert dropped_assignments(counts, None) == 0
    assert dropped_assignments(counts, 2) == 3 + 0 + 0 + 0 + 0 + 2
    assert dropped_assignments(counts, [1, 3]) == 4 + 0 + 0 + 0 + 0 + 1
    with pytest.raises(ValueError, match="2 capacities for 1 drop groups"):
        dropped_assignments([[1]], [1, 2])


def test_dropped_share_equals_the_capacity_formula_on_the_routers_choices():
    cfg = MoEConfig(n_experts=4, top_k=2)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        moe = MoE(8, 16, cfg).double()
    x = torch.randn(2, 24, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        routing = moe.router(x.reshape(-1, 8))
    groups = torch.arange(48) // 16  # 3 ranks of 16 tokens
    counts = [tokens_per_expert(routing.experts[groups == g], 4).tolist() for g in range(3)]
    for cf in (0.5, 0.8, 1.0, 1.3):
        share, weight_probs = dropped_share(moe, x, cf, "probs", n_groups=3)
        _, weight_position = dropped_share(moe, x, cf, "position", n_groups=3)
        capped = MoEConfig(n_experts=4, top_k=2, capacity_factor=cf)
        assert round(share * 48 * 2) == dropped_assignments(counts, expert_capacity(16, capped))
        keep = grouped_keep_mask(routing, capped, groups)
        assert round(share * 96) == int((~keep).sum())
        assert weight_probs <= weight_position + 1e-12  # "probs" drops the least trusted assignments
    assert dropped_share(moe, x, 0.5, n_groups=3)[0] >= 0.5 - 1e-12
    with pytest.raises(ValueError, match="n_groups=5 does not divide the 48 tokens"):
        dropped_share(moe, x, 1.0, n_groups=5)


def test_load_imbalance_is_one_when_even_and_e_over_k_when_all_tokens_agree():
    even = torch.arange(16).remainder(8).view(8, 2)
    same = torch.tensor([[0, 1]] * 8)
    routing = type("R", (), {})
    routing.experts = even
    assert load_imbalance(routing, 8) == 1.0
    routing.experts = same
    assert load_imbalance(routing, 8) == 8 / 2


@pytest.mark.slow
def test_aux_loss_and_expert_bias_end_better_balanced_than_no_balancing():
    runs = {
        name: train_balance(cfg, steps=30, batch=8)
        for name, cfg in {
            "none": MoEConfig(n_experts=8, top_k=2),
            "aux": MoEConfig(n_experts=8, top_k=2, aux_loss_coef=0.1),
            "sigmoid": MoEConfig(n_experts=8, top_k=2, score="sigmoid"),
            "bias": MoEConfig(n_experts=8, top_k=2, score="sigmoid", bias_update_rate=0.01),
        }.items()
    }
    for run in runs.values():
        assert len(run.imbalance) == 30 and len(run.worst()) == 30 and len(run.after) == 2
        assert run.losses[-1] < 0.6 * run.losses[0]  # the model did learn the stream
    assert max(runs["aux"].after) < max(runs["none"].after) - 0.2
    assert max(runs["bias"].after) < max(runs["sigmoid"].after) - 0.2
    assert runs["bias"].model.layers[0].mlp.router.expert_bias.abs().max() > 0  # the bias moved
    assert runs["none"].model.layers[0].mlp.router.expert_bias.abs().max() == 0
    moe = moe_layers(runs["none"].model)[0]
    x = moe_input(runs["none"].model, moe, runs["none"].held_out)
    assert x.shape == (*runs["none"].held_out.shape, 32)


def test_figures_draw_the_runs_they_are_given():
    fig = plot_load_balance({"a": [2.0, 1.5, 1.2], "b": [1.9, 1.9, 2.0]})
    lines = [ln for ln in fig.axes[0].get_lines() if len(ln.get_xdata()) == 3]
    assert [list(ln.get_ydata()) for ln in lines] == [[2.0, 1.5, 1.2], [1.9, 1.9, 2.0]]
    fig = plot_dropped([0.5, 1.0], {"r": [0.5, 0.1]})
    assert list(fig.axes[0].get_lines()[0].get_ydata()) == [50.0, 10.0]


def test_expert_placement_is_read_from_each_ranks_param_map():
    from pylib.runtime.mesh import AxisGroup

    cfg = MoEConfig(n_experts=4, top_k=2)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        moe = MoE(8, 16, cfg).double()
    held = []
    for rank in range(4):  # ep = 2 (ranks {0, 2} / {1, 3}), etp = 2 (ranks {0, 1} / {2, 3}); no process needed
        ep = AxisGroup("ep", (rank % 2, rank % 2 + 2), rank // 2, None)
        etp = AxisGroup("etp", (rank - rank % 2, rank - rank % 2 + 1), rank % 2, None)
        layer = ExpertParallelMoE(moe, ep, etp, None)
        held.append(expert_holdings(layer.param_map()))
    assert held[0] == [(0, 0, 8), (1, 0, 8)] and held[1] == [(0, 8, 16), (1, 8, 16)]
    assert held[2] == [(2, 0, 8), (3, 0, 8)] and held[3] == [(2, 8, 16), (3, 8, 16)]
    fig = plot_expert_placement(held, 4, 16)
    labels = sorted(t.get_text() for t in fig.axes[0].texts)
    assert labels == sorted(f"rank {r}" for r in range(4) for _ in range(2))
