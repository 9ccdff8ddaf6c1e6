"""Every constraint a composed TP x SP x CP x EP x DP x PP run must satisfy, checked up front, ALL reported at once.

The rules live in `pylib.plan.problems` (one validity model, asked by the modes, compose, the explorer and the
planner alike); this module gives them compose's keyword arguments, the options of `ParallelTransformer.from_full`.

    problems = compose_problems(model_cfg, ParallelConfig(tp=2, cp=2, dp=2, pp=2), world_size=16, batch=8, seq=16)
    check_compose(...)          # raises ComposeConfigError(problems) when the list is not empty
"""

from __future__ import annotations

from pylib.i18n import tr
from pylib.plan.mesh import ParallelConfig
from pylib.plan.options import CP_KINDS, ZERO_STAGES, RunOptions
from pylib.plan.problems import ComposeConfigError, problems

__all__ = ["CP_KINDS", "ZERO_STAGES", "ComposeConfigError", "check_compose", "compose_problems"]


def compose_problems(
    cfg, pc: ParallelConfig, world_size: int | None = None, *, batch=None, seq=None, **options
) -> list[str]:
    """Every violated constraint of running model `cfg` (a `pylib.model.ModelConfig`) on `pc` over `world_size`
    ranks with a global batch [batch, seq]; empty when it can run. `batch` / `seq` None skip the data checks.
    options: the fields of `pylib.plan.RunOptions` (sequence_parallel, cp_layout, cp_kind, schedule,
    n_microbatches, v, zero_stage, recompute, recompute_method, recompute_num_layers), their defaults RunOptions's."""
    return problems(cfg, pc, world_size, batch=batch, seq=seq, options=RunOptions(**options))


def check_compose(cfg, pc: ParallelConfig, world_size: int | None = None, **kwargs) -> None:
    """Raise `ComposeConfigError` listing every problem `compose_problems` finds."""
    found = compose_problems(cfg, pc, world_size, **kwargs)
    if found:
        raise ComposeConfigError(found, tr("ParallelConfig({plan}) on {n} ranks", plan=pc.describe(), n=world_size))
