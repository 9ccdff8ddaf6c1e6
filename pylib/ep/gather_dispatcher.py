"""The all-gather token dispatcher: every rank gathers all the tokens of its EP x ETP group and keeps the rows
routed to its own experts (Megatron-Core's MoEAllGatherTokenDispatcher, token_dispatcher.py).

Group: the n = etp * ep ranks of the expert grid (`mesh["etp-ep"]`; the EP group when etp = 1). Rank r holds
experts [first, first + E_local), a 1/etp slice of each under ETP.

  dispatch  1 mark     dropped assignments get the id E (no rank holds it)                  (local)
            2 gather   tokens x [T, h] -> [n*T, h] and their expert ids [T, k] -> [n*T, k]   (tagged "dispatch")
            3 permute  the gathered assignments whose expert is local, grouped by local expert (local, pure)
  experts   each local expert on its block (a partial sum of its h_ffn slice when etp > 1)
  combine   3' un-permute with the gathered router weights [n*T, k] (all-gather, tagged "combine") into
               [n*T, h]: this rank's experts' weighted outputs for every token of the group, zero elsewhere
            2' reduce-scatter over the group: sums every rank's contribution (other experts, other ETP slices)
               and hands each rank back its own T tokens

Backward: the gathers' conjugate is the reduce-scatter (every rank used every token; their gradients add up at
the token's home), the reduce-scatter's is the all-gather. No count exchange and no uneven splits: every rank
gathers the same n*T rows, so the shapes do not depend on the routing. All ranks of the group must route the same
number of tokens T (the gather's agreement check names a mismatch).

Bytes one rank sends per forward (ring): (n-1) T (h b + k 8 + k b) in the gathers (rows, int64 ids, weights) and
(n-1) T h b in the reduce-scatter -- independent of k for the rows, where the all-to-all's grow with k
(`pylib.analysis.ep.dispatcher_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from pylib.runtime import collectives
from pylib.runtime.mesh import AxisGroup
from pylib.runtime.tracer import tag

from .permute import PermutePlan, permute, unpermute


@dataclass(frozen=True)
class AllGatherState:
    """plan: the permutation of the gathered assignments that are local (expert ids relative to `first`)."""

    plan: PermutePlan

    @cached_property
    def rows_per_local_expert(self) -> list[int]:
        return self.plan.tokens_per_expert.tolist()


class AllGatherDispatcher:
    """dispatch(x [T, h], experts [T, k], keep [T, k]) -> rows [R, h] grouped by local expert, and the state;
    combine(y [R, h], state, weights [T, k]) -> out [T, h]."""

    def __init__(self, n_experts: int, group: AxisGroup, first: int, n_local: int):
        self.n_experts, self.group, self.first, self.n_local = n_experts, group, first, n_local

    def dispatch(self, x: torch.Tensor, experts: torch.Tensor, keep: torch.Tensor | None = None):
        ids = experts if keep is None else experts.masked_fill(~keep, self.n_experts)
        with tag("dispatch"):
            xg = collectives.all_gather(x, 0, self.group)
            ids = collectives.all_gather_tensor(ids, 0, self.group)
        local = (ids >= self.first) & (ids < self.first + self.n_local)
        rows, plan = permute(xg, torch.where(local, ids - self.first, 0), self.n_local, local)
        return rows, AllGatherState(plan)

    def combine(self, y: torch.Tensor, state: AllGatherState, weights: torch.Tensor) -> torch.Tensor:
        with tag("combine"):
            wg = collectives.all_gather(weights, 0, self.group)
            out = unpermute(y, state.plan, wg)
            return collectives.reduce_scatter(out, 0, self.group)
