"""Global gradient-norm clipping: one norm over gradients that live in pieces on many ranks, each counted once.

    result = clip_grads(families, grads, max_norm=1.0)        # the generic form: families of counted gradients
    result.norm, result.coefficient, result.skipped           # the same on every rank
    model.step(ids, targets, clip=GradClip(1.0))               # the composed model: `held_norm_families` + this

The norm is that of the whole model's gradient as one vector, ||g|| = (sum over every reference element g_i^2)^(1/2),
as `torch.nn.utils.clip_grad_norm_` computes it on one device. A rank holds some elements once, some as copies of
another rank's and some not at all, so each rank sums the squares of the elements it *counts*, and one all-reduce
per family adds the partial sums over the ranks that hold different elements:

    family  counted on this rank                                      partial sums added over
    ------  --------------------------------------------------------  -------------------------------------------
    dense   TP slices (vocab, column, row; the shared experts'        tp-pp under DDP (the dp-cp replicas hold
            too) everywhere; a copy held on every TP rank             the same gradient: added once; EP ranks of
            (LayerNorms, the router) on TP rank 0 only; a K/V head    a shared slice are among them); the world
            copied on r TP ranks on the first of the r                under ZeRO (each dp-cp rank holds its own
                                                                      shard: all added)
    expert  every held expert slice (ETP x EP split)                  etp-ep-pp under DDP (edp replicas); the
                                                                      world under ZeRO (edp shards)

A tied embedding held on the first and the last pipeline stage is counted on the first stage only (the last stage's
copy is Megatron's `shared` parameter, left out by `param_is_not_shared`, megatron/core/transformer/module.py).

Then ||g||^2 = dense + expert on every rank, the clip coefficient min(1, max_norm / (||g|| + 1e-6)) multiplies every
held gradient, copies included. Before that, one all-reduce (minimum) over the whole world agrees on the first rank
holding a non-finite gradient element (copies included): if there is one, every rank skips the update, or raises
`NonFiniteGradientError`, whichever `on_nonfinite` says, so no rank updates while another does not.

This is how Megatron-Core does it (NVIDIA/Megatron-LM at d98e8a6): `megatron/core/optimizer/clip_grads.py`
`get_grad_norm_fp32` sums |g|^p of the gradients it is given, all-reduces the sum over a "grad stats" group and takes
the root; `clip_grad_by_total_norm_fp32` scales by max_norm / (norm + 1e-6) when that is below 1. The gradients
given are filtered in `megatron/core/optimizer/optimizer.py` `_filter_grads_for_norm` by
`param_is_not_tensor_parallel_duplicate` (`megatron/core/tensor_parallel/layers.py`: a parameter marked
`tensor_model_parallel`, or else TP rank 0 only -- expert parameters filtered over the expert TP group). The group is
the model-parallel group tp-pp for the dense optimizer and tp-ep-pp of the expert layout for the expert one
(`megatron/core/optimizer/__init__.py`, `get_megatron_optimizer`), whose two norms the `ChainedOptimizer` combines
as sqrt(a^2 + b^2); with the distributed optimizer both use the whole distributed-optimizer instance (the world).
The found-inf flag is all-reduced (max) over the same group in `_unscale_main_grads_and_check_for_nan`; pylib agrees
over the world instead, so a non-finite value on a rank outside a replica's group is seen too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from pylib.i18n import tr
from pylib.plan.fields import choice, number
from pylib.runtime import collectives as C
from pylib.runtime.launch import current_device
from pylib.runtime.tracer import phase, tag

CLIP_PHASE = "grad_norm"
EPS = 1e-6  # added to the norm before dividing, as torch and Megatron do
ON_NONFINITE = ("skip", "raise")


class ClipError(ValueError):
    """A clipping argument out of its range (max_norm <= 0 or NaN, a norm order below 1), named with its value."""


class NonFiniteGradientError(RuntimeError):
    """Raised on every rank when some rank holds a non-finite gradient and `on_nonfinite="raise"`."""

    def __init__(self, rank: int | None, norm: float):
        self.rank, self.norm = rank, norm
        if rank is None:
            text = tr("the global gradient norm is {norm}: every rank refuses the update", norm=norm)
        else:
            text = tr("rank {rank} holds a non-finite gradient: every rank refuses the update", rank=rank)
        super().__init__(text)


@dataclass(frozen=True)
class GradClip:
    """What to clip to: max_norm > 0 (inf: measure only), the norm's order p >= 1 or inf, and what every rank does
    when some rank holds a non-finite gradient ("skip" the update, or "raise")."""

    max_norm: float
    norm_type: float = 2.0
    on_nonfinite: str = "skip"

    def __post_init__(self):
        check_clip(self.max_norm, self.norm_type)
        choice("GradClip", "on_nonfinite", self.on_nonfinite, ON_NONFINITE)


def check_clip(max_norm, norm_type=2.0) -> None:
    """Refuse, with `ClipError` naming the value, a max_norm that is not a number > 0 (NaN included; inf is allowed
    and never clips) or a norm order that is not >= 1 (inf: the largest |g|)."""
    try:
        if not (isinstance(max_norm, float) and max_norm == math.inf):
            number("GradClip", "max_norm", max_norm, above=0)
        if not (isinstance(norm_type, (int, float)) and norm_type == math.inf):
            number("GradClip", "norm_type", norm_type, low=1)
    except (TypeError, ValueError) as e:
        raise ClipError(str(e)) from None


@dataclass(frozen=True)
class NormFamily:
    """Gradients whose partial sums are added over one group.

    name: "dense", "expert" ... grads: the gradient elements this rank counts (each reference element counted on
    exactly one rank of `over`). over: the `AxisGroup` whose members' partial sums make the family's total; every
    rank of the world must list the same families in the same order (with no grads where it holds none)."""

    name: str
    grads: tuple
    over: object  # an AxisGroup (pylib.runtime.mesh)


@dataclass(frozen=True)
class ClipResult:
    """What every rank agreed on. norm: the global norm (NaN when skipped); coefficient: what each gradient was
    multiplied by (1.0 when the norm was within max_norm, NaN when skipped); families: each family's norm;
    nonfinite_rank: the lowest rank holding a non-finite gradient element, or None (skipped with None: every
    element finite, but the norm overflowed)."""

    norm: float
    coefficient: float
    families: dict = field(default_factory=dict)
    nonfinite_rank: int | None = None

    @property
    def skipped(self) -> bool:
        return self.nonfinite_rank is not None or not math.isfinite(self.norm)

    @property
    def clipped(self) -> bool:
        return not self.skipped and self.coefficient < 1.0


def _accumulator(g: torch.Tensor) -> torch.dtype:
    """Megatron sums in fp32 (`get_grad_norm_fp32`); float64 gradients keep float64."""
    return torch.promote_types(g.dtype, torch.float32)


def local_sum(grads, norm_type: float = 2.0) -> torch.Tensor:
    """This rank's partial: the sum of |g|^p over `grads` (p = inf: the largest |g|), as a 0-dim float64 tensor on
    the rank's device (no host synchronisation here: the step waits once, at the all-reduce)."""
    total = torch.zeros((), dtype=torch.float64, device=current_device())
    for g in grads:
        if not g.numel():
            continue
        g = g.detach()
        if norm_type == math.inf:
            total = torch.maximum(total, g.abs().max().double())
        else:
            total = total + torch.linalg.vector_norm(g, norm_type, dtype=_accumulator(g)).double() ** norm_type
    return total


