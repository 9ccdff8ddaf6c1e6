"""Every parallel mode on a GPU node, NCCL with one rank per GPU, checked against the single-device reference.

    python bench/gpu_check.py                   # every visible GPU (at most 8): NCCL, rank r on cuda:r
    python bench/gpu_check.py --ranks 4         # the first 4 GPUs (or CUDA_VISIBLE_DEVICES=...)
    python bench/gpu_check.py --only tp,cp-ring # some modes
    python bench/gpu_check.py --cpu --quick     # the same checks on gloo CPU ranks: proves the script (CI runs it)

Each mode runs in its own launch (a hang or crash in one does not hide the others), does one short training
step (DP and the composed model: a few Adam steps) and is compared with the single-device reference:

    tp, tp+sp        TPTransformer (GQA, SwiGLU, RoPE), loss and every gathered gradient; collectives vs
                     pylib.analysis.tp.model_collectives
    cp-ring,         ring attention / Ulysses, causal zig-zag, output and dq/dk/dv vs attention on the whole
    cp-ulysses       sequence; on a GPU in bf16 with the flash-attn kernel when it is installed (`select_kernel`),
                     else torch's own fused attention (SDPAKernel); traffic vs ring_traffic / ulysses_traffic
    ep               ExpertParallelMoE over all ranks, output, input, router and expert gradients vs the
                     reference MoE on every rank's tokens; all-to-all bytes vs the dispatch matrix's formula
    pp               1F1B over all ranks, loss and gradients; point-to-point bytes vs p2p_bytes_per_rank
    ddp, zero1-3     pylib.dp.train_data_parallel, losses and parameters after the steps vs one device;
                     bytes per op vs pylib.analysis.dp.traffic_by_op
    compose          ParallelTransformer (TP+SP, CP, PP, ZeRO-3 as the GPU count allows), losses and every
                     parameter piece vs one device; per-axis traffic vs pylib.analysis.compose.step_traffic

and, on a GPU with flash-attn, the single-GPU kernel checks of bench/cp_gpu_check.py (flash vs torch kernel).

Prints one row per mode -- ranks, what ran (dtype, kernel), the largest error against its tolerance, whether the
traced bytes equal the formula, the time of the checked step (the slowest rank) -- and exits with status 1 if any
mode fails, 2 if it cannot run (no GPU without --cpu).

With --cpu every rank also runs under `pylib.runtime.placement.stray_tensors_to_meta`: a tensor that pylib creates
without naming its device goes to the meta device, so a mode that would mix a stray CPU tensor with GPU data on
a GPU node fails here too, with the file and line of the stray tensor.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback
from collections import Counter

import torch
import torch.distributed as dist

from pylib.analysis.cp import ring_traffic, ulysses_traffic
from pylib.analysis.dp import traffic_by_op
from pylib.analysis.ep import alltoall_bytes, dispatch_matrix
from pylib.analysis.pp import p2p_bytes_per_rank
from pylib.analysis.tp import model_collectives
from pylib.compose import compose_problems, traffic_matches_formulas
from pylib.cp import (
    TorchKernel,
    kernel_attention,
    ring_attention,
    select_kernel,
    shard_sequence,
    ulysses_attention,
    unshard_sequence,
)
from pylib.dp import STAGES, assemble
from pylib.ep import ExpertParallelMoE
from pylib.experiments.compose_training import compare_with_reference, train, train_reference
from pylib.experiments.dp_training import train_data_parallel
from pylib.experiments.dp_training import train_reference as dp_reference
from pylib.model import ModelConfig, MoEConfig, build_model, random_tokens
from pylib.plan import RunOptions
from pylib.plan.presets import tiny, tiny_gqa, tiny_odd
from pylib.pp import PipelineParallel
from pylib.runtime import ParallelConfig, current_device, launch, trace
from pylib.runtime.placement import stray_tensors_to_meta
from pylib.tp import TPTransformer, gather_full

MODES = ("tp", "tp+sp", "cp-ring", "cp-ulysses", "ep", "pp", *STAGES, "compose")
TOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}
COMPOSE_OPTIONS = RunOptions(zero_stage=3, schedule="1f1b", n_microbatches=2, cp_kind="ring")


# ------------------------------------------------------------------------------------------------ sizes


def sizes(n: int, *, gpu: bool, quick: bool) -> dict:
    """Every mode's sizes for n ranks: each split size a multiple of n, tiny except CP's sequence on a GPU."""
    return dict(
        n=n,
        # TP / SP: n_head = 2n, n_kv_head = n (GQA, K/V heads split), h_ffn and V multiples of n, s = 2n for SP
        tp=dict(
            cfg=ModelConfig(
                vocab_size=16 * n,
                d_model=8 * n,
                n_layers=2,
                n_heads=2 * n,
                n_kv_heads=n,
                d_ff=16 * n,
                mlp="swiglu",
                position="rope",
                dtype="float64",
            ),
            b=2,
            s=2 * n,
        ),
        # CP: n_head = 2n, n_kv_head = n (Ulysses needs n | n_kv_head), zig-zag needs 2n | s
        cp=dict(
            b=1,
            heads=2 * n,
            kv_heads=n,
            d=64 if gpu else 8,
            s=(1024 if quick else 4096) // (2 * n) * (2 * n) if gpu else (4 if quick else 8) * n,
            dtype=torch.bfloat16 if gpu else torch.float64,
        ),
        # EP: 2 experts per rank, top-2, 8 tokens per rank
        ep=dict(
            cfg=ModelConfig(
                vocab_size=16, d_model=16, n_layers=1, n_heads=2, d_ff=32, dtype="float64", moe=MoEConfig(2 * n, 2)
            ),
            tokens=8,
        ),
        # PP: one layer per rank, m = 2n microbatches of one sequence
        pp=dict(
            cfg=tiny().with_(n_layers=n),
            m=2 * n,
            s=8,
        ),
        # DP: odd sizes, so ZeRO's flat buffers need padding
        dp=dict(
            cfg=tiny_odd(),
            batch=2 * n,
            seq=8,
            steps=2 if quick else 3,
            bucket_bytes=2048,
            lr=1e-2,
        ),
        compose=dict(
            cfg=tiny_gqa(),
            pc=compose_config(n),
            steps=2 if quick else 3,
            seq=16,
            lr=1e-2,
        ),
    )


def compose_config(n: int) -> ParallelConfig:
    """TP+SP, CP and PP as far as n allows (ZeRO-3 over the rest): 8 | n -> tp2 cp2 pp2, 4 | n -> tp2 pp2,
    2 | n -> pp2, else dp only."""
    if n % 8 == 0:
        return ParallelConfig(tp=2, cp=2, pp=2, dp=n // 8)
    if n % 4 == 0:
        return ParallelConfig(tp=2, pp=2, dp=n // 4)
    if n % 2 == 0:
        return ParallelConfig(pp=2, dp=n // 2)
    return ParallelConfig(dp=n)


# ------------------------------------------------------------------------------------------------ in the ranks


def _sync() -> None:
    if current_device().type == "cuda":
        torch.cuda.synchronize()


def _timed(fn):
    """(fn(), seconds), the device synchronised on both sides."""
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    return out, time.perf_counter() - t0


def _cpu_randn(shape, seed, dtype=torch.float64):
    """The same numbers on every rank and in the caller (generated on the CPU)."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def _tp(spec, sequence_parallel: bool) -> dict:
    cfg, b, s = spec["cfg"], spec["b"], spec["s"]
    dev = current_device()
    model = TPTransformer.from_full(build_model(cfg).to(dev), sequence_parallel=sequence_parallel)
    ids, targets = (t.to(dev) for t in random_tokens(cfg, b, s, seed=1))

    def step():
        loss = model.loss(ids, targets)
        loss.backward()
        model.finalize_grads()
        return loss

    with trace() as tr:
        loss, seconds = _timed(step)
    grads = gather_full(model, grads=True)
    traced = Counter((e.phase, e.op, e.tag, e.payload_bytes, e.bytes_sent) for e in tr.events)
    return dict(loss=float(loss.detach()), grads=grads, traced=traced, seconds=seconds)


