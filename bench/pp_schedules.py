"""Pipeline parallelism, measured: bubble, point-to-point traffic and activation memory against their formulas,
and our 1F1B step time against PyTorch's Schedule1F1B on the same ranks.

    PYTHONPATH=$PWD python bench/pp_schedules.py [--p 4] [--repeats 3] [--torch-only | --zero-bubble-only | --v-only]

Bubble, four ways (idle time / compute time, averaged over ranks):
  formula     (p-1)/m for GPipe and 1F1B, (p-1)/(v·m) for interleaved
  schedule    the pure schedule simulated in logical time (forward 1, backward 2, posted sends)
  replay      the order the ranks really ran, re-timed in logical units (what the tests assert on)
  padded      wall clock, every forward of a chunk padded to t_f/v and every backward to t_b/v seconds with a
              sleep (the recorder's `compute_delay`): compute costs a known amount, so the timing noise of a
              shared 2-core machine is small against it; communication and scheduling overheads remain
  raw         wall clock of the tiny model as is (dominated by per-op overhead and noise on a CPU)
The median over `--repeats` runs is printed for the wall-clock columns.

1F1B against PyTorch (`--torch-only`: this row alone): our step and `Schedule1F1B`'s on the same ranks, model and
microbatches, alternating, the median step of rank 0. Ours runs with the cross-rank agreement check on (as shipped
under gloo: one all-reduce per step, `agree_pipeline`) and off (as torch, which has none), and records no timeline
(`PipelineRecorder(record_timeline=False)`: torch records none, so neither side makes a collective of its own).

Zero bubble (ZB-H1, ZB-H2: the backward split into B and W): each rank's own idle (from its first compute to its
last, the busiest rank), padded to t_f, t_b/2, t_b/2 seconds for F, B, W (1F1B's backward to t_b), against
`pylib.analysis.pp.split_bubble_time`: (p-1)(T_F+T_B+T_W) for 1F1B, (p-1)(T_B+max(T_F-T_W, 0)) for ZB-H1, 0 for
ZB-H2 at equal costs (nan otherwise: no formula); and the raw step time of each
against our 1F1B's on the same ranks (what the W bookkeeping costs).

Against PyTorch's zero-bubble schedules (`--v-only`: this table alone): ZB-V, DualPipeV and ZB-H1, ours against
PyTorch's ScheduleZBVZeroBubble, ScheduleDualPipeV and ScheduleInterleavedZeroBubble (one stage per rank: our ZB-H1)
on the same ranks, model (two chunks per rank in the V placement; ZB-H1 one per rank) and microbatches, alternating,
the median step of rank 0 (ours with the agreement check off and no timeline, as torch). On a CPU DualPipeV's F&B
slots run back to back on both sides: the ratio is the runtimes', not the overlap's.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.distributed as dist

from pylib.analysis import pp as A
from pylib.model import ModelConfig, build_model, random_tokens, torch_dtype
from pylib.plan.schedules import build
from pylib.pp.pipeline import PipelineParallel
from pylib.pp.recorder import PipelineRecorder
from pylib.pp.simulate import simulate
from pylib.pp.split import lm_loss, rank_chunks
from pylib.pp.timeline import bubble, replay
from pylib.runtime import collectives as C
from pylib.runtime import launch, trace

CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=8, n_heads=4, d_ff=64, dtype="float32")
SEQ = 16
SWEEP = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)]


def _sweep(ms, repeats, t_f, t_b):
    model = build_model(CFG)
    out = []
    for name, v in SWEEP:
        pipe = PipelineParallel(model, v=v)
        for m in ms:
            ids, targets = random_tokens(CFG, m, SEQ, seed=m)  # microbatch size 1
            warm_up = PipelineRecorder(measure_memory=False)
            pipe.step(ids, targets, schedule=name, n_microbatches=m, recorder=warm_up)
            runs = []
            for _ in range(repeats):
                pipe.zero_grad()
                with trace() as tr:
                    run = pipe.step(ids, targets, schedule=name, n_microbatches=m)
                sent = sum(e.bytes_sent for e in tr.select(op="send"))
                pipe.zero_grad()
                padded = pipe.step(
                    ids,
                    targets,
                    schedule=name,
                    n_microbatches=m,
                    recorder=PipelineRecorder(measure_memory=False, compute_delay=(t_f / v, t_b / v)),
                )
                runs.append(dict(raw=run, padded=padded.timeline, sent=sent))
            out.append(dict(name=name, v=v, m=m, runs=runs))
    return out


def torch_schedule_step(schedule, ids, targets):
    """One step of a `torch.distributed.pipelining` schedule on this rank: the first stage feeds the inputs, the
    last the targets, the others neither."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        schedule.step(ids)
    elif rank == p - 1:
        schedule.step(target=targets)
    else:
        schedule.step()


