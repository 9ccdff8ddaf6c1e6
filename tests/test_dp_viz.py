"""The data-parallel figures draw what real runs measured."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from pylib.analysis.dp import held_bytes  # noqa: E402
from pylib.dist import launch  # noqa: E402
from pylib.dp import STAGES, train_data_parallel  # noqa: E402
from pylib.model import ModelConfig  # noqa: E402
from pylib.viz.dp import plot_bucket_overlap, plot_zero_memory  # noqa: E402

CFG = ModelConfig(vocab_size=37, d_model=9, n_heads=3, d_ff=22, n_layers=2, dtype="float64")


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
