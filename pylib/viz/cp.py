"""Figures for the context-parallelism chapter, drawn from real runs.

    sequence_split_figure(specs, seq_len) the matrix picture: x [s, h] split along s, and the score matrix each
                                          rank must fill (from the CP model's shard specs)
    ring_rounds_figure(rows)              article A's round table as a picture (rows from pylib.cp.ring_rounds)
    zigzag_balance_figure(work)           measured per-rank attention work, contiguous vs zig-zag
    causal_ownership_figure(seq_len, cp)  the causal score matrix coloured by the rank that computes each row
    merge_drift_figure(rows)              error of bf16 ring attention vs cp, bf16 vs float32 merge (measured)
    allgather_figure(runs, seq_len)       all-gather CP: the chunks each rank holds, gathers and attends to
    ring_overlap_figure(timelines)        the ring's measured timeline: each step's compute and the K/V transfers,
                                          overlapped and blocking (pylib.experiments.ring_overlap)

Drawn in the book's style (`pylib.viz.style`): each rank, and the K/V block it owns, in its rank colour.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap, to_rgba

from ..i18n import tr
from ..plan.options import CP_LAYOUT
from ..plan.problems import n_chunks
from . import style


def _rank_handles(n: int) -> list:
    return [plt.Rectangle((0, 0), 1, 1, color=style.rank_colour(r)) for r in range(n)]


@style.styled
def ring_rounds_figure(rows, *, title: str | None = None):
    """A grid: one row per round, one column per rank; each cell is the K/V block that rank attends to, coloured
    by the block's owner, with arrows for the transfers between rounds (who received from whom)."""
    n = len(rows[0]["holds"])
    fig, ax = style.subplots(figsize=(1.6 * n + 1.4, 0.9 * len(rows) + 1.0), grid=False)
    for i, row in enumerate(rows):
        y = -i
        for r, block in enumerate(row["holds"]):
            colour = style.rank_colour(block)
            ax.add_patch(plt.Rectangle((r - 0.38, y - 0.3), 0.76, 0.6, color=colour, zorder=2))
            ink = style.ink_on(colour)
            ax.text(r, y, f"K{block}V{block}", ha="center", va="center", color=ink, fontsize=10, zorder=3)
        if row["recv_from"] is not None:
            for r, src in enumerate(row["recv_from"]):
                start = (src, y + 1 - 0.32)
                end = (r, y + 0.32)
                if src == n - 1 and r == 0 and n > 2:  # the wrap-around hop: out at the right edge, in at the left
                    dashed = dict(color=style.MUTED, lw=1.0, linestyle="--")
                    ax.plot([src + 0.38, n - 0.45], [y + 1 - 0.1, y + 0.5], zorder=1, **dashed)
                    ax.annotate(
                        "", xy=(-0.38, y + 0.1), xytext=(-0.55, y + 0.5), arrowprops=dict(arrowstyle="->", **dashed)
                    )
                else:
                    arrow = dict(arrowstyle="->", color=style.MUTED, lw=1.0)
                    ax.annotate("", xy=end, xytext=start, arrowprops=arrow, zorder=1)
    ax.set_xlim(-0.62, n - 0.38)
    ax.set_ylim(-len(rows) + 0.4, 0.6)
    ax.set_xticks(range(n), [tr("rank {r}\n(keeps Q{r})", r=r) for r in range(n)])
    ax.set_yticks([-i for i in range(len(rows))], [tr("round {n}", n=row["round"]) for row in rows])
    ax.xaxis.tick_top()
    ax.set_title(
        tr("Ring attention: the K/V block each rank holds, round by round") if title is None else title, pad=28
    )
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.tick_params(length=0)
    fig.tight_layout()
    return fig


def _layout_name(layout: str) -> str:
    """A CP layout's name ("contiguous", "zigzag": the keys code uses) in the reader's language."""
    return {"contiguous": tr("contiguous"), "zigzag": tr("zigzag")}.get(layout, layout)


