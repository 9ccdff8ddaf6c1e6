"""Figures of the composed model: the rank mesh, where the global batch lands, and what each rank holds and moves.

    fig = plot_rank_mesh(ParallelConfig(tp=2, cp=2, dp=2, pp=2, ep=4), 16)    # from the rank generator
    fig = plot_token_placement(owner, microbatch_rows=2, dp_rows=4)           # owner [B, S]: rank holding each token
    fig = plot_rank_report(report_rows(results), traffic_formula=..., memory_formula=...)   # a real run, per rank

Every figure is drawn under `pylib.viz.style` (a near-white card with mid-tone colours, readable in the site's light
and dark themes). Drawn elements carry a `gid` naming what they show ("mesh:tp:3:6" is rank 6 in TP group 3,
"token:2:5:9" token 5 of sequence 2 held by rank 9, "bar:params:4" rank 4's parameter bytes), so the tests can check
a figure against the data it was drawn from.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from pylib.plan.mesh import AXES, ParallelConfig, coordinates, rank_groups

from ..i18n import N_, tr
from . import style

MEMORY_PARTS = ("params", "grads", "optim", "activations")
MEMORY_LABELS = {
    "params": "parameters",
    "grads": "gradients",
    "optim": "optimizer state",
    "activations": "saved activations (peak)",
}
_MEMORY_SHOWN = {
    "params": N_("parameters"),
    "grads": N_("gradients"),
    "optim": N_("optimizer state"),
    "activations": N_("saved activations (peak)"),
}
AXIS_ORDER = ("tp", "cp", "ep", "etp", "pp", "dp-cp", "edp", "tp-cp")
AXIS_COLOURS = dict(zip(AXIS_ORDER, style.PALETTE))


def _dense_sizes(config: ParallelConfig) -> list[tuple[str, int]]:
    """(axis, size) of the dense layout in the order string's order, fastest-varying first (ep is 1 there)."""
    sizes = dict(tp=config.tp, cp=config.cp, ep=1, dp=config.dp, pp=config.pp)
    tokens = config.order.split("-")
    return [(a, sizes[a]) for a in tokens + [a for a in AXES if a not in tokens]]


def mesh_columns(config: ParallelConfig, world_size: int) -> int:
    """Columns of the rank grid: the product of the fastest-varying axes of the order string, up to sqrt(world), so
    that a row of the grid is one block of the fastest axes (tp x cp for the default order)."""
    cols = 1
    for _, size in _dense_sizes(config):
        if cols * size > math.isqrt(world_size) and cols > 1:
            break
        cols *= size
    return cols


def rank_formula(config: ParallelConfig) -> str:
    """The global rank as a sum over the dense axes, e.g. "rank = tp + 2·cp + 4·dp + 8·pp" (sizes-1 axes dropped)."""
    terms, stride = [], 1
    for axis, size in _dense_sizes(config):
        if size > 1:
            terms.append(axis if stride == 1 else f"{stride}·{axis}")
        stride *= size
    return "rank = " + (" + ".join(terms) if terms else "0")


def default_mesh_axes(config: ParallelConfig, world_size: int) -> list[str]:
    """The groups worth drawing: every dense axis of size > 1, dp-cp when both are, and the expert axes when the
    folded expert layout differs from the dense one."""
    axes = [a for a in ("tp", "cp", "dp", "pp") if getattr(config, a) > 1]
    if config.dp > 1 and config.cp > 1:
        axes.append("dp-cp")
    if config.ep > 1 or config.etp > 1:
        axes += [a for a in ("etp", "ep", "edp") if len(rank_groups(config, world_size)[a][0]) > 1]
    return axes


def _cell(ax, x, y, colour, text, gid, alpha=0.32, fontsize=9):
    ax.add_patch(Rectangle((x + 0.06, y + 0.06), 0.88, 0.88, facecolor=colour, alpha=alpha, edgecolor="none", gid=gid))
    ax.add_patch(Rectangle((x + 0.06, y + 0.06), 0.88, 0.88, facecolor="none", edgecolor=colour, lw=1.2))
    ax.text(x + 0.5, y + 0.5, text, ha="center", va="center", fontsize=fontsize, color=style.TEXT)


def _grid_axes(ax, rows, cols, title):
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(title, fontsize=9)


