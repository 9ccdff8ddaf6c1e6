"""Vocab-parallel cross-entropy: the loss of logits split over the vocabulary, never gathered.

Rank r holds z_r = logits[..., r*V/t : (r+1)*V/t] ([b, s, V/t]). For one token with target y:

    loss = log sum_v exp(z_v) - z_y = log sum_v exp(z_v - m) - (z_y - m),   m = max_v z_v

Three all-reduces over TP, each of b*s numbers (not b*s*V):
    1. m = max over ranks of the local max                (op "max"; for stability only, no gradient needed)
    2. z_y - m: the rank owning y contributes it, others 0  (sum)
    3. sum of exp(z - m): each rank sums its own columns    (sum)

Backward is local: d loss / d z_v = softmax(z)_v - [v == y], and each rank has its columns of the softmax
(exp(z - m) / the all-reduced sum) and knows whether it owns y. No communication.

A padded vocabulary (`pylib.plan.vocab`: V_p columns, of which only the first V are tokens): given vocab_size=V,
`mask_padded_logits` sets columns V..V_p-1 to -inf first, so exp gives 0 there: the padded ids get no
probability, no gradient, and the loss is the unpadded one. Targets must lie in [0, V).
"""

from __future__ import annotations

import torch

from pylib.model.data import check_tokens
from pylib.runtime import collectives as C
from pylib.runtime.tracer import current_tag


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, g, tag):
        z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
        per_rank = z.shape[-1]
        start = g.rank * per_rank
        m = z.detach().amax(dim=-1).contiguous()
        C.all_reduce_(m, g, op="max", tag=f"{tag}.max".lstrip("."))
        shifted = z - m.unsqueeze(-1)
        mine = (targets >= start) & (targets < start + per_rank)
        local_t = torch.where(mine, targets - start, torch.zeros_like(targets))
        target_logit = shifted.gather(-1, local_t.unsqueeze(-1)).squeeze(-1).masked_fill(~mine, 0.0).contiguous()
        C.all_reduce_(target_logit, g, tag=f"{tag}.target_logit".lstrip("."))
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1).contiguous()
        C.all_reduce_(sum_exp, g, tag=f"{tag}.sum_exp".lstrip("."))
        softmax = exp.div_(sum_exp.unsqueeze(-1))  # my columns of softmax(z)
        ctx.save_for_backward(softmax, local_t, mine)
        ctx.in_dtype = logits.dtype
        return torch.log(sum_exp) - target_logit

    @staticmethod
    def backward(ctx, dloss):
        softmax, local_t, mine = ctx.saved_tensors
        grad = softmax.clone()
        onehot = torch.zeros_like(grad).scatter_(-1, local_t.unsqueeze(-1), 1.0) * mine.unsqueeze(-1)
        grad = (grad - onehot) * dloss.unsqueeze(-1)
        return grad.to(ctx.in_dtype), None, None, None


def mask_padded_logits(local_logits: torch.Tensor, vocab_size: int, group=None) -> torch.Tensor:
    """This rank's logits [b, s, V_p/t] with the columns of padded ids (global index >= vocab_size) set to -inf:
    softmax gives them 0, so they are never sampled and add nothing to the loss; their gradient is 0. Unchanged
    (the same tensor) on a rank that holds no padded column."""
    g = C.resolve_group(group)
    width = local_logits.shape[-1]
    start = g.rank * width
    if start + width <= vocab_size:
        return local_logits
    padded = torch.arange(start, start + width, device=local_logits.device) >= vocab_size
    return local_logits.masked_fill(padded, float("-inf"))


def vocab_parallel_cross_entropy(
    local_logits: torch.Tensor, targets: torch.Tensor, group=None, vocab_size: int | None = None
) -> torch.Tensor:
    """Per-token cross-entropy [b, s] from this rank's vocabulary slice local_logits [b, s, V/t] and the global
    target ids [b, s] (the same on every TP rank). Rank r's slice is vocabulary [r*V/t, (r+1)*V/t).
    vocab_size: V when the logits' V_p = t * width is padded (columns V..V_p-1 masked, targets below V); None: V_p.

    The result is the same on every TP rank; `.mean()` is the reference model's loss."""
    g = C.resolve_group(group)
    if targets.shape != local_logits.shape[:-1]:
        raise ValueError(
            f"targets {tuple(targets.shape)} must match logits {tuple(local_logits.shape)} without the vocabulary dim"
        )
    padded = local_logits.shape[-1] * g.size
    if vocab_size is None:
        vocab_size = padded
    elif not 0 < vocab_size <= padded:
        raise ValueError(
            f"vocab_size={vocab_size} must be in [1, {padded}], the {g.size} ranks' logits' width "
            f"{local_logits.shape[-1]} times {g.size}"
        )
    check_tokens(targets, vocab_size, "targets")  # a target no rank owns: loss log(sum exp)
    local_logits = mask_padded_logits(local_logits, vocab_size, g)
    return _VocabParallelCrossEntropy.apply(local_logits, targets, g, current_tag())
