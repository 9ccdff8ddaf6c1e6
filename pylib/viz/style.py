"""The book's matplotlib style: figures that read the same in the site's light and dark themes and in JupyterLab.

Call it once per chapter, before drawing, or around one figure::

    from pylib.viz import style

    style.apply()                     # for the rest of the notebook
    with style.use():                 # or only for the figures created inside
        fig, ax = plt.subplots()
        ax.plot(x, y, color=style.PALETTE[0])

and give every figure alt text (the site test fails a page with an image whose alt is empty): in a MyST code cell,
``mystnb: {image: {alt: "..."}, figure: {caption: "...", name: fig-...}}`` in the cell's options.

Why a light card and not a transparent background: in its dark theme the pydata theme puts every image of the
page content on a light grey card (and dims it), so a transparent figure drawn for a dark page would sit on light
grey there; and JupyterLab's dark theme puts a transparent figure on near-black. A near-white figure background
(`CARD`) looks like the page in the light theme, like the theme's own card in the dark theme, and stays a card in
JupyterLab. On it:

- text and axes are a dark slate grey (`TEXT`, contrast 9:1 on the card), never pure black;
- `PALETTE` holds eight mid-tone colours of distinct hue (the default colour cycle), each at least 3:1 against the
  card and against a near-black page, so a figure drawn transparent still reads on both; `GRID` and `MUTED` are
  for background structure (grid lines, shaded bubbles, inactive ranks).

tests/test_viz_style.py checks those contrast ratios (WCAG 2 relative luminance) and that figures made under the
style render with the card background.
"""

from __future__ import annotations

import contextlib

import matplotlib as mpl

CARD = "#fbfbfc"  # figure and axes background: near-white, opaque
TEXT = "#3d4451"  # labels, titles, ticks, spines
MUTED = "#7a818c"  # secondary marks (inactive ranks, reference lines)
GRID = "#d9dde3"  # grid lines, light fills
PALETTE = (
    "#3b78c4",  # blue
    "#c8691e",  # orange
    "#2e9467",  # green
    "#d1495b",  # red
    "#8a63c6",  # purple
    "#1b8f9c",  # teal
    "#a67c12",  # ochre
    "#7a818c",  # grey
)
DARK_PAGE = "#121212"  # the pydata theme's dark page background, for the contrast checks

RC: dict[str, object] = {
    "figure.facecolor": CARD,
    "figure.edgecolor": CARD,
    "savefig.facecolor": CARD,
    "savefig.edgecolor": CARD,
    "savefig.transparent": False,
    "axes.facecolor": CARD,
    "axes.edgecolor": TEXT,
    "axes.labelcolor": TEXT,
    "axes.titlecolor": TEXT,
    "axes.prop_cycle": mpl.cycler(color=list(PALETTE)),
    "axes.grid": True,
    "axes.axisbelow": True,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "grid.color": GRID,
    "grid.linewidth": 0.8,
    "text.color": TEXT,
    "xtick.color": TEXT,
    "ytick.color": TEXT,
    "xtick.labelcolor": TEXT,
    "ytick.labelcolor": TEXT,
    "legend.frameon": False,
    "legend.labelcolor": TEXT,
    "patch.edgecolor": CARD,
    "font.size": 10,
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "savefig.bbox": "tight",
}


def apply() -> None:
    """Use the book's style for every figure created from now on in this process (updates `matplotlib.rcParams`)."""
    mpl.rcParams.update(RC)


@contextlib.contextmanager
def use():
    """Use the book's style for the figures created inside the block only; rcParams are restored after."""
    with mpl.rc_context(RC):
        yield


def relative_luminance(color) -> float:
    """WCAG 2 relative luminance of a matplotlib colour (alpha ignored): 0 for black, 1 for white."""

    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = mpl.colors.to_rgb(color)
    return 0.2126 * linear(r) + 0.7152 * linear(g) + 0.0722 * linear(b)


def contrast_ratio(a, b) -> float:
    """WCAG 2 contrast ratio of two colours, from 1 (same) to 21 (black on white)."""
    la, lb = sorted((relative_luminance(a), relative_luminance(b)))
    return (lb + 0.05) / (la + 0.05)
