"""How context parallelism lays a sequence out over the cp ranks: contiguous, or the load-balanced zig-zag.

    contiguous   the sequence cut into cp chunks; rank r holds chunk r
    zigzag       the sequence cut into 2*cp chunks; rank r holds chunks r and 2*cp-1-r (in that order)

    s = 16, cp = 4              chunk:  0  1  2  3  4  5  6  7
      contiguous  rank:                 0  0  1  1  2  2  3  3
      zigzag      rank:                 0  1  2  3  3  2  1  0

Under a causal mask the token at position i attends to i+1 keys, so later tokens cost more. Contiguous gives the
last rank the most expensive tokens; zig-zag pairs an early (cheap) chunk with a late (dear) one so every rank
does the same work (`pylib.analysis.cp.causal_work_per_rank`).

Every activation of a CP layer is [b, s/cp, h] on each rank, its rows being this rank's chunks in this order;
`sequence_positions` gives their global token indices (RoPE and causal masks need them).
"""

from __future__ import annotations

import torch

from pylib.plan.options import CP_LAYOUT
from pylib.plan.problems import LAYOUTS, check_layout, check_sequence, n_chunks
from pylib.plan.sequence import layout_chunks, token_positions
from pylib.runtime.sharding import ShardSpec

__all__ = [
    "LAYOUTS",
    "check_layout",
    "check_sequence",
    "layout_chunks",
    "layout_order",
    "n_chunks",
    "sequence_positions",
    "sequence_shard_spec",
    "shard_sequence",
    "unshard_sequence",
]


def sequence_positions(seq_len: int, cp_rank: int, cp_size: int, layout: str = CP_LAYOUT, device=None) -> torch.Tensor:
    """Global token positions [s/cp] (int64) of the rows rank `cp_rank` holds, in its storage order
    (`pylib.plan.sequence.token_positions` as a tensor)."""
    return torch.tensor(token_positions(seq_len, cp_rank, cp_size, layout), dtype=torch.int64, device=device)


def layout_order(seq_len: int, cp_size: int, layout: str = CP_LAYOUT, device=None) -> torch.Tensor:
    """Positions [s] of the sequence as the ranks' shards concatenate in rank order (what an all-gather over the
    cp group, or Ulysses' all-to-all, produces)."""
    return torch.cat([sequence_positions(seq_len, r, cp_size, layout, device) for r in range(cp_size)])


def shard_sequence(x: torch.Tensor, dim: int, cp_rank: int, cp_size: int, layout: str = CP_LAYOUT) -> torch.Tensor:
    """This rank's part of `x` along `dim` (the sequence dimension): [.., s, ..] -> [.., s/cp, ..].

    Autograd flows through it. Shard every per-token tensor the same way (ids, targets, positions, hidden states);
    next-token targets must be formed *before* sharding, since under zig-zag a chunk's successor lives elsewhere."""
    check_sequence(x.shape[dim], cp_size, layout)
    chunks = x.chunk(n_chunks(cp_size, layout), dim=dim)
    return torch.cat([chunks[i] for i in layout_chunks(cp_rank, cp_size, layout)], dim=dim)


def unshard_sequence(parts, dim: int, layout: str = CP_LAYOUT) -> torch.Tensor:
    """Every rank's part (a list in cp-rank order) -> the full tensor in the original token order."""
    parts = list(parts)
    cp_size = len(parts)
    if cp_size == 0:
        raise ValueError("unshard_sequence needs at least one part")
    check_layout(layout)
    if layout == "contiguous":
        return torch.cat(parts, dim=dim)
    for r, p in enumerate(parts):
        if p.shape[dim] % 2:
            raise ValueError(f"zigzag parts hold two equal chunks: rank {r}'s part has odd length {p.shape[dim]}")
    halves = [p.chunk(2, dim=dim) for p in parts]
    ordered = [h[0] for h in halves] + [h[1] for h in reversed(halves)]
    return torch.cat(ordered, dim=dim)


def sequence_shard_spec(name: str, full_shape, dim: int, cp_rank: int, cp_size: int, layout: str = CP_LAYOUT):
    """A `ShardSpec` saying that activation `name` is split along its sequence dimension over the cp axis."""
    full_shape = tuple(full_shape)
    check_sequence(full_shape[dim], cp_size, layout)
    local = list(full_shape)
    local[dim] //= cp_size
    chunks = layout_chunks(cp_rank, cp_size, layout)
    held = ", ".join(map(str, chunks))
    note = f"rank {cp_rank} holds chunk{'s' if len(chunks) > 1 else ''} {held} of {n_chunks(cp_size, layout)}"
    return ShardSpec(name, "cp", dim, f"sequence-{layout}", full_shape, tuple(local), note)
