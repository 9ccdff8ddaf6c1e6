"""The book's matplotlib style: figures that read the same in the site's light and dark themes and in JupyterLab.
Every figure of pylib.viz is drawn with it; a chapter that draws its own figure uses it too::

    from pylib.viz import style

    fig, ax = style.subplots(figsize=(6, 3))      # a figure on the card, axes in the book's look
    ax.plot(x, y, color=style.FORWARD)
    with style.use():                             # or: everything created inside uses the style
        ...
    style.apply()                                 # or: for the rest of the notebook

A chapter shows or glues the Figure as usual: importing this module makes the notebook show figures as SVG
(`show_as_svg`), sharp at any zoom and screen density, with the text as paths so no font has to reach the reader.

Give every figure alt text (the site test fails a page with an image whose alt is empty): in a MyST code cell,
``mystnb: {image: {alt: "..."}, figure: {caption: "...", name: fig-...}}`` in the cell's options, or ``:alt:`` on
the ``{glue:figure}``.

Why a light card and not a transparent background: in its dark theme the pydata theme puts every image of the
page content on a light background (and dims it), so a transparent figure drawn for a dark page would sit on light
grey there; and JupyterLab's dark theme puts a transparent figure on near-black. A near-white figure background
(`CARD`) looks like the page in the light theme, like the theme's own card in the dark theme, and stays a card in
JupyterLab. On it:

- text and axes are a dark slate grey (`TEXT`, contrast 9:1 on the card), never pure black; `MUTED` (about 4:1)
  for secondary text and marks (notes under a label, reference lines, inactive ranks);
- `PALETTE` holds eight mid-tone colours of distinct hue (the default colour cycle), each at least 3:1 against the
  card and against a near-black page, so a figure drawn transparent still reads on both; `GRID` is for background
  structure (grid lines, cell borders, light fills);
- text written on a filled shape takes `ink_on(fill, alpha)`: `INK` (near-black) on light fills, `CARD` on the
  full-strength ones, whichever contrasts more (never less than 4:1 on a palette colour at any alpha).

One meaning, one colour, in every figure:

    rank_colour(r)            rank r (PALETTE in order; groups of ranks, the modes of Part II likewise)
    FORWARD, BACKWARD         forward and backward compute (pipeline timelines, DP's backward pass)
    PARAMS, GRADS, OPTIM      model state: parameters, gradients (born in backward: BACKWARD's colour), optimizer
    COMM                      communication (a collective's name, a P2P arrow, a send/recv wait, a bucket in flight)
    WASTE                     what is spent on nothing: the pipeline bubble, a flat buffer's padding
    REPLICATED                a tensor every rank holds whole (no rank's colour)
    GREEN, AMBER, RED         article A's traffic lights (AMBER: a fill only, too light for lines on the card)

A figure function of pylib.viz: decorate it with `@styled` (its body runs under the style, so its text and legends
need no colour), make its axes with `subplots(...)`, or `figure_axes(ax, ...)` when it takes an `ax=`, colour by
meaning from the names above, return the Figure (no `plt.show()`, no backend switch).

tests/test_viz_style.py checks the contrast ratios (WCAG 2 relative luminance) and the helpers;
tests/test_viz_card.py checks that every public figure function of pylib.viz draws on the card (a new one needs a
case there).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import re

import matplotlib as mpl
import matplotlib.pyplot as plt

CARD = "#fbfbfc"  # figure and axes background: near-white, opaque
TEXT = "#3d4451"  # labels, titles, ticks, spines
MUTED = "#7a818c"  # secondary text and marks (notes, reference lines, inactive ranks)
GRID = "#d9dde3"  # grid lines, cell borders, light fills
INK = "#1b1f25"  # text on a light fill (see ink_on)

BLUE = "#3b78c4"
ORANGE = "#c8691e"
GREEN = "#2e9467"
RED = "#d1495b"
PURPLE = "#8a63c6"
TEAL = "#1b8f9c"
OCHRE = "#a67c12"
GREY = "#7a818c"
PALETTE = (BLUE, ORANGE, GREEN, RED, PURPLE, TEAL, OCHRE, GREY)
# A yellow that looks yellow cannot be dark enough for a line on the card (OCHRE is the palette's yellow): AMBER is a
# fill only, always with an edge and INK text on it -- article A's yellow traffic light.
AMBER = "#e0ae2e"
DARK_PAGE = "#121212"  # the pydata theme's dark page background, for the contrast checks

FORWARD, BACKWARD = BLUE, ORANGE
PARAMS, GRADS, OPTIM = BLUE, ORANGE, GREEN
COMM = TEAL
WASTE = RED
REPLICATED = MUTED

BYTE_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}  # the `unit=` of figures that plot bytes

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


# The Chinese edition's figures: Noto Sans CJK SC, from the `mplfonts` wheel (requirements-common.txt; the wheel is
# found, not imported). Figures reach the page as SVG (`show_as_svg`) with their text drawn as paths (svg.fonttype
# "path"), so the reader's browser needs no CJK font: an SVG shown by an <img> may not load web fonts, and a reader
# without Noto Sans CJK would see a fallback font or boxes. DejaVu Sans stays behind it in font.family: matplotlib
# falls back glyph by glyph to the next family for what the first lacks.
CJK_FAMILY = "Noto Sans CJK SC"
CJK_FILE = "NotoSansCJKsc-Regular.otf"


@functools.cache
def cjk_font_path():
    """The CJK font file (a pathlib.Path), registered with matplotlib's font manager; None when it is not
    installed."""
    import importlib.util
    from pathlib import Path

    from matplotlib import font_manager

    spec = importlib.util.find_spec("mplfonts")
    if spec is None or not spec.submodule_search_locations:
        return None
    for where in spec.submodule_search_locations:
        path = Path(where) / "fonts" / CJK_FILE
        if path.is_file():
            manager = font_manager.fontManager
            manager.addfont(str(path))
            # The wheel has the regular weight only. A bold text (a figure's emphasis) would be drawn in it anyway,
            # after matplotlib's "Failed to find font weight bold" warning in the page's output: register the same
            # file as the bold face too, so the fallback is said here once instead of warned in every figure.
            regular = [f for f in manager.ttflist if Path(f.fname) == path]
            manager.ttflist += [dataclasses.replace(f, weight="bold") for f in regular]
            return path
    return None


def rc() -> dict[str, object]:
    """RC, plus the CJK font first in font.sans-serif when pylib speaks Chinese (pylib.i18n.language()). Raises
    when the Chinese edition is asked for and the font is missing: a figure of boxes would be worse than an error."""
    from pylib.i18n import language

    params = dict(RC)
    if language() == "zh":
        if cjk_font_path() is None:
            raise RuntimeError(f"the Chinese figures need {CJK_FAMILY}: pip install mplfonts (requirements-common.txt)")
        # font.family names the families themselves, not "sans-serif": a Text keeps its family list and resolves
        # a generic name at draw time, with the rcParams of then (after `use()` has restored them).
        families = [CJK_FAMILY, "DejaVu Sans"]  # DejaVu Sans: matplotlib's own, always there
        params["font.family"] = families
        params["font.sans-serif"] = families
    return params


def show_as_svg() -> None:
    """Make the notebook show every figure as SVG, text drawn as paths (see CJK_FAMILY), instead of the inline
    backend's PNG at the figure's dpi (100: soft on a HiDPI screen and when a phone reader zooms in). Runs when this
    module is imported, so every chapter and lab that draws (each imports pylib.viz) shows SVG with no cell of its
    own; outside IPython (a test, a script) it does nothing. A `{glue:figure}` pastes the same SVG: myst-nb's glue
    formats a figure through the same formatters.

    Each SVG goes out with the width its smallest text needs on a phone (`svg_with_phone_width`), as the output's
    metadata; see PHONE_COLUMN_PX for what the site does with it."""
    import sys

    if "IPython" not in sys.modules:  # not in a notebook: nothing imported IPython
        return
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return
    from IPython.core.pylabtools import select_figure_formats
    from matplotlib.figure import Figure
    from matplotlib_inline.backend_inline import InlineBackend

    mpl.rcParams["svg.fonttype"] = "path"
    # The inline backend's settings, not just its formatters: it selects the formats from these again when it is
    # first activated (configure_inline_support), which may come after this import.
    config = InlineBackend.instance()
    config.figure_formats = {"svg"}
    select_figure_formats(shell, config.figure_formats, **config.print_figure_kwargs)
    # Then the SVG formatter itself, replaced by one that adds the metadata (select_figure_formats registered
    # IPython's print_figure for Figure; a formatter may return (data, metadata)).
    formatter = shell.display_formatter.formatters["image/svg+xml"]
    formatter.for_type(Figure, functools.partial(svg_with_phone_width, **config.print_figure_kwargs))


def apply() -> None:
    """Use the book's style for every figure created from now on in this process (updates `matplotlib.rcParams`)."""
    mpl.rcParams.update(rc())


