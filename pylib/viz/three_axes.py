"""Which elements of an activation [batch, seq, d] each rank holds, one panel per parallelism (article A's three
axes: DP cuts the batch, SP/CP the sequence, TP the features).

    draw_three_axes({"DP": per_rank_indices, ...}, (b, s, d), token_names)
"""

from __future__ import annotations

import torch
from matplotlib.patches import Rectangle

from pylib import i18n

from . import style
from .layer_flow import COLOURS


@style.styled
def draw_three_axes(
    holdings: dict[str, list[torch.Tensor]], shape: tuple[int, int, int], token_names: list[list[str]] | None = None
):
    """One panel per parallelism: the [batch, seq, d] activation as batch rows of seq tokens of d features,
    each element coloured by the rank that holds it.

    holdings: title -> per rank, the flat indices (into a [b, s, d] tensor) of the elements that rank holds.
    Returns the Figure; raises ValueError if an element is held by no rank or by two."""
    b, s, d = shape
    panels = list(holdings.items())
    figsize = (8.2, (1.9 if token_names else 1.35) * len(panels) * b / 2 + 0.5)
    fig, axes = style.subplots(len(panels), 1, figsize=figsize, squeeze=False, grid=False)
    for ax, (title, per_rank) in zip(axes[:, 0], panels):
        owner = torch.full((b * s * d,), -1, dtype=torch.long)
        for r, idx in enumerate(per_rank):
            if (owner[idx] >= 0).any():
                raise ValueError(f"{title}: an element is held by two ranks")
            owner[idx] = r
        if (owner < 0).any():
            raise ValueError(f"{title}: {(owner < 0).sum().item()} elements are held by no rank")
        owner = owner.view(b, s, d)
        ax.set_axis_off()
        gap, pitch = 0.5, 1.5 if token_names else 1.0  # a sentence row: d squares per token, the words under them
        for i in range(b):
            y0 = (b - 1 - i) * pitch + (pitch - 1.0)
            for t in range(s):
                x0 = t * (d + gap)
                for f in range(d):
                    colour = COLOURS[f"rank{owner[i, t, f].item() % 4}"]
                    ax.add_patch(Rectangle((x0 + f, y0), 0.92, 0.85, facecolor=colour, edgecolor="none"))
                if token_names:
                    ax.text(x0 + d / 2, y0 - 0.08, token_names[i][t], ha="center", va="top", fontsize=9)
        ax.set_xlim(-0.2, s * (d + gap))
        ax.set_ylim(-0.15, b * pitch)
        ax.set_title(title, fontsize=10, loc="left")
    handles = [Rectangle((0, 0), 1, 1, facecolor=COLOURS[f"rank{r}"]) for r in range(len(panels[0][1]))]
    fig.legend(
        handles,
        [i18n.tr("rank {r}", r=r) for r in range(len(handles))],
        loc="lower center",
        ncol=len(handles),
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig
