"""The rows of the TP chapter's tables, formatted from what the runs hand over (specs, layouts, traces, sizes).

    shard_spec_rows(model.shard_specs())          # one row per parameter of layer 0 and the ends
    SPLIT_KINDS                                   # the kinds of split a TP model's ShardSpecs have
    head_layout_rows(8, (8, 4, 2, 1), (1, 2, 4, 8))   # the heads the last TP rank holds, from plan.head_layout
    trace_summary_rows(events)                    # a step's traced collectives, counted per (phase, op, where)
    korthikanti_rows(items, e)                    # the paper's saved tensors beside ours, with a total row

Each returns a list of rows (lists of cells) for `pylib.tables.markdown_table`; none computes a result the
chapter asserts: formatting only.
"""

from __future__ import annotations

import collections

from pylib.i18n import N_, shown, tr
from pylib.plan.heads import head_layout

SPLIT_KINDS = ("column", "row", "vocab", "replicated")  # ShardSpec.kind of a TP model's parameters (tbl-tp-split-kinds)

# The kinds (keys code compares) as a table shows them.
_KINDS = frozenset({N_("column"), N_("row"), N_("vocab"), N_("replicated")})


def split_kind(kind: str) -> str:
    """A ShardSpec kind ("column", "row", "vocab", "replicated", ...) in the reader's language."""
    return shown(_KINDS, kind)


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
_SAVED_ITEMS = frozenset(
    {
        N_("LayerNorm inputs (LN1, LN2)"),
        N_("LayerNorm mean and 1/std"),
        N_("QKV input (LN1 output)"),
        N_("MLP input (LN2 output)"),
        N_("Q and K"),
        N_("softmax output"),
        N_("softmax dropout mask"),
        N_("attention probabilities after dropout"),
        N_("causal mask"),
        N_("RoPE cos and sin"),
        N_("W_O input (attention output)"),
        N_("attention residual dropout mask"),
        N_("MLP hidden"),
        N_("MLP residual dropout mask"),
    }
)
_RELATIONS = frozenset({N_("same"), N_("different"), N_("paper only"), N_("ours only")})


def korthikanti_row(r, e: int) -> list:
    """One `compare_with_korthikanti` row as shown: [saved tensor, paper × e/2 (B), ours (B), relation, why]."""
    item = shown(_SAVED_ITEMS, r.item)  # "V": the same in both languages
    return [item, f"{r.paper_bytes * e / 2:.0f}", r.ours_bytes, shown(_RELATIONS, r.relation), r.why]


def korthikanti_rows(items, e: int) -> list[list]:
    """items: `pylib.analysis.tp.compare_with_korthikanti` rows. [saved tensor, paper × e/2 (B), ours (B),
    relation, why] for every item either side counts, then a total row (the paper counts 2-byte elements)."""
    rows = [korthikanti_row(r, e) for r in items if r.paper_bytes or r.ours_bytes]
    paper = sum(r.paper_bytes for r in items) * e / 2
    rows.append([tr("**total**"), f"{paper:.0f}", sum(r.ours_bytes for r in items), "", ""])
    return rows