@contextlib.contextmanager
def use():
    """Use the book's style for the figures created inside the block only; rcParams are restored after."""
    with mpl.rc_context(rc()):
        yield


def styled(fn):
    """Decorator for a figure function: its body runs under `use()`, so every text, line, legend and axes it creates
    takes the book's colours without naming them. The signature is unchanged."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with use():
            return fn(*args, **kwargs)

    return wrapper


def style_axes(ax, grid: bool | str = True):
    """Give an existing axes (and its figure) the book's look: card background, TEXT spines, ticks and labels, no
    top or right spine. grid: False, True (both axes), "x" or "y". Returns the axes.

    For axes made elsewhere: a chapter's own `plt.subplots`, handed to a figure function as `ax=`. The settings
    are stored on the axes, so they hold for ticks and labels matplotlib creates later, at draw time."""
    ax.figure.set_facecolor(CARD)
    ax.figure.set_edgecolor(CARD)
    ax.set_facecolor(CARD)
    for side, spine in ax.spines.items():
        spine.set_color(TEXT)
        spine.set_visible(side in ("left", "bottom"))
    ax.tick_params(colors=TEXT, labelcolor=TEXT)
    ax.xaxis.label.set_color(TEXT)
    ax.yaxis.label.set_color(TEXT)
    ax.title.set_color(TEXT)
    ax.grid(False)
    if grid:
        ax.set_axisbelow(True)
        ax.grid(True, axis="both" if grid is True else grid, color=GRID, linewidth=0.8)
    return ax


def subplots(*args, grid: bool | str = True, **kwargs):
    """`plt.subplots(*args, **kwargs)` in the book's style: the figure on the card, every axes through
    `style_axes(ax, grid)` (grid False for diagrams and images, "y" for bar charts). Returns (fig, axes) as
    plt.subplots does."""
    with use():
        fig, axes = plt.subplots(*args, **kwargs)
    for ax in fig.axes:
        style_axes(ax, grid)
    return fig, axes


def figure_axes(ax=None, *, figsize=None, grid: bool | str = True):
    """(fig, ax) for a figure function with an optional `ax=` argument: the caller's axes (say, one panel of a
    chapter's `subplots`) put in the book's style, or else a new figure of `figsize` with one styled axes."""
    if ax is None:
        return subplots(figsize=figsize, grid=grid)
    return ax.figure, style_axes(ax, grid)


def rank_colour(r: int) -> str:
    """The colour of rank r (of group r, of mode r): PALETTE in order, repeating after eight."""
    return PALETTE[r % len(PALETTE)]


def tint(colour, amount: float) -> str:
    """`colour` mixed with the card, as "#rrggbb": amount 0 is the colour, 1 the card (lighter shades of one
    meaning, e.g. the later chunks of an interleaved pipeline; also what a fill at alpha 1 - amount looks like)."""
    if not 0 <= amount <= 1:
        raise ValueError(f"tint amount must be in [0, 1], got {amount}")
    c, k = mpl.colors.to_rgb(colour), mpl.colors.to_rgb(CARD)
    return mpl.colors.to_hex([a + (b - a) * amount for a, b in zip(c, k)])


def ink_on(fill, alpha: float = 1.0) -> str:
    """The colour for text written on `fill` drawn at `alpha` over the card: INK or CARD, whichever contrasts
    more with what the reader sees there."""
    seen = tint(fill, 1.0 - alpha)
    return INK if contrast_ratio(INK, seen) >= contrast_ratio(CARD, seen) else CARD


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


# How large a figure's text is on the page. A figure reaches the page as an SVG (`show_as_svg`), whose size is the
# figure's in points (matplotlib writes width="<width_in * 72>pt"): a browser shows it at 96 CSS px per inch
# (CSS_PX_PER_IN; 1 pt = 4/3 px), whatever the figure's dpi, and draws its vectors at the screen's own resolution, so
# on a HiDPI screen its text is as sharp as the page's. The page shows it at that natural width, or scaled down to
# the content column when wider (`max-width: 100%`, book/_static/site.css). COLUMN_PX is that column as measured on
# the built site in a 1280-px-wide window (a laptop): the article is 752 px wide, less its 2 x 32 px padding and a
# figure's (or a cell output's) 2 x 8 px, so a wide figure is shown 672 px wide (7 in); tests/site/test_browser.py
# checks that no figure is shown narrower than this assumes. A figure whose smallest text lands under LEGIBLE_PX
# CSS pixels there is not legible; tests/test_viz_card.py holds every figure function of pylib.viz to it.
# The natural width is taken as the figure's width; the inline backend saves with bbox_inches="tight", which trims
# the empty margin (the text then shows larger than computed, when the figure is wider than the column) or grows to
# take in text outside the figure (smaller: keep text inside the figure). On a phone the column is about half as wide:
# see PHONE_COLUMN_PX below for how a figure stays legible there.
CSS_PX_PER_IN = 96
COLUMN_PX = 672
LEGIBLE_PX = 9.0


def smallest_text_px(fig, column_px: int = COLUMN_PX) -> float:
    """The smallest visible, non-empty text of `fig` in CSS pixels, shown as an SVG on a page whose content column
    is `column_px` wide (inf when the figure has no text)."""
    from matplotlib.text import Text

    scale = min(1.0, column_px / (fig.get_figwidth() * CSS_PX_PER_IN))
    sizes = [
        t.get_fontsize() * CSS_PX_PER_IN / 72 * scale
        for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip() and t.figure is fig
    ]
    return min(sizes, default=float("inf"))


def legible_pt(fig, pt: float) -> float:
    """`pt`, or the font size (points, 1% above the bound) whose text is LEGIBLE_PX high on the page once `fig` is
    scaled to the content column, whichever is larger: for a figure function that draws on a caller's axes and so
    does not choose the figure's width (`legible_pt(ax.figure, 7)` is 7 pt on a figure up to COLUMN_PX wide)."""
    scale = min(1.0, COLUMN_PX / (fig.get_figwidth() * CSS_PX_PER_IN))
    return max(pt, 1.01 * LEGIBLE_PX * 72 / (CSS_PX_PER_IN * scale))


