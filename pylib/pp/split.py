"""Cut the reference model into pipeline stages: which layers each rank holds, and the stage modules themselves.

With p pipeline ranks and v virtual chunks per rank there are K = p·v *virtual stages*, each holding
L / K consecutive layers. Virtual stage k lives on rank k % p as its chunk k // p -- Megatron's interleaved
layout: chunk c of rank r holds layer block c·p + r. With v = 1 that is the plain split (rank r holds block r).

    p = 2, v = 2, L = 8:   rank 0: chunk 0 = layers 0-1 (+ embedding),  chunk 1 = layers 4-5
                           rank 1: chunk 0 = layers 2-3,                chunk 1 = layers 6-7 (+ ln_f, lm_head, loss)

A forward pass visits the virtual stages in order 0, 1, ..., K-1, so an activation goes round the ring of ranks v
times. Virtual stage 0 also embeds the token ids; virtual stage K-1 also applies ln_f and the LM head and, given
targets, returns the microbatch's mean cross-entropy loss.

Recomputation (`pylib.plan.recompute`, as Megatron counts it: within each stage): recompute="selective" recomputes
every layer's attention core in backward, recompute="full" keeps only the input of each group of layers.

The layer arithmetic (`check_split`, `virtual_stage`, `layers_of_stage`, `stage_layers`) is `pylib.plan.split`'s,
re-exported here; this module builds the stage modules.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from pylib.plan.recompute import Recompute, as_recompute, check_recompute
from pylib.plan.schedules import rank_stage
from pylib.plan.split import check_split, layers_of_stage, stage_layers, virtual_stage

from ..model import Transformer
from ..model.data import check_tokens
from ..runtime.collectives import all_reduce_
from ..runtime.recompute import RecomputedCore, run_layers
from ..runtime.sharding import ShardSpec

__all__ = [
    "PipelineChunk",
    "allreduce_embedding_grads",
    "embedding_group",
    "mark_tied_embedding",
    "tied_weights",
    "check_split",
    "check_v_split",
    "layers_of_stage",
    "lm_loss",
    "rank_chunks",
    "shard_specs",
    "split_model",
    "stage_layers",
    "virtual_stage",
]


class PipelineChunk(nn.Module):
    """One virtual stage of the reference model: a run of consecutive layers, plus the embedding on the first
    stage and ln_f + lm_head on the last.

    forward(x, targets=None):
        first stage:  x = ids [b, s] (int64)      -> hidden [b, s, h]
        middle stage: x = hidden [b, s, h]         -> hidden [b, s, h]
        last stage:   x = hidden [b, s, h]         -> logits [b, s, V], or, with targets [b, s], the mean
                                                    next-token cross-entropy of this microbatch (a scalar)
    Parameter names are the reference model's own ("layers.5.attn.q_proj.weight"), so gradients and weights can
    be compared with the reference by name.
    """

    def __init__(
        self,
        layers: dict[int, nn.Module],
        *,
        stage: int,
        n_stages: int,
        embed=None,
        ln_f=None,
        lm_head=None,
        vocab_size: int | None = None,
        recompute: Recompute = Recompute(),
    ):
        super().__init__()
        self.recompute = check_recompute(recompute)
        self.stage, self.n_stages = stage, n_stages
        self.is_first, self.is_last = stage == 0, stage == n_stages - 1
        self.embed = embed
        self.layers = nn.ModuleDict({str(i): layer for i, layer in layers.items()})
        self.ln_f, self.lm_head = ln_f, lm_head
        self.vocab_size = vocab_size
        if self.recompute.granularity == "selective":
            for layer in self.layers.values():
                layer.attn.core = RecomputedCore(layer.attn.core)  # the instance's core shadows the method

    @classmethod
    def from_full(
        cls, model: Transformer, stage: int, n_stages: int, recompute: Recompute = Recompute()
    ) -> PipelineChunk:
        """Virtual stage `stage` of `n_stages`, with copies of the reference model's weights. recompute: a
        `pylib.plan.recompute.Recompute` (or its granularity string)."""
        cfg = model.cfg
        ids = layers_of_stage(cfg.n_layers, stage, n_stages)
        first, last = stage == 0, stage == n_stages - 1
        embed = copy.deepcopy(model.embed) if first else None
        lm_head = copy.deepcopy(model.lm_head) if last else None
        if cfg.tie_embeddings:
            mark_tied_embedding(embed, lm_head)
        return cls(
            {i: copy.deepcopy(model.layers[i]) for i in ids},
            stage=stage,
            n_stages=n_stages,
            embed=embed,
            ln_f=copy.deepcopy(model.ln_f) if last else None,
            lm_head=lm_head,
            vocab_size=cfg.vocab_size,
            recompute=as_recompute(recompute),
        )

    @property
    def layer_ids(self) -> list[int]:
        return [int(k) for k in self.layers]

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(check_tokens(x, self.embed.num_embeddings, "ids"))
        x = run_layers(
            self.layers.values(),
            x,
            recompute=self.recompute,
        )
        if self.lm_head is None:
            return x
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return lm_loss(logits, targets)

    def extra_repr(self) -> str:
        parts = [f"stage {self.stage}/{self.n_stages}", f"layers {self.layer_ids}"]
        if self.is_first:
            parts.append("+embed")
        if self.is_last:
            parts.append("+ln_f+lm_head")
        return ", ".join(parts)


def mark_tied_embedding(embed, lm_head) -> None:
    """Tied input and output embeddings on a stage that holds `embed` (first stage), `lm_head` (last), or both.

    Both on one stage: one parameter, as in the reference model. Split over stages, as Megatron-Core places them
    (`LanguageModule.setup_embeddings_and_output_layer`, megatron/core/models/common/language_module/
    language_module.py at d98e8a6): the first stage holds the embedding, the last stage a copy used as the LM head
    (here copied from the same reference weight, so the two start equal); both are marked `shared_embedding`, and
    their gradients must be summed over the embedding group (`embedding_group`, `allreduce_embedding_grads`) before
    the optimizer, so the copies stay equal step after step."""
    if embed is not None and lm_head is not None:
        lm_head.weight = embed.weight
        return
    for module in (embed, lm_head):
        if module is not None:
            module.weight.shared_embedding = True


def tied_weights(chunks) -> list[nn.Parameter]:
    """The tied embedding copies these chunks hold (the `shared_embedding` parameters), in chunk order."""
    return [p for c in chunks for p in c.parameters() if getattr(p, "shared_embedding", False)]


def embedding_group(mesh):
    """This rank's embedding group: the first and the last rank of its pipeline group (Megatron-Core's "embd"
    group, `parallel_state.get_embedding_group`), as a `pylib.runtime.AxisGroup` named "embd"; None when
    pp = 1 or this rank is neither end. Collective (process groups are created on every rank, in the same order):
    every rank calls it. With pp = 2 the pipeline group itself is the pair."""
    import torch.distributed as dist

    from ..runtime.mesh import AxisGroup

    pp_groups = [tuple(g) for g in mesh.groups["pp"]]
    if len(pp_groups[0]) == 1:
        return None
    me, found = mesh.global_rank, None
    for g in pp_groups:
        pair = (g[0], g[-1])
        if len(g) == 2:
            pg = mesh.pp.pg if me in pair else None
        else:
            pg = dist.new_group(list(pair))
        if me in pair:
            found = AxisGroup("embd", pair, pair.index(me), pg)
    return found


def allreduce_embedding_grads(chunks, group) -> int:
    """Sum the gradients of the tied embedding copies these chunks hold over the embedding `group` (the first
    and last pipeline rank; `embedding_group`), in one all-reduce (phase "grad_sync", tag "embedding_grads"), as
    Megatron-Core's `_allreduce_word_embedding_grads` does (megatron/core/distributed/finalize_model_grads.py at
    d98e8a6). Afterwards both copies hold the reference's gradient of the tied weight. Returns the elements
    reduced (0 on a rank that holds no copy)."""
    grads = [p.grad for p in tied_weights(chunks) if p.grad is not None]
    if not grads:
        return 0
    if group is None:
        raise ValueError("these chunks hold a tied embedding copy but no embedding group was given")
    flat = torch.cat([g.reshape(-1) for g in grads])
    all_reduce_(flat, group, phase="grad_sync", tag="embedding_grads")
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
    return flat.numel()


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, as `Transformer.loss`: logits [b, s, V], targets [b, s] -> scalar."""
    check_tokens(targets, logits.shape[-1], "targets")
    flat = logits.reshape(-1, logits.shape[-1])
    if flat.dtype in (torch.bfloat16, torch.float16):
        flat = flat.float()
    return F.cross_entropy(flat, targets.reshape(-1))


