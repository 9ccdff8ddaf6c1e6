"""A figure on a phone: the width show_as_svg writes into a figure's output (pylib.viz.style.PHONE_COLUMN_PX) holds
its smallest text at LEGIBLE_PX or more on a 390-px screen, and every figure of pylib.viz gets what it needs."""

import io
import math
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from pylib.viz import style  # noqa: E402


def _svg(fig) -> tuple[str, float]:
    """The SVG the notebook shows (bbox_inches="tight", as the inline backend saves) and its width in points."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    svg = buf.getvalue()
    return svg, float(re.search(r'<svg[^>]*\swidth="([0-9.]+)pt"', svg)[1])


def test_legible_width_is_the_width_at_which_the_smallest_text_is_legible_px():
    fig = plt.figure(figsize=(8, 2))  # 768 px natural
    fig.text(0.1, 0.5, "small", fontsize=6)  # 8 px at natural size
    fig.text(0.5, 0.5, "large", fontsize=12)
    fig.text(0.8, 0.5, "", fontsize=2)  # empty: not text a reader sees
    assert style.legible_width_px(fig) == pytest.approx(768 * style.LEGIBLE_PX / 8)  # 864: wider than natural
    assert style.legible_width_px(fig, width_pt=300) == pytest.approx(300 * 4 / 3 * style.LEGIBLE_PX / 8)
    plt.close(fig)
    assert style.legible_width_px(plt.figure(figsize=(2, 2))) == 0  # no text: any width will do
    plt.close("all")


def test_a_wide_figure_gets_a_phone_width_and_is_legible_at_390_px_with_it_and_not_without():
    fig, ax = style.subplots(figsize=(7, 3))
    ax.plot([0, 1], [0, 1])
    ax.set_title("7 pt", fontsize=7.5)
    ax.tick_params(labelsize=7.5)
    svg, width_pt = _svg(fig)
    md = style.phone_metadata(fig, svg)
    assert md["width"] == math.ceil(width_pt * 4 / 3 * style.LEGIBLE_PX / (7.5 * 4 / 3))
    assert md["width"] > style.PHONE_COLUMN_PX
    before = style.shown_text_px(fig, style.PHONE_COLUMN_PX, width_pt)
    after = style.shown_text_px(fig, style.PHONE_COLUMN_PX, width_pt, md["width"])
    assert before < style.LEGIBLE_PX <= after < 1.02 * style.LEGIBLE_PX, (before, after)
    # at the laptop's column nothing changes: the site shows the natural width, scaled down to COLUMN_PX
    assert style.shown_text_px(fig, style.COLUMN_PX, width_pt) == pytest.approx(
        7.5 * 4 / 3 * min(1, style.COLUMN_PX / (width_pt * 4 / 3))
    )
    plt.close(fig)


def test_a_figure_legible_in_the_phone_column_gets_no_width():
    fig, ax = style.subplots(figsize=(3.5, 2.5))  # 336 px: fits the phone column at its natural size
    ax.plot([0, 1], [0, 1])
    svg, width_pt = _svg(fig)
    assert style.phone_metadata(fig, svg) == {}
    assert style.shown_text_px(fig, style.PHONE_COLUMN_PX, width_pt) >= style.LEGIBLE_PX
    plt.close(fig)


def test_phone_metadata_names_an_svg_without_a_width():
    fig = plt.figure()
    with pytest.raises(ValueError, match="no width in points"):
        style.phone_metadata(fig, "<svg viewBox='0 0 1 1'></svg>")
    plt.close(fig)


def test_the_notebook_formatter_puts_the_phone_width_in_the_outputs_metadata():
    """What myst-nb reads (the output's metadata for image/svg+xml, `width`), through the formatter show_as_svg
    installs, the same one glue uses."""
    from IPython.core.formatters import format_display_data
    from IPython.core.interactiveshell import InteractiveShell

    InteractiveShell.instance()
    try:
        style.show_as_svg()
        wide, ax = style.subplots(figsize=(9, 3))
        ax.tick_params(labelsize=7)
        data, md = format_display_data(wide)
        narrow, _ = style.subplots(figsize=(3, 2))
        _, md_narrow = format_display_data(narrow)
        plt.close("all")
    finally:
        InteractiveShell.clear_instance()
    assert md["image/svg+xml"] == style.phone_metadata(wide, data["image/svg+xml"])
    assert md["image/svg+xml"]["width"] > style.PHONE_COLUMN_PX
    assert "image/svg+xml" not in md_narrow
