"""CP drops into the reference model: only attention changes; LayerNorm, the projections and the MLP are untouched.

Each rank of the cp group holds its sequence shard of every activation, x [b, s/cp, h] (layout "contiguous" or
"zigzag"), and a full copy of every weight. The token-local modules (LN, Q/K/V/O projections, MLP, LM head) run
on the shard unchanged; attention swaps its `core` for ring attention, Ulysses or all-gather CP. RoPE and the
causal mask use the shard's *global* positions (`sequence_positions`), which under zig-zag are two separate ranges.

Weights are replicated over cp but each rank only sees its own tokens, so each rank's weight gradient is a
partial sum: all-reduce (sum) the gradients over the cp group -- in Megatron the cp group is folded into the
data-parallel group for exactly this reason ("dp-cp") -- and every rank holds the reference gradient.

    core = CPAttentionCore(group, layout="zigzag", kind="ring", causal=True)   # core(q, k, v, positions)
    attn = CPAttention.from_full(model.layers[0].attn, group=g, layout="zigzag", kind="ring")
    cp_model = CPTransformer.from_full(model, group=g, layout="zigzag", kind="ulysses")
    loss = cp_model.loss(shard(ids), shard(targets)); loss.backward(); cp_model.allreduce_gradients()

Recomputation (`pylib.plan.recompute`): recompute="selective" keeps only the core's q, k, v and runs ring attention
(its K/V passes), Ulysses (its all-to-alls) or all-gather CP (its all-gather) again in backward; recompute="full"
keeps each group's input [b, s/cp, h] and runs the group again.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from pylib.i18n import tr
from pylib.model.attention import Attention
from pylib.model.data import check_tokens
from pylib.model.transformer import Block, Transformer
from pylib.plan.options import ALL_CP_KINDS, CP_KIND, CP_LAYOUT
from pylib.plan.recompute import Recompute, check_recompute
from pylib.runtime import collectives as C
from pylib.runtime.recompute import RecomputedCore, run_layers
from pylib.runtime.sharding import ShardSpec

from .allgather import allgather_attention
from .layout import check_layout, check_sequence, sequence_positions, sequence_shard_spec
from .ring import cp_group, ring_attention
from .ulysses import check_heads, ulysses_attention

KINDS = ALL_CP_KINDS  # "ring", "ulysses", "allgather"


class CPAttentionCore:
    """`core(q, k, v, positions)` -- the signature of `pylib.model.Attention.core` -- computed by ring attention,
    Ulysses or all-gather CP over a cp group. q [b, n_head, s/cp, d_head], k, v [b, n_kv_head, s/cp, d_head], this
    rank's shard.

    `positions`, if given, must be this rank's global positions in `layout` (a mismatch means the caller sharded
    differently from the core, and raises). Usable inside any attention module, e.g. a tensor-parallel one whose
    q, k, v hold only its heads."""

    def __init__(
        self,
        group=None,
        *,
        layout: str = CP_LAYOUT,
        kind: str = CP_KIND,
        causal: bool = True,
        kernel="auto",
        overlap: bool = True,
    ):
        check_layout(layout)
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r} must be one of {KINDS}")
        self.group = cp_group(group)
        self.layout, self.kind, self.causal = layout, kind, causal
        self.kernel, self.overlap = kernel, overlap

    @property
    def cp_size(self) -> int:
        return self.group.size

    @property
    def cp_rank(self) -> int:
        return self.group.rank

    def positions(self, s_local: int, device=None) -> torch.Tensor:
        """This rank's global token positions [s_local] for a local length s_local."""
        return sequence_positions(s_local * self.cp_size, self.cp_rank, self.cp_size, self.layout, device)

    def __call__(self, q, k, v, positions=None) -> torch.Tensor:
        if positions is not None:
            expected = self.positions(q.shape[2], positions.device)
            if positions.shape != expected.shape or not torch.equal(positions, expected):
                raise ValueError(
                    tr(
                        "positions {got} are not cp rank {r}'s {layout} positions {want} (cp={cp}); shard with "
                        "pylib.cp.shard_sequence(..., layout={kind!r})",
                        got=positions.tolist(),
                        r=self.cp_rank,
                        layout=self.layout,
                        want=expected.tolist(),
                        cp=self.cp_size,
                        kind=self.layout,
                    )
                )
        kw = dict(
            group=self.group,
            causal=self.causal,
            layout=self.layout,
            kernel=self.kernel,
        )
        if self.kind == "ring":
            return ring_attention(q, k, v, overlap=self.overlap, **kw)
        if self.kind == "allgather":
            return allgather_attention(q, k, v, **kw)
        return ulysses_attention(q, k, v, **kw)

    def __repr__(self) -> str:
        return (
            f"CPAttentionCore(kind={self.kind}, layout={self.layout}, causal={self.causal}, "
            f"cp={self.cp_size}, rank={self.cp_rank})"
        )


