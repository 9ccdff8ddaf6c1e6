"""The constraints an expert-parallel MoE must satisfy, checked up front and reported with the numbers."""

from __future__ import annotations

from pylib.model.config import MoEConfig


def expert_parallel_problems(cfg: MoEConfig, *, ep: int, etp: int, d_ff_expert: int) -> list[str]:
    """Every violated constraint of running `cfg` with `ep` expert-parallel and `etp` expert-tensor-parallel
    ranks, as sentences (empty when it can run)."""
    out = []
    if ep < 1 or cfg.n_experts % ep:
        out.append(f"ep={ep} does not divide n_experts={cfg.n_experts}")
    if not 1 <= cfg.top_k <= cfg.n_experts:
        out.append(f"top_k={cfg.top_k} must be between 1 and n_experts={cfg.n_experts}")
    if cfg.capacity_factor is not None and cfg.capacity_factor <= 0:
        out.append(f"capacity_factor={cfg.capacity_factor} must be > 0 (or None for no dropping)")
    if etp < 1 or d_ff_expert % etp:
        out.append(f"etp={etp} does not divide expert h_ffn={d_ff_expert}")
    return out


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
