"""Data-parallel figures, drawn from real runs: article B's matrix picture, the flat buffers, ZeRO's per-rank memory
bars, the bucket / backward overlap, ZeRO-3's resident parameters and HSDP's mesh.

    fig = plot_dp_matrix(d, tokens_per_rank, h_in, h_out, kind=spec.kind)     # which axis is split, which collective
    fig = plot_flat_layout(layout)                                            # a FlatLayout: params, padding, slices
    fig = plot_zero_memory({"ddp": mem, "zero1": mem1, ...}, formula={...})   # HeldBytes dicts, measured
    fig = plot_bucket_overlap([report_rank0, report_rank1])                   # OverlapReports from traces
    fig = plot_zero3_resident(fsdp.timeline, shard_bytes)                      # gathered before use, freed after
    fig = plot_hsdp_mesh(shard_groups, replica_groups, sent)                   # HSDP's 2-D mesh, bytes per link

Colours are the book's (`pylib.viz.style`): PARAMS, GRADS, OPTIM for model state, BACKWARD and COMM on the
timeline, a rank's slice in its rank colour. Each function draws on `ax` when given one, else on a new figure.
"""

from __future__ import annotations

from matplotlib.lines import Line2D
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle

from pylib.plan.options import ZeroStage

from ..i18n import tr
from . import style

TRANSIENT = style.PURPLE  # memory resident only for a while: ZeRO-3's gathered unit, ZeRO-2's buckets on the wire
BUCKETS = (style.COMM, style.tint(style.COMM, 0.45))  # neighbouring gradient buckets, told apart

STAGE_LABELS = {s.key: s.label for s in ZeroStage}  # "ddp" -> "DDP", "zero1" -> "ZeRO-1", ... (pylib.plan.options)


@style.styled
def plot_zero_memory(
    measured: dict,
    *,
    formula: dict | None = None,
    unit: str = "KiB",
    title: str | None = None,
    show_peak: bool = True,
    ax=None,
):
    """Stacked bars of the bytes one rank holds per stage: parameters, gradients, optimizer state.

    measured: stage -> `HeldBytes` (or its dict) from a real run. formula: stage -> {"params", "grads", "optim"}
    (e.g. `pylib.analysis.dp.held_bytes`), drawn as a dashed outline at its total. show_peak: hatch on top what is
    resident only for a while -- ZeRO-3's gathered unit, ZeRO-2's buckets on the wire (peak - held)."""
    scale = style.BYTE_UNITS[unit]
    stages = list(measured)
    held = {s: m if isinstance(m, dict) else m.as_dict() for s, m in measured.items()}
    fig, ax = style.figure_axes(ax, figsize=(1.6 * len(stages) + 2.5, 4), grid="y")
    for i, stage in enumerate(stages):
        _memory_bar(ax, i, held[stage], scale, show_peak)
        if formula is not None and stage in formula:
            total = sum(formula[stage][k] for k in ("params", "grads", "optim")) / scale
            left, right = i - _MEMORY_BAR / 2 - 0.06, i + _MEMORY_BAR / 2 + 0.06
            ax.plot([left, right], [total, total], linestyle="--", color=style.TEXT, linewidth=1.2, gid="formula")
    tops = [
        max(m["params"], m.get("peak_params", 0)) + max(m["grads"], m.get("peak_grads", 0)) + m["optim"]
        for m in held.values()
    ]
    ax.set_xlim(-0.6, len(stages) - 0.4)
    ax.set_ylim(0, 1.15 * max(tops) / scale)
    ax.set_xticks(range(len(stages)), [STAGE_LABELS.get(s, s) for s in stages])
    ax.set_ylabel(tr("held by one rank ({unit})", unit=unit))
    handles = [
        Patch(color=style.PARAMS, label=tr("parameters")),
        Patch(color=style.GRADS, label=tr("gradients")),
        Patch(color=style.OPTIM, label=tr("optimizer state")),
    ]
    if show_peak:
        handles.append(Patch(facecolor="none", edgecolor=TRANSIENT, hatch="///", label=tr("transient (peak)")))
    if formula is not None:
        handles.append(Line2D([], [], linestyle="--", color=style.TEXT, label=tr("formula")))
    ax.legend(handles=handles, fontsize=style.legible_pt(fig, 8), loc="upper right")
    ax.set_title(title or tr("Model state per rank, measured"), fontsize=style.legible_pt(fig, 10))
    fig.tight_layout()
    return fig


