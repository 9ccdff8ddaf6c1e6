"""Ring attention: each rank keeps its queries; the key/value blocks travel once around the cp ring.

Rank r holds q, k, v for its own tokens ([b, n_head, s/cp, d_head]; k, v with n_kv_head heads). At step t it
holds the K/V block of rank (r - t) mod cp, attends its queries to it, and passes the block on to rank r+1:

    step t:  post  send(my K/V block -> r+1), recv(next block <- r-1)     one batch_isend_irecv
             compute attention of my Q against the block I hold          while the bytes are in flight
             merge it into (out, lse) with the log-sum-exp               (pylib.cp.merge)
             wait   for the next block                                   the exposed communication

After cp steps every query has seen every key: cp - 1 transfers of 2 * b * n_kv_head * (s/cp) * d_head elements
per rank (`pylib.analysis.cp.ring_traffic`). Memory stays at two K/V blocks whatever cp is.

Backward recomputes each block's probabilities from the saved global LSE (no score matrix is kept), accumulates
dQ locally, and sends the dK/dV accumulators around a second ring in step with the K/V blocks: the accumulator of
block j starts at rank j, gathers every rank's contribution as it goes round, and one last hop brings it home
(cp transfers of dK/dV per rank, plus cp - 1 of K/V again).

Causal masking decides which part of each block is worth computing (`ring_block_plan`):
  contiguous  step 0: the diagonal block, causal; a block from an earlier rank: all of it; from a later rank:
              nothing (fully masked) -- so rank r works r + 1/2 blocks' worth and the last rank dominates.
  zigzag      rank r holds chunks (r, 2cp-1-r) as [first half | second half] of its rows.
              step 0: causal on its own two chunks;
              K/V from an earlier rank j < r: chunk j is in the past of both of r's chunks and chunk 2cp-1-j in
                the future of both -> all local Q against the first K/V half;
              K/V from a later rank j > r: chunk r precedes both of j's chunks, chunk 2cp-1-r follows both ->
                the second Q half against all K/V.
              Every step after the first costs every rank the same half block: balanced.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from pylib.plan.heads import kv_group_problem
from pylib.plan.options import CP_LAYOUT
from pylib.runtime import collectives as C
from pylib.runtime import tracer
from pylib.runtime.agreement import agree
from pylib.runtime.mesh import AxisGroup

from .kernels import accumulation_dtype, default_scale, select_kernel
from .layout import check_layout
from .merge import merge_block
from .recorder import RingRecorder

# --------------------------------------------------------------------------------------------------- the plan


class ScoreBlock:
    """The sizes of one kernel call of a CP attention (its `q_rows`, `kv_rows` and `causal`, which the ring's and the
    all-gather's block plans hold): query and key rows, and the score entries that count and that are computed."""

    @property
    def n_q(self) -> int:
        return self.q_rows.stop - self.q_rows.start

    @property
    def n_kv(self) -> int:
        return self.kv_rows.stop - self.kv_rows.start

    @property
    def unmasked(self) -> int:
        """Score entries that count (per batch row and head)."""
        return self.n_q * (self.n_q + 1) // 2 if self.causal else self.n_q * self.n_kv

    @property
    def computed(self) -> int:
        """Score entries a dense kernel evaluates (a causal block is evaluated whole, then masked)."""
        return self.n_q * self.n_kv


@dataclass(frozen=True)
class BlockPlan(ScoreBlock):
    """What one ring step computes: local query rows `q_rows` against rows `kv_rows` of the K/V block it holds
    (the block of rank `kv_owner`), with a causal mask inside the block or none."""

    step: int
    kv_owner: int
    q_rows: slice
    kv_rows: slice
    causal: bool


def ring_block_plan(step: int, cp_rank: int, cp_size: int, s_local: int, *, causal: bool, layout: str):
    """The block rank `cp_rank` computes at ring step `step`, or None when it is fully masked (skipped)."""
    check_layout(layout)
    owner = (cp_rank - step) % cp_size
    every = slice(0, s_local)
    if not causal:
        return BlockPlan(step, owner, every, every, False)
    if step == 0:
        return BlockPlan(step, owner, every, every, True)
    if layout == "contiguous":
        return BlockPlan(step, owner, every, every, False) if owner < cp_rank else None
    half = s_local // 2
    if owner < cp_rank:
        return BlockPlan(step, owner, every, slice(0, half), False)
    return BlockPlan(step, owner, slice(half, s_local), every, False)


# --------------------------------------------------------------------------------------------------- the ring


def cp_group(group) -> AxisGroup:
    """The cp group as an AxisGroup; outside a launched rank, group=None is a group of one (no communication)."""
    if group is None and not dist.is_initialized():
        return AxisGroup("cp", (0,), 0, None)
    return C.resolve_group(group)


@dataclass(frozen=True)
class Ring:
    """How one ring attention runs: over `group`, causal or not, in `layout`, with `scale`, the block `kernel`,
    (out, lse) accumulated in `merge_dtype`; `overlap` posts each transfer before the compute it hides behind
    (False: waits for it first, the blocking baseline); `tag` names its messages in the tracer."""

    group: AxisGroup
    causal: bool
    layout: str
    scale: float
    kernel: object
    merge_dtype: torch.dtype
    overlap: bool
    tag: str

    def plan(self, step: int, s_local: int):
        return ring_block_plan(step, self.group.rank, self.group.size, s_local, causal=self.causal, layout=self.layout)

    def exchange(self, buf, name: str, rec: RingRecorder):
        """Send `buf` to the next rank and receive the previous rank's into a new buffer. Returns (incoming, the
        pending works, or None when not overlapping: then the transfer is already waited for)."""
        g = self.group
        incoming = torch.empty_like(buf)
        tag = f"{self.tag}.ring.{name}" if self.tag else f"ring.{name}"
        works = C.batch_isend_irecv(
            [("send", buf, (g.rank + 1) % g.size), ("recv", incoming, (g.rank - 1) % g.size)], g, tag=tag
        )
        if self.overlap:
            return incoming, works
        _wait(works, rec)  # the blocking variant: nothing overlaps the transfer
        return incoming, None


def _wait(works, rec: RingRecorder) -> None:
    if not works:
        return
    with rec.waiting():
        for w in works:
            w.wait()


def _rows(x, s: slice):
    return x[:, :, s]


class RingAttention(torch.autograd.Function):
    """q [b, n_head, s/cp, d_head], k, v [b, n_kv_head, s/cp, d_head] -> out [b, n_head, s/cp, d_head]."""

    @staticmethod
    def forward(ctx, q, k, v, ring: Ring, rec: RingRecorder):
        n, s_local = ring.group.size, q.shape[2]
        out = torch.empty(q.shape, dtype=ring.merge_dtype, device=q.device)
        lse = torch.empty(q.shape[:3], dtype=ring.merge_dtype, device=q.device)
        kv = torch.stack([k, v])  # one message per step: [2, b, n_kv_head, s/cp, d_head]
        for step in range(n):
            pending = None
            if step + 1 < n:
                incoming, pending = ring.exchange(kv, f"kv.{step + 1}", rec)
            plan = ring.plan(step, s_local)
            with rec.computing():
                if plan is not None:
                    b_out, b_lse = ring.kernel.forward(
                        _rows(q, plan.q_rows),
                        _rows(kv[0], plan.kv_rows),
                        _rows(kv[1], plan.kv_rows),
                        causal=plan.causal,
                        scale=ring.scale,
                    )
                    if step == 0:  # the first block covers every row: it *is* the running result
                        out.copy_(b_out)
                        lse.copy_(b_lse)
                    else:
                        merge_block(_rows(out, plan.q_rows), _rows(lse, plan.q_rows), b_out, b_lse)
            _wait(pending, rec)
            if step + 1 < n:
                kv = incoming
            rec.step_done("forward", step, (ring.group.rank - step) % n, plan, q.shape[0] * q.shape[1])
        out_q = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out_q, lse)
        ctx.ring, ctx.rec = ring, rec
        return out_q

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring, rec = ctx.ring, ctx.rec
        n, s_local = ring.group.size, q.shape[2]
        acc = accumulation_dtype(q.dtype)
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        kv = torch.stack([k, v])
        dkv = dkv_incoming = dkv_pending = None
        for step in range(n):
            kv_pending = None
            if step + 1 < n:
                kv_incoming, kv_pending = ring.exchange(kv, f"kv.{step + 1}", rec)
            plan = ring.plan(step, s_local)
            with rec.computing():
                block = torch.zeros(kv.shape, dtype=acc, device=q.device)  # my contribution to this block's dK/dV
                if plan is not None:
                    rows, cols = plan.q_rows, plan.kv_rows
                    dq_b, dk_b, dv_b = ring.kernel.backward(
                        _rows(dout, rows),
                        _rows(q, rows),
                        _rows(kv[0], cols),
                        _rows(kv[1], cols),
                        _rows(out, rows),
                        _rows(lse, rows),
                        causal=plan.causal,
                        scale=ring.scale,
                    )
                    _rows(dq, rows).add_(dq_b)
                    _rows(block[0], cols).add_(dk_b)
                    _rows(block[1], cols).add_(dv_b)
            if step > 0:  # add the accumulator of this same block, arriving from the previous rank
                _wait(dkv_pending, rec)
                block += dkv_incoming
            dkv = block
            _wait(kv_pending, rec)
            if step + 1 < n:
                kv = kv_incoming
            if n > 1:  # pass the accumulator on; after the last step this hop takes it home
                dkv_incoming, dkv_pending = ring.exchange(dkv, f"dkv.{step + 1}", rec)
            if step == n - 1 and n > 1:
                _wait(dkv_pending, rec)
                dkv = dkv_incoming
            rec.step_done("backward", step, (ring.group.rank - step) % n, plan, q.shape[0] * q.shape[1])
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None


