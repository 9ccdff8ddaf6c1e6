"""Seed A section 6 for real: EP = 4, 8 experts (2 per rank), top-2, 8 tokens.

The 8 tokens are seed A's two sentences, "The cat sat here" and "A dog ran fast" (ids 0..7), and the MoE is the
reference model of seed A (d = 4, one head, h_ffn = 8) with its MLP replaced by 8 experts and a top-2 router. The
routing table -- token -> its two experts -> the ranks that own them -- comes from that real router on the
hidden states that really enter the MoE (LN2's output). Expert ids are 0-based here; the seed counts from 1
(its "expert 1, 5" is our (0, 4)) and `format_routing_table(..., one_based=True)` prints it the seed's way.
"""

from __future__ import annotations

import torch

from pylib.model.config import SEED_A, ModelConfig, MoEConfig
from pylib.model.moe import Routing
from pylib.model.transformer import build_model

from .balance import moe_input

SEED_A_TOKENS = ("The", "cat", "sat", "here", "A", "dog", "ran", "fast")
SEED_A_IDS = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])


def seed_a_moe_config(n_experts: int = 8, top_k: int = 2) -> ModelConfig:
    """Seed A's model with its MLP replaced by `n_experts` experts (each h_ffn = 8), top-k routing, float64."""
    return SEED_A.with_(moe=MoEConfig(n_experts=n_experts, top_k=top_k), dtype="float64")


def seed_a_moe_input(cfg: ModelConfig | None = None) -> tuple[torch.Tensor, torch.nn.Module]:
    """(x [2, 4, h], the MoE module): the hidden states entering layer 0's MoE for seed A's 8 tokens."""
    cfg = cfg or seed_a_moe_config()
    model = build_model(cfg)
    moe = model.layers[0].mlp
    return moe_input(model, moe, SEED_A_IDS), moe


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


def seed_a_routing_table(ep: int = 4, n_experts: int = 8, top_k: int = 2) -> list[dict]:
    """Seed A's routing table from the real router of the reference MoE (see the module docstring)."""
    cfg = seed_a_moe_config(n_experts, top_k)
    x, moe = seed_a_moe_input(cfg)
    with torch.no_grad():
        moe(x)
    return routing_table(moe.last_routing, n_experts, ep, SEED_A_TOKENS, moe.last_keep)


def format_routing_table(rows: list[dict], ep: int, n_experts: int, one_based: bool = False) -> str:
    """Seed A's table as text: token | experts | ranks (GPU i holds experts ...)."""
    off = 1 if one_based else 0
    per = n_experts // ep
    lines = [f"{'token':<6} {'experts':<10} {'weights':<14} ranks"]
    for r in rows:
        experts = ", ".join(str(e + off) for e in r["experts"])
        weights = ", ".join(f"{w:.3f}" for w in r["weights"])
        ranks = ", ".join(f"GPU{k} (experts {k * per + off}-{k * per + per - 1 + off})" for k in r["ranks"])
        lines.append(f"{r['token']:<6} {experts:<10} {weights:<14} {ranks}")
    return "\n".join(lines)


def seed_a_ep_worker(ep_group=None) -> dict:
    """Inside a launched rank of a 4-rank run: route seed A's tokens with the real router, dispatch them over
    EP = 4 with the all-to-all, and return this rank's view: the tokens it holds (2 of the 8), their routing
    rows, the experts it holds, the rows its experts received from each rank, and the trace of the forward."""
    from pylib.runtime import current_device, trace
    from pylib.runtime.collectives import resolve_group

    from .layer import ExpertParallelMoE

    g = resolve_group(ep_group)
    cfg = seed_a_moe_config()
    x, moe = seed_a_moe_input(cfg)
    device = current_device()  # the rank's GPU under NCCL: the counts and rows the all-to-alls move live there
    x, moe = x.to(device), moe.to(device)
    layer = ExpertParallelMoE.from_full(moe, ep_group=g)
    xt = x.reshape(-1, x.shape[-1])
    per = xt.shape[0] // g.size
    mine = list(range(g.rank * per, (g.rank + 1) * per))
    with trace() as tr, torch.no_grad():
        y = layer(xt[mine].unsqueeze(0))
    names = [SEED_A_TOKENS[t] for t in mine]
    return dict(
        rank=g.rank,
        tokens=names,
        table=routing_table(layer.last_routing, cfg.moe.n_experts, g.size, names, layer.last_keep),
        experts_held=tuple(layer.expert_ids),
        rows_received=[int(c) for c in layer.last_state.recv_counts.sum(1)],
        output=y.squeeze(0),
        events=[e.as_dict() for e in tr.events],
    )
