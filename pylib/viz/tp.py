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

from ..i18n import tr
from . import style

# fig_sp_region's boxes: where the activations live, outside the TP region (LN, residual) or inside it
OUTSIDE, INSIDE = style.tint(style.GREEN, 0.4), style.tint(style.BLUE, 0.4)


# ------------------------------------------------------------------------------------------ column vs row split


def _matrix(ax, m: np.ndarray, title: str, colour: str, fmt: str = "{:.1f}"):
    """Draw a small matrix as coloured cells with its numbers (FONT pt: legible at the page's width)."""
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
            ax.text(j + 0.5, i + 0.5, fmt.format(m[i, j]), ha="center", va="center", fontsize=FONT, color=ink)
    ax.set_title(title, fontsize=FONT)


# Text size of the TP figures, in points: with the figures at most style.COLUMN_PX wide (7 in at the SVG's 96 CSS px
# per inch), 7.5 pt is 10 px on the page, above style.LEGIBLE_PX.
FONT = 7.5
WIDTH_IN = style.COLUMN_PX / style.CSS_PX_PER_IN


@style.styled
def fig_column_vs_row(ex):
    """Seed B's fig-mat-tp-col-row: the column split's outputs concatenate; the row split's outputs are full-size
    partial sums that must be all-reduced. Every number is from the ranks' real shards.

    One page column wide, four rows of t + 2 panel slots: x and the column shards W_r; the outputs y_r and their
    concatenation; the row shards V_r; the partial sums y_r V_r and their sum (the all-reduce)."""
    t = len(ex.col_weights)
    n_cols = t + 2
    panel = WIDTH_IN / n_cols
    fig = plt.figure(figsize=(WIDTH_IN, 4 * (panel + 0.42) + 0.75))
    grid = fig.add_gridspec(4, n_cols, hspace=0.42, wspace=0.1, top=0.9, bottom=0.01, left=0.01, right=0.99)

    def panel_at(i, j, span=1):
        return fig.add_subplot(grid[i, j : j + span])

    def note(ax, text):
        ax.axis("off")
        ax.text(0.04, 0.5, text, fontsize=FONT + 0.5, va="center", ha="left", transform=ax.transAxes)

    _matrix(panel_at(0, 0), ex.x, tr("x [n, d_in]\nwhole on every rank"), style.REPLICATED)
    for r in range(t):
        c = style.rank_colour(r)
        _matrix(panel_at(0, 1 + r), ex.col_weights[r], tr("rank {r}: W_{r}, columns\n[d_in, d_out/t]", r=r), c)
        _matrix(panel_at(1, r), ex.col_outputs[r], tr("rank {r}: y_{r} = x W_{r}\n[n, d_out/t]", r=r), c)
        _matrix(panel_at(2, r), ex.row_weights[r], tr("rank {r}: V_{r}, rows\n[d_out/t, d_in]", r=r), c)
        _matrix(panel_at(3, r), ex.partials[r], tr("rank {r}: y_{r} V_{r}\npartial sum, full size", r=r), c)
    note(panel_at(0, t + 1), tr("column split:\nW cut by its\noutput columns"))
    concat = np.concatenate(ex.col_outputs, axis=1)
    _matrix(panel_at(1, t, span=2), concat, tr("concat(y_r) = x W: no communication"), style.REPLICATED)
    note(panel_at(2, t, span=2), tr("row split: V cut by its input\nrows; rank r multiplies\nits own y_r by V_r"))
    _matrix(panel_at(3, t), ex.reduced, tr("all-reduce: sum\nof the partial sums"), style.REPLICATED)
    ok_y = np.allclose(concat, ex.reference_y, atol=1e-5)
    ok_z = np.allclose(ex.reduced, ex.reference_z, atol=1e-5)
    mark = {True: "✓", False: "✗"}
    note(
        panel_at(3, t + 1), tr("one device:\nconcat = x W {ok_y}\nsum = x W V {ok_z}", ok_y=mark[ok_y], ok_z=mark[ok_z])
    )
    fig.suptitle(
        tr(
            "TP on {t} ranks: a column split's results concatenate (rows 1-2);\n"
            "a row split's results are full-size partial sums, all-reduced (rows 3-4)",
            t=t,
        ),
        fontsize=FONT + 1.5,
    )
    return fig


