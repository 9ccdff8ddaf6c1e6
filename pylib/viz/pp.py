"""Pipeline figures: schedule timelines with the bubble shaded, and the bubble against the number of microbatches.

    fig = plot_schedule(build("1f1b", 4, 8))                      # before running anything: the pure schedule
    fig = plot_timeline(runs_timeline, title="1F1B, measured")     # from a real run (pylib.pp executor Events)

One row per rank (rank 0 on top); forwards and backwards as bars labelled with the microbatch (and the chunk, when
interleaved: lighter bars for later chunks); the time a rank idles inside the step is hatched -- the bubble.
Colours are the book's (`pylib.viz.style`): FORWARD, BACKWARD, COMM, the bubble in WASTE, a stage in its rank's
colour. A zero-bubble schedule's backward is split: its B (the input gradient) keeps BACKWARD's colour and its W (the
weight gradient) is drawn in WEIGHT_GRAD, the palette's bluish green, the hue that stays apart from both the blue
forward and the orange B under red-green colour blindness (the legend then reads F, B, W).
Each function draws on `ax` when given one (a chapter's `style.subplots`), else on a figure of its own.
"""

from __future__ import annotations

from matplotlib.patches import Patch, Rectangle

from ..i18n import tr
from ..pp.simulate import simulate
from ..pp.timeline import as_events, bubble, idle_intervals
from . import style


def _measured(key: str) -> str:
    """A measured series' name (a key of the rows) in the reader's language."""
    return {"measured: schedule": tr("measured: schedule"), "measured: replay": tr("measured: replay")}.get(key, key)


def _unit(unit: str) -> str:
    return {"s": tr("s"), "units": tr("units")}.get(unit, unit)


def _shade(color: str, chunk: int, n_chunks: int) -> str:
    """Chunk 0 in the full colour, later chunks lighter."""
    return style.tint(color, 0.45 * chunk / max(n_chunks - 1, 1))


WEIGHT_GRAD = style.GREEN  # a split backward's W; its B stays style.BACKWARD
KIND_COLOUR = {"F": style.FORWARD, "B": style.BACKWARD, "W": WEIGHT_GRAD}


@style.styled
def plot_timeline(
    timeline,
    *,
    title: str | None = None,
    unit: str = "s",
    show_comm: bool = True,
    shade_bubble: bool = True,
    xlim: tuple[float, float] | None = None,
    ax=None,
):
    """Draw a timeline (Events from `simulate` or from the executor, or their dicts); returns the Figure.

    The drawn bars are exactly the compute events; the hatched spans are exactly `timeline.idle_intervals`, so the
    shaded area per rank is the rank's idle time and the title's bubble is `timeline.bubble(...)`. `xlim` fixes
    the time axis (to stack several timelines on one scale); labels are drawn only on bars wide enough for them."""
    events = as_events(timeline)
    compute = [e for e in events if e.is_compute]
    ranks = sorted({e.rank for e in events})
    n_chunks = max((e.chunk for e in compute), default=0) + 1
    fig, ax = style.figure_axes(ax, figsize=(7.2, 0.55 * len(ranks) + 1.5), grid=False)
    if xlim is None:
        t_min, t_max = min(e.start for e in events), max(e.end for e in events)
        xlim = (t_min, t_max + 0.01 * (t_max - t_min))
    small = style.legible_pt(fig, 7)  # bar labels: legible at the page's column on whatever figure ax is part of
    # a label is drawn only where it fits: about 0.6 of the font size per character, in data units
    per_char = 0.6 * small / 72 * (xlim[1] - xlim[0]) / (ax.get_position().width * fig.get_figwidth())
    _draw_compute(ax, compute, n_chunks, per_char, small)
    slots = _draw_slots(ax, compute)
    split = any(e.kind == "W" for e in compute)
    if shade_bubble:
        _draw_idle(ax, events, ranks)
    if show_comm:
        _draw_comm(ax, events)
    ax.set_xlim(*xlim)
    ax.set_ylim(-len(ranks) + 0.4, 0.6)
    ax.set_yticks([-r for r in ranks], [tr("rank {r}", r=r) for r in ranks])
    ax.set_xlabel(tr("time ({unit})", unit=_unit(unit)) if unit else tr("time"))
    b = bubble(events)
    head = f"{title}: " if title else ""
    title_pt = style.legible_pt(fig, 10)
    ax.set_title(
        head + tr("bubble {rel:.3f} of ideal ({share:.1%} of the step)", rel=b.mean_relative, share=b.mean_share),
        fontsize=title_pt,
    )
    ax.tick_params(labelsize=style.legible_pt(fig, 9))
    ax.xaxis.label.set_fontsize(style.legible_pt(fig, 9))
    handles = _timeline_legend(n_chunks, shade_bubble, show_comm, split)
    if slots:
        handles.append(Patch(facecolor="none", edgecolor=style.INK, linewidth=1.2, label=tr("F&B slot")))
    ncol = len(handles) if len(handles) <= 4 else (len(handles) + 1) // 2
    legend_pt = style.legible_pt(fig, 8)
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=ncol, fontsize=legend_pt)
    fig.tight_layout()
    return fig


