"""Is a module token-local? Run it on the whole sequence here and on pieces of it on real ranks, and compare
(article A's test for which stages of a layer can be split along the sequence without communication).

    split_check(fn, [x], seq_dims=[1])     # SplitCheck: .matches, .max_abs_err, the local shapes, comm events
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from pylib.runtime import launch, trace


@dataclass
class SplitCheck:
    """A module run on the whole sequence and on `world_size` pieces of it, one piece per real rank."""

    full: torch.Tensor  # fn on the whole sequence
    pieces: torch.Tensor  # the ranks' outputs concatenated along the sequence
    local_in_shapes: list[list[tuple[int, ...]]]  # per rank, the shape of each input it held
    local_out_shapes: list[tuple[int, ...]]
    comm_events: int  # ops the ranks issued through pylib.runtime.collectives while running fn (summed over ranks)
    atol: float

    @property
    def max_abs_err(self) -> float:
        return (self.full - self.pieces).abs().max().item()

    @property
    def matches(self) -> bool:
        return self.max_abs_err <= self.atol

    @property
    def mark(self) -> str:
        return "✓" if self.matches else "✗"


def _split_worker(fn, inputs, seq_dims, out_dim):
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = [t.chunk(world, dim=d)[rank].contiguous() for t, d in zip(inputs, seq_dims)]
    with trace() as tr, torch.no_grad():
        out = fn(*mine)
    return out, [tuple(t.shape) for t in mine], len(tr.events)


def split_check(
    fn,
    inputs,
    seq_dims,
    world_size: int = 2,
    out_dim: int | None = None,
    atol: float = 1e-5,
    reference: torch.Tensor | None = None,
    **launch_kwargs,
) -> SplitCheck:
    """Is `fn` token-local? Run `fn(*inputs)` here on the whole sequence, then on `world_size` real ranks, each
    holding its contiguous piece of every input along that input's sequence dim (`seq_dims`), and compare.

    out_dim: the output's sequence dim (default seq_dims[0]). The pieces match the whole when every output row
    depends on its own token only (token-local) -- or, for a token-global module, never.
    reference: the whole-sequence result to compare with, for an `fn` that communicates (and so cannot run
    here, outside a rank); default fn(*inputs).
    The ranks use gloo unless `backend=` says otherwise: the inputs are CPU tensors, on a GPU node too."""
    out_dim = seq_dims[0] if out_dim is None else out_dim
    for t, d in zip(inputs, seq_dims):
        if t.shape[d] % world_size:
            raise ValueError(
                f"world_size={world_size} does not divide the sequence length {t.shape[d]} "
                f"(dim {d} of an input of shape {tuple(t.shape)})"
            )
    if reference is None:
        with torch.no_grad():
            full = fn(*inputs)
    else:
        full = reference
    launch_kwargs.setdefault("backend", "gloo")
    results = launch(_split_worker, world_size, fn, list(inputs), list(seq_dims), out_dim, **launch_kwargs)
    pieces = torch.cat([r[0] for r in results], dim=out_dim)
    return SplitCheck(
        full.detach(),
        pieces,
        [r[1] for r in results],
        [tuple(r[0].shape) for r in results],
        sum(r[2] for r in results),
        atol,
    )