_MEMORY_BAR = 0.6  # a stage's bar width


def _memory_bar(ax, i: int, m: dict, scale: float, show_peak: bool) -> None:
    """Stage i's stacked bar (params, grads, optim), the hatched transient on top, and the held total above."""
    width = _MEMORY_BAR
    bottom = 0.0
    for key, color in (("params", style.PARAMS), ("grads", style.GRADS), ("optim", style.OPTIM)):
        h = m[key] / scale
        ax.add_patch(Rectangle((i - width / 2, bottom), width, h, facecolor=color, edgecolor="none", gid=key))
        bottom += h
    extra = (m.get("peak_params", m["params"]) - m["params"]) + (m.get("peak_grads", m["grads"]) - m["grads"])
    if show_peak and extra > 0:
        ax.add_patch(
            Rectangle(
                (i - width / 2, bottom),
                width,
                extra / scale,
                facecolor="none",
                edgecolor=TRANSIENT,
                hatch="///",
                linewidth=0.8,
                gid="transient",
            )
        )
    above = bottom + (extra / scale if show_peak and extra > 0 else 0)  # the label sits above any hatching
    ax.text(i, above, f"{bottom:,.1f}", ha="center", va="bottom", fontsize=style.legible_pt(ax.figure, 8))


@style.styled
def plot_bucket_overlap(reports, *, title: str | None = None, unit: str = "ms", ax=None):
    """Backward and each gradient bucket's collective, per rank, on one time axis.

    reports: one `OverlapReport` (or a list, one per rank) -- e.g. `overlap_from_trace(tracer.events, ...)`. Each
    rank gets a row for backward (start to end) and one row per bucket (launch to completion); the part of the
    bucket bars right of the dashed line is communication that backward could not hide."""
    reports = reports if isinstance(reports, (list, tuple)) else [reports]
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    t0 = min(min([r.backward_start or r.backward_end] + [b.t_launch for b in r.buckets]) for r in reports)
    rows = sum(1 + len(r.buckets) for r in reports)
    fig, ax = style.figure_axes(ax, figsize=(7.2, 0.28 * rows + 1.4), grid=False)
    y, ticks, labels = 0, [], []
    height = 0.75
    right = 0.0
    for rank, r in enumerate(reports):
        start = (r.backward_start if r.backward_start is not None else t0) - t0
        end = r.backward_end - t0
        ax.add_patch(
            Rectangle(
                (start * scale, -y - height / 2),
                (end - start) * scale,
                height,
                facecolor=style.BACKWARD,
                edgecolor="none",
                gid="backward",
            )
        )
        ticks.append(-y)
        labels.append(f"rank {rank} backward" if len(reports) > 1 else "backward")
        top = y
        y += 1
        for k, b in enumerate(r.buckets):
            a, z = (b.t_launch - t0) * scale, (b.t_done - t0) * scale
            ax.add_patch(
                Rectangle(
                    (a, -y - height / 2),
                    max(z - a, 1e-9),
                    height,
                    facecolor=BUCKETS[k % 2],
                    edgecolor="none",
                    gid="bucket",
                )
            )
            ticks.append(-y)
            labels.append(b.tag.split(".", 1)[-1])
            right = max(right, z)
            y += 1
        ax.plot([end * scale] * 2, [-top + 0.5, -y + 0.5], linestyle="--", color=style.TEXT, linewidth=1)
        right = max(right, end * scale)
    ax.set_xlim(0, right * 1.03 if right > 0 else 1)
    ax.set_ylim(-y + 0.4, 0.6)
    ax.set_yticks(ticks, labels, fontsize=style.legible_pt(fig, 8))
    ax.tick_params(axis="x", labelsize=style.legible_pt(fig, 9))
    ax.set_xlabel(tr("time since backward began ({unit})", unit=unit), fontsize=style.legible_pt(fig, 10))
    hidden = sum(r.hidden_fraction for r in reports) / len(reports)
    ax.set_title(
        title or tr("Buckets during backward: {hidden:.0%} of communication hidden", hidden=hidden),
        fontsize=style.legible_pt(fig, 10),
    )
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------------ the matrix picture


