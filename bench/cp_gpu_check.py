"""Verify and time the flash-attn path of pylib.cp on a GPU node (NCCL, flash-attn 2). Not run in CI.

    PYTHONPATH=. python bench/cp_gpu_check.py                 # every visible GPU (up to 8) as the cp group
    PYTHONPATH=. python bench/cp_gpu_check.py --cp 4 --seq 32768
    PYTHONPATH=. python bench/cp_gpu_check.py --cpu           # dry run of this script: torch kernel, gloo, fp32

Checks, each printed PASS/FAIL (exit status 1 on any FAIL):
  1. kernel: FlashKernel's out, lse and dq/dk/dv equal TorchKernel's (bf16 and fp16; causal and not; MHA and GQA).
  2. merge: flash blocks merged with the LSE equal flash-attn over the whole sequence (one GPU, no ring).
  3. ring, Ulysses and all-gather CP on cp GPUs over NCCL, flash kernel, bf16, causal zig-zag: output and input
     gradients equal single-GPU flash-attn on the full sequence.
Then times forward+backward: ring attention (Ulysses, all-gather CP) on cp GPUs vs flash-attn on one GPU over the same
sequence, reported as tokens per second and the speed-up.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.distributed as dist

from pylib.cp import (
    FlashKernel,
    TorchKernel,
    allgather_attention,
    flash_available,
    kernel_attention,
    merge_all,
    ring_attention,
    shard_sequence,
    ulysses_attention,
    unshard_sequence,
)
from pylib.runtime import launch

KINDS = ("ring", "ulysses", "allgather")

FAILED = []


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| over the whole tensor: gradients grow with s, an absolute bound does not."""
    got, want = got.double().cpu(), want.double().cpu()
    return ((got - want).norm() / want.norm().clamp_min(1e-300)).item()


def report(name: str, err: float, tol: float) -> None:
    ok = err <= tol
    if not ok:
        FAILED.append(name)
    print(f"{'PASS' if ok else 'FAIL'}  {name}: relative error {err:.3e} (tolerance {tol:.0e})", flush=True)


