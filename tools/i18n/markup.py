"""What a translation must carry over unchanged from its English message: MyST roles' targets, inline math, code
spans and link targets. `differences(msgid, msgstr)` names each one that was lost, altered or added; a translation
may reorder them and translate a role's shown text ({ref}`text <label>`), never its label."""

from __future__ import annotations

import re
from collections import Counter

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


def differences(msgid: str, msgstr: str) -> list[str]:
    want, got = parts(msgid), parts(msgstr)
    faults = []
    for kind in want:
        lost = want[kind] - got[kind]
        added = got[kind] - want[kind]
        faults += [f"{kind} lost: {item}" for item in lost]
        faults += [f"{kind} added: {item}" for item in added]
    return faults