@style.styled
def zigzag_balance_figure(work, *, what: str | None = None, title: str | None = None):
    """Grouped bars of per-rank attention work for each layout. `work`: {"contiguous": [w_0, ..], "zigzag":
    [..]} measured on real rings (e.g. `RingStats.work()` per rank). Each layout's max/min ratio is in the
    legend."""
    layouts = list(work)
    n = len(work[layouts[0]])
    fig, ax = style.subplots(figsize=(1.1 * n + 3.0, 3.2), grid="y")
    width = 0.8 / len(layouts)
    for j, layout in enumerate(layouts):
        vals = np.asarray(work[layout], dtype=float)
        ratio = vals.max() / vals.min()
        ax.bar(
            np.arange(n) + (j - (len(layouts) - 1) / 2) * width,
            vals,
            width * 0.95,
            color=style.PALETTE[j],
            label=tr("{layout}  (max/min = {ratio:.2f})", layout=_layout_name(layout), ratio=ratio),
        )
    ax.set_xticks(range(n), [tr("rank {r}", r=r) for r in range(n)])
    ax.set_ylabel(tr("score entries computed") if what is None else what)
    ax.set_title(title or tr("Causal attention work per rank, cp = {n}", n=n))
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig


@style.styled
def causal_ownership_figure(seq_len: int, cp: int, layouts=("contiguous", "zigzag")):
    """The causal score matrix (query rows x key columns) for each layout, each unmasked entry coloured by the
    rank that owns its query row: contiguous piles the big rows on the last rank, zig-zag spreads them."""
    from pylib.plan.sequence import token_positions

    fig, axes = style.subplots(1, len(layouts), figsize=(3.4 * len(layouts) + 1.2, 3.4), grid=False)
    axes = np.atleast_1d(axes)
    cmap = ListedColormap([style.rank_colour(r) for r in range(cp)])
    for ax, layout in zip(axes, layouts):
        owner = np.full(seq_len, -1)
        for r in range(cp):
            owner[token_positions(seq_len, r, cp, layout)] = r
        grid = np.where(np.tril(np.ones((seq_len, seq_len), dtype=bool)), owner[:, None], np.nan)
        ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-0.5, vmax=cp - 0.5, interpolation="nearest")
        ticks = range(0, seq_len, max(1, seq_len // 4))
        ax.set_xticks(ticks)
        ax.set_yticks(ticks)
        ax.set_title(_layout_name(layout))
        ax.set_xlabel(tr("key position"))
        ax.set_ylabel(tr("query position"))
    fig.tight_layout(rect=(0, 0, 0.82, 0.92))
    fig.legend(_rank_handles(cp), [tr("rank {r}", r=r) for r in range(cp)], loc="center right")
    fig.suptitle(tr("Who computes which scores (causal, s = {s}, cp = {cp})", s=seq_len, cp=cp))
    return fig


def _chunk_owner(note: str) -> tuple[int, list[int], int]:
    """(rank, chunks, n_chunks) from a sequence ShardSpec note: "rank 1 holds chunks 1, 6 of 8"."""
    words = note.replace(",", " ").split()
    rank = int(words[1])
    of = words.index("of")
    return rank, [int(w) for w in words[4:of]], int(words[of + 1])


@style.styled
def sequence_split_figure(specs_by_rank, seq_len: int, *, name: str = "x", causal: bool = True):
    """Article B's matrix picture of CP, from each rank's `shard_specs()` (a list per cp rank, rank order).

    Left: the activation `name` [s, h] with its rows coloured by the rank that holds them (split along s; every
    column on every rank). Right: the score matrix q k^T [s, s] (under the causal mask if `causal`): row i is
    computed by the rank holding token i; a cell is solid where the key's K/V already lives on that rank and pale
    where it must arrive from another rank -- the only communication CP needs."""
    cp = len(specs_by_rank)
    owner = np.full(seq_len, -1)
    width = None
    for specs in specs_by_rank:
        spec = next(s for s in specs if s.name == name)
        width = spec.full_shape[-1]
        rank, chunks, n_chunks = _chunk_owner(spec.note)
        c = seq_len // n_chunks
        for i in chunks:
            owner[i * c : (i + 1) * c] = rank
    if (owner < 0).any():
        raise ValueError(f"the specs leave tokens {np.flatnonzero(owner < 0).tolist()} without an owner")
    colours = np.array([to_rgba(style.rank_colour(r)) for r in range(cp)])
    fig, (ax_x, ax_s) = style.subplots(1, 2, figsize=(8.6, 4.0), gridspec_kw=dict(width_ratios=[1, 2.2]), grid=False)
    shown_h = min(width, 8)
    ax_x.imshow(colours[owner][:, None, :].repeat(shown_h, axis=1), aspect="auto", interpolation="nearest")
    ax_x.set_title(tr("{name} [s, h]: rows split over cp = {cp}", name=name, cp=cp))
    ax_x.set_xlabel(
        tr("feature (h = {h}, first 8 shown)", h=width) if width > shown_h else tr("feature (h = {h})", h=width)
    )
    ax_x.set_ylabel(tr("token position (s)"))
    ax_x.set_xticks([])
    local = owner[:, None] == owner[None, :]
    rgba = colours[owner][:, None, :].repeat(seq_len, axis=1).copy()
    rgba[..., 3] = np.where(local, 1.0, 0.28)
    if causal:
        rgba[~np.tril(np.ones((seq_len, seq_len), dtype=bool)), 3] = 0.0
    ax_s.imshow(rgba, interpolation="nearest")
    ticks = range(0, seq_len, max(1, seq_len // 8))
    ax_s.set_xticks(ticks)
    ax_s.set_yticks(ticks)
    ax_x.set_yticks(ticks)
    ax_s.set_title(tr("scores q k^T [s, s]: row i computed by token i's rank"))
    ax_s.set_xlabel(tr("key position (its K/V: solid = on the same rank, pale = from another rank)"))
    ax_s.set_ylabel(tr("query position"))
    ax_s.legend(_rank_handles(cp), [tr("rank {r}", r=r) for r in range(cp)], loc="upper right")
    fig.tight_layout()
    return fig


@style.styled
def merge_drift_figure(rows, *, title: str | None = None):
    """RMS error vs cp for the two merge accumulators, from `pylib.experiments.ring_merge_drift` rows (measured)."""
    cps = [r["cp"] for r in rows]
    fig, ax = style.subplots(figsize=(5.6, 3.3))
    labels = (("bf16_merge", tr("merge accumulated in bf16")), ("fp32_merge", tr("in float32")))
    for j, (key, label) in enumerate(labels):
        ax.plot(cps, [r[key] for r in rows], marker="o", color=style.PALETTE[j + 1], label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(cps, [str(c) for c in cps])
    ax.set_xlabel(tr("cp (ring size = number of merged blocks)"))
    ax.set_ylabel(tr("RMS error"))
    ax.set_ylim(bottom=0)
    ax.set_title(tr("bf16 ring attention: error against float64 attention") if title is None else title)
    ax.legend()
    fig.tight_layout()
    return fig


@style.styled
def allgather_figure(runs, seq_len: int, layout: str = CP_LAYOUT):
    """All-gather CP on real ranks, one row per rank, one cell per chunk of the sequence (cut as `layout` cuts it)
    in token order. runs: per rank (rank order) a dict with "positions" (the token positions it holds), "blocks"
    (the `GatherBlock`s its forward computed) and "sent" (bytes its all-gather sent, from the tracer). A cell is the
    chunk's K/V in its owner's colour: solid where the rank holds it (and its queries, "Q"), pale where it arrived by
    the gather; a bar under the row spans the keys each of the rank's query chunks attended to, so the gathered
    chunks right of every bar were gathered and never read."""
    cp = len(runs)
    n = n_chunks(cp, layout)
    c = seq_len // n
    owner = np.full(n, -1)
    for r, run in enumerate(runs):
        for p in run["positions"][::c]:
            owner[p // c] = r
    fig, ax = style.subplots(figsize=(0.62 * n + 2.6, 1.0 * cp + 1.4), grid=False)
    for r, run in enumerate(runs):
        y = -r
        mine = {p // c for p in run["positions"]}
        for i in range(n):
            colour = style.rank_colour(owner[i])
            alpha = 1.0 if i in mine else 0.3
            ax.add_patch(plt.Rectangle((i - 0.42, y - 0.22), 0.84, 0.5, color=colour, alpha=alpha, lw=0, zorder=2))
            label = f"Q{i}\nK{i}V{i}" if i in mine else f"K{i}V{i}"
            ax.text(i, y + 0.03, label, ha="center", va="center", fontsize=8, color=style.ink_on(colour, alpha))
        reach: dict[int, int] = {}  # query chunk -> the end of the keys it attended to, in chunks
        for blk in run["blocks"]:
            q = run["positions"][blk.q_rows.start] // c
            reach[q] = max(reach.get(q, 0), blk.kv_rows.stop // c)
        for j, (q, stop) in enumerate(sorted(reach.items())):
            yb = y - 0.32 - 0.13 * j
            ax.plot([-0.42, stop - 0.58], [yb, yb], color=style.rank_colour(r), lw=1.8, zorder=3)
            ax.text(stop - 0.52, yb, f"Q{q}", va="center", fontsize=8, color=style.MUTED)
        ax.text(n - 0.3, y + 0.03, tr("sent {kib:,.1f} KiB", kib=run["sent"] / 1024), va="center", fontsize=9)
    ax.set_xlim(-0.6, n + 1.6)
    ax.set_ylim(-cp + 0.45, 0.55)
    ax.set_xticks(range(n), [str(i) for i in range(n)])
    ax.set_xlabel(tr("chunk of the sequence (token order)"))
    ax.xaxis.set_label_position("top")
    ax.set_yticks([-r for r in range(cp)], [tr("rank {r}", r=r) for r in range(cp)])
    ax.xaxis.tick_top()
    ax.set_title(
        tr("All-gather CP: solid = held, pale = gathered;\nbars = the keys each query chunk attends to"), pad=24
    )
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.tick_params(length=0)
    fig.tight_layout()
    return fig


def _variant_title(name: str) -> str:
    """A ring_overlap_timings variant's name as the figure's panel title."""
    titles = {"overlap": tr("overlapped (overlap=True)"), "blocking": tr("blocking (overlap=False)")}
    return titles.get(name, name)


@style.styled
def ring_overlap_figure(timelines: dict, *, title: str | None = None):
    """The ring's measured timeline (`ring_overlap_timings(...)["timelines"]`), one panel per variant on one time
    axis: for each rank a lane of compute, each step's block attention and merge as a bar (forward blue, backward
    orange, labelled F<step> / B<step>), and under it a lane of the K/V (and, backward, dK/dV) transfers, each from
    when it was issued to when it was waited for. Overlapped, a transfer's bar spans the compute above it; blocking,
    it ends before the compute starts."""
    names = list(timelines)
    n = len(timelines[names[0]])
    end = max(x["end"] for tl in timelines.values() for rank in tl for x in rank["compute"] + rank["transfers"])
    ms = 1e3
    gap = 0.07 * end * ms  # labels of one lane closer than this would overlap: the later one is left out
    fig, axes = style.subplots(len(names), 1, figsize=(7, 1.2 + 1.05 * n * len(names)), sharex=True, grid="x")
    for ax, name in zip(np.atleast_1d(axes), names):
        for r, rank in enumerate(timelines[name]):
            y = 2 * r
            for c in rank["compute"]:
                colour = style.FORWARD if c["phase"] == "forward" else style.BACKWARD
                width = (c["end"] - c["start"]) * ms
                ax.barh(y, width, left=c["start"] * ms, height=0.8, color=colour, edgecolor=style.CARD, lw=1.2)
                label = ("F" if c["phase"] == "forward" else "B") + str(c["step"])
                ink = style.ink_on(colour)
                ax.text(c["start"] * ms + width / 2, y, label, ha="center", va="center", fontsize=9, color=ink)
            last = -float("inf")
            for t in rank["transfers"]:
                alpha = 0.55 if t["phase"] == "forward" else 0.35
                left, width = t["start"] * ms, (t["end"] - t["start"]) * ms
                ax.barh(y + 0.9, width, left=left, height=0.5, color=style.COMM, alpha=alpha, edgecolor=style.COMM)
                if left - last >= gap:
                    ax.text(left, y + 0.9, t["name"], ha="left", va="center", fontsize=9, color=style.INK)
                    last = left
        ranks = [tr("rank {r}", r=r) for r in range(n)]
        style.rank_lanes(ax, ranks, tr("transfers"), end * ms, _variant_title(name), bottom=0.5)
    return style.finish_timeline(fig, axes, tr("time since the rank started forward (ms)"), title)
