"""Article B's matrix-view figures from measurements: which tensor dimension each mode cuts (fig-mat-dim-orth), the
column- and row-parallel shards (fig-mat-tp-col-row) and the FFN intermediate cut by TP, then CP, then DP
(fig-mat-superposition).

    fig_dim_orth(axis_cuts(...))                       # a filled cell where a rank holds part of a dimension
    fig_col_row(column_row_example(t=2))
    fig_superposition(runs, b, s, d_ff, tp, cp, dp)    # runs: `probe_compose` records of a 16-rank run
"""

from __future__ import annotations

import numpy as np
from matplotlib.patches import Rectangle

from pylib.seedcheck.axis_cuts import DIMS, MODES

from ..i18n import tr
from . import style
from .tp import fig_column_vs_row

DIM_TICKS = {"h": "h\n(residual)", "n_head": "n_head\n(heads)", "L": "L\n(layers)", "E": "E\n(experts)"}


DIM_LABELS = {
    "b": "b (batch)",
    "s": "s (sequence)",
    "h": "h (residual stream)",
    "n_head": "n_head (h = n_head d_head inside attention)",
    "h_ffn": "h_ffn",
    "V": "V (vocabulary)",
    "L": "L (layers)",
    "E": "E (experts)",
}


@style.styled
def fig_dim_orth(cuts: dict[str, dict[str, float]], modes=MODES, dims=DIMS):
    """Article B's fig-mat-dim-orth from measurements: one row per mode, one column per tensor dimension, a filled
    cell where the mode's ranks hold only part of that dimension (the share written in it)."""
    fig, ax = style.subplots(figsize=(1.05 * len(dims) + 1.6, 0.55 * len(modes) + 1.4), grid=False)
    ax.set_xlim(0, len(dims))
    ax.set_ylim(len(modes), 0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    colours = {m: style.rank_colour(i) for i, m in enumerate(modes)}
    for i, mode in enumerate(modes):
        for j, dim in enumerate(dims):
            share = cuts[mode].get(dim, 1.0)
            cut = share < 1
            ax.add_patch(
                Rectangle(
                    (j + 0.06, i + 0.08),
                    0.88,
                    0.84,
                    facecolor=colours[mode] if cut else style.CARD,
                    edgecolor=style.GRID,
                    lw=1.0,
                )
            )
            if cut:
                ax.text(
                    j + 0.5,
                    i + 0.5,
                    f"1/{round(1 / share)}",
                    ha="center",
                    va="center",
                    fontsize=style.legible_pt(fig, 9),
                    color=style.ink_on(colours[mode]),
                    fontweight="bold",
                )
    ax.set_xticks(np.arange(len(dims)) + 0.5, [DIM_TICKS.get(d, d) for d in dims])
    ax.set_yticks(np.arange(len(modes)) + 0.5, modes)
    ax.tick_params(length=0, labelsize=style.legible_pt(fig, 9))
    ax.xaxis.tick_top()
    ax.set_title(
        tr("share of each dimension one rank holds, measured on 2 ranks per mode (SP: beyond TP's cuts)"),
        fontsize=style.legible_pt(fig, 9),
        pad=34,
    )
    fig.tight_layout()
    return fig


def fig_col_row(ex):
    """Article B's fig-mat-tp-col-row from the real shards of `pylib.experiments.tp_runs.column_row_example`: the TP
    chapter's figure (`pylib.viz.tp.fig_column_vs_row`, one page column wide, four rows of matrices)."""
    return fig_column_vs_row(ex)


def superposition_pieces(runs: list[dict], b: int, s: int, d_ff: int) -> np.ndarray:
    """[b, s, h_ffn] array of owners: which rank's FFN intermediate holds each element, from each rank's measured
    rows (dp), positions (cp) and hidden columns (tp). -1 where nobody does."""
    owner = -np.ones((b, s, d_ff), dtype=int)
    for r, run in enumerate(runs):
        rows, pos, cols = run["rows"], run["positions"], run["hidden_cols"]
        block = owner[np.ix_(rows, pos, cols)]
        if (block != -1).any():
            raise AssertionError(f"rank {r} holds elements another rank holds")
        owner[np.ix_(rows, pos, cols)] = r
    return owner


@style.styled
def fig_superposition(runs: list[dict], b: int, s: int, d_ff: int, tp: int, cp: int, dp: int, rank: int = 0):
    """Article B's fig-mat-superposition from the 16-rank run: the FFN intermediate [b, s, h_ffn] drawn as b
    stacked sequences (rows: tokens, columns: h_ffn), and the part rank `rank` holds after TP, then CP, then DP:
    each panel shades the elements that rank still holds, with the cut lines of the axes applied so far."""
    me = runs[rank]
    rows, pos, cols = set(me["rows"]), set(me["positions"]), set(me["hidden_cols"])
    stages = [
        ("one device", lambda i, t, j: True, 1),
        (f"TP = {tp}: cut h_ffn", lambda i, t, j: j in cols, tp),
        (f"+ CP = {cp}: cut s (zig-zag)", lambda i, t, j: j in cols and t in pos, tp * cp),
        (f"+ DP = {dp}: cut b", lambda i, t, j: j in cols and t in pos and i in rows, tp * cp * dp),
    ]
    fig, axes = style.subplots(2, 2, figsize=(7.2, 7.4), grid=False)
    colour = style.PALETTE[0]
    for ax, (title, holds, parts) in zip(axes.ravel(), stages):
        ax.set_xlim(0, d_ff)
        ax.set_ylim(b * s, 0)
        ax.set_xticks([0, d_ff], ["0", f"h_ffn = {d_ff}"])
        ax.set_yticks([i * s + s / 2 for i in range(b)], [f"seq {i}" for i in range(b)], fontsize=8)
        ax.tick_params(axis="x", labelsize=8)
        ax.tick_params(axis="y", length=0)
        held = 0
        for i in range(b):
            for t in range(s):
                run_start = None
                for j in range(d_ff + 1):
                    inside = j < d_ff and holds(i, t, j)
                    if inside and run_start is None:
                        run_start = j
                    if not inside and run_start is not None:
                        ax.add_patch(
                            Rectangle((run_start, i * s + t), j - run_start, 1, facecolor=colour, edgecolor="none")
                        )
                        held += j - run_start
                        run_start = None
        for i in range(1, b):
            ax.axhline(i * s, color=style.MUTED, lw=1.2)
        if parts > 1:
            for j in range(1, tp):
                ax.axvline(j * d_ff / tp, color=style.MUTED, lw=0.6, ls="--")
        ax.set_title(title + "\n" + tr("rank {r} holds 1/{n}", r=rank, n=round(b * s * d_ff / held)), fontsize=9)
    fig.suptitle(
        tr(
            "FFN intermediate [b, s, h_ffn] = [{b}, {s}, {d_ff}]: the part rank {rank} holds\n"
            "(coordinates tp {tp}, cp {cp}, dp {dp})",
            b=b,
            s=s,
            d_ff=d_ff,
            rank=rank,
            tp=me["coords"]["tp"],
            cp=me["coords"]["cp"],
            dp=me["coords"]["dp"],
        ),
        fontsize=10,
    )
    fig.tight_layout()
    return fig