# On a phone. The content column at 390 px (a phone held upright) is PHONE_COLUMN_PX wide for a figure (measured on the
# built site: 390 less 2 x 16 px of the article's padding and 2 x 8 of the figure's), about half COLUMN_PX, so a figure
# legible at COLUMN_PX is not, scaled down to it: its text landed at 4.7-8.6 px (36 of the 37 figures of pylib.viz).
# Reflowing every figure for a narrow screen would mean a second layout per figure, and a diagram's geometry (a
# timeline, a matrix of cells) is the argument; so instead a figure keeps, on a narrow screen, the width at which its
# smallest text is LEGIBLE_PX high (`legible_width_px`), and scrolls sideways in its own box when that is wider than
# the column: the reader swipes, as for a wide table, instead of pinching. show_as_svg writes that width into the
# output's metadata (`svg_with_phone_width`, only for a figure that needs it: wider than PHONE_COLUMN_PX); myst-nb
# turns it into the <img>'s `style="width: ...px"`, which book/_static/site.css keeps below 576 px (with the column
# as a minimum, and the figure's box scrolling) and overrides above, where the column is wide enough (at least 528
# px) for the natural width. tests/site/test_browser.py measures the text of every figure at 390 px from its SVG.
PHONE_COLUMN_PX = 342


