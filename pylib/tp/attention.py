"""Tensor-parallel attention: heads split over the TP ranks.

Rank r computes n_head/t query heads end to end: its slice of W_Q, W_K, W_V (column-parallel), attention on
its heads over the whole sequence, and its slice of W_O (row-parallel), whose partial sums are reduced when
leaving the TP region. Heads never talk to each other, so nothing is communicated in between.

GQA (n_kv_head < n_head; query head i reads K/V head i // (n_head / n_kv_head)):
  * t divides n_kv_head: split the K/V heads too; rank r holds K/V heads [r*n_kv/t, (r+1)*n_kv/t), exactly
    those its query heads read.
  * n_kv_head divides t (t > n_kv_head): every rank's query heads fall in one K/V group, so rank r holds that
    one K/V head, j = r // (t / n_kv_head), and t / n_kv_head ranks hold a copy of it. Each copy gets gradient
    only from its rank's query heads: `grads.allreduce_replicated_kv_grads` sums them. (vLLM replicates K/V
    heads the same way, `num_kv_head_replicas`; Megatron-Core instead splits the fused QKV weight evenly and
    all-gathers the QKV activations, whose conjugate reduce-scatter sums the copies' gradients.)
  * otherwise some rank's query heads would need K/V heads held by two ranks: refused.

Attention itself goes through a replaceable `core(q, k, v, positions)` with the reference signature
(q [b, n_head/t, s, d_head], k, v [b, n_kv_local, s, d_head] -> [b, n_head/t, s, d_head]); a context-parallel
core (ring attention, Ulysses) plugs in there without touching this file. `positions` [s] are the global token
positions of the sequence the core sees (RoPE and the causal mask use them).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from pylib.model import attention_core, rope
from pylib.plan.heads import HeadLayout, head_layout
from pylib.runtime import ShardSpec
from pylib.runtime import collectives as C
from pylib.runtime.tracer import current_tag

from .linear import ColumnParallelLinear, RowParallelLinear
from .regions import column_parallel_linears


class LocalAttention:
    """The default core: the reference `attention_core` on this rank's heads and the whole sequence."""

    def __init__(self, causal: bool, scale: float | None = None):
        self.causal, self.scale = causal, scale

    def __call__(self, q, k, v, positions=None):
        return attention_core(q, k, v, causal=self.causal, scale=self.scale, q_pos=positions, k_pos=positions)

    def __repr__(self) -> str:
        return f"LocalAttention(causal={self.causal})"


class TPAttention(nn.Module):
    """x [b, s, h] (TP) or [b, s/t, h] (SP) -> the same shape. Holds W_Q [n_head/t*d_head, h],
    W_K, W_V [n_kv_local*d_head, h] (column-parallel) and W_O [h, n_head/t*d_head] (row-parallel)."""

    def __init__(
        self,
        q_proj,
        k_proj,
        v_proj,
        o_proj,
        layout: HeadLayout,
        *,
        cfg,
        group,
        sequence_parallel,
        regather,
        core,
    ):
        """cfg: the reference model's config (its d_head, position encoding and RoPE base)."""
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = q_proj, k_proj, v_proj, o_proj
        self.layout, self.d_head, self.position, self.rope_base = layout, cfg.d_head, cfg.position, cfg.rope_base
        self.group, self.sequence_parallel, self.regather = group, sequence_parallel, regather
        self.core = core

    @classmethod
    def from_full(cls, attn, *, group=None, sequence_parallel: bool = False, regather: bool = False, core=None):
        """Keep this rank's heads of a reference `pylib.model.Attention`."""
        cfg = attn.cfg
        g = C.resolve_group(group)
        lay = head_layout(cfg.n_heads, cfg.kv_heads, g.size, g.rank)
        dh = cfg.d_head

        def rows(linear, first, count):
            return linear.weight[first * dh : (first + count) * dh]

        kw = dict(sequence_parallel=sequence_parallel, regather=regather)
        q = ColumnParallelLinear(
            rows(attn.q_proj, lay.q_first, lay.q_count), None, g, full_shape=tuple(attn.q_proj.weight.shape), **kw
        )
        kv_kind = "column" if lay.kv_replicas == 1 else "kv-replicated"
        k, v = (
            ColumnParallelLinear(
                rows(lin, lay.kv_first, lay.kv_count),
                None,
                g,
                kind=kv_kind,
                full_shape=tuple(lin.weight.shape),
                replicas=lay.kv_replicas,
                **kw,
            )
            for lin in (attn.k_proj, attn.v_proj)
        )
        cols = slice(lay.q_first * dh, (lay.q_first + lay.q_count) * dh)
        o = RowParallelLinear(
            attn.o_proj.weight[:, cols],
            None,
            g,
            sequence_parallel=sequence_parallel,
            full_shape=tuple(attn.o_proj.weight.shape),
        )
        core = core if core is not None else LocalAttention(cfg.causal)
        return cls(
            q,
            k,
            v,
            o,
            lay,
            cfg=cfg,
            group=g,
            sequence_parallel=sequence_parallel,
            regather=regather,
            core=core,
        )

    def project(self, x: torch.Tensor, positions: torch.Tensor | None = None):
        """Enter the TP region (once for Q, K and V) and project: q [b, n_head/t, s, d_head],
        k, v [b, n_kv_local, s, d_head], with RoPE at the global `positions` [s]."""
        q, k, v = column_parallel_linears(
            x,
            [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight],
            None,
            self.group,
            sequence_parallel=self.sequence_parallel,
            regather=self.regather,
            tag=current_tag(),
        )
        b, s, _ = q.shape
        q, k, v = (y.view(b, s, -1, self.d_head).transpose(1, 2) for y in (q, k, v))
        if self.position == "rope":
            pos = torch.arange(s, device=x.device) if positions is None else positions
            q, k = rope(q, pos, self.rope_base), rope(k, pos, self.rope_base)
        return q, k, v

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = self.project(x, positions)
        b, _, s, _ = q.shape
        o = self.core(q, k, v, positions)  # [b, n_head/t, s, d_head]
        return self.o_proj(o.transpose(1, 2).reshape(b, s, -1))

    def shard_specs(self, prefix: str = "") -> list[ShardSpec]:
        specs = []
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            specs += getattr(self, name).shard_specs(f"{prefix}{name}.")
        return specs

    def extra_repr(self) -> str:
        lay = self.layout
        return (
            f"q_heads=[{lay.q_first}, {lay.q_first + lay.q_count}), kv_heads=[{lay.kv_first}, "
            f"{lay.kv_first + lay.kv_count}) x{lay.kv_replicas}, core={self.core!r}"
        )
