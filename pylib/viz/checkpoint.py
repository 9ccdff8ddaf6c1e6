"""The checkpoint figure: what each rank of one mesh wrote, and which of those files each rank of another mesh read.

    fig = plot_resharding(written, read, saved_on="tp2 pp2 dp2", loaded_on="tp4 dp2")

written: {saving rank: {kind: bytes}} (kind "model", "exp_avg", "exp_avg_sq", ...: the key's prefix);
read: {loading rank: {saving rank: bytes}}. Both come from a real run (`pylib.compose.checkpoint`'s SaveReport
and LoadReport); this module draws what it is handed.
"""

from __future__ import annotations

import numpy as np
from matplotlib.patches import Patch

from ..i18n import N_, tr
from . import style

KIND_LABELS = {"model": N_("parameters"), "exp_avg": N_("Adam exp_avg"), "exp_avg_sq": N_("Adam exp_avg_sq")}


def key_kind(key: str) -> str:
    """ "model" for "model.<name>", the state name for "optim.<state>.<name>"."""
    return "model" if key.startswith("model.") else key.split(".")[1]


@style.styled
def plot_resharding(written: dict, read: dict, *, saved_on: str, loaded_on: str, unit: str = "KiB"):
    """Two panels: above, the bytes each saving rank wrote, stacked by kind; below, a matrix of the bytes each
    loading rank (row) read from each saving rank's file (column), each cell labelled."""
    scale = style.BYTE_UNITS[unit]
    savers = sorted(written)
    loaders = sorted(read)
    kinds = [k for k in KIND_LABELS if any(k in w for w in written.values())]
    kinds += sorted({k for w in written.values() for k in w} - set(kinds))
    fig, (top, bottom) = style.subplots(2, 1, figsize=(6.72, 7.2), grid=False, gridspec_kw=dict(height_ratios=[1, 1.6]))
    style.style_axes(top, "y")
    base = np.zeros(len(savers))
    for i, kind in enumerate(kinds):
        h = np.array([written[r].get(kind, 0) / scale for r in savers])
        top.bar(savers, h, bottom=base, color=style.PALETTE[i], width=0.7, edgecolor=style.CARD, lw=0.5)
        base += h
    for r, total in zip(savers, base):
        top.text(r, total, f"{total:.1f}", ha="center", va="bottom", fontsize=8)
    top.set_xticks(savers)
    top.set_xlabel(tr("rank of {mesh} (the saving mesh)", mesh=saved_on))
    top.set_ylabel(tr("written ({unit})", unit=unit))
    top.set_ylim(0, base.max() * 1.18)
    top.set_title(tr("what each rank wrote: its boxes after the replicas were dropped"), fontsize=10)
    top.legend(
        handles=[Patch(facecolor=style.PALETTE[i], label=tr(KIND_LABELS.get(k, k))) for i, k in enumerate(kinds)],
        fontsize=8,
        ncols=len(kinds),
        loc="upper center",
        frameon=False,
    )
    matrix = np.array([[read[b].get(a, 0) / scale for a in savers] for b in loaders])
    bottom.imshow(matrix, cmap="Blues", aspect="auto", vmin=0, vmax=matrix.max() * 1.25)
    for i in range(len(loaders)):
        for j in range(len(savers)):
            v = matrix[i, j]
            if v:
                fill = style.ink_on(bottom.images[0].cmap(v / (matrix.max() * 1.25)))
                bottom.text(j, i, f"{v:.1f}", ha="center", va="center", fontsize=8, color=fill)
    bottom.set_xticks(range(len(savers)), [str(r) for r in savers])
    bottom.set_yticks(range(len(loaders)), [str(r) for r in loaders])
    bottom.set_xlabel(tr("the saving rank of {mesh}, whose file was read", mesh=saved_on))
    bottom.set_ylabel(tr("rank of {mesh} (the loading mesh)", mesh=loaded_on))
    bottom.set_title(tr("the resharding map: {unit} each loading rank read from each file", unit=unit), fontsize=10)
    fig.tight_layout()
    return fig