def split_model(
    model: Transformer, pp: int, v: int = 1, recompute=Recompute(), *, placement: str = "loop"
) -> list[list[PipelineChunk]]:
    """chunks[r][c]: the module for chunk c of rank r (virtual stage c·pp + r; in the V placement stage r or
    2pp-1-r: `pylib.plan.schedules.rank_stage`), copied from the full model. recompute: as
    `PipelineChunk.from_full`."""
    return [rank_chunks(model, r, pp, v, recompute, placement=placement) for r in range(pp)]


def rank_chunks(
    model: Transformer, rank: int, pp: int, v: int = 1, recompute=Recompute(), *, placement: str = "loop"
) -> list[PipelineChunk]:
    """This rank's chunks only (what a launched rank keeps), in chunk order. recompute: as
    `PipelineChunk.from_full`; placement: "loop" or "v" (`pylib.plan.schedules.rank_stage`)."""
    if placement == "dual":
        return _dual_chunks(model, rank, pp, v, recompute)
    check_v_split(model.cfg.n_layers, pp, v, placement)
    if placement == "v" and model.cfg.tie_embeddings:
        raise ValueError(
            "tie_embeddings=True with the V placement: the embedding (stage 0) and the LM head (stage 2p-1) are "
            "both on rank 0, in chunks 0 and 1, so their gradients would be summed inside rank 0, not over the "
            "embedding group of the first and last rank (`embedding_group`); not supported: untie them"
        )
    if not 0 <= rank < pp:
        raise ValueError(f"rank={rank} is outside 0..{pp - 1}")
    return [PipelineChunk.from_full(model, rank_stage(rank, c, pp, placement), pp * v, recompute) for c in range(v)]


