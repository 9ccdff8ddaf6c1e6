"""The smallest font size that stays legible once a figure is shown in the page's content column.

A PNG of a figure `w` inches wide at `fig.dpi` is shown at its natural width, or scaled down to `style.COLUMN_PX`
when wider (`style.smallest_text_px`). A figure function that draws on a caller's axes does not choose the figure's
width, so it asks here for the size its small labels need on that figure: `legible_pt(ax.figure, 7)` is 7 pt on a
figure up to 7.2 in wide at dpi 100, and grows with the width beyond that (9 pt at 10 in).
"""

from __future__ import annotations

from . import style


def legible_pt(fig, pt: float) -> float:
    """`pt`, or the font size (points, 1% above the bound) whose text is `style.LEGIBLE_PX` high on the page when
    `fig` is scaled to the content column, whichever is larger."""
    scale = min(1.0, style.COLUMN_PX / (fig.get_figwidth() * fig.dpi))
    need = style.LEGIBLE_PX * 72 / (fig.dpi * scale)
    return max(pt, 1.01 * need)
