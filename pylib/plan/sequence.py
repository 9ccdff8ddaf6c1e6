"""Which tokens a context-parallel rank holds: the layouts' chunk ownership as plain integers (no torch).

    contiguous   the sequence cut into cp chunks; rank r holds chunk r
    zigzag       the sequence cut into 2*cp chunks; rank r holds chunks r and 2*cp-1-r (in that order)

`pylib.cp.layout` shards tensors with these; `pylib.viz.cp` draws them without running anything.
"""

from __future__ import annotations

from .options import CP_LAYOUT
from .problems import check_layout, check_sequence, n_chunks


def layout_chunks(cp_rank: int, cp_size: int, layout: str = CP_LAYOUT) -> tuple[int, ...]:
    """Indices of the chunks rank `cp_rank` holds, in the order it stores them."""
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank={cp_rank} is outside 0..{cp_size - 1}")
    check_layout(layout)
    return (cp_rank,) if layout == "contiguous" else (cp_rank, 2 * cp_size - 1 - cp_rank)


def token_positions(seq_len: int, cp_rank: int, cp_size: int, layout: str = CP_LAYOUT) -> list[int]:
    """Global positions of the s/cp tokens rank `cp_rank` holds, in its storage order."""
    check_sequence(seq_len, cp_size, layout)
    c = seq_len // n_chunks(cp_size, layout)
    return [p for i in layout_chunks(cp_rank, cp_size, layout) for p in range(i * c, (i + 1) * c)]