class CPAttention(Attention):
    """The reference `Attention` with its core computed across the cp group. x [b, s/cp, h] -> [b, s/cp, h].

    Weights: full copies of the reference's q/k/v/o projections (replicated over cp)."""

    def __init__(self, cfg, core: CPAttentionCore):
        with torch.random.fork_rng(devices=[]):  # the weights are overwritten; leave the caller's RNG alone
            super().__init__(cfg)
        self.cp_core = core

    @classmethod
    def from_full(cls, attn: Attention, *, group=None, layout: str = CP_LAYOUT, kind: str = CP_KIND, **core_kw):
        cfg = attn.cfg
        core = CPAttentionCore(group, layout=layout, kind=kind, causal=cfg.causal, **core_kw)
        if kind == "ulysses":
            check_heads(attn.q_proj.out_features // cfg.d_head, attn.k_proj.out_features // cfg.d_head, core.cp_size)
        new = cls(cfg, core)
        new.to(dtype=attn.q_proj.weight.dtype, device=attn.q_proj.weight.device)
        new.load_state_dict(attn.state_dict())
        return new

    def core(self, q, k, v, positions=None) -> torch.Tensor:
        return self.cp_core(q, k, v, positions)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x [b, s/cp, h]: this rank's shard. positions default to the shard's global positions."""
        if positions is None:
            positions = self.cp_core.positions(x.shape[1], x.device)
        return super().forward(x, positions)


def cp_block(
    block: Block, *, group=None, layout: str = CP_LAYOUT, kind: str = CP_KIND, recompute=Recompute(), **core_kw
) -> Block:
    """A copy of a reference layer whose attention runs over the cp group; LN and MLP are the same modules
    (copied). x [b, s/cp, h] -> [b, s/cp, h]. recompute="selective": the cp core is recomputed in backward."""
    selective = check_recompute(recompute).granularity == "selective"
    new = copy.deepcopy(block)
    new.attn = CPAttention.from_full(block.attn, group=group, layout=layout, kind=kind, **core_kw)
    if selective:
        new.attn.cp_core = RecomputedCore(new.attn.cp_core)
    return new


class CPTransformer(nn.Module):
    """The reference Transformer with every layer's attention over the cp group. ids [b, s/cp] -> logits
    [b, s/cp, V] for this rank's tokens."""

    def __init__(
        self,
        model: Transformer,
        group,
        layout: str,
        kind: str,
        recompute: Recompute = Recompute(),
        **core_kw,
    ):
        super().__init__()
        g = cp_group(group)
        self.cfg, self.group, self.layout, self.kind = model.cfg, g, layout, kind
        self.recompute = recompute = check_recompute(recompute)
        self.embed = copy.deepcopy(model.embed)
        self.layers = nn.ModuleList(
            cp_block(b, group=g, layout=layout, kind=kind, recompute=recompute, **core_kw) for b in model.layers
        )
        self.ln_f = copy.deepcopy(model.ln_f)
        self.lm_head = copy.deepcopy(model.lm_head)
        if model.cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    @classmethod
    def from_full(cls, model: Transformer, *, group=None, layout: str = CP_LAYOUT, kind: str = CP_KIND, **kw):
        """kw: recompute (a `pylib.plan.recompute.Recompute` or its granularity) and the core's options."""
        return cls(model, group, layout, kind, **kw)

    def positions(self, s_local: int, device=None) -> torch.Tensor:
        g = self.group
        return sequence_positions(s_local * g.size, g.rank, g.size, self.layout, device)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """ids [b, s/cp]: this rank's shard (`shard_sequence(ids, 1, ...)`)."""
        positions = self.positions(ids.shape[1], ids.device) if positions is None else positions
        x = self.embed(check_tokens(ids, self.cfg.vocab_size, "ids"))
        x = run_layers(
            self.layers,
            x,
            positions,
            recompute=self.recompute,
        )
        return self.lm_head(self.ln_f(x))

    def loss(self, ids: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """The reference's mean next-token loss over the *whole* sequence, on every rank.

        Rank r contributes sum(its tokens' losses) / (tokens on all ranks); a forward all-reduce adds the
        contributions (backward: identity, so each rank's gradient is that of its own tokens only -- a partial
        sum that `allreduce_gradients` completes). targets are the full sequence's next tokens, sharded like ids."""
        logits = self(ids, positions).reshape(-1, self.cfg.vocab_size)
        if logits.dtype in (torch.bfloat16, torch.float16):
            logits = logits.float()
        local_sum = F.cross_entropy(
            logits, check_tokens(targets, self.cfg.vocab_size, "targets").reshape(-1), reduction="sum"
        )
        return C.reduce_from_group(local_sum / (targets.numel() * self.group.size), self.group, tag="cp.loss")

    def allreduce_gradients(self) -> None:
        """Sum every parameter's gradient over the cp group (each rank saw only its tokens)."""
        for p in self.parameters():
            if p.grad is not None:
                C.all_reduce_(p.grad, self.group, tag="cp.grads")

    def shard_specs(self, batch: int, seq_len: int) -> list[ShardSpec]:
        """How this rank holds each tensor over cp: activations split along the sequence, weights replicated."""
        g = self.group
        check_sequence(seq_len, g.size, self.layout)
        h = self.cfg.d_model
        specs = [
            sequence_shard_spec("ids", (batch, seq_len), 1, g.rank, g.size, self.layout),
            sequence_shard_spec("x", (batch, seq_len, h), 1, g.rank, g.size, self.layout),
            sequence_shard_spec("logits", (batch, seq_len, self.cfg.vocab_size), 1, g.rank, g.size, self.layout),
        ]
        for name, p in self.named_parameters():
            specs.append(
                ShardSpec(
                    name, "cp", None, "replicated", tuple(p.shape), tuple(p.shape), "gradient all-reduced over cp"
                )
            )
        return specs
