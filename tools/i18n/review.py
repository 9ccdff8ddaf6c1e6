"""What the catalog checks say of one translated entry, and the tally they print: shared by the book's catalogs
(catalogs.py) and the labs' (pylib.labs.i18n), so an entry is judged the same way wherever it is."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import markup  # noqa: E402  (tools/i18n/markup.py)
import terms  # noqa: E402  (tools/i18n/terms.py)

KINDS = ("missing", "outdated", "markup", "term", "no catalog")  # each fault line starts with one of these


def faults(message, glossary) -> list[str]:
    """One entry's faults: untranslated ("missing"), fuzzy ("outdated"), a role, math, code span or link not
    carried over ("markup (...)"), a glossary term translated another way ("term (...)"), an old rendering the
    glossary retired ("term (retired rendering: ...)"), each with the start of its English. A line break inside
    inline math or a code span is a space to Markdown, and so to these checks."""
    short = message.id[:70].replace("\n", " ")
    if not message.string:
        return [f"missing: {short}"]
    if message.fuzzy:
        return [f"outdated: {short}"]
    english, chinese = message.id.replace("\n", " "), message.string.replace("\n", " ")
    senses = terms.other_senses(message.user_comments)
    return (
        [f"markup ({fault}): {short}" for fault in markup.differences(english, chinese)]
        + [f"term ({fault}): {short}" for fault in terms.violations(english, chinese, glossary, senses)]
        + [f"term (retired rendering: {fault}): {short}" for fault in terms.retired(english, chinese)]
    )


def tally(found: dict[str, list[str]], show: bool = True) -> int:
    """Print every fault (when `show`) and the count of each kind; 1 if there is any, else 0."""
    counts = dict.fromkeys(KINDS, 0)
    for name, lines in found.items():
        for line in lines:
            counts[next(k for k in KINDS if line.startswith(k))] += 1
            if show:
                print(f"{name}: {line}")
    print(", ".join(f"{v} {k}" for k, v in counts.items()))
    return 1 if any(counts.values()) else 0