def _cp(spec, kind: str) -> dict:
    b, h, h_kv, d, s, dtype = (spec[k] for k in ("b", "heads", "kv_heads", "d", "s", "dtype"))
    r, n = dist.get_rank(), dist.get_world_size()
    dev = current_device()
    full = [_cpu_randn(shape, i, dtype) for i, shape in enumerate([(b, h, s, d), (b, h_kv, s, d), (b, h_kv, s, d)])]
    dout = _cpu_randn((b, h, s, d), 9, dtype)
    q, k, v = (shard_sequence(x, 2, r, n, "zigzag").to(dev).requires_grad_() for x in full)
    fn = ring_attention if kind == "ring" else ulysses_attention
    kernel = select_kernel(q, "auto")

    def step():
        out = fn(q, k, v, causal=True, layout="zigzag", kernel=kernel)
        out.backward(shard_sequence(dout, 2, r, n, "zigzag").to(dev))
        return out

    with trace() as tr:
        out, seconds = _timed(step)
    res = dict(
        kernel=kernel.name,
        shards=[t.detach().double() for t in (out, q.grad, k.grad, v.grad)],
        sent=sum(e.bytes_sent for e in tr.events),
        seconds=seconds,
    )
    if r == 0:  # the reference: the torch kernel on the whole sequence, on one device, in float32 or wider
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        qf, kf, vf = (x.to(dev, acc).requires_grad_() for x in full)
        ref = kernel_attention(qf, kf, vf, causal=True, kernel=TorchKernel())
        ref.backward(dout.to(dev, acc))
        res["reference"] = [t.detach().double() for t in (ref, qf.grad, kf.grad, vf.grad)]
    return res