def _torch_1f1b(m, steps):
    """This rank's step seconds {"ours on", "ours off", "torch": [each step]}, the three alternating."""
    rank, p = dist.get_rank(), dist.get_world_size()
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from pylib.runtime import agreement_check

    model = build_model(CFG)
    ids, targets = random_tokens(CFG, m, SEQ, seed=0)
    chunk = rank_chunks(model, rank, p)[0]
    schedule = Schedule1F1B(PipelineStage(chunk, rank, p, torch.device("cpu")), m, loss_fn=lm_loss)
    pipe = PipelineParallel(model)

    def theirs():
        torch_schedule_step(schedule, ids, targets)

    def ours():
        recorder = PipelineRecorder(measure_memory=False, record_timeline=False)
        pipe.step(ids, targets, schedule="1f1b", n_microbatches=m, recorder=recorder)

    variants = {"ours on": (ours, True), "ours off": (ours, False), "torch": (theirs, False)}
    times = {who: [] for who in variants}
    for fn, check in variants.values():  # warm-up
        with agreement_check(check):
            fn()
    for _ in range(steps):
        for who, (fn, check) in variants.items():
            with agreement_check(check):
                dist.barrier()
                t = time.perf_counter()
                fn()
                dist.barrier()
                times[who].append(time.perf_counter() - t)
    return times


