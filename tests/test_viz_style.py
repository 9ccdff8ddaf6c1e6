"""The shared figure style: its colours keep their contrast on the figure's card and on a dark page, and figures
made under it render on the card."""

import io
import itertools
import re

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.image import imread  # noqa: E402

from pylib.viz import style  # noqa: E402


def test_contrast_ratio_is_wcag_black_on_white_21_and_same_colour_1():
    assert style.contrast_ratio("black", "white") == pytest.approx(21.0)
    assert style.contrast_ratio("#777777", "#777777") == pytest.approx(1.0)
    # WCAG's example: #777777 on white is just under the 4.5:1 of AA body text.
    assert style.contrast_ratio("#777777", "white") == pytest.approx(4.48, abs=0.01)


@pytest.mark.parametrize("color", style.PALETTE)
def test_palette_colour_reads_on_the_card_and_on_a_dark_page(color):
    assert style.contrast_ratio(color, style.CARD) >= 3.0, f"{color} on the card {style.CARD}"
    assert style.contrast_ratio(color, style.DARK_PAGE) >= 3.0, f"{color} on the dark page {style.DARK_PAGE}"


def test_text_reads_on_the_card_at_body_text_contrast():
    assert style.contrast_ratio(style.TEXT, style.CARD) >= 7.0
    assert style.contrast_ratio(style.MUTED, style.CARD) >= 3.0


def test_palette_colours_are_distinct():
    assert len(set(style.PALETTE)) == len(style.PALETTE)
    for a, b in itertools.combinations(style.PALETTE, 2):
        ra, rb = matplotlib.colors.to_rgb(a), matplotlib.colors.to_rgb(b)
        distance = sum((x - y) ** 2 for x, y in zip(ra, rb)) ** 0.5
        assert distance > 0.15, f"{a} and {b} are too close (RGB distance {distance:.2f})"


def test_use_styles_figures_inside_the_block_and_restores_rcparams_after():
    before = dict(matplotlib.rcParams)
    with style.use():
        fig, ax = plt.subplots()
        (line,) = ax.plot([0, 1], [1, 0])
        ax.set_xlabel("ranks")
    assert matplotlib.colors.to_hex(fig.get_facecolor()) == style.CARD
    assert matplotlib.colors.to_hex(line.get_color()) == style.PALETTE[0]
    assert matplotlib.colors.to_hex(ax.xaxis.label.get_color()) == style.TEXT
    assert dict(matplotlib.rcParams) == before
    plt.close(fig)


def test_figure_renders_opaque_on_the_card():
    with style.use():
        fig, ax = plt.subplots(figsize=(2, 1.5))
        ax.bar([0, 1], [1, 2])
        buf = io.BytesIO()
        # IPython's inline backend saves with the figure's own face colour (the SVG's, below, too).
        fig.savefig(buf, format="png", facecolor=fig.get_facecolor())
    plt.close(fig)
    buf.seek(0)
    pixels = imread(buf)
    corner = pixels[0, 0]
    assert corner[3] == pytest.approx(1.0), "the figure background must be opaque"
    assert matplotlib.colors.to_hex(corner[:3]) == style.CARD


def test_apply_sets_the_style_globally():
    with matplotlib.rc_context():
        style.apply()
        for key, value in style.RC.items():
            assert matplotlib.rcParams[key] == matplotlib.rcParams.validate[key](value), key


def test_semantic_colours_are_palette_colours_and_tell_apart_what_one_figure_shows_together():
    for name in ("FORWARD", "BACKWARD", "PARAMS", "GRADS", "OPTIM", "COMM", "WASTE"):
        assert getattr(style, name) in style.PALETTE, name
    timeline = [style.FORWARD, style.BACKWARD, style.COMM, style.WASTE]  # a pipeline timeline shows all four
    assert len(set(timeline)) == len(timeline)
    state = [style.PARAMS, style.GRADS, style.OPTIM]  # DP's memory bars stack all three
    assert len(set(state)) == len(state)
    assert style.GRADS == style.BACKWARD  # gradients are what backward makes
    assert style.contrast_ratio(style.REPLICATED, style.CARD) >= 3.0


def test_rank_colour_walks_the_palette_in_order_and_repeats():
    assert [style.rank_colour(r) for r in range(len(style.PALETTE))] == list(style.PALETTE)
    assert style.rank_colour(len(style.PALETTE) + 2) == style.PALETTE[2]