def _matrix(ax, box, *, strips=None, axis="rows", label="", shape="", colour=style.REPLICATED, gid=None):
    """A matrix drawn as a box = (x, y, w, h): w x h with its top-left at (x, y); strips: split it into that many
    bands (rank colours) along "rows" (horizontal bands) or "cols" (vertical bands)."""
    x, y, w, h = box
    if strips is None:
        ax.add_patch(Rectangle((x, y - h), w, h, facecolor=colour, edgecolor="none", gid=gid or "replicated"))
    else:
        for r in range(strips):
            if axis == "rows":
                box = (x, y - (r + 1) * h / strips), w, h / strips
            else:
                box = (x + r * w / strips, y - h), w / strips, h
            colour = style.rank_colour(r)
            ax.add_patch(Rectangle(*box, facecolor=colour, edgecolor=style.CARD, linewidth=0.6, gid=gid or "rank"))
    ax.text(x + w / 2, y + 0.12, label, ha="center", va="bottom", fontsize=10)
    if shape:
        ax.text(x + w / 2, y - h - 0.12, shape, ha="center", va="top", fontsize=8)


@style.styled
def plot_dp_matrix(d: int, tokens_per_rank: int, h_in: int, h_out: int, *, weight: str = "W", kind: str = "replicated"):
    """Article B's rule for data parallelism, as two matrix products of one linear layer Y = X W (W as [in, out]).

    d ranks each hold `tokens_per_rank` rows (b/d * s tokens) of X and dY and, as `kind` says ("replicated", from
    the wrapper's `shard_specs()`), all of W. Forward contracts over h_in, which every rank holds whole: no
    communication. The weight gradient dW = X^tall dY contracts over the tokens, which are split: each rank holds a
    partial sum, and only an all-reduce over the d ranks completes it."""
    if kind != "replicated":
        raise ValueError(f"data parallelism replicates every weight; the spec for {weight} says {kind!r}")
    tokens = d * tokens_per_rank
    u = 2.6 / max(tokens, h_in, h_out)  # one element's size
    sizes = dict(tall=tokens * u, wide_in=h_in * u, wide_out=h_out * u)
    fig, ax = style.subplots(figsize=(7.2, 3.8), grid=False)
    ax.set_axis_off()
    x = _dp_forward(ax, d, h_in, h_out, weight, **sizes)
    x = _dp_weight_gradient(ax, d, h_in, h_out, weight, x + 1.3, **sizes)
    ax.set_xlim(-0.2, x + d * _PARTIAL_OFFSET + 0.3)
    ax.set_ylim(_TOP - sizes["tall"] - 1.75, _TOP + 0.6)
    ax.set_aspect("equal")
    handles = [Patch(color=style.rank_colour(r), label=tr("rank {r}", r=r)) for r in range(d)]
    handles.append(Patch(color=style.REPLICATED, label=tr("replicated")))
    ax.legend(handles=handles, fontsize=8, loc="lower center", ncol=d + 1, bbox_to_anchor=(0.5, -0.08))
    fig.tight_layout()
    return fig


_TOP, _GAP, _PARTIAL_OFFSET = 0.0, 0.45, 0.07  # the matrices' top edge, the gap around an operator, a partial's step


