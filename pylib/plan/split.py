"""Which layers each pipeline rank holds: the one layer-split formula every part of pylib asks.

With p pipeline ranks and v virtual chunks per rank there are K = p·v *virtual stages*, each holding
L / K consecutive layers. Virtual stage k lives on rank k % p as its chunk k // p -- Megatron's interleaved
layout: chunk c of rank r holds layer block c·p + r. With v = 1 that is the plain split (rank r holds block r).

    p = 2, v = 2, L = 8:   rank 0: chunk 0 = layers 0-1 (+ embedding),  chunk 1 = layers 4-5
                           rank 1: chunk 0 = layers 2-3,                chunk 1 = layers 6-7 (+ ln_f, lm_head, loss)

Pure arithmetic: `pylib.pp.split` cuts the modules by it, `pylib.analysis` predicts with it.
"""

from __future__ import annotations

import functools

from pylib.i18n import tr


def check_split(n_layers: int, pp: int, v: int = 1) -> None:
    """Raise a ValueError naming the numbers when L layers cannot be cut into pp·v equal blocks."""
    for name, value in (("pp", pp), ("v", v)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    if n_layers % (pp * v):
        raise ValueError(
            tr(
                "n_layers={n} is not divisible by pp × v = {pp} × {v} = {pv} "
                "(every virtual stage must hold the same number of layers)",
                n=n_layers,
                pp=pp,
                v=v,
                pv=pp * v,
            )
        )


def virtual_stage(rank: int, chunk: int, pp: int) -> int:
    """Index k of the virtual stage held by `rank` as its chunk `chunk`: k = chunk·pp + rank."""
    return chunk * pp + rank


def layers_of_stage(n_layers: int, stage: int, n_stages: int) -> range:
    """The layer indices virtual stage `stage` of `n_stages` holds: the stage-th run of L / n_stages layers."""
    check_split(n_layers, n_stages)
    if not 0 <= stage < n_stages:
        raise ValueError(f"stage={stage} is outside 0..{n_stages - 1}")
    per = n_layers // n_stages
    return range(stage * per, (stage + 1) * per)


def chunk_layers(n_layers: int, pp: int, v: int, pp_rank: int) -> list[range]:
    """Layers of each chunk c of pipeline rank `pp_rank`: virtual stage c·pp + pp_rank of pp·v."""
    return list(_chunk_layers(n_layers, pp, v, pp_rank))


@functools.lru_cache(maxsize=4096)
def _chunk_layers(n_layers: int, pp: int, v: int, pp_rank: int) -> tuple[range, ...]:
    # remembered: the planner asks the same few splits hundreds of thousands of times
    check_split(n_layers, pp, v)
    if not 0 <= pp_rank < pp:
        raise ValueError(f"pp_rank={pp_rank} is outside 0..{pp - 1}")
    per = n_layers // (pp * v)
    return tuple(range(k * per, (k + 1) * per) for k in (virtual_stage(pp_rank, c, pp) for c in range(v)))


def stage_layers(n_layers: int, pp: int, v: int = 1) -> list[list[range]]:
    """layers[r][c]: the range of layer indices that chunk c of rank r holds (the book prints it)."""
    check_split(n_layers, pp, v)
    return [chunk_layers(n_layers, pp, v, r) for r in range(pp)]
