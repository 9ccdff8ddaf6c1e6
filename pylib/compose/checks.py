"""Every constraint a composed TP x SP x CP x EP x DP x PP run must satisfy, checked up front, ALL reported at once.

The rules live in `pylib.plan.problems` (one validity model, asked by the modes, compose, the explorer and the
planner alike); this module gives them compose's keyword arguments, the options of `ParallelTransformer.from_full`.

    problems = compose_problems(model_cfg, ParallelConfig(tp=2, cp=2, dp=2, pp=2), world_size=16, batch=8, seq=16)
    check_compose(...)          # raises ComposeConfigError(problems) when the list is not empty

A model is built with `training=False` (what building and evaluating need); `training_problems` is what its training
step refuses besides, as Megatron-Core's MoELayer.forward does (a MoE layer under TP without SP).
"""

from __future__ import annotations

from pylib.i18n import tr
from pylib.plan.mesh import ParallelConfig
from pylib.plan.options import CP_KINDS, ZERO_STAGES, RunOptions
from pylib.plan.problems import ComposeConfigError, problems, training_problems

__all__ = [
    "CP_KINDS",
    "ZERO_STAGES",
    "ComposeConfigError",
    "check_compose",
    "compose_problems",
    "refuse_training",
    "training_problems",
]


def compose_problems(
    cfg,
    par: ParallelConfig,
    world_size: int | None = None,
    *,
    batch=None,
    seq=None,
    options=RunOptions(),
    training: bool = True,
) -> list[str]:
    """Every violated constraint of training model `cfg` (a `pylib.model.ModelConfig`) on `par` over `world_size`
    ranks with a global batch [batch, seq] and `options` (a `pylib.plan.RunOptions`); empty when it can run.
    `batch` / `seq` None skip the data checks; training=False leaves out what only a training step refuses."""
    return problems(cfg, par, world_size, batch=batch, seq=seq, options=options, training=training)


def check_compose(cfg, par: ParallelConfig, world_size: int | None = None, **kwargs) -> None:
    """Raise `ComposeConfigError` listing every problem `compose_problems` finds."""
    found = compose_problems(cfg, par, world_size, **kwargs)
    if found:
        raise ComposeConfigError(found, tr("ParallelConfig({plan}) on {n} ranks", plan=par.describe(), n=world_size))


def refuse_training(cfg, par: ParallelConfig, options: RunOptions, where) -> None:
    """Raise `ComposeConfigError` if a training forward of `cfg` on `par` with `options` is refused
    (`training_problems`); `where()` names the forward, e.g. "the training step" (a function, so that the words
    are translated only when refusing: a rank run that translates nothing is the same in either language, which
    lets the book's two editions share it, see pylib.i18n.editions)."""
    found = training_problems(cfg, par, options)
    if found:
        raise ComposeConfigError(found, where())
