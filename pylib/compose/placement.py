"""Where a token sits in the composed model: CP's layout over the sequence, then SP's contiguous split of each CP
rank's tokens over TP.

    holder_labels(seq, cp, tp, layout) -> [S]   # position -> cp_rank * tp + tp_rank of the rank holding it
"""

from __future__ import annotations

import torch

from pylib.cp.layout import sequence_positions
from pylib.plan.options import CP_LAYOUT


def holder_labels(seq: int, cp: int, tp: int, layout: str = CP_LAYOUT) -> torch.Tensor:
    """[S] int64: for each position of a sequence, the index (cp_rank * tp + tp_rank) of the rank of one replica
    that holds it in the composed model (CP's layout, then SP's contiguous split of the CP rank's tokens)."""
    labels = torch.empty(seq, dtype=torch.int64, device="cpu")
    per = seq // (cp * tp)
    for c in range(cp):
        for k, p in enumerate(sequence_positions(seq, c, cp, layout).tolist()):
            labels[p] = c * tp + k // per
    return labels
