"""The shared figure style: its colours keep their contrast on the figure's card and on a dark page, and figures
made under it render on the card."""

import io
import itertools

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


def test_figure_renders_opaque_on_the_card_as_the_inline_backend_saves_it():
    with style.use():
        fig, ax = plt.subplots(figsize=(2, 1.5))
        ax.bar([0, 1], [1, 2])
        buf = io.BytesIO()
        # IPython's inline backend saves with the figure's own face colour.
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
