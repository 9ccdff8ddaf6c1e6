"""Tables as text: a labelled MyST table a chapter cell prints, article A's labelled matrix rows, plain-text and HTML
tables for the explorers, and the byte and shape formats they share. The figures (`pylib.viz`) and the seed checks
(`pylib.seedcheck`) both print with these, so this module sits below both and imports only `pylib.i18n`.

    markdown_table(header, rows, caption=, name=)    # a MyST {table} with a caption and a label
    format_rows(matrix, row_labels, col_labels)      # a matrix printed the way article A prints its numbers
    text_table(header, rows) / html_table(header, rows)
    fmt_bytes(n)  fmt_shape(shape)                   # "1.5 GB" (decimal units, as article B); "[2, 4, 16]"
"""

from __future__ import annotations

import html

from pylib.i18n import columns


def markdown_table(header: list[str], rows: list[list], caption: str, name: str, align: str = "center") -> str:
    """A MyST `{table}` with a caption and a label, for a cell whose Markdown output is rendered as MyST."""

    def cell(v):
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = [f":::{{table}} {caption}", f":name: {name}", f":align: {align}", ""]
    lines.append("| " + " | ".join(cell(h) for h in header) + " |")
    lines.append("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a row has {len(row)} cells, the header {len(header)}: {row}")
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    lines.append(":::")
    return "\n".join(lines)


def format_rows(matrix, row_labels: list[str], col_labels: list[str] | None = None, decimals: int = 3) -> str:
    """A matrix printed the way article A prints its numbers: one labelled row per token, fixed decimals.

    >>> print(format_rows([[0.5, -1.25]], ["cat"], ["d1", "d2"], decimals=2))
            d1     d2
    cat [ 0.50, -1.25]
    """
    cells = [[f"{v:.{decimals}f}" for v in row] for row in _rows(matrix, len(row_labels))]
    width = max(columns.width(c) for row in cells for c in row)
    pad = max(columns.width(r) for r in row_labels)
    lines = []
    if col_labels is not None:
        lines.append(" " * (pad + 2) + "  ".join(columns.rjust(c, width) for c in col_labels))
    for label, row in zip(row_labels, cells):
        lines.append(f"{columns.ljust(label, pad)} [" + ", ".join(columns.rjust(c, width) for c in row) + "]")
    return "\n".join(lines)


def _rows(matrix, n_rows: int) -> list[list[float]]:
    """A 1-D or 2-D matrix (nested lists, or anything with `.tolist()`: a tensor, an array) as rows of floats."""
    m = matrix.tolist() if hasattr(matrix, "tolist") else [r.tolist() if hasattr(r, "tolist") else r for r in matrix]
    if m and not isinstance(m[0], (list, tuple)):
        m = [m]
    try:
        rows = [[float(v) for v in row] for row in m]
    except TypeError:
        rows = None
    if rows is None or len(rows) != n_rows:
        raise ValueError(f"need a [rows, cols] matrix with {n_rows} rows, got {matrix!r:.80}")
    return rows


def fmt_shape(shape) -> str:
    return "—" if shape is None else "[" + ", ".join(str(v) for v in shape) + "]"


def fmt_bytes(n: float) -> str:
    """Decimal units, as article B writes them (MB, GB)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def text_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a plain-text table: the header, then one per row, each column padded to its widest cell."""
    width = columns.width
    widths = [max(width(h), *(width(r[i]) for r in rows)) if rows else width(h) for i, h in enumerate(header)]
    return ["  ".join(columns.ljust(c, w) for c, w in zip(r, widths)) for r in [header, *rows]]


def html_table(header: list[str], rows: list[list[str]]) -> str:
    """An HTML table of strings (escaped), left-aligned headers, without TeX (the explorers' widgets show it)."""
    th = "".join(f"<th style='text-align:left;padding:2px 8px'>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td style='padding:2px 8px'>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"
