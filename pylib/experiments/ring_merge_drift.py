"""A pitfall worth a page: ring attention's merge accumulated in bf16 drifts as the ring grows.

Each ring step folds one more block into the running (out, lse). In float32 each fold is exact to ~1e-7 and the
only error left is the bf16 rounding of each block's output. Accumulate in bf16 instead and every fold rounds
the running output (8 bits of mantissa) and, worse, the running LSE: an LSE near 5 is held to +-1/64, and that
error goes straight into the exponent of every later block's weight. The error therefore grows with the number
of blocks -- with cp. `merge_precision_drift` measures it on real rings.
"""

from __future__ import annotations

import torch

from pylib.cp import ring_attention, shard_sequence, unshard_sequence
from pylib.model.attention import attention_core
from pylib.runtime import launch


def _inputs(batch, n_head, seq_len, d_head, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, n_head, seq_len, d_head, generator=g, dtype=torch.float64) for _ in range(3))
    return q, k, v


def _rank(qkv, cp, merge_dtypes, layout):
    import torch.distributed as dist

    r = dist.get_rank()
    q, k, v = (shard_sequence(x.to(torch.bfloat16), 2, r, cp, layout) for x in qkv)
    return {str(dt): ring_attention(q, k, v, layout=layout, kernel="torch", merge_dtype=dt) for dt in merge_dtypes}


def merge_precision_drift(
    cp_sizes=(1, 2, 4, 8),
    *,
    seq_len: int = 256,
    batch: int = 1,
    n_head: int = 2,
    d_head: int = 16,
    seed: int = 0,
    layout: str = "contiguous",
    timeout: float = 60.0,
) -> list[dict]:
    """RMS error of bf16 ring attention (non-causal) against float64 attention of the same bf16 inputs, with
    the merge accumulated in bf16 vs float32, for each cp. Runs a real ring of cp gloo ranks per row.

    Returns [{"cp": 1, "blocks": 1, "bf16_merge": e1, "fp32_merge": e2}, ...]."""
    qkv = _inputs(batch, n_head, seq_len, d_head, seed)
    q64, k64, v64 = (x.to(torch.bfloat16).to(torch.float64) for x in qkv)  # exactly what the ranks see
    ref = attention_core(q64, k64, v64, causal=False)
    dtypes = (torch.bfloat16, torch.float32)
    rows = []
    for cp in cp_sizes:
        parts = launch(_rank, cp, qkv, cp, dtypes, layout, backend="gloo", timeout=timeout)
        row = dict(cp=cp, blocks=cp)
        for dt, key in zip(dtypes, ("bf16_merge", "fp32_merge")):
            out = unshard_sequence([p[str(dt)] for p in parts], 2, layout).to(torch.float64)
            row[key] = (out - ref).pow(2).mean().sqrt().item()
        rows.append(row)
    return rows
