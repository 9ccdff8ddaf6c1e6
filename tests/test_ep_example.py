"""Seed A section 6 run for real (EP = 4, 8 experts, 2 per rank, top-2, 8 tokens), and the EP figures."""

import matplotlib
import matplotlib.pyplot as plt
import torch

from pylib.analysis.ep import dispatch_matrix
from pylib.ep import format_routing_table
from pylib.ep.folding import folding_groups
from pylib.ep.traffic import traffic_matrix
from pylib.experiments.seed_a_routing import (
    SEED_A_TOKENS,
    seed_a_ep_worker,
    seed_a_moe_input,
    seed_a_routing_table,
)
from pylib.plan.presets import seed_a_moe_config
from pylib.runtime import ParallelConfig, launch
from pylib.viz.ep import plot_folding, plot_routing_table, plot_traffic_matrix
from tests.conftest import assert_float64_close


def test_seed_a_routing_table_comes_from_the_real_router():
    rows = seed_a_routing_table()
    x, moe = seed_a_moe_input()
    # independently: softmax over the 8 experts of x W_gate^T, the two largest
    probs = torch.softmax(x.reshape(8, -1) @ moe.router.gate.weight.T, dim=-1)
    top = probs.topk(2, dim=-1)
    assert [r["token"] for r in rows] == list(SEED_A_TOKENS)
    for t, r in enumerate(rows):
        assert r["experts"] == tuple(top.indices[t].tolist())
        torch.testing.assert_close(torch.tensor(r["weights"], dtype=torch.float64), top.values[t])
        assert r["ranks"] == tuple(e // 2 for e in r["experts"])  # GPU i holds experts 2i, 2i+1
        assert r["kept"] == (True, True)
    text = format_routing_table(rows, 4, 8, one_based=True)
    assert text.splitlines()[1].startswith("The") and "GPU" in text


def test_seed_a_example_runs_over_ep4_and_its_traffic_matches_the_routing_table():
    table = seed_a_routing_table()
    results = launch(seed_a_ep_worker, 4)
    x, moe = seed_a_moe_input(seed_a_moe_config())
    with torch.no_grad():
        y_ref = moe(x).reshape(8, -1)
    experts = []
    for r, res in enumerate(results):
        assert res["experts_held"] == (2 * r, 2 * r + 1)
        assert res["tokens"] == list(SEED_A_TOKENS[2 * r : 2 * r + 2])
        mine = table[2 * r : 2 * r + 2]
        assert [(row["experts"], row["ranks"]) for row in res["table"]] == [(m["experts"], m["ranks"]) for m in mine]
        assert_float64_close(res["output"], y_ref[2 * r : 2 * r + 2])
        experts.append(torch.tensor([row["experts"] for row in res["table"]]))
    matrix = dispatch_matrix(experts, 8)
    for r, res in enumerate(results):  # rows rank r's experts received from each source rank
        assert res["rows_received"] == [matrix[s][r] for s in range(4)]
    row_bytes = 4 * 8  # h = 4 float64 numbers
    traced = traffic_matrix([res["events"] for res in results], 4)
    assert traced == [[c * row_bytes for c in row] for row in matrix]
    assert sum(map(sum, matrix)) == 8 * 2  # every token's two copies went somewhere


def test_figures_draw_the_data_they_are_given():
    matplotlib.use("Agg")
    rows = seed_a_routing_table()
    fig = plot_routing_table(rows, 8, 4)
    labels = sorted(t.get_text() for t in fig.axes[0].texts)
    assert labels == sorted(f"{w:.2f}" for r in rows for w in r["weights"])
    matrix = [[0, 64, 32, 0], [32, 0, 0, 96], [0, 0, 32, 32], [64, 32, 0, 0]]
    fig = plot_traffic_matrix(matrix)
    assert sorted(int(t.get_text()) for t in fig.axes[0].texts) == sorted(v for row in matrix for v in row)
    fig = plot_folding(folding_groups(ParallelConfig(tp=2, cp=2, dp=2, pp=2, ep=4), 16), 16)
    dense, expert = fig.axes
    assert [t.get_text() for t in dense.get_yticklabels()] == ["TP (2)", "CP (2)", "DP (2)", "PP (2)"]
    assert [t.get_text() for t in expert.get_yticklabels()] == ["ETP (1)", "EP (4)", "EDP (2)", "PP (2)"]
    assert len(expert.texts) == 4 * 16  # every rank once per axis
    plt.close("all")