BAR = 0.8  # a rank's row height on the timeline


def _draw_compute(ax, compute, n_chunks: int, per_char: float, fontsize: float) -> None:
    """One bar per forward / backward (B and W where split), shaded by chunk, labelled mb (or mb.chunk) where the
    label fits."""
    for e in compute:
        y = -e.rank
        color = _shade(KIND_COLOUR[e.kind], e.chunk, n_chunks)
        ax.add_patch(
            Rectangle(
                (e.start, y - BAR / 2),
                e.duration,
                BAR,
                facecolor=color,
                edgecolor=style.CARD,
                linewidth=0.6,
                gid="compute",
            )
        )
        labels = [f"{e.mb}"] if n_chunks == 1 else [f"{e.mb}.{e.chunk}", f"{e.mb}"]
        label = next((x for x in labels if e.duration > (len(x) + 0.5) * per_char), None)
        if label is not None:
            ink = style.ink_on(color)
            ax.text(e.start + e.duration / 2, y, label, ha="center", va="center", fontsize=fontsize, color=ink)


def _draw_slots(ax, compute) -> int:
    """A frame round each overlapped F&B slot (DualPipe's pair: a forward marked "&" and the B after it, one slot
    on a GPU, back to back here); returns how many were drawn."""
    drawn = 0
    for r in sorted({e.rank for e in compute}):
        mine = sorted((e for e in compute if e.rank == r), key=lambda e: e.start)
        for e, nxt in zip(mine, mine[1:]):
            if e.what == "&":
                frame = Rectangle(
                    (e.start, -r - BAR / 2 - 0.04), nxt.end - e.start, BAR + 0.08, fill=False, linewidth=1.2
                )
                frame.set_edgecolor(style.INK)
                frame.set_gid("slot")
                ax.add_patch(frame)
                drawn += 1
    return drawn


def _draw_idle(ax, events, ranks) -> None:
    """The hatched bubble: exactly each rank's `idle_intervals`."""
    for r in ranks:
        for t0, t1 in idle_intervals(events, r):
            ax.add_patch(
                Rectangle(
                    (t0, -r - BAR / 2),
                    t1 - t0,
                    BAR,
                    facecolor=style.WASTE,
                    alpha=0.18,
                    hatch="///",
                    edgecolor=style.WASTE,
                    linewidth=0,
                    gid="bubble",
                )
            )


def _draw_comm(ax, events) -> None:
    """A thin strip under each rank's row for every send / receive that took time (its wait)."""
    for e in events:
        if not e.is_compute and e.duration > 0:
            ax.add_patch(
                Rectangle(
                    (e.start, -e.rank - BAR / 2 - 0.08),
                    e.duration,
                    0.06,
                    facecolor=style.COMM,
                    edgecolor="none",
                    gid="comm",
                )
            )


