"""Auxiliary-loss-free balancing driven by training: the composed model updates every MoE layer's expert bias once
per optimizer step from the whole step's counts summed over the ranks that share the router (tp-dp-cp), as
Megatron-Core's finalize_model_grads does, and so trains exactly like the single-device reference that updates its
bias from the global batch's counts."""

import pytest
import torch

from pylib.experiments.compose_training import compare_with_reference, train, train_reference
from pylib.model import MoEConfig
from pylib.plan import RunOptions
from pylib.plan.presets import tiny
from pylib.runtime import ParallelConfig, launch
from tests.conftest import FLOAT64_ATOL

CFG = tiny().with_(
    position="rope", moe=MoEConfig(n_experts=4, top_k=2, every=2, score="sigmoid", bias_update_rate=0.05)
)
PAR = ParallelConfig(tp=2, dp=2, pp=2, ep=2)  # 8 ranks; layers 1 and 3 are MoE, one on each stage
OPTIONS = RunOptions(zero_stage=1, schedule="1f1b", n_microbatches=2, recompute="full")  # recomputed: counted once
STEPS, BATCH, SEQ = 4, 8, 16


@pytest.fixture(scope="module")
def runs():
    results = launch(train, 8, CFG, PAR, OPTIONS, steps=STEPS, batch=BATCH, seq=SEQ, data="pattern")
    return results, train_reference(CFG, steps=STEPS, batch=BATCH, seq=SEQ, data="pattern")


@pytest.mark.slow
def test_expert_bias_updated_each_step_from_the_global_counts_equals_the_reference(runs):
    results, ref = runs
    err = compare_with_reference(results, ref)
    assert err["loss_err"] <= FLOAT64_ATOL and err["param_err"] <= FLOAT64_ATOL and err["missing"] == []
    moved = set()
    for r in results:
        assert len(r["expert_bias"]) == STEPS
        for step, (held, want) in enumerate(zip(r["expert_bias"], ref["expert_bias"])):
            assert set(held) == {2 * r["coords"]["pp"] + 1}  # stage 0 holds MoE layer 1, stage 1 layer 3
            for layer, bias in held.items():
                assert torch.equal(bias, want[layer]), (r["rank"], step, layer)  # every rank, bit for bit
                moved |= {layer} if bias.abs().max() > 0 else set()
    assert moved == {1, 3}  # the bias did move on both stages


@pytest.mark.slow
def test_the_step_counts_are_every_microbatchs_tokens_once_summed_over_the_stage(runs):
    results, _ = runs
    tokens = BATCH * SEQ * CFG.moe.top_k  # every assignment of the global batch, on each MoE layer
    for stage in (0, 1):
        ranks = [r for r in results if r["coords"]["pp"] == stage]
        for step in range(STEPS):
            total = torch.tensor([r["expert_counts"][step][2 * stage + 1] for r in ranks]).sum(0)
            assert int(total.sum()) == tokens


def test_step_loads_add_every_ranks_counts_per_layer_and_step():
    from pylib.experiments.moe_balance_training import step_loads, worst_imbalance

    ranks = [[{1: [3, 1, 0, 0]}, {1: [1, 1, 1, 1]}], [{1: [1, 1, 2, 0]}, {1: [2, 2, 0, 0]}]]
    loads = step_loads(ranks, 2)
    assert loads == [{1: [4, 2, 2, 0]}, {1: [3, 3, 1, 1]}]
    assert worst_imbalance(loads[0]) == 4 * 4 / 8 and worst_imbalance({1: [2, 2], 3: [3, 1]}) == 1.5


def test_the_balance_figure_draws_the_curves_and_the_biases_it_is_given():
    import matplotlib

    matplotlib.use("Agg")
    from pylib.viz import style
    from pylib.viz.ep_balance import plot_balance_during_training

    fig = plot_balance_during_training({"a": [2.0, 1.5, 1.2], "b": [1.9, 1.8, 2.0]}, [[0.0, 0.0], [0.01, -0.01]])
    left, right = fig.axes
    assert [list(ln.get_ydata()) for ln in left.get_lines()[:2]] == [[2.0, 1.5, 1.2], [1.9, 1.8, 2.0]]
    assert [list(ln.get_ydata()) for ln in right.get_lines()[:2]] == [[0.0, 0.01], [0.0, -0.01]]
    assert style.smallest_text_px(fig) >= 9
