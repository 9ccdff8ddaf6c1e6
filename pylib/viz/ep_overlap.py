"""The measured timeline of two micro-batches through EP MoE layers (`ep_overlap_timings(...)["timelines"]`).

Drawn as `pylib.viz.cp.ring_overlap_figure` draws the ring: one panel per variant on one time axis, for each rank
a lane of compute bars and under it a lane of transfers, each from when it was issued to when it was waited for.
Here the colour says which micro-batch (A blue, B orange), compute bars are named attn.<layer> / experts.<layer>,
and transfers dispatch.<layer> / combine.<layer>."""

from __future__ import annotations

import numpy as np

from ..i18n import tr
from . import style

MICRO_BATCH = (style.BLUE, style.ORANGE)  # A, B
SHORT = {"attn": "a", "experts": "e", "dispatch": "d", "combine": "c", "out": ""}


def variant_title(name: str) -> str:
    """An `ep_overlap_timings` variant's name as a panel title or a table row."""
    titles = {"overlap": tr("interleaved (overlap=True)"), "blocking": tr("one after the other (overlap=False)")}
    return titles.get(name, name)


def _label(mb: int, name: str) -> str:
    """'attn.0' of micro-batch 1 -> 'Ba0' (micro-batch letter, the part's initial, the layer)."""
    kind, _, layer = name.partition(".")
    return "AB"[mb] + SHORT.get(kind, kind) + layer if SHORT.get(kind, kind) else ""


@style.styled
def ep_overlap_figure(timelines: dict, *, title: str | None = None):
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
        ticks = [2 * r + d for r in range(n) for d in (0, 0.9)]
        labels = [lab for r in range(n) for lab in (tr("rank {r}", r=r), tr("all-to-all"))]
        ax.set_yticks(ticks, labels, fontsize=9)
        ax.set_ylim(2 * n - 0.6, -0.6)
        ax.set_xlim(0, end * ms * 1.02)
        ax.set_title(variant_title(name), fontsize=10, loc="left")
        ax.tick_params(axis="x", labelsize=9)
    np.atleast_1d(axes)[-1].set_xlabel(tr("time since the step began (ms)"), fontsize=10)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