def _timeline_legend(n_chunks: int, shade_bubble: bool, show_comm: bool, split: bool = False) -> list:
    kinds = ("F", "B", "W") if split else ("F", "B")
    if n_chunks == 1 and split:
        names = {"F": tr("F: forward"), "B": tr("B: input gradient"), "W": tr("W: weight gradient")}
        handles = [Patch(facecolor=KIND_COLOUR[k], label=names[k]) for k in kinds]
    elif n_chunks == 1:
        handles = [
            Patch(facecolor=style.FORWARD, label=tr("forward")),
            Patch(facecolor=style.BACKWARD, label=tr("backward")),
        ]
    else:
        handles = [
            Patch(facecolor=_shade(KIND_COLOUR[kind], c, n_chunks), label=tr("{kind} chunk {c}", kind=kind, c=c))
            for kind in kinds
            for c in range(n_chunks)
        ]
    if shade_bubble:
        handles.append(Patch(facecolor=style.WASTE, edgecolor=style.WASTE, alpha=0.3, hatch="///", label=tr("bubble")))
    if show_comm:
        handles.append(Patch(facecolor=style.COMM, label=tr("send / recv wait")))
    return handles


def plot_schedule(
    schedule,
    *,
    cost_f: float | None = None,
    cost_b: float | None = None,
    cost_w: float | None = None,
    sends: str = "eager",
    title: str | None = None,
    xlim: tuple[float, float] | None = None,
    ax=None,
):
    """Draw a pure schedule (`pylib.plan.schedules`) from its simulated logical timeline: a forward costs `cost_f`,
    a backward `cost_b` (a split one: a B `cost_b`, a W `cost_w`); each left out is the schedule's own (`build`'s
    defaults: forward 1, backward 2, split as B 1 and W 1)."""
    own = (schedule.cost_f, schedule.cost_b, schedule.cost_w)
    cost_f, cost_b, cost_w = (
        mine if mine is not None else theirs for mine, theirs in zip((cost_f, cost_b, cost_w), own)
    )
    events = simulate(schedule, cost_f, cost_b, sends=sends, cost_w=cost_w)
    name = title or f"{schedule.name}, p={schedule.p}, m={schedule.m}" + (f", v={schedule.v}" if schedule.v > 1 else "")
    return plot_timeline(events, title=name, unit="units", show_comm=False, xlim=xlim, ax=ax)


@style.styled
def plot_bubble_sweep(rows, *, title: str | None = None, ax=None):
    """rows: dicts with schedule, m, formula and one or more measured values (keys starting with "measured").
    Draws each schedule's formula as a line and the measurements as markers against m."""
    fig, ax = style.figure_axes(ax, figsize=(6, 4))
    markers = ["o", "s", "^", "D"]
    names = list(dict.fromkeys(r["schedule"] for r in rows))
    for i, name in enumerate(names):
        mine = sorted((r for r in rows if r["schedule"] == name), key=lambda r: r["m"])
        ms = [r["m"] for r in mine]
        colour = style.PALETTE[i % len(style.PALETTE)]
        ax.plot(ms, [r["formula"] for r in mine], color=colour, label=tr("{name}: formula", name=name))
        keys = [k for k in mine[0] if k.startswith("measured")]
        for j, k in enumerate(keys):  # later keys drawn smaller, so markers on the same spot stay visible
            ax.plot(
                ms,
                [r[k] for r in mine],
                linestyle="none",
                marker=markers[j % 4],
                markersize=max(10 - 3.5 * j, 3),
                markerfacecolor="none" if j == 0 else colour,
                markeredgewidth=1.4,
                color=colour,
                alpha=0.85,
                label=f"{name}: {_measured(k)}",
            )
    ax.set_xscale("log", base=2)
    all_m = sorted({r["m"] for r in rows})
    ax.set_xticks(all_m, [str(m) for m in all_m])
    ax.minorticks_off()
    ax.set_xlabel(tr("microbatches m"))
    ax.set_ylabel(tr("bubble / ideal time"))
    ax.set_title(tr("Bubble vs microbatches") if title is None else title, fontsize=style.legible_pt(fig, 10))
    ax.legend(fontsize=style.legible_pt(fig, 7))
    fig.tight_layout()
    return fig


