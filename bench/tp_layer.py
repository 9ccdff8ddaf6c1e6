"""Benchmark one tensor-parallel Transformer layer at a few sizes, t in {1, 2, 4}, TP and TP + SP.

Prints, per size and t:
  * traffic: bytes the tracer recorded / bytes the formula (pylib.analysis.tp.layer_collectives) predicts: 1.00;
  * activation memory: bytes autograd saved for backward (measured) / our derived formula: 1.00, and beside it
    Korthikanti et al. 2022's formula (2-byte activations, dropout), converted to our element size;
  * step time (forward + backward of the layer) of our TPBlock and of PyTorch's DTensor tensor parallelism
    (parallelize_module with ColwiseParallel / RowwiseParallel / SequenceParallel) on the same ranks, and the ratio.
Then one layer's saved tensors item by item beside the paper's terms, with the reason for every difference, and
the recomputation rows (none / selective / full): saved bytes measured / `pylib.analysis.recompute`'s formula (1.00),
the extra forward FLOPs backward runs (FlopCounterMode) / formula, the re-issued collectives' bytes / formula, and
Korthikanti's bytes for the same choice.

    PYTHONPATH=. python bench/tp_layer.py [--steps 10]

Timing on a shared CPU with gloo is noisy; the byte ratios are exact.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.distributed.tensor.parallel  # noqa: F401  (slow import: once here, the forked ranks inherit it)
from torch.utils.flop_counter import FlopCounterMode

from pylib.analysis import recompute as R
from pylib.analysis.tp import compare_with_korthikanti, korthikanti_bytes, layer_collectives, saved_activation_bytes
from pylib.model import ModelConfig, build_model, random_hidden, saved_activations, torch_dtype
from pylib.runtime import launch, trace
from pylib.runtime.recompute import run_layers
from pylib.tp import TPBlock, finalize_grads, scatter_to_sequence_parallel_region
from pylib.tp.dtensor import dtensor_block

SIZES = [  # (b, s, h, n_heads, d_ff)
    (2, 64, 64, 8, 256),
    (4, 128, 128, 8, 512),
    (1, 256, 256, 16, 1024),
]


def _step(block, x, finalize):
    for p in block.parameters():
        p.grad = None
    y = block(x)
    y = y.to_local() if hasattr(y, "to_local") else y
    y.square().sum().backward()
    if finalize:
        finalize_grads(block)


def _time(fn, steps):
    times = []
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _rank(steps):
    t = dist.get_world_size()
    rows = []
    for b, s, h, heads, ff in SIZES:
        cfg = ModelConfig(d_model=h, n_heads=heads, d_ff=ff, n_layers=1, dtype="float32")
        ref = build_model(cfg).layers[0]
        for sp, regather in ((False, False), (True, False), (True, True)) if t > 1 else ((False, False),):
            ours = TPBlock.from_full(ref, sequence_parallel=sp, regather=regather)
            theirs = dtensor_block(ref, t, sp)
            x = random_hidden(b, s, h, dtype=torch_dtype(cfg.dtype))
            x = (scatter_to_sequence_parallel_region(x) if sp else x).detach().requires_grad_()
            with trace() as tr:
                _step(ours, x, finalize=False)
            traced = sum(e.bytes_sent for e in tr.events)
            formula = sum(
                c.bytes_sent for c in layer_collectives(b, s, h, t, 4, sequence_parallel=sp, regather=regather)
            )
            with saved_activations(exclude=list(ours.parameters())) as saved:
                ours(x)
            for _ in range(2):  # warm up both (DTensor caches its sharding decisions on first use)
                _step(ours, x, True)
                _step(theirs, x, False)
            t_ours = _time(lambda: _step(ours, x, True), steps)  # noqa: B023
            t_theirs = _time(lambda: _step(theirs, x, False), steps)  # noqa: B023
            rows.append(
                dict(
                    b=b,
                    s=s,
                    h=h,
                    heads=heads,
                    ff=ff,
                    sp=sp,
                    regather=regather,
                    traced=traced,
                    formula=formula,
                    saved=saved.bytes,
                    t_ours=t_ours,
                    t_theirs=t_theirs,
                )
            )
    return rows


def _recompute_rank():
    """Per size, SP off/on and recompute choice: saved bytes, the extra backward FLOPs, the re-issued bytes."""
    t = dist.get_world_size()
    rows = []
    for b, s, h, heads, ff in SIZES:
        cfg = ModelConfig(d_model=h, n_heads=heads, d_ff=ff, n_layers=1, dtype="float32")
        ref = build_model(cfg).layers[0]
        for sp in (False, True) if t > 1 else (False,):
            base_flops = None
            for rc in R.RECOMPUTE:
                block = TPBlock.from_full(ref, sequence_parallel=sp, recompute=rc)
                x = random_hidden(b, s, h, dtype=torch_dtype(cfg.dtype))
                x = (scatter_to_sequence_parallel_region(x) if sp else x).detach().requires_grad_()
                with trace() as tr:
                    with saved_activations(exclude=list(block.parameters())) as saved:
                        y = run_layers([block], x, recompute=rc)
                    with FlopCounterMode(display=False) as flops:
                        y.square().sum().backward()
                base_flops = flops.get_total_flops() if rc == "none" else base_flops
                redo = sum(e.bytes_sent for e in tr.events if e.phase == "recompute")
                extra = flops.get_total_flops() - base_flops
                rows.append(
                    dict(b=b, s=s, h=h, heads=heads, ff=ff, sp=sp, rc=rc, saved=saved.bytes, flops=extra, redo=redo)
                )
    return rows


def _print_recompute():
    print("\nrecomputation, one TP layer, float32 (rank 0): saved B kept for backward; extra FLOPs: matmul FLOPs")
    print("backward runs again (FlopCounterMode; torch's checkpoint stops before the region's last matmul); re-sent B:")
    print("bytes the re-run collectives send; paper*e/2: Korthikanti et al.'s bytes for the choice at 4-byte elements.")
    head = (
        f"{'b':>2} {'s':>4} {'h':>4} {'t':>2} {'mode':>5} {'recompute':>9} | {'saved B':>9} {'formula':>9} "
        f"{'ratio':>5} {'paper*e/2':>10} | {'extra FLOPs':>11} {'formula':>11} {'ratio':>5} | "
        f"{'re-sent B':>9} {'formula':>9}"
    )
    print(head)
    print("-" * len(head))
    for t in (1, 2, 4):
        for r in launch(_recompute_rank, t, timeout=600, backend="gloo")[0]:
            cfg = ModelConfig(d_model=r["h"], n_heads=r["heads"], d_ff=r["ff"], n_layers=1, dtype="float32")
            b, s, sp, rc = r["b"], r["s"], r["sp"], r["rc"]
            saved = R.layer_saved_bytes(cfg, b, s, t, sequence_parallel=sp, recompute=rc)
            paper = R.korthikanti_recompute_bytes(s, b, r["h"], r["heads"], t, sequence_parallel=sp, recompute=rc) * 2
            flops = R.extra_forward_flops(cfg, b, s, t, rc)
            redo = sum(c.bytes_sent for c in R.extra_collectives(cfg, b, s, t, sequence_parallel=sp, recompute=rc))
            flop_ratio = f"{r['flops'] / flops:.2f}" if flops else "  -"
            print(
                f"{b:>2} {s:>4} {r['h']:>4} {t:>2} {'TP+SP' if sp else 'TP':>5} {rc:>9} | {r['saved']:>9} {saved:>9} "
                f"{r['saved'] / saved:>5.2f} {paper:>10.0f} | {r['flops']:>11} {flops:>11} {flop_ratio:>5} | "
                f"{r['redo']:>9} {redo:>9}"
            )


def _mode(r) -> str:
    return "TP+SP+rg" if r["regather"] else ("TP+SP" if r["sp"] else "TP")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    print("one TP layer, float32, gloo on CPU; bytes are per rank (rank 0), times are medians of forward+backward.")
    print("traced B: bytes sent by the layer's collectives (forward + backward); saved B: activations kept for")
    print("backward; paper*e/2: Korthikanti et al.'s bytes at 4-byte elements; TP+SP+rg: SP keeping only the")
    print("sequence slice of the region's input and all-gathering it again in backward (Megatron's choice).")
    print("DTensor runs TP or TP+SP (no regather); DT/ours = DTensor time / ours.\n")
    head = (
        f"{'b':>2} {'s':>4} {'h':>4} {'t':>2} {'mode':>8} | {'traced B':>9} {'formula':>9} {'ratio':>5} | "
        f"{'saved B':>9} {'formula':>9} {'ratio':>5} {'paper*e/2':>10} {'ours/paper':>10} | "
        f"{'ours ms':>8} {'DTensor ms':>10} {'DT/ours':>7}"
    )
    print(head)
    print("-" * len(head))
    for t in (1, 2, 4):
        for r in launch(_rank, t, args.steps, timeout=600, backend="gloo")[0]:
            cfg = ModelConfig(d_model=r["h"], n_heads=r["heads"], d_ff=r["ff"], n_layers=1, dtype="float32")
            derived = saved_activation_bytes(cfg, r["b"], r["s"], t, sequence_parallel=r["sp"], regather=r["regather"])
            paper = korthikanti_bytes(r["s"], r["b"], r["h"], r["heads"], t, sequence_parallel=r["sp"]) * 4 / 2
            ratio = f"{r['traced'] / r['formula']:.2f}" if r["formula"] else "  -"
            print(
                f"{r['b']:>2} {r['s']:>4} {r['h']:>4} {t:>2} {_mode(r):>8} | "
                f"{r['traced']:>9} {r['formula']:>9} {ratio:>5} | "
                f"{r['saved']:>9} {derived:>9} {r['saved'] / derived:>5.2f} {paper:>10.0f} "
                f"{r['saved'] / paper:>10.2f} | "
                f"{1e3 * r['t_ours']:>8.2f} {1e3 * r['t_theirs']:>10.2f} {r['t_theirs'] / r['t_ours']:>7.2f}"
            )
    b, s, h, heads, ff = SIZES[1]
    cfg = ModelConfig(d_model=h, n_heads=heads, d_ff=ff, n_layers=1, dtype="float32")
    for t, sp, regather in ((4, False, False), (4, True, False), (4, True, True)):
        mode = "TP" if not sp else ("TP+SP, regather" if regather else "TP+SP")
        print(f"\nsaved tensors of one layer, b={b} s={s} h={h} a={heads} h_ffn={ff}, t={t}, {mode} (bytes per rank):")
        print(f"{'item':<40} {'paper (2 B)':>12} {'ours (4 B)':>11}  relation    why")
        rows = compare_with_korthikanti(cfg, b, s, t, sequence_parallel=sp, regather=regather)
        for row in rows:
            print(f"{row.item:<40} {row.paper_bytes:>12.0f} {row.ours_bytes:>11}  {row.relation:<11} {row.why}")
        print(f"{'total':<40} {sum(r.paper_bytes for r in rows):>12.0f} {sum(r.ours_bytes for r in rows):>11}")
    _print_recompute()


if __name__ == "__main__":
    main()
