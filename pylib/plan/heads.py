"""Which attention heads a tensor-parallel rank holds: query heads split n_head / tp, K/V heads split or replicated.

GQA (n_kv_head < n_head; query head i reads K/V head i // (n_head / n_kv_head)):
  * tp divides n_kv_head: split the K/V heads too; rank r holds K/V heads [r*n_kv/tp, (r+1)*n_kv/tp), exactly
    those its query heads read.
  * n_kv_head divides tp (tp > n_kv_head): every rank's query heads fall in one K/V group, so rank r holds that
    one K/V head, j = r // (tp / n_kv_head), and tp / n_kv_head ranks hold a copy of it.
  * otherwise some rank's query heads would need K/V heads held by two ranks: refused.

Pure arithmetic (`pylib.tp.TPAttention` shards by it; `pylib.analysis` predicts shapes and traffic with it).
"""

from __future__ import annotations

from dataclasses import dataclass

from pylib.i18n import tr


@dataclass(frozen=True)
class HeadLayout:
    """Which heads one TP rank holds."""

    q_first: int
    q_count: int
    kv_first: int
    kv_count: int
    kv_replicas: int  # how many TP ranks hold each of this rank's K/V heads (1 = split, >1 = replicated)


def kv_group_problem(n_head: int, n_kv_head: int) -> str | None:
    """GQA's rule, as a sentence when it fails: query head i reads K/V head i // (n_head / n_kv_head), so n_kv_head
    must divide n_head (None when it does). The config, the reference attention and the CP kernels all ask it."""
    if n_kv_head < 1 or n_head % n_kv_head:
        return f"n_kv_head={n_kv_head} does not divide n_head={n_head}"
    return None


def head_layout(n_head: int, n_kv_head: int, tp: int, rank: int) -> HeadLayout:
    """The query and K/V heads TP rank `rank` of `tp` holds; raises naming the constraint when none works."""
    if tp < 1 or n_head % tp:
        raise ValueError(tr("tp={tp} does not divide n_heads={n}", tp=tp, n=n_head))
    q_count = n_head // tp
    if n_kv_head % tp == 0:
        kv_count = n_kv_head // tp
        return HeadLayout(rank * q_count, q_count, rank * kv_count, kv_count, 1)
    if tp % n_kv_head == 0:
        replicas = tp // n_kv_head
        return HeadLayout(rank * q_count, q_count, rank // replicas, 1, replicas)
    raise ValueError(
        tr(
            "tp={tp} does not divide n_kv_heads={n}, and n_kv_heads={n} does not divide tp={tp}: "
            "some rank's query heads would read K/V heads held by two ranks",
            tp=tp,
            n=n_kv_head,
        )
    )


def kv_heads_per_rank(n_head: int, n_kv_head: int, tp: int) -> tuple[int, int]:
    """(K/V heads a TP rank holds, how many TP ranks hold each of them): `head_layout`'s kv_count, kv_replicas."""
    lay = head_layout(n_head, n_kv_head, tp, 0)
    return lay.kv_count, lay.kv_replicas