# ------------------------------------------------------------------------------------------ SP around the region


def _box(ax, x, y, text, colour, w=1.7, h=0.62):
    """A box centred at (x, y): where the activations (or their gradients) live."""
    ax.add_patch(
        FancyBboxPatch(
            (x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02", facecolor=colour, edgecolor=style.MUTED, lw=0.8
        )
    )
    ax.text(x, y, text, ha="center", va="center", fontsize=FONT, color=style.ink_on(colour))


def _nbytes(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


def _arrow(ax, x, y, label, below, colour=style.COMM, dashed=False, length=0.62):
    """A downward arrow from y to y - length at x, its collective's name and payload beside it."""
    ax.annotate(
        "",
        xy=(x, y - length),
        xytext=(x, y),
        arrowprops=dict(arrowstyle="->", color=style.MUTED, lw=1, linestyle="--" if dashed else "-"),
    )
    ax.text(x + 0.1, y - length / 2 + 0.1, label, ha="left", va="center", fontsize=FONT, color=colour)
    if below:
        ax.text(x + 0.1, y - length / 2 - 0.12, below, ha="left", va="center", fontsize=FONT, color=style.MUTED)


def _inside_label(tag: str, s: int) -> str:
    part = tag.split(".")[-1]
    what = {"attn": tr("1/t of heads"), "mlp": tr("1/t of h_ffn")}.get(part, tr("1/t of columns"))
    return tr("{part}: {what}\nall {s} tokens", part=part, what=what, s=s)


NAMES = {"all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter"}


def _phase_items(events, phase, t, s) -> list[tuple]:
    """The chain of one column, in issue order: ("box", text, colour) where the activations (forward) or their
    gradients (backward) live, ("arrow", label, below, colour, dashed) for each collective this rank issued in
    `phase`. An all-gather enters the TP region; an all-reduce or a reduce-scatter leaves it. TP enters with no
    communication at all (identity forward; in backward the identity is the conjugate of the forward all-reduce),
    drawn dashed."""
    evs = [e for e in events if e["phase"] == phase]
    sp = any(e["op"] != "all_reduce" for e in evs)
    outside = ("box", tr("LN, residual\n{n} tokens", n=s // t if sp else s), OUTSIDE)
    items, where = [outside], "out"
    for e in evs:
        regather = e["tag"].endswith("regather")
        if e["op"] != "all_gather" and where == "out":  # TP: the entry that moves nothing
            items += [("arrow", tr("identity"), tr("nothing sent"), style.MUTED, True)]
            items += [("box", _inside_label(e["tag"], s), INSIDE)]
            where = "in"
        label = NAMES[e["op"]] + (tr(" (regather)") if regather else "")
        items.append(("arrow", label, f"{_nbytes(e['payload_bytes'])}, {e['tag']}", style.COMM, False))
        if regather:  # Megatron's SP backward: rebuild the input that was kept as a sequence slice
            items.append(("box", tr("weight grads\nfrom rebuilt input"), INSIDE))
            continue
        where = "in" if e["op"] == "all_gather" else "out"
        items.append(("box", _inside_label(e["tag"], s), INSIDE) if where == "in" else outside)
    return items


@style.styled
def fig_sp_region(traces: dict):
    """Columns: TP and TP + SP, forward and backward, each read top to bottom; boxes are where the activations live
    (green: outside the TP region, s/t tokens under SP; blue: inside, all tokens, heads or h_ffn split), arrows the
    collectives this rank really issued (from the trace), with their payloads. Same payload sum per column:
    AR = AG + RS. One page column wide (style.COLUMN_PX), its text FONT pt."""
    t, s, events = traces["t"], traces["s"], traces["events"]
    columns = [(mode, phase) for mode in events for phase in ("forward", "backward")]
    chains = [_phase_items(events[mode], phase, t, s) for mode, phase in columns]
    box_h, arrow_len = 0.62, 0.6  # vertical room of a box and of an arrow (data units; one is about 0.86 in)
    depth = max(sum(box_h if it[0] == "box" else arrow_len for it in chain) for chain in chains)
    pitch = 2.05  # horizontal distance between columns
    fig, ax = style.subplots(figsize=(WIDTH_IN, 0.86 * (depth + 1.7) + 0.4), grid=False)
    for i, ((mode, phase), chain) in enumerate(zip(columns, chains)):
        x, top = i * pitch, 0.0  # top: where the next item starts
        ax.text(x, 0.45, f"{mode}\n{tr(phase)}", ha="center", va="center", fontsize=FONT + 1)
        for item in chain:
            if item[0] == "box":
                _box(ax, x, top - box_h / 2, item[1], item[2], h=box_h)
                top -= box_h
            else:
                _arrow(ax, x, top, item[1], item[2], colour=item[3], dashed=item[4], length=arrow_len)
                top -= arrow_len
        total = sum(e["bytes_sent"] for e in events[mode] if e["phase"] == phase)
        ax.text(x, top - 0.12, tr("sent {bytes}", bytes=_nbytes(total)), ha="center", va="top", fontsize=FONT + 0.5)
    y = -depth
    ax.set_xlim(-0.95, (len(columns) - 1) * pitch + 1.15)
    ax.set_ylim(y - 0.5, 0.8)
    ax.axis("off")
    ax.set_title(
        tr(
            "One layer, t = {t}, b = {b}, s = {s}, h = {h} ({dtype}): SP turns each\n"
            "all-reduce into an all-gather into the TP region and a reduce-scatter out of it",
            t=t,
            b=traces["b"],
            s=s,
            h=traces["h"],
            dtype=traces["dtype"],
        ),
        fontsize=FONT + 1,
    )
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------ vocabulary padding


@style.styled
def fig_vocab_padding(cases: list[tuple[int, int, int, int]]):
    """One panel per case (V, t, d, V_p): the t ranks' slices of the padded vocabulary [0, V_p), V_p/t ids each,
    drawn as a bar per rank, the ids of real tokens in the rank's colour and the padded ids (V..V_p-1, which no
    tokenizer emits) hatched grey. One page column wide (style.COLUMN_PX), its text FONT pt."""
    rows = sum(t for _, t, _, _ in cases)
    fig, axes = style.subplots(
        len(cases),
        1,
        figsize=(WIDTH_IN, 0.3 * rows + 0.75 * len(cases)),
        grid=False,
        squeeze=False,
        gridspec_kw=dict(height_ratios=[t for _, t, _, _ in cases]),
    )
    for ax, (V, t, d, Vp) in zip(axes[:, 0], cases):
        per = Vp // t
        for r in range(t):
            lo, hi = r * per, (r + 1) * per
            real = max(0, min(hi, V) - lo)
            ax.barh(r, real / per, color=style.rank_colour(r), height=0.7)
            ax.barh(
                r,
                1 - real / per,
                left=real / per,
                color=style.CARD,
                edgecolor=style.MUTED,
                hatch="///",
                height=0.7,
                lw=0.6,
            )
            note = tr("ids {lo:,}..{hi:,}", lo=lo, hi=hi - 1)
            if real < per:
                note += tr(", {n:,} padded", n=per - real)
            ax.text(1.01, r, note, va="center", ha="left", fontsize=FONT)
        ax.set_yticks(range(t), [tr("rank {r}", r=r) for r in range(t)], fontsize=FONT)
        ax.set_ylim(t - 0.5, -0.5)
        ax.set_xlim(0, 1)
        ax.set_xticks([])
        ax.spines["bottom"].set_visible(False)
        ax.set_title(
            tr("V = {V:,} on t = {t}: padded to a multiple of {d} x {t}, V_p = {Vp:,}", V=V, t=t, d=d, Vp=Vp),
            fontsize=FONT + 0.5,
            loc="left",
        )
    fig.tight_layout()
    fig.subplots_adjust(right=0.7)
    return fig


# ------------------------------------------------------------------------------------------ the TP block


def _op_names(ops: list[str]) -> str:
    """A crossing's collectives in one phase, as the reader says them: "all-reduce", or "identity" for none."""
    return ", ".join(op.replace("_", "-") for op in ops) if ops else tr("identity")


def _shape(shape) -> str:
    return "[" + ", ".join(str(n) for n in shape) + "]"


@style.styled
def fig_tp_block(ex: dict):
    """Megatron-LM's TP block as `tp_block_example` ran it: x -> f -> column-parallel linear -> GELU ->
    row-parallel linear -> g -> y, one lane per rank between f and g, each with its shard of W_up and W_down (seed B's
    layout, W [in, out]) and the shapes of what it computes; under f and g the collectives each crossing issued,
    forward and backward (traced), which are each other's conjugates. One page column wide, its text FONT + 0.5 pt."""
    t, ranks = ex["t"], ex["ranks"]
    size = FONT + 0.5
    lane, box_h = 1.2, 0.78  # vertical pitch of a rank's lane and height of its boxes (data units)
    top = (t - 1) * lane / 2
    widths = dict(x=1.05, f=0.7, up=1.75, gelu=1.3, down=1.75, g=0.7, y=1.05)
    gap = 0.42
    xs, at = {}, 0.0
    for name, width in widths.items():
        xs[name] = at + width / 2
        at += width + gap
    span = at - gap
    fig, ax = style.subplots(figsize=(WIDTH_IN, 0.55 * (t * lane + 2.6)), grid=False)

    def box(name, y, text, colour, height=box_h, alpha=0.3):
        width = widths[name]
        ax.add_patch(
            FancyBboxPatch(
                (xs[name] - width / 2, y - height / 2),
                width,
                height,
                boxstyle="round,pad=0.02,rounding_size=0.08",
                facecolor=style.tint(colour, 1 - alpha),
                edgecolor=colour,
                lw=1.0,
            )
        )
        ax.text(xs[name], y, text, ha="center", va="center", fontsize=size, color=style.INK)

    def arrow(a, b, y):
        x0, x1 = xs[a] + widths[a] / 2, xs[b] - widths[b] / 2
        ax.annotate("", (x1, y), (x0, y), arrowprops=dict(arrowstyle="-|>", color=style.TEXT, lw=0.9))

    first = ranks[0]["shapes"]
    crossing_h = 2 * top + box_h + 0.3
    box("x", 0, f"x\n{_shape(first['x'])}", style.REPLICATED)
    box("y", 0, f"y\n{_shape(first['y'])}", style.REPLICATED)
    for name in ("f", "g"):
        box(name, 0, name, style.COMM, height=crossing_h, alpha=0.18)
    arrow("x", "f", 0)
    arrow("g", "y", 0)
    for r, rank in enumerate(ranks):
        y = top - r * lane
        colour = style.rank_colour(r)
        specs = {name.split(".")[0]: (kind, local) for name, kind, _, local in rank["specs"]}
        (up_kind, up), (down_kind, down) = specs["up_proj"], specs["down_proj"]
        # torch stores [out, in]; seed B's layout is W [in, out]
        box("up", y, f"{tr(up_kind)}\nW_up {_shape(up[::-1])}", colour)
        box("gelu", y, f"GELU\n{_shape(rank['shapes']['hidden'])}", colour, alpha=0.15)
        box("down", y, f"{tr(down_kind)}\nW_down {_shape(down[::-1])}", colour)
        for a, b in (("f", "up"), ("up", "gelu"), ("gelu", "down"), ("down", "g")):
            arrow(a, b, y)
        ax.text(xs["up"] - widths["up"] / 2, y + box_h / 2 + 0.03, tr("rank {r}", r=r), va="bottom", fontsize=size)
    low = -top - box_h / 2
    ax.text(
        xs["down"] + widths["down"] / 2,
        low - 0.06,
        tr("out: partial sums {shape}", shape=_shape(first["partial"])),
        ha="right",
        va="top",
        fontsize=size,
        color=style.MUTED,
    )
    below = -crossing_h / 2 - 0.06
    for name in ("f", "g"):
        ops = ranks[0]["crossings"][name]
        ax.text(
            xs[name],
            below,
            tr("forward: {fwd}\nbackward: {bwd}", fwd=_op_names(ops["forward"]), bwd=_op_names(ops["backward"])),
            ha="center",
            va="top",
            fontsize=size,
            color=style.TEXT,
        )
    ax.set_xlim(-0.05, span + 0.05)
    ax.set_ylim(below - 0.75, top + box_h / 2 + 0.4)
    ax.axis("off")
    ax.set_title(
        tr(
            "The TP block on t = {t} ranks, h = {h}, h_ffn = {h_ffn}: f and g are conjugate",
            t=t,
            h=ex["h"],
            h_ffn=ex["h_ffn"],
        ),
        fontsize=size + 0.5,
    )
    fig.tight_layout()
    return fig
