"""The CP figures draw from real runs: the round table from a ring's trace, the balance from measured work."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from pylib.cp import RingStats, ring_attention, ring_rounds, shard_sequence  # noqa: E402
from pylib.plan.presets import tiny_layer  # noqa: E402
from pylib.runtime import launch, trace  # noqa: E402
from pylib.viz import style  # noqa: E402
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
    assert fig.get_facecolor() == matplotlib.colors.to_rgba(style.CARD)
    work = {layout: [w for _, w in runs[layout]] for layout in runs}
    fig2 = zigzag_balance_figure(work)
    heights = [p.get_height() for p in fig2.axes[0].patches]
    assert heights == work["contiguous"] + work["zigzag"]
    assert "max/min = 1.00" in fig2.axes[0].get_legend().get_texts()[1].get_text()
    fig3 = causal_ownership_figure(16, 4)
    assert len(fig3.axes) == 2
    plt.close("all")


def test_sequence_split_figure_colours_rows_by_the_owner_named_in_the_shard_specs():
    from pylib.cp import CPTransformer, sequence_positions
    from pylib.model import build_model
    from pylib.runtime.mesh import AxisGroup
    from pylib.viz.cp import sequence_split_figure

    model = build_model(tiny_layer())
    s, cp = 16, 4
    for layout in ("contiguous", "zigzag"):
        specs = [
            CPTransformer.from_full(model, group=AxisGroup("cp", tuple(range(cp)), r, None), layout=layout).shard_specs(
                2, s
            )
            for r in range(cp)
        ]
        fig = sequence_split_figure(specs, s)
        x_img, score_img = (ax.get_images()[0].get_array() for ax in fig.axes[:2])
        for r in range(cp):
            rows = sequence_positions(s, r, cp, layout)
            colour = x_img[rows.tolist(), 0, :3]
            assert (colour == colour[0]).all()  # one colour per rank ...
            others = [i for i in range(s) if i not in rows.tolist()]
            assert not (x_img[others, 0, :3] == colour[0]).all(axis=-1).any()  # ... no other rank's
            # solid (alpha 1) exactly where query and key live on the same rank, below the diagonal
            for i in rows.tolist():
                solid = [j for j in range(i + 1) if score_img[i, j, 3] == 1.0]
                assert solid == [j for j in rows.tolist() if j <= i]
        assert (score_img[0, 1:, 3] == 0).all()  # causal: the first query sees only itself
    plt.close("all")


def test_merge_drift_figure_plots_the_measured_rows():
    from pylib.viz.cp import merge_drift_figure

    rows = [dict(cp=c, bf16_merge=1e-3 * c, fp32_merge=2e-4) for c in (1, 2, 4, 8)]
    fig = merge_drift_figure(rows)
    lines = fig.axes[0].get_lines()
    assert list(lines[0].get_ydata()) == [1e-3, 2e-3, 4e-3, 8e-3] and list(lines[1].get_ydata()) == [2e-4] * 4
    assert fig.get_facecolor() == matplotlib.colors.to_rgba(style.CARD)
    plt.close("all")


def _allgather_rank():
    from pylib.cp import allgather_attention, sequence_positions

    r, n = dist.get_rank(), dist.get_world_size()
    x = torch.randn(1, 2, 16, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    q = shard_sequence(x, 2, r, n, "zigzag")
    blocks = []
    with trace() as tr:
        allgather_attention(q, q, q, causal=True, blocks=blocks)
    return dict(positions=sequence_positions(16, r, n).tolist(), blocks=blocks, sent=tr.total("bytes_sent"))


def test_allgather_figure_draws_each_ranks_held_chunks_and_the_keys_its_queries_read_from_a_real_run():
    from pylib.viz.cp import allgather_figure

    runs = launch(_allgather_rank, 4)
    fig = allgather_figure(runs, 16)
    ax = fig.axes[0]
    solid = [p for p in ax.patches if p.get_alpha() == 1.0]
    assert len(ax.patches) == 4 * 8 and len(solid) == 4 * 2  # every rank: 8 chunks, 2 of them its own
    # one bar per query chunk, reaching to the end of that chunk: rank 0's chunks 0 and 7 read 1 and 8 chunks
    bars = [line.get_xdata()[1] + 0.58 for line in ax.get_lines()]
    assert bars[:2] == [1.0, 8.0] and len(bars) == 8
    assert "sent 1.5 KiB" in [t.get_text() for t in ax.texts]  # (cp - 1) shards of K and V [2, 1, 2, 4, 4] float64
    plt.close("all")
