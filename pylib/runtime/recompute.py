"""Activation recomputation in torch: run part of the forward again in backward instead of keeping its activations.

    core = RecomputedCore(core)              # selective: the attention core keeps only q, k, v
    x = run_layers(layers, x, positions, recompute=Recompute("full", "uniform", 2))

Both go through `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)` (torch 2.6's API). The region's tensor
inputs are saved once (autograd's saved-tensor hooks see them: `saved_activations` counts them); what the region saves
inside is dropped and rebuilt by running it again when backward first needs it. Collectives inside the region run
again in that second forward (an SP all-gather, a TP all-reduce, ring attention's K/V passes): the tracer shows them in
backward, under the tracer's phase "recompute" (the forward's own are "forward", the gradients' "backward"). Our
forward has no dropout and draws no random numbers, so the RNG state is not saved
(preserve_rng_state=False) and the rerun computes bit-identical values: the gradients equal those without recompute.
Which layers a stage recomputes is `pylib.plan.recompute.Recompute.groups`.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils.checkpoint import checkpoint

from pylib.plan.recompute import Recompute, as_recompute

from .tracer import current_phase, phase


def recomputed(fn, *tensors: torch.Tensor):
    """fn(*tensors), keeping only `tensors` for backward and running fn again there (traced as "recompute")."""

    def run(*args):
        rerun = current_phase() == "backward"
        with phase("recompute") if rerun else contextlib.nullcontext():
            return fn(*args)

    return checkpoint(run, *tensors, use_reentrant=False, preserve_rng_state=False)


def is_recomputing() -> bool:
    """True inside the second forward of a recomputed region (forward hooks that log use it to log once)."""
    return current_phase() == "recompute"


class RecomputedCore:
    """An attention core `core(q, k, v, positions)` whose internals are recomputed in backward (selective
    recomputation): it keeps q [b, heads, s, d_head], k, v [b, kv_heads, s, d_head], not the scores, the mask or the
    softmax. `positions` is the caller's (it lives as long as the caller does), so it is not saved again."""

    def __init__(self, core):
        self.core = core

    def __call__(self, q, k, v, positions=None):
        return recomputed(lambda q_, k_, v_: self.core(q_, k_, v_, positions), q, k, v)

    def __getattr__(self, name):  # the wrapped core's attributes (cp_size, layout, ...) stay visible
        if name == "core":
            raise AttributeError(name)
        return getattr(self.core, name)

    def __repr__(self) -> str:
        return f"RecomputedCore({self.core!r})"


def run_layers(layers, x, positions=None, *, recompute: Recompute | str = Recompute(), wrap=None):
    """x -> layers[-1](... layers[0](x, positions)), with "full" recomputation over the groups that
    `Recompute.groups(len(layers))` names (a granularity string is `Recompute(granularity)`). wrap(i, layer, x):
    how to call one layer (the callers' tracer tags); default layer(x, positions)."""
    layers = list(layers)
    call = wrap if wrap is not None else (lambda i, layer, x_: layer(x_, positions))

    def run(positions_in_group, x_):
        for i in positions_in_group:
            x_ = call(i, layers[i], x_)
        return x_

    for group, whole in as_recompute(recompute).groups(len(layers)):
        x = recomputed(lambda x_, g=group: run(g, x_), x) if whole and torch.is_grad_enabled() else run(group, x)
    return x