def _dp_forward(ax, d, h_in, h_out, weight, *, tall, wide_in, wide_out) -> float:
    """X [tokens, h_in] . W [h_in, h_out] = Y [tokens, h_out], from x = 0; returns where Y ends."""
    top, gap = _TOP, _GAP
    x = 0.0
    _matrix(ax, (x, top, wide_in, tall), strips=d, label="X", shape=f"[b·s, {h_in}]")
    ax.text(x + wide_in + gap / 2, top - tall / 2, "·", ha="center", va="center", fontsize=16)
    x += wide_in + gap
    _matrix(
        ax,
        (x, top, wide_out, wide_in),
        label=weight,
        shape=tr("[{h_in}, {h_out}]\non every rank", h_in=h_in, h_out=h_out),
        gid="weight",
    )
    ax.text(x + wide_out + gap / 2, top - tall / 2, "=", ha="center", va="center", fontsize=14)
    x += wide_out + gap
    _matrix(ax, (x, top, wide_out, tall), strips=d, label="Y", shape=f"[b·s, {h_out}]")
    ax.text(
        (x + wide_out) / 2,
        top - tall - 0.55,
        tr(
            "forward: contracts over h_in = {h_in},\nwhole on every rank → each rank's\nrows of Y are final: "
            "no communication",
            h_in=h_in,
        ),
        ha="center",
        va="top",
        fontsize=9,
    )
    return x + wide_out


def _dp_weight_gradient(ax, d, h_in, h_out, weight, x0, *, tall, wide_in, wide_out) -> float:
    """X^T [h_in, tokens] . dY [tokens, h_out] = sum_r partial_r, from x0; returns the left edge of the partials."""
    top, gap, off = _TOP, _GAP, _PARTIAL_OFFSET
    x = x0
    _matrix(ax, (x, top, tall, wide_in), strips=d, axis="cols", label="Xᵀ", shape=f"[{h_in}, b·s]")
    ax.text(x + tall + gap / 2, top - wide_in / 2, "·", ha="center", va="center", fontsize=16)
    x += tall + gap
    _matrix(ax, (x, top, wide_out, tall), strips=d, label=tr("dY"), shape=f"[b·s, {h_out}]")
    ax.text(x + wide_out + gap / 2, top - wide_in / 2, "=", ha="center", va="center", fontsize=14)
    x += wide_out + gap
    for r in reversed(range(d)):  # d stacked partial sums, rank 0 in front
        ax.add_patch(
            Rectangle(
                (x + r * off, top - wide_in + r * off),
                wide_out,
                wide_in,
                facecolor=style.rank_colour(r),
                edgecolor=style.CARD,
                linewidth=0.6,
                alpha=0.9,
                gid="partial",
            )
        )
    ax.text(
        x + wide_out / 2,
        top + 0.12 + d * off,
        tr("d{weight} = Σ partials", weight=weight),
        ha="center",
        va="bottom",
        fontsize=10,
    )
    ax.text(x + wide_out / 2, top - wide_in - 0.12, f"[{h_in}, {h_out}]", ha="center", va="top", fontsize=8)
    ax.text(
        (x0 + x + wide_out) / 2,
        top - tall - 0.55,
        tr(
            "weight gradient: contracts over b·s,\nsplit over d = {d} → every rank holds\na partial sum: all-reduce",
            d=d,
        ),
        ha="center",
        va="top",
        fontsize=9,
    )
    return x + wide_out


# ------------------------------------------------------------------------------------------------ flat buffers

SEGMENTS = (style.tint(style.PARAMS, 0.35), style.tint(style.PARAMS, 0.6))  # neighbouring parameters, told apart


