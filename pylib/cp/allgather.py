"""All-gather context parallelism (Llama 3: Grattafiori et al. 2024, section 3.3.2): every rank gathers the whole
sequence's K and V once, then attends its own queries to the keys before them.

Rank r holds q [b, n_head, s/cp, d_head] and k, v [b, n_kv_head, s/cp, d_head] for its own tokens:

    all-gather  K and V (one message, [2, b, n_kv_head, s/cp, d_head])  -> [2, b, n_kv_head, s, d_head]
                through `collectives.all_gather`, whose backward is the reduce-scatter of dK, dV
    attention   each of my query chunks against the keys at or before its positions (`allgather_block_plan`),
                the blocks of a chunk merged with the log-sum-exp (`pylib.cp.merge`)

GQA: only the n_kv_head K/V heads are gathered; each rank expands them for its query heads in the kernel. Per rank,
forward sends (cp-1) shards of K and V -- the ring's forward total, in one collective -- and backward reduce-scatters
dK, dV: (cp-1) shards again, in the input dtype (`pylib.analysis.cp.allgather_traffic`). The price is memory: the
gathered K/V, 2 b n_kv_head s d_head elements, is held (and kept for backward) whatever cp is, where the ring holds
two blocks of s/cp; and the gather is exposed (attention cannot start before it ends), where the ring hides each
step's transfer behind the previous block.

Causal balance is the zig-zag layout's (Llama 3: "we split the input sequence into 2 x CP chunks and assign rank i
chunks i and 2 x CP - 1 - i"): a chunk i of c tokens attends i c keys in full and a causal c x c diagonal block, so
rank r evaluates (r + 1) + (2 cp - r) = 2 cp + 1 blocks of c x c, the same on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pylib.plan.options import CP_LAYOUT
from pylib.runtime import collectives as C
from pylib.runtime import tracer

from .kernels import accumulation_dtype, default_scale, select_kernel
from .layout import check_layout, layout_chunks, layout_order, n_chunks
from .merge import merge_block
from .ring import ScoreBlock, check_qkv, cp_group


@dataclass(frozen=True)
class GatherBlock(ScoreBlock):
    """One kernel call of all-gather attention: local query rows `q_rows` against rows `kv_rows` of the gathered
    K/V in token order, with a causal mask inside the block (then square, on the diagonal) or none."""

    q_rows: slice
    kv_rows: slice
    causal: bool


def allgather_block_plan(cp_rank: int, cp_size: int, s_local: int, *, causal: bool, layout: str) -> list[GatherBlock]:
    """The kernel calls rank `cp_rank` makes against the gathered K/V (s = cp * s_local keys, token order).

    Not causal: all local queries against all keys. Causal: each chunk i the rank holds (`layout_chunks`), of c
    tokens, attends keys [0, i c) in full (when i > 0) and keys [i c, (i+1) c) under the causal mask."""
    check_layout(layout)
    s = s_local * cp_size
    if not causal:
        return [GatherBlock(slice(0, s_local), slice(0, s), False)]
    c = s // n_chunks(cp_size, layout)
    blocks = []
    for k, i in enumerate(layout_chunks(cp_rank, cp_size, layout)):
        rows = slice(k * c, (k + 1) * c)
        if i > 0:
            blocks.append(GatherBlock(rows, slice(0, i * c), False))
        blocks.append(GatherBlock(rows, slice(i * c, (i + 1) * c), True))
    return blocks


@dataclass(frozen=True)
class Gathered:
    """How one all-gather attention runs: its block plan, the gathered rows' token positions (`order`: gathered
    row j is token order[j]; None when they already are in token order), scale, kernel, accumulators' dtype, and
    `blocks`, a list the forward appends each block it computes to (None: nothing recorded)."""

    plan: tuple
    order: torch.Tensor | None
    scale: float
    kernel: object
    merge_dtype: torch.dtype
    blocks: list | None = None


class AllGatherAttention(torch.autograd.Function):
    """q [b, n_head, s/cp, d_head], kv [2, b, n_kv_head, s, d_head] (gathered, rows in the ranks' shard order)
    -> out [b, n_head, s/cp, d_head]. Backward returns dkv for the gathered rows: the all-gather's conjugate
    reduce-scatter (autograd, in `collectives`) sums it over the ranks and leaves each its own shard."""

    @staticmethod
    def forward(ctx, q, kv, run: Gathered):
        if run.order is not None:  # to token order, so a chunk's past keys are one contiguous range
            kv = kv.index_select(3, torch.argsort(run.order))
        out = torch.empty(q.shape, dtype=run.merge_dtype, device=q.device)
        lse = torch.empty(q.shape[:3], dtype=run.merge_dtype, device=q.device)
        started = set()
        for blk in run.plan:
            b_out, b_lse = run.kernel.forward(
                q[:, :, blk.q_rows],
                kv[0][:, :, blk.kv_rows],
                kv[1][:, :, blk.kv_rows],
                causal=blk.causal,
                scale=run.scale,
            )
            if blk.q_rows.start in started:
                merge_block(out[:, :, blk.q_rows], lse[:, :, blk.q_rows], b_out, b_lse)
            else:  # a chunk's first block is its running result
                out[:, :, blk.q_rows].copy_(b_out)
                lse[:, :, blk.q_rows].copy_(b_lse)
                started.add(blk.q_rows.start)
            if run.blocks is not None:
                run.blocks.append(blk)
        out_q = out.to(q.dtype)
        ctx.save_for_backward(q, kv, out_q, lse)
        ctx.run = run
        return out_q

    @staticmethod
    def backward(ctx, dout):
        q, kv, out, lse = ctx.saved_tensors
        run = ctx.run
        acc = accumulation_dtype(q.dtype)
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        dkv = torch.zeros(kv.shape, dtype=acc, device=q.device)
        for blk in run.plan:
            rows, cols = blk.q_rows, blk.kv_rows
            dq_b, dk_b, dv_b = run.kernel.backward(
                dout[:, :, rows],
                q[:, :, rows],
                kv[0][:, :, cols],
                kv[1][:, :, cols],
                out[:, :, rows],
                lse[:, :, rows],
                causal=blk.causal,
                scale=run.scale,
            )
            dq[:, :, rows] += dq_b
            dkv[0][:, :, cols] += dk_b
            dkv[1][:, :, cols] += dv_b
        if run.order is not None:  # back to the gathered rows' order (the permutation's transpose)
            dkv = dkv.index_select(3, run.order)
        return dq.to(q.dtype), dkv.to(kv.dtype), None


def allgather_attention(
    q,
    k,
    v,
    *,
    group=None,
    causal: bool = False,
    layout: str = CP_LAYOUT,
    kernel="auto",
    merge_dtype: torch.dtype | None = None,
    blocks: list | None = None,
) -> torch.Tensor:
    """Attention of this rank's queries over the whole sequence, K and V all-gathered over the cp group.

    q [b, n_head, s/cp, d_head]; k, v [b, n_kv_head, s/cp, d_head] (GQA when n_kv_head < n_head): this rank's
    shard in `layout`. Returns out [b, n_head, s/cp, d_head]. Autograd-aware: backward reduce-scatters dK, dV.
    kernel and merge_dtype as in `ring_attention`; blocks: a list to which the forward appends each `GatherBlock`
    it computes (what the rank attended, for a table or a figure)."""
    g = cp_group(group)
    check_qkv(q, k, v, g.size, layout, "allgather_attention")
    merge_dtype = accumulation_dtype(q.dtype) if merge_dtype is None else merge_dtype
    if not merge_dtype.is_floating_point:
        raise ValueError(f"merge_dtype={merge_dtype} must be a floating dtype")
    base = tracer.current_tag()
    kv = C.all_gather(torch.stack([k, v]), 3, g, tag=f"{base}.allgather.kv" if base else "allgather.kv")
    s_local = q.shape[2]
    order = None
    if causal and layout == "zigzag" and g.size > 1:
        order = layout_order(s_local * g.size, g.size, layout, device=q.device)
    plan = tuple(allgather_block_plan(g.rank, g.size, s_local, causal=bool(causal), layout=layout))
    run = Gathered(plan, order, default_scale(q.shape[-1]), select_kernel(q, kernel), merge_dtype, blocks)
    return AllGatherAttention.apply(q, kv, run)
