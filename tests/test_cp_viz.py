"""The CP figures draw from real runs: the round table from a ring's trace, the balance from measured work."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from pylib.cp import RingStats, ring_attention, ring_rounds, shard_sequence  # noqa: E402
from pylib.dist import launch, trace  # noqa: E402
from pylib.viz.cp import causal_ownership_figure, ring_rounds_figure, zigzag_balance_figure  # noqa: E402


def _rank(layout):
    r, n = dist.get_rank(), dist.get_world_size()
    x = torch.randn(1, 2, 16, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    q = shard_sequence(x, 2, r, n, layout)
    stats = RingStats()
    with trace() as tr:
        ring_attention(q, q, q, causal=True, layout=layout, stats=stats)
    return tr.events, stats.work("forward", "computed")


def test_figures_draw_from_a_real_trace_and_measured_work():
    runs = {layout: launch(_rank, 4, layout) for layout in ("contiguous", "zigzag")}
    rows = ring_rounds([events for events, _ in runs["zigzag"]])
    fig = ring_rounds_figure(rows)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts[:4] == ["K0V0", "K1V1", "K2V2", "K3V3"] and texts[4:8] == ["K3V3", "K0V0", "K1V1", "K2V2"]
    assert fig.patch.get_alpha() == 0.0
    work = {layout: [w for _, w in runs[layout]] for layout in runs}
    fig2 = zigzag_balance_figure(work)
    heights = [p.get_height() for p in fig2.axes[0].patches]
    assert heights == work["contiguous"] + work["zigzag"]
    assert "max/min = 1.00" in fig2.axes[0].get_legend().get_texts()[1].get_text()
    fig3 = causal_ownership_figure(16, 4)
    assert len(fig3.axes) == 2
    plt.close("all")