def first_nonfinite_rank(grads, world) -> int | None:
    """One all-reduce (minimum) of one int64 over `world`: the lowest global rank holding a non-finite element of
    `grads`, the same answer on every rank, or None."""
    bad = torch.zeros((), dtype=torch.bool, device=current_device())
    for g in grads:
        if g.numel():
            bad = bad | ~torch.isfinite(g.detach()).all()
    mine = torch.full((), world.global_rank, dtype=torch.int64, device=bad.device)
    t = torch.where(bad, mine, torch.full_like(mine, world.size)).reshape(1)
    with phase(CLIP_PHASE), tag("found_nonfinite"):
        C.all_reduce_(t, world, op="min")
    first = int(t)
    return None if first >= world.size else first


def global_norm(families, norm_type: float = 2.0) -> tuple[float, dict]:
    """The global norm and each family's, the same on every rank: one all-reduce per distinct group, carrying one
    float64 per family reduced over it (sum of |g|^p; max for p = inf)."""
    by_group: dict[tuple, list] = {}
    for f in families:
        by_group.setdefault(tuple(f.over.ranks), []).append(f)
    totals = {}
    op = "max" if norm_type == math.inf else "sum"
    for fams in by_group.values():
        t = torch.stack([local_sum(f.grads, norm_type) for f in fams])
        with phase(CLIP_PHASE), tag("grad_norm." + "+".join(f.name for f in fams)):
            C.all_reduce_(t, fams[0].over, op=op)
        totals.update({f.name: float(v) for f, v in zip(fams, t.tolist())})
    if norm_type == math.inf:
        return max(totals.values(), default=0.0), dict(totals)
    root = 1.0 / norm_type
    return sum(totals.values()) ** root, {k: v**root for k, v in totals.items()}


