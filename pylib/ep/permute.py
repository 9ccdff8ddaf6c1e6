"""Permute and un-permute: the two pure functions at either end of the expert-parallel dispatcher.

A routing of T tokens to k experts each is a set of *assignments* (token t, choice j) -> expert e. `permute`
copies each kept assignment's token row into one tensor sorted by expert id -- and since rank r of the expert-
parallel group holds the contiguous experts [r * E_local, (r+1) * E_local), sorted by expert id is the same as
grouped by destination rank, then by local expert. Inside one expert, rows keep token order. `unpermute` is the
way back: each row, scaled by its combine weight, is added into its token's output row, so the k copies of a
token are summed (a dropped assignment contributes nothing).

`sort_chunks` regroups rows that arrive as blocks in (a, b) order into (b, a) order, e.g. after the all-to-all
rows come grouped by (source rank, local expert) and the experts want (local expert, source rank).

Nothing here communicates; the property tests check these functions alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PermutePlan:
    """What `permute` did, so `unpermute` can undo it.

    token_index [A]: the source token of each permuted row; slot_index [A]: which of its k choices;
    expert_index [A]: the expert of each row (ascending); tokens_per_expert [E] int64: rows per expert;
    n_tokens: T, the number of input rows."""

    token_index: torch.Tensor
    slot_index: torch.Tensor
    expert_index: torch.Tensor
    tokens_per_expert: torch.Tensor
    n_tokens: int

    def rows_per_rank(self, ep: int) -> torch.Tensor:
        """[ep] int64: rows going to each rank of the expert-parallel group (E/ep consecutive experts each)."""
        return self.tokens_per_expert.view(ep, -1).sum(1)


def permute(
    x: torch.Tensor, experts: torch.Tensor, n_experts: int, keep: torch.Tensor | None = None
) -> tuple[torch.Tensor, PermutePlan]:
    """x [T, h], experts [T, k] (int64 expert ids), keep [T, k] bool (None = keep all) ->
    rows [A, h] (one per kept assignment, sorted by expert, token order inside an expert) and the plan."""
    T, k = experts.shape
    if x.shape[0] != T:
        raise ValueError(f"x has {x.shape[0]} tokens but the routing has {T}")
    flat_e = experts.reshape(-1)
    if flat_e.numel() and (int(flat_e.min()) < 0 or int(flat_e.max()) >= n_experts):
        raise ValueError(f"expert ids must lie in [0, {n_experts}), got {flat_e.min().item()}..{flat_e.max().item()}")
    ids = torch.arange(T * k, device=experts.device)  # assignment (t, j) is t * k + j: token-major
    if keep is not None:
        ids = ids[keep.reshape(-1)]
    ids = ids[torch.sort(flat_e[ids], stable=True).indices]
    token, slot = ids // k, ids % k
    expert = flat_e[ids]
    plan = PermutePlan(token, slot, expert, torch.bincount(expert, minlength=n_experts), T)
    return x[token], plan


def unpermute(
    rows: torch.Tensor, plan: PermutePlan, weights: torch.Tensor | None = None, *, fused: bool = False
) -> torch.Tensor:
    """rows [A, h] in permuted order -> out [T, h] with out[t] = sum over t's kept choices j of w[t, j] * row.

    weights [T, k] (None = 1): the router's combine weights; their gradient flows back to the router.
    fused: the weighting and the sum in one autograd function (`_WeightedUnpermute`), which keeps the rows and
    their weights but not the weighted rows: autograd's index_add saves its source, so the unfused path keeps
    [A, h] twice (the rows for the weights' gradient, the weighted rows for index_add's). With weights None the
    fused sum keeps only the token index (`_SumUnpermute`: rows whose weights the experts applied, "gate_in_expert")."""
    if rows.shape[0] != plan.token_index.numel():
        raise ValueError(f"unpermute got {rows.shape[0]} rows, the plan has {plan.token_index.numel()}")
    if fused and weights is None:
        return _SumUnpermute.apply(rows, plan.token_index, plan.n_tokens)
    if fused:
        w = weights[plan.token_index, plan.slot_index].to(rows.dtype)
        return _WeightedUnpermute.apply(rows, w, plan.token_index, plan.n_tokens)
    if weights is not None:
        rows = rows * weights[plan.token_index, plan.slot_index].unsqueeze(-1).to(rows.dtype)
    out = torch.zeros((plan.n_tokens, *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
    return out.index_add(0, plan.token_index, rows)


class _WeightedUnpermute(torch.autograd.Function):
    """out = zeros[T, h].index_add(0, token, rows * w[:, None]), keeping rows, w and token for backward:
    d rows = w * d out[token], d w = sum over h of rows * d out[token] (DeepSeek-V3's fused combine)."""

    @staticmethod
    def forward(ctx, rows, w, token, n_tokens):
        ctx.save_for_backward(rows, w, token)
        out = rows.new_zeros((n_tokens, *rows.shape[1:]))
        return out.index_add_(0, token, rows * w.unsqueeze(-1))

    @staticmethod
    def backward(ctx, dout):
        rows, w, token = ctx.saved_tensors
        g = dout[token]
        return g * w.unsqueeze(-1), (g * rows).sum(-1), None, None


class _SumUnpermute(torch.autograd.Function):
    """out = zeros[T, h].index_add(0, token, rows), keeping token alone: d rows = d out[token]."""

    @staticmethod
    def forward(ctx, rows, token, n_tokens):
        ctx.save_for_backward(token)
        return rows.new_zeros((n_tokens, *rows.shape[1:])).index_add_(0, token, rows)

    @staticmethod
    def backward(ctx, dout):
        (token,) = ctx.saved_tensors
        return dout[token], None, None


def sort_chunks(rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Regroup rows from (a, b) block order to (b, a) block order.

    counts [A, B] int: rows arrive as A*B consecutive blocks, block (a, b) holding counts[a, b] rows, a outermost.
    Returns the same rows with the blocks reordered so b is outermost. `sort_chunks(y, counts.T)` undoes it."""
    counts = torch.as_tensor(counts)
    if counts.dim() != 2:
        raise ValueError(f"counts must be a 2-D block-count matrix, got shape {tuple(counts.shape)}")
    sizes = counts.reshape(-1).tolist()  # host-side split sizes: one device sync on a GPU
    if sum(sizes) != rows.shape[0]:
        raise ValueError(f"block counts sum to {sum(sizes)} but there are {rows.shape[0]} rows")
    A, B = counts.shape
    blocks = rows.split(sizes)
    return torch.cat([blocks[a * B + b] for b in range(B) for a in range(A)]) if sizes else rows
