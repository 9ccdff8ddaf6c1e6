"""Load balance under training: a small MoE language model trained with no balancing, with the load-balancing aux
loss, or with the aux-loss-free expert bias -- and the assignments a capacity limit then drops.

    ids, targets = structured_tokens(vocab_size, batch, seq, seed)   # a learnable synthetic stream
    run = train_balance(MoEConfig(n_experts=8, top_k=2, aux_loss_coef=0.1), steps=40)
    run.imbalance[step][layer]        # max / mean assignments per expert on that step's batch
    run.before, run.after             # the same on a held-out batch, before and after training
    dropped_share(moe, x, capacity_factor, policy, n_groups)   # (share of assignments, share of router weight)

The bench (bench/ep_moe.py), the tests and the book's chapter on expert parallelism all call these, so they
measure the same thing. Everything runs on one process with the reference model (`pylib.model`): balancing is a
property of the router, not of how the experts are spread over ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from pylib.i18n import editions
from pylib.model.moe import MoE, Routing, grouped_keep_mask, tokens_per_expert
from pylib.model.transformer import Transformer, build_model
from pylib.plan.config import ModelConfig, MoEConfig


def structured_tokens(vocab_size: int, batch: int, seq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [b, s] and next-token targets [b, s] of a learnable stream: a Zipf-like first token, then each next
    token is (3 * previous + 1) mod V with probability 0.8, else a fresh Zipf-like draw. Fixed by `seed`."""
    g = torch.Generator().manual_seed(seed)
    zipf = 1.0 / torch.arange(1, vocab_size + 1, dtype=torch.float64)
    ids = torch.empty(batch, seq + 1, dtype=torch.int64)
    ids[:, 0] = torch.multinomial(zipf, batch, replacement=True, generator=g)
    for t in range(1, seq + 1):
        follow = (3 * ids[:, t - 1] + 1) % vocab_size
        fresh = torch.multinomial(zipf, batch, replacement=True, generator=g)
        ids[:, t] = torch.where(torch.rand(batch, generator=g) < 0.8, follow, fresh)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def moe_layers(model: Transformer) -> list[MoE]:
    return [layer.mlp for layer in model.layers if isinstance(layer.mlp, MoE)]


def load_imbalance(routing: Routing, n_experts: int) -> float:
    """max / mean assignments per expert: 1.0 is perfect balance; E / k means every token picked the same k."""
    load = tokens_per_expert(routing.experts, n_experts).to(torch.float64)
    return (load.max() / load.mean()).item()


def _imbalances(model: Transformer) -> list[float]:
    return [load_imbalance(m.last_routing, m.cfg.n_experts) for m in moe_layers(model)]


@dataclass
class BalanceRun:
    """One training run. imbalance: per step, per MoE layer (on that step's batch, before the update);
    before / after: per MoE layer on the held-out batch; losses: the language-model loss per step (without the aux
    loss, which only adds gradient); held_out: the held-out ids."""

    moe: MoEConfig
    model: Transformer
    imbalance: list[list[float]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    before: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)
    held_out: torch.Tensor | None = None

    def worst(self) -> list[float]:
        """Per step, the imbalance of the worst MoE layer."""
        return [max(step) for step in self.imbalance]

    def routing_imbalance(self, last: int = 10) -> float:
        """The planner's factor (`pylib.analysis.planner.Plan.routing_imbalance`): the worst MoE layer's max / mean
        load, averaged over the run's `last` steps (the load the busiest expert sees once the router has trained)."""
        if not 1 <= last <= len(self.imbalance):
            raise ValueError(f"last={last} must be between 1 and the run's {len(self.imbalance)} steps")
        tail = self.worst()[-last:]
        return sum(tail) / len(tail)


# The small model `train_balance` puts its MoE layers into (the MoE config and the seed are the run's).
BALANCE_MODEL = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64)


@editions.shared  # the book's two editions train once (pylib.i18n.editions)
def train_balance(
    moe: MoEConfig,
    steps: int,
    *,
    base: ModelConfig = BALANCE_MODEL,
    batch: int = 16,
    seq: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
    threads: int | None = 1,
) -> BalanceRun:
    """Train the reference model with MoE MLPs for `steps` Adam steps on `structured_tokens`, recording the load
    imbalance of every MoE layer at every step. When `moe.bias_update_rate` > 0 the expert bias is updated after
    each optimizer step (DeepSeek-V3's aux-loss-free balancing). base: the model whose MLPs become `moe`'s layers
    (`BALANCE_MODEL`; its moe and seed are replaced by the run's).

    threads: torch's intra-op threads while training (restored after). The tensors are tiny, so one thread is the
    fastest; on a busy 2-core machine two threads contending made a 30-step run 10x slower. None: leave it alone."""
    saved = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _train(base.with_(moe=moe, seed=seed), steps, batch, seq, lr, seed)
    finally:
        torch.set_num_threads(saved)


def _train(cfg, steps, batch, seq, lr, seed) -> BalanceRun:
    moe, vocab_size = cfg.moe, cfg.vocab_size
    model = build_model(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    held_out, _ = structured_tokens(vocab_size, batch, seq, seed=10_000 + seed)
    run = BalanceRun(moe, model, held_out=held_out)
    with torch.no_grad():
        model(held_out)
    run.before = _imbalances(model)
    for step in range(steps):
        ids, targets = structured_tokens(vocab_size, batch, seq, seed=seed * 100_003 + step)
        loss = model.loss(ids, targets)
        run.imbalance.append(_imbalances(model))
        run.losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if moe.bias_update_rate:
            for m in moe_layers(model):
                m.update_expert_bias()
    with torch.no_grad():
        model(held_out)
    run.after = _imbalances(model)
    return run


def moe_input(model: Transformer, moe: MoE, ids: torch.Tensor) -> torch.Tensor:
    """The hidden states [b, s, h] entering `moe` in one forward of `model` on `ids`."""
    seen = {}
    handle = moe.register_forward_pre_hook(lambda mod, args: seen.setdefault("x", args[0].detach()))
    try:
        with torch.no_grad():
            model(ids)
    finally:
        handle.remove()
    return seen["x"]


def dropped_share(
    moe: MoE, x: torch.Tensor, capacity_factor: float, policy: str = "probs", n_groups: int = 1
) -> tuple[float, float]:
    """(share of the T*k assignments dropped, share of the router's combine weight dropped) when `moe`'s router
    routes x [b, s, h] with `capacity_factor`, capacity computed per group of T / n_groups consecutive tokens (the
    tokens of one rank of an expert-parallel run; Megatron-Core's per-rank rule)."""
    cfg = replace(moe.cfg, capacity_factor=capacity_factor, drop_policy=policy)
    with torch.no_grad():
        routing = moe.router(x.reshape(-1, x.shape[-1]))
    T = routing.experts.shape[0]
    if T % n_groups:
        raise ValueError(f"n_groups={n_groups} does not divide the {T} tokens")
    keep = grouped_keep_mask(routing, cfg, torch.arange(T) // (T // n_groups))
    w = routing.weights
    return 1.0 - keep.double().mean().item(), ((w * ~keep).sum() / w.sum()).item()