def _moe(cfg):
    return build_model(cfg).layers[0].mlp


def _ep(spec) -> dict:
    cfg, T = spec["cfg"], spec["tokens"]
    r, n = dist.get_rank(), dist.get_world_size()
    dev = current_device()
    h = cfg.d_model
    layer = ExpertParallelMoE.from_full(_moe(cfg).to(dev))  # the EP group: every rank
    x = _cpu_randn((n, T, h), 3)[r].to(dev).requires_grad_()
    dy = _cpu_randn((n, T, h), 4)[r].to(dev)

    def step():
        y = layer(x[None])[0]
        y.backward(dy)
        return y

    with trace() as tr:
        y, seconds = _timed(step)
    layer.reduce_router_grad()  # every rank routed other tokens: the router's gradient is their sum
    experts = {
        f"experts.{layer.experts.global_id(i)}.{name}": p.grad
        for i, expert in enumerate(layer.experts.experts)
        for name, p in expert.named_parameters()
    }
    return dict(
        y=y.detach(),
        dx=x.grad,
        router=layer.router.gate.weight.grad,
        experts=experts,
        routing=layer.last_routing.experts,
        sent=sum(e.bytes_sent for e in tr.events if e.op == "all_to_all"),
        seconds=seconds,
    )


def _pp(spec) -> dict:
    cfg, m, s = spec["cfg"], spec["m"], spec["s"]
    rank = dist.get_rank()
    dev = current_device()
    pipe = PipelineParallel(build_model(cfg).to(dev))  # p = every rank, one chunk each
    ids, targets = (t.to(dev) for t in random_tokens(cfg, m, s, seed=2))
    with trace() as tr:
        run, seconds = _timed(lambda: pipe.step(ids, targets, schedule="1f1b", n_microbatches=m))
    return dict(
        loss=run.loss,
        grads={name: p.grad for name, p in pipe.named_parameters()},
        sent=sum(e.bytes_sent for e in tr.events if e.op == "send"),
        expected=p2p_bytes_per_rank(1, s, cfg.d_model, 8, dist.get_world_size(), m, rank),
        seconds=seconds,
    )


def _dp(spec) -> dict:
    kw = {k: spec[k] for k in ("steps", "bucket_bytes", "lr")}
    out = {}
    for stage in STAGES:
        res, seconds = _timed(
            lambda stage=stage: train_data_parallel(
                spec["cfg"], stage, global_batch=spec["batch"], seq=spec["seq"], **kw
            )
        )
        out[stage] = dict(res, seconds=seconds / spec["steps"])
    return out


