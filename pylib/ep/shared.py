"""The shared experts on one rank: a dense MLP that every token goes through, cut as tensor parallelism cuts the
dense MLP and replicated over the expert-parallel group.

Megatron-Core places them so (megatron/core/transformer/moe/shared_experts.py, `SharedExpertMLP`: an `MLP` built
with the tensor-parallel group `pg_collection.tp` and ffn_hidden_size = moe_shared_expert_intermediate_size). The
shared MLP never meets the router or the dispatcher; it sees the same tokens the dense MLP of a dense layer would:

    x [b, s/tp, h]  --all-gather over tp (dim 1)-->  [b, s, h]            (backward: reduce-scatter)
        up / gate   W [n_s*h_ffn/tp, h]   column-parallel: rows of rank j's slice
        down        W [h, n_s*h_ffn/tp]   row-parallel: the same slice's columns -> a partial sum [b, s, h]
    partial  --reduce-scatter over tp (dim 1)-->  y [b, s/tp, h]           (backward: all-gather)

The tokens of one TP group are the sequence shards of the same sequences (sequence parallelism), so the gather is
along the sequence. Without sequence parallelism (sequence_parallel=False: every TP rank holds the same tokens, as
the composed model's TP region does when SP is off) the crossings are Megatron's f and g instead: the input enters
unchanged (backward: all-reduce over tp) and the partial sums leave through an all-reduce (backward: identity).
Ranks of the EP group outside this TP group hold the same slice for other tokens: their gradients add up over the
data-parallel ranks, as a dense MLP's do (`ExpertParallelMoE.reduce_shared_grad`).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from pylib.model.mlp import MLP
from pylib.runtime import collectives
from pylib.runtime.mesh import AxisGroup
from pylib.runtime.tracer import tag

from .experts import LocalExperts


class SharedExperts(nn.Module):
    """Slice `tp_group.rank` of the reference's shared MLP `full` (h_ffn split `tp_group.size` ways).

    forward(x [b, s_local, h]) -> [b, s_local, h]: this rank's tokens, a sequence shard of the TP group's
    (sequence_parallel=False: the TP group's tokens, the same on each of its ranks)."""

    def __init__(self, full: MLP, tp_group: AxisGroup, sequence_parallel: bool = True):
        super().__init__()
        self.tp_group, self.sequence_parallel = tp_group, sequence_parallel
        d_ff = full.up_proj.weight.shape[0]
        if d_ff % tp_group.size:
            raise ValueError(f"tp={tp_group.size} does not divide the shared experts' h_ffn={d_ff}")
        self.d_ff = d_ff
        # the same column / row cut as one expert under ETP: one piece of the one MLP
        self.mlp = LocalExperts([full], 0, 1, tp_group.rank, tp_group.size).experts[0]

    def param_map(self) -> list[tuple[str, nn.Parameter, str, tuple]]:
        """(local name, parameter, reference name under `shared.`, index into the reference tensor)."""
        step = self.d_ff // self.tp_group.size
        cut = slice(self.tp_group.rank * step, (self.tp_group.rank + 1) * step)
        out = []
        for name, p in self.mlp.named_parameters():
            index = (cut,) if LocalExperts.split_dim(name) == 0 else (slice(None), cut)
            out.append((f"shared.mlp.{name}", p, f"shared.{name}", index))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.sequence_parallel:
            with tag("shared"):
                return collectives.reduce_from_group(
                    self.mlp(collectives.copy_to_group(x, self.tp_group)), self.tp_group
                )
        if self.tp_group.size > 1 and x.dim() != 3:
            raise ValueError(
                f"the shared experts gather the tp={self.tp_group.size} sequence shards along dim 1 of x [b, s, h]; "
                f"got x of shape {tuple(x.shape)}"
            )
        with tag("shared"):
            full = collectives.all_gather(x, 1, self.tp_group)
            partial = self.mlp(full)
            return collectives.reduce_scatter(partial, 1, self.tp_group)
