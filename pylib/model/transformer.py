"""The reference model: a Pre-LN decoder on one device. Every parallel mode shards *this*.

ids [b, s] -> embed -> x [b, s, h]
per layer:  x = x + attn(ln1(x))        (1) LN  (2) QKV  (3) attention  (4) W_o + residual
            x = x + mlp(ln2(x))         (5) LN  (6) MLP + residual
ln_f -> lm_head -> logits [b, s, V]
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from pylib.plan.config import ModelConfig

from .attention import Attention
from .data import check_tokens
from .dtype import torch_dtype
from .mlp import MLP
from .moe import MoE


class Block(nn.Module):
    """One Transformer layer. x [b, s, h] -> [b, s, h]."""

    def __init__(self, cfg: ModelConfig, index: int = 0):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        if cfg.is_moe_layer(index):
            self.mlp = MoE(cfg.d_model, cfg.d_ff, cfg.moe, cfg.mlp)
        else:
            self.mlp = MLP(cfg.d_model, cfg.d_ff, cfg.mlp)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), positions)
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """Embedding, `n_layers` blocks, final LayerNorm, LM head. ids [b, s] -> logits [b, s, V]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)  # [V, h]
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)  # [h, V] (torch stores [V, h])
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(check_tokens(ids, self.cfg.vocab_size, "ids"))
        for layer in self.layers:
            x = layer(x, positions)
        return self.lm_head(self.ln_f(x))

    def loss(self, ids: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Mean next-token cross-entropy over every position of every sequence."""
        logits = self(ids, positions).reshape(-1, self.cfg.vocab_size)
        if logits.dtype in (torch.bfloat16, torch.float16):
            logits = logits.float()
        return F.cross_entropy(logits, check_tokens(targets, self.cfg.vocab_size, "targets").reshape(-1))


def build_model(cfg: ModelConfig) -> Transformer:
    """The reference model with deterministic weights: PyTorch's default init after manual_seed(cfg.seed),
    cast to cfg.dtype. The caller's random state is left untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = Transformer(cfg)
    return model.to(torch_dtype(cfg.dtype))
