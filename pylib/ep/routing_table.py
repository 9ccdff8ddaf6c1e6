"""A routing as a table a reader can check: token -> its experts, their combine weights, the EP ranks owning them.

    rows = routing_table(moe.last_routing, n_experts, ep, token_names, moe.last_keep)
    print(format_routing_table(rows, ep, n_experts, one_based=True))   # article A's way: experts counted from 1

Experts are placed in contiguous blocks: EP rank r owns experts [r*E/ep, (r+1)*E/ep).
"""

from __future__ import annotations

import torch

from pylib.model.moe import Routing


def routing_table(
    routing: Routing, n_experts: int, ep: int, token_names=None, keep: torch.Tensor | None = None
) -> list[dict]:
    """One row per token: its name, chosen experts (highest weight first), their combine weights, the EP ranks
    owning them (contiguous blocks of E/ep experts), and which choices survived capacity."""
    per_rank = n_experts // ep
    rows = []
    for t in range(routing.experts.shape[0]):
        experts = [int(e) for e in routing.experts[t]]
        rows.append(
            dict(
                token=token_names[t] if token_names is not None else str(t),
                experts=tuple(experts),
                weights=tuple(float(w) for w in routing.weights[t]),
                ranks=tuple(e // per_rank for e in experts),
                kept=tuple(bool(k) for k in keep[t]) if keep is not None else (True,) * len(experts),
            )
        )
    return rows


def format_routing_table(rows: list[dict], ep: int, n_experts: int, one_based: bool = False) -> str:
    """Article A's table as text: token | experts | ranks (GPU i holds experts ...)."""
    off = 1 if one_based else 0
    per = n_experts // ep
    lines = [f"{'token':<6} {'experts':<10} {'weights':<14} ranks"]
    for r in rows:
        experts = ", ".join(str(e + off) for e in r["experts"])
        weights = ", ".join(f"{w:.3f}" for w in r["weights"])
        ranks = ", ".join(f"GPU{k} (experts {k * per + off}-{k * per + per - 1 + off})" for k in r["ranks"])
        lines.append(f"{r['token']:<6} {experts:<10} {weights:<14} {ranks}")
    return "\n".join(lines)
