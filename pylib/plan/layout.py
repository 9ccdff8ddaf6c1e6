"""Flat buffers as data: parameters laid end to end in one 1-D buffer, padded so that it splits into equal shards.

Every data-parallel mode reduces gradients (and ZeRO shards parameters and optimizer state) one *flat buffer*
at a time: DDP's gradient buckets, ZeRO-1/2's buckets, ZeRO-3's per-module flat parameters. A `FlatLayout` says,
as data, which parameter occupies which range of which buffer and how much padding makes the buffer divisible by
the number of shards, so the book can print it and a test can put the shards back together:

    bucket0  [ layers.1.mlp.down_proj.bias | layers.1.mlp.down_proj.weight | ... | pad ]
              ^ offset 0                     ^ offset 16                          numel .. padded_numel
    rank r of d holds elements [r * padded_numel / d, (r + 1) * padded_numel / d) of every ZeRO buffer.

Pure arithmetic (names and shapes in, layouts out; no tensors): `pylib.dp.layout` flattens and unflattens tensors
by these layouts, `pylib.analysis` predicts memory and traffic from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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