def plot_rank_mesh(
    config: ParallelConfig, world_size: int, axes: list[str] | None = None, *, ncols: int | None = None, title=None
):
    """The ranks as a grid (rank 0 top left, one row per block of the fastest axes of the order string), drawn once
    with each rank's coordinates, then once per group kind in `axes` (default `default_mesh_axes`): ranks of the
    same group share a colour and are joined by a line. Everything comes from `rank_groups` / `coordinates`."""
    groups = rank_groups(config, world_size)
    axes = default_mesh_axes(config, world_size) if axes is None else list(axes)
    cols = ncols or mesh_columns(config, world_size)
    rows = -(-world_size // cols)
    panels = 1 + len(axes)
    per_row = min(panels, 3)  # three panels of a 4-wide grid fit the page column with 8-pt text
    grid_rows = -(-panels // per_row)
    cell = 0.55
    with style.use():
        fig, axs = plt.subplots(
            grid_rows,
            per_row,
            figsize=(per_row * (cols * cell + 0.4), grid_rows * (rows * cell + 1.0)),
            squeeze=False,
        )
        flat = [a for row in axs for a in row]
        dense_axes = [a for a, size in _dense_sizes(config) if size > 1 and a != "ep"]
        ax = flat[0]
        for r in range(world_size):
            c = coordinates(config, world_size, r)
            label = f"{r}\n" + " ".join(str(c[a]) for a in dense_axes)
            _cell(ax, r % cols, r // cols, style.MUTED, label, f"mesh:rank:{r}", alpha=0.12, fontsize=8)
        _grid_axes(
            ax,
            rows,
            cols,
            tr("{formula}\n(cell: rank, then {axes})", formula=rank_formula(config), axes=" ".join(dense_axes)),
        )
        for ax, axis in zip(flat[1:], axes):
            for gi, members in enumerate(groups[axis]):
                colour = style.PALETTE[gi % len(style.PALETTE)]
                for a, b in zip(members, members[1:]):  # arcs, so that links skipping a rank stay apart
                    ax.add_patch(
                        FancyArrowPatch(
                            (a % cols + 0.5, a // cols + 0.5),
                            (b % cols + 0.5, b // cols + 0.5),
                            arrowstyle="-",
                            connectionstyle="arc3,rad=0.35",
                            color=colour,
                            lw=1.8,
                            zorder=3,
                            gid=f"link:{axis}:{gi}",
                        )
                    )
                for m in members:
                    _cell(ax, m % cols, m // cols, colour, str(m), f"mesh:{axis}:{gi}:{m}")
            size = len(groups[axis][0])
            _grid_axes(ax, rows, cols, tr("{axis}: {n} groups of {size}", axis=axis, n=len(groups[axis]), size=size))
        for ax in flat[1 + len(axes) :]:
            ax.set_visible(False)
        default = tr("{plan} on {n} ranks, order {order!r}", plan=config.describe(), n=world_size, order=config.order)
        fig.suptitle(title or default, fontsize=10)
        fig.tight_layout(h_pad=1.5)
    return fig


def plot_token_placement(owner, *, microbatch_rows: int | None = None, dp_rows: int | None = None, title=None):
    """owner: [B, S] ints, the global rank holding each token of the global batch (after the embedding, on one
    pipeline stage). Each cell is coloured by its rank and labelled with it; solid lines separate the data-parallel
    row blocks (`dp_rows` sequences each), dashed lines the microbatches (`microbatch_rows`)."""
    owner = [[int(x) for x in row] for row in owner]
    B, S = len(owner), len(owner[0])
    ranks = sorted({x for row in owner for x in row})
    colour = {r: style.PALETTE[i % len(style.PALETTE)] for i, r in enumerate(ranks)}
    with style.use():
        fig, ax = plt.subplots(figsize=(0.42 * S + 1.4, 0.42 * B + 1.1))
        for b in range(B):
            for s in range(S):
                r = owner[b][s]
                _cell(ax, s, b, colour[r], str(r), f"token:{b}:{s}:{r}", alpha=0.38, fontsize=8)
        if microbatch_rows:
            for y in range(microbatch_rows, B, microbatch_rows):
                if not dp_rows or y % dp_rows:
                    ax.axhline(y, color=style.TEXT, lw=1.0, ls="--", gid="microbatch")
        if dp_rows:
            for y in range(dp_rows, B, dp_rows):
                ax.axhline(y, color=style.TEXT, lw=2.2, gid="dp")
        ax.set_xlim(0, S)
        ax.set_ylim(B, 0)
        ax.set_aspect("equal")
        ax.grid(False)
        ax.set_xticks([s + 0.5 for s in range(S)])
        ax.set_xticklabels([str(s) for s in range(S)], fontsize=8)
        ax.set_yticks([b + 0.5 for b in range(B)])
        ax.set_yticklabels([str(b) for b in range(B)], fontsize=8)
        ax.set_xlabel(tr("position in the sequence"))
        ax.set_ylabel(tr("sequence (row of the global batch)"))
        for side in ax.spines.values():
            side.set_visible(False)
        ax.tick_params(length=0)
        ax.set_title(title or tr("which rank holds each token after the embedding"), fontsize=10)
        fig.tight_layout()
    return fig


def _axis_key(a: str) -> int:
    return AXIS_ORDER.index(a) if a in AXIS_ORDER else len(AXIS_ORDER)


def plot_rank_report(
    rows: list[dict],
    *,
    traffic_formula: list[dict] | None = None,
    memory_formula: list[dict] | None = None,
    unit: str = "KiB",
    title: str | None = None,
):
    """Two panels over the ranks of a run (`pylib.compose.report_rows`): left, the bytes each rank holds (stacked:
    parameters, gradients, optimizer state, peak saved activations); right, the bytes it sent in one step, stacked
    by mesh axis. traffic_formula / memory_formula (one dict per row, in the same order: {axis: bytes} and
    {"params", "grads", "optim"}) are drawn as markers at their totals: a traffic bar that ends at its marker, and a
    memory bar whose model-state part (parameters, gradients, optimizer state) ends at its marker, are measurements
    equal to the formulas."""
    scale = style.BYTE_UNITS[unit]
    n = len(rows)
    axes = sorted({a for r in rows for a in r["traffic"]}, key=_axis_key)
    with style.use():
        width = min(style.COLUMN_PX / 100, max(6.0, 0.3 * n + 3.2))  # at most the page column: 8-pt ticks stay legible
        fig, (mem_ax, net_ax) = plt.subplots(2, 1, figsize=(width, 6.4), sharex=True)
        mem_top = _memory_bars(mem_ax, rows, scale)
        if memory_formula is not None:
            ys = [sum(f[k] for k in ("params", "grads", "optim")) / scale for f in memory_formula]
            _formula_marks(mem_ax, ys, "formula:memory")
        net_top = _traffic_bars(net_ax, rows, axes, scale)
        if traffic_formula is not None:
            _formula_marks(net_ax, [sum(f.values()) / scale for f in traffic_formula], "formula:traffic")
        _rank_axis(mem_ax, rows, mem_top, tr("held by the rank ({unit})", unit=unit))
        _rank_axis(net_ax, rows, net_top, tr("sent by the rank in one step ({unit})", unit=unit))
        handles = [Patch(facecolor=style.PALETTE[k], label=tr(_MEMORY_SHOWN[p])) for k, p in enumerate(MEMORY_PARTS)]
        _side_legend(mem_ax, handles, memory_formula is not None)
        handles = [Patch(facecolor=AXIS_COLOURS.get(a, style.MUTED), label=a) for a in axes]
        _side_legend(net_ax, handles, traffic_formula is not None)
        net_ax.set_xlabel(tr("rank"))
        mem_ax.set_title(tr("memory per rank"), fontsize=10)
        net_ax.set_title(tr("traffic per rank, by mesh axis"), fontsize=10)
        if title:
            fig.suptitle(title, fontsize=10)
        fig.tight_layout()
    return fig


def _bar(ax, x: float, bottom: float, h: float, colour, gid: str) -> None:
    ax.add_patch(Rectangle((x - 0.38, bottom), 0.76, h, facecolor=colour, edgecolor=style.CARD, lw=0.5, gid=gid))


def _memory_bars(ax, rows, scale: float) -> float:
    """Each rank's held bytes stacked by MEMORY_PARTS; returns the tallest stack."""
    bottom = [0.0] * len(rows)
    for k, part in enumerate(MEMORY_PARTS):
        for i, r in enumerate(rows):
            h = r[part] / scale
            _bar(ax, i, bottom[i], h, style.PALETTE[k], f"bar:{part}:{r['rank']}")
            bottom[i] += h
    return max(bottom) if bottom else 1.0


def _traffic_bars(ax, rows, axes, scale: float) -> float:
    """Each rank's bytes sent, stacked by mesh axis (an axis it sent nothing on draws nothing); the tallest."""
    bottom = [0.0] * len(rows)
    for a in axes:
        colour = AXIS_COLOURS.get(a, style.MUTED)
        for i, r in enumerate(rows):
            h = r["traffic"].get(a, (0, 0))[0] / scale
            if h:
                _bar(ax, i, bottom[i], h, colour, f"bar:{a}:{r['rank']}")
                bottom[i] += h
    return max(bottom) if bottom else 1.0


def _formula_marks(ax, ys, gid: str) -> None:
    ax.plot(list(range(len(ys))), ys, ls="none", marker="_", ms=16, mew=2.2, color=style.TEXT, gid=gid)


def _rank_axis(ax, rows, top: float, ylabel: str) -> None:
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.set_ylim(0, top * 1.12)
    ax.set_xticks(list(range(len(rows))))
    ax.set_xticklabels([str(r["rank"]) for r in rows], fontsize=8)
    ax.tick_params(labelbottom=True)
    ax.set_ylabel(ylabel)
    ax.grid(axis="x", visible=False)


def _side_legend(ax, handles: list, formula: bool) -> None:
    if formula:
        handles.append(Line2D([], [], ls="none", marker="_", ms=12, mew=2, color=style.TEXT, label=tr("formula")))
    ax.legend(handles=handles, fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
