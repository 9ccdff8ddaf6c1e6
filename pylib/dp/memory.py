"""Measure the model-state memory one rank holds: parameters, gradients, optimizer state.

Counting is by *storage*: each underlying buffer counts once, at its real size, however many tensors view it (a
DDP parameter's `.grad` is a view into its bucket; a ZeRO-1 parameter is a view into its flat buffer; a ZeRO-3
parameter between uses is a view into a storage that has been freed, and counts 0). So these numbers are what the
rank actually keeps alive, not what a formula says it should.

Not counted: the optimizer's step counters (one 0-dim tensor per optimized tensor), transient `p.grad` tensors that
autograd creates and the bucket hook folds into the bucket at once, and activations (see
`pylib.model.saved_activations`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch


@dataclass
class HeldBytes:
    """Bytes held by one rank. `peak_params` / `peak_grads`: the most held at any moment of forward and backward
    (ZeRO-3 gathers each module's full parameters for a while; ZeRO-2 keeps a bucket's full gradient until its
    reduce-scatter completes); equal to `params` / `grads` for modes whose buffers never change size."""

    params: int
    grads: int
    optim: int
    peak_params: int
    peak_grads: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optim

    def as_dict(self) -> dict:
        return asdict(self) | dict(total=self.total)


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind `tensors` (None and empty storages skipped)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        s = t.untyped_storage()
        if s.nbytes() and s.data_ptr() not in seen:
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def optimizer_state_tensors(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """Every state tensor of `optimizer` (Adam: exp_avg and exp_avg_sq per parameter) except 0-dim step counters."""
    if optimizer is None:
        return []
    out = []
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                out.append(v)
    return out
