"""Mixture of experts, single device: the reference every expert-parallel run is compared with.

x [b, s, h] is flattened to T = b*s tokens. The router scores every token against E experts and picks k; each
chosen (token, expert) pair is an *assignment*. An expert computes its MLP on the tokens assigned to it and the
outputs come back weighted by the router. With a capacity factor an expert takes at most
C = ceil((T * k / E) * capacity_factor) assignments; the rest are dropped (their contribution is zero; the
residual connection still carries the token).

Which tokens does the capacity count? Megatron-Core (its default, "sub-sequence dropping") computes C on each rank
from the tokens *that rank routes* and drops locally, before any communication: T above is the rank's own token
count, and each rank keeps at most C assignments per expert of its own tokens (an expert may then receive up to
C from every rank of its expert-parallel group). The reference reproduces that rule with `drop_groups`: a label
per token saying which rank holds it; capacity is then computed and applied per label, over that label's tokens
in their original order. Without labels the whole batch is one group (one rank).

Shared experts (DeepSeek-V2/V3, Qwen-MoE; `cfg.n_shared_experts`) are one dense MLP every token goes through,
its output added to the routed experts' weighted sum: y = shared(x) + sum_j w_j * expert_{e_j}(x).

Group-limited top-k (`cfg.n_groups`, `cfg.topk_groups`; `select_experts`) restricts each token's k experts to its
topk_groups best groups of consecutive experts; with the groups on different nodes it caps the nodes a token's
rows travel to.

The load-balancing and z losses, by contrast, are taken over every token of the call (the union of all ranks'
tokens in an expert-parallel run that reduces them over its ranks).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn as nn

from pylib.plan.config import MoEConfig, expert_capacity

from .mlp import MLP


class Routing(NamedTuple):
    """One routing decision for T tokens."""

    logits: torch.Tensor  # [T, E] router logits
    scores: torch.Tensor  # [T, E] softmax (or sigmoid) of the logits: the P in the aux loss
    experts: torch.Tensor  # [T, k] chosen expert ids (int64)
    weights: torch.Tensor  # [T, k] combine weights of the chosen experts


def select_experts(selection: torch.Tensor, cfg: MoEConfig) -> torch.Tensor:
    """[T, E] selection scores (no gradient; bias included) -> [T, k] expert ids, best first.

    Plain top-k, or with cfg.n_groups > 1 and topk_groups < n_groups group-limited top-k (DeepSeek-V3's router;
    Megatron-Core's group_limited_topk in moe_utils.py): the E experts form n_groups groups of consecutive ids, a
    group scores the sum of its top_k // topk_groups best selection scores (top-2 for V3's k = 8, M = 4), each token
    keeps its topk_groups best groups, and its top_k experts are chosen inside them (the rest masked to -inf)."""
    k, G = cfg.top_k, cfg.n_groups
    M = G if cfg.topk_groups is None else cfg.topk_groups
    if M < G:
        T, E = selection.shape
        group_scores = selection.view(T, G, E // G).topk(k // M, dim=-1).values.sum(-1)
        kept = torch.zeros(T, G, dtype=torch.bool, device=selection.device)
        kept.scatter_(1, group_scores.topk(M, dim=-1).indices, True)
        selection = selection.masked_fill(~kept.repeat_interleave(E // G, dim=1), float("-inf"))
    return torch.topk(selection, k, dim=-1).indices


class Router(nn.Module):
    """Linear gate [h -> E] and top-k selection. x [T, h] -> Routing.

    `expert_bias` [E] (a buffer, no gradient) is added to the scores for *selection only*: the auxiliary-loss-free
    balancing of DeepSeek-V3 nudges it after each step; the combine weights never see it.
    """

    def __init__(self, d_model: int, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        self.gate = nn.Linear(d_model, cfg.n_experts, bias=False)
        bias = torch.zeros(cfg.n_experts, device=self.gate.weight.device)  # where the gate is (moves with .to())
        self.register_buffer("expert_bias", bias, persistent=True)

    def forward(self, x: torch.Tensor) -> Routing:
        cfg, k = self.cfg, self.cfg.top_k
        logits = self.gate(x)
        bias = self.expert_bias.to(logits.dtype)
        if cfg.score == "sigmoid":
            scores = torch.sigmoid(logits)
            experts = select_experts(scores.detach() + bias, cfg)
            weights = scores.gather(-1, experts)
            if k > 1:
                weights = weights / weights.sum(-1, keepdim=True)
        elif cfg.topk_then_softmax:
            scores = torch.softmax(logits, dim=-1)
            experts = select_experts(logits.detach() + bias, cfg)
            weights = torch.softmax(logits.gather(-1, experts), dim=-1)
        else:
            scores = torch.softmax(logits, dim=-1)
            experts = select_experts(scores.detach() + bias, cfg)
            weights = scores.gather(-1, experts)
        return Routing(logits, scores, experts, weights)


def capacity_keep_mask(routing: Routing, cfg: MoEConfig, capacity: int | None) -> torch.Tensor:
    """[T, k] boolean: which assignments survive the capacity limit.

    drop_policy "probs" keeps each expert's `capacity` assignments with the highest combine weight (ties to the
    earlier token); "position" keeps the earliest tokens.
    """
    experts, weights = routing.experts, routing.weights.detach()
    keep = torch.ones_like(experts, dtype=torch.bool)
    if capacity is None:
        return keep
    T, k = experts.shape
    flat_e = experts.reshape(-1)
    order = torch.arange(T * k, device=experts.device)  # token-major: assignment (t, j) is t*k + j
    for e in range(cfg.n_experts):
        idx = order[flat_e == e]
        if idx.numel() <= capacity:
            continue
        if cfg.drop_policy == "probs":
            w = weights.reshape(-1)[idx]
            # stable: sort by weight descending, earlier assignment first among equals
            ranked = idx[torch.sort(-w, stable=True).indices]
        else:
            ranked = idx
        keep.view(-1)[ranked[capacity:]] = False
    return keep


def grouped_keep_mask(routing: Routing, cfg: MoEConfig, drop_groups: torch.Tensor | None) -> torch.Tensor:
    """[T, k] keep mask with the capacity computed and applied separately inside each drop group.

    drop_groups: [T] (or any shape with T elements) integer label per token, e.g. the rank that holds it; None =
    one group. Each group gets C = expert_capacity(its token count) per expert and is ranked over its own tokens
    in their original order -- exactly what each rank of an expert-parallel run computes on its own tokens."""
    T = routing.experts.shape[0]
    if drop_groups is None:
        return capacity_keep_mask(routing, cfg, expert_capacity(T, cfg))
    labels = drop_groups.reshape(-1).to(routing.experts.device)
    if labels.numel() != T:
        raise ValueError(f"drop_groups has {labels.numel()} labels for {T} tokens")
    keep = torch.ones_like(routing.experts, dtype=torch.bool)
    for g in torch.unique(labels).tolist():
        idx = torch.nonzero(labels == g).squeeze(1)
        sub = Routing(*(t[idx] for t in routing))
        keep[idx] = capacity_keep_mask(sub, cfg, expert_capacity(idx.numel(), cfg))
    return keep


def tokens_per_expert(experts: torch.Tensor, n_experts: int, keep: torch.Tensor | None = None) -> torch.Tensor:
    """[E] int64: how many assignments chose each expert (only the kept ones when `keep` is given)."""
    chosen = experts.reshape(-1) if keep is None else experts[keep]
    return torch.bincount(chosen, minlength=n_experts)


def updated_expert_bias(bias: torch.Tensor, counts: torch.Tensor, rate: float) -> torch.Tensor:
    """Auxiliary-loss-free balancing (DeepSeek-V3; Megatron's get_updated_expert_bias):

        b_i <- b_i + rate * sign(mean_j c_j - c_i)

    c = tokens routed to each expert over the step. An overloaded expert's bias drops by `rate`, an underloaded
    one's rises; the bias only shifts which experts are *selected*, never the combine weights."""
    c = counts.to(torch.float64)
    return (bias.to(torch.float64) + rate * torch.sign(c.mean() - c)).to(bias.dtype)


def load_balancing_loss(routing: Routing, n_experts: int, top_k: int) -> torch.Tensor:
    """Switch / Megatron auxiliary loss E * sum_i f_i * P_i.

    f_i = share of the T*k assignments that chose expert i (no gradient), P_i = mean router score of expert i.
    Equals 1 when routing is perfectly uniform."""
    T = routing.scores.shape[0]
    counts = tokens_per_expert(routing.experts, n_experts).to(routing.scores.dtype)
    f = counts / (T * top_k)
    P = routing.scores.mean(0)
    return n_experts * (f * P).sum()


def z_loss(routing: Routing) -> torch.Tensor:
    """Router z-loss mean_t logsumexp(logits_t)^2 (ST-MoE): keeps router logits small."""
    return torch.logsumexp(routing.logits, dim=-1).square().mean()


class AddAuxiliaryLoss(torch.autograd.Function):
    """Forward returns `x` unchanged; backward also sends gradient 1 into `loss`.

    This is how an auxiliary loss joins training without changing the layer's output: whatever loss is later
    taken of the model's output, d(total)/d(loss) = 1 is added (Megatron's MoEAuxLossAutoScaler)."""

    @staticmethod
    def forward(ctx, x, loss):
        ctx.loss_shape, ctx.loss_dtype = loss.shape, loss.dtype
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return dy, torch.ones(ctx.loss_shape, dtype=ctx.loss_dtype, device=dy.device)


def auxiliary_loss(routing: Routing, cfg: MoEConfig) -> torch.Tensor | None:
    """aux_loss_coef * load-balancing + z_loss_coef * z-loss, or None when both coefficients are 0."""
    total = None
    if cfg.aux_loss_coef:
        total = cfg.aux_loss_coef * load_balancing_loss(routing, cfg.n_experts, cfg.top_k)
    if cfg.z_loss_coef:
        z = cfg.z_loss_coef * z_loss(routing)
        total = z if total is None else total + z
    return total


class MoE(nn.Module):
    """Router + E expert MLPs (+ the shared experts). x [b, s, h] -> [b, s, h]; each token's output is
    sum_j w_j * expert_{e_j}(x), plus shared(x) when cfg.n_shared_experts > 0: `shared` is one MLP of
    n_shared_experts * h_ffn(expert) hidden units (DeepSeek-V2/V3 fuse their shared experts the same way).

    After a forward, `last_routing` and `last_keep` hold the decision (detached) for inspection. While gradients
    are enabled, `routed_counts` [E] accumulates the tokens the router sent to each expert (before dropping) until
    `update_expert_bias()` applies the auxiliary-loss-free bias rule and resets it.

    `drop_groups` (argument of forward, or the attribute of the same name when the argument is None): the per-token
    label of the rank that holds each token, so capacity is applied per rank as an expert-parallel run does (see
    the module docstring)."""

    def __init__(self, d_model: int, d_ff: int, cfg: MoEConfig, kind: str = "gelu"):
        super().__init__()
        self.cfg = cfg
        self.router = Router(d_model, cfg)
        self.experts = nn.ModuleList(MLP(d_model, cfg.d_ff or d_ff, kind) for _ in range(cfg.n_experts))
        self.shared = MLP(d_model, cfg.n_shared_experts * (cfg.d_ff or d_ff), kind) if cfg.n_shared_experts else None
        counts = torch.zeros(cfg.n_experts, dtype=torch.int64, device=self.router.gate.weight.device)
        self.register_buffer("routed_counts", counts, persistent=False)
        self.drop_groups: torch.Tensor | None = None
        self.last_routing: Routing | None = None
        self.last_keep: torch.Tensor | None = None

    @torch.no_grad()
    def update_expert_bias(self, rate: float | None = None) -> torch.Tensor:
        """Apply `updated_expert_bias` with the counts accumulated since the last call (rate defaults to
        cfg.bias_update_rate), reset the counts, and return the new bias."""
        rate = self.cfg.bias_update_rate if rate is None else rate
        bias = self.router.expert_bias
        bias.copy_(updated_expert_bias(bias, self.routed_counts, rate))
        self.routed_counts.zero_()
        return bias.clone()

    def forward(self, x: torch.Tensor, drop_groups: torch.Tensor | None = None) -> torch.Tensor:
        shape = x.shape
        xt = x.reshape(-1, shape[-1])
        routing = self.router(xt)
        keep = grouped_keep_mask(routing, self.cfg, self.drop_groups if drop_groups is None else drop_groups)
        if torch.is_grad_enabled():
            self.routed_counts += tokens_per_expert(routing.experts, self.cfg.n_experts)
        out = torch.zeros_like(xt)
        for e, expert in enumerate(self.experts):
            tok, slot = torch.nonzero((routing.experts == e) & keep, as_tuple=True)
            if tok.numel():
                y = expert(xt[tok]) * routing.weights[tok, slot].unsqueeze(-1)
                out = out.index_add(0, tok, y)
        if self.shared is not None:
            out = out + self.shared(xt)
        self.last_routing = Routing(*(t.detach() for t in routing))
        self.last_keep = keep
        aux = auxiliary_loss(routing, self.cfg)
        if aux is not None:
            out = AddAuxiliaryLoss.apply(out, aux)
        return out.view(shape)
