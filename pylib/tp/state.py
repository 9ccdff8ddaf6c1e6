"""Reassemble full tensors from the TP shards, driven by the modules' `shard_specs()`.

For checks and for the book: gather every parameter (or gradient) of a TP module back into the reference
model's shapes and names, so it can be compared with the single-device model. All sharded tensors travel in one
all-gather of their concatenation (every rank's shards have the same shapes), traced as phase "gather_full".
"""

from __future__ import annotations

import torch
import torch.nn as nn

from pylib.runtime import ShardSpec, phase
from pylib.runtime import collectives as C


def _unshard(pieces: list[torch.Tensor], spec: ShardSpec) -> torch.Tensor:
    """Every rank's piece, in group order -> the full tensor (one copy of each replicated K/V head; a padded
    vocabulary's rows past V dropped)."""
    if spec.kind == "vocab":
        full = torch.cat(pieces, dim=spec.dim).narrow(spec.dim, 0, spec.full_shape[spec.dim])
        if tuple(full.shape) != spec.full_shape:
            raise RuntimeError(f"{spec.name}: gathered {tuple(full.shape)}, expected {spec.full_shape}")
        return full
    replicas = len(pieces) * spec.local_shape[spec.dim] // spec.full_shape[spec.dim]
    full = torch.cat(pieces[::replicas], dim=spec.dim)
    if tuple(full.shape) != spec.full_shape:
        raise RuntimeError(f"{spec.name}: gathered {tuple(full.shape)}, expected {spec.full_shape}")
    return full


def gather_full(module: nn.Module, group=None, *, grads: bool = False) -> dict[str, torch.Tensor]:
    """{reference name: full tensor} of every parameter (grads=False) or gradient (grads=True) of a TP module.

    Replicated parameters come back as this rank's copy (so an un-reduced SP gradient shows as it is)."""
    specs = {s.name: s for s in module.shard_specs()}
    tensors = {}
    for name, p in module.named_parameters():
        if name not in specs:
            raise KeyError(f"{name} has no shard spec")
        t = p.grad if grads else p
        if t is not None:
            tensors[name] = t.detach()
    out = {n: t.clone() for n, t in tensors.items() if specs[n].dim is None}
    sharded = [n for n in tensors if specs[n].dim is not None]
    if not sharded:
        return out
    g = C.resolve_group(group)
    flat = torch.cat([tensors[n].reshape(-1) for n in sharded])
    with phase("gather_full"):
        rows = C.all_gather_tensor(flat, 0, g, tag="gather_full").view(g.size, -1)
    offset = 0
    for n in sharded:
        shape, k = tensors[n].shape, tensors[n].numel()
        out[n] = _unshard([rows[r, offset : offset + k].view(shape) for r in range(g.size)], specs[n])
        offset += k
    return out