def legible_width_px(fig, width_pt: float | None = None) -> float:
    """The narrowest width, in CSS px, at which `fig` shows its smallest visible text LEGIBLE_PX high (0 when it
    has no text: any width will do). width_pt: the width of the saved SVG in points (with bbox_inches="tight" it
    differs from the figure's; default: the figure's own). The SVG's text scales with its width: a fontsize-pt text of a
    width_pt-wide SVG shown w px wide is fontsize * w / width_pt px high."""
    if width_pt is None:
        width_pt = fig.get_figwidth() * 72
    natural = smallest_text_px(fig, column_px=float("inf"))  # every text at the SVG's natural size (4/3 px per pt)
    return width_pt * CSS_PX_PER_IN / 72 * LEGIBLE_PX / natural


def shown_text_px(fig, column_px: float, width_pt: float | None = None, phone_width: float | None = None) -> float:
    """The smallest text of `fig` in CSS px on a page whose content column is `column_px` wide: the SVG at its
    natural width or scaled down to the column, unless `phone_width` (the metadata show_as_svg writes) holds it at
    least that wide (site.css: the column as a minimum too), as on a narrow screen."""
    if width_pt is None:
        width_pt = fig.get_figwidth() * 72
    natural_px = width_pt * CSS_PX_PER_IN / 72
    shown = min(natural_px, column_px) if phone_width is None else max(phone_width, column_px)
    return smallest_text_px(fig, column_px=float("inf")) * shown / natural_px


