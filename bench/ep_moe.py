"""Expert parallelism, measured: dropping vs capacity factor, all-to-all bytes vs formula, load balance after training.

    PYTHONPATH=. python bench/ep_moe.py [--steps 80]

1. Load imbalance (max / mean tokens per expert) of a small MoE language model after a few real Adam steps,
   trained three ways: no balancing, the load-balancing aux loss, the aux-loss-free expert bias.
2. Assignments dropped vs capacity factor (per-rank capacity, ep = 4 ranks' worth of tokens), for the routers of
   those trained models, and the share of router weight those drops lose under each drop policy (both policies
   drop the same *number* of assignments; "probs" drops the least confident ones).
3. All-to-all bytes per rank in a real EP = 4 run (traced) vs the formula on the actual routing and vs the
   uniform-routing expectation T * k * h * b * (ep - 1) / ep.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

from pylib.analysis.ep import alltoall_bytes, dispatch_matrix, expected_alltoall_bytes
from pylib.dist import launch, trace
from pylib.ep import ExpertParallelMoE
from pylib.ep.traffic import traffic_matrix
from pylib.model.config import ModelConfig, MoEConfig
from pylib.model.moe import MoE, grouped_keep_mask
from pylib.model.transformer import build_model

EP = 4


def structured_tokens(cfg: ModelConfig, batch: int, seq: int, seed: int):
    """A learnable stream: Zipf-like unigram starts, then each next token = (3 * prev + 1) mod V with prob 0.8."""
    g = torch.Generator().manual_seed(seed)
    V = cfg.vocab_size
    weights = 1.0 / torch.arange(1, V + 1, dtype=torch.float64)
    ids = torch.empty(batch, seq + 1, dtype=torch.int64)
    ids[:, 0] = torch.multinomial(weights, batch, replacement=True, generator=g)
    for t in range(1, seq + 1):
        follow = (3 * ids[:, t - 1] + 1) % V
        rand = torch.multinomial(weights, batch, replacement=True, generator=g)
        ids[:, t] = torch.where(torch.rand(batch, generator=g) < 0.8, follow, rand)
    return ids[:, :-1], ids[:, 1:]


def moe_layers(model):
    return [layer.mlp for layer in model.layers if isinstance(layer.mlp, MoE)]


def imbalance(model, ids) -> list[float]:
    """max / mean assignments per expert, per MoE layer, on `ids`."""
    with torch.no_grad():
        model(ids)
    out = []
    for moe in moe_layers(model):
        load = torch.bincount(moe.last_routing.experts.reshape(-1), minlength=moe.cfg.n_experts).double()
        out.append((load.max() / load.mean()).item())
    return out


def train(moe_cfg: MoEConfig, steps: int, seed: int = 0):
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64, moe=moe_cfg, seed=seed)
    model = build_model(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    held_out, _ = structured_tokens(cfg, 16, 32, seed=999)
    before = imbalance(model, held_out)
    for step in range(steps):
        ids, targets = structured_tokens(cfg, 16, 32, seed=step)
        loss = model.loss(ids, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if moe_cfg.bias_update_rate:
            for moe in moe_layers(model):
                moe.update_expert_bias()
    return model, before, imbalance(model, held_out), loss.item(), held_out


def moe_input(model, moe: MoE, ids) -> dict:
    """{"x": the hidden states entering `moe`} for one forward of `model` on `ids`."""
    seen = {}
    handle = moe.register_forward_pre_hook(lambda mod, a: seen.setdefault("x", a[0].detach()))
    with torch.no_grad():
        model(ids)
    handle.remove()
    return seen


def dropped(moe: MoE, x: torch.Tensor, capacity_factor: float, policy: str) -> tuple[float, float]:
    """(share of assignments dropped, share of the router's combine weight dropped)."""
    cfg = MoEConfig(**{**moe.cfg.__dict__, "capacity_factor": capacity_factor, "drop_policy": policy})
    with torch.no_grad():
        routing = moe.router(x.reshape(-1, x.shape[-1]))
    T = routing.experts.shape[0]
    groups = torch.arange(T) // (T // EP)  # capacity per rank, as an EP = 4 run computes it
    keep = grouped_keep_mask(routing, cfg, groups)
    w = routing.weights
    return 1.0 - keep.float().mean().item(), (w * ~keep).sum().item() / w.sum().item()


def _traced_ep_run(tokens: int, h: int, cfg: MoEConfig):
    r = dist.get_rank()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        moe = MoE(h, 4 * h, cfg)
    layer = ExpertParallelMoE.from_full(moe)
    x = torch.randn(1, tokens, h, generator=torch.Generator().manual_seed(r), requires_grad=True)
    with trace() as tr:
        layer(x).sum().backward()
    return [e.as_dict() for e in tr.events], layer.last_routing.experts, layer.last_keep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    torch.set_num_threads(1)  # tiny tensors: extra threads only contend (and the CI machine has 2 cores)
    t0 = time.time()

    print(f"1. load imbalance max/mean tokens per expert (8 experts, top-2, 2 MoE layers), {args.steps} Adam steps")
    variants = {
        "no balancing": MoEConfig(n_experts=8, top_k=2),
        "aux loss 0.01": MoEConfig(n_experts=8, top_k=2, aux_loss_coef=0.01),
        "aux loss 0.1": MoEConfig(n_experts=8, top_k=2, aux_loss_coef=0.1),
        "expert bias 1e-2": MoEConfig(n_experts=8, top_k=2, score="sigmoid", bias_update_rate=1e-2),
        "sigmoid, no bias": MoEConfig(n_experts=8, top_k=2, score="sigmoid"),
    }
    print(f"   {'variant':<18} {'before L0':>9} {'before L1':>9} {'after L0':>9} {'after L1':>9} {'final loss':>10}")
    trained = {}
    for name, mcfg in variants.items():
        model, before, after, loss, held_out = train(mcfg, args.steps)
        trained[name] = (model, held_out)
        print(f"   {name:<18} {before[0]:9.2f} {before[1]:9.2f} {after[0]:9.2f} {after[1]:9.2f} {loss:10.3f}")

    print("\n2. dropped (%) vs capacity factor, capacity per rank (EP=4), layer 0 of the trained models")
    factors = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0]
    print(f"   {'router':<18} {'dropped':<17}" + "".join(f"{f'cf={f}':>9}" for f in factors))
    for name in ("no balancing", "aux loss 0.1", "expert bias 1e-2"):
        model, held_out = trained[name]
        moe = moe_layers(model)[0]
        seen = moe_input(model, moe, held_out)
        cells = "".join(f"{100 * dropped(moe, seen['x'], f, 'probs')[0]:9.1f}" for f in factors)
        print(f"   {name:<18} {'assignments':<17}" + cells)
        for policy in ("probs", "position"):
            cells = "".join(f"{100 * dropped(moe, seen['x'], f, policy)[1]:9.1f}" for f in factors)
            print(f"   {'':<18} {'weight, ' + policy:<17}" + cells)

    print("\n3. all-to-all bytes per rank, real EP=4 run (float32, h=64, 128 tokens per rank, 8 experts, top-2)")
    h, tokens = 64, 128
    for label, mcfg in [
        ("no drop", MoEConfig(n_experts=8, top_k=2)),
        ("cf=1.0", MoEConfig(n_experts=8, top_k=2, capacity_factor=1.0)),
    ]:
        results = launch(_traced_ep_run, EP, tokens, h, mcfg)
        matrix = dispatch_matrix([r[1] for r in results], 8, [r[2] for r in results])
        formula = alltoall_bytes(matrix, h, 4)
        traced = traffic_matrix([r[0] for r in results], EP)
        uniform = expected_alltoall_bytes(tokens, 2, h, EP, 4)
        print(
            f"   [{label}] {'rank':>4} {'traced sent':>12} {'formula':>9} {'traced recv':>12} {'formula':>9} "
            f"{'uniform E[.]':>12} {'combine sent':>12} {'bwd a2a sent':>12}"
        )
        for r, (events, _, _) in enumerate(results):
            fwd = {e["tag"]: e for e in events if e["op"] == "all_to_all" and e["phase"] == "forward"}
            bwd = sum(e["bytes_sent"] for e in events if e["op"] == "all_to_all" and e["phase"] == "backward")
            d, c = fwd["dispatch"], fwd["combine"]
            assert d["bytes_sent"] == formula[r]["dispatch_sent"] and d["bytes_recv"] == formula[r]["dispatch_recv"]
            print(
                f"   {'':9} {r:>4} {d['bytes_sent']:>12} {formula[r]['dispatch_sent']:>9} {d['bytes_recv']:>12} "
                f"{formula[r]['dispatch_recv']:>9} {uniform:>12.0f} {c['bytes_sent']:>12} {bwd:>12}"
            )
        print(f"   {'':9} traffic matrix (bytes, row = from, col = to, diagonal stays local): {traced}")
    print(f"\n(total {time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