def _compose(spec) -> dict:
    return train(
        spec["cfg"],
        spec["pc"],
        COMPOSE_OPTIONS,
        steps=spec["steps"],
        batch=spec["batch"],
        seq=spec["seq"],
        lr=spec["lr"],
        data="pattern",
    )


WORKERS = {
    "tp": lambda spec: _tp(spec["tp"], False),
    "tp+sp": lambda spec: _tp(spec["tp"], True),
    "cp-ring": lambda spec: _cp(spec["cp"], "ring"),
    "cp-ulysses": lambda spec: _cp(spec["cp"], "ulysses"),
    "ep": lambda spec: _ep(spec["ep"]),
    "pp": lambda spec: _pp(spec["pp"]),
    "dp": lambda spec: _dp(spec["dp"]),
    "compose": lambda spec: _compose(spec["compose"]),
}


def _rank(group: str, spec: dict, strays: bool) -> dict:
    """One launch's work on one rank; with `strays`, pylib's device-less tensors go to meta (see the docstring)."""
    mode = stray_tensors_to_meta() if strays else contextlib.nullcontext()
    with mode as placement:
        try:
            return WORKERS[group](spec)
        except Exception as exc:
            sites = getattr(placement, "sites", [])
            if sites:
                raise RuntimeError(f"{exc}\ntensors pylib created without a device (on meta here): {sites}") from exc
            raise


# ------------------------------------------------------------------------------------------------ in the caller


class Row:
    """One line of the table: a mode's largest error against its tolerance, its bytes against the formula."""

    def __init__(self, mode: str, ranks: int, what: str = "float64", tol: float = TOL[torch.float64]):
        self.mode, self.ranks, self.what, self.tol = mode, ranks, what, tol
        self.error: float | None = None
        self.bytes_ok: bool | None = None
        self.bytes_note = ""
        self.seconds: float | None = None
        self.failure = ""

    @property
    def ok(self) -> bool:
        return not self.failure and self.error is not None and self.error <= self.tol and self.bytes_ok is not False


def _max_abs(got, want) -> float:
    """Largest |got - want|; a missing gradient (None: nothing reached the parameter) counts as zeros."""
    if got is None and want is None:
        return 0.0
    got = torch.zeros_like(want) if got is None else got
    want = torch.zeros_like(got) if want is None else want
    if got.shape != want.shape:
        raise ValueError(f"shape {tuple(got.shape)} != reference {tuple(want.shape)}")
    return float((got.double() - want.double()).abs().max()) if got.numel() else 0.0


def _dict_error(got: dict, want: dict) -> float:
    if set(got) != set(want):
        raise ValueError(f"names missing or extra: {sorted(set(got) ^ set(want))}")
    return max(_max_abs(got[k], want[k]) for k in want)


def _reference_grads(model, ids, targets) -> tuple[float, dict]:
    loss = model.loss(ids, targets)
    loss.backward()
    return float(loss.detach()), {name: p.grad for name, p in model.named_parameters()}


def check_tp(row, per_rank, spec, sequence_parallel):
    c, n = spec["tp"], spec["n"]
    cfg, b, s = c["cfg"], c["b"], c["s"]
    loss, grads = _reference_grads(build_model(cfg), *random_tokens(cfg, b, s, seed=1))
    row.error = max(max(abs(r["loss"] - loss), _dict_error(r["grads"], grads)) for r in per_rank)
    formula = model_collectives(cfg, b, s, n, sequence_parallel=sequence_parallel)
    want = Counter((f.phase, f.op, f.where, f.payload_bytes, f.bytes_sent) for f in formula)
    row.bytes_ok = all(r["traced"] == want for r in per_rank)
    row.bytes_note = f"{sum(f.bytes_sent for f in formula)} B/rank"
    row.what = f"float64, {cfg.n_heads // n} heads/rank" + (", SP" if sequence_parallel else "")


