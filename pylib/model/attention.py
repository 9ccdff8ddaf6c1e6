"""Self-attention: the one place a Transformer layer mixes tokens (article A's "red light").

Shapes: x [b, s, h]; q [b, n_head, s, d_head]; k, v [b, n_kv_head, s, d_head]. With GQA each group of
n_head / n_kv_head query heads shares one K/V head: query head i reads K/V head i // (n_head / n_kv_head).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from pylib.plan.config import ModelConfig
from pylib.plan.heads import kv_group_problem


def expand_kv(k: torch.Tensor, n_head: int) -> torch.Tensor:
    """[b, n_kv_head, s, d] -> [b, n_head, s, d] by repeating each K/V head for its group of query heads."""
    n_kv = k.shape[1]
    if problem := kv_group_problem(n_head, n_kv):
        raise ValueError(problem)
    return k if n_kv == n_head else k.repeat_interleave(n_head // n_kv, dim=1)


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """[s_q, s_k] boolean: True where query position may attend key position (k_pos <= q_pos)."""
    return k_pos[None, :] <= q_pos[:, None]


def attention_core(q, k, v, *, causal: bool, scale: float | None = None, q_pos=None, k_pos=None) -> torch.Tensor:
    """softmax(q k^T * scale [+ causal mask]) v, in plain torch.

    q [b, n_head, s_q, d]; k, v [b, n_kv_head, s_k, d] -> [b, n_head, s_q, d]. Positions (global token indices,
    default 0..s-1) define the causal mask, so a rank holding a slice of the sequence passes its own positions.
    """
    n_head, d = q.shape[1], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    k, v = expand_kv(k, n_head), expand_kv(v, n_head)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [b, n_head, s_q, s_k]
    if causal:
        q_pos = torch.arange(q.shape[2], device=q.device) if q_pos is None else q_pos
        k_pos = torch.arange(k.shape[2], device=q.device) if k_pos is None else k_pos
        scores = scores.masked_fill(~causal_mask(q_pos.to(q.device), k_pos.to(q.device)), float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding (rotate-half form) of x [b, heads, s, d_head] at integer `positions` [s]."""
    d = x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d))
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [s, d/2]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    """QKV projections, attention, output projection. x [b, s, h] -> [b, s, h].

    `core` computes attention from q, k, v and positions; the parallel modes swap it (ring attention, Ulysses)
    without touching the projections.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        h, dh = cfg.d_model, cfg.d_head
        self.q_proj = nn.Linear(h, cfg.n_heads * dh, bias=False)  # W_Q [h, h]  (torch stores [out, in])
        self.k_proj = nn.Linear(h, cfg.kv_heads * dh, bias=False)  # W_K [h, h_kv]
        self.v_proj = nn.Linear(h, cfg.kv_heads * dh, bias=False)  # W_V [h, h_kv]
        self.o_proj = nn.Linear(cfg.n_heads * dh, h, bias=False)  # W_O [h, h]

    def project(self, x: torch.Tensor, positions: torch.Tensor | None = None):
        """x [b, s, h] -> q [b, n_head, s, d_head], k, v [b, n_kv_head, s, d_head] (heads from the weights' widths)."""
        b, s, _ = x.shape
        dh = self.cfg.d_head
        q = self.q_proj(x).view(b, s, -1, dh).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, dh).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, dh).transpose(1, 2)
        if self.cfg.position == "rope":
            pos = torch.arange(s, device=x.device) if positions is None else positions
            q, k = rope(q, pos, self.cfg.rope_base), rope(k, pos, self.cfg.rope_base)
        return q, k, v

    def core(self, q, k, v, positions=None) -> torch.Tensor:
        return attention_core(q, k, v, causal=self.cfg.causal, q_pos=positions, k_pos=positions)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.project(x, positions)
        o = self.core(q, k, v, positions)  # [b, n_head, s, d_head]
        return self.o_proj(o.transpose(1, 2).reshape(b, s, -1))