@style.styled
def plot_flat_layout(layout, *, title: str | None = None, ax=None):
    """One flat buffer (a `FlatLayout`): its parameters end to end, the padding that makes it split into
    `layout.parts` equal slices, and which rank owns which slice (ZeRO's layout)."""
    n = layout.padded_numel
    fig, ax = style.figure_axes(ax, figsize=(7.2, 2.4), grid=False)
    small = style.legible_pt(fig, 8)
    ax.set_axis_off()
    _draw_buffer(ax, layout, style.legible_pt(fig, 7))
    for r in range(layout.parts):
        lo, hi = layout.shard_range(r)
        colour = style.rank_colour(r)
        ax.add_patch(
            Rectangle((lo, 0.35), hi - lo, 0.45, facecolor=colour, edgecolor=style.CARD, linewidth=0.8, gid="slice")
        )
        ink = style.ink_on(colour)
        ax.text((lo + hi) / 2, 0.575, f"rank {r}: [{lo}, {hi})", ha="center", va="center", fontsize=small, color=ink)
    ax.set_xlim(-0.01 * n, 1.01 * n)
    ax.set_ylim(0.2, 2.45)
    pad = tr(", {n} padding", n=layout.padding) if layout.padding else tr(", no padding")
    ax.set_title(
        title
        or tr(
            "{key}: {n} parameters, {numel} elements{pad}, {parts} slices of {shard}",
            key=layout.key,
            n=len(layout.entries),
            numel=layout.numel,
            pad=pad,
            parts=layout.parts,
            shard=layout.shard_numel,
        ),
        fontsize=style.legible_pt(fig, 10),
    )
    fig.tight_layout()
    return fig


def _draw_buffer(ax, layout, fontsize: float) -> None:
    """The buffer's top row: each parameter's span, named where it fits, then the hatched padding."""
    n = layout.padded_numel
    for k, e in enumerate(layout.entries):
        colour = SEGMENTS[k % 2]
        ax.add_patch(
            Rectangle((e.offset, 1.0), e.numel, 1.0, facecolor=colour, edgecolor=style.CARD, linewidth=0.8, gid="param")
        )
        if e.numel / n > 0.07:
            name = e.name if e.numel / n > 0.25 else ".".join(e.name.split(".")[-2:])  # short name in a narrow box
            ax.text(
                e.offset + e.numel / 2,
                1.5,
                f"{name}\n{list(e.shape)}",
                ha="center",
                va="center",
                fontsize=fontsize,
                color=style.ink_on(colour),
            )
    if layout.padding:
        ax.add_patch(
            Rectangle(
                (layout.numel, 1.0),
                layout.padding,
                1.0,
                facecolor="none",
                edgecolor=style.WASTE,
                hatch="///",
                linewidth=0.8,
                gid="padding",
            )
        )


# ------------------------------------------------------------------------------------------------ ZeRO-3 resident bytes


@style.styled
def plot_zero3_resident(timeline, shard_bytes: int, *, unit: str = "KiB", ax=None):
    """Resident parameter bytes of one ZeRO-3 rank through a forward and backward, one step per gather or free:
    `timeline` is `FullyShardedDataParallel.timeline` ((time, bytes, what) after every gather and free; the times
    are not used, so short gathers stay visible). The dashed line is the rank's own shards, what it keeps between
    uses; the shaded part is backward."""
    scale = style.BYTE_UNITS[unit]
    rows = list(timeline)
    xs = list(range(len(rows)))
    bs = [b / scale for _, b, _ in rows]
    fig, ax = style.figure_axes(ax, figsize=(7.2, 3.4), grid="y")
    small, label = style.legible_pt(fig, 7), style.legible_pt(fig, 8)
    ax.step(xs + [len(rows)], bs + [bs[-1]], where="post", color=style.PARAMS, linewidth=1.8, gid="resident")
    ax.axhline(shard_bytes / scale, linestyle="--", color=style.TEXT, linewidth=1, gid="shards")
    top = max(bs)
    first_bwd = next((x for x, (_, _, w) in zip(xs, rows) if "backward" in w), None)
    if first_bwd is not None:
        ax.axvspan(first_bwd, len(rows), color=style.BACKWARD, alpha=0.15, linewidth=0, gid="backward")
        ax.text(first_bwd + 0.2, top * 1.2, tr("backward"), fontsize=label, va="bottom")
    ax.text(0.2, top * 1.2, tr("forward"), fontsize=label, va="bottom")
    for x, b, (_, _, what) in zip(xs, bs, rows):
        if what.startswith("gather"):
            ax.text(x + 0.5, b + top * 0.02, what.split()[1], fontsize=small, ha="center", va="bottom")
    ax.text(len(rows), shard_bytes / scale, tr("own shards "), fontsize=label, ha="right", va="bottom")
    ax.set_xlim(0, len(rows))
    ax.set_ylim(0, top * 1.32)
    ax.set_xticks([])
    ax.set_xlabel(tr("gathers and frees, in the order they happened"))
    ax.set_ylabel(tr("parameters resident ({unit})", unit=unit))
    ax.set_title(
        tr("ZeRO-3: one unit gathered at a time, peak {top:,.1f} {unit}", top=top, unit=unit),
        fontsize=style.legible_pt(fig, 10),
    )
    fig.tight_layout()
    return fig


