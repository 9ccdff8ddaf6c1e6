"""Sharding specs: each parallel module says, in data, how it holds each tensor.

The book's tables (which weight is cut along which axis, by which parallelism) are printed from these specs, so
the code and the book cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pylib.i18n import tr


@dataclass(frozen=True)
class ShardSpec:
    """How one tensor is laid out over one mesh axis.

    name: the tensor's name in the reference model ("layers.0.attn.q_proj.weight").
    axis: the mesh axis it is split or replicated over ("tp", "cp", "ep", "etp", "dp", "pp").
    dim: the tensor dimension that is split, or None when every rank of the axis holds all of it.
    kind: "column", "row", "vocab", "replicated", "expert", "stage", "zero" ...
    full_shape / local_shape: the reference shape and this rank's shape.
    """

    name: str
    axis: str
    dim: int | None
    kind: str
    full_shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    note: str = ""

    @property
    def fraction(self) -> float:
        """Share of the full tensor held by one rank."""
        full = 1
        for n in self.full_shape:
            full *= n
        local = 1
        for n in self.local_shape:
            local *= n
        return local / full if full else 1.0


def shard(full: torch.Tensor, dim: int, index: int, parts: int, what: str = "") -> torch.Tensor:
    """Part `index` of `parts` equal parts of `full` along `dim`, as a new tensor.

    Raises a ValueError naming the constraint when the size is not divisible, e.g.
    "tp=3 does not divide n_heads=8"-style messages come from passing `what` ("tp=3 ... n_heads=8")."""
    size = full.shape[dim]
    if parts < 1 or size % parts:
        raise ValueError(
            what or f"{parts} parts do not divide dimension {dim} of size {size} (shape {tuple(full.shape)})"
        )
    return full.chunk(parts, dim=dim)[index].clone()


def require_divisible(size: int, parts: int, axis: str, what: str) -> None:
    """Raise "tp=3 does not divide n_heads=8" when `parts` does not divide `size`."""
    if parts < 1 or size % parts:
        raise ValueError(
            tr("{axis}={parts} does not divide {what}={size}", axis=axis, parts=parts, what=what, size=size)
        )