# ours -> PyTorch's class; ZB-H1 is ScheduleInterleavedZeroBubble with one stage per rank (test_pp_torch_pipelining)
V_TORCH = {"zb-v": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV", "zb-h1": "ScheduleInterleavedZeroBubble"}


def _torch_v(m, steps):
    """This rank's step seconds {(name, "ours" | "torch"): [each step]} for the zero-bubble schedules torch has,
    alternating."""
    from torch.distributed import pipelining

    from pylib.runtime import agreement_check

    rank, p = dist.get_rank(), dist.get_world_size()
    model = build_model(CFG)
    ids, targets = random_tokens(CFG, m, SEQ, seed=0)
    variants = {}
    for name, cls in V_TORCH.items():
        v, placement = (1, "loop") if name == "zb-h1" else (2, "v")
        pipe = PipelineParallel(model, v=v, placement=placement)
        chunks = rank_chunks(model, rank, p, v, placement=placement)
        stages = [pipelining.PipelineStage(c, c.stage, v * p, torch.device("cpu")) for c in chunks]
        schedule = getattr(pipelining, cls)(stages, m, loss_fn=lm_loss)
        first, last = rank == 0, rank == (0 if placement == "v" else p - 1)

        def theirs(schedule=schedule, first=first, last=last):
            args = (ids,) if first else ()
            schedule.step(*args, target=targets) if last else schedule.step(*args)

        def ours(name=name, pipe=pipe):
            recorder = PipelineRecorder(measure_memory=False, record_timeline=False)
            pipe.step(ids, targets, schedule=name, n_microbatches=m, recorder=recorder)

        variants[(name, "ours")], variants[(name, "torch")] = ours, theirs
    times = {k: [] for k in variants}
    with agreement_check(False):
        for fn in variants.values():  # warm-up
            fn()
        for _ in range(steps):
            for k, fn in variants.items():
                dist.barrier()
                t = time.perf_counter()
                fn()
                dist.barrier()
                times[k].append(time.perf_counter() - t)
    return times


ZB_SWEEP = ("1f1b", "zb-h1", "zb-h2")


def _zero_bubble(m, repeats, t_f, t_b, t_w):
    """Per schedule: the padded timelines (own idle) and the raw step seconds, alternating schedules per repeat."""
    model = build_model(CFG)
    ids, targets = random_tokens(CFG, m, SEQ, seed=m)
    pipe = PipelineParallel(model)
    out = {name: dict(padded=[], raw=[]) for name in ZB_SWEEP}
    for name in ZB_SWEEP:  # warm-up
        pipe.step(ids, targets, schedule=name, n_microbatches=m, recorder=PipelineRecorder(measure_memory=False))
    for _ in range(repeats):
        for name in ZB_SWEEP:
            delay = (t_f, t_b + t_w) if name == "1f1b" else (t_f, t_b, t_w)
            pipe.zero_grad()
            run = pipe.step(
                ids,
                targets,
                schedule=name,
                n_microbatches=m,
                recorder=PipelineRecorder(measure_memory=False, compute_delay=delay),
            )
            out[name]["padded"].append(run.timeline)
            pipe.zero_grad()
            C.all_reduce_(torch.zeros(1))  # a barrier
            t = time.perf_counter()
            pipe.step(ids, targets, schedule=name, n_microbatches=m, recorder=PipelineRecorder(measure_memory=False))
            C.all_reduce_(torch.zeros(1))
            out[name]["raw"].append(time.perf_counter() - t)
    return out


def _formula(name, p, t_f, t_b, t_w):
    """The busiest rank's idle by `pylib.analysis.pp.split_bubble_time`; nan for ZB-H2 away from equal costs,
    where it states none."""
    try:
        return A.split_bubble_time(name, p, t_f, t_b, t_w)
    except ValueError:
        return math.nan


def zero_bubble_rows(p, m, repeats, t_f, t_b, t_w):
    """Measure the ZB table on p gloo ranks: (name, formula, simulated, padded own idle in s, raw ms, ratio)."""
    results = launch(_zero_bubble, p, m, repeats, t_f, t_b, t_w, timeout=900, backend="gloo")
    base = statistics.median(results[0]["1f1b"]["raw"])
    rows = []
    for name in ZB_SWEEP:
        sched = build(
            name, p, m, cost_f=t_f, cost_b=t_b if name != "1f1b" else t_b + t_w, cost_w=t_w if name != "1f1b" else 0
        )
        simulated = max(bubble(simulate(sched, t_f, sched.cost_b, sends="eager", cost_w=sched.cost_w)).own_idle)
        padded = statistics.median(
            max(bubble([e for r in range(p) for e in results[r][name]["padded"][k]]).own_idle) for k in range(repeats)
        )
        raw = statistics.median(results[0][name]["raw"])
        rows.append((name, _formula(name, p, t_f, t_b, t_w), simulated, padded, raw, raw / base))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--p", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10, help="timed steps for the PyTorch comparison")
    ap.add_argument("--t-f", type=float, default=0.04, help="padded forward seconds per stage and microbatch")
    ap.add_argument("--t-b", type=float, default=0.08, help="padded backward seconds per stage and microbatch")
    ap.add_argument("--zero-bubble-only", action="store_true", help="only the zero-bubble table")
    ap.add_argument("--torch-only", action="store_true", help="only the 1F1B step against PyTorch's")
    ap.add_argument("--v-only", action="store_true", help="only ZB-V, DualPipeV and ZB-H1 against PyTorch's")
    args = ap.parse_args()
    if args.v_only:
        _print_torch_v(args)
        return
    if args.zero_bubble_only:
        _print_zero_bubble(args)
        return
    if args.torch_only:
        _print_torch_1f1b(args)
        return
    p = args.p
    ms = [p, 2 * p, 4 * p]  # multiples of p, as the interleaved schedule needs
    nbytes = torch.finfo(torch_dtype(CFG.dtype)).bits // 8
    print(
        f"pipeline p={p}, model h={CFG.d_model} L={CFG.n_layers} {CFG.dtype}, microbatch b=1 s={SEQ}; "
        f"padded compute t_f={args.t_f * 1e3:.0f} ms, t_b={args.t_b * 1e3:.0f} ms per stage"
    )
    t0 = time.time()
    results = launch(_sweep, p, ms, args.repeats, args.t_f, args.t_b, timeout=900, backend="gloo")
    print(f"(sweep ran in {time.time() - t0:.1f} s)\n")

    print("Bubble (idle / compute), mean over ranks")
    print(f"{'schedule':<12} {'v':>2} {'m':>3} {'formula':>8} {'schedule':>9} {'replay':>7} {'padded':>7} {'raw':>7}")
    for i, row in enumerate(results[0]):
        name, v, m = row["name"], row["v"], row["m"]
        runs = [[results[r][i]["runs"][k] for r in range(p)] for k in range(args.repeats)]
        raw_tl = [[e for rank in rep for e in rank["raw"].timeline] for rep in runs]
        padded_tl = [[e for rank in rep for e in rank["padded"]] for rep in runs]
        logical = bubble(simulate(build(name, p, m, v), 1, 2, sends="eager")).mean_relative
        replayed = bubble(replay(raw_tl[0], 1, 2)).mean_relative
        padded = statistics.median(bubble(tl).mean_relative for tl in padded_tl)
        raw = statistics.median(bubble(tl).mean_relative for tl in raw_tl)
        print(
            f"{name:<12} {v:>2} {m:>3} {A.bubble_fraction(p, m, v):>8.3f} {logical:>9.3f} {replayed:>7.3f} "
            f"{padded:>7.3f} {raw:>7.3f}"
        )

    print("\nPoint-to-point bytes per step (all ranks, both directions), traced vs formula 2(pv-1)·m·b·s·h·bytes")
    print(f"{'schedule':<12} {'v':>2} {'m':>3} {'traced':>10} {'formula':>10} {'equal':>6}")
    for i, row in enumerate(results[0]):
        name, v, m = row["name"], row["v"], row["m"]
        traced = sum(results[r][i]["runs"][0]["sent"] for r in range(p))
        formula = A.p2p_bytes_per_step(1, SEQ, CFG.d_model, nbytes, p, m, v)
        print(f"{name:<12} {v:>2} {m:>3} {traced:>10} {formula:>10} {str(traced == formula):>6}")

    print(
        "\nPeak activation memory per rank (bytes autograd saved), measured vs in-flight x bytes per microbatch-chunk"
    )
    print(f"{'schedule':<12} {'v':>2} {'m':>3} {'rank':>4} {'in flight':>9} {'measured':>9} {'formula':>9}")
    for i, row in enumerate(results[0]):
        name, v, m = row["name"], row["v"], row["m"]
        if m != ms[-1]:
            continue
        for r in range(p):
            run = results[r][i]["runs"][0]["raw"]
            per_chunk = max(run.activation_bytes[(0, c)] for c in range(v))
            formula = A.activation_memory(name, p, m, r, per_chunk, v)
            print(
                f"{name:<12} {v:>2} {m:>3} {r:>4} {run.peak_in_flight:>9} {run.peak_activation_bytes:>9} "
                f"{formula:>9}" + ("  (chunks differ: bound)" if v > 1 and r in (0, p - 1) else "")
            )

    _print_torch_1f1b(args)
    _print_zero_bubble(args)
    _print_torch_v(args)


def _print_torch_v(args):
    p, m = args.p, 2 * args.p  # DualPipeV needs m >= 2p
    times = launch(_torch_v, p, m, args.steps, timeout=600, backend="gloo")[0]
    print(f"\nZero-bubble schedules against PyTorch's, p={p}, m={m}, rank 0, median of {args.steps} alternating steps")
    print(f"{'schedule':<10} {'ours ms':>8} {'torch ms':>9} {'ours/torch':>10}  (PyTorch class)")
    for name, cls in V_TORCH.items():
        ours, theirs = (statistics.median(times[(name, who)]) for who in ("ours", "torch"))
        print(f"{name:<10} {ours * 1e3:>8.1f} {theirs * 1e3:>9.1f} {ours / theirs:>10.2f}  ({cls})")


def _print_torch_1f1b(args):
    p, m = args.p, 2 * args.p
    times = launch(_torch_1f1b, p, m, args.steps, timeout=600, backend="gloo")[0]
    on, off, theirs = (statistics.median(times[k]) for k in ("ours on", "ours off", "torch"))
    print(f"\n1F1B step time, p={p}, m={m}, rank 0, median of {args.steps} alternating steps on the same ranks")
    print(
        f"  ours, check on {on * 1e3:8.1f} ms   ours, check off {off * 1e3:8.1f} ms   "
        f"PyTorch Schedule1F1B {theirs * 1e3:8.1f} ms"
    )
    print(f"  ratio ours/PyTorch: check on {on / theirs:.2f}, check off {off / theirs:.2f}")


def _print_zero_bubble(args):
    p, m = args.p, 2 * args.p
    t_f, t_b, t_w = args.t_f, args.t_b / 2, args.t_b / 2
    rows = zero_bubble_rows(p, m, args.repeats, t_f, t_b, t_w)
    print(
        f"\nZero bubble, p={p}, m={m}: own idle of the busiest rank (s), T_F={t_f * 1e3:.0f} ms, "
        f"T_B={t_b * 1e3:.0f} ms, T_W={t_w * 1e3:.0f} ms (1F1B's backward T_B+T_W); raw step time vs our 1F1B"
    )
    print(f"{'schedule':<8} {'formula':>8} {'simulated':>9} {'padded':>7} {'raw ms':>7} {'raw/1f1b':>8}")
    for name, formula, simulated, padded, raw, ratio in rows:
        print(f"{name:<8} {formula:>8.3f} {simulated:>9.3f} {padded:>7.3f} {raw * 1e3:>7.1f} {ratio:>8.2f}")


if __name__ == "__main__":
    main()
