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
from pylib.ep import ExpertParallelMoE
from pylib.ep.balance import dropped_share, moe_input, moe_layers, train_balance
from pylib.ep.traffic import traffic_matrix
from pylib.model.moe import MoE
from pylib.plan.config import MoEConfig
from pylib.runtime import Mesh, ParallelConfig, launch, trace

EP = 4


def ep_layer_and_input(tokens: int, h: int, cfg: MoEConfig, etp: int = 1):
    """This rank's expert-parallel layer of one seeded MoE (h, 4h, `cfg`) and its own input of `tokens` rows; with
    etp > 1 the world is etp x (world / etp) ranks, each expert's h_ffn split over the ETP group."""
    r = dist.get_rank()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        moe = MoE(h, 4 * h, cfg)
    if etp == 1:
        layer = ExpertParallelMoE.from_full(moe)
    else:
        world = dist.get_world_size()
        mesh = Mesh(ParallelConfig(dp=world, ep=world // etp, etp=etp))
        layer = ExpertParallelMoE.from_full(moe, ep_group=mesh.ep, etp_group=mesh.etp, aux_group=mesh.world)
    x = torch.randn(1, tokens, h, generator=torch.Generator().manual_seed(r), requires_grad=True)
    return layer, x


def _traced_ep_run(tokens: int, h: int, cfg: MoEConfig):
    layer, x = ep_layer_and_input(tokens, h, cfg)
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
        run = train_balance(mcfg, args.steps)
        trained[name] = run
        (b0, b1), (a0, a1) = run.before, run.after
        print(f"   {name:<18} {b0:9.2f} {b1:9.2f} {a0:9.2f} {a1:9.2f} {run.losses[-1]:10.3f}")

    print("\n2. dropped (%) vs capacity factor, capacity per rank (EP=4), layer 0 of the trained models")
    factors = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0]
    print(f"   {'router':<18} {'dropped':<17}" + "".join(f"{f'cf={f}':>9}" for f in factors))
    for name in ("no balancing", "aux loss 0.1", "expert bias 1e-2"):
        run = trained[name]
        moe = moe_layers(run.model)[0]
        x = moe_input(run.model, moe, run.held_out)
        cells = "".join(f"{100 * dropped_share(moe, x, f, 'probs', EP)[0]:9.1f}" for f in factors)
        print(f"   {name:<18} {'assignments':<17}" + cells)
        for policy in ("probs", "position"):
            cells = "".join(f"{100 * dropped_share(moe, x, f, policy, EP)[1]:9.1f}" for f in factors)
            print(f"   {'':<18} {'weight, ' + policy:<17}" + cells)

    print("\n3. all-to-all bytes per rank, real EP=4 run (float32, h=64, 128 tokens per rank, 8 experts, top-2)")
    h, tokens = 64, 128
    for label, mcfg in [
        ("no drop", MoEConfig(n_experts=8, top_k=2)),
        ("cf=1.0", MoEConfig(n_experts=8, top_k=2, capacity_factor=1.0)),
    ]:
        results = launch(_traced_ep_run, EP, tokens, h, mcfg, backend="gloo")
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
