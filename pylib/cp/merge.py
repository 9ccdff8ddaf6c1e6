"""Online softmax: merge the attention of one key block into the running result with the log-sum-exp.

For one query row, block A (keys seen so far) gives out_A = sum_j softmax_A(j) v_j and lse_A = log sum_j e^{s_j};
block B gives out_B, lse_B. Attention over A and B together is

    lse = log(e^lse_A + e^lse_B)
    out = (e^lse_A out_A + e^lse_B out_B) / e^lse

Written that way it overflows (e^lse) and loses precision. Divide through by e^lse and it becomes a sigmoid:

    out = out_A - sigmoid(lse_B - lse_A) * (out_A - out_B)
    lse = lse_A - logsigmoid(lse_A - lse_B)

Both forms only ever see the *difference* of two LSEs, so nothing overflows whatever the scores' size; sigmoid
and logsigmoid are computed stably by torch for either sign. The accumulators must be float32 (or wider): the
merge is a long chain of small corrections, and a bf16 accumulator rounds every one of them
(`pylib.experiments.ring_merge_drift.merge_precision_drift` measures the damage).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def merge_block(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """Fold one block into the running (out, lse), in place, in the accumulators' dtype.

    out [.., s_q, d_head] and lse [.., s_q] are the accumulators (views of row slices are fine);
    block_out, block_lse are the block kernel's result for the same rows."""
    block_out = block_out.to(out.dtype)
    block_lse = block_lse.to(lse.dtype)
    w = torch.sigmoid(block_lse - lse).unsqueeze(-1)  # the new block's share of the merged softmax
    out.sub_(w * (out - block_out))
    lse.sub_(F.logsigmoid(lse - block_lse))


def merge_all(blocks, dtype: torch.dtype | None = None):
    """Merge a list of (out, lse) blocks of the same rows, left to right; returns (out, lse) in `dtype`
    (default: the first block's lse dtype). The single-process picture of what the ring does across ranks."""
    blocks = list(blocks)
    if not blocks:
        raise ValueError("merge_all needs at least one block")
    dtype = dtype or blocks[0][1].dtype
    out = blocks[0][0].to(dtype).clone()
    lse = blocks[0][1].to(dtype).clone()
    for bo, bl in blocks[1:]:
        merge_block(out, lse, bo, bl)
    return out, lse
