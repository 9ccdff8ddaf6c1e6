"""Tensor-parallel MLP: column-parallel up (and gate), row-parallel down, h_ffn split over the TP ranks.

GELU:   rank r holds W_up rows [r*h_ffn/t, (r+1)*h_ffn/t) and the same columns of W_down; the nonlinearity is
        element-wise, so gelu of my slice is my slice of gelu.
SwiGLU: silu(gate x) * (up x) multiplies gate and up unit by unit, so rank r keeps the *same* slice of both
        (the pairing that lets the product stay local).
x [b, s, h] (TP) or [b, s/t, h] (SP) -> the same shape; the hidden activation is [b, s, h_ffn/t] on each rank.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from pylib.runtime import ShardSpec
from pylib.runtime import collectives as C
from pylib.runtime.tracer import current_tag

from .linear import ColumnParallelLinear, RowParallelLinear
from .regions import column_parallel_linears


class TPMLP(nn.Module):
    def __init__(self, up_proj, down_proj, gate_proj, kind, group, *, sequence_parallel, regather):
        super().__init__()
        self.kind = kind
        if gate_proj is not None:
            self.gate_proj = gate_proj
        self.up_proj, self.down_proj = up_proj, down_proj
        self.group, self.sequence_parallel, self.regather = group, sequence_parallel, regather

    @classmethod
    def from_full(cls, mlp, *, group=None, sequence_parallel: bool = False, regather: bool = False):
        """Keep this rank's slice of h_ffn of a reference `pylib.model.MLP` (GELU or SwiGLU)."""
        g = C.resolve_group(group)
        if not hasattr(mlp, "up_proj"):
            raise TypeError(
                f"TPMLP shards a dense MLP, got {type(mlp).__name__}; an MoE layer's experts are split "
                "by expert parallelism (pylib.ep)"
            )
        kw = dict(group=g, sequence_parallel=sequence_parallel, regather=regather)
        up = ColumnParallelLinear.from_full(mlp.up_proj, what="d_ff", **kw)
        gate = ColumnParallelLinear.from_full(mlp.gate_proj, what="d_ff", **kw) if mlp.kind == "swiglu" else None
        down = RowParallelLinear.from_full(mlp.down_proj, group=g, sequence_parallel=sequence_parallel, what="d_ff")
        return cls(up, down, gate, mlp.kind, g, sequence_parallel=sequence_parallel, regather=regather)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """Enter the TP region and compute my slice of the hidden activation [b, s, h_ffn/t]."""
        col = [self.gate_proj, self.up_proj] if self.kind == "swiglu" else [self.up_proj]
        ys = column_parallel_linears(
            x,
            [c.weight for c in col],
            [c.bias for c in col],
            self.group,
            sequence_parallel=self.sequence_parallel,
            regather=self.regather,
            tag=current_tag(),
        )
        if self.kind == "swiglu":
            return F.silu(ys[0]) * ys[1]
        return F.gelu(ys[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.hidden(x))

    def shard_specs(self, prefix: str = "") -> list[ShardSpec]:
        names = (["gate_proj"] if self.kind == "swiglu" else []) + ["up_proj", "down_proj"]
        return [s for n in names for s in getattr(self, n).shard_specs(f"{prefix}{n}.")]
