"""Mixed precision under DDP and ZeRO-1/2/3 measured: memory per rank vs the mixed-precision formula, and the loss
against the single-device run of the same recipe and against float64.

    PYTHONPATH=. python bench/mixed_precision.py [--d 2 4] [--steps 4] [--layers 2] [--d-model 30] [--heads 3]

Every number comes from real runs on gloo ranks: bytes from the storages each rank holds (`HeldBytes`: bf16
parameters, gradient buffers in the reduce dtype, fp32 masters and Adam moments), the formula from
`pylib.analysis.dp.mixed_held_bytes` with the run's own padded buffer sizes; with bf16 reduction it is the ZeRO
paper's 16 Psi, 4 Psi + 12 Psi/d, 2 Psi + 14 Psi/d, 16 Psi/d (Psi = parameter count).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from pylib.analysis.dp import mixed_held_bytes
from pylib.dp import STAGES, SingleDeviceMixed, micro_batch, wrap
from pylib.model import ModelConfig, build_model, random_tokens
from pylib.plan.options import MixedPrecision
from pylib.runtime import launch

RECIPES = {
    "bf16, reduce fp32": MixedPrecision("bfloat16", grad_reduce="float32"),
    "bf16, reduce bf16": MixedPrecision("bfloat16", grad_reduce="bfloat16"),
}


def _batches(cfg, steps, batch, seq):
    return [random_tokens(cfg, batch, seq, seed=s) for s in range(steps)]


def _train(cfg, stage, recipe, steps, batch, seq, lr):
    rank, d = dist.get_rank(), dist.get_world_size()
    model = build_model(cfg)
    trainer = wrap(model, stage, precision=recipe, lr=lr)
    losses = []
    for ids, targets in _batches(cfg, steps, batch, seq):
        loss = model.loss(micro_batch(ids, rank, d), micro_batch(targets, rank, d))
        trainer.scale_loss(loss).backward()
        trainer.finish_gradient_sync()
        trainer.step()
        memory = trainer.memory()
        trainer.zero_grad()
        losses.append(float(loss.detach()))
    return dict(losses=losses, memory=memory.as_dict(), padded=sum(lay.padded_numel for lay in trainer.layouts))


def _reference(cfg, recipe, d, steps, batch, seq, lr):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as every launched rank: CPU bf16 products round by thread blocking
    try:
        ref = SingleDeviceMixed(build_model(cfg), recipe, parts=d, lr=lr)
        return [ref.train_step(ids, t) for ids, t in _batches(cfg, steps, batch, seq)]
    finally:
        torch.set_num_threads(threads)


def _float64(cfg, steps, batch, seq, lr):
    model = build_model(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    out = []
    for ids, targets in _batches(cfg, steps, batch, seq):
        loss = model.loss(ids, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(float(loss.detach()))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=30)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=101)  # odd sizes: ZeRO needs padding
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-2)
    args = ap.parse_args()
    h = args.d_model
    cfg = ModelConfig(
        vocab_size=args.vocab, d_model=h, n_layers=args.layers, n_heads=args.heads, d_ff=4 * h + 2, dtype="float64"
    )
    n = sum(p.numel() for p in build_model(cfg).parameters())
    shape = (args.steps, args.batch, args.seq, args.lr)
    exact = _float64(cfg, *shape)
    print(f"model: h={h} L={args.layers} V={args.vocab}, Psi = {n:,} parameters; {args.steps} Adam steps lr={args.lr}")
    print("\nMemory per rank [bytes]: measured / mixed_held_bytes; loss: largest |mixed - single-device recipe|")
    print("and largest relative |mixed - float64| over the steps")
    head = f"{'d':>2} {'stage':<6} {'recipe':<18} {'params':>13} {'grads':>13} {'optim':>15} {'total':>8} {'ratio':>5}"
    print(head + f" {'B/param':>7} {'vs 1-dev':>8} {'vs fp64':>8}")
    for d in args.d:
        for name, recipe in RECIPES.items():
            ref = _reference(cfg, recipe, d, *shape)
            for stage in STAGES:
                runs = launch(_train, d, cfg, stage, recipe, *shape, timeout=600, backend="gloo")
                r = runs[0]
                want = mixed_held_bytes(n, d, stage, recipe, padded_params=r["padded"])
                got = {k: r["memory"][k] for k in want}
                cells = [f"{got[k]:,}/{want[k]:,}" for k in ("params", "grads", "optim")]
                ratio = sum(got.values()) / sum(want.values())
                mean = [sum(x["losses"][i] for x in runs) / d for i in range(args.steps)]
                vs_ref = max(abs(a - b) for a, b in zip(mean, ref))
                vs_64 = max(abs(a - b) / b for a, b in zip(mean, exact))
                print(
                    f"{d:>2} {stage:<6} {name:<18} {cells[0]:>13} {cells[1]:>13} {cells[2]:>15} "
                    f"{sum(got.values()):>8,} {ratio:>5.2f} {sum(got.values()) / n:>7.2f} {vs_ref:>8.1e} {vs_64:>8.1e}"
                )


if __name__ == "__main__":
    main()
