"""The all-to-all token dispatcher: send each token to the ranks holding its experts, and bring the results home.

Rank r of the expert-parallel (EP) group holds experts [r * E_local, (r+1) * E_local), E_local = E / ep. With
expert tensor parallelism (ETP) every rank of an ETP group holds the same experts, each a 1/etp slice of h_ffn,
and the ranks of an ETP group hold *different* tokens (as under sequence parallelism). Article A section 6:

  dispatch   1 count     tokens_per_expert [E] from the routing                            (local)
             2 exchange  send my counts for rank j's experts to rank j: recv_counts [ep, E_local]
                         (all-to-all of E integers, tagged "counts")
             3 permute   rows grouped by destination rank, then local expert               (local, pure)
             4 all-to-all  uneven splits: my rows for rank j go to rank j                  (tagged "dispatch")
             5 ETP       all-gather the received rows (and their counts) over the ETP group (tagged "dispatch")
             6 regroup   (source, local expert) blocks -> (local expert, source) blocks     (local, pure)
  experts    each local expert runs on its contiguous block (a partial sum when etp > 1)
  combine    6' regroup back, 5' reduce-scatter over ETP (sums the partial outputs, each rank keeps the rows it
             contributed), 4' all-to-all back (splits swapped, tagged "combine"), 3' un-permute: each row times
             its router weight, added into its token's output: the weighted sum of the k copies.

Backward runs the same exchanges in reverse order (the all-to-all's conjugate is the all-to-all with the splits
swapped; the ETP all-gather's is the reduce-scatter), each tagged as the forward op it undoes.

Pad to capacity (`capacity` given to `dispatch`; Megatron's --moe-pad-expert-input-to-capacity): step 3 places
expert e's rows at [e*C, e*C + n_e) of a zero tensor [E*C, h], so every split is C rows per expert whatever the
routing -- fixed shapes, no count exchange (step 2 is skipped: the counts are known), and each local expert gets
exactly ep*C (etp*ep*C with ETP) rows, padding included. Step 3' drops the padding rows again. The zero rows cost
bytes and expert FLOPs but change nothing: an expert without bias maps 0 to 0, and the rows are never combined.

Megatron-Core's MoEAlltoAllTokenDispatcher follows the same steps; it also ships the router probabilities with
the tokens and applies them at the experts, where we apply them at home in step 3' (nothing extra to send).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from pylib.runtime import collectives
from pylib.runtime.mesh import AxisGroup
from pylib.runtime.tracer import tag

from .permute import PermutePlan, permute, sort_chunks, unpermute


@dataclass(frozen=True)
class DispatchState:
    """Everything `combine` needs to reverse a `dispatch`.

    plan: the local permutation. send_counts [ep, E_local]: my rows for each rank's local experts.
    recv_counts [ep, E_local]: rows each source rank sent to my local experts. chunk_counts [etp * ep, E_local]:
    rows per (ETP member, source rank, local expert) after the ETP all-gather (= recv_counts when etp = 1).
    etp_rows [etp]: rows each ETP member received in the all-to-all.
    pad_index [A] (pad to capacity only): where each permuted row sits in the padded [E*C, h] tensor.
    gathered: etp_rows as `collectives.gather_sizes` gave them with chunk_counts (etp > 1 without a capacity)."""

    plan: PermutePlan
    send_counts: torch.Tensor
    recv_counts: torch.Tensor
    chunk_counts: torch.Tensor
    etp_rows: list[int]
    pad_index: torch.Tensor | None = None
    # the all-to-all's splits as `exchange_splits` gave them (agreed by construction, so not checked again);
    # None under a capacity, where every rank sends C rows per expert and the splits are checked as given
    exchanged: collectives.ExchangedSplits | None = None
    # etp_rows summed from the counts every ETP member all-gathered (`gather_sizes`): every member holds the same
    # list, so the ETP all-gather and reduce-scatter skip the row-count check; None when etp = 1 or under a
    # capacity (there each member derives its list from its own capacity, so the list is checked as given)
    gathered: collectives.GatheredSizes | None = None

    # Host-side lists (the all-to-alls and the experts' split need ints): each costs one device sync, so each is
    # computed once per dispatch and reused by the experts, the combine and whoever inspects the state.
    @cached_property
    def rows_per_local_expert(self) -> list[int]:
        return self.chunk_counts.sum(0).tolist()

    @cached_property
    def input_splits(self) -> list[int]:
        return list(self.exchanged.input) if self.exchanged else self.send_counts.sum(1).tolist()

    @cached_property
    def output_splits(self) -> list[int]:
        return list(self.exchanged.output) if self.exchanged else self.recv_counts.sum(1).tolist()

    @property
    def etp_sizes(self):
        """The ETP all-gather's / reduce-scatter's row counts as `all_gather_uneven` takes them: the
        `GatheredSizes` when the counts were gathered, else the list (checked on every call)."""
        return self.gathered if self.gathered is not None else self.etp_rows

    def splits(self, back: bool = False) -> tuple:
        """(output_splits, input_splits) of the dispatch's all-to-all (`back`: the combine's), as
        `all_to_all_uneven` takes them: the `ExchangedSplits` alone when the counts were exchanged."""
        if self.exchanged is not None:
            return (self.exchanged.swapped() if back else self.exchanged, None)
        return (self.input_splits, self.output_splits) if back else (self.output_splits, self.input_splits)


class AllToAllDispatcher:
    """Moves token rows between the ranks of `ep_group` (and gathers them inside `etp_group`).

    dispatch(x [T, h], experts [T, k], keep [T, k]) -> rows [R, h] grouped by local expert, and the state;
    combine(y [R, h], state, weights [T, k]) -> out [T, h].
    fused_unpermute: the combine's weighting and sum as one function keeping the expert outputs once
    (`unpermute(fused=True)`, DeepSeek-V3's storage that `planner.Workload.storage` prices); off by default.
    gate_in_expert: the combine weights travel with the rows (`dispatch_gates`, one value a row, tagged "dispatch")
    and the experts apply them (`LocalExperts.forward`'s gates), so the combine is a plain sum that keeps no expert
    output (the storage choice "gate_in_expert"); off by default. `ExpertParallelMoE.forward` and the overlapped
    forward (`pylib.ep.overlap.moe_steps`, the weights in flight with their rows) read both."""

    def __init__(self, n_experts: int, ep_group: AxisGroup, etp_group: AxisGroup):
        self.n_experts, self.ep_group, self.etp_group = n_experts, ep_group, etp_group
        self.ep, self.etp = ep_group.size, etp_group.size
        self.n_local = n_experts // self.ep
        self.fused_unpermute = False
        self.gate_in_expert = False

    def prepare(self, x: torch.Tensor, experts: torch.Tensor, keep: torch.Tensor | None, capacity: int | None):
        """Everything `dispatch` does before its all-to-all: the rows permuted (padded to `capacity`) and the
        counts exchanged (and, with etp > 1, gathered over ETP): (rows, DispatchState). `pylib.ep.overlap` issues
        the all-to-all after it without waiting."""
        rows, plan = permute(x, experts, self.n_experts, keep)
        pad_index, exchanged, gathered = None, None, None
        if capacity is not None:
            rows, pad_index = self._pad(rows, plan, capacity)
            send_counts = torch.full((self.ep, self.n_local), capacity, dtype=torch.int64, device=x.device)
            recv_counts = send_counts  # every rank sends C per expert: nothing to exchange
            chunk_counts = send_counts.repeat(self.etp, 1)
        else:
            send_counts = plan.tokens_per_expert.view(self.ep, self.n_local)
            with tag("counts"):
                recv_counts, exchanged = collectives.exchange_splits(plan.tokens_per_expert, self.ep_group)
                recv_counts = recv_counts.view(self.ep, self.n_local)
                if self.etp > 1:  # every ETP member gets the same counts, and sums the same row counts from them
                    every, gathered = collectives.gather_sizes(recv_counts, self.etp_group)
                    chunk_counts = every.view(self.etp * self.ep, self.n_local)
                else:
                    chunk_counts = recv_counts
        etp_rows = list(gathered.sizes) if gathered else chunk_counts.view(self.etp, -1).sum(1).tolist()
        state = DispatchState(plan, send_counts, recv_counts, chunk_counts, etp_rows, pad_index, exchanged, gathered)
        return rows, state

    def dispatch(
        self, x: torch.Tensor, experts: torch.Tensor, keep: torch.Tensor | None = None, capacity: int | None = None
    ):
        """capacity: pad every expert's rows to exactly C (None = send only the kept rows)."""
        rows, state = self.prepare(x, experts, keep, capacity)
        return self._send(rows, state), state

    def _send(self, rows: torch.Tensor, state: DispatchState) -> torch.Tensor:
        """Rows laid out as `prepare` sends them -> where they go, grouped by local expert: the all-to-all (and,
        with etp > 1, the ETP all-gather), tagged "dispatch"."""
        with tag("dispatch"):
            rows = collectives.all_to_all_uneven(rows, *state.splits(), self.ep_group)
            if self.etp > 1:
                rows = collectives.all_gather_uneven(rows, state.etp_sizes, self.etp_group)
        return sort_chunks(rows, state.chunk_counts)

    def gate_rows(self, weights: torch.Tensor, state: DispatchState) -> torch.Tensor:
        """The combine weights [T, k] laid out as `prepare` lays out the rows it sends: [rows sent, 1] (zeros at the
        padding under a capacity), for `dispatch_gates` and for `pylib.ep.overlap`'s async exchange of them."""
        plan = state.plan
        w = weights[plan.token_index, plan.slot_index].unsqueeze(-1)
        if state.pad_index is not None:  # [E C, 1] as `_pad` lays the rows out
            w = w.new_zeros((int(state.send_counts.sum()), 1)).index_copy(0, state.pad_index, w)
        return w

    def dispatch_gates(self, weights: torch.Tensor, state: DispatchState) -> torch.Tensor:
        """The combine weights [T, k] of a `dispatch`'s kept assignments, sent where their rows went and in the same
        order: [R], one per row the local experts received (0 for a padding row). Their gradient comes home by the
        same exchanges backward."""
        return self._send(self.gate_rows(weights, state), state).squeeze(-1)

    def combine(self, y: torch.Tensor, state: DispatchState, weights: torch.Tensor | None = None) -> torch.Tensor:
        y = sort_chunks(y, state.chunk_counts.T)
        with tag("combine"):
            if self.etp > 1:
                y = collectives.reduce_scatter_uneven(y, state.etp_sizes, self.etp_group)
            y = collectives.all_to_all_uneven(y, *state.splits(back=True), self.ep_group)
        return self.unpermute_home(y, state, weights)

    def unpermute_home(self, y: torch.Tensor, state: DispatchState, weights: torch.Tensor | None) -> torch.Tensor:
        """The combine's last part, once the rows are home: [rows sent, h] -> each token's weighted sum of its k
        expert outputs [T, h] (weights None: the experts applied them, a plain sum), fused as this dispatcher's
        storage choices say (`fused_unpermute`, and always with `gate_in_expert`)."""
        if state.pad_index is not None:
            y = y[state.pad_index]
        return unpermute(y, state.plan, weights, fused=self.fused_unpermute or self.gate_in_expert)

    def _pad(self, rows: torch.Tensor, plan: PermutePlan, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        """rows [A, h] sorted by expert -> [E*C, h] with expert e's n_e <= C rows first in its block of C."""
        counts = plan.tokens_per_expert
        if int(counts.max()) > capacity:
            raise ValueError(f"an expert has {int(counts.max())} rows, more than its capacity C={capacity}")
        start = torch.cumsum(counts, 0) - counts  # first permuted row of each expert
        e = plan.expert_index
        pad_index = e * capacity + torch.arange(e.numel(), device=e.device) - start[e]
        padded = rows.new_zeros((self.n_experts * capacity, *rows.shape[1:]))
        return padded.index_copy(0, pad_index, rows), pad_index
