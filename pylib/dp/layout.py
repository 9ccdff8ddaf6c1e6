"""Flat buffers: parameters laid end to end in one 1-D tensor, padded so that it splits into equal shards.

Every data-parallel mode here reduces gradients (and ZeRO shards parameters and optimizer state) one *flat buffer*
at a time: DDP's gradient buckets, ZeRO-1/2's buckets, ZeRO-3's per-module flat parameters. A `FlatLayout` says,
as data, which parameter occupies which range of which buffer and how much padding makes the buffer divisible by
the number of shards, so the book can print it and a test can put the shards back together:

    bucket0  [ layers.1.mlp.down_proj.bias | layers.1.mlp.down_proj.weight | ... | pad ]
              ^ offset 0                     ^ offset 16                          numel .. padded_numel
    rank r of d holds elements [r * padded_numel / d, (r + 1) * padded_numel / d) of every ZeRO buffer.

`plan_buckets` is pure (names and shapes in, layouts out): no processes, no tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FlatEntry:
    """One parameter inside a flat buffer: elements [offset, offset + numel) hold it, reshaped to `shape`."""

    name: str
    shape: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class FlatLayout:
    """A flat buffer of parameters of one dtype, reduced over one group and split into `parts` equal shards.

    key: unique name ("bucket0", "layers.1"); axis / group: the reduction group's name and global ranks;
    parts: how many shards (1 for DDP, which shards nothing; the group size for ZeRO).
    """

    key: str
    axis: str
    group: tuple[int, ...]
    dtype: str
    element_size: int
    entries: tuple[FlatEntry, ...]
    parts: int = 1

    @property
    def numel(self) -> int:
        return sum(e.numel for e in self.entries)

    @property
    def padded_numel(self) -> int:
        return padded_numel(self.numel, self.parts)

    @property
    def padding(self) -> int:
        return self.padded_numel - self.numel

    @property
    def bytes(self) -> int:
        """Parameter bytes, padding excluded."""
        return self.numel * self.element_size

    @property
    def padded_bytes(self) -> int:
        """Bytes of the whole buffer, padding included (what the collectives move)."""
        return self.padded_numel * self.element_size

    @property
    def shard_numel(self) -> int:
        return self.padded_numel // self.parts

    def shard_range(self, index: int) -> tuple[int, int]:
        """Elements [lo, hi) of the buffer held by shard `index`."""
        if not 0 <= index < self.parts:
            raise ValueError(f"shard index {index} is outside 0..{self.parts - 1}")
        return index * self.shard_numel, (index + 1) * self.shard_numel

    def owned(self, index: int) -> list[tuple[str, int, int]]:
        """(parameter name, first, last+1 flat element *of that parameter*) for every piece shard `index` holds.
        A parameter may straddle two shards; padding belongs to nobody."""
        lo, hi = self.shard_range(index)
        out = []
        for e in self.entries:
            a, b = max(lo, e.offset), min(hi, e.offset + e.numel)
            if a < b:
                out.append((e.name, a - e.offset, b - e.offset))
        return out

    def entry(self, name: str) -> FlatEntry:
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(f"{name!r} is not in flat buffer {self.key!r}")


def padded_numel(numel: int, parts: int) -> int:
    """The smallest multiple of `parts` that is >= numel: the buffer size that splits into `parts` equal shards."""
    if parts < 1:
        raise ValueError(f"parts={parts} must be >= 1")
    return -(-numel // parts) * parts


def plan_buckets(
    params: list[tuple[str, tuple[int, ...]]],
    *,
    element_size: int,
    bucket_bytes: int,
    parts: int = 1,
    axis: str = "world",
    group: tuple[int, ...] = (),
    dtype: str = "float32",
    first_index: int = 0,
    key_prefix: str = "bucket",
) -> list[FlatLayout]:
    """Cut `params` (name, shape), taken in the given order, into buckets of at most `bucket_bytes` each.

    Give the parameters in the order their gradients become ready -- reverse registration order, as PyTorch's DDP
    assumes (the last layer's gradients are computed first) -- so the first bucket fills up first. A parameter is
    never split: one larger than `bucket_bytes` gets a bucket of its own. Each bucket is padded to a multiple of
    `parts` elements (its size is counted without the padding)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes} must be >= 1")
    buckets: list[list[FlatEntry]] = []
    current: list[FlatEntry] = []
    size = 0
    for name, shape in params:
        nbytes = math.prod(shape) * element_size
        if current and size + nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(FlatEntry(name, tuple(shape), size // element_size))
        size += nbytes
    if current:
        buckets.append(current)
    return [
        FlatLayout(f"{key_prefix}{first_index + i}", axis, tuple(group), dtype, element_size, tuple(b), parts)
        for i, b in enumerate(buckets)
    ]


def single_flat(
    key: str,
    params: list[tuple[str, tuple[int, ...]]],
    *,
    element_size: int,
    parts: int,
    axis: str = "world",
    group: tuple[int, ...] = (),
    dtype: str = "float32",
) -> FlatLayout:
    """All of `params` in one flat buffer (ZeRO-3 keeps one per module and reduction group)."""
    entries, offset = [], 0
    for name, shape in params:
        entries.append(FlatEntry(name, tuple(shape), offset))
        offset += math.prod(shape)
    return FlatLayout(key, axis, tuple(group), dtype, element_size, tuple(entries), parts)


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


def layout_table(layouts: list[FlatLayout]) -> list[dict]:
    """One row per flat buffer: key, group, parameter count, elements, padding, bytes -- for the book's tables."""
    return [
        dict(
            key=lay.key,
            axis=lay.axis,
            params=len(lay.entries),
            first=lay.entries[0].name if lay.entries else "",
            last=lay.entries[-1].name if lay.entries else "",
            numel=lay.numel,
            padding=lay.padding,
            padded_bytes=lay.padded_bytes,
            shard_numel=lay.shard_numel,
        )
        for lay in layouts
    ]


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
