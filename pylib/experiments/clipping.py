"""Global gradient-norm clipping, run: one step of the composed model with `GradClip`, and the one-device reference.

    results = launch(clipped_step, 8, cfg, ParallelConfig(tp=2, dp=2, pp=2, ep=4), RunOptions(), clip=GradClip(0.5))
    ref = reference_clip(cfg, GradClip(0.5))           # torch.nn.utils.clip_grad_norm_ on one device
    results[r]["norm"] == ref["norm"]; results[r]["grads"] are pieces of ref["grads"]     (`compare_clip`)

`clipped_step` also records what the book draws and counts: each held parameter's kind, family, whether this rank
counts it and its sum of squares; this rank's partial sums; the traced grad_norm traffic; and (`pitfalls=True`, a
measure-only step) the norms two miscounts would give on this rank.
"""

from __future__ import annotations

import math

import torch

from pylib.compose import ParallelTransformer
from pylib.compose.clip import GradClip, NormFamily, counted_here, global_norm, held_norm_families, local_sum
from pylib.model import batches, build_model
from pylib.plan.options import RunOptions, ZeroStage
from pylib.runtime import Mesh, ParallelConfig, current_device
from pylib.runtime.tracer import trace


def clipped_step(
    model_cfg,
    par: ParallelConfig,
    options: RunOptions = RunOptions(),
    *,
    clip: GradClip,
    batch: int = 8,
    seq: int = 16,
    data: str = "pattern",
    pitfalls: bool = False,
) -> dict:
    """Inside a launched rank: one step of the composed model on batch 0 with `clip`; returns this rank's record
    (the agreed norm and coefficient, its clipped gradient pieces as (reference name, index, lo, hi, values), its
    parameter pieces after the step, what it counts, the traced grad_norm events)."""
    mesh = Mesh(par)
    full = build_model(model_cfg).to(current_device())
    model = ParallelTransformer.from_full(full, mesh, options, batch=batch, seq=seq, lr=1e-2)
    before = model.parameter_pieces()
    ids, targets = batches(model_cfg, batch, seq, 0, data=data)
    with trace() as tr:
        res = model.step(ids, targets, measure_memory=False, clip=clip)
    c = res.clip
    pieces = model.gradient_pieces()
    sharded = model.zero_stage != ZeroStage.DDP
    out = dict(
        rank=mesh.global_rank,
        coords={k: mesh[k].rank for k in ("tp", "cp", "dp", "pp", "ep", "etp", "edp", "dp-cp")},
        norm=c.norm,
        coefficient=c.coefficient,
        families=dict(c.families),
        nonfinite_rank=c.nonfinite_rank,
        skipped=c.skipped,
        loss=res.loss,
        grads=_reference_pieces(model, pieces),
        params_before=before,
        params=model.parameter_pieces(),
        held=_held_rows(model, pieces, mesh, c.coefficient),
        events=[e.as_dict() for e in tr.events if e.phase == "grad_norm"],
        step_bytes_sent=sum(e.bytes_sent for e in tr.events if e.phase != "grad_norm"),
        groups={
            "dense": _group_of(mesh, sharded, "tp-pp"),
            "expert": _group_of(mesh, sharded, "etp-ep-pp"),
        },
    )
    if pitfalls:  # the step scaled every gradient by one coefficient: divide it out to get the norms before
        wrong = miscounted_norms(model, pieces, mesh, sharded)
        out["pitfalls"] = {k: v / c.coefficient for k, v in wrong.items()}
    return out


def _group_of(mesh, sharded: bool, name: str) -> list[int]:
    return list(mesh.world.ranks if sharded else mesh[name].ranks)


def _reference_pieces(model, pieces) -> list[tuple]:
    """(reference name, index, lo, hi, values) of every gradient element this rank holds."""
    out = []
    for info in model.infos:
        for lo, hi, v in pieces.get(info.name, []):
            out.append((info.ref_name, info.ref_index, lo, hi, v.detach().clone()))
    return out


