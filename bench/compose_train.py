"""The composed TP x SP x CP x EP x DP x PP model measured: per-rank memory and traffic, step time, wall time.

    PYTHONPATH=. python bench/compose_train.py [--steps 4] [--d-model 64] [--seq 64] [--batch 16] [--only NAME ...]

For each configuration: one real training run on gloo ranks (the generated "pattern" language, Adam), checked
against the single-device reference (loss curve, final parameters), its traffic per axis against the sum of the
modes' formulas (`pylib.analysis.compose`), its held model-state bytes against the DP formulas; then the per-rank
table (bytes in K = KiB, M = MiB; traffic as bytes sent / ops in step 0) and the wall time of the whole launch.

In float32 the parameters differ from the reference by up to ~1e-4 after a few Adam steps at lr 1e-2: Adam divides
each gradient by its own running magnitude, so rounding-level differences in near-zero gradients become steps of
up to lr. With --dtype float64 the same runs agree to ~1e-13 (the tests use float64 at smaller sizes: ~1e-15).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pylib.analysis.compose import dp_held_bytes
from pylib.compose import format_reduction_table, format_report, reference_ffn_bytes, traffic_matches_formulas
from pylib.experiments.compose_training import compare_with_reference, train, train_reference
from pylib.model import ModelConfig, MoEConfig
from pylib.plan import RunOptions
from pylib.runtime import ParallelConfig, launch


def configurations(dense, moe):
    return {
        "tp2 cp2 dp2 pp2 (ZeRO-1, 1F1B m=2, ring)": (
            dense,
            ParallelConfig(tp=2, cp=2, dp=2, pp=2),
            16,
            RunOptions(zero_stage=1, schedule="1f1b", n_microbatches=2, cp_kind="ring"),
        ),
        "tp4 cp2 dp2 (ZeRO-2, article B's 1/16)": (
            dense,
            ParallelConfig(tp=4, cp=2, dp=2),
            16,
            RunOptions(zero_stage=2, n_microbatches=1),
        ),
        "MoE tp2 dp4 ep4 etp1 (DDP, m=2)": (
            moe,
            ParallelConfig(tp=2, dp=4, ep=4),
            8,
            RunOptions(zero_stage=0, n_microbatches=2),
        ),
        "MoE tp2 cp2 dp2 pp2 ep2 (ZeRO-3, interleaved v=2, Ulysses)": (
            moe,
            ParallelConfig(tp=2, cp=2, dp=2, pp=2, ep=2),
            16,
            RunOptions(zero_stage=3, schedule="interleaved", v=2, n_microbatches=2, cp_kind="ulysses"),
        ),
    }


def _k(n: float) -> str:
    return f"{n / 1024:.1f}K" if n < 2**20 else f"{n / 2**20:.2f}M"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--only", nargs="*", default=None, help="run only configurations whose name contains these")
    args = ap.parse_args()
    h = args.d_model
    dense = ModelConfig(
        vocab_size=args.vocab,
        d_model=h,
        n_layers=args.layers,
        n_heads=args.heads,
        n_kv_heads=args.kv_heads,
        d_ff=4 * h,
        mlp="swiglu",
        position="rope",
        dtype=args.dtype,
    )
    moe = dense.with_(moe=MoEConfig(n_experts=8, top_k=2, every=2))
    B, S, steps = args.batch, args.seq, args.steps
    print(
        f"model: h={h}, L={args.layers}, n_head={args.heads}, n_kv_head={args.kv_heads}, h_ffn={4 * h}, "
        f"V={args.vocab}, {args.dtype}; global batch [{B}, {S}]; {steps} Adam steps; MoE: 8 experts, top-2, every 2nd"
    )
    summary = []
    refs = {}
    for name, (cfg, pc, world, options) in configurations(dense, moe).items():
        if args.only and not any(o in name for o in args.only):
            continue
        key = "moe" if cfg.moe is not None else "dense"
        if key not in refs:
            t0 = time.perf_counter()
            refs[key] = train_reference(cfg, steps=steps, batch=B, seq=S, data="pattern")
            refs[key]["wall"] = time.perf_counter() - t0
            refs[key]["ffn"] = reference_ffn_bytes(cfg, batch=B, seq=S, data="pattern")
        ref = refs[key]
        t0 = time.perf_counter()
        results = launch(
            train,
            world,
            cfg,
            pc,
            options,
            steps=steps,
            batch=B,
            seq=S,
            data="pattern",
            record=("ffn",),
            timeout=600,
            backend="gloo",
        )
        wall = time.perf_counter() - t0
        err = compare_with_reference(results, ref)
        traffic_ok = memory_ok = True
        for r in results:
            traffic_ok &= traffic_matches_formulas(cfg, pc, r, options, batch=B, seq=S)
            memory_ok &= dp_held_bytes(r["layouts"], options.zero_stage) == {
                k: r["memory"][k] for k in ("params", "grads", "optim")
            }
        step_ms = 1000 * statistics.mean(statistics.mean(r["times"][1:] or r["times"]) for r in results)
        dense_layer = min(i for i in ref["ffn"] if not cfg.is_moe_layer(i))
        ratios = {
            ref["ffn"][dense_layer] / r["ffn_hidden_bytes"][dense_layer]
            for r in results
            if dense_layer in r["ffn_hidden_bytes"]
        }
        print(f"\n=== {name}: {world} ranks ===")
        print(format_report(results))
        print(
            f"loss curve: {', '.join(f'{x:.4f}' for x in results[0]['losses'])}  "
            f"(reference {', '.join(f'{x:.4f}' for x in ref['losses'])})"
        )
        summary.append(
            dict(
                name=name,
                world=world,
                wall=wall,
                step_ms=step_ms,
                loss_err=err["loss_err"],
                param_err=err["param_err"],
                traffic_ok=traffic_ok,
                memory_ok=memory_ok,
                ratio=sorted(ratios),
                ref_ms=1000 * statistics.mean(ref["times"][1:] or ref["times"]),
            )
        )
        if "ep2" in name:
            last = max(results, key=lambda r: r["coords"]["pp"])
            print("\nreduction table (a last-stage rank):")
            print(format_reduction_table(last["reduction_table"]))
    print("\n=== summary (2-core CPU sandbox, gloo; wall = the whole launch incl. process start) ===")
    head = (
        f"{'configuration':58} {'ranks':>5} {'wall s':>7} {'step ms':>8} {'ref ms':>7} {'loss err':>9} "
        f"{'param err':>9} {'traffic=formula':>15} {'bytes=formula':>13} {'FFN 1/x':>8}"
    )
    print(head)
    for s in summary:
        print(
            f"{s['name']:58} {s['world']:>5} {s['wall']:>7.1f} {s['step_ms']:>8.0f} {s['ref_ms']:>7.1f} "
            f"{s['loss_err']:>9.1e} {s['param_err']:>9.1e} {str(s['traffic_ok']):>15} {str(s['memory_ok']):>13} "
            f"{'/'.join(f'{x:g}' for x in s['ratio']):>8}"
        )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
