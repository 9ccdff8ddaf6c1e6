"""Mixed precision: 16-bit compute, fp32 master weights and optimizer state, gradients reduced in a stated dtype.

The recipe every published large run uses (ZeRO paper section 3.1; Megatron's distributed optimizer):

    forward, backward   in the compute dtype (bf16 or fp16): parameters Psi_c = 2 bytes each, autograd's gradients too
    reduce              gradients cast to the reduce dtype (bf16, or fp32 = Megatron's `grad_reduce_in_fp32`) and
                        averaged over the data-parallel group in it; the buffers the wrappers keep are in that dtype
    step                the reduced gradient cast to fp32 (and, with fp16, divided by the loss scale), Adam on the fp32
                        master copy (4 bytes) with fp32 moments (4 + 4 bytes), the master cast back to the compute dtype

So K = 12 bytes of optimizer state per parameter (master, momentum, variance), held by `MasterWeights` for the
tensors a rank updates: DDP every parameter, ZeRO-1/2 its slice of each flat bucket, ZeRO-3 its parameter shards
-- Megatron's distributed optimizer is ZeRO-1 with exactly this state sharded.

fp16 has 5 exponent bits, so small gradients underflow: the loss is multiplied by a scale before backward
(`scale_loss`), the fp32 gradient divided by it, and a step whose gradients hold an inf or nan is skipped and the
scale halved ("dynamic"; it doubles again after `growth_interval` clean steps). Under ZeRO each rank sees only its
slice, so the inf flag is all-reduced (max) over the group before anyone decides.

Guards (`LossScaler`): a recipe whose scale cannot work (infinite, below 1, above 2**64) is refused when it is
checked; 64 consecutive skipped steps raise `LossScaleError` with the scale history; a step whose unscaled
gradients are all zero is warned about (`ZeroGradientsWarning`), read from the same max-reduced flag.

`SingleDeviceMixed` runs the same recipe on one device with the same rounding points as a d-rank run: d
micro-batches, each one's 16-bit gradient cast to the reduce dtype, summed in that dtype in rank order and divided
by d, then the fp32 update. With d = 2 a sum of two numbers rounds the same in either order and halving is exact,
so the d-rank run equals it bit for bit; with more ranks the reduction order may differ (about 1 ulp of the reduce
dtype per element).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn as nn

from pylib.model import torch_dtype
from pylib.model.fp8 import to_fp8
from pylib.plan.fields import instance
from pylib.plan.options import MAX_CONSECUTIVE_SKIPS, MixedPrecision

from ..runtime import collectives as C
from .batch import micro_batch
from .memory import optimizer_state_tensors


def cast_module(module: nn.Module, recipe: MixedPrecision) -> nn.Module:
    """The module's floating-point parameters and buffers in the compute dtype (in place; returns the module); with an
    FP8 recipe (`recipe.fp8`) its linear layers also run their GEMMs in FP8 (`pylib.model.fp8.to_fp8`)."""
    module = module.to(torch_dtype(recipe.compute))
    return module if recipe.fp8 is None else to_fp8(module, recipe.fp8)


class LossScaleError(RuntimeError):
    """Loss scaling skipped MAX_CONSECUTIVE_SKIPS steps in a row: no scale makes these gradients finite."""


class ZeroGradientsWarning(UserWarning):
    """A step whose gradients, unscaled, are zero everywhere (the loss scale let them underflow, or nothing
    reached the loss)."""


class LossScaler:
    """The loss scale of a recipe: 1 without loss scaling, fixed ("static") or adapted to overflow ("dynamic").

    Guards: the recipe's scale must work at all (`pylib.plan.options.loss_scale_problems`, checked when the
    recipe is built); MAX_CONSECUTIVE_SKIPS skipped steps in a row raise LossScaleError with the scale history (a
    recipe that skips every step would otherwise train on nothing while its losses look normal); a step whose
    unscaled gradients are all zero is counted in `zero_steps` and warned about (ZeroGradientsWarning)."""

    def __init__(self, recipe: MixedPrecision, max_skips: int = MAX_CONSECUTIVE_SKIPS):
        self.recipe = instance("LossScaler", "recipe", recipe, MixedPrecision)
        self.scale = 1.0 if recipe.loss_scaling == "none" else float(recipe.loss_scale)
        self.clean_steps = 0
        self.skipped = 0
        self.zero_steps = 0
        self.max_skips = max_skips
        self.history: list[tuple[float, bool]] = []  # (scale, overflow) of the steps since the last clean one

    @property
    def checks_overflow(self) -> bool:
        return self.recipe.loss_scaling != "none"

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss if self.scale == 1.0 else loss * self.scale

    def update(self, overflow: bool) -> None:
        self.history = self.history + [(self.scale, overflow)] if overflow else []
        if overflow:
            self.skipped += 1
            if len(self.history) >= self.max_skips:
                scales = ", ".join(f"{s:g}" for s, _ in self.history)
                raise LossScaleError(
                    f"{len(self.history)} consecutive steps skipped by {self.recipe.loss_scaling} loss scaling "
                    f"(MAX_CONSECUTIVE_SKIPS = {self.max_skips}): every step's gradients held an inf or nan at "
                    f"scales {scales}; no scale makes them finite (a nan or inf in the loss or the model?)"
                )
        if self.recipe.loss_scaling != "dynamic":
            return
        if overflow:
            self.scale, self.clean_steps = self.scale / 2, 0
        else:
            self.clean_steps += 1
            if self.clean_steps == self.recipe.growth_interval:
                self.scale, self.clean_steps = self.scale * 2, 0

    def report_zero(self) -> None:
        """Count and warn about a step whose unscaled gradients are zero everywhere."""
        self.zero_steps += 1
        warnings.warn(
            ZeroGradientsWarning(
                f"every gradient is zero after unscaling (loss scale {self.scale:g}, {self.recipe.compute} compute): "
                "the scaled gradients underflowed, or no parameter reached the loss; the step changes nothing"
            ),
            stacklevel=3,
        )


class MasterWeights:
    """fp32 master copies of `low` (16-bit tensors the model computes with, or this rank's slices of them) and the
    optimizer over the masters. `step(grads)` takes one reduced gradient per tensor (any dtype, or None: no update),
    updates the masters and copies them back into `low`. groups: where an overflow flag must be agreed (the groups
    whose members each see only a slice of the gradients; empty for DDP, where every rank sees the same)."""

    def __init__(self, low: list[torch.Tensor], recipe: MixedPrecision, optimizer, groups=(), **optim_kwargs):
        self.recipe = instance("MasterWeights", "recipe", recipe, MixedPrecision)
        self.low = list(low)
        master = torch_dtype(recipe.master)
        self.master = [t.detach().to(master, copy=True) for t in self.low]
        self.optimizer = optimizer(self.master, **optim_kwargs)
        self.scaler = LossScaler(recipe)
        self.groups = list({(g.name, g.ranks): g for g in groups}.values())

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale_loss(loss)

    def step(self, grads: list[torch.Tensor | None]) -> bool:
        """One optimizer step on the masters; False (nothing changed) when loss scaling found an inf or nan."""
        if len(grads) != len(self.master):
            raise ValueError(f"{len(self.master)} master tensors but {len(grads)} gradients")
        inverse = 1.0 / self.scaler.scale
        for m, g in zip(self.master, grads):
            if g is None:
                m.grad = None
                continue
            mg = g.detach().reshape(m.shape).to(m.dtype, copy=True)
            if inverse != 1.0:
                mg.mul_(inverse)
            m.grad = mg
        overflow = False
        if self.scaler.checks_overflow:
            # one number, max-reduced over the groups: 1 an inf/nan somewhere, else 0 a non-zero gradient
            # somewhere, else -1 (every gradient zero): the all-zero report costs no byte more
            state = -1.0
            for m in self.master:
                if m.grad is None:
                    continue
                if not bool(torch.isfinite(m.grad).all()):
                    state = 1.0
                    break
                if state < 0 and bool(m.grad.any()):
                    state = 0.0
            flag = torch.full((), state, dtype=torch.float32, device=self.master[0].device)
            for g in self.groups:
                C.all_reduce_(flag, g, op="max", phase="optimizer", tag="mixed.overflow")
            overflow = flag.item() > 0
            if flag.item() < 0 and any(m.grad is not None for m in self.master):
                self.scaler.report_zero()
        if not overflow:
            self.optimizer.step()
            with torch.no_grad():
                for t, m in zip(self.low, self.master):
                    t.copy_(m.view(t.shape))
        for m in self.master:
            m.grad = None  # the fp32 gradient is transient: the reduced buffer is what a rank keeps
        self.scaler.update(overflow)
        return not overflow

    def state_tensors(self) -> list[torch.Tensor]:
        """The fp32 masters and the optimizer's state: the K bytes per parameter."""
        return self.master + optimizer_state_tensors(self.optimizer)


class SingleDeviceMixed:
    """The recipe on one device with a d-rank run's rounding points (see the module docstring).

    `module` is cast to the compute dtype; `train_step(ids, targets)` runs `parts` micro-batches ([b/parts, s]
    rows each), reduces their gradients as the data-parallel run does, steps, and returns the mean loss."""

    def __init__(self, module: nn.Module, recipe: MixedPrecision, parts: int, optimizer=torch.optim.Adam, **kw):
        self.module, self.recipe, self.parts = (
            cast_module(module, instance("SingleDeviceMixed", "recipe", recipe, MixedPrecision)),
            recipe,
            parts,
        )
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.weights = MasterWeights(self.params, recipe, optimizer, **kw)

    @property
    def scaler(self) -> LossScaler:
        return self.weights.scaler

    def train_step(self, ids: torch.Tensor, targets: torch.Tensor) -> float:
        reduce = torch_dtype(self.recipe.grad_reduce)
        total = [torch.zeros(p.shape, dtype=reduce) for p in self.params]
        losses = []
        for r in range(self.parts):
            loss = self.module.loss(micro_batch(ids, r, self.parts), micro_batch(targets, r, self.parts))
            self.weights.scale_loss(loss).backward()
            losses.append(float(loss.detach()))
            for t, p in zip(total, self.params):
                if p.grad is not None:
                    t.add_(p.grad.to(reduce))
                p.grad = None
        self.weights.step([t.div_(self.parts) for t in total])
        return sum(losses) / self.parts
