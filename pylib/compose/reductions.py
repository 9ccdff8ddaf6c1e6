"""Which gradient reduction each parameter needs, as data -- and the reductions themselves, each done once.

A parameter's gradient on one rank covers only the tokens that rank saw. What completes it depends on how the
parameter is held (the table the book prints, `reduction_table`):

    parameter               held                    the local gradient covers        completed by
    ----------------------  ----------------------  -------------------------------  -----------------------------
    embed, lm_head          vocab rows over TP      the replica's s/cp tokens        average over dp-cp
    tied embed (pp > 1)     first stage: embed,     its own use (input or output)    average over dp-cp, then sum
                            last stage: a copy                                       over the embedding group
    q k v o, up gate down   a TP slice              the replica's s/cp tokens        average over dp-cp
    shared experts          a TP slice, the same    the replica's s/cp tokens        average over dp-cp (its EP
                            on every EP rank                                         ranks included)
    LayerNorms (SP)         whole on each TP rank   its s/(cp*tp) tokens             sum over tp, average over dp-cp
    k, v (GQA, tp > n_kv)   one K/V head, copied    its own query heads' share       sum over the head's copies
                            on tp/n_kv ranks                                         (tp), average over dp-cp
    router (SP, tp > 1)     whole on every rank     its s/(cp*tp) tokens             sum over tp, average over dp-cp
    experts                 E/ep experts, each      every token of its EP x ETP      average over edp, then
                            h_ffn/etp               group                            times edp / (dp*cp)

Why the expert factor: the loss is the mean over the dp*cp replicas' equal token sets, so every gradient must be
(1/(dp*cp)) * (sum over every token of the world). A dense weight's dp-cp average gives exactly that. An expert
slice's EDP group partitions the world's tokens among its members' EP x ETP groups, so the sum over EDP is the sum
over all tokens -- and an average over EDP divides by edp, not dp*cp (they differ unless tp*cp*dp = etp*ep*...).
Megatron-Core scales expert gradients by 1/(dp*cp) for the same reason (its expert_gradient_scaling_factor).

Order in a step (Megatron's finalize_model_grads): backward of every microbatch accumulates; the data-parallel
wrapper reduces once per chunk, after that chunk's last microbatch (`no_sync` before it; ZeRO-2/3 reduce inside
every backward by design); then, on whatever gradient elements this rank holds after that reduction (the whole
parameter under DDP, its ZeRO shard otherwise: `held_gradient_pieces`), the TP sums (SP parameters and the router in
one all-reduce "sp_grads", replicated K/V in one "kv_grads") and the expert scaling; then the optimizer step.
Averaging and summing are linear and act on different groups, so their order does not change the result; the TP
peers of a rank hold the same element ranges (same layouts, same dp-cp index), so the sums line up.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from fractions import Fraction

import torch
import torch.nn as nn

from pylib.dp.fsdp import FullyShardedDataParallel
from pylib.dp.wrap import DDPTrainer
from pylib.dp.zero import ZeroDataParallel
from pylib.ep.layer import ExpertParallelMoE
from pylib.runtime import collectives as C
from pylib.runtime.tracer import phase, tag
from pylib.tp.mlp import TPMLP

SP_PHASE = "sp_grads"
KV_PHASE = "kv_grads"
EMBD = "embd"  # `Reduction.pre` of a tied embedding copy: summed over the embedding group (first, last stage)
EMBD_PHASE = "grad_sync"  # Megatron-Core's finalize_model_grads runs it with the data-parallel reductions


@dataclass(frozen=True)
class ParamInfo:
    """One local parameter: its name on this rank, the reference parameter it is a piece of, and which piece
    (`ref_index`, a tuple of slices: reference[ref_index] is what this rank holds)."""

    name: str
    ref_name: str
    ref_index: tuple
    kind: str  # vocab | column | row | kv-replicated | replicated | router | expert
    local_shape: tuple
    full_shape: tuple


@dataclass(frozen=True)
class Reduction:
    """How one parameter's gradient is completed (one row of the book's table).

    pre: the extra sum before the optimizer ("tp": over the TP group; "tp/kv": over the TP ranks sharing a K/V
    head; None). dp_group / dp_size: the data-parallel group whose average the DP wrapper takes. scale: the
    factor applied after that average (edp / (dp*cp) for experts, else 1)."""

    name: str
    ref_name: str
    kind: str
    pre: str | None
    dp_group: str
    dp_size: int
    scale: Fraction
    why: str

    def as_dict(self) -> dict:
        d = asdict(self)
        d["scale"] = str(self.scale)
        return d


def _rows(first: int, count: int) -> slice:
    return slice(first, first + count)


def parameter_map(stage) -> list[ParamInfo]:
    """Every parameter of a `ParallelStage`, with the reference piece it holds."""
    out = []
    if stage.embed is not None:
        e = stage.embed
        index = (slice(e.vocab_start, e.vocab_end), _ALL)
        out.append(_info("embed.weight", e.weight, index, "vocab", (e.vocab_size, e.weight.shape[1])))
    for i, layer in stage.layers.items():
        out += _layer_pieces(f"layers.{i}.", layer)
    if stage.ln_f is not None:
        out += [_info(f"ln_f.{n}", p, (_ALL,), "replicated", p.shape) for n, p in stage.ln_f.named_parameters()]
        h = stage.lm_head
        per, rank = h.weight.shape[0], h.group.rank
        # tied: on the first stage too, the LM head is the embedding (one parameter, mapped above); on the last
        # stage alone it is a copy of the embedding's piece (the reference has no lm_head.weight of its own)
        if stage.embed is None or h.weight is not stage.embed.weight:
            ref = "embed.weight" if getattr(h.weight, "shared_embedding", False) else None
            rows = (slice(rank * per, (rank + 1) * per), _ALL)
            out.append(_info("lm_head.weight", h.weight, rows, "vocab", h.full_shape, ref=ref))
    names = {n for n, _ in stage.named_parameters()}
    mapped = {i.name for i in out}
    if names != mapped:
        raise RuntimeError(
            f"parameters without a reference piece: {sorted(names - mapped)}; "
            f"mapped but absent: {sorted(mapped - names)}"
        )
    return out


_ALL = slice(None)  # the whole of an axis


def _info(name: str, p, index, kind: str, full_shape, ref: str | None = None) -> ParamInfo:
    """The stage's parameter `name` holds reference[`ref` (default: the same name)][index]."""
    return ParamInfo(name, name if ref is None else ref, tuple(index), kind, tuple(p.shape), tuple(full_shape))


