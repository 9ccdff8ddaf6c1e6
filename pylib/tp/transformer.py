"""The tensor-parallel Transformer layer and model, assembled from the reference model's modules.

Per layer (Pre-LN), with t TP ranks:

    x ─ LN1 ─[enter]─ Q,K,V (column) ─ attention (my heads) ─ W_O (row) ─[leave]─ + x
      ─ LN2 ─[enter]─ W_up (column) ─ GELU ─ W_down (row) ─[leave]─ + x

TP only: x is [b, s, h] on every rank; enter = identity (all-reduce in backward), leave = all-reduce.
TP + SP: x is my sequence slice [b, s/t, h]; enter = all-gather, leave = reduce-scatter. LayerNorm and the
residual adds run on s/t tokens (article A's green zone cut to 1/t); the LayerNorm gradients need
`allreduce_sequence_parallel_grads` (see grads.py).

Model: vocab-parallel embedding, the layers, final LayerNorm, column-parallel LM head giving my vocabulary
slice of the logits [b, s, V/t], vocab-parallel cross-entropy. The full logits are never formed. With
make_vocab_size_divisible_by=d the vocabulary is padded to V_p, a multiple of d*t (Megatron-LM's rule,
`pylib.plan.vocab`), and the logits of the padded ids are -inf on every rank that holds them.

Recomputation (`pylib.plan.recompute`): recompute="selective" wraps each layer's attention core in
`RecomputedCore` (it keeps q, k, v, not the [b, n_head/t, s, s] probabilities); recompute="full" keeps only the input
of each group of layers ([b, s/t, h] under SP) and runs the group again in backward, its all-gathers and
reduce-scatters (or all-reduces) included.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from pylib.plan.recompute import Recompute, check_recompute
from pylib.plan.vocab import padded_vocab_size
from pylib.runtime import ShardSpec, require_divisible, tag
from pylib.runtime import collectives as C
from pylib.runtime.agreement import agree_on_batch
from pylib.runtime.recompute import RecomputedCore, run_layers

from .attention import LocalAttention, TPAttention, head_layout
from .cross_entropy import mask_padded_logits, vocab_parallel_cross_entropy
from .embedding import VocabParallelEmbedding, pad_vocab_rows
from .grads import finalize_grads, mark_sequence_parallel
from .linear import ColumnParallelLinear
from .mlp import TPMLP


def copy_layernorm(ln: nn.LayerNorm, sequence_parallel: bool) -> nn.LayerNorm:
    """A copy of a reference LayerNorm on the reference's device and dtype (the rank's GPU under NCCL)."""
    out = nn.LayerNorm(
        ln.normalized_shape,
        eps=ln.eps,
        elementwise_affine=ln.elementwise_affine,
        dtype=ln.weight.dtype if ln.weight is not None else None,
        device=ln.weight.device if ln.weight is not None else None,
    )
    out.load_state_dict(ln.state_dict())
    if sequence_parallel:
        for p in out.parameters():
            mark_sequence_parallel(p)
    return out


def layernorm_specs(ln: nn.LayerNorm, prefix: str, sequence_parallel: bool, tokens: str = "s/t") -> list[ShardSpec]:
    """A replicated LayerNorm's specs; under SP each TP rank normalises only its `tokens` of the sequence."""
    note = f"SP: sees {tokens} tokens, gradient all-reduced over TP" if sequence_parallel else "whole on every TP rank"
    return [
        ShardSpec(f"{prefix}{n}", "tp", None, "replicated", tuple(p.shape), tuple(p.shape), note)
        for n, p in ln.named_parameters()
    ]


def check_tp_config(cfg, tp: int, make_vocab_size_divisible_by: int | None = None) -> None:
    """Raise naming the first size TP cannot split: heads, K/V heads, h_ffn, vocabulary (the padded one, a
    multiple of t by construction, when make_vocab_size_divisible_by is given: `pylib.plan.vocab`)."""
    head_layout(cfg.n_heads, cfg.kv_heads, tp, 0)
    require_divisible(cfg.d_ff, tp, "tp", "d_ff")
    require_divisible(padded_vocab_size(cfg.vocab_size, tp, make_vocab_size_divisible_by), tp, "tp", "vocab_size")


