"""Mixture of experts, single device: the reference every expert-parallel run is compared with.

x [b, s, h] is flattened to T = b*s tokens. The router scores every token against E experts and picks k; each
chosen (token, expert) pair is an *assignment*. An expert computes its MLP on the tokens assigned to it and the
outputs come back weighted by the router. With a capacity factor an expert takes at most
C = ceil(capacity_factor * T * k / E) assignments; the rest are dropped (their contribution is zero; the
residual connection still carries the token).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn as nn

from .config import MoEConfig
from .mlp import MLP


class Routing(NamedTuple):
    """One routing decision for T tokens."""

    logits: torch.Tensor  # [T, E] router logits
    scores: torch.Tensor  # [T, E] softmax (or sigmoid) of the logits: the P in the aux loss
    experts: torch.Tensor  # [T, k] chosen expert ids (int64)
    weights: torch.Tensor  # [T, k] combine weights of the chosen experts


class Router(nn.Module):
    """Linear gate [h -> E] and top-k selection. x [T, h] -> Routing.

    `expert_bias` [E] (a buffer, no gradient) is added to the scores for *selection only*: the auxiliary-loss-free
    balancing of DeepSeek-V3 nudges it after each step; the combine weights never see it.
    """

    def __init__(self, d_model: int, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        self.gate = nn.Linear(d_model, cfg.n_experts, bias=False)
        self.register_buffer("expert_bias", torch.zeros(cfg.n_experts), persistent=True)

    def forward(self, x: torch.Tensor) -> Routing:
        cfg, k = self.cfg, self.cfg.top_k
        logits = self.gate(x)
        bias = self.expert_bias.to(logits.dtype)
        if cfg.score == "sigmoid":
            scores = torch.sigmoid(logits)
            experts = torch.topk(scores.detach() + bias, k, dim=-1).indices
            weights = scores.gather(-1, experts)
            weights = weights / weights.sum(-1, keepdim=True)
        elif cfg.topk_then_softmax:
            scores = torch.softmax(logits, dim=-1)
            experts = torch.topk(logits.detach() + bias, k, dim=-1).indices
            weights = torch.softmax(logits.gather(-1, experts), dim=-1)
        else:
            scores = torch.softmax(logits, dim=-1)
            experts = torch.topk(scores.detach() + bias, k, dim=-1).indices
            weights = scores.gather(-1, experts)
        return Routing(logits, scores, experts, weights)


def expert_capacity(n_tokens: int, cfg: MoEConfig) -> int | None:
    """C = ceil(capacity_factor * T * k / E), or None when nothing is dropped."""
    if cfg.capacity_factor is None:
        return None
    return math.ceil(cfg.capacity_factor * n_tokens * cfg.top_k / cfg.n_experts)


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


def load_balancing_loss(routing: Routing, n_experts: int, top_k: int) -> torch.Tensor:
    """Switch / Megatron auxiliary loss E * sum_i f_i * P_i.

    f_i = share of the T*k assignments that chose expert i (no gradient), P_i = mean router score of expert i.
    Equals 1 when routing is perfectly uniform."""
    T = routing.scores.shape[0]
    counts = torch.bincount(routing.experts.reshape(-1), minlength=n_experts).to(routing.scores.dtype)
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
    """Router + E expert MLPs. x [b, s, h] -> [b, s, h]; each token's output is sum_j w_j * expert_{e_j}(x).

    After a forward, `last_routing` and `last_keep` hold the decision (detached) for inspection."""

    def __init__(self, d_model: int, d_ff: int, cfg: MoEConfig, kind: str = "gelu"):
        super().__init__()
        self.cfg = cfg
        self.router = Router(d_model, cfg)
        self.experts = nn.ModuleList(MLP(d_model, cfg.d_ff or d_ff, kind) for _ in range(cfg.n_experts))
        self.last_routing: Routing | None = None
        self.last_keep: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        xt = x.reshape(-1, shape[-1])
        routing = self.router(xt)
        keep = capacity_keep_mask(routing, self.cfg, expert_capacity(xt.shape[0], self.cfg))
        out = torch.zeros_like(xt)
        for e, expert in enumerate(self.experts):
            tok, slot = torch.nonzero((routing.experts == e) & keep, as_tuple=True)
            if tok.numel():
                y = expert(xt[tok]) * routing.weights[tok, slot].unsqueeze(-1)
                out = out.index_add(0, tok, y)
        self.last_routing = Routing(*(t.detach() for t in routing))
        self.last_keep = keep
        aux = auxiliary_loss(routing, self.cfg)
        if aux is not None:
            out = AddAuxiliaryLoss.apply(out, aux)
        return out.view(shape)
