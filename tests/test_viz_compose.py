"""The composition figures draw the rank generator's groups, the batch placement and a real run's per-rank bytes."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from pylib.analysis.compose import dp_held_bytes, per_axis  # noqa: E402
from pylib.compose import formula_traffic, holder_labels, report_rows  # noqa: E402
from pylib.experiments.compose_training import train  # noqa: E402
from pylib.plan import RunOptions
from pylib.plan.presets import tiny  # noqa: E402
from pylib.runtime import ParallelConfig, coordinates, launch, rank_groups  # noqa: E402
from pylib.viz import style  # noqa: E402
from pylib.viz.compose import (  # noqa: E402
    default_mesh_axes,
    mesh_columns,
    plot_rank_mesh,
    plot_rank_report,
    plot_token_placement,
    rank_formula,
)

FOLDED = ParallelConfig(tp=2, cp=2, dp=2, pp=2, ep=4)


def _gids(fig, prefix):
    return [p.get_gid() for ax in fig.axes for p in ax.patches if (p.get_gid() or "").startswith(prefix)]


def test_rank_formula_reads_the_order_string_fastest_axis_first():
    assert rank_formula(ParallelConfig(tp=2, cp=2, dp=2, pp=2)) == "rank = tp + 2·cp + 4·dp + 8·pp"
    assert rank_formula(ParallelConfig(tp=2, cp=2, dp=2, pp=2, order="tp-dp-cp-pp")) == "rank = tp + 2·dp + 4·cp + 8·pp"
    assert rank_formula(ParallelConfig(tp=4, dp=2, pp=2)) == "rank = tp + 4·dp + 8·pp"  # size-1 axes dropped
    for pc, world in (
        (ParallelConfig(tp=2, cp=2, dp=2, pp=2, order="tp-dp-cp-pp"), 16),
        (ParallelConfig(tp=4, dp=2), 8),
    ):
        terms = rank_formula(pc).removeprefix("rank = ").split(" + ")
        for r in range(world):
            c = coordinates(pc, world, r)
            value = sum(int(t.split("·")[0]) * c[t.split("·")[1]] if "·" in t else c[t] for t in terms)
            assert value == r


def test_mesh_rows_are_blocks_of_the_fastest_axes():
    assert mesh_columns(ParallelConfig(tp=2, cp=2, dp=2, pp=2), 16) == 4  # one row = one tp x cp block
    assert mesh_columns(ParallelConfig(tp=8, dp=2), 16) == 8  # never split the first axis
    assert mesh_columns(ParallelConfig(dp=4), 4) == 4


def test_default_axes_add_the_expert_groups_only_when_folding_regroups_the_ranks():
    assert default_mesh_axes(ParallelConfig(tp=2, cp=2, dp=2, pp=2), 16) == ["tp", "cp", "dp", "pp", "dp-cp"]
    assert default_mesh_axes(FOLDED, 16) == ["tp", "cp", "dp", "pp", "dp-cp", "ep", "edp"]  # etp = 1: no panel


def test_mesh_panels_colour_exactly_the_rank_generators_groups():
    fig = plot_rank_mesh(FOLDED, 16)
    groups = rank_groups(FOLDED, 16)
    cols = mesh_columns(FOLDED, 16)
    for axis in default_mesh_axes(FOLDED, 16):
        drawn = {}
        for gid in _gids(fig, f"mesh:{axis}:"):
            _, _, gi, rank = gid.split(":")
            drawn.setdefault(int(gi), []).append(int(rank))
        assert [sorted(drawn[i]) for i in range(len(groups[axis]))] == groups[axis], axis
    cells = [p for ax in fig.axes for p in ax.patches if (p.get_gid() or "").startswith("mesh:rank:")]
    assert len(cells) == 16
    for p in cells:
        r = int(p.get_gid().split(":")[2])
        assert (int(p.get_x()), int(p.get_y())) == (r % cols, r // cols)  # rank 0 top left, rows of cols ranks
    assert "rank = tp + 2·cp + 4·dp + 8·pp" in fig.axes[0].get_title()
    assert matplotlib.colors.to_hex(fig.get_facecolor()) == style.CARD
    plt.close(fig)


def test_token_placement_draws_the_owner_of_every_token_and_the_dp_and_microbatch_lines():
    B, S = 8, 16
    labels = holder_labels(S, 2, 2)  # cp 2 x tp 2 inside one replica
    owner = torch.stack([labels + 4 * (b // 4) for b in range(B)])
    fig = plot_token_placement(owner, microbatch_rows=2, dp_rows=4)
    drawn = {(int(b), int(s)): int(r) for b, s, r in (g.split(":")[1:] for g in _gids(fig, "token:"))}
    assert drawn == {(b, s): int(owner[b, s]) for b in range(B) for s in range(S)}
    ax = fig.axes[0]
    assert [line.get_ydata()[0] for line in ax.lines if line.get_gid() == "dp"] == [4]
    assert sorted(line.get_ydata()[0] for line in ax.lines if line.get_gid() == "microbatch") == [2, 6]
    plt.close(fig)


CFG = tiny().with_(n_layers=2)
PC = ParallelConfig(tp=2, dp=2, pp=2)


@pytest.fixture(scope="module")
def run():
    return launch(train, 8, CFG, PC, RunOptions(zero_stage=1, n_microbatches=2), steps=1, batch=4, seq=8, timeout=120)


@pytest.mark.timeout(120)
def test_report_bars_are_the_run_s_bytes_and_the_marks_the_formulas(run):
    rows = report_rows(run)
    memory = [dp_held_bytes(r["layouts"], 1) for r in run]
    traffic = []
    for r in run:
        f = formula_traffic(CFG, PC, r, RunOptions(n_microbatches=2, zero_stage=1), batch=4, seq=8)
        traffic.append({a: v["bytes_sent"] for a, v in per_axis(f).items()})
    fig = plot_rank_report(rows, traffic_formula=traffic, memory_formula=memory, unit="B")
    mem_ax, net_ax = fig.axes[:2]
    for row in rows:
        for part in ("params", "grads", "optim", "activations"):
            (bar,) = [p for p in mem_ax.patches if p.get_gid() == f"bar:{part}:{row['rank']}"]
            assert bar.get_height() == row[part]
        for axis, (sent, _) in row["traffic"].items():
            (bar,) = [p for p in net_ax.patches if p.get_gid() == f"bar:{axis}:{row['rank']}"]
            assert bar.get_height() == sent
    (mem_marks,) = [line for line in mem_ax.lines if line.get_gid() == "formula:memory"]
    assert list(mem_marks.get_ydata()) == [sum(m[k] for k in ("params", "grads", "optim")) for m in memory]
    (net_marks,) = [line for line in net_ax.lines if line.get_gid() == "formula:traffic"]
    tops = [sum(sent for sent, _ in row["traffic"].values()) for row in rows]
    assert list(net_marks.get_ydata()) == tops  # the run sent exactly what the formulas say
    plt.close(fig)
