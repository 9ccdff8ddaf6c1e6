"""Measure what autograd keeps for backward: the activation memory that SP, CP and recomputation reduce.

with saved_activations(exclude=model.parameters()) as saved:
    loss = model(x).sum()
saved.bytes          # distinct storages saved for backward, parameters excluded
saved.by_shape()     # what was saved, grouped by shape and dtype
"""

from __future__ import annotations

import contextlib
from collections import Counter

import torch


class SavedTensors:
    """Tensors packed by autograd inside the block, each underlying storage counted once."""

    def __init__(self, exclude_ptrs: set[int]):
        self._exclude = exclude_ptrs
        self._seen: dict[int, int] = {}
        self.tensors: list[tuple[tuple, str, int]] = []

    def add(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self._exclude or ptr in self._seen or storage.nbytes() == 0:
            return
        self._seen[ptr] = storage.nbytes()
        self.tensors.append((tuple(t.shape), str(t.dtype).replace("torch.", ""), storage.nbytes()))

    @property
    def bytes(self) -> int:
        return sum(self._seen.values())

    def by_shape(self) -> list[tuple[tuple, str, int, int]]:
        """(shape, dtype, count, bytes) rows, largest total first."""
        counts, sizes = Counter(), Counter()
        for shape, dtype, n in self.tensors:
            counts[(shape, dtype)] += 1
            sizes[(shape, dtype)] += n
        return sorted(((s, d, counts[(s, d)], sizes[(s, d)]) for (s, d) in counts), key=lambda r: -r[3])


@contextlib.contextmanager
def saved_activations(exclude=()):
    """Count the bytes of every tensor autograd saves for backward while the block runs.

    exclude: tensors (typically the model's parameters) whose storage must not be counted; weights are saved by
    reference for the input gradient, but they are not activations."""
    rec = SavedTensors({p.untyped_storage().data_ptr() for p in exclude})

    def pack(t):
        rec.add(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield rec
