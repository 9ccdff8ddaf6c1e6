"""Figures for the collectives primer (book/part0/collectives.md), drawn from what real ranks returned.

    fig_collective_shards(cases)   each collective's blocks before and after, one grid of ranks x blocks per side
    fig_ring_steps(held)           the ring all-reduce step by step: which ranks are summed into each chunk

Values follow `pylib.experiments.collective_runs`: an input block is 10*rank + j (its tens digit names the rank
that holds it), so a block coloured by that digit shows where it came from; a sum has no single owner and is
drawn in the REPLICATED grey. In the ring figure a chunk's label lists the ranks summed into it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from pylib import i18n

from . import style


def _cell(ax, x, y, text, fill, *, edge=None, lw=0.8, fontsize=9):
    ax.add_patch(plt.Rectangle((x, y), 1, 1, facecolor=fill, edgecolor=edge or style.CARD, lw=lw, zorder=2))
    ax.text(x + 0.5, y + 0.5, text, ha="center", va="center", fontsize=fontsize, color=style.ink_on(fill), zorder=3)


def _block_fill(value: float, inputs: set[float]) -> str:
    """An input block in its rank's colour (light), a sum in the replicated grey."""
    if value in inputs:
        return style.tint(style.rank_colour(int(value) // 10), 0.45)
    return style.tint(style.REPLICATED, 0.35)


def _grid(ax, x0, rows, inputs):
    for r, row in enumerate(rows):
        for j, v in enumerate(row):
            _cell(ax, x0 + j, -r - 1, f"{int(v):02d}", _block_fill(float(v), inputs))


@style.styled
def fig_collective_shards(cases):
    """cases: a list of (name, before, after), `before` [n][k] and `after` [n][k'] the values each rank held
    before and after the collective (lists or tensors, rank r's row r; at most 4 blocks a side reads well).
    One panel per collective, two columns of panels: the rank-by-block grid before, an arrow, the grid after."""
    cols = 2
    rows_ = (len(cases) + cols - 1) // cols
    fig, axes = style.subplots(rows_, cols, figsize=(7.2, 2.3 * rows_ + 0.2), grid=False, squeeze=False)
    for ax in axes.flat[len(cases) :]:
        ax.set_visible(False)
    for ax, (name, before, after) in zip(axes.flat, cases):
        before = [[float(v) for v in row] for row in before]
        after = [[float(v) for v in row] for row in after]
        n, k, k2 = len(before), len(before[0]), len(after[0])
        inputs = {v for row in before for v in row}
        _grid(ax, 0, before, inputs)
        x_after = k + 1.4
        _grid(ax, x_after, after, inputs)
        ax.annotate(
            "",
            xy=(x_after - 0.15, -n / 2),
            xytext=(k + 0.15, -n / 2),
            arrowprops=dict(arrowstyle="->", color=style.COMM, lw=1.6),
        )
        for r in range(n):
            ax.text(-0.15, -r - 0.5, i18n.tr("rank {r}", r=r), ha="right", va="center", fontsize=9)
        ax.text(k / 2, 0.25, i18n.tr("before"), ha="center", va="bottom", fontsize=9, color=style.MUTED)
        ax.text(x_after + k2 / 2, 0.25, i18n.tr("after"), ha="center", va="bottom", fontsize=9, color=style.MUTED)
        ax.set_title(name, fontsize=11, pad=4)
        ax.set_xlim(-1.9, x_after + max(k2, 4) + 0.1)
        ax.set_ylim(-n - 0.1, 1.0)
        ax.set_aspect("equal")
        ax.axis("off")
    fig.tight_layout()
    return fig


@style.styled
def fig_ring_steps(held, *, title="Ring all-reduce on real ranks: the ranks summed into each chunk"):
    """held [step][rank][chunk]: the tuple of ranks whose contributions that rank's chunk holds after that step
    (step 0 the input; `pylib.experiments.collective_runs.ring_contributors`). For n <= 4 ranks.

    One panel per step, reduce-scatter steps on the top row and all-gather steps below; in a panel, a row per
    rank and a column per chunk, the cell labelled with the ranks in its sum (Σ once it holds all n), darker the
    more it holds; the cell that changed at that step (the chunk just received) has a thick dark edge."""
    n = len(held[0])
    if n > 4:
        raise ValueError(f"fig_ring_steps draws up to 4 ranks legibly, got {n}")
    cols = n  # top: input and the n-1 reduce-scatter steps; bottom: the n-1 all-gather steps
    fig, axes = style.subplots(2, cols, figsize=(7.2, 4.4), grid=False, squeeze=False)
    panels = [axes[0, c] for c in range(cols)] + [axes[1, c] for c in range(1, cols)]
    axes[1, 0].axis("off")
    axes[1, 0].text(
        0.5,
        0.5,
        i18n.tr("cell: the ranks\nsummed into it\nΣ: all of them\n\nthick edge: the\nchunk received\nat this step"),
        ha="center",
        va="center",
        fontsize=9,
        color=style.MUTED,
        transform=axes[1, 0].transAxes,
    )
    for s, ax in enumerate(panels):
        for r in range(n):
            for c in range(n):
                ranks = held[s][r][c]
                changed = s > 0 and ranks != held[s - 1][r][c]
                fill = style.tint(style.COMM, 1.0 - 0.85 * len(ranks) / n)
                edge, lw = (style.INK, 2.2) if changed else (style.CARD, 0.8)
                label = "Σ" if len(ranks) == n else "".join(map(str, ranks))
                _cell(ax, c, -r - 1, label, fill, edge=edge, lw=lw, fontsize=10 if len(label) < 3 else 9)
        phase = "input" if s == 0 else ("reduce-scatter" if s < n else "all-gather")
        ax.set_title(i18n.tr("step {s}: {phase}", s=s, phase=phase) if s else i18n.tr("input"), fontsize=9, pad=3)
        ax.set_xlim(-0.05, n + 0.05)
        ax.set_ylim(-n - 0.05, 0.05)
        ax.set_aspect("equal")
        ax.set_xticks([c + 0.5 for c in range(n)], [f"c{c}" for c in range(n)], fontsize=9)
        ax.set_yticks([-r - 0.5 for r in range(n)], [f"r{r}" for r in range(n)], fontsize=9)
        ax.tick_params(length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
