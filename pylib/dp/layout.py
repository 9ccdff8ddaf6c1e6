"""Flat buffers of tensors: flatten parameters into one 1-D tensor by a `FlatLayout`, take it apart, join shards.

The layouts themselves -- which parameter occupies which range, the padding that makes a buffer split into equal
shards, the bucket plan -- are pure arithmetic in `pylib.plan.layout` (re-exported here); this module holds the
torch side:

    flat = flatten(layout, tensors)          # [padded_numel], padding zero
    unflatten(layout, flat)                  # {name: tensor view}
    join_shards(layout, shards)              # the whole buffer from every member's shard, in group order
    assemble(layouts, shards_by_member)      # every parameter's full tensor
"""

from __future__ import annotations

import torch

from pylib.plan.layout import FlatEntry, FlatLayout, layout_table, padded_numel, plan_buckets, single_flat

__all__ = [
    "FlatEntry",
    "FlatLayout",
    "assemble",
    "flatten",
    "join_shards",
    "layout_table",
    "padded_numel",
    "plan_buckets",
    "single_flat",
    "unflatten",
]


def flatten(layout: FlatLayout, tensors: list[torch.Tensor]) -> torch.Tensor:
    """The whole flat buffer [padded_numel] holding `tensors` (one per entry, in order; the dtype and device of the
    first), padding zero: what `unflatten` takes apart."""
    flat = torch.zeros(layout.padded_numel, dtype=tensors[0].dtype, device=tensors[0].device)
    for e, t in zip(layout.entries, tensors, strict=True):
        flat[e.offset : e.offset + e.numel].copy_(t.detach().reshape(-1))
    return flat


def unflatten(layout: FlatLayout, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each parameter's tensor from a whole flat buffer (`flat` has numel or padded_numel elements)."""
    if flat.numel() not in (layout.numel, layout.padded_numel):
        raise ValueError(
            f"flat buffer {layout.key!r} has {layout.numel} elements ({layout.padded_numel} padded), got {flat.numel()}"
        )
    flat = flat.reshape(-1)
    return {e.name: flat[e.offset : e.offset + e.numel].view(e.shape) for e in layout.entries}


def join_shards(layout: FlatLayout, shards: list[torch.Tensor]) -> torch.Tensor:
    """The whole flat buffer from every shard, given in group order (shard i from group member i)."""
    if len(shards) != layout.parts:
        raise ValueError(f"flat buffer {layout.key!r} has {layout.parts} shards, got {len(shards)}")
    for i, s in enumerate(shards):
        if s.numel() != layout.shard_numel:
            raise ValueError(f"shard {i} of {layout.key!r} has {s.numel()} elements, expected {layout.shard_numel}")
    return torch.cat([s.reshape(-1) for s in shards])


def assemble(layouts: list[FlatLayout], shards_by_member: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Every parameter's full tensor from the flat shards the members of its group hold.

    shards_by_member[i] maps a layout key to what group member i holds of that buffer: its slice (parts > 1) or
    the whole buffer (parts == 1, e.g. DDP's buckets, where member 0's copy is used)."""
    out: dict[str, torch.Tensor] = {}
    for lay in layouts:
        if lay.parts == 1:
            flat = shards_by_member[0][lay.key]
        else:
            flat = join_shards(lay, [m[lay.key] for m in shards_by_member[: lay.parts]])
        out.update(unflatten(lay, flat))
    return out