def _layer_pieces(pre: str, layer) -> list[ParamInfo]:
    """One Transformer layer: its LayerNorms (replicated), attention (head-sharded), and its MLP or MoE."""
    out = []
    for ln in ("ln1", "ln2"):
        for n, p in getattr(layer, ln).named_parameters():
            out.append(_info(f"{pre}{ln}.{n}", p, (_ALL,), "replicated", p.shape))
    attn, lay = layer.attn, layer.attn.layout
    dh = attn.d_head
    q_rows = _rows(lay.q_first * dh, lay.q_count * dh)
    kv_rows = _rows(lay.kv_first * dh, lay.kv_count * dh)
    for n, rows in (("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)):
        lin = getattr(attn, n)
        kind = "kv-replicated" if lin.replicas > 1 else "column"
        out.append(_info(f"{pre}attn.{n}.weight", lin.weight, (rows, _ALL), kind, lin.full_shape))
    o = attn.o_proj
    out.append(_info(f"{pre}attn.o_proj.weight", o.weight, (_ALL, q_rows), "row", o.full_shape))
    mlp = layer.mlp
    if isinstance(mlp, ExpertParallelMoE):
        return out + _moe_pieces(pre, mlp)
    if isinstance(mlp, TPMLP):
        return out + _mlp_pieces(pre, mlp)
    raise TypeError(f"layer {pre.split('.')[1]}: unexpected MLP {type(mlp).__name__}")


def _moe_pieces(pre: str, mlp) -> list[ParamInfo]:
    """The router (replicated), each expert's weight, whose full shape is the ETP-sharded axis times etp, and the
    shared experts' TP slices (column: up / gate, row: down; a dense MLP's kinds, so reduced as its weights are)."""
    out = []
    for local, p, ref, index in mlp.param_map():
        kind = "router" if local.startswith("router.") else "expert"
        full_shape = p.shape if kind == "router" else None
        if kind == "expert":
            shape = list(p.shape)
            d = 0 if isinstance(index[0], slice) and len(index) == 1 else 1
            shape[d] = shape[d] * mlp.etp_group.size
            full_shape = tuple(shape)
        out.append(_info(f"{pre}mlp.{local}", p, index, kind, full_shape, ref=f"{pre}mlp.{ref}"))
    if mlp.shared is not None:
        tp = mlp.shared.tp_group.size
        for local, p, ref, index in mlp.shared.param_map():
            d = len(index) - 1  # (rows,) for up / gate, (all, columns) for down
            full = list(p.shape)
            full[d] *= tp
            out.append(
                _info(f"{pre}mlp.{local}", p, index, "row" if d else "column", tuple(full), ref=f"{pre}mlp.{ref}")
            )
    return out


def _mlp_pieces(pre: str, mlp) -> list[ParamInfo]:
    """The dense MLP: gate and up column-sharded (rows of [h_ffn, h]), down row-sharded (columns of [h, h_ffn])."""
    out = []
    for n in (["gate_proj"] if mlp.kind == "swiglu" else []) + ["up_proj", "down_proj"]:
        lin = getattr(mlp, n)
        if n == "down_proj":
            per = lin.weight.shape[1]
            index = (_ALL, slice(lin.group.rank * per, (lin.group.rank + 1) * per))
            kind = "row"
        else:
            per = lin.weight.shape[0]
            index = (slice(lin.group.rank * per, (lin.group.rank + 1) * per), _ALL)
            kind = "column"
        out.append(_info(f"{pre}mlp.{n}.weight", lin.weight, index, kind, lin.full_shape))
    return out


def reduction_table(stage, mesh) -> list[Reduction]:
    """One `Reduction` per parameter of a `ParallelStage`, read from how each parameter is held (the flags the TP
    modules set: `p.sequence_parallel`, `p.kv_replicas`; the expert / router kinds of `parameter_map`)."""
    params = dict(stage.named_parameters())
    tp, dpcp, edp = mesh.tp.size, mesh["dp-cp"].size, mesh["edp"].size
    out = []
    for info in parameter_map(stage):
        p = params[info.name]
        sp = getattr(p, "sequence_parallel", False) and tp > 1
        replicas = getattr(p, "kv_replicas", 1)
        dense = ("dp-cp", dpcp, Fraction(1))  # the DP group, its size and the scale after its average
        if getattr(p, "shared_embedding", False):  # a tied embedding held on the first and the last stage
            pre, (group, size, scale) = EMBD, dense
            why = (
                "tied input/output embedding, one copy on the first stage, one on the last: average over "
                f"dp-cp={dpcp}, then sum over the embedding group (first and last pipeline stage)"
            )
        elif info.kind == "expert":
            pre, (group, size, scale) = None, ("edp", edp, Fraction(edp, dpcp))
            why = (
                f"complete over its EP x ETP group's tokens; the edp={edp} members hold disjoint tokens: "
                f"average over edp, then x edp/(dp*cp) = {edp}/{dpcp}"
            )
        elif replicas > 1:
            pre, (group, size, scale) = "tp/kv", dense
            why = (
                f"K/V head copied on {replicas} TP ranks, each with its own query heads' share: sum over them, "
                "average over dp-cp"
            )
        elif sp:
            pre, (group, size, scale) = "tp", dense
            what = "router" if info.kind == "router" else "replicated under SP"
            why = f"{what}: each TP rank saw s/(cp*tp) tokens: sum over tp={tp}, average over dp-cp={dpcp}"
        else:
            pre, (group, size, scale) = None, dense
            why = (
                "complete over the replica's tokens (TP collectives carried the rest): average over dp-cp "
                f"(dp*cp={dpcp} replicas of equal token counts)"
            )
        out.append(Reduction(info.name, info.ref_name, info.kind, pre, group, size, scale, why))
    return out


# ------------------------------------------------------------------------------------- held gradient elements


def _held_pieces(out: dict, layout, lo: int, hi: int, buf: torch.Tensor) -> None:
    """Add to `out` the piece of each parameter of `layout` inside elements [lo, hi) of its flat buffer, as
    (first, last+1 element of the parameter, the matching part of `buf`, which holds elements [lo, hi))."""
    for e in layout.entries:
        a, z = max(lo, e.offset), min(hi, e.offset + e.numel)
        if a < z:
            out.setdefault(e.name, []).append((a - e.offset, z - e.offset, buf[a - lo : z - lo]))


def held_gradient_pieces(dp) -> dict[str, list[tuple[int, int, torch.Tensor]]]:
    """After `finish_gradient_sync()`: for each parameter, the gradient elements this rank holds and the optimizer
    will read, as (lo, hi, view) -- elements [lo, hi) of the flattened parameter, a view into the wrapper's storage
    (so writing to it changes what the optimizer sees).

    DDP: the whole parameter (a view of its bucket). ZeRO-1: the part of this rank's slice of each bucket.
    ZeRO-2: the part of its kept gradient shard. ZeRO-3: the part of its flat shard's gradient."""
    out: dict[str, list[tuple[int, int, torch.Tensor]]] = {}
    if isinstance(dp, (DDPTrainer, ZeroDataParallel)):
        for b in (dp.ddp if isinstance(dp, DDPTrainer) else dp).buckets.buckets:
            _held_pieces(out, b.layout, *b.shard_range, b.held_grad)
    elif isinstance(dp, FullyShardedDataParallel):
        for unit in dp.units:
            for f in unit.flats:
                if f.grad is None:
                    f.shard.grad = torch.zeros_like(f.shard)
                _held_pieces(out, f.layout, *f.layout.shard_range(f.group.rank), f.grad)
    else:
        raise TypeError(f"unknown data-parallel wrapper {type(dp).__name__}")
    return out


def held_parameter_pieces(dp) -> dict[str, list[tuple[int, int, torch.Tensor]]]:
    """The parameter elements this rank holds, as `held_gradient_pieces` (ZeRO-3: its shard; otherwise the whole
    parameter, which DDP and ZeRO-1/2 keep on every rank)."""
    out: dict[str, list[tuple[int, int, torch.Tensor]]] = {}
    if isinstance(dp, FullyShardedDataParallel):
        for unit in dp.units:
            for f in unit.flats:
                _held_pieces(out, f.layout, *f.layout.shard_range(f.group.rank), f.shard.detach())
        return out
    for name, p in dp.module.named_parameters():
        out[name] = [(0, p.numel(), p.detach().reshape(-1))]
    return out


# ------------------------------------------------------------------------------------- the reductions


def _allreduce_pieces(views: list[torch.Tensor], group, phase_name: str, tag_name: str) -> None:
    if not views:
        return
    flat = torch.cat([v.reshape(-1) for v in views])
    with phase(phase_name), tag(tag_name):
        C.all_reduce_(flat, group)
    offset = 0
    for v in views:
        n = v.numel()
        v.copy_(flat[offset : offset + n].view_as(v))
        offset += n


def finalize_gradients(
    pieces: dict[str, list], table: list[Reduction], mesh, kv_replicas: dict[str, int], embedding_group=None
) -> dict:
    """The reductions that follow the data-parallel one (see the module docstring), on the held `pieces`.

    One all-reduce over TP for every "tp" parameter (phase "sp_grads"), one for every "tp/kv" parameter (phase
    "kv_grads": each rank writes its piece into slot rank // replicas of a zero buffer with tp / replicas slots, so
    the sum leaves in each slot the sum over exactly the ranks sharing that head), the expert scaling, and, for a
    tied embedding split over stages ("embd" rows), one all-reduce over `embedding_group` (the first and last
    pipeline rank, `pylib.pp.split.embedding_group`; phase "grad_sync", tag "embedding_grads").
    Returns the element counts reduced (for the traffic formulas)."""
    tp = mesh.tp
    sp_views = [v for r in table if r.pre == "tp" for _, _, v in pieces.get(r.name, [])]
    if tp.size > 1:
        _allreduce_pieces(sp_views, tp, SP_PHASE, "sequence_parallel_grads")
    kv_rules = [r for r in table if r.pre == "tp/kv"]
    kv_elems = 0
    if kv_rules and tp.size > 1:
        slots, targets = [], []
        for r in kv_rules:
            reps = kv_replicas[r.name]
            for _, _, v in pieces.get(r.name, []):
                buf = torch.zeros((tp.size // reps, v.numel()), dtype=v.dtype, device=v.device)
                buf[tp.rank // reps] = v.reshape(-1)
                slots.append(buf)
                targets.append((v, buf, tp.rank // reps))
        _allreduce_pieces(slots, tp, KV_PHASE, "replicated_kv_grads")
        for v, buf, slot in targets:
            v.copy_(buf[slot].view_as(v))
        kv_elems = sum(b.numel() for b in slots)
    for r in table:
        if r.scale != 1:
            for _, _, v in pieces.get(r.name, []):
                v.mul_(float(r.scale))
    embd_views = [v for r in table if r.pre == EMBD for _, _, v in pieces.get(r.name, [])]
    if embd_views and embedding_group is None:
        raise ValueError("this rank holds a tied embedding copy but no embedding group was given")
    _allreduce_pieces(embd_views, embedding_group, EMBD_PHASE, "embedding_grads")
    return dict(
        sp_elements=sum(v.numel() for v in sp_views) if tp.size > 1 else 0,
        kv_elements=kv_elems,
        embd_elements=sum(v.numel() for v in embd_views),
    )


def kv_replica_counts(stage: nn.Module) -> dict[str, int]:
    return {n: p.kv_replicas for n, p in stage.named_parameters() if getattr(p, "kv_replicas", 1) > 1}
