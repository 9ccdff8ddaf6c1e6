"""Padding for text tables whose cells may hold Chinese: a CJK character takes two columns of a monospace font.

`str.ljust` and `str.rjust` count characters, so a header such as 专家数 (3 characters, 6 columns) would push every
column after it out of line in the Chinese edition. These count display columns instead (Unicode's East Asian
Width: Wide and Fullwidth characters take 2), and are `str.ljust` / `str.rjust` exactly for text without them, so
the English tables are unchanged.
"""

from __future__ import annotations

import unicodedata


def width(text: str) -> int:
    """The columns `text` takes in a monospace font: 2 for each wide or fullwidth character, 0 for a combining
    mark, 1 for the rest."""
    total = 0
    for ch in text:
        if unicodedata.combining(ch):
            continue
        total += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return total


def ljust(text: str, columns: int) -> str:
    """`text` padded on the right with spaces to `columns` display columns (unchanged when it is wider)."""
    return text + " " * max(0, columns - width(text))


def rjust(text: str, columns: int) -> str:
    """`text` padded on the left with spaces to `columns` display columns (unchanged when it is wider)."""
    return " " * max(0, columns - width(text)) + text