def _held_rows(model, pieces, mesh, coefficient: float) -> list[dict]:
    """Per held parameter: reference name, kind, family, whether counted here, held elements, and the sum of
    squares of its held gradient before the step scaled it by `coefficient`."""
    rows = []
    for r, info in zip(model.table, model.infos):
        views = [v for _, _, v in pieces.get(r.name, [])]
        rows.append(
            dict(
                ref_name=info.ref_name,
                kind=r.kind,
                family="expert" if r.kind == "expert" else "dense",
                counted=counted_here(r.kind, mesh.tp, model.kv_replicas.get(r.name, 1)),
                elements=sum(v.numel() for v in views),
                sumsq=float(local_sum(views)) / coefficient**2,
            )
        )
    return rows


def miscounted_norms(model, pieces, mesh, sharded: bool) -> dict:
    """The norm on this rank as counted right, and as two bugs count it (each one more all-reduce per family):
    "tp_copies": every TP rank counts its copy of the LayerNorms, the router and replicated K/V;
    "experts_as_dense": the expert slices counted in the dense family, summed over the dense group."""
    experts = model.cfg.moe is not None
    right = held_norm_families(pieces, model.table, mesh, model.kv_replicas, sharded=sharded, experts=experts)
    every = [v for r in model.table if r.kind != "expert" for _, _, v in pieces.get(r.name, [])]
    copies = [NormFamily("dense", tuple(every), right[0].over), *right[1:]]
    out = dict(right=global_norm(right)[0], tp_copies=global_norm(copies)[0])
    if experts:
        merged = [NormFamily("dense", right[0].grads + right[1].grads, right[0].over)]
        out["experts_as_dense"] = global_norm(merged)[0]
    return out


def reference_clip(model_cfg, clip: GradClip, *, batch: int = 8, seq: int = 16, data: str = "pattern") -> dict:
    """One device: the reference model's gradient of the mean loss on batch 0, clipped by
    `torch.nn.utils.clip_grad_norm_`. Returns norm (before clipping), the gradients after, and the norm of each
    kind of parameter (for the book's tables)."""
    model = build_model(model_cfg)
    ids, targets = batches(model_cfg, batch, seq, 0, data=data)
    model.loss(ids, targets).backward()
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    # foreach=False: the per-tensor loop (the fused path first imports torch._dynamo, ~10 s)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip.max_norm, clip.norm_type, foreach=False)
    return dict(norm=float(norm), grads={n: p.grad.detach().clone() for n, p in model.named_parameters()})


def compare_clip(results: list[dict], ref: dict) -> dict:
    """Largest differences of the ranks' norms and held clipped gradients from the reference; which reference
    parameters no rank held; the spread of the norm and coefficient over the ranks."""
    norm_err = max(abs(r["norm"] - ref["norm"]) for r in results)
    grad_err, covered = 0.0, set()
    for r in results:
        for name, index, lo, hi, t in r["grads"]:
            want = ref["grads"][name][index].reshape(-1)[lo:hi]
            if t.numel():
                grad_err = max(grad_err, float((t - want).abs().max()))
            covered.add(name)
    coefficients = {r["coefficient"] for r in results}
    return dict(
        norm_err=norm_err,
        grad_err=grad_err,
        missing=sorted(set(ref["grads"]) - covered),
        coefficient_spread=max(coefficients) - min(coefficients) if coefficients else math.nan,
    )


def clipped_steps(runs: dict, clip: GradClip, pitfalls: bool = False) -> dict:
    """Inside a launched rank: `clipped_step` for each named (cfg, ParallelConfig, RunOptions) of `runs` in turn,
    on the same ranks (one launch pays the start-up once). Returns {name: this rank's record}."""
    torch.set_num_threads(1)
    return {name: clipped_step(cfg, pc, opts, clip=clip, pitfalls=pitfalls) for name, (cfg, pc, opts) in runs.items()}
