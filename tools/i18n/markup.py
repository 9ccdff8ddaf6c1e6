"""What a translation must carry over unchanged from its English message: MyST roles' targets, inline math, code
spans and link targets. `differences(msgid, msgstr)` names each one that was lost, altered or added; a translation
may reorder them and translate a role's shown text ({ref}`text <label>`), never its label. A bold or italic marker
must not come out as a literal asterisk (CommonMark's flanking rules make `**注意：**中文` one)."""

from __future__ import annotations

import re
from collections import Counter
from functools import cache

from markdown_it import MarkdownIt

ROLE = re.compile(r"\{([\w:-]+)\}`([^`]*)`")
MATH = re.compile(r"(?<![\\$])\$([^$\n]+?)\$(?!\$)")
CODE = re.compile(r"(?<![`{}])`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
TEXT_ROLES = {"ref", "numref", "doc", "download", "term", "abbr"}  # roles whose shown text may be translated


def _role_targets(text: str) -> Counter:
    found = Counter()
    for role, body in ROLE.findall(text):
        if role in TEXT_ROLES:
            label = re.search(r"<([^<>]+)>\s*$", body)
            body = label.group(1) if label else body
        found[(role, body.strip())] += 1
    return found


def _without_roles(text: str) -> str:
    return ROLE.sub(" ", text)


def parts(text: str) -> dict[str, Counter]:
    bare = _without_roles(text)
    return {
        "role": _role_targets(text),
        "math": Counter(m.strip() for m in MATH.findall(bare)),
        "code": Counter(CODE.findall(bare)),
        "link": Counter(LINK.findall(bare)),
    }


@cache
def _markdown() -> MarkdownIt:
    return MarkdownIt("commonmark")


def stray_asterisks(text: str) -> int:
    """Asterisks CommonMark leaves as text (outside code and math): a `**` or `*` that failed to open or close, as
    `**注意：**中文` does (Chinese punctuation just inside the marker, a letter just outside it)."""
    count = 0
    for token in _markdown().parseInline(MATH.sub("x", text)):  # math as a letter, as MyST sees it
        for child in token.children or []:
            if child.type == "text":
                count += child.content.count("*")
    return count


def differences(msgid: str, msgstr: str) -> list[str]:
    want, got = parts(msgid), parts(msgstr)
    faults = []
    if stray_asterisks(msgstr) > stray_asterisks(msgid):
        faults.append("emphasis: a ** or * that CommonMark shows as literal asterisks")
    for kind in want:
        lost = want[kind] - got[kind]
        added = got[kind] - want[kind]
        faults += [f"{kind} lost: {item}" for item in lost]
        faults += [f"{kind} added: {item}" for item in added]
    return faults
