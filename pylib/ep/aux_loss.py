"""The router's auxiliary losses over the tokens of several ranks, each rank adding its share.

The reference takes, over the T tokens of one batch,

    load balancing   L_aux = E * sum_i f_i * P_i,   f_i = N_i / (T k),   P_i = (1/T) sum_x p_x,i
    z-loss           L_z   = (1/T) sum_x logsumexp(logits_x)^2

When the batch is spread over the ranks of a group (sequence shards under SP/CP, or any ranks whose tokens form
one batch), N_i and T are sums over the ranks (one all-reduce of E + 1 numbers, no gradient needed: f is a count),
and the sums over x split by rank. So rank r adds

    L_aux,r = E * sum_i f_i * (1/T) sum_{x on r} p_x,i         L_z,r = (1/T) sum_{x on r} lse_x^2

and sum_r L_r equals the reference loss on the union of the tokens -- its gradient too, once the router's
gradient is summed over the ranks (what `ExpertParallelMoE.reduce_router_grad` and, in a full model, the data-
parallel gradient all-reduce do). This is Megatron-Core's switch_load_balancing_loss_func with tokens_per_expert
reduced over its tp-cp group (the ranks holding pieces of the same sequences).
"""

from __future__ import annotations

import torch

from pylib.model.moe import Routing, tokens_per_expert
from pylib.plan.config import MoEConfig
from pylib.runtime import collectives
from pylib.runtime.tracer import tag


def group_token_stats(routing: Routing, n_experts: int, group=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(N [E], T): assignments per expert and tokens, summed over `group` (None = this rank alone)."""
    counts = tokens_per_expert(routing.experts, n_experts).to(torch.float64)
    n_tokens = torch.tensor([float(routing.experts.shape[0])], dtype=torch.float64, device=counts.device)
    stats = torch.cat([counts, n_tokens])
    if group is not None:
        with tag("aux"):
            collectives.all_reduce_(stats, group)
    return stats[:n_experts], stats[n_experts]


def group_aux_loss(routing: Routing, cfg: MoEConfig, group=None) -> torch.Tensor | None:
    """This rank's share of aux_loss_coef * L_aux + z_loss_coef * L_z over the union of `group`'s tokens
    (None = this rank's tokens only), or None when both coefficients are 0."""
    if not (cfg.aux_loss_coef or cfg.z_loss_coef):
        return None
    N, T = group_token_stats(routing, cfg.n_experts, group)
    dtype = routing.scores.dtype
    total = torch.zeros((), dtype=dtype, device=routing.scores.device)
    if cfg.aux_loss_coef:
        f = (N / (T * cfg.top_k)).to(dtype)
        P_share = routing.scores.sum(0) / T.to(dtype)
        total = total + cfg.aux_loss_coef * cfg.n_experts * (f * P_share).sum()
    if cfg.z_loss_coef:
        total = total + cfg.z_loss_coef * torch.logsumexp(routing.logits, dim=-1).square().sum() / T.to(dtype)
    return total