def check_cp(row, per_rank, spec, kind):
    c, n = spec["cp"], spec["n"]
    row.what = f"{str(c['dtype'])[6:]}, {per_rank[0]['kernel']} kernel, s={c['s']}"
    row.tol = TOL[c["dtype"]]
    ref = per_rank[0]["reference"]
    errors = []
    for j in range(4):  # out, dq, dk, dv: the largest difference relative to the largest reference value
        got = unshard_sequence([r["shards"][j] for r in per_rank], 2, "zigzag")
        errors.append(_max_abs(got, ref[j]) / max(float(ref[j].abs().max()), 1e-30))
    row.error = max(errors)
    elem = torch.tensor([], dtype=c["dtype"]).element_size()
    if kind == "ring":
        f = ring_traffic(c["b"], c["s"], c["kv_heads"], c["d"], n, elem)
    else:
        f = ulysses_traffic(c["b"], c["s"], c["heads"], c["kv_heads"], c["d"], n, elem)
    want = f["forward_bytes_sent"] + f["backward_bytes_sent"]
    row.bytes_ok = all(r["sent"] == want for r in per_rank)
    row.bytes_note = f"{want} B/rank"


def check_ep(row, per_rank, spec):
    c, n = spec["ep"], spec["n"]
    cfg, T, h, E = c["cfg"], c["tokens"], c["cfg"].d_model, c["cfg"].moe.n_experts
    moe = _moe(cfg)
    x = _cpu_randn((n, T, h), 3).requires_grad_()
    y = moe(x.reshape(1, n * T, h)).reshape(n, T, h)
    y.backward(_cpu_randn((n, T, h), 4))
    experts = {f"experts.{name}": p.grad for name, p in moe.experts.named_parameters()}
    err = 0.0
    for r, res in enumerate(per_rank):
        err = max(err, _max_abs(res["y"], y[r].detach()), _max_abs(res["dx"], x.grad[r]))
        err = max(err, _max_abs(res["router"], moe.router.gate.weight.grad))
        err = max([err] + [_max_abs(g, experts[name]) for name, g in res["experts"].items()])
    row.error = err
    matrix = dispatch_matrix([res["routing"] for res in per_rank], E)
    counts = (n - 1) * (E // n) * 8  # the count exchange: E/n int64 numbers to each peer
    # forward: dispatch sends my rows out, combine sends the results back; backward: the same two, reversed
    want = [2 * (a["dispatch_sent"] + a["dispatch_recv"]) + counts for a in alltoall_bytes(matrix, h, 8)]
    row.bytes_ok = [res["sent"] for res in per_rank] == want
    row.bytes_note = f"{min(want)}-{max(want)} B/rank"
    row.what = f"float64, {E} experts, top-{cfg.moe.top_k}"


def check_pp(row, per_rank, spec):
    c = spec["pp"]
    cfg, m, s = c["cfg"], c["m"], c["s"]
    loss, grads = _reference_grads(build_model(cfg), *random_tokens(cfg, m, s, seed=2))
    held = {k: v for r in per_rank for k, v in r["grads"].items()}
    row.error = max(_dict_error(held, grads), abs(per_rank[-1]["loss"] - loss))
    row.bytes_ok = all(r["sent"] == r["expected"] for r in per_rank)
    row.bytes_note = f"{max(r['expected'] for r in per_rank)} B/rank"
    row.what = f"float64, 1F1B, m={m}"


def check_dp(row, per_rank, spec, stage):
    c, n = spec["dp"], spec["n"]
    ref = dp_reference(c["cfg"], global_batch=c["batch"], seq=c["seq"], steps=c["steps"], lr=c["lr"])
    results = [r[stage] for r in per_rank]
    err = max(abs(sum(r["losses"][i] for r in results) / n - ref["losses"][i]) for i in range(c["steps"]))
    layouts = results[0]["layouts"]
    holdings = [] if stage == "zero3" else [r["params"] for r in results]  # ZeRO-3's modules hold no parameter
    if stage != "ddp":  # the optimizer's flat shards, put together
        holdings.append(assemble(layouts, [r["param_shards"] for r in results]))
    row.error = max([err] + [_dict_error(params, ref["params"]) for params in holdings])
    psi = sum(lay.padded_bytes if stage != "ddp" else lay.bytes for lay in layouts)
    want = traffic_by_op(psi, n, stage)
    sent = []
    for r in results:
        for events in r["events"]:  # one list per step
            by_op = Counter()
            for e in events:
                by_op[e["op"]] += e["bytes_sent"]
            sent.append(dict(by_op))
    row.bytes_ok = all(s == want for s in sent)
    row.bytes_note = f"{sum(want.values())} B/rank/step"
    row.seconds = max(r["seconds"] for r in results)
    row.what = f"float64, {c['steps']} Adam steps"


def check_compose(row, per_rank, spec):
    c = spec["compose"]
    cfg, pc = c["cfg"], c["pc"]
    ref = train_reference(cfg, steps=c["steps"], batch=c["batch"], seq=c["seq"], data="pattern", lr=c["lr"])
    err = compare_with_reference(per_rank, ref)
    if err["missing"]:
        raise ValueError(f"reference parameters no rank holds: {err['missing']}")
    row.error = max(err["loss_err"], err["param_err"])
    ok = all(traffic_matches_formulas(cfg, pc, r, COMPOSE_OPTIONS, batch=c["batch"], seq=c["seq"]) for r in per_rank)
    row.bytes_ok = ok
    row.bytes_note = "every axis, every rank"
    row.seconds = max(sum(r["times"]) / len(r["times"]) for r in per_rank)
    row.what = f"float64, {pc.describe()}, ZeRO-3, {c['steps']} steps"


CHECKS = {
    "tp": lambda row, res, spec: check_tp(row, res, spec, False),
    "tp+sp": lambda row, res, spec: check_tp(row, res, spec, True),
    "cp-ring": lambda row, res, spec: check_cp(row, res, spec, "ring"),
    "cp-ulysses": lambda row, res, spec: check_cp(row, res, spec, "ulysses"),
    "ep": check_ep,
    "pp": check_pp,
    **{stage: (lambda row, res, spec, stage=stage: check_dp(row, res, spec, stage)) for stage in STAGES},
    "compose": check_compose,
}


def run_group(group: str, modes: list[str], spec: dict, args, backend: str) -> list[Row]:
    """One launch for `group` (the DP stages share one), then each mode's check. A launch that raises or hangs
    fails its rows; the rank's traceback is printed below the table."""
    n = spec["n"]
    rows = [Row(m, n) for m in modes]
    try:
        per_rank = launch(_rank, n, group, spec, args.cpu, backend=backend, timeout=args.timeout)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        for row in rows:
            row.failure = f"{type(exc).__name__}: {exc}"
        return rows
    for row in rows:
        try:
            CHECKS[row.mode](row, per_rank, spec)
            if row.seconds is None:
                row.seconds = max(r["seconds"] for r in per_rank)
        except Exception:  # noqa: BLE001 - reported in the table
            row.failure = "the check raised:\n" + traceback.format_exc()
    return rows


def flash_kernel_rows(rows) -> None:
    """On a GPU with flash-attn: bench/cp_gpu_check.py's single-GPU checks of the flash kernel against the torch
    kernel (bf16 and fp16, causal and not, MHA and GQA) and of merged flash blocks against one call."""
    from pylib.cp import FlashKernel

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/, for its cp_gpu_check.py
    import cp_gpu_check

    row = Row("cp-kernel", 1, "bf16+fp16, flash vs torch kernel", tol=0.0)
    rows.append(row)
    try:
        device, kernel = torch.device("cuda", 0), FlashKernel()
        cp_gpu_check.kernel_checks(device, kernel, [torch.bfloat16, torch.float16], 2e-2)
        cp_gpu_check.merge_check(device, kernel, torch.bfloat16, 2e-2)
    except Exception as exc:  # noqa: BLE001
        row.failure = f"{type(exc).__name__}: {exc}"
        return
    row.error = float(len(cp_gpu_check.FAILED))  # the number of failed checks (each printed PASS/FAIL above)
    row.bytes_note = "no communication" if not cp_gpu_check.FAILED else f"FAILED: {cp_gpu_check.FAILED}"


def table(rows) -> str:
    head = (
        f"{'mode':<11} {'ranks':>5}  {'what ran':<38} {'max error':>10} {'tol':>7}  {'traced bytes = formula':<30} "
        f"{'time':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        err = "-" if r.error is None else f"{r.error:.1e}"
        tol = "-" if r.tol is None else f"{r.tol:.0e}"
        b = (
            "-"
            if r.bytes_ok is None
            else ("yes" if r.bytes_ok else "NO") + (f" ({r.bytes_note})" if r.bytes_note else "")
        )
        t = "-" if r.seconds is None else f"{r.seconds * 1e3:.1f} ms"
        status = "" if r.ok else "  FAIL"
        lines.append(f"{r.mode:<11} {r.ranks:>5}  {r.what[:38]:<38} {err:>10} {tol:>7}  {b[:30]:<30} {t:>9}{status}")
    lines.append(
        "max error: the largest |difference| from one device over losses, outputs, gradients and parameters (CP: "
        "relative to the\nlargest reference value); time: the checked step on the slowest rank, its first call "
        "(warm-up included; DP: per step)"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="gloo CPU ranks instead of NCCL GPUs (what CI runs)")
    ap.add_argument("--quick", action="store_true", help="fewer steps and shorter sequences")
    ap.add_argument("--ranks", type=int, default=0, help="ranks (default: every GPU, at most 8; 4 with --cpu)")
    ap.add_argument("--only", default="", help=f"comma-separated modes of {', '.join(MODES)}")
    ap.add_argument("--timeout", type=float, default=0, help="seconds per launch (default 120 on CPU, 900 on GPUs)")
    args = ap.parse_args(argv)

    if args.cpu:
        backend, n = "gloo", args.ranks or 4
    else:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus < 2:
            print(f"{gpus} CUDA GPU(s) visible: this script checks NCCL across GPUs (use --cpu for the CPU run)")
            return 2
        backend, n = "nccl", args.ranks or min(gpus, 8)
        if n > gpus:
            print(f"--ranks {n} needs {n} GPUs, {gpus} visible")
            return 2
    if n < 2:
        print("at least 2 ranks")
        return 2
    args.timeout = args.timeout or (120 if args.cpu else 900)
    wanted = [m.strip() for m in args.only.split(",") if m.strip()] or list(MODES)
    unknown = sorted(set(wanted) - set(MODES))
    if unknown:
        print(f"unknown mode(s) {unknown}; modes: {', '.join(MODES)}")
        return 2
    spec = sizes(n, gpu=not args.cpu, quick=args.quick)
    c = spec["compose"]
    c["batch"] = 2 * c["pc"].dp * COMPOSE_OPTIONS.n_microbatches
    problems = compose_problems(c["cfg"], c["pc"], n, batch=c["batch"], seq=c["seq"], options=COMPOSE_OPTIONS)
    if problems:
        raise SystemExit(f"internal: the composed configuration for {n} ranks is invalid: {problems}")

    from pylib.cp import flash_available

    flash = not args.cpu and flash_available()
    print(
        f"{n} ranks on {backend}"
        + (f" ({torch.cuda.get_device_name(0)})" if not args.cpu else ", pylib's device-less tensors on meta")
        + (
            "; flash-attn installed" if flash else "; flash-attn not installed: CP uses torch's fused attention on CUDA"
        ),
        flush=True,
    )
    rows: list[Row] = []
    groups: dict[str, list[str]] = {}
    for m in wanted:
        groups.setdefault("dp" if m in STAGES else m, []).append(m)
    for group, modes in groups.items():
        t0 = time.perf_counter()
        rows += run_group(group, modes, spec, args, backend)
        print(f"  {group}: {time.perf_counter() - t0:.1f} s", flush=True)
    if flash and any(m.startswith("cp") for m in wanted):
        flash_kernel_rows(rows)
    print()
    print(table(rows))
    failed = [r for r in rows if not r.ok]
    for r in failed:
        if r.failure:
            print(f"\n{r.mode}: {r.failure}")
    print(
        f"\n{len(rows) - len(failed)} of {len(rows)} checks passed"
        + (f"; FAILED: {[r.mode for r in failed]}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