def _rand(shape, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(shape, generator=g).to(device=device, dtype=dtype)


def kernel_checks(device, kernel, dtypes, tol):
    ref = TorchKernel()
    b, s, d = 2, 256, 64
    for dtype in dtypes:
        for h, h_kv in ((8, 8), (8, 2)):
            for causal in (False, True):
                q = _rand((b, h, s, d), dtype, device, 0)
                k = _rand((b, h_kv, s, d), dtype, device, 1)
                v = _rand((b, h_kv, s, d), dtype, device, 2)
                dout = _rand((b, h, s, d), dtype, device, 3)
                scale = d**-0.5
                out, lse = kernel.forward(q, k, v, causal=causal, scale=scale)
                out_r, lse_r = ref.forward(q, k, v, causal=causal, scale=scale)
                grads = kernel.backward(dout, q, k, v, out, lse, causal=causal, scale=scale)
                grads_r = ref.backward(dout, q, k, v, out_r, lse_r, causal=causal, scale=scale)
                name = f"kernel {kernel.name} vs torch, {str(dtype)[6:]}, heads {h}/{h_kv}, causal={causal}"
                report(name + ": out", rel(out, out_r), tol)
                report(name + ": lse", rel(lse, lse_r), tol)
                for g, g_r, n in zip(grads, grads_r, ("dq", "dk", "dv")):
                    report(f"{name}: {n}", rel(g, g_r), tol)


def merge_check(device, kernel, dtype, tol):
    b, h, s, d = 1, 8, 1024, 64
    q, k, v = (_rand((b, h, s, d), dtype, device, i) for i in range(3))
    scale = d**-0.5
    full, _ = kernel.forward(q, k, v, causal=False, scale=scale)
    blocks = [kernel.forward(q, k[:, :, c], v[:, :, c], causal=False, scale=scale) for c in torch.arange(s).chunk(4)]
    out, _ = merge_all(blocks, torch.float32)
    report(f"merge of 4 {kernel.name} blocks vs one call", rel(out, full), tol)


def _rank(cfg):
    r, n = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if cfg["device"] == "cuda" else torch.device("cpu")
    dtype, kernel, s, b, h, h_kv, d = (cfg[k] for k in ("dtype", "kernel", "seq", "batch", "heads", "kv_heads", "d"))
    full = [_rand(shape, dtype, device, i) for i, shape in enumerate([(b, h, s, d), (b, h_kv, s, d), (b, h_kv, s, d)])]
    dout = _rand((b, h, s, d), dtype, device, 9)
    results = {}
    for kind, fn in (("ring", ring_attention), ("ulysses", ulysses_attention), ("allgather", allgather_attention)):
        if kind == "ulysses" and h_kv % n:
            continue
        q, k, v = (shard_sequence(x, 2, r, n, "zigzag").detach().requires_grad_() for x in full)
        out = fn(q, k, v, causal=True, layout="zigzag", kernel=kernel)
        out.backward(shard_sequence(dout, 2, r, n, "zigzag"))
        results[kind] = [t.detach().float().cpu() for t in (out, q.grad, k.grad, v.grad)]

        def step(fn=fn, q=q, k=k, v=v):
            o = fn(q, k, v, causal=True, layout="zigzag", kernel=kernel)
            o.backward(shard_sequence(dout, 2, r, n, "zigzag"))

        results[kind + "_s"] = _time(step, cfg["repeats"], device)
    if r == 0:  # the single-GPU baseline on the full sequence
        q, k, v = (x.detach().requires_grad_() for x in full)
        out = kernel_attention(q, k, v, causal=True, kernel=kernel)
        out.backward(dout)
        results["reference"] = [t.detach().float().cpu() for t in (out, q.grad, k.grad, v.grad)]

        def single(q=q, k=k, v=v):
            kernel_attention(q, k, v, causal=True, kernel=kernel).backward(dout)

        results["single_s"] = _time(single, cfg["repeats"], device, together=False)
    return results


def _time(fn, repeats, device, together=True):
    """Seconds per call. together=True: every rank calls it (a barrier lines them up first)."""
    fn()  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    if together:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeats


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cp", type=int, default=0, help="ranks in the cp group (default: every GPU, at most 8)")
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--d-head", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cpu", action="store_true", help="dry run on CPU: torch kernel, gloo, float32, small sizes")
    args = ap.parse_args()

    if args.cpu:
        device, backend, dtypes, tol = torch.device("cpu"), "gloo", [torch.float32], 1e-5
        kernel, cp = TorchKernel(), args.cp or 2
        seq, heads, kv_heads, d = min(args.seq, 256), min(args.heads, 8), min(args.kv_heads, 4), min(args.d_head, 32)
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: this script checks the GPU path (use --cpu for a dry run)")
            sys.exit(2)
        if not flash_available():
            print(
                "flash-attn does not import (optional: pip install flash-attn --no-build-isolation); "
                "bench/gpu_single.py checks torch's own fused kernel"
            )
            sys.exit(2)
        device, backend, dtypes, tol = torch.device("cuda"), "nccl", [torch.bfloat16, torch.float16], 3e-2
        kernel, cp = FlashKernel(), args.cp or min(torch.cuda.device_count(), 8)
        seq, heads, kv_heads, d = args.seq, args.heads, args.kv_heads, args.d_head
    print(
        f"device {device}, {torch.cuda.device_count() if device.type == 'cuda' else 0} GPU(s), kernel {kernel.name}, "
        f"cp={cp}, s={seq}, b={args.batch}, heads {heads}/{kv_heads}, d_head={d}"
    )

    kernel_checks(device, kernel, dtypes, tol)
    merge_check(device, kernel, dtypes[0], tol)

    cfg = dict(
        device=device.type,
        dtype=dtypes[0],
        kernel=kernel,
        seq=seq,
        batch=args.batch,
        heads=heads,
        kv_heads=kv_heads,
        d=d,
        repeats=args.repeats,
    )
    per_rank = launch(_rank, cp, cfg, backend=backend, timeout=600 if args.cpu else 900)
    ref = per_rank[0]["reference"]
    for kind in KINDS:
        if kind not in per_rank[0]:
            print(f"skip  {kind}: cp={cp} does not divide n_kv_head={kv_heads}")
            continue
        for j, name in enumerate(("out", "dq", "dk", "dv")):
            got = unshard_sequence([p[kind][j] for p in per_rank], 2, "zigzag")
            report(f"{kind} cp={cp} vs one-GPU {kernel.name}: {name}", rel(got, ref[j]), tol)

    tokens = args.batch * seq
    single = per_rank[0]["single_s"]
    print(f"\nforward+backward, causal, s={seq}: one device {single * 1e3:.1f} ms = {tokens / single:,.0f} tokens/s")
    for kind in KINDS:
        if kind + "_s" in per_rank[0]:
            t = max(p[kind + "_s"] for p in per_rank)
            print(
                f"{kind:9s} cp={cp}: {t * 1e3:.1f} ms = {tokens / t:,.0f} tokens/s, speed-up {single / t:.2f}x "
                f"on {cp} devices ({single / t / cp:.0%} of linear)"
            )
    print("\nall checks passed" if not FAILED else f"\n{len(FAILED)} check(s) FAILED")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
