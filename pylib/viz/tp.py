"""Figures for tensor and sequence parallelism, drawn from real runs of `pylib.tp`.

    ex = column_row_example(t=2)            # runs ColumnParallelLinear / RowParallelLinear on t ranks
    fig_column_vs_row(ex)                   # seed B's fig-mat-tp-col-row, with the real numbers

    traces = layer_traces(t=2)              # traces one TPBlock forward + backward, TP and TP + SP
    fig_sp_region(traces)                   # where SP's all-gathers and reduce-scatters sit around the TP region

Matrices are shown in seed B's layout, W [in, out] (torch stores [out, in]; the figures transpose it). Colours and
background are the book's (`pylib.viz.style`): a rank's cells in its rank colour, what every rank holds in
`REPLICATED`.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.patches import FancyBboxPatch

from . import style

# fig_sp_region's boxes: where the activations live, outside the TP region (LN, residual) or inside it
OUTSIDE, INSIDE = style.tint(style.GREEN, 0.4), style.tint(style.BLUE, 0.4)


# ------------------------------------------------------------------------------------------ column vs row split


@dataclass
class ColumnRowExample:
    """One column-parallel and one row-parallel matmul on t ranks, every number from the real shards.

    Seed B layout: x [n, d_in]; column split W [d_in, d_out] -> W_r [d_in, d_out/t], y_r = x W_r [n, d_out/t];
    row split V [d_out, d_in] -> V_r [d_out/t, d_in], partial_r = y_r V_r [n, d_in] (full size), z = sum_r."""

    x: np.ndarray
    col_weights: list[np.ndarray]  # W_r
    col_outputs: list[np.ndarray]  # y_r
    row_weights: list[np.ndarray]  # V_r
    partials: list[np.ndarray]  # y_r V_r, before the all-reduce
    reduced: np.ndarray  # what the all-reduce returns on every rank
    reference_y: np.ndarray  # x W on one device
    reference_z: np.ndarray  # x W V on one device


def _column_row_rank(x, up, down):
    from pylib.runtime import current_device
    from pylib.tp import ColumnParallelLinear, RowParallelLinear

    device = current_device()  # the rank's GPU under NCCL
    x, up, down = x.to(device), up.to(device), down.to(device)
    col = ColumnParallelLinear.from_full(up)
    row = RowParallelLinear.from_full(down)
    with torch.no_grad():
        y = col(x)
        partial = row.partial(y)
        reduced = row(y)
    return col.weight.T.clone(), y, row.weight.T.clone(), partial, reduced


def column_row_example(t: int = 2, n: int = 4, d_in: int = 4, d_out: int = 8, seed: int = 0) -> ColumnRowExample:
    """Run the split on t launched ranks (seed A's sizes by default: 4 tokens, d = 4, d_ff = 8)."""
    from pylib.runtime import launch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g, device="cpu").round(decimals=1)
    up = torch.nn.Linear(d_in, d_out, bias=False)
    down = torch.nn.Linear(d_out, d_in, bias=False)
    with torch.no_grad():
        up.weight.copy_(torch.randn(d_out, d_in, generator=g, device="cpu").round(decimals=1))
        down.weight.copy_(torch.randn(d_in, d_out, generator=g, device="cpu").round(decimals=1))
    ranks = launch(_column_row_rank, t, x, up, down)
    with torch.no_grad():
        ref_y, ref_z = up(x), down(up(x))
    return ColumnRowExample(
        x=x.numpy(),
        col_weights=[r[0].numpy() for r in ranks],
        col_outputs=[r[1].numpy() for r in ranks],
        row_weights=[r[2].numpy() for r in ranks],
        partials=[r[3].numpy() for r in ranks],
        reduced=ranks[0][4].numpy(),
        reference_y=ref_y.numpy(),
        reference_z=ref_z.numpy(),
    )


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
def fig_column_vs_row(ex: ColumnRowExample):
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


def _layer_trace_rank(cfg, b, s, modes):
    from pylib.model import build_model, random_hidden
    from pylib.runtime import current_device, trace
    from pylib.tp import TPBlock, scatter_to_sequence_parallel_region

    device = current_device()  # the rank's GPU under NCCL
    out = {}
    for name, sp, regather in modes:
        block = TPBlock.from_full(build_model(cfg).to(device).layers[0], sequence_parallel=sp, regather=regather)
        x = random_hidden(b, s, cfg.d_model, dtype=cfg.torch_dtype).to(device)
        x = (scatter_to_sequence_parallel_region(x) if sp else x).detach().requires_grad_()
        with trace() as tr:
            block(x).square().sum().backward()
        out[name] = [e.as_dict() for e in tr.events]
    return out


def layer_traces(t: int = 2, b: int = 1, s: int = 8, cfg=None, regather: bool = False) -> dict:
    """Trace one TPBlock forward + backward on t ranks, TP only and TP + SP; rank 0's events per mode, with sizes."""
    from pylib.model import ModelConfig
    from pylib.runtime import launch

    cfg = cfg or ModelConfig(d_model=16, n_heads=4, d_ff=64, n_layers=1)
    modes = [("TP", False, False), ("TP + SP", True, regather)]
    events = launch(_layer_trace_rank, t, cfg, b, s, modes)[0]
    return {"t": t, "b": b, "s": s, "h": cfg.d_model, "dtype": cfg.dtype, "events": events}


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
