"""The rows of the composition chapter's tables, formatted from what the runs hand over (records, specs, tables).

    spans([0, 1, 2, 3, 12, 13])                  # '0–3, 12–13'
    token_rows(coords, held, cp_parts, mbs, S)   # which tokens of the global batch each rank holds
    fold(name)                                   # one parameter name for every expert of a layer
    shard_axis_rows(specs, wanted)               # how one rank holds each parameter, one column per mesh axis
    reduction_rules(table_rows)                  # one entry per distinct way of completing a gradient
    axis_phase_summary(traffic)                  # "forward: all-reduce ×4; backward: ..." of one axis

Formatting only: the chapter asserts what the rows show, on the records themselves.
"""

from __future__ import annotations

from pylib.i18n import N_, tr

from .spec_text import shown_kind, shown_note

SHARD_COLUMNS = ("TP", "EP", "ETP", "PP", "DP")
_COLUMN_OF_AXIS = {"tp": "TP", "ep": "EP", "etp": "ETP", "pp": "PP", "dp-cp": "DP", "edp": "DP"}


def spans(positions) -> str:
    """Sorted ints as ranges: [0, 1, 2, 3, 12, 13] -> '0–3, 12–13'."""
    out, start = [], None
    for i, p in enumerate(positions):
        if start is None:
            start = p
        if i + 1 == len(positions) or positions[i + 1] != p + 1:
            out.append(f"{start}–{p}" if p > start else f"{start}")
            start = None
    return ", ".join(out)


def token_rows(coords, held, cp_parts, pieces, seq: int) -> list[list]:
    """One row per rank: [rank, "tp cp dp pp" coordinates, sequences, microbatches' sequences, positions of its CP rank,
    positions it holds, tokens]. held[r] / cp_parts[r]: [B/dp, S/(cp·tp)] / [B/dp, S/cp] token indices
    (sequence * seq + position); pieces[r]: the microbatches, the pieces of held[r] the schedule runs."""

    def seqs(t):
        return spans(sorted({int(x) // seq for x in t.flatten()}))

    def positions(t):
        return spans(sorted({int(x) % seq for x in t[0]}))

    return [
        [
            r,
            " ".join(str(c[a]) for a in ("tp", "cp", "dp", "pp")),
            seqs(held[r]),
            " / ".join(seqs(mb) for mb in pieces[r]),
            positions(cp_parts[r]),
            positions(held[r]),
            held[r].numel(),
        ]
        for r, c in enumerate(coords)
    ]


def fold(name: str) -> str:
    """layers.1.mlp.experts.experts.0.up_proj.weight and layers.1.mlp.experts.*.up_proj.weight -> one name,
    layers.1.mlp.experts.*.up_proj.weight."""
    parts = name.split(".")
    if "experts" in parts:
        i = parts.index("experts")
        rest = parts[i + 2 :] if parts[i + 1] == "experts" else parts[i + 1 :]
        rest = rest[1:] if rest and (rest[0].isdigit() or rest[0] == "*") else rest
        return ".".join(parts[:i] + ["experts", "*"] + rest)
    return name


def shard_cells(specs) -> dict[str, dict[str, str]]:
    """{folded parameter name: {column (SHARD_COLUMNS): how the axis holds it}} from a rank's shard specs: the
    kind, and full -> local shape where the axis cuts; the stage for PP; "whole expert" for ETP = 1 (in the
    reader's language: the chapter asserts on the specs, not on these texts)."""
    cells: dict[str, dict[str, str]] = {}
    for s in specs:
        cut = s.full_shape != s.local_shape
        kind = shown_kind(s.kind)
        text = f"{kind} {list(s.full_shape)}→{list(s.local_shape)}" if cut else kind
        if s.axis in ("pp", "etp") and not cut:
            text = shown_note(s.note)  # "stage 0 of 2", "whole expert (etp=1)"
        if s.axis == "edp":
            text = tr("{kind} over edp", kind=kind)
        cells.setdefault(fold(s.name), {})[_COLUMN_OF_AXIS[s.axis]] = text
    return cells


def shard_axis_rows(cells: dict, wanted: list[str]) -> list[list]:
    """[`name`, TP, EP, ETP, PP, DP] for each wanted (folded) name; "—" where the axis does nothing to it."""
    return [[f"`{n}`", *(cells[n].get(col, "—") for col in SHARD_COLUMNS)] for n in wanted]


FAMILY = {"row": "column"}  # a row shard is completed like a column shard
KIND = {
    "vocab": "vocab rows (TP)",
    "column": "column / row shard (TP)",
    "replicated": "replicated (SP)",
    "kv-replicated": "K/V head copies (TP)",
    "router": "replicated router",
    "expert": "expert (EP)",
}
_KIND_SHOWN = {
    "vocab": N_("vocab rows (TP)"),
    "column": N_("column / row shard (TP)"),
    "replicated": N_("replicated (SP)"),
    "kv-replicated": N_("K/V head copies (TP)"),
    "router": N_("replicated router"),
    "expert": N_("expert (EP)"),
}


def rule_key(name: str) -> str:
    """layers.3.mlp.experts.experts.0.up_proj.weight -> layers.*.mlp.experts.*.up_proj.weight"""
    parts = fold(name).split(".")
    if parts[0] == "layers":
        parts[1] = "*"
    return ".".join(parts)


def reduction_rules(table_rows: list[dict]) -> dict[tuple, list[str]]:
    """{(family, pre, dp_group, dp_size, scale): folded parameter names} over reduction-table rows (dicts):
    one entry per distinct way of completing a gradient."""
    rules: dict[tuple, list[str]] = {}
    for r in table_rows:
        family = FAMILY.get(r["kind"], r["kind"])
        names = rules.setdefault((family, r["pre"], r["dp_group"], r["dp_size"], r["scale"]), [])
        if rule_key(r["name"]) not in names:
            names.append(rule_key(r["name"]))
    return rules


def reduction_rule_rows(rules: dict, reason: dict[str, str]) -> list[list]:
    """[parameters, held as, then sum over, DP reduction over, scale, why] per rule of `reduction_rules`."""
    return [
        [", ".join(f"`{n}`" for n in names), tr(_KIND_SHOWN[family]), pre or "—", f"{group} ({size})", scale]
        + [reason[family]]
        for (family, pre, group, size, scale), names in rules.items()
    ]


def axis_phase_summary(traffic: dict) -> str:
    """One axis of a step's traced traffic (`train`'s record): its ops per phase, e.g.
    "forward: all-gather ×4, reduce-scatter ×4; backward: ..."."""
    return "; ".join(
        f"{ph}: " + ", ".join(f"{op.replace('_', '-')} ×{n}" for op, n in ops.items())
        for ph, ops in traffic["phases"].items()
    )