def clip_grads(families, grads, clip: GradClip, world) -> ClipResult:
    """Clip `grads` (every gradient this rank holds and its optimizer reads, copies included) to the global norm
    of `families`. First the non-finite check over `world`, then the norm; skipped (or raised) on every rank at
    once. Scales in place by max_norm / (norm + 1e-6) when that is below 1."""
    grads = [g for g in grads if g is not None]
    first = first_nonfinite_rank(grads, world)
    if first is not None:
        if clip.on_nonfinite == "raise":
            raise NonFiniteGradientError(first, math.nan)
        return ClipResult(math.nan, math.nan, {f.name: math.nan for f in families}, first)
    norm, per_family = global_norm(families, clip.norm_type)
    if not math.isfinite(norm):  # finite elements whose |g|^p overflowed: the same on every rank
        if clip.on_nonfinite == "raise":
            raise NonFiniteGradientError(None, norm)
        return ClipResult(norm, math.nan, per_family)
    coefficient = min(1.0, clip.max_norm / (norm + EPS))
    if coefficient < 1.0:
        for g in grads:
            g.mul_(coefficient)
    return ClipResult(norm, coefficient, per_family)


# ------------------------------------------------------------------------------------- the composed model


def counted_here(kind: str, tp, kv_replicas: int = 1) -> bool:
    """Whether this rank counts a parameter of `kind` (a row of `reductions.reduction_table`) in the norm: TP
    slices and expert slices always; a whole parameter copied on every TP rank (LayerNorms, the router) on TP
    rank 0 only; a K/V head copied on `kv_replicas` TP ranks on the first of them (Megatron's
    `param_is_not_tensor_parallel_duplicate`, plus the K/V copies Megatron does not make)."""
    if kind in ("replicated", "router"):
        return tp.rank == 0
    if kind == "kv-replicated":
        return tp.rank % kv_replicas == 0
    if kind in ("vocab", "column", "row", "expert"):
        return True
    raise ValueError(f"unknown parameter kind {kind!r}")


def held_norm_families(pieces, table, mesh, kv_replicas, *, sharded: bool, experts: bool) -> list[NormFamily]:
    """The composed model's families from what this rank holds after the gradient reductions.

    pieces: `reductions.held_gradient_pieces` (name -> [(lo, hi, view)]); table: the `Reduction` rows; sharded:
    ZeRO-1/2/3 (each dp-cp / edp rank holds its own shard: the partial sums go over the world) or DDP (replicas:
    over tp-pp, and etp-ep-pp for experts); experts: whether the model has MoE layers (every rank then joins the
    expert all-reduce, with nothing to add where its stages hold no expert)."""
    dense, expert = [], []
    for r in table:
        if r.pre == "embd" and r.name == "lm_head.weight":  # the last stage's copy of a tied embedding: the
            continue  # first stage counts it (Megatron's param_is_not_shared, megatron/core/transformer/module.py)
        if counted_here(r.kind, mesh.tp, kv_replicas.get(r.name, 1)):
            views = [v for _, _, v in pieces.get(r.name, [])]
            (expert if r.kind == "expert" else dense).extend(views)
    world = mesh.world
    out = [NormFamily("dense", tuple(dense), world if sharded else mesh["tp-pp"])]
    if experts:
        out.append(NormFamily("expert", tuple(expert), world if sharded else mesh["etp-ep-pp"]))
    return out


def clip_held_gradients(pieces, table, mesh, kv_replicas, clip: GradClip, *, sharded: bool, experts: bool):
    """`clip_grads` on a composed model's held gradient pieces (every view scaled, copies included)."""
    families = held_norm_families(pieces, table, mesh, kv_replicas, sharded=sharded, experts=experts)
    views = [v for ps in pieces.values() for _, _, v in ps]
    return clip_grads(families, views, clip, mesh.world)
