"""The chapters as a reader meets them: code that fits the page, no walls of code, no emoji check marks.

The book's page shows about 84 characters of code before it scrolls sideways (the theme's content column at
desktop width, in its monospace font), so every line of a code cell the reader can see or unfold fits in that.
A visible cell holds at most 30 lines: what a cell only formats goes into `pylib` (or a cell tagged
`hide-input`); the code that runs on the ranks stays on the page. What only checks, glues a number into the prose
or translates a message (an `assert`, `glue(`, `tr(`, `i18n`, `N_(`) runs in a cell the reader does not see
(`remove-cell`) or sees folded (`hide-input`): the checks run on every build, out of the argument's way. Results are
marked ✓ / ✗ (in every font) rather than the emoji ✅ / ❌ (empty boxes in a browser without an emoji font).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE_CODE_WIDTH = 84  # characters of code the page shows without scrolling
VISIBLE_CELL_LINES = 30
HIDING_TAGS = {"hide-input", "hide-cell", "remove-input", "remove-cell"}
REMOVED_TAGS = {"remove-input", "remove-cell"}
EMOJI_MARKS = re.compile("[\u2705\u274c\u274e\u2714\ufe0f]")
# A line of test harness rather than argument: a check, a glue into the prose, a translation call.
HARNESS = re.compile(r"^\s*assert\b|\bglue\(|\btr\(|\bi18n\b|\bN_\(")


def chapters() -> list[Path]:
    toc = (ROOT / "_toc.yml").read_text()
    names = re.findall(r"^root:\s*(\S+)", toc, re.M) + re.findall(r"file:\s*(\S+)", toc)
    return [ROOT / f"{name}.md" for name in names if (ROOT / f"{name}.md").exists()]


def code_cells(page: Path) -> list[tuple[int, set[str], list[str]]]:
    """(first line number, tags, code lines) of every ```{code-cell} of a MyST notebook."""
    lines = page.read_text().splitlines()
    cells, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```{code-cell}"):
            start, tags, body = i + 1, set(), []
            i += 1
            while i < len(lines) and lines[i].startswith(":"):  # the cell's options (:tags: [...])
                tags |= (
                    set(re.findall(r"[\w-]+", lines[i].split(":", 2)[2])) if lines[i].startswith(":tags:") else set()
                )
                i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            while body and not body[0].strip():
                body.pop(0)
            while body and not body[-1].strip():
                body.pop()
            cells.append((start, tags, body))
        i += 1
    return cells


PAGES = chapters()
IDS = [str(p.relative_to(ROOT)) for p in PAGES]


def test_the_toc_lists_chapters():
    assert len(PAGES) >= 15, IDS


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_code_lines_fit_the_page(page):
    long = [
        f"{page.name}:{start + k}: {len(line)} chars"
        for start, tags, body in code_cells(page)
        if not tags & REMOVED_TAGS
        for k, line in enumerate(body)
        if len(line) > PAGE_CODE_WIDTH
    ]
    assert not long, f"code lines wider than the page's {PAGE_CODE_WIDTH} characters:\n" + "\n".join(long)


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_no_visible_wall_of_code(page):
    walls = [
        f"{page.name}:{start}: {len(body)} lines"
        for start, tags, body in code_cells(page)
        if not tags & HIDING_TAGS and len(body) > VISIBLE_CELL_LINES
    ]
    assert not walls, f"visible code cells over {VISIBLE_CELL_LINES} lines:\n" + "\n".join(walls)


def visible_harness(page: Path) -> list[str]:
    """`page:line: code` for every line of a visible code cell that is harness (`HARNESS`)."""
    return [
        f"{page.name}:{start + k}: {line.strip()}"
        for start, tags, body in code_cells(page)
        if not tags & HIDING_TAGS
        for k, line in enumerate(body)
        if HARNESS.search(line)
    ]


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_no_visible_harness(page):
    hits = visible_harness(page)
    assert not hits, (
        "checks, glue or translation calls in visible code cells (move them into a cell tagged remove-cell, "
        "or hide-input where the reader needs the output):\n" + "\n".join(hits)
    )


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_no_emoji_check_marks(page):
    hits = [f"{page.name}:{n}" for n, line in enumerate(page.read_text().splitlines(), 1) if EMOJI_MARKS.search(line)]
    assert not hits, "emoji check marks (use ✓ / ✗):\n" + "\n".join(hits)


def test_no_emoji_check_marks_in_what_pylib_prints():
    hits = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "pylib").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if EMOJI_MARKS.search(line)
    ]
    assert not hits, "emoji check marks in pylib (use ✓ / ✗):\n" + "\n".join(hits)


def test_the_checker_sees_a_long_line_a_wall_and_a_hidden_cell(tmp_path):
    page = tmp_path / "p.md"
    wall = "\n".join(f"x{i} = {i}" for i in range(31))
    page.write_text(
        "```{code-cell} ipython3\n" + "y = 1" + " " * 90 + "\n```\n"
        "```{code-cell} ipython3\n" + wall + "\n```\n"
        "```{code-cell} ipython3\n:tags: [hide-input]\n\n" + wall + "\n```\n"
    )
    cells = code_cells(page)
    assert [len(body) for _, _, body in cells] == [1, 31, 31]
    assert [tags for _, tags, _ in cells] == [set(), set(), {"hide-input"}]
    assert len(cells[0][2][0]) > PAGE_CODE_WIDTH


def test_the_harness_check_sees_checks_glue_and_translations_only_where_visible(tmp_path):
    page = tmp_path / "p.md"
    harness = 'assert x == 1\nglue("x", x, display=False)\nprint(i18n.tr("x"))\nlabel = N_("x")\n'
    page.write_text(
        "```{code-cell} ipython3\ny = launch(f, 2)\n" + harness + "```\n"
        "```{code-cell} ipython3\n:tags: [remove-cell]\n\n" + harness + "```\n"
        "```{code-cell} ipython3\n:tags: [hide-input]\n\n" + harness + "```\n"
        "```{code-cell} ipython3\nassertion = glued = translate = 1  # names, not calls\n```\n"
    )
    assert [hit.split(": ", 1)[1] for hit in visible_harness(page)] == harness.splitlines()