@style.styled
def plot_hsdp_mesh(shard_groups, replica_groups, sent: dict[str, float], *, unit: str = "KiB", ax=None):
    """HSDP's 2-D mesh: one row per shard group (a node; `pylib.plan.mesh.hsdp_groups`), its ranks coloured by the
    shard they hold, joined down each column by their replica group; beside them the bytes one rank sent on each
    link class in a step, `sent` = {"dp-shard": bytes, "dp-replicate": bytes} (a traced run's, by group name)."""
    scale = style.BYTE_UNITS[unit]
    r, s = len(shard_groups), len(shard_groups[0])
    fig, ax = style.figure_axes(ax, figsize=(7.2, 1.0 + 1.15 * r), grid=False)
    small, label = style.legible_pt(fig, 7.5), style.legible_pt(fig, 8.5)
    w, h, gap = 1.0, 0.62, 0.55  # a rank's cell, and the space between two nodes
    top = lambda i: -(i * (h + gap))  # noqa: E731  (row i's top edge)
    for j in range(len(replica_groups)):  # the replica groups first, under the cells
        x = j * (w + 0.15) + w / 2
        ys = [top(0) - h / 2, top(r - 1) - h / 2]  # under the cells: seen between the nodes
        ax.plot([x, x], ys, color=style.COMM, linewidth=2.4, zorder=0.5, gid="replica")
    for i, members in enumerate(shard_groups):
        box = FancyBboxPatch(
            (-0.12, top(i) - h - 0.1),
            s * (w + 0.15) + 0.09,
            h + 0.2,
            boxstyle="round,pad=0,rounding_size=0.08",
            facecolor="none",
            edgecolor=style.TEXT,
            linewidth=1.2,
            gid="node",
        )
        ax.add_patch(box)
        ax.text(-0.25, top(i) - h / 2, tr("node {i}", i=i), ha="right", va="center", fontsize=label)
        for j, g in enumerate(members):
            x = j * (w + 0.15)
            fill = style.rank_colour(j)
            ax.add_patch(Rectangle((x, top(i) - h), w, h, facecolor=fill, edgecolor=style.CARD, gid="rank"))
            ink = style.ink_on(fill)
            ax.text(
                x + w / 2, top(i) - h * 0.32, tr("rank {g}", g=g), ha="center", va="center", fontsize=small, color=ink
            )
            ax.text(
                x + w / 2, top(i) - h * 0.72, tr("shard {j}", j=j), ha="center", va="center", fontsize=small, color=ink
            )
    right = s * (w + 0.15) + 0.3
    shard_text = tr("shard group, inside a node:\n{x:,.1f} {unit} sent per rank", x=sent["dp-shard"] / scale, unit=unit)
    replica_text = tr(
        "replica group, across nodes:\n{x:,.1f} {unit} sent per rank", x=sent["dp-replicate"] / scale, unit=unit
    )
    ax.text(right, top(0) - h / 2 + 0.1, shard_text, ha="left", va="center", fontsize=label, color=style.TEXT)
    ax.text(right, top(0) - h - gap / 2 - 0.1, replica_text, ha="left", va="top", fontsize=label, color=style.COMM)
    ax.set_xlim(-1.3, right + 3.2)
    ax.set_ylim(top(r - 1) - h - 0.4, 0.3)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(tr("HSDP: {r} replicas x {s} shards", r=r, s=s), fontsize=style.legible_pt(fig, 10))
    fig.tight_layout()
    return fig
