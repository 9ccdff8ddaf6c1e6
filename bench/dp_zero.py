"""DDP and ZeRO-1/2/3 measured: traffic vs formula, memory per rank vs formula (and the ZeRO paper's), step time.

    PYTHONPATH=. python bench/dp_zero.py [--d 2 4] [--steps 6] [--layers 4] [--d-model 66] [--heads 3]

Every number comes from real runs of the reference model on gloo ranks: bytes from the tracer, memory from the
storages each rank holds (`HeldBytes`), times from `time.perf_counter` around each phase. The model runs in float32
with no master copy, so "ours" is the formula for what we hold; the paper's mixed-precision formula (2 + 2 + K
bytes per parameter, K = 12) is printed beside it for the same parameter count.
"""

from __future__ import annotations

import argparse
import statistics

from pylib.analysis.dp import held_bytes, paper_bytes, traffic_per_step, zero3_peak_param_bytes
from pylib.dp import STAGES
from pylib.experiments.dp_training import train_data_parallel
from pylib.model import ModelConfig, build_model
from pylib.runtime import launch


def _all_stages(cfg, steps, batch, seq, bucket_bytes):
    return {
        s: train_data_parallel(cfg, s, global_batch=batch, seq=seq, steps=steps, bucket_bytes=bucket_bytes)
        for s in STAGES
    }


def _kib(n) -> str:
    return f"{n / 1024:,.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=66)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=251)  # odd sizes: ZeRO needs padding
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--bucket-kib", type=int, default=128)
    args = ap.parse_args()
    h = args.d_model
    cfg = ModelConfig(
        vocab_size=args.vocab, d_model=h, n_layers=args.layers, n_heads=args.heads, d_ff=4 * h + 2, dtype="float32"
    )
    n_params = sum(p.numel() for p in build_model(cfg).parameters())
    e = 4
    print(
        f"model: h={h} L={args.layers} V={args.vocab} h_ffn={4 * h + 2}, {n_params:,} parameters, float32, "
        f"Psi = {_kib(n_params * e)} KiB; global batch {args.batch} x {args.seq}, buckets {args.bucket_kib} KiB, "
        f"{args.steps} Adam steps"
    )
    rows_traffic, rows_mem, rows_time = [], [], []
    for d in args.d:
        runs = launch(
            _all_stages, d, cfg, args.steps, args.batch, args.seq, args.bucket_kib * 1024, timeout=600, backend="gloo"
        )
        for stage in STAGES:
            per_rank = [r[stage] for r in runs]
            r0 = per_rank[0]
            layouts = r0["layouts"]
            psi = sum(lay.bytes for lay in layouts)
            psi_pad = sum(lay.padded_bytes for lay in layouts) if stage != "ddp" else psi
            sent = {sum(ev["bytes_sent"] for ev in events) for r in per_rank for events in r["events"]}
            formula = traffic_per_step(psi_pad, d, stage)
            (measured,) = sent  # every rank, every step: one number
            rows_traffic.append((d, stage, psi, psi_pad - psi, measured, formula, measured / formula))
            mem = r0["memory"]
            phi_pad = psi_pad // e
            ours = held_bytes(n_params, e, d, stage, padded_params=phi_pad)
            paper = paper_bytes(n_params, d, stage)
            peak = ""
            if stage == "zero3":
                units = list(r0["unit_bytes"].values())
                peak = f"{_kib(mem['peak_params'])} / {_kib(zero3_peak_param_bytes(mem['params'], units))}"
            elif stage == "zero2":
                peak = f"grads {_kib(mem['peak_grads'])}"
            rows_mem.append((d, stage, mem, ours, paper, peak))
            steady = per_rank[0]["times"][1:] or per_rank[0]["times"]
            med = {k: statistics.median(t[k] for t in steady) for k in steady[0]}
            hidden = statistics.mean(r["overlap"].hidden_fraction for r in per_rank) if stage != "zero3" else None
            rows_time.append((d, stage, med, hidden))

    print("\nTraffic per rank per step (tracer) vs formula [bytes]; Psi_pad = Psi + padding (ZeRO's flat buffers)")
    print(f"{'d':>2} {'stage':<6} {'Psi':>9} {'padding':>8} {'measured':>10} {'formula':>10} {'ratio':>6}")
    for d, stage, psi, pad, measured, formula, ratio in rows_traffic:
        print(f"{d:>2} {stage:<6} {psi:>9,} {pad:>8,} {measured:>10,} {formula:>10,.0f} {ratio:>6.2f}")

    print(
        "\nMemory per rank [KiB]: measured = formula for what we hold (float32, no master copy); "
        "paper = 2Psi + 2Psi + 12Psi split per stage"
    )
    print(
        f"{'d':>2} {'stage':<6} {'params':>16} {'grads':>16} {'optim':>16} {'total':>16} {'paper total':>11}  "
        "transient: ZeRO-3 params measured / shards + largest unit; ZeRO-2 grads"
    )
    for d, stage, mem, ours, paper, peak in rows_mem:
        cells = [f"{_kib(mem[k])}/{_kib(ours[k])}" for k in ("params", "grads", "optim")]
        total = f"{_kib(mem['total'])}/{_kib(sum(ours.values()))}"
        print(
            f"{d:>2} {stage:<6} {cells[0]:>16} {cells[1]:>16} {cells[2]:>16} {total:>16} "
            f"{_kib(sum(paper.values())):>11}  {peak}"
        )

    print(
        "\nStep time per rank [ms], median of steps 2.. (rank 0); hidden = share of bucket communication done "
        "before backward ended"
    )
    print(f"{'d':>2} {'stage':<6} {'fwd+bwd':>8} {'sync wait':>9} {'opt step':>8} {'total':>8} {'hidden':>7}")
    for d, stage, med, hidden in rows_time:
        hid = f"{hidden:>7.0%}" if hidden is not None else f"{'-':>7}"
        print(
            f"{d:>2} {stage:<6} {1e3 * med['forward_backward']:>8.1f} {1e3 * med['sync_wait']:>9.1f} "
            f"{1e3 * med['step']:>8.1f} {1e3 * med['total']:>8.1f} {hid}"
        )


if __name__ == "__main__":
    main()
