"""The one-GPU check: what a reader with a single GPU runs (a few minutes), and what CI runs on the CPU.

    python bench/gpu_single.py          # one CUDA GPU: bf16 and fp16 checks at s = 4K, timing at s = 32K
    python bench/gpu_single.py --cpu    # every row on the CPU, float64, small sizes (tests/test_gpu_single.py)

Rows (each PASS or FAIL against a relative tolerance, ||got - want|| / ||want|| over the whole tensor):
  launch   launch(fn, 1, backend="nccl"): a spawned rank, its function shipped by cloudpickle, bound to cuda:0,
           an all-reduce on the GPU, the result back on the CPU.          (--cpu: gloo, a forked rank)
  kernel   the block kernel `select_kernel(q, "auto")` picks (flash-attn if installed, else torch's own fused
           SDPA op) against TorchKernel in float32 on the same inputs: out, lse, dq, dk, dv; bf16 and fp16,
           MHA and GQA, causal and not.                                   (--cpu: torch's CPU fused op, float64)
  cp       ring attention (contiguous and zig-zag layouts) and Ulysses, causal GQA, cp = 4 ranks as threads on
           the one device (bench/cp_threads.py: the real RingAttention / ulysses_attention forward and backward),
           output and dq, dk, dv against full attention in float32 at s = 4K.
  merge    the zig-zag ring with cp = 8, its (out, lse) accumulators in float32 (checked) and in bf16 (reported):
           the book's merge-precision pitfall on the real kernel, with the LSE handed to backward in bf16.
  time     forward + backward of the CP = 2/4/8 ring (every rank's work, run one after another on the one
           device) over one fused call on the whole sequence at s = 32K: the ring's compute overhead, ideally
           1.0x (no pass/fail; device-synchronized clock).
Exit status 0 when every check passes, 1 if one fails, 2 if there is no GPU (without --cpu).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/cp_threads.py beside this script

from cp_threads import ThreadTransport, backward_in_thread  # noqa: E402

from pylib.cp import kernel_attention, ring_attention, shard_sequence, ulysses_attention, unshard_sequence  # noqa: E402
from pylib.cp.kernels import TorchKernel, select_kernel  # noqa: E402
from pylib.runtime import launch  # noqa: E402
from pylib.runtime.clock import time_per_call  # noqa: E402
from pylib.runtime.compat import SUPPORTED, unsupported_reason  # noqa: E402

TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 1e-2}


@dataclass(frozen=True)
class Plan:
    """Sizes and dtypes of one run: GPU (bf16/fp16 against float32) or CPU (float64 against float64)."""

    device: str
    dtypes: tuple
    ref_dtype: torch.dtype
    kernel: str  # what select_kernel is asked for
    kernel_shape: tuple  # (b, s, n_head, d_head) of the kernel rows; GQA rows use n_head // 4 K/V heads
    cp_shape: tuple  # (b, s, n_head, n_kv_head, d_head) of the cp and merge rows
    cp: int
    merge_cp: int
    time_shape: tuple  # (b, s, n_head, n_kv_head, d_head) of the timing rows
    time_cps: tuple
    repeats: int


GPU = Plan(
    "cuda",
    (torch.bfloat16, torch.float16),
    torch.float32,
    "auto",
    (2, 1024, 8, 64),
    (1, 4096, 8, 4, 64),
    4,
    8,
    (1, 32768, 8, 2, 128),
    (2, 4, 8),
    3,
)
CPU = Plan(
    "cpu",
    (torch.float64,),
    torch.float64,
    "sdpa",
    (2, 32, 8, 16),
    (1, 64, 8, 4, 16),
    4,
    8,
    (1, 256, 4, 2, 16),
    (2, 4, 8),
    1,
)


class Report:
    def __init__(self):
        self.rows, self.failed = 0, []

    def check(self, row: str, name: str, err: float, tol: float, note: str = "") -> None:
        ok = err <= tol  # a NaN error fails
        self.rows += 1
        if not ok:
            self.failed.append(f"{row} {name}")
        print(f"{'PASS' if ok else 'FAIL'}  {row:7s} {name:52s} rel err {err:9.2e}  tol {tol:.0e}  {note}", flush=True)


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    return ((got - want).norm() / want.norm().clamp_min(1e-300)).item()


def rand(shape, dtype, device, seed) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)


def qkv(b, s, h, h_kv, d, dtype, device, seed=0):
    return [rand(shape, dtype, device, seed + i) for i, shape in enumerate([(b, h, s, d), *[(b, h_kv, s, d)] * 2])]


def dname(dtype) -> str:
    return str(dtype).replace("torch.", "")


# ------------------------------------------------------------------------------------------------ launch


def _launch_probe(x):
    """One rank: where it computes, an all-reduce there, a tensor back."""
    import torch.distributed as dist

    from pylib.runtime import current_device

    device = current_device()
    t = x.to(device) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return dict(device=str(device), backend=dist.get_backend(), sum=t, pid=os.getpid())


def launch_row(plan: Plan, report: Report) -> None:
    backend = "nccl" if plan.device == "cuda" else "gloo"
    x = torch.arange(4, dtype=torch.float32)
    (got,) = launch(_launch_probe, 1, x, backend=backend, timeout=300)
    want_device = "cuda:0" if plan.device == "cuda" else "cpu"
    placed = got["device"] == want_device and got["backend"] == backend and got["pid"] != os.getpid()
    err = rel(got["sum"], x) if placed and got["sum"].device.type == "cpu" else float("inf")
    report.check("launch", f"1 rank, {backend}, on {got['device']}, result on the CPU", err, 0.0)


# ------------------------------------------------------------------------------------------------ kernel


def kernel_rows(plan: Plan, report: Report) -> None:
    b, s, h, d = plan.kernel_shape
    ref = TorchKernel()
    for dtype in plan.dtypes:
        for h_kv in (h, h // 4):
            for causal in (False, True):
                q, k, v = qkv(b, s, h, h_kv, d, dtype, plan.device, seed=10)
                dout = rand((b, h, s, d), dtype, plan.device, 20)
                kernel = select_kernel(q, plan.kernel)
                scale = d**-0.5
                out, lse = kernel.forward(q, k, v, causal=causal, scale=scale)
                grads = kernel.backward(dout, q, k, v, out, lse, causal=causal, scale=scale)
                r = [x.to(plan.ref_dtype) for x in (q, k, v, dout)]
                out_r, lse_r = ref.forward(*r[:3], causal=causal, scale=scale)
                grads_r = ref.backward(r[3], *r[:3], out_r, lse_r, causal=causal, scale=scale)
                errs = dict(out=rel(out, out_r), lse=rel(lse, lse_r))
                errs.update({n: rel(g, g_r) for n, g, g_r in zip(("dq", "dk", "dv"), grads, grads_r)})
                worst = max(errs, key=errs.get)
                name = f"{kernel!r:22.22s} {dname(dtype)} {'MHA' if h_kv == h else 'GQA'} causal={causal}"
                report.check("kernel", name, errs[worst], TOL[dtype], f"(worst: {worst})")


# ------------------------------------------------------------------------------------------------ cp


def _cp_rank(group, full, dout, kind, layout, kernel, merge_dtype):
    """One cp rank (a thread): its shard of q, k, v, ring or Ulysses forward, then backward in this thread."""
    r, n = group.rank, group.size
    q, k, v = (shard_sequence(x, 2, r, n, layout).detach().requires_grad_() for x in full)
    if kind == "ring":
        out = ring_attention(q, k, v, group=group, causal=True, layout=layout, kernel=kernel, merge_dtype=merge_dtype)
    else:
        out = ulysses_attention(q, k, v, group=group, causal=True, layout=layout, kernel=kernel)
    backward_in_thread(out, shard_sequence(dout, 2, r, n, layout))
    return [t.detach() for t in (out, q.grad, k.grad, v.grad)]


def cp_run(n, full, dout, kind, layout, kernel, merge_dtype=None):
    """(out, dq, dk, dv) of the whole sequence, from n thread ranks."""
    with ThreadTransport(n) as transport:
        parts = transport.run(_cp_rank, full, dout, kind, layout, kernel, merge_dtype)
    return [unshard_sequence([p[j] for p in parts], 2, layout) for j in range(4)]


def full_reference(full, dout, ref_dtype):
    q, k, v = (x.detach().to(ref_dtype).requires_grad_() for x in full)
    out = kernel_attention(q, k, v, causal=True, kernel=TorchKernel())
    out.backward(dout.to(ref_dtype))
    return [t.detach() for t in (out, q.grad, k.grad, v.grad)]


def cp_rows(plan: Plan, report: Report) -> None:
    b, s, h, h_kv, d = plan.cp_shape
    dtype = plan.dtypes[0]
    full = qkv(b, s, h, h_kv, d, dtype, plan.device, seed=30)
    dout = rand((b, h, s, d), dtype, plan.device, 40)
    kernel = select_kernel(full[0], plan.kernel)
    want = full_reference(full, dout, plan.ref_dtype)
    for kind, layout in (("ring", "contiguous"), ("ring", "zigzag"), ("ulysses", "zigzag")):
        got = cp_run(plan.cp, full, dout, kind, layout, plan.kernel)
        errs = {n: rel(g, w) for n, g, w in zip(("out", "dq", "dk", "dv"), got, want)}
        worst = max(errs, key=errs.get)
        name = f"{kind} {layout} cp={plan.cp} s={s} {dname(dtype)} vs full attention"
        report.check("cp", name, errs[worst], TOL[dtype], f"(worst: {worst}; kernel {kernel!r})")

    # the merge: the same ring with accumulators in float32 and in bf16
    merged = {}
    for merge_dtype in (torch.float32, torch.bfloat16):
        got = cp_run(plan.merge_cp, full, dout, "ring", "zigzag", plan.kernel, merge_dtype)
        merged[merge_dtype] = max(rel(g, w) for g, w in zip(got, want))
    f32, bf16 = merged[torch.float32], merged[torch.bfloat16]
    report.check(
        "merge",
        f"ring zigzag cp={plan.merge_cp} s={s} {dname(dtype)}, float32 merge",
        f32,
        max(TOL[dtype], TOL[torch.float32]),
        f"(bf16 merge: {bf16:.2e}, {bf16 / max(f32, 1e-300):.1f}x the float32 merge's error)",
    )


# ------------------------------------------------------------------------------------------------ time


def _ring_step(group, full, dout, kernel):
    r, n = group.rank, group.size
    q, k, v = (shard_sequence(x, 2, r, n, "zigzag").detach().requires_grad_() for x in full)
    out = ring_attention(q, k, v, group=group, causal=True, layout="zigzag", kernel=kernel)
    backward_in_thread(out, shard_sequence(dout, 2, r, n, "zigzag"))


def time_rows(plan: Plan) -> list[dict]:
    b, s, h, h_kv, d = plan.time_shape
    dtype = plan.dtypes[0]
    full = qkv(b, s, h, h_kv, d, dtype, plan.device, seed=50)
    dout = rand((b, h, s, d), dtype, plan.device, 60)
    kernel = select_kernel(full[0], plan.kernel)
    device = full[0].device

    def one_call():
        q, k, v = (x.detach().requires_grad_() for x in full)
        kernel_attention(q, k, v, causal=True, kernel=kernel).backward(dout)

    single = time_per_call(one_call, device, repeats=plan.repeats)
    rows = []
    print(f"\ntime    forward+backward, causal, s={s}, {dname(dtype)}, heads {h}/{h_kv}, d_head={d}, {kernel!r}")
    print(f"        one fused call on the whole sequence: {single * 1e3:9.1f} ms")
    for n in plan.time_cps:
        with ThreadTransport(n) as transport:
            t = time_per_call(lambda tr=transport: tr.run(_ring_step, full, dout, kernel), device, repeats=plan.repeats)
        rows.append(dict(cp=n, ring_s=t, single_s=single, ratio=t / single))
        print(f"        ring zigzag cp={n} (all ranks, one device): {t * 1e3:9.1f} ms = {t / single:5.2f}x one call")
    return rows


# ------------------------------------------------------------------------------------------------ main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="every row on the CPU in float64 at small sizes")
    args = ap.parse_args(argv)
    if args.cpu:
        plan = CPU
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: this is the one-GPU check (use --cpu to run every row on the CPU)")
            return 2
        plan = GPU
    lo, hi = SUPPORTED
    why = unsupported_reason()
    where = torch.cuda.get_device_name(0) if plan.device == "cuda" else "CPU"
    print(
        f"torch {torch.__version__} (GPU path supports {lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}"
        f"{'' if why is None else ': ' + why}), {where}, kernel request {plan.kernel!r}"
    )
    report = Report()
    launch_row(plan, report)
    kernel_rows(plan, report)
    cp_rows(plan, report)
    time_rows(plan)
    passed = report.rows - len(report.failed)
    print(f"\n{passed} of {report.rows} checks passed" + (f"; FAILED: {report.failed}" if report.failed else ""))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
