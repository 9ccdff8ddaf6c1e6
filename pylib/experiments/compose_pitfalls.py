"""The composition's bookkeeping bugs, injected into the real `ParallelTransformer`, one SGD step each.

    out = launch(one_step_each, 8, cfg, pc, variants, batch=8, seq=16, lr=0.5)
    ratios, worst = update_ratios(out, name, cfg, batch=8, seq=16, lr=0.5)
    out = launch(build_train_evaluate, 8, cfg, pc, options, batch=8, seq=16)   # what is refused, and where

`variants` maps a name to (`RunOptions`, bug, unchecked): `bug(model)` returns a context manager that injects the
bug (a `mock.patch` of one method or one table; None for the right run), and `unchecked` skips the configuration
checks, those of building and those of a training step (to train a combination `compose_problems` refuses, and show
why it is refused).
"""

from __future__ import annotations

from contextlib import nullcontext
from unittest import mock

import torch

import pylib.compose.checks as compose_checks
import pylib.compose.model as compose_model
from pylib.compose import ComposeConfigError, ParallelTransformer
from pylib.compose.model import local_batch
from pylib.model import batches, build_model
from pylib.runtime import Mesh, trace

from .compose_training import train_reference

DP_AXES = ("dp-cp", "edp")


def one_step_each(cfg, par, variants: dict, *, batch: int, seq: int, lr: float) -> dict:
    """On every rank: for each variant, the composed model from the same initial weights, one SGD step on step
    0's batch with the variant's bug injected. Per variant: the loss, the parameter pieces it holds afterwards,
    its reduction table, its DP reductions in backward, its TP sums after backward and its DP bytes sent."""
    mesh = Mesh(par)
    out = {}
    for name, (options, bug, unchecked) in variants.items():
        no_check = mock.patch.object(compose_model, "check_compose", lambda *a, **k: None)
        with no_check if unchecked else nullcontext():
            full = build_model(cfg)
            model = ParallelTransformer.from_full(full, mesh, options, optimizer=torch.optim.SGD, lr=lr)
        if unchecked:
            model.check_batch = lambda batch, seq: None
        # the refusal of a training forward (Megatron's MoELayer.forward), looked up when the step runs
        no_refusal = mock.patch.object(compose_checks, "training_problems", lambda *a, **k: [])
        with no_refusal if unchecked else nullcontext(), bug(model) if bug else nullcontext(), trace() as tr:
            res = model.step(*batches(cfg, batch, seq, 0, data="pattern"), measure_memory=False)
        events = tr.events
        out[name] = dict(
            loss=res.loss,
            params=model.parameter_pieces(),
            table=model.reduction_table(),
            dp_ops=sum(1 for e in events if e.axis in DP_AXES and e.phase == "backward"),
            tp_sums=sum(1 for e in events if e.phase == "sp_grads"),
            dp_bytes=sum(e.bytes_sent for e in events if e.axis in DP_AXES),
        )
    return out


def build_train_evaluate(cfg, par, options, *, batch: int, seq: int) -> dict:
    """On every rank, the three things a framework can refuse, tried in turn on step 0's batch: building the
    composed model, a training step, and an evaluation (the stage in eval mode under no_grad; pp = 1). Returns the
    problems each refused with (None: accepted), this rank's evaluated loss (mean over its tokens) and its dp-cp
    index. With a MoE model, tp > 1 and no SP, Megatron-Core builds and evaluates, and refuses the training forward
    (MoELayer.forward); so does the composed model."""
    if par.pp != 1:
        raise ValueError(f"build_train_evaluate evaluates one stage: pp={par.pp} must be 1")
    mesh = Mesh(par)
    out = dict(build=None, train=None, train_forward=None, eval_loss=None, dp_cp=mesh["dp-cp"].rank)
    try:
        model = ParallelTransformer.from_full(build_model(cfg), mesh, options)
    except ComposeConfigError as exc:
        out["build"] = exc.problems
        return out
    ids, targets = batches(cfg, batch, seq, 0, data="pattern")
    try:
        model.step(ids, targets, measure_memory=False)
    except ComposeConfigError as exc:
        out["train"] = exc.problems
    stage = model.stages[0]
    mine = local_batch(ids, mesh, options.cp_layout), local_batch(targets, mesh, options.cp_layout)
    try:  # the stage's own forward in training mode: the MoE layer refuses it
        stage(*mine)
    except ComposeConfigError as exc:
        out["train_forward"] = exc.problems
    stage.eval()
    with torch.no_grad():
        out["eval_loss"] = float(stage(*mine))
    return out


def update_ratios(results: list[dict], name: str, cfg, *, batch: int, seq: int, lr: float):
    """||update on the ranks|| / ||update on one device|| per kind of parameter (LayerNorm, experts, router,
    TP-split weights), over the pieces every rank holds; and the largest parameter difference."""
    before = dict(build_model(cfg).named_parameters())
    ref = train_reference(cfg, steps=1, batch=batch, seq=seq, data="pattern", optimizer=torch.optim.SGD, lr=lr)
    after = ref["params"]
    kind_of = {row["ref_name"]: row["kind"] for r in results for row in r[name]["table"]}
    group = {"replicated": "LayerNorm", "expert": "experts", "router": "router"}
    num, den, worst = {}, {}, 0.0
    for r in results:
        for ref_name, index, lo, hi, t in r[name]["params"]:
            b0 = before[ref_name].detach()[index].reshape(-1)[lo:hi]
            want = after[ref_name][index].reshape(-1)[lo:hi]
            g = group.get(kind_of[ref_name], "TP-split weights")
            num[g] = num.get(g, 0.0) + float((t - b0).pow(2).sum())
            den[g] = den.get(g, 0.0) + float((want - b0).pow(2).sum())
            worst = max(worst, float((t - want).abs().max()) if t.numel() else 0.0)
    return {g: (num[g] / den[g]) ** 0.5 for g in num}, worst
