"""One pipeline stage of the composed model: the layers a rank holds, each already split by TP, CP and EP.

A stage is what `pylib.pp.run_pipeline` runs (it is generic over stage modules). Inside it every mode plays its
part on the same activations:

    ids [b, s/cp]      this rank's DP rows, its CP (zig-zag) part of the sequence; the same on every TP rank
      embed            VocabParallelEmbedding, reduce-scatter -> x [b, s/(cp*tp), h]   (SP: TP's sequence split)
      per layer        TPBlock: LN on s/(cp*tp) tokens, all-gather -> [b, s/cp, h], Q/K/V for n_head/tp heads,
                       attention core = ring / Ulysses over CP at the zig-zag positions, W_O, reduce-scatter
                       dense MLP:  TPMLP (h_ffn/tp), the same SP crossings
                       MoE:        ExpertParallelMoE on this rank's s/(cp*tp) tokens (router replicated; experts
                                   over the folded EP x ETP groups: all-to-all dispatch and combine, or the
                                   all-gather dispatcher over the etp x ep grid; shared experts, if any, cut over
                                   TP as the dense MLP, with its SP crossings, and replicated over EP)
      ln_f, lm_head    all-gather -> logits [b, s/cp, V/tp]
      loss             vocab-parallel cross-entropy, mean over this rank's b * s/cp tokens (same on every TP rank)

Parameter names are the reference model's ("layers.3.attn.q_proj.weight"), except the experts a rank holds,
which are numbered locally ("layers.3.mlp.experts.experts.0.up_proj.weight"; `reductions.parameter_map` maps them back),
and the shared experts' slices ("layers.3.mlp.shared.mlp.up_proj.weight", the reference's "layers.3.mlp.shared.
up_proj.weight").
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import torch
import torch.nn as nn

from pylib.cp.layer import CPAttentionCore
from pylib.cp.layout import sequence_positions
from pylib.ep.layer import ExpertParallelMoE
from pylib.i18n import tr
from pylib.plan.options import RunOptions
from pylib.pp.split import layers_of_stage, mark_tied_embedding
from pylib.runtime import ShardSpec, tag
from pylib.runtime.recompute import run_layers
from pylib.tp.attention import TPAttention
from pylib.tp.cross_entropy import vocab_parallel_cross_entropy
from pylib.tp.embedding import VocabParallelEmbedding
from pylib.tp.grads import mark_sequence_parallel
from pylib.tp.linear import ColumnParallelLinear
from pylib.tp.mlp import TPMLP
from pylib.tp.transformer import TPBlock, copy_layernorm, layernorm_specs, selective_core

from . import checks


def build_layer(block, mesh, options: RunOptions) -> TPBlock:
    """One reference `Block` on this rank: attention over TP x CP, the MLP over TP (dense) or EP x ETP (MoE).

    MoE auxiliary losses (load balancing, z-loss) are taken, as in Megatron, over the tokens of one microbatch of
    one data-parallel replica (the tp-cp group). Their coefficients are scaled by cp / m here, so that after the
    gradient average over dp-cp and the sum over m microbatches the objective is the *mean* over (replica,
    microbatch) of each group's aux loss (`train_reference(..., like=...)` computes exactly that on one device).
    options.recompute "selective": the attention core (local, ring or Ulysses) is recomputed in backward."""
    cfg = block.attn.cfg
    sequence_parallel = options.sequence_parallel
    tp = mesh.tp
    core = None
    if mesh.cp.size > 1:
        core = CPAttentionCore(mesh.cp, layout=options.cp_layout, kind=options.cp_kind, causal=cfg.causal)
    if options.recompute.granularity == "selective":
        core = selective_core(core, cfg.causal)
    attn = TPAttention.from_full(block.attn, group=tp, sequence_parallel=sequence_parallel, core=core)
    if hasattr(block.mlp, "router"):
        aux = cfg.moe.aux_loss_coef or cfg.moe.z_loss_coef
        mlp = ExpertParallelMoE.from_full(
            block.mlp,
            ep_group=mesh.ep,
            etp_group=mesh.etp,
            aux_group=mesh["tp-cp"] if aux else None,
            tp_group=tp,  # the shared experts: cut over TP as the dense MLP, replicated over EP
            grid_group=mesh["etp-ep"] if mesh.etp.size > 1 else None,  # the all-gather dispatcher's (etp = 1: ep)
            sequence_parallel=sequence_parallel,
        )
        if aux:
            k = Fraction(mesh.cp.size, options.n_microbatches)
            mlp.cfg = replace(
                mlp.cfg, aux_loss_coef=float(mlp.cfg.aux_loss_coef * k), z_loss_coef=float(mlp.cfg.z_loss_coef * k)
            )
        if sequence_parallel and tp.size > 1:  # every TP rank routes its own s/(cp*tp) tokens
            mark_sequence_parallel(mlp.router.gate.weight)
        mlp.register_forward_pre_hook(_refuse_training_forward(cfg, mesh.config, options))
    else:
        mlp = TPMLP.from_full(block.mlp, group=tp, sequence_parallel=sequence_parallel)
    return TPBlock(
        copy_layernorm(block.ln1, sequence_parallel),
        attn,
        copy_layernorm(block.ln2, sequence_parallel),
        mlp,
        tp,
        sequence_parallel,
    )


def _refuse_training_forward(cfg, par, options: RunOptions):
    """A MoE layer's forward pre-hook: in training mode it refuses what `checks.training_problems` refuses, as
    Megatron-Core's MoELayer.forward checks `self.training` (eval mode and no_grad evaluation pass)."""

    def hook(module, args):
        if module.training:
            checks.refuse_training(cfg, par, options, lambda: tr("the MoE layer's training forward"))

    return hook


