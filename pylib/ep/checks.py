"""The constraints an expert-parallel MoE must satisfy, checked up front and reported with the numbers."""

from __future__ import annotations

from pylib.plan.config import MoEConfig
from pylib.plan.problems import expert_parallel_problems

__all__ = ["check_expert_parallel", "check_orthogonal", "expert_parallel_problems"]


def check_expert_parallel(cfg: MoEConfig, *, ep: int, etp: int, d_ff_expert: int) -> None:
    """Raise one ValueError naming every violated constraint, e.g. "ep=3 does not divide n_experts=8"."""
    problems = expert_parallel_problems(cfg, ep=ep, etp=etp, d_ff_expert=d_ff_expert)
    if problems:
        raise ValueError(f"cannot split this MoE over ep={ep}, etp={etp}: " + "; ".join(problems))


def check_orthogonal(ep_ranks, etp_ranks, me: int) -> None:
    """The EP and ETP groups of one rank must meet in that rank only (together they form an ETP x EP grid)."""
    shared = sorted(set(ep_ranks) & set(etp_ranks) - {me})
    if shared:
        raise ValueError(
            f"the ep group {tuple(ep_ranks)} and the etp group {tuple(etp_ranks)} of rank {me} also share ranks "
            f"{shared}: each expert slice must live on exactly one rank (ETP x EP is a grid)"
        )