def svg_with_phone_width(fig, **kwargs):
    """IPython's SVG of `fig` (`print_figure(fig, "svg", **kwargs)`): (data, {"width": px}) when the figure needs
    more than PHONE_COLUMN_PX to show its text LEGIBLE_PX high (`phone_metadata`), else the data alone; None for a
    figure with nothing drawn (IPython shows nothing then)."""
    from IPython.core.pylabtools import print_figure

    data = print_figure(fig, "svg", **kwargs)
    if data is None:
        return None
    metadata = phone_metadata(fig, data)
    return (data, metadata) if metadata else data


def phone_metadata(fig, svg: str) -> dict:
    """{"width": px} for the SVG `svg` of `fig` when its legible width exceeds PHONE_COLUMN_PX, else {}."""
    match = re.search(r'<svg[^>]*\swidth="([0-9.]+)pt"', svg)
    if match is None:
        raise ValueError("the SVG has no width in points on its <svg> element: not matplotlib's SVG backend?")
    need = legible_width_px(fig, float(match.group(1)))
    return {"width": math.ceil(need)} if need > PHONE_COLUMN_PX and math.isfinite(need) else {}


show_as_svg()


def rank_lanes(ax, rank_labels: list[str], lane_label: str, end_ms: float, title: str, bottom: float = 0.5) -> None:
    """A timeline panel's axes: per rank a compute row at 2r and a transfer lane at 2r + 0.9 (ticks labelled
    `rank_labels[r]` and `lane_label`), time from 0 to `end_ms`, `title` on the left (cp's ring, ep's overlap)."""
    n = len(rank_labels)
    ticks = [2 * r + d for r in range(n) for d in (0, 0.9)]
    ax.set_yticks(ticks, [lab for r in range(n) for lab in (rank_labels[r], lane_label)], fontsize=9)
    ax.set_ylim(2 * n - bottom, -0.6)
    ax.set_xlim(0, end_ms * 1.02)
    ax.set_title(title, fontsize=10, loc="left")
    ax.tick_params(axis="x", labelsize=9)


def finish_timeline(fig, axes, xlabel: str, title: str | None):
    """The last panel's time label, the figure's title (if any), a tight layout: the figure."""
    (axes.flat[-1] if hasattr(axes, "flat") else axes).set_xlabel(xlabel, fontsize=10)  # one Axes or an array
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
