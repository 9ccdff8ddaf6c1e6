"""Figures for tensor and sequence parallelism, drawn from real runs of `pylib.tp`.

    fig_column_vs_row(column_row_example(t=2))   # seed B's fig-mat-tp-col-row, with the real numbers
    fig_sp_region(layer_traces(t=2))             # where SP's all-gathers and reduce-scatters sit around the TP region

The runs (`column_row_example`, `layer_traces`: real ranks) are `pylib.experiments.tp_runs`.

Matrices are shown in seed B's layout, W [in, out] (torch stores [out, in]; the figures transpose it). Colours and
background are the book's (`pylib.viz.style`): a rank's cells in its rank colour, what every rank holds in
`REPLICATED`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyBboxPatch

from . import style

# fig_sp_region's boxes: where the activations live, outside the TP region (LN, residual) or inside it
OUTSIDE, INSIDE = style.tint(style.GREEN, 0.4), style.tint(style.BLUE, 0.4)


# ------------------------------------------------------------------------------------------ column vs row split


def _matrix(ax, m: np.ndarray, title: str, colour: str, fmt: str = "{:.1f}"):
    """Draw a small matrix as coloured cells with its numbers."""
    rows, cols = m.shape
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_aspect("equal")
    ax.axis("off")
    span = max(float(np.abs(m).max()), 1e-9)
    for i in range(rows):
        for j in range(cols):
            alpha = 0.35 + 0.55 * abs(float(m[i, j])) / span
            ax.add_patch(plt.Rectangle((j, i), 1, 1, facecolor=colour, alpha=alpha, edgecolor=style.GRID, lw=0.5))
            ink = style.ink_on(colour, alpha)
            ax.text(j + 0.5, i + 0.5, fmt.format(m[i, j]), ha="center", va="center", fontsize=7, color=ink)
    ax.set_title(title, fontsize=8)


@style.styled
def fig_column_vs_row(ex):
    """Seed B's fig-mat-tp-col-row: the column split's outputs concatenate; the row split's outputs are full-size
    partial sums that must be all-reduced. Every number is from the ranks' real shards."""
    t = len(ex.col_weights)
    fig, axes = style.subplots(2, 2 * t + 2, figsize=(2.0 * (2 * t + 2), 5.2), grid=False)
    top, bottom = axes
    _matrix(top[0], ex.x, "x [n, d_in]\n(whole on every rank)", style.REPLICATED)
    for r in range(t):
        c = style.rank_colour(r)
        _matrix(top[1 + r], ex.col_weights[r], f"rank {r}: W_{r}\n[d_in, d_out/t] (columns)", c)
        _matrix(top[1 + t + r], ex.col_outputs[r], f"rank {r}: y_{r} = x W_{r}\n[n, d_out/t]", c)
    _matrix(top[-1], np.concatenate(ex.col_outputs, axis=1), "concat(y_r) = x W\nno communication", style.REPLICATED)
    for r in range(t):
        c = style.rank_colour(r)
        _matrix(bottom[r], ex.row_weights[r], f"rank {r}: V_{r}\n[d_out/t, d_in] (rows)", c)
        _matrix(bottom[t + r], ex.partials[r], f"rank {r}: y_{r} V_{r}\npartial sum, full size", c)
    _matrix(bottom[2 * t], ex.reduced, "all-reduce: sum of\nthe partial sums", style.REPLICATED)
    bottom[2 * t + 1].axis("off")
    ok_y = np.allclose(np.concatenate(ex.col_outputs, axis=1), ex.reference_y, atol=1e-5)
    ok_z = np.allclose(ex.reduced, ex.reference_z, atol=1e-5)
    bottom[2 * t + 1].text(
        0.0,
        0.5,
        f"one device:\nconcat = x W  {'yes' if ok_y else 'NO'}\nsum = x W V  {'yes' if ok_z else 'NO'}",
        fontsize=8,
        va="center",
    )
    fig.suptitle(
        f"TP on {t} ranks. Column split (top): each rank owns output columns, results concatenate.\n"
        "Row split (bottom): each rank owns input rows, every rank's result is a full-size partial sum: all-reduce.",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------ SP around the region


def _box(ax, x, y, w, text, colour):
    ax.add_patch(
        FancyBboxPatch((x, y - 0.3), w, 0.6, boxstyle="round,pad=0.02", facecolor=colour, edgecolor=style.MUTED, lw=0.8)
    )
    ax.text(x + w / 2, y, text, ha="center", va="center", fontsize=7, color=style.ink_on(colour))


def _nbytes(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


def _arrow(ax, x, y, label, below, colour=style.COMM, dashed=False):
    ax.annotate(
        "",
        xy=(x + 0.9, y),
        xytext=(x, y),
        arrowprops=dict(arrowstyle="->", color=style.MUTED, lw=1, linestyle="--" if dashed else "-"),
    )
    ax.text(x + 0.45, y + 0.42, label, ha="center", fontsize=6.5, color=colour)
    if below:
        ax.text(x + 0.45, y - 0.52, below, ha="center", va="top", fontsize=6, color=style.MUTED)


def _inside_label(tag: str, s: int) -> str:
    part = tag.split(".")[-1]
    what = {"attn": "1/t of heads", "mlp": "1/t of h_ffn"}.get(part, "1/t of columns")
    return f"{part}: {what}\nall {s} tokens"


def _phase_row(ax, y, events, phase, t, s):
    """One row: where the activations (forward) or their gradients (backward) live between the collectives this
    rank issued in `phase`, in issue order. An all-gather enters the TP region; an all-reduce or a reduce-scatter
    leaves it. TP enters with no communication at all (identity forward; in backward the identity is the
    conjugate of the forward all-reduce), drawn dashed."""
    evs = [e for e in events if e["phase"] == phase]
    sp = any(e["op"] != "all_reduce" for e in evs)
    outside = f"LN, residual\n{s // t if sp else s} tokens"
    x = 0.0
    _box(ax, x, y, 1.4, outside, OUTSIDE)
    x += 1.5
    where = "out"
    names = {"all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter"}
    for e in evs:
        regather = e["tag"].endswith("regather")
        if e["op"] != "all_gather" and where == "out":  # TP: the entry that moves nothing
            _arrow(ax, x, y, "identity", "no communication", colour=style.MUTED, dashed=True)
            x += 1.0
            _box(ax, x, y, 1.4, _inside_label(e["tag"], s), INSIDE)
            x += 1.5
            where = "in"
        _arrow(
            ax, x, y, names[e["op"]] + (" (regather)" if regather else ""), f"{_nbytes(e['payload_bytes'])}\n{e['tag']}"
        )
        x += 1.0
        if regather:  # Megatron's SP backward: rebuild the input that was kept as a sequence slice
            _box(ax, x, y, 1.4, "weight grads\nfrom rebuilt input", INSIDE)
            x += 1.5
            continue
        where = "in" if e["op"] == "all_gather" else "out"
        if where == "in":
            _box(ax, x, y, 1.4, _inside_label(e["tag"], s), INSIDE)
        else:
            _box(ax, x, y, 1.4, outside, OUTSIDE)
        x += 1.5
    return x


@style.styled
def fig_sp_region(traces: dict):
    """Rows: TP and TP + SP, forward and backward; boxes are where the activations live (green: outside the TP
    region, s/t tokens under SP; blue: inside, all tokens, heads or h_ffn split), arrows the collectives this
    rank really issued (from the trace), with their payloads. Same payload sum per row: AR = AG + RS."""
    t, s, events = traces["t"], traces["s"], traces["events"]
    rows = [(mode, phase) for mode in events for phase in ("forward", "backward")]
    fig, ax = style.subplots(figsize=(13, 1.35 * len(rows) + 0.6), grid=False)
    width = 0.0
    for i, (mode, phase) in enumerate(rows):
        y = -1.6 * i
        ax.text(-0.2, y, f"{mode}\n{phase}", ha="right", va="center", fontsize=8)
        width = max(width, _phase_row(ax, y, events[mode], phase, t, s))
        total = sum(e["bytes_sent"] for e in events[mode] if e["phase"] == phase)
        ax.text(width + 0.1, y, f"sent {_nbytes(total)}", va="center", fontsize=7)
    ax.set_xlim(-1.6, width + 1.5)
    fig.set_size_inches(max(8.0, 0.85 * (width + 3.1)), 1.35 * len(rows) + 0.6)
    ax.set_ylim(-1.6 * (len(rows) - 1) - 1.0, 0.9)
    ax.axis("off")
    ax.set_title(
        f"One layer, t = {t}, b = {traces['b']}, s = {s}, h = {traces['h']} ({traces['dtype']}): SP turns each "
        "all-reduce into an all-gather into the TP region and a reduce-scatter out of it",
        fontsize=9,
    )
    fig.tight_layout()
    return fig
