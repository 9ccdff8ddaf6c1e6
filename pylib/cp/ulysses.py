"""Ulysses (DeepSpeed-Ulysses) context parallelism: trade the sequence split for a head split, attend, trade back.

Every rank holds its sequence shard of q [b, n_head, s/cp, d_head] and k, v [b, n_kv_head, s/cp, d_head].

    all-to-all  q, k, v: scatter heads, gather sequence  -> [b, n_head/cp, s, d_head], [b, n_kv_head/cp, s, d_head]
    attention   over the whole sequence for my n_head/cp heads (any single-device kernel)
    all-to-all  out: scatter sequence, gather heads      -> [b, n_head, s/cp, d_head]

Four all-to-alls forward (q, k, v in; out back), each moving (cp-1)/cp of a local tensor, and four backward
(their conjugates: dout in; dq, dk, dv back). Unlike the ring, the traffic per rank does not grow with cp for a
fixed per-rank sequence, but cp can be at most the number of K/V heads: each rank must hold whole heads.

After the all-to-all the sequence arrives in the order of the ranks' shards (`layout_order`); for the zig-zag
layout with a causal mask it is permuted to token order for the kernel and back afterwards.
"""

from __future__ import annotations

import torch

from pylib.plan.options import CP_LAYOUT
from pylib.plan.problems import check_heads
from pylib.runtime import collectives as C
from pylib.runtime import tracer

from .kernels import default_scale, kernel_attention
from .layout import layout_order
from .ring import check_qkv, cp_group


def ulysses_attention(
    q,
    k,
    v,
    *,
    group=None,
    causal: bool = False,
    layout: str = CP_LAYOUT,
    kernel="auto",
) -> torch.Tensor:
    """Attention of this rank's sequence shard via two head <-> sequence all-to-alls.

    q [b, n_head, s/cp, d_head]; k, v [b, n_kv_head, s/cp, d_head], this rank's shard in `layout`. Returns
    out [b, n_head, s/cp, d_head] for the same rows. Autograd-aware (the all-to-alls' conjugates in backward).
    """
    g = cp_group(group)
    check_qkv(q, k, v, g.size, layout, "ulysses_attention")
    check_heads(q.shape[1], k.shape[1], g.size)
    scale = default_scale(q.shape[-1])
    base = tracer.current_tag()
    name = f"{base}.ulysses" if base else "ulysses"
    # sequence-sharded -> head-sharded: scatter dim 1 (heads), gather dim 2 (sequence)
    qh = C.all_to_all(q, 1, 2, g, tag=f"{name}.q")
    kh = C.all_to_all(k, 1, 2, g, tag=f"{name}.k")
    vh = C.all_to_all(v, 1, 2, g, tag=f"{name}.v")
    reorder = causal and layout == "zigzag" and g.size > 1
    if reorder:  # the gathered rows are in the ranks' shard order; the causal kernel wants token order
        order = layout_order(qh.shape[2], g.size, layout, device=q.device)  # position of each gathered row
        to_tokens = torch.argsort(order)
        qh, kh, vh = (x.index_select(2, to_tokens) for x in (qh, kh, vh))
    oh = kernel_attention(qh, kh, vh, causal=causal, scale=scale, kernel=kernel)  # [b, n_head/cp, s, d_head]
    if reorder:
        oh = oh.index_select(2, order)
    return C.all_to_all(oh, 2, 1, g, tag=f"{name}.out")  # head-sharded -> sequence-sharded