def test_tint_mixes_towards_the_card():
    assert style.tint(style.BLUE, 0.0) == style.BLUE
    assert style.tint(style.BLUE, 1.0) == style.CARD
    lighter = [style.relative_luminance(style.tint(style.BLUE, a)) for a in (0.0, 0.3, 0.6, 0.9)]
    assert lighter == sorted(lighter) and len(set(lighter)) == 4
    with pytest.raises(ValueError, match=r"tint amount must be in \[0, 1\], got 1.5"):
        style.tint(style.BLUE, 1.5)


@pytest.mark.parametrize("alpha", [1.0, 0.9, 0.8, 0.6, 0.35, 0.1])
@pytest.mark.parametrize("fill", style.PALETTE)
def test_text_on_a_palette_fill_reads_at_any_alpha(fill, alpha):
    seen = style.tint(fill, 1.0 - alpha)  # what the fill looks like over the card
    ink = style.ink_on(fill, alpha)
    assert ink in (style.INK, style.CARD)
    assert style.contrast_ratio(ink, seen) >= 4.0, f"{ink} on {fill} at alpha {alpha}"
    assert style.contrast_ratio(ink, seen) >= style.contrast_ratio(({style.INK, style.CARD} - {ink}).pop(), seen)


def test_ink_is_dark_but_not_black():
    assert style.contrast_ratio(style.INK, style.CARD) >= 12
    assert style.relative_luminance(style.INK) > 0


def test_subplots_styles_every_axes_and_keeps_ticks_made_later_in_the_text_colour():
    before = dict(matplotlib.rcParams)
    fig, (a, b) = style.subplots(1, 2, grid="y")
    assert dict(matplotlib.rcParams) == before
    assert fig.get_facecolor() == matplotlib.colors.to_rgba(style.CARD)
    for ax in (a, b):
        assert ax.get_facecolor() == matplotlib.colors.to_rgba(style.CARD)
        assert not ax.spines["top"].get_visible() and ax.spines["left"].get_visible()
        ax.set_xticks(range(12))  # new ticks, created outside the style's rc_context
        tick = ax.xaxis.get_major_ticks()[-1]
        assert matplotlib.colors.to_hex(tick.label1.get_color()) == style.TEXT
        assert ax.yaxis.get_gridlines()[0].get_visible() and not ax.xaxis.get_gridlines()[0].get_visible()
    plt.close(fig)


def test_figure_axes_styles_a_callers_axes_and_its_figure():
    fig, ax = plt.subplots()  # a chapter's own axes, made without the style
    got_fig, got_ax = style.figure_axes(ax, grid=False)
    assert (got_fig, got_ax) == (fig, ax)
    assert fig.get_facecolor() == ax.get_facecolor() == matplotlib.colors.to_rgba(style.CARD)
    assert not any(line.get_visible() for line in ax.get_xgridlines() + ax.get_ygridlines())
    new_fig, new_ax = style.figure_axes(figsize=(3, 2))
    assert tuple(new_fig.get_size_inches()) == (3, 2) and new_ax.figure is new_fig
    plt.close(fig)
    plt.close(new_fig)


def test_styled_runs_a_figure_function_under_the_style_and_keeps_its_signature():
    import inspect

    def draw(label: str, *, size: float = 1.0):
        fig, ax = plt.subplots()
        ax.text(0, 0, label)
        return fig

    wrapped = style.styled(draw)
    assert inspect.signature(wrapped) == inspect.signature(draw) and wrapped.__name__ == "draw"
    before = dict(matplotlib.rcParams)
    fig = wrapped("hi")
    assert dict(matplotlib.rcParams) == before
    assert matplotlib.colors.to_hex(fig.axes[0].texts[0].get_color()) == style.TEXT
    assert fig.get_facecolor() == matplotlib.colors.to_rgba(style.CARD)
    plt.close(fig)


def test_amber_is_a_fill_that_takes_ink():
    assert style.ink_on(style.AMBER) == style.INK
    assert style.contrast_ratio(style.INK, style.AMBER) >= 7.0


