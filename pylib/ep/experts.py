"""The experts one rank holds: E_local = E / ep whole experts, or with ETP a 1/etp slice of each.

ETP cuts each expert's FFN as tensor parallelism cuts a dense MLP (article B's column / row split):

    up_proj, gate_proj  W [h_ffn, h] (torch [out, in])  column-parallel: rows [i * h_ffn/etp, (i+1) * h_ffn/etp)
    down_proj           W [h, h_ffn]                    row-parallel:    columns of the same range

so a rank computes down_i(act(up_i x)) -- a partial sum whose sum over the ETP group is the expert's output (the
dispatcher's reduce-scatter adds them). The nonlinearity is element-wise in h_ffn, so the split is exact.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from pylib.model.mlp import MLP
from pylib.model.v3_storage import cached_swiglu_mlp, gated_expert
from pylib.runtime.sharding import shard

COLUMN = ("gate_proj", "up_proj")  # split along their output rows
ROW = ("down_proj",)  # split along their input columns


class LocalExperts(nn.Module):
    """`experts[l]` is global expert `first + l`, holding h_ffn / etp hidden units (slice `etp_rank`).

    forward(rows [R, h], sizes [E_local]) -> [R, h]: rows are grouped by local expert, sizes[l] rows each.
    swiglu_fp8 (an `Fp8Recipe`, None by default): each SwiGLU expert keeps its input and the SwiGLU's two inputs in
    FP8 and recomputes the SwiGLU output in backward (`pylib.model.v3_storage.cached_swiglu_mlp`, DeepSeek-V3's
    storage that `planner.Workload.storage` prices). With the combine weights handed in (`forward`'s gates) each expert
    applies its rows' weights itself (`gated_expert`, the storage choice "gate_in_expert")."""

    swiglu_fp8 = None

    def __init__(self, full_experts, first: int, count: int, etp_rank: int, etp: int):
        super().__init__()
        self.first, self.count, self.etp_rank, self.etp = first, count, etp_rank, etp
        self.experts = nn.ModuleList()
        for e in range(first, first + count):
            full = full_experts[e]
            d_ff, d_model = full.up_proj.weight.shape
            w = full.up_proj.weight
            local = MLP(d_model, d_ff // etp, full.kind).to(device=w.device, dtype=w.dtype)
            with torch.no_grad():
                for name, p in local.named_parameters():
                    p.copy_(self.slice_of(name, dict(full.named_parameters())[name]))
            self.experts.append(local)

    def slice_of(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's piece of the full expert parameter `name` ("up_proj.weight", ...)."""
        dim = self.split_dim(name)
        what = f"etp={self.etp} does not divide expert h_ffn={full.shape[dim]}"
        return shard(full.detach(), dim, self.etp_rank, self.etp, what)

    @staticmethod
    def split_dim(name: str) -> int:
        """0 for column-parallel weights (up, gate), 1 for the row-parallel down projection."""
        return 0 if name.split(".")[0] in COLUMN else 1

    def global_id(self, local: int) -> int:
        return self.first + local

    def forward(self, rows: torch.Tensor, sizes: list[int], gates: torch.Tensor | None = None) -> torch.Tensor:
        """gates [R] (None: the combine weights are applied at home): each row's combine weight, applied inside its
        expert before the down projection (`pylib.model.v3_storage.gated_expert`)."""
        if sum(sizes) != rows.shape[0]:
            raise ValueError(f"expert block sizes {sizes} sum to {sum(sizes)}, got {rows.shape[0]} rows")
        if gates is not None:
            blocks = zip(self.experts, rows.split(sizes), gates.split(sizes))
            outs = [gated_expert(b, e, g, self.swiglu_fp8) for e, b, g in blocks]
        elif self.swiglu_fp8 is not None:
            outs = [cached_swiglu_mlp(b, e, self.swiglu_fp8) for e, b in zip(self.experts, rows.split(sizes))]
        else:
            outs = [expert(block) for expert, block in zip(self.experts, rows.split(sizes))]
        return torch.cat(outs) if outs else rows
