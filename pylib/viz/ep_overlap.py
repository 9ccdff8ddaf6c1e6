"""The measured timeline of two micro-batches through EP MoE layers (`ep_overlap_timings(...)["timelines"]`).

Drawn as `pylib.viz.cp.ring_overlap_figure` draws the ring: one panel per variant on one time axis, for each rank
a lane of compute bars and under it a lane of transfers, each from when it was issued to when it was waited for.
Here the colour says which micro-batch (A blue, B orange), compute bars are named attn.<layer> / experts.<layer>,
and transfers dispatch.<layer> / combine.<layer>; a backward's pieces and transfers (`ep_fwd_bwd_timings`) carry
"grad." before the name and a "∇" in the label."""

from __future__ import annotations

import numpy as np

from ..i18n import tr
from . import style

MICRO_BATCH = (style.BLUE, style.ORANGE)  # A, B
SHORT = {"attn": "a", "experts": "e", "dispatch": "d", "combine": "c", "out": ""}


def variant_title(name: str) -> str:
    """An `ep_overlap_timings` or `ep_fwd_bwd_timings` variant's name as a panel title or a table row."""
    titles = {
        "overlap": tr("interleaved (overlap=True)"),
        "blocking": tr("one after the other (overlap=False)"),
        "paired": tr("A's backward paired with B's forward (overlap=True)"),
    }
    return titles.get(name, name)


def _label(mb: int, name: str) -> str:
    """'attn.0' of micro-batch 1 -> 'Ba0' (micro-batch letter, the part's initial, the layer); a backward's
    'grad.experts.1' of micro-batch 0 -> 'A∇e1', its 'grad.out' -> 'A∇o' (the output's un-permute and the loss)."""
    grad = name.startswith("grad.")
    kind, _, layer = name.removeprefix("grad.").partition(".")
    short = "o" if grad and kind == "out" else SHORT.get(kind, kind)
    return "AB"[mb] + ("∇" if grad else "") + short + layer if short else ""


@style.styled
def ep_overlap_figure(timelines: dict, *, title: str | None = None, xlabel: str | None = None):
    """One panel per variant; per rank a compute lane and a transfer lane (see the module docstring)."""
    names = list(timelines)
    n = len(timelines[names[0]])
    end = max(x["end"] for tl in timelines.values() for rank in tl for x in rank["compute"] + rank["transfers"])
    ms = 1e3
    gap = 0.045 * end * ms  # a label narrower than its bar's room is left out
    fig, axes = style.subplots(len(names), 1, figsize=(7, 1.2 + 1.05 * n * len(names)), sharex=True, grid="x")
    for ax, name in zip(np.atleast_1d(axes), names):
        for r, rank in enumerate(timelines[name]):
            y = 2 * r
            for c in rank["compute"]:
                colour = MICRO_BATCH[c["mb"] % 2]
                width = (c["end"] - c["start"]) * ms
                ax.barh(y, width, left=c["start"] * ms, height=0.8, color=colour, edgecolor=style.CARD, lw=1.2)
                label = _label(c["mb"], c["name"])
                if label and width >= gap:
                    ink = style.ink_on(colour)
                    ax.text(c["start"] * ms + width / 2, y, label, ha="center", va="center", fontsize=9, color=ink)
            for t in rank["transfers"]:
                lane = y + 0.75 + 0.3 * t["mb"]  # A's transfers above B's, so two in flight at once both show
                left, width = t["start"] * ms, (t["end"] - t["start"]) * ms
                colour = MICRO_BATCH[t["mb"] % 2]
                ax.barh(lane, width, left=left, height=0.28, color=colour, alpha=0.45, edgecolor=colour)
                if width >= gap:
                    ax.text(left + width / 2, lane, _label(t["mb"], t["name"]), ha="center", va="center",
                            fontsize=9, color=style.INK)  # fmt: skip
        ranks = [tr("rank {r}", r=r) for r in range(n)]
        style.rank_lanes(ax, ranks, tr("all-to-all"), end * ms, variant_title(name), bottom=0.6)
    return style.finish_timeline(fig, axes, xlabel or tr("time since the step began (ms)"), title)
