"""The rows of the TP chapter's tables, formatted from what the runs hand over (specs, layouts, traces, sizes).

    shard_spec_rows(model.shard_specs())          # one row per parameter of layer 0 and the ends
    SPLIT_CONSEQUENCE                             # split kind -> what it means for the next operator
    head_layout_rows(8, (8, 4, 2, 1), (1, 2, 4, 8))   # the heads the last TP rank holds, from plan.head_layout
    trace_summary_rows(events)                    # a step's traced collectives, counted per (phase, op, where)
    korthikanti_rows(items, e)                    # the paper's saved tensors beside ours, with a total row

Each returns a list of rows (lists of cells) for `pylib.tables.markdown_table`; none computes a result the
chapter asserts: formatting only.
"""

from __future__ import annotations

import collections

from pylib.i18n import shown, tr
from pylib.plan.heads import head_layout

SPLIT_CONSEQUENCE = {  # seed B's rule, per kind of split
    "column": "output features split: the next op is per feature, nothing to add; the input enters by f",
    "row": "input (contracted) features split: outputs are partial sums, g all-reduces them",
    "vocab": "vocabulary split: lookups are partial (zeros elsewhere), rows all-reduced",
    "replicated": "whole on every rank: runs on the whole activation",
}

# The kinds (ShardSpec.kind, keys code compares) and their consequences as a table shows them.
_KINDS = {
    "column": lambda: tr("column"),
    "row": lambda: tr("row"),
    "vocab": lambda: tr("vocab"),
    "replicated": lambda: tr("replicated"),
}
_CONSEQUENCES = {
    "column": lambda: tr("output features split: the next op is per feature, nothing to add; the input enters by f"),
    "row": lambda: tr("input (contracted) features split: outputs are partial sums, g all-reduces them"),
    "vocab": lambda: tr("vocabulary split: lookups are partial (zeros elsewhere), rows all-reduced"),
    "replicated": lambda: tr("whole on every rank: runs on the whole activation"),
}


def split_kind(kind: str) -> str:
    """A ShardSpec kind ("column", "row", "vocab", "replicated", ...) in the reader's language."""
    return shown(_KINDS, kind)


def split_consequence_rows() -> list[list[str]]:
    """[kind, what it means for the next operator] per kind of SPLIT_CONSEQUENCE, in the reader's language."""
    return [[split_kind(k), _CONSEQUENCES[k]()] for k in SPLIT_CONSEQUENCE]


def shard_spec_rows(specs, skip_prefix: str = "layers.1") -> list[list]:
    """[parameter, split, full [out, in], rank holds, torch dim cut, share] per spec (skipping `skip_prefix`,
    a layer laid out as an earlier one)."""
    return [
        [
            f"`{s.name}`",
            split_kind(s.kind),
            list(s.full_shape),
            list(s.local_shape),
            "—" if s.dim is None else s.dim,
            f"{s.fraction:g}",
        ]
        for s in specs
        if not s.name.startswith(skip_prefix)
    ]


def _heads(first: int, count: int) -> str:
    return f"{first}" if count == 1 else f"{first}–{first + count - 1}"


def head_layout_rows(n_head: int, kv_heads, tps) -> list[list]:
    """One row per n_kv_head, one cell per t: the query and K/V heads of the last rank of the TP group, and
    whether its K/V heads are split or copied (copy ×k: k ranks hold the same K/V head)."""
    rows = []
    for n_kv in kv_heads:
        kind = "MHA" if n_kv == n_head else "MQA" if n_kv == 1 else "GQA"
        row = [f"{n_kv} ({kind})"]
        for t in tps:
            lay = head_layout(n_head, n_kv, t, t - 1)
            how = tr("split") if lay.kv_replicas == 1 else tr("copy ×{k}", k=lay.kv_replicas)
            q, kv = _heads(lay.q_first, lay.q_count), _heads(lay.kv_first, lay.kv_count)
            row.append(f"Q {q}, K/V {kv} ({how})")
        rows.append(row)
    return rows


def trace_summary_rows(events) -> list[list]:
    """events: (phase, op, where, payload bytes, bytes sent) tuples. One row per (phase, op, where, payload) with
    its count; a layer's `where` (layers.3.attn) is shortened to its part (attn)."""
    count = collections.Counter(
        (p, op, w.split(".")[-1] if w.startswith("layers") else w, pl) for p, op, w, pl, _ in events
    )
    return [[p, op, w, pl, n] for (p, op, w, pl), n in count.items()]


# `compare_with_korthikanti`'s item and relation keys as a table shows them (the keys stay: code compares them)
_SAVED_ITEMS = {
    "LayerNorm inputs (LN1, LN2)": lambda: tr("LayerNorm inputs (LN1, LN2)"),
    "LayerNorm mean and 1/std": lambda: tr("LayerNorm mean and 1/std"),
    "QKV input (LN1 output)": lambda: tr("QKV input (LN1 output)"),
    "MLP input (LN2 output)": lambda: tr("MLP input (LN2 output)"),
    "Q and K": lambda: tr("Q and K"),
    "softmax output": lambda: tr("softmax output"),
    "softmax dropout mask": lambda: tr("softmax dropout mask"),
    "attention probabilities after dropout": lambda: tr("attention probabilities after dropout"),
    "causal mask": lambda: tr("causal mask"),
    "RoPE cos and sin": lambda: tr("RoPE cos and sin"),
    "W_O input (attention output)": lambda: tr("W_O input (attention output)"),
    "attention residual dropout mask": lambda: tr("attention residual dropout mask"),
    "MLP hidden": lambda: tr("MLP hidden"),
    "MLP residual dropout mask": lambda: tr("MLP residual dropout mask"),
}
_RELATIONS = {
    "same": lambda: tr("same"),
    "different": lambda: tr("different"),
    "paper only": lambda: tr("paper only"),
    "ours only": lambda: tr("ours only"),
}


def korthikanti_row(r, e: int) -> list:
    """One `compare_with_korthikanti` row as shown: [saved tensor, paper × e/2 (B), ours (B), relation, why]."""
    item = _SAVED_ITEMS.get(r.item, lambda: r.item)()  # "V": the same in both languages
    return [item, f"{r.paper_bytes * e / 2:.0f}", r.ours_bytes, _RELATIONS[r.relation](), r.why]


def korthikanti_rows(items, e: int) -> list[list]:
    """items: `pylib.analysis.tp.compare_with_korthikanti` rows. [saved tensor, paper × e/2 (B), ours (B),
    relation, why] for every item either side counts, then a total row (the paper counts 2-byte elements)."""
    rows = [korthikanti_row(r, e) for r in items if r.paper_bytes or r.ours_bytes]
    paper = sum(r.paper_bytes for r in items) * e / 2
    rows.append([tr("**total**"), f"{paper:.0f}", sum(r.ours_bytes for r in items), "", ""])
    return rows
