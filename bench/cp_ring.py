"""Context parallelism, measured: traffic against the formulas, causal load balance, overlap, the round table, and
the bf16-merge drift. Prints tables; asserts nothing about time.

    PYTHONPATH=. python bench/cp_ring.py [--quick]

Every number comes from real ring-attention / Ulysses runs over `pylib.runtime.launch` ranks (gloo on CPU, NCCL where
GPUs are visible), except the rows marked "formula".
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
import torch.distributed as dist

from pylib.analysis.cp import (
    balance_ratio,
    causal_work_per_rank,
    ring_traffic,
    ring_work_per_rank,
    ulysses_traffic,
)
from pylib.cp import (
    RingStats,
    flash_available,
    format_round_table,
    ring_attention,
    ring_rounds,
    shard_sequence,
    ulysses_attention,
)
from pylib.experiments.ring_merge_drift import merge_precision_drift
from pylib.runtime import launch, trace


def _qkv(b, h, h_kv, s, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, h, s, d, generator=g).to(dtype),
        torch.randn(b, h_kv, s, d, generator=g).to(dtype),
        torch.randn(b, h_kv, s, d, generator=g).to(dtype),
    )


def _table(rows, cols):
    widths = [max(len(str(c)), *(len(str(r[c])) for r in rows)) for c in cols]
    print("  ".join(str(c).ljust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths)))
    print()


# --------------------------------------------------------------------------------------------------- traffic


def _rank_traffic(full, kind, causal, layout):
    r, n = dist.get_rank(), dist.get_world_size()
    q, k, v = (shard_sequence(x, 2, r, n, layout).requires_grad_() for x in full)
    fn = ring_attention if kind == "ring" else ulysses_attention
    with trace() as tr:
        out = fn(q, k, v, causal=causal, layout=layout)
        out.sum().backward()
    return [(e.phase, e.op, e.bytes_sent) for e in tr.events]


def traffic(sizes):
    b, s, h, h_kv, d = sizes
    print(f"== Traffic per rank, traced vs formula (b={b}, s={s}, n_head={h}, n_kv_head={h_kv}, d_head={d}, fp32)")
    full = _qkv(b, h, h_kv, s, d)
    rows = []
    for cp in (2, 4, 8):
        for kind in ("ring", "ulysses"):
            if kind == "ulysses" and h_kv % cp:
                continue
            events = launch(_rank_traffic, cp, full, kind, True, "zigzag", backend="gloo")[0]
            if kind == "ring":
                f = ring_traffic(b, s, h_kv, d, cp, 4)
                formula = {"forward": f["forward_bytes_sent"], "backward": f["backward_bytes_sent"]}
            else:
                f = ulysses_traffic(b, s, h, h_kv, d, cp, 4)
                formula = {"forward": f["forward_bytes_sent"], "backward": f["backward_bytes_sent"]}
            for ph in ("forward", "backward"):
                sent = [e for e in events if e[0] == ph and e[1] in ("send", "all_to_all")]
                got = sum(e[2] for e in sent)
                rows.append(
                    dict(
                        mode=kind,
                        cp=cp,
                        phase=ph,
                        ops=f"{len(sent)} x {sent[0][1]}",
                        traced_bytes=got,
                        formula_bytes=formula[ph],
                        match="yes" if got == formula[ph] else "NO",
                    )
                )
    _table(rows, ["mode", "cp", "phase", "ops", "traced_bytes", "formula_bytes", "match"])


def traffic_at_scale():
    print("== Forward traffic per rank at a real size (formula): s=128K, n_head=64, n_kv_head=8, d_head=128, bf16")
    rows = []
    for cp in (2, 4, 8, 16):
        r = ring_traffic(1, 131072, 8, 128, cp, 2)
        u = ulysses_traffic(1, 131072, 64, 8, 128, cp, 2) if 8 % cp == 0 else None
        rows.append(
            dict(
                cp=cp,
                ring_MiB=f"{r['forward_bytes_sent'] / 2**20:.0f}",
                ulysses_MiB=f"{u['forward_bytes_sent'] / 2**20:.0f}" if u else "n/a (cp > n_kv_head)",
            )
        )
    _table(rows, ["cp", "ring_MiB", "ulysses_MiB"])


# --------------------------------------------------------------------------------------------------- balance


def _rank_work(full, layout):
    r, n = dist.get_rank(), dist.get_world_size()
    q, k, v = (shard_sequence(x, 2, r, n, layout) for x in full)
    stats = RingStats()
    ring_attention(q, k, v, causal=True, layout=layout, stats=stats)
    return stats.work("forward", "computed"), stats.work("forward", "unmasked")


def balance(s):
    print(f"== Causal attention work per rank (score entries per batch row and head), s={s}")
    rows = []
    for cp in (2, 4, 8):
        for layout in ("contiguous", "zigzag"):
            mask = causal_work_per_rank(s, cp, layout)
            sched = ring_work_per_rank(s, cp, layout, True, "computed")
            measured = launch(_rank_work, cp, _qkv(1, 1, 1, s, 8), layout, timeout=120, backend="gloo")
            computed = [m[0] for m in measured]
            unmasked = [m[1] for m in measured]
            rows.append(
                dict(
                    cp=cp,
                    layout=layout,
                    unmasked_measured=unmasked,
                    mask_formula="same" if unmasked == mask else mask,
                    computed_measured=computed,
                    schedule_formula="same" if computed == sched else sched,
                    max_over_min=f"{balance_ratio(computed):.2f}",
                )
            )
    _table(
        rows,
        ["cp", "layout", "unmasked_measured", "mask_formula", "computed_measured", "schedule_formula", "max_over_min"],
    )


# --------------------------------------------------------------------------------------------------- overlap


def _rank_overlap(full, overlap, repeats, causal):
    r, n = dist.get_rank(), dist.get_world_size()
    q, k, v = (shard_sequence(x, 2, r, n, "zigzag").requires_grad_() for x in full)
    runs = []
    for i in range(repeats + 1):
        stats = RingStats()
        dist.barrier()
        t0 = time.perf_counter()
        out = ring_attention(q, k, v, causal=causal, overlap=overlap, stats=stats)
        out.sum().backward()
        wall = time.perf_counter() - t0
        if i:  # the first run warms up
            runs.append(
                (
                    wall,
                    stats.compute_s("forward"),
                    stats.wait_s("forward"),
                    stats.compute_s("backward"),
                    stats.wait_s("backward"),
                )
            )
    return runs


def overlap(configs, repeats):
    print(
        "== Overlap: time blocked waiting for a transfer (exposed communication) vs computing, per rank (ms); each "
        f"rank's least-disturbed of {repeats} runs, then the slowest rank"
    )
    rows = []
    for cp, (b, s, h, h_kv, d), causal in configs:
        full = _qkv(b, h, h_kv, s, d)
        for ov in (True, False):
            per_rank = launch(_rank_overlap, cp, full, ov, repeats, causal, timeout=600, backend="gloo")
            best = [min(runs, key=lambda run: run[0]) for runs in per_rank]  # least disturbed by other load
            worst = [max(run[j] for run in best) * 1e3 for j in range(5)]  # the slowest rank sets the step
            msg = ring_traffic(b, s, h_kv, d, cp, 4)["kv_message_bytes"]
            rows.append(
                dict(
                    cp=cp,
                    s=s,
                    heads=f"{h}/{h_kv}",
                    d=d,
                    causal=causal,
                    kv_msg_KiB=msg // 1024,
                    p2p="async (overlap)" if ov else "blocking",
                    fwd_compute=f"{worst[1]:.1f}",
                    fwd_wait=f"{worst[2]:.1f}",
                    bwd_compute=f"{worst[3]:.1f}",
                    bwd_wait=f"{worst[4]:.1f}",
                    wall=f"{worst[0]:.1f}",
                )
            )
    _table(
        rows,
        [
            "cp",
            "s",
            "heads",
            "d",
            "causal",
            "kv_msg_KiB",
            "p2p",
            "fwd_compute",
            "fwd_wait",
            "bwd_compute",
            "bwd_wait",
            "wall",
        ],
    )


# --------------------------------------------------------------------------------------------------- rounds, drift


def _rank_rounds(full):
    r, n = dist.get_rank(), dist.get_world_size()
    q, k, v = (shard_sequence(x, 2, r, n, "zigzag") for x in full)
    with trace() as tr:
        ring_attention(q, k, v, causal=True)
    return tr.events


def rounds():
    print("== Article A's round table (cp=4), read from the real ring's trace")
    print(format_round_table(ring_rounds(launch(_rank_rounds, 4, _qkv(1, 2, 2, 16, 8), backend="gloo"))))
    print()


def drift():
    print("== bf16 ring attention: RMS error vs float64, merge accumulated in bf16 vs float32 (s=256, non-causal)")
    rows = merge_precision_drift((1, 2, 4, 8))
    for r in rows:
        r["bf16_merge"] = f"{r['bf16_merge']:.2e}"
        r["fp32_merge"] = f"{r['fp32_merge']:.2e}"
    _table(rows, ["cp", "bf16_merge", "fp32_merge"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller overlap sizes and fewer repeats")
    args = ap.parse_args()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print(
        f"machine: {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"{gpus} GPU(s), flash-attn {'available' if flash_available() else 'not installed'}"
    )
    if not gpus:
        print(
            "No GPU here: everything below runs the torch block kernel on gloo ranks; the flash-attn kernel path "
            "is UNVERIFIED (run bench/cp_gpu_check.py on a GPU node)."
        )
    print()
    traffic((2, 64, 8, 4, 16))
    traffic_at_scale()
    balance(64)
    repeats = 3 if args.quick else 5
    # (cp, (b, s, n_head, n_kv_head, d_head), causal). On CPU, cp ranks share the cores: with more ranks than cores
    # the "wait" also holds time a rank spends descheduled while its neighbour computes.
    configs = [(2, (1, 512, 16, 16, 64), False), (4, (1, 1024, 4, 4, 64), False), (4, (1, 2048, 4, 4, 64), True)]
    if args.quick:
        configs = configs[:1]
    overlap(configs, repeats)
    rounds()
    drift()


if __name__ == "__main__":
    main()
