"""The position-wise MLP (FFN): every token alone through the same weights (article A's green zone).

GELU:   down(gelu(up x))                 up [h -> h_ffn], down [h_ffn -> h]
SwiGLU: down(silu(gate x) * up x)         gate and up [h -> h_ffn], down [h_ffn -> h]
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """x [..., h] -> [..., h] through h_ffn = d_ff hidden units."""

    def __init__(self, d_model: int, d_ff: int, kind: str = "gelu"):
        super().__init__()
        self.kind = kind
        if kind == "swiglu":
            self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """The FFN intermediate activation [..., h_ffn] (after the nonlinearity)."""
        if self.kind == "swiglu":
            return F.silu(self.gate_proj(x)) * self.up_proj(x)
        return F.gelu(self.up_proj(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.hidden(x))
