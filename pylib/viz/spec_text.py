"""A ShardSpec's kind and note as a table shows them, in the reader's language (the spec keeps the English: code
compares kinds, and tests read notes).

    shown_kind("replicated")                   # English: "replicated"; Chinese: "复制"
    shown_note("virtual stage 0 of 2")         # "stage 0 of 2" / "stage 0（共 2 个）"
"""

from __future__ import annotations

import re

from pylib.i18n import N_, shown, tr

# ShardSpec kinds (keys code compares) as a table shows them
_KINDS = frozenset({N_("column"), N_("row"), N_("vocab"), N_("replicated"), N_("expert")})
_VIRTUAL_STAGE = re.compile(r"virtual stage (\d+) of (\d+)")
_EXPERTS_HELD = re.compile(r"experts (\d+)\.\.(\d+) of (\d+) on ep rank (\d+)")  # pylib.ep.layer's notes
_FFN_SLICE = re.compile(r"h_ffn slice (\d+) of (\d+)")
_CP_CHUNKS = re.compile(r"rank (\d+) holds (chunks?) (.+) of (\d+)")  # pylib.cp.layout's notes


def shown_kind(kind: str) -> str:
    """A ShardSpec kind in the reader's language (a kind without an entry stays as it is)."""
    return shown(_KINDS, kind)


def shown_note(note: str) -> str:
    """A spec's note as a table shows it, in the reader's language: "stage 0 of 2" (from "virtual stage 0 of 2"),
    "whole expert (etp=1)", the router's; any other note as it is."""
    m = _VIRTUAL_STAGE.fullmatch(note)
    if m:
        return tr("stage {stage} of {n}", stage=int(m[1]), n=int(m[2]))
    m = _EXPERTS_HELD.fullmatch(note)
    if m:
        return tr("experts {first}..{last} of {n} on ep rank {r}", first=m[1], last=m[2], n=m[3], r=m[4])
    m = _FFN_SLICE.fullmatch(note)
    if m:
        return tr("h_ffn slice {r} of {etp}", r=m[1], etp=m[2])
    m = _CP_CHUNKS.fullmatch(note)
    if m:
        if m[2] == "chunk":
            return tr("rank {r} holds chunk {held} of {n}", r=m[1], held=m[3], n=m[4])
        return tr("rank {r} holds chunks {held} of {n}", r=m[1], held=m[3], n=m[4])
    notes = frozenset(
        {N_("whole expert (etp=1)"), N_("each rank routes its own tokens"), N_("gradient all-reduced over cp")}
    )
    return shown(notes, note)