class ParallelStage(nn.Module):
    """Virtual stage `stage` of `n_stages` on this rank (see the module docstring).

    forward(x, targets=None): first stage x = ids [b, s/cp]; otherwise x = hidden [b, s/(cp*tp), h] (SP) or
    [b, s/cp, h]. Returns the hidden state for the next stage, or on the last stage the vocabulary slice of the
    logits [b, s/cp, V/tp], or with targets [b, s/cp] the mean cross-entropy of this rank's tokens (a scalar)."""

    def __init__(
        self,
        *,
        stage,
        n_stages,
        layers,
        embed,
        ln_f,
        lm_head,
        tp_group,
        cp_group,
        options: RunOptions,
    ):
        super().__init__()
        self.options = options  # sequence_parallel, cp_layout and recompute act here
        self.stage, self.n_stages = stage, n_stages
        self.is_first, self.is_last = stage == 0, stage == n_stages - 1
        self.embed = embed
        self.layers = nn.ModuleDict({str(i): layer for i, layer in layers.items()})
        self.ln_f, self.lm_head = ln_f, lm_head
        self.tp_group, self.cp_group = tp_group, cp_group
        self._positions: dict[tuple, torch.Tensor] = {}
        self.saved_probe = None  # a `probe.SavedProbe`: measures what each forward saves for backward
        self.chunk = 0  # this stage's chunk index on its rank

    @classmethod
    def from_full(
        cls,
        model,
        mesh,
        stage: int,
        n_stages: int,
        options: RunOptions = RunOptions(),
    ) -> ParallelStage:
        """options: the run's `pylib.plan.RunOptions` (the groups of options.recompute "full" are counted within
        this stage, as Megatron counts them within a pipeline stage)."""
        ids = layers_of_stage(model.cfg.n_layers, stage, n_stages)
        sequence_parallel = options.sequence_parallel
        layers = {i: build_layer(model.layers[i], mesh, options) for i in ids}
        first, last = stage == 0, stage == n_stages - 1
        tp = mesh.tp
        embed = None
        if first:
            embed = VocabParallelEmbedding.from_full(model.embed, group=tp, sequence_parallel=sequence_parallel)
        ln_f = copy_layernorm(model.ln_f, sequence_parallel) if last else None
        lm_head = None
        if last:
            lm_head = ColumnParallelLinear.from_full(
                model.lm_head, group=tp, sequence_parallel=sequence_parallel, what="vocab_size"
            )
        if model.cfg.tie_embeddings:  # one parameter on one stage; across stages a marked copy on the last
            mark_tied_embedding(embed, lm_head)
        return cls(
            stage=stage,
            n_stages=n_stages,
            layers=layers,
            embed=embed,
            ln_f=ln_f,
            lm_head=lm_head,
            tp_group=tp,
            cp_group=mesh.cp,
            options=options,
        )

    def positions(self, s_cp: int, device) -> torch.Tensor:
        """[s/cp] global positions of this CP rank's tokens (zig-zag: two ranges), for a CP-local length s_cp."""
        key = (s_cp, str(device))
        if key not in self._positions:
            g = self.cp_group
            self._positions[key] = sequence_positions(s_cp * g.size, g.rank, g.size, self.options.cp_layout, device)
        return self._positions[key]

    @property
    def layer_ids(self) -> list[int]:
        return [int(k) for k in self.layers]

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if self.saved_probe is None:
            return self._forward(x, targets)
        with self.saved_probe.measure(self.chunk):
            return self._forward(x, targets)

    def _forward(self, x: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
        if self.embed is not None:
            s_cp = x.shape[1]  # ids [b, s/cp]
            with tag("embed"):
                x = self.embed(x)
        else:  # hidden [b, s/(cp*tp), h] under SP
            s_cp = x.shape[1] * (self.tp_group.size if self.options.sequence_parallel else 1)
        positions = self.positions(s_cp, x.device)
        ids = self.layer_ids

        def one(k, layer, x):
            with tag(f"layers.{ids[k]}"):
                return layer(x, positions)

        x = run_layers(
            self.layers.values(),
            x,
            recompute=self.options.recompute,
            wrap=one,
        )
        if self.lm_head is None:
            return x
        with tag("lm_head"):
            logits = self.lm_head(self.ln_f(x))  # [b, s/cp, V/tp]
        if targets is None:
            return logits
        with tag("cross_entropy"):
            return vocab_parallel_cross_entropy(logits, targets, self.tp_group).mean()

    def moe_layers(self) -> dict[int, ExpertParallelMoE]:
        return {int(i): layer.mlp for i, layer in self.layers.items() if isinstance(layer.mlp, ExpertParallelMoE)}

    def shard_specs(self) -> list[ShardSpec]:
        """How this rank holds each of its parameters over TP / EP / ETP (DP and PP are added by the model)."""
        sp = self.options.sequence_parallel
        specs = self.embed.shard_specs("embed.") if self.embed is not None else []
        for i, layer in self.layers.items():
            p = f"layers.{i}."
            specs += layernorm_specs(layer.ln1, p + "ln1.", sp, "s/(cp*tp)") + layer.attn.shard_specs(p + "attn.")
            specs += layernorm_specs(layer.ln2, p + "ln2.", sp, "s/(cp*tp)")
            if isinstance(layer.mlp, ExpertParallelMoE):
                specs += [replace(s, name=p + "mlp." + s.name) for s in layer.mlp.shard_specs()]
            else:
                specs += layer.mlp.shard_specs(p + "mlp.")
        if self.ln_f is not None:
            specs += layernorm_specs(self.ln_f, "ln_f.", sp, "s/(cp*tp)")
            if self.embed is None or self.lm_head.weight is not self.embed.weight:  # tied on one stage: one
                specs += self.lm_head.shard_specs("lm_head.")
        return specs

    def extra_repr(self) -> str:
        parts = [f"stage {self.stage}/{self.n_stages}", f"layers {self.layer_ids}"]
        if self.is_first:
            parts.append("+embed")
        if self.is_last:
            parts.append("+ln_f+lm_head+loss")
        return ", ".join(parts)
