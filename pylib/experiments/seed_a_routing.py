"""Article A section 6 for real: EP = 4, 8 experts (2 per rank), top-2, 8 tokens.

The 8 tokens are article A's two sentences, "The cat sat here" and "A dog ran fast" (ids 0..7), and the MoE is the
reference model of article A (d = 4, one head, h_ffn = 8) with its MLP replaced by 8 experts and a top-2 router
(`pylib.plan.presets.seed_a_moe_config`). The routing table -- token -> its two experts -> the ranks that own
them -- comes from that real router on the hidden states that really enter the MoE (LN2's output). Expert ids are
0-based here; the seed counts from 1 (its "expert 1, 5" is our (0, 4)) and
`pylib.ep.format_routing_table(..., one_based=True)` prints it the seed's way.

    x, moe = seed_a_moe_input()                 # the MoE's input [2, 4, h] and the module
    rows = seed_a_routing_table(ep=4)           # one row per token, from the real router
    launch(seed_a_ep_worker, 4)                 # inside each rank: the tokens it holds, dispatched over EP = 4
"""

from __future__ import annotations

import torch

from pylib.ep import ExpertParallelMoE, routing_table
from pylib.ep.balance import moe_input
from pylib.model import ModelConfig, build_model
from pylib.plan.presets import seed_a_moe_config
from pylib.runtime import current_device, trace
from pylib.runtime.collectives import resolve_group

SEED_A_TOKENS = ("The", "cat", "sat", "here", "A", "dog", "ran", "fast")
SEED_A_IDS = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])


def seed_a_moe_input(cfg: ModelConfig | None = None) -> tuple[torch.Tensor, torch.nn.Module]:
    """(x [2, 4, h], the MoE module): the hidden states entering layer 0's MoE for article A's 8 tokens."""
    cfg = cfg or seed_a_moe_config()
    model = build_model(cfg)
    moe = model.layers[0].mlp
    return moe_input(model, moe, SEED_A_IDS), moe


def seed_a_routing_table(ep: int = 4, n_experts: int = 8, top_k: int = 2) -> list[dict]:
    """Article A's routing table from the real router of the reference MoE (see the module docstring)."""
    cfg = seed_a_moe_config(n_experts, top_k)
    x, moe = seed_a_moe_input(cfg)
    with torch.no_grad():
        moe(x)
    return routing_table(moe.last_routing, n_experts, ep, SEED_A_TOKENS, moe.last_keep)


def seed_a_ep_worker(ep_group=None) -> dict:
    """Inside a launched rank of a 4-rank run: route article A's tokens with the real router, dispatch them over
    EP = 4 with the all-to-all, and return this rank's view: the tokens it holds (2 of the 8), their routing
    rows, the experts it holds, the rows its experts received from each rank, and the trace of the forward."""
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
