"""The slice of a global batch a data-parallel rank (or one micro-step of one device) takes.

Rank r of a group of d takes rows [r*b/d, (r+1)*b/d) of every global batch [b, s]; the mean of the d losses is the
reference loss on the whole batch. `pylib.dp.wrap` trains the ranks this way and `SingleDeviceMixed` steps through
the same slices on one device, so both round where a d-rank run rounds.
"""

from __future__ import annotations

import torch

from pylib.i18n import tr


def micro_batch(ids: torch.Tensor, index: int, parts: int) -> torch.Tensor:
    """Rows [index*b/parts, (index+1)*b/parts) of a global batch [b, s]."""
    if ids.shape[0] % parts:
        raise ValueError(tr("dp={dp} does not divide the global batch size {b}", dp=parts, b=ids.shape[0]))
    return ids.chunk(parts, dim=0)[index]