def check_qkv(q, k, v, cp_size: int, layout: str, who: str) -> None:
    """Shapes and the layout's divisibility, with the numbers in the message."""
    check_layout(layout)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{who}: q, k, v must be [b, heads, s_local, d_head]; got {tuple(q.shape)}, {tuple(k.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"{who}: k {tuple(k.shape)} and v {tuple(v.shape)} differ")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"{who}: q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    b, n_head, s_local, d = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (b, s_local, d):
        raise ValueError(f"{who}: q {tuple(q.shape)} and k {tuple(k.shape)} disagree on batch, s_local or d_head")
    if problem := kv_group_problem(n_head, k.shape[1]):
        raise ValueError(f"{who}: {problem}")
    if layout == "zigzag" and s_local % 2:
        raise ValueError(
            f"{who}: the zigzag layout cuts the sequence into 2*cp={2 * cp_size} chunks, two per rank: "
            f"s_local={s_local} is odd (s={s_local * cp_size} is not divisible by {2 * cp_size})"
        )


def ring_attention(
    q,
    k,
    v,
    *,
    group=None,
    causal: bool = False,
    layout: str = CP_LAYOUT,
    kernel="auto",
    overlap: bool = True,
    merge_dtype: torch.dtype | None = None,
    stats: RingRecorder | None = None,
) -> torch.Tensor:
    """Attention of this rank's queries over the whole sequence, the K/V blocks passed around the cp ring.

    q [b, n_head, s/cp, d_head]; k, v [b, n_kv_head, s/cp, d_head] (GQA when n_kv_head < n_head): this rank's
    shard in `layout` ("contiguous" or "zigzag", see `pylib.cp.layout`). Returns out [b, n_head, s/cp, d_head],
    this rank's rows of softmax(q k^T / sqrt(d_head) [+ causal mask]) v. Autograd-aware.

    kernel: "auto" | "torch" | "flash" | a kernel object (`pylib.cp.kernels`). overlap=False waits for each
    transfer before computing (the blocking baseline for measuring overlap). merge_dtype: the (out, lse)
    accumulators' dtype, default float32 (float64 for float64 inputs). stats: a recorder to tell each step's
    work and time (`RingStats`; any `pylib.cp.recorder.RingRecorder`).
    """
    g = cp_group(group)
    check_qkv(q, k, v, g.size, layout, "ring_attention")
    agree("ring_attention", g, [q, k, v], params={"causal": int(bool(causal))})  # before any P2P
    scale = default_scale(q.shape[-1])
    merge_dtype = accumulation_dtype(q.dtype) if merge_dtype is None else merge_dtype
    if not merge_dtype.is_floating_point:
        raise ValueError(f"merge_dtype={merge_dtype} must be a floating dtype")
    ring = Ring(
        g, bool(causal), layout, scale, select_kernel(q, kernel), merge_dtype, bool(overlap), tracer.current_tag()
    )
    return RingAttention.apply(q, k, v, ring, RingRecorder() if stats is None else stats)
