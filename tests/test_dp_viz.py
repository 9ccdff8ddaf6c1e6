"""The data-parallel figures draw what real runs measured."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from pylib.analysis.dp import held_bytes  # noqa: E402
from pylib.dp import STAGES  # noqa: E402
from pylib.experiments.dp_training import train_data_parallel  # noqa: E402
from pylib.plan.presets import tiny_odd  # noqa: E402
from pylib.runtime import launch  # noqa: E402
from pylib.viz.dp import (  # noqa: E402
    plot_bucket_overlap,
    plot_dp_matrix,
    plot_flat_layout,
    plot_hsdp_mesh,
    plot_zero3_resident,
    plot_zero_memory,
)

CFG = tiny_odd()


def _all_stages():
    return {s: train_data_parallel(CFG, s, steps=1, bucket_bytes=1024, keep_events=False) for s in STAGES}


@pytest.fixture(scope="module")
def runs():
    return launch(_all_stages, 2)


def test_memory_bars_are_the_measured_bytes_and_the_formula_line_sits_on_them(runs):
    measured = {s: runs[0][s]["memory"] for s in STAGES}
    n = sum(lay.numel for lay in runs[0]["ddp"]["layouts"])
    formula = {
        s: held_bytes(n, 8, 2, s, padded_params=sum(lay.padded_numel for lay in runs[0][s]["layouts"])) for s in STAGES
    }
    fig = plot_zero_memory(measured, formula=formula, unit="B")
    ax = fig.axes[0]
    for key in ("params", "grads", "optim"):
        heights = [p.get_height() for p in ax.patches if p.get_gid() == key]
        assert heights == [measured[s][key] for s in STAGES]
    lines = [line.get_ydata()[0] for line in ax.lines if line.get_gid() == "formula"]
    assert lines == [sum(measured[s][k] for k in ("params", "grads", "optim")) for s in STAGES]
    assert len([p for p in ax.patches if p.get_gid() == "transient"]) >= 1  # ZeRO-3's gathered unit
    plt.close(fig)


def test_overlap_timeline_has_one_bar_per_bucket_and_rank(runs):
    reports = [r["ddp"]["overlap"] for r in runs]
    fig = plot_bucket_overlap(reports)
    ax = fig.axes[0]
    assert len([p for p in ax.patches if p.get_gid() == "bucket"]) == sum(len(r.buckets) for r in reports)
    assert len([p for p in ax.patches if p.get_gid() == "backward"]) == 2
    widths = sorted(p.get_width() for p in ax.patches if p.get_gid() == "bucket")
    expected = sorted((b.t_done - b.t_launch) * 1e3 for r in reports for b in r.buckets)
    assert widths == pytest.approx(expected)
    plt.close(fig)


def test_matrix_picture_splits_tokens_over_ranks_and_refuses_a_sharded_weight():
    fig = plot_dp_matrix(4, 8, 9, 22)
    ax = fig.axes[0]
    # X, Y, X^T and dY in 4 rank bands each; W replicated; dW as 4 partial sums
    assert len([p for p in ax.patches if p.get_gid() == "rank"]) == 4 * 4
    assert len([p for p in ax.patches if p.get_gid() == "weight"]) == 1
    assert len([p for p in ax.patches if p.get_gid() == "partial"]) == 4
    plt.close(fig)
    with pytest.raises(ValueError, match="replicates every weight; the spec for W says 'zero'"):
        plot_dp_matrix(2, 4, 8, 8, kind="zero")


def test_flat_layout_draws_every_parameter_the_padding_and_one_slice_per_rank(runs):
    lay = runs[0]["zero2"]["layouts"][0]
    fig = plot_flat_layout(lay)
    ax = fig.axes[0]
    params = [p for p in ax.patches if p.get_gid() == "param"]
    assert [(p.get_x(), p.get_width()) for p in params] == [(e.offset, e.numel) for e in lay.entries]
    slices = [p for p in ax.patches if p.get_gid() == "slice"]
    assert [(p.get_x(), p.get_x() + p.get_width()) for p in slices] == [lay.shard_range(r) for r in range(lay.parts)]
    assert len([p for p in ax.patches if p.get_gid() == "padding"]) == (1 if lay.padding else 0)
    plt.close(fig)


def test_zero3_resident_curve_is_the_measured_timeline(runs):
    r = runs[0]["zero3"]
    shards = sum(r["unit_bytes"].values()) // 2  # d = 2: each rank keeps half of every padded unit
    fig = plot_zero3_resident(r["timeline"], shards, unit="B")
    ax = fig.axes[0]
    (curve,) = [line for line in ax.lines if line.get_gid() == "resident"]
    assert list(curve.get_ydata())[:-1] == [b for _, b, _ in r["timeline"]]  # one step per gather or free
    assert max(curve.get_ydata()) == r["memory"]["peak_params"]
    plt.close(fig)


def test_hsdp_mesh_draws_a_row_per_node_a_line_per_replica_group_and_the_bytes_given():
    from pylib.plan.mesh import hsdp_groups
    from pylib.viz import style

    shards, replicas = hsdp_groups(range(8), 4)
    fig = plot_hsdp_mesh(shards, replicas, {"dp-shard": 3 * 1024, "dp-replicate": 512}, unit="KiB")
    ax = fig.axes[0]
    assert len([p for p in ax.patches if p.get_gid() == "rank"]) == 8
    assert len([p for p in ax.patches if p.get_gid() == "node"]) == 2
    assert len([line for line in ax.lines if line.get_gid() == "replica"]) == 4
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "3.0 KiB" in texts and "0.5 KiB" in texts and "rank 7" in texts
    assert style.smallest_text_px(fig) >= style.LEGIBLE_PX
    plt.close(fig)