def test_legible_pt_keeps_small_text_legible_on_any_figure_width():
    import matplotlib.pyplot as plt

    for width_in in (3.0, style.COLUMN_PX / style.CSS_PX_PER_IN, 10.0, 16.0):
        fig = plt.figure(figsize=(width_in, 2), dpi=100)
        pt = style.legible_pt(fig, 7)
        fig.text(0.5, 0.5, "1/2", fontsize=pt)
        assert style.smallest_text_px(fig) >= style.LEGIBLE_PX
        if width_in * style.CSS_PX_PER_IN <= style.COLUMN_PX:
            assert pt == 7  # a figure shown at its natural width keeps the size asked for
        plt.close(fig)


def test_a_bold_chinese_text_draws_without_a_font_warning(caplog):
    """The CJK wheel has no bold face: a bold text in a Chinese figure is drawn in the regular one, and matplotlib
    says nothing in the page's output (it logged "Failed to find font weight bold" on every such figure)."""
    from pylib import i18n

    before = i18n.language()
    i18n.set_language("zh")
    try:
        with style.use(), caplog.at_level("WARNING", logger="matplotlib.font_manager"):
            fig, ax = plt.subplots()
            ax.set_title("专家 0", fontweight="bold")
            fig.canvas.draw()
            plt.close(fig)
    finally:
        i18n.set_language(before)
    assert not [r for r in caplog.records if "findfont" in r.getMessage() or "weight" in r.getMessage()]


def test_a_notebook_shows_figures_as_svg_with_text_as_paths_on_the_card():
    """Importing pylib.viz.style (every figure module does) makes a notebook show a figure as SVG only, the way the
    inline backend and myst-nb's glue format it: no PNG beside it, no <text> element (its glyphs are paths, so no
    font, CJK or other, has to reach the reader's browser), the figure's background the opaque card."""
    from IPython.core.formatters import format_display_data
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        style.show_as_svg()
        fig, ax = style.subplots(figsize=(3, 2))
        ax.set_title("rank 0")
        data, _ = format_display_data(fig)
        plt.close(fig)
    finally:
        InteractiveShell.clear_instance()
    assert shell is not None and "image/png" not in data, sorted(data)
    svg = data["image/svg+xml"]
    assert "<text" not in svg and re.search(r'<path id="DejaVuSans-\d+" d="', svg), "glyphs as paths"
    card = re.search(r'<g id="patch_1">\s*<path d="[^"]*"\s*style="([^"]*)"', svg)
    assert card and card[1].strip() == f"fill: {style.CARD}", card and card[1]


def test_an_svg_is_as_wide_as_its_figure_at_96_css_px_per_inch_whatever_its_dpi():
    """What smallest_text_px assumes: matplotlib writes an SVG's size in points (width_in * 72 pt, which a browser
    shows as width_in * 96 CSS px), not in pixels of the figure's dpi as a PNG."""
    for dpi in (72, 100, 200):
        fig = plt.figure(figsize=(5, 2), dpi=dpi)
        buf = io.StringIO()
        fig.savefig(buf, format="svg")
        plt.close(fig)
        width_pt = float(re.search(r'<svg[^>]*\swidth="([0-9.]+)pt"', buf.getvalue())[1])
        assert width_pt * 96 / 72 == pytest.approx(5 * style.CSS_PX_PER_IN), (dpi, width_pt)


def test_smallest_text_px_is_the_points_at_96_px_per_inch_scaled_down_to_the_column():
    narrow = plt.figure(figsize=(3, 2))  # 288 px: shown at its natural width
    narrow.text(0.1, 0.5, "a", fontsize=10)
    narrow.text(0.5, 0.5, "b", fontsize=12)
    narrow.text(0.8, 0.5, "", fontsize=4)  # empty: not text a reader sees
    assert style.smallest_text_px(narrow) == pytest.approx(10 * 96 / 72)
    wide = plt.figure(figsize=(2 * style.COLUMN_PX / style.CSS_PX_PER_IN, 2))  # twice the column: shown at half
    wide.text(0.5, 0.5, "c", fontsize=10)
    assert style.smallest_text_px(wide) == pytest.approx(10 * 96 / 72 / 2)
    assert style.smallest_text_px(wide, column_px=2 * style.COLUMN_PX) == pytest.approx(10 * 96 / 72)
    plt.close(narrow)
    plt.close(wide)