def vocab_parallel_head(linear: nn.Linear, group, padded: int, sequence_parallel: bool, regather: bool):
    """The LM head [V, h] as a column-parallel linear over the vocabulary, its rows padded with zeros to `padded`
    first: rank r holds rows [r*padded/t, (r+1)*padded/t). Unpadded, exactly `ColumnParallelLinear.from_full`."""
    kw = dict(group=group, sequence_parallel=sequence_parallel, regather=regather)
    if padded == linear.weight.shape[0]:
        return ColumnParallelLinear.from_full(linear, what="vocab_size", **kw)
    g = C.resolve_group(group)
    rows = slice(g.rank * padded // g.size, (g.rank + 1) * padded // g.size)
    weight = pad_vocab_rows(linear.weight, padded)[rows]
    bias = None if linear.bias is None else pad_vocab_rows(linear.bias, padded)[rows]
    kw.pop("group")
    return ColumnParallelLinear(weight, bias, g, full_shape=tuple(linear.weight.shape), kind="vocab", **kw)


def selective_core(core, causal: bool) -> RecomputedCore:
    """The attention core (default: `LocalAttention`) recomputed in backward: selective recomputation."""
    return RecomputedCore(core if core is not None else LocalAttention(causal))


class TPBlock(nn.Module):
    """One Pre-LN layer. x [b, s, h] (TP) or my slice [b, s/t, h] (SP) -> the same shape.
    `positions` [s]: global positions of the whole sequence inside the TP region (as for the reference)."""

    def __init__(self, ln1, attn, ln2, mlp, group, sequence_parallel):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = ln1, attn, ln2, mlp
        self.group, self.sequence_parallel = group, sequence_parallel

    @classmethod
    def from_full(
        cls,
        block,
        *,
        group=None,
        sequence_parallel: bool = False,
        regather: bool = False,
        core=None,
        recompute: Recompute = Recompute(),
    ):
        """recompute (a `Recompute` or its granularity) "selective": the attention core is recomputed in backward
        (the other choices act on whole layers: `TPTransformer`, `run_layers`)."""
        selective = check_recompute(recompute).granularity == "selective"
        g = C.resolve_group(group)
        kw = dict(group=g, sequence_parallel=sequence_parallel, regather=regather)
        core = selective_core(core, block.attn.cfg.causal) if selective else core
        return cls(
            copy_layernorm(block.ln1, sequence_parallel),
            TPAttention.from_full(block.attn, core=core, **kw),
            copy_layernorm(block.ln2, sequence_parallel),
            TPMLP.from_full(block.mlp, **kw),
            g,
            sequence_parallel,
        )

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        with tag("attn"):
            x = x + self.attn(self.ln1(x), positions)
        with tag("mlp"):
            return x + self.mlp(self.ln2(x))

    def shard_specs(self, prefix: str = "") -> list[ShardSpec]:
        return (
            layernorm_specs(self.ln1, f"{prefix}ln1.", self.sequence_parallel)
            + self.attn.shard_specs(f"{prefix}attn.")
            + layernorm_specs(self.ln2, f"{prefix}ln2.", self.sequence_parallel)
            + self.mlp.shard_specs(f"{prefix}mlp.")
        )


class TPTransformer(nn.Module):
    """ids [b, s] (the same on every TP rank) -> my vocabulary slice of the logits [b, s, V/t].

    `loss(ids, targets)` equals the reference model's mean cross-entropy; after backward call
    `finalize_grads()` (SP LayerNorm gradients, replicated K/V gradients) before the optimizer step."""

    def __init__(self, cfg, embed, layers, ln_f, lm_head, group, sequence_parallel, recompute=Recompute()):
        super().__init__()
        self.cfg = cfg
        self.embed, self.layers, self.ln_f, self.lm_head = embed, nn.ModuleList(layers), ln_f, lm_head
        self.group, self.sequence_parallel = group, sequence_parallel
        self.recompute = recompute

    @classmethod
    def from_full(
        cls,
        model,
        *,
        group=None,
        sequence_parallel: bool = False,
        regather: bool = False,
        core=None,
        recompute: Recompute = Recompute(),
        make_vocab_size_divisible_by: int | None = None,
    ):
        """Shard a reference `pylib.model.Transformer`. `core` replaces every layer's attention core; recompute: a
        `pylib.plan.recompute.Recompute` (or its granularity string); make_vocab_size_divisible_by: pad the
        vocabulary of the embedding and the LM head to a multiple of it times t, as Megatron-LM does (its default,
        `pylib.plan.vocab.MAKE_VOCAB_SIZE_DIVISIBLE_BY`, is 128); None: no padding, t must divide V."""
        recompute = check_recompute(recompute)
        cfg = model.cfg
        g = C.resolve_group(group)
        padded = padded_vocab_size(cfg.vocab_size, g.size, make_vocab_size_divisible_by)
        check_tp_config(cfg, g.size, make_vocab_size_divisible_by)
        if cfg.moe is not None:
            raise ValueError(
                "TPTransformer shards dense layers; a model with MoE layers needs expert parallelism "
                "(pylib.ep) for its experts"
            )
        embed = VocabParallelEmbedding.from_full(
            model.embed,
            group=g,
            sequence_parallel=sequence_parallel,
            make_vocab_size_divisible_by=make_vocab_size_divisible_by,
        )
        layers = [
            TPBlock.from_full(
                b, group=g, sequence_parallel=sequence_parallel, regather=regather, core=core, recompute=recompute
            )
            for b in model.layers
        ]
        ln_f = copy_layernorm(model.ln_f, sequence_parallel)
        lm_head = vocab_parallel_head(model.lm_head, g, padded, sequence_parallel, regather)
        if cfg.tie_embeddings:  # the embedding's vocab rows and the head's output rows are the same slice
            lm_head.weight = embed.weight
        return cls(cfg, embed, layers, ln_f, lm_head, g, sequence_parallel, recompute)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """ids [b, s], the same on every TP rank (checked: `agree_on_batch`) -> this rank's logits [b, s, V/t]."""
        agree_on_batch("TPTransformer", self.group, {"ids": ids})
        with tag("embed"):
            x = self.embed(ids)  # [b, s, h] or [b, s/t, h]

        def one(i, layer, x):
            with tag(f"layers.{i}"):
                return layer(x, positions)

        x = run_layers(
            self.layers,
            x,
            recompute=self.recompute,
            wrap=one,
        )
        with tag("lm_head"):
            logits = self.lm_head(self.ln_f(x))  # [b, s, V_p/t]
        return mask_padded_logits(logits, self.cfg.vocab_size, self.group)  # padded ids: -inf, never sampled

    def loss(self, ids: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Mean next-token cross-entropy, the same value on every TP rank (ids and targets the same on each)."""
        agree_on_batch("TPTransformer.loss", self.group, {"targets": targets})
        local_logits = self(ids, positions)
        with tag("cross_entropy"):
            return vocab_parallel_cross_entropy(local_logits, targets, self.group, self.cfg.vocab_size).mean()

    def full_logits(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Gather the whole logits [b, s, V] (for checks only: this is what vocab parallelism avoids); the padded
        columns, if any, are dropped after the gather."""
        with tag("full_logits"):
            return C.gather_from_group(self(ids, positions), -1, self.group)[..., : self.cfg.vocab_size]

    def finalize_grads(self) -> None:
        finalize_grads(self, self.group)

    def shard_specs(self, prefix: str = "") -> list[ShardSpec]:
        specs = self.embed.shard_specs(f"{prefix}embed.")
        for i, layer in enumerate(self.layers):
            specs += layer.shard_specs(f"{prefix}layers.{i}.")
        specs += layernorm_specs(self.ln_f, f"{prefix}ln_f.", self.sequence_parallel)
        if not self.cfg.tie_embeddings:
            specs += self.lm_head.shard_specs(f"{prefix}lm_head.")
        return specs