def _dual_chunks(model: Transformer, rank: int, pp: int, v: int, recompute) -> list[PipelineChunk]:
    """DualPipe's two chunks of rank `rank`: model stage rank (the first copy's, chunk 0) and model stage pp-1-rank
    (the second copy's, chunk 1), each one of pp stages of the model (their `.stage`)."""
    if v != 2 or pp % 2:
        raise ValueError(
            f"the dual placement (DualPipe) holds two copies of the model on an even number of ranks: v must be 2 "
            f"and pp even, got v={v}, pp={pp}"
        )
    if model.cfg.tie_embeddings:
        raise ValueError(
            "tie_embeddings=True with DualPipe: each copy's embedding and LM head are on the two end ranks, in "
            "opposite order, so the four copies' gradients would need one sum; not supported: untie them"
        )
    if not 0 <= rank < pp:
        raise ValueError(f"rank={rank} is outside 0..{pp - 1}")
    check_split(model.cfg.n_layers, pp, 1)
    return [PipelineChunk.from_full(model, k, pp, recompute) for k in (rank, pp - 1 - rank)]


def check_v_split(n_layers: int, pp: int, v: int, placement: str) -> None:
    """`check_split`, and for the V placement its own conditions named: two chunks per rank, L / 2pp layers each
    (so L even, and a multiple of 2pp)."""
    if placement == "v":
        if v != 2:
            raise ValueError(
                f"the V placement holds two chunks per rank (stage r and stage 2p-1-r): v must be 2, got v={v}"
            )
        if n_layers % (2 * pp):
            raise ValueError(
                f"the V cuts n_layers={n_layers} into 2p = {2 * pp} stages of equal size (chunk 0 = stage r, "
                f"chunk 1 = stage {2 * pp}-1-r on rank r): n_layers must be a multiple of {2 * pp}"
                + (" (an odd layer count cannot be cut into the V's two halves)" if n_layers % 2 else "")
            )
    check_split(n_layers, pp, v)


def shard_specs(model: Transformer, rank: int, pp: int, v: int = 1, *, placement: str = "loop") -> list[ShardSpec]:
    """How `rank` holds the reference weights under pp (and v chunks): whole tensors of its stages, none of the
    others. Every spec has axis "pp", dim None (a stage holds a parameter entirely) and kind "stage"."""
    out = []
    full = dict(model.named_parameters())
    for c, chunk in enumerate(rank_chunks(model, rank, pp, v, placement=placement)):
        for name, p in chunk.named_parameters():
            out.append(
                ShardSpec(
                    name,
                    "pp",
                    None,
                    "stage",
                    tuple(full[name].shape),
                    tuple(p.shape),
                    note=f"rank {rank} chunk {c} = "
                    + (f"stage {chunk.stage} of copy {c}" if placement == "dual" else f"virtual stage {chunk.stage}")
                    + f" of {chunk.n_stages}",
                )
            )
    return out