def _block_of(name: str) -> str:
    """The model block a parameter belongs to: "embed", "layer i", or "head" (ln_f and lm_head)."""
    if name.startswith("layers."):
        return f"layer {name.split('.')[1]}"
    if name.startswith("embed."):
        return "embed"
    return "head"


@style.styled
def plot_stage_map(specs_per_rank, *, title: str | None = None, ax=None):
    """Who holds which block of the model under pipeline parallelism, drawn from `pylib.pp.shard_specs`.

    specs_per_rank[r]: rank r's ShardSpecs. One column per block in forward order (embedding, layer 0 .. L-1,
    ln_f + LM head), one row per rank; a filled cell is a block the rank holds, labelled with its parameter count
    (every tensor whole: PP distributes weights, it does not cut them). The forward path runs left to right through
    the filled cells; every step that changes rank is a stage boundary, drawn as an arrow: one point-to-point send
    of the activation [b, s, h] per microbatch (and its gradient back)."""
    owner: dict[str, int] = {}
    size: dict[str, int] = {}
    for r, specs in enumerate(specs_per_rank):
        for spec in specs:
            if spec.dim is not None or spec.local_shape != spec.full_shape:
                raise ValueError(f"{spec.name} is cut on rank {r} ({spec.local_shape} of {spec.full_shape})")
            block = _block_of(spec.name)
            if owner.setdefault(block, r) != r:
                raise ValueError(f"{block} is held by ranks {owner[block]} and {r}")
            n = 1
            for d in spec.full_shape:
                n *= d
            size[block] = size.get(block, 0) + n
    layers = sorted((b for b in owner if b.startswith("layer ")), key=lambda b: int(b.split()[1]))
    blocks = [b for b in ["embed", *layers, "head"] if b in owner]
    p = len(specs_per_rank)
    fig, ax = style.figure_axes(ax, figsize=(7.2, 0.6 * p + 1.4), grid=False)
    small = style.legible_pt(fig, 8)
    for x, block in enumerate(blocks):
        r = owner[block]
        colour = style.rank_colour(r)
        ax.add_patch(Rectangle((x - 0.42, -r - 0.38), 0.84, 0.76, facecolor=colour, edgecolor="none", gid="stage-cell"))
        count = size[block]
        text = f"{count / 1000:.1f}k" if count >= 1000 else str(count)
        ax.text(x, -r, text, ha="center", va="center", fontsize=small, color=style.ink_on(colour))
    boundaries = 0
    for x, (a, b) in enumerate(zip(blocks, blocks[1:])):
        ra, rb = owner[a], owner[b]
        if ra == rb:
            ax.plot([x + 0.42, x + 0.58], [-ra, -ra], color=style.MUTED, linewidth=1)
            continue
        boundaries += 1
        ax.annotate(
            "",
            xy=(x + 1 - 0.3, -rb + (0.3 if rb > ra else -0.3)),
            xytext=(x + 0.3, -ra - (0.3 if rb > ra else -0.3)),
            arrowprops=dict(arrowstyle="-|>", color=style.COMM, linewidth=1.6),
            gid="p2p",
        )
    ax.set_xlim(-0.6, len(blocks) - 0.4)
    ax.set_ylim(-p + 0.4, 0.6)
    ax.set_xticks(
        range(len(blocks)), ["embed" if b == "embed" else "ln_f+head" if b == "head" else b.split()[1] for b in blocks]
    )
    ax.set_yticks([-r for r in range(p)], [tr("rank {r}", r=r) for r in range(p)])
    ax.tick_params(labelsize=style.legible_pt(fig, 9))
    ax.set_xlabel(tr("blocks in forward order (embedding, layers, ln_f + LM head)"), fontsize=style.legible_pt(fig, 9))
    head = f"{title}: " if title else ""
    ax.set_title(
        head + tr("{n} stage boundaries, each a P2P of [b, s, h] per microbatch", n=boundaries),
        fontsize=style.legible_pt(fig, 10),
    )
    fig.tight_layout()
    return fig
