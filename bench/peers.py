"""Ours against torch's own implementation of each mode, in one run: one table of step-time ratios ours / torch.

    PYTHONPATH=. python bench/peers.py [--steps 10] [--settings on off full] [--rows tp pp dp cp ep] [--tiny]

Every row is a forward + backward (and, for DP, the gradient sync and the optimizer step) of the same module on
the same gloo ranks, timed as the slowest rank's step (each rank times from a common barrier; the step is the max
over ranks). `--steps` cycles each run every variant once, back to back; a step time is the median over cycles,
a ratio the median over cycles of the two variants' ratio in the same cycle, so a burst of load from the rest of
the machine falls on both sides of it.

    TP, TP+SP            pylib.tp.TPBlock                    DTensor: parallelize_module (pylib.tp.dtensor)
    1F1B, interleaved,   pylib.pp.PipelineParallel           torch.distributed.pipelining Schedule1F1B,
    zb-v, dualpipev      (no timeline recorded)              ScheduleInterleaved1F1B, ScheduleZBVZeroBubble,
                                                             ScheduleDualPipeV: the same chunks, placed alike
    DDP                  pylib.dp.wrap(..., "ddp")           torch.nn.parallel.DistributedDataParallel + Adam
    ZeRO-3               pylib.dp.wrap(..., "zero3", units=  FSDP2: fully_shard on each layer and the root + Adam
                         the layers), the root unit kept     (torch's default: the root kept from forward to
                         for backward                        backward)
    ZeRO-3 every unit    pylib.dp.wrap(..., "zero3")         FSDP2: fully_shard on embed, each layer, ln_f,
                         (the book's: every unit resharded)  lm_head and the root, reshard_after_forward=True
    ring (CP)            pylib.cp.ring_attention, zig-zag    all-gather K and V (torch.distributed.nn), then
                                                             torch's scaled_dot_product_attention with the mask
    EP dispatch          pylib.ep.ExpertParallelMoE          (torch has none: the row shows the check's cost only)
    EP+ETP (etp=2)       the same on 2 x 2 ranks, each        (none in torch)
                         expert's h_ffn split over ETP

Torch has no cross-rank agreement check, so ours runs under each `--settings` (like with like: "off"):
    on     the check as shipped (`pylib.runtime.agreement`): a call the group's verified order predicts costs
           nothing; unknown calls (the first steps) one all-reduce of two int64
    every  the check before predicted calls: one all-reduce of two int64 before every collective
    off    `agreement_check(False)`: no check at all, as torch
    full   the check before issue 30: every collective first all-gathers every rank's whole descriptor
The `check` column is ours-on / ours-off - 1: what the check costs of that row's step (`every`: the same for
ours-every); `checked/step` how many collectives of an ours-on step still communicated to check (the slowest
rank, the median cycle), predicted calls whose raw row counts still had to be compared included: 0 once the step's
order is learned (the pipeline's once-per-step `agree_pipeline` included: it too is predicted once verified).

Timing on a shared CPU with gloo is noisy: rerun and read the medians, not one row.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benches, imported not copied
from cp_ring import _qkv  # noqa: E402
from ep_moe import ep_layer_and_input  # noqa: E402
from pp_schedules import CFG as PP_CFG  # noqa: E402
from pp_schedules import SEQ as PP_SEQ  # noqa: E402
from pp_schedules import torch_schedule_step  # noqa: E402
from tp_layer import SIZES as TP_SIZES  # noqa: E402
from tp_layer import _step as tp_step  # noqa: E402

from pylib.cp import ring_attention, shard_sequence  # noqa: E402
from pylib.cp.layout import sequence_positions  # noqa: E402
from pylib.dp import wrap  # noqa: E402
from pylib.dp.batch import micro_batch  # noqa: E402
from pylib.model import ModelConfig, build_model, random_hidden, random_tokens, torch_dtype  # noqa: E402
from pylib.plan.config import MoEConfig  # noqa: E402
from pylib.plan.schedules import rank_stage  # noqa: E402
from pylib.pp.pipeline import PipelineParallel  # noqa: E402
from pylib.pp.recorder import PipelineRecorder  # noqa: E402
from pylib.pp.split import lm_loss, rank_chunks  # noqa: E402
from pylib.runtime import agreement, agreement_check, launch  # noqa: E402
from pylib.runtime.collectives import resolve_group  # noqa: E402
from pylib.tp import TPBlock, scatter_to_sequence_parallel_region  # noqa: E402
from pylib.tp.dtensor import dtensor_block  # noqa: E402

SETTINGS = ("on", "every", "off", "full")
DP_CFG = ModelConfig(vocab_size=251, d_model=66, n_layers=4, n_heads=3, d_ff=264, dtype="float32")  # dp_zero's
DP_BATCH, DP_SEQ = 16, 32
CP_SIZE = (1, 1024, 4, 4, 64)  # (b, s, n_head, n_kv_head, d_head): cp_ring.py's causal overlap row
EP_SIZE = (128, 64, MoEConfig(n_experts=8, top_k=2))  # (tokens per rank, h, config): ep_moe.py's traced run


@contextlib.contextmanager
def _setting(name: str):
    """Ours under one agreement-check setting ("every": step 1 before every collective, nothing predicted; "full":
    the whole descriptor exchanged before every collective)."""
    agreement._setting.full_exchange = name == "full"
    agreement._setting.predict = name == "on"
    try:
        with agreement_check(name != "off"):
            yield
    finally:
        agreement._setting.full_exchange, agreement._setting.predict = False, True


def _timed(ours, theirs, settings, steps) -> dict[str, list[float]]:
    """This rank's step times {variant: [seconds of each cycle]}, variants "ours <setting>" and "torch": each
    variant warmed up once, then `steps` cycles, each running every variant once, back to back (so a burst of load
    from the rest of the machine falls on the variants of one cycle alike)."""
    variants = {f"ours {s}": (ours, s) for s in settings}
    if theirs is not None:
        variants["torch"] = (theirs, "off")
        variants[AGAIN] = (theirs, "off")  # the control: torch against itself, timed the same way
    for fn, s in variants.values():
        with _setting(s):
            fn()
    out = {k: [] for k in variants}
    if "on" in settings:
        out[CHECKED] = []
    order = list(variants.items())
    for cycle in range(steps):
        k = cycle % len(order)  # each cycle starts one variant later: no variant always runs first, or last
        for key, (fn, s) in order[k:] + order[:k]:
            with _setting(s):
                dist.barrier()
                before = _checked()
                t0 = time.perf_counter()
                fn()
                out[key].append(time.perf_counter() - t0)
                if s == "on":
                    out[CHECKED].append(_checked() - before)
    return out


AGAIN = "torch again"  # torch's step timed a second time in each cycle: the A/A control
CHECKED = "checked calls"  # of ours on, per step: the calls that communicated to check (steps 1-2, rendezvous)


def _checked() -> int:
    """Calls this rank's groups have checked with communication so far (`agreement._Predictor`): steps 1-2, store
    rendezvous, and predicted calls whose raw row counts were still checked (split residuals, `sizes` hashes); and
    the pipeline's step checks and rendezvous (`agreement._PipelineState`)."""
    calls = sum(p.checked + p.rounds + p.row_checks for p in agreement._PREDICTORS.values())
    return calls + sum(p.checked + p.rounds for p in agreement._PIPELINES.values())


# ------------------------------------------------------------------------------------------------ the rows


def _tp_rank(sizes, settings, steps):
    t = dist.get_world_size()
    rows = []
    for b, s, h, heads, ff in sizes:
        cfg = ModelConfig(d_model=h, n_heads=heads, d_ff=ff, n_layers=1, dtype="float32")
        ref = build_model(cfg).layers[0]
        for sp in (False, True):
            ours, theirs = TPBlock.from_full(ref, sequence_parallel=sp), dtensor_block(ref, t, sp)
            x = random_hidden(b, s, h, dtype=torch_dtype(cfg.dtype))
            x = (scatter_to_sequence_parallel_region(x) if sp else x).detach().requires_grad_()
            times = _timed(lambda: tp_step(ours, x, True), lambda: tp_step(theirs, x, False), settings, steps)  # noqa: B023
            rows.append((("TP+SP" if sp else "TP"), f"b={b} s={s} h={h}", "DTensor", times))
    return rows


# ours -> (v, placement, torch's schedule class): each pair runs the same chunks in the same placement
PP_PEERS = {
    "1f1b": (1, "loop", "Schedule1F1B"),
    "interleaved": (2, "loop", "ScheduleInterleaved1F1B"),
    "zb-v": (2, "v", "ScheduleZBVZeroBubble"),
    "dualpipev": (2, "v", "ScheduleDualPipeV"),
}


def _pp_rank(m, schedules, settings, steps):
    import torch.distributed.pipelining.schedules as torch_schedules
    from torch.distributed.pipelining import PipelineStage

    rank, p = dist.get_rank(), dist.get_world_size()
    model = build_model(PP_CFG)
    ids, targets = random_tokens(PP_CFG, m, PP_SEQ, seed=0)
    rows = []
    for name in schedules:
        v, placement, label = PP_PEERS[name]
        chunks = rank_chunks(model, rank, p, v, placement=placement)
        cpu = torch.device("cpu")
        stages = [PipelineStage(c, rank_stage(rank, k, p, placement), p * v, cpu) for k, c in enumerate(chunks)]
        schedule = getattr(torch_schedules, label)(stages[0] if v == 1 else stages, m, loss_fn=lm_loss)
        pipe = PipelineParallel(model, v=v, placement=placement)

        def theirs(schedule=schedule, placement=placement):
            if placement == "v" and rank == 0:  # the V: rank 0 holds the first stage and the last
                schedule.step(ids, target=targets)
            else:
                torch_schedule_step(schedule, ids, targets)

        def ours(pipe=pipe, name=name):
            pipe.zero_grad()
            recorder = PipelineRecorder(measure_memory=False, record_timeline=False)  # torch records none either
            pipe.step(ids, targets, schedule=name, n_microbatches=m, recorder=recorder)

        rows.append((name, f"p={p} m={m} v={v}", label, _timed(ours, theirs, settings, steps)))
    return rows


def _ours_dp(cfg, g, zero_stage, wrapping):
    """Ours on a fresh reference model, wrapped as `_torch_dp` wraps its peer: (model, trainer). "layers": each layer
    a unit, embed, ln_f and lm_head in the root unit, kept for backward (FSDP2's default); otherwise `wrap`'s
    default units, each resharded after forward."""
    model = build_model(cfg)
    if wrapping == "layers":
        dp = wrap(model, zero_stage, g, units=[f"layers.{i}" for i in range(cfg.n_layers)], lr=1e-2)
        dp.set_reshard_after_forward(False, ["root"])
    else:
        dp = wrap(model, zero_stage, g, lr=1e-2)
    return model, dp


def _torch_dp(cfg, g, wrapping):
    """torch's peer on the reference model: DDP, or FSDP2 over `wrapping` ("layers": fully_shard on each layer and
    the root, torch's default policy, the root kept from forward to backward; "every": on embed, each layer, ln_f
    and lm_head too, and the root resharded after forward like every unit)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    reference = build_model(cfg)
    if wrapping is None:
        return DDP(reference)
    mesh = init_device_mesh("cpu", (g.size,))
    inner = list(reference.layers)
    if wrapping == "every":
        inner += [reference.embed, reference.ln_f, reference.lm_head]
    for module in inner:
        fully_shard(module, mesh=mesh)
    return fully_shard(reference, mesh=mesh, reshard_after_forward=True if wrapping == "every" else None)


# (label, zero stage, wrapping, torch's peer): ZeRO-3 twice, each wrapped as its FSDP2 peer (the same units, the
# same collectives: `FullyShardedDataParallel.reshard_after_forward`)
DP_ROWS = (
    ("DDP", "ddp", None, "torch DDP"),
    ("ZeRO-3", "zero3", "layers", "FSDP2 fully_shard"),
    ("ZeRO-3 every unit", "zero3", "every", "FSDP2 fully_shard"),
)


def _dp_rank(cfg, batch, seq, settings, steps):
    g = resolve_group(None)
    ids, targets = random_tokens(cfg, batch, seq, seed=0)
    ids, targets = micro_batch(ids, g.rank, g.size), micro_batch(targets, g.rank, g.size)
    rows = []
    for label, stage, wrapping, peer in DP_ROWS:
        model, dp = _ours_dp(cfg, g, stage, wrapping)

        def ours(model=model, dp=dp):
            model.loss(ids, targets).backward()
            dp.finish_gradient_sync()
            dp.step()
            dp.zero_grad()

        try:
            module = _torch_dp(cfg, g, wrapping)
            optimizer = torch.optim.Adam(module.parameters(), lr=1e-2)

            def theirs(module=module, optimizer=optimizer):
                lm_loss(module(ids), targets).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            theirs()  # FSDP2 on gloo: fails here, not inside the timing, if it cannot run
        except Exception as exc:  # noqa: BLE001  (measured, then said in the table)
            theirs, peer = None, f"{peer}: cannot run here ({type(exc).__name__}: {str(exc)[:80]})"
        size = f"{cfg.n_layers} layers h={cfg.d_model} b={batch} s={seq}"
        rows.append((label, size, peer, _timed(ours, theirs, settings, steps)))
    return rows


def _allgather_kv_attention(q, k, v, layout):
    """The reference: every rank all-gathers K and V (torch.distributed.nn: differentiable), puts them back in
    sequence order and runs torch's scaled_dot_product_attention for its own queries with the causal mask."""
    from torch.distributed.nn.functional import all_gather

    r, n = dist.get_rank(), dist.get_world_size()
    s_local = q.shape[2]
    s = s_local * n
    order = torch.cat([sequence_positions(s, j, n, layout) for j in range(n)])  # gathered row -> position
    with warnings.catch_warnings():  # torch 2.13 points to a private module instead; this one is public since 1.x
        warnings.simplefilter("ignore", FutureWarning)
        k_full, v_full = (torch.cat(all_gather(t.contiguous()), dim=2) for t in (k, v))
    inverse = torch.argsort(order)
    k_full, v_full = k_full[:, :, inverse], v_full[:, :, inverse]
    mine = sequence_positions(s, r, n, layout)
    mask = mine[:, None] >= torch.arange(s)[None, :]
    return F.scaled_dot_product_attention(q, k_full, v_full, attn_mask=mask)


def _cp_rank(size, settings, steps):
    r, n = dist.get_rank(), dist.get_world_size()
    b, s, h, h_kv, d = size
    q, k, v = (shard_sequence(x, 2, r, n, "zigzag").requires_grad_() for x in _qkv(b, h, h_kv, s, d))

    torch.testing.assert_close(  # the same work: the reference's output is the ring's
        ring_attention(q, k, v, causal=True, layout="zigzag"), _allgather_kv_attention(q, k, v, "zigzag")
    )

    def ours():
        ring_attention(q, k, v, causal=True, layout="zigzag").sum().backward()

    def theirs():
        _allgather_kv_attention(q, k, v, "zigzag").sum().backward()

    return [
        (
            "ring (CP)",
            f"s={s} heads={h} d={d} causal",
            "all-gather KV + SDPA",
            _timed(ours, theirs, settings, steps),
        )
    ]


def _ep_rank(size, settings, steps, etp=1):
    tokens, h, cfg = size
    layer, x = ep_layer_and_input(tokens, h, cfg, etp)

    def ours():
        layer(x).sum().backward()

    label = f"{tokens} tokens/rank h={h} E={cfg.n_experts} top-{cfg.top_k}"
    name = "EP dispatch" if etp == 1 else f"EP+ETP (etp={etp})"
    return [(name, label, "(none in torch)", _timed(ours, None, settings, steps))]


def _check_rank(settings, calls, rounds):
    """The check alone: seconds per call of a small all_gather_tensor (16 float32 per rank) under each setting,
    `rounds` rounds of `calls` calls per setting, the settings taking turns round by round."""
    from pylib.runtime import collectives as C

    x = torch.ones(16)
    out = {s: [] for s in settings}
    for _ in range(rounds):
        for s in settings:
            with _setting(s):
                C.all_gather_tensor(x)
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(calls):
                    C.all_gather_tensor(x)
                out[s].append((time.perf_counter() - t0) / calls)
    return out


def check_rows(settings, calls=100, rounds=5, worlds=(2, 4)) -> list[dict]:
    """Per world size: the microseconds of one small collective under each setting (the slowest rank of each round,
    the median round) and what the check adds to it, on and full, per call (median over rounds of on - off)."""
    rows = []
    for n in worlds:
        per_rank = launch(_check_rank, n, settings, calls, rounds, timeout=900, backend="gloo")
        rounds_of = {s: [max(ts) for ts in zip(*(r[s] for r in per_rank))] for s in settings}
        row = dict(ranks=n, us={s: 1e6 * statistics.median(ts) for s, ts in rounds_of.items()})
        for s in settings:
            if s != "off" and "off" in settings:
                row[f"{s} adds"] = 1e6 * statistics.median(a - b for a, b in zip(rounds_of[s], rounds_of["off"]))
        rows.append(row)
    return rows


def format_check_rows(rows: list[dict], settings) -> str:
    head = f"{'ranks':>5}  " + "  ".join(f"{s + ' us':>9}" for s in settings)
    adds = [s for s in settings if f"{s} adds" in rows[0]]
    head += "".join(f"  {s + ' adds us':>13}" for s in adds)
    lines = [head]
    for r in rows:
        line = f"{r['ranks']:>5}  " + "  ".join(f"{r['us'][s]:>9.0f}" for s in settings)
        lines.append(line + "".join(f"  {r[f'{s} adds']:>13.0f}" for s in adds))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ the table


def table_rows(launched: list[tuple[int, list]]) -> list[dict]:
    """From [(ranks, [each rank's rows])] to one dict a row: the mode, its size, the peer, each variant's step
    seconds (the slowest rank of each cycle, the median cycle), the ratio ours / torch for each setting and the
    check's cost ours-on / ours-off - 1, each ratio the median over cycles of the two variants' times in the same
    cycle (paired: a burst of load in one cycle falls on both)."""
    out = []
    for ranks, per_rank in launched:
        for i, (mode, size, peer, _) in enumerate(per_rank[0]):
            steps = {key: [max(ts) for ts in zip(*(rows[i][3][key] for rows in per_rank))] for key in per_rank[0][i][3]}
            row = dict(mode=mode, size=size, ranks=ranks, peer=peer)
            row["seconds"] = {key: statistics.median(ts) for key, ts in steps.items()}

            def paired(a, b, steps=steps):
                return statistics.median(x / y for x, y in zip(steps[a], steps[b]))

            def quartiles(a, b, steps=steps):
                ratios = [x / y for x, y in zip(steps[a], steps[b])]
                return tuple(statistics.quantiles(ratios, n=4)[::2]) if len(ratios) > 1 else (ratios[0],) * 2

            for key in steps:
                if key.startswith("ours ") and "torch" in steps:
                    row[f"{key}/torch"] = paired(key, "torch")
                    row[f"{key}/torch quartiles"] = quartiles(key, "torch")
            if AGAIN in steps:
                row["torch/torch"] = paired(AGAIN, "torch")
                row["torch/torch quartiles"] = quartiles(AGAIN, "torch")
            if "ours on" in steps and "ours off" in steps:
                row["check"] = paired("ours on", "ours off") - 1
            if "ours every" in steps and "ours off" in steps:
                row["every"] = paired("ours every", "ours off") - 1
            out.append(row)
    return out


def machine() -> str:
    load = ", load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()) if hasattr(os, "getloadavg") else ""
    return f"{platform.platform()}, {os.cpu_count()} CPUs, torch {torch.__version__}, gloo{load}"


def _ratio(row: dict, key: str) -> str:
    """A ratio as the table shows it: the median over cycles, then its quartiles over cycles in brackets."""
    if key not in row:
        return "-"
    lo, hi = row[f"{key} quartiles"]
    return f"{row[key]:.2f} [{lo:.2f}-{hi:.2f}]"


def format_table(rows: list[dict], settings) -> str:
    ours = [f"ours {s}" for s in settings]
    head = ["mode", "size", "ranks", "torch's", *[f"{k} ms" for k in ours], "torch ms"]
    head += [f"{k}/torch" for k in ours] + ["torch/torch", "check", "every", "checked/step"]
    lines = []
    for r in rows:
        ms = [f"{1e3 * r['seconds'][k]:.2f}" if k in r["seconds"] else "-" for k in [*ours, "torch"]]
        ratios = [_ratio(r, f"{k}/torch") for k in [*ours, "torch"]]
        checks = [f"{100 * r[k]:+.0f}%" if k in r else "-" for k in ("check", "every")]
        checks.append(f"{r['seconds'][CHECKED]:g}" if CHECKED in r["seconds"] else "-")
        lines.append([r["mode"], r["size"], str(r["ranks"]), r["peer"], *ms, *ratios, *checks])
    widths = [max(len(h), *(len(line[c]) for line in lines)) for c, h in enumerate(head)]
    text = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    text += ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)) for line in lines]
    return "\n".join(text)


ROWS = ("tp", "pp", "dp", "cp", "ep")


def measure(settings=SETTINGS, steps=10, tiny=False, rows=ROWS) -> list[dict]:
    """The chosen `rows` (all by default), launched from this process, as `table_rows` gives them."""
    if tiny:
        small = ModelConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, d_ff=32, dtype="float32")
        tp, pp, dp, cp, ep = [(1, 16, 16, 2, 32)], (2, 2), (small, 4, 8), (1, 64, 2, 2, 8), (16, 8, EP_SIZE[2])
        pp_schedules, worlds = ["1f1b"], (2,)
    else:
        tp, pp, dp, cp, ep = TP_SIZES, (4, 8), (DP_CFG, DP_BATCH, DP_SEQ), CP_SIZE, EP_SIZE
        pp_schedules, worlds = list(PP_PEERS), (2, 4)
    d, (p, m) = worlds[-1], pp
    runs = {
        "tp": [(t, (_tp_rank, t, tp, settings, steps)) for t in worlds],
        "pp": [(p, (_pp_rank, p, m, pp_schedules, settings, steps))],
        "dp": [(d, (_dp_rank, d, *dp, settings, steps))],
        "cp": [(d, (_cp_rank, d, cp, settings, steps))],
        "ep": [(d, (_ep_rank, d, ep, settings, steps)), (4, (_ep_rank, 4, ep, settings, steps, 2))],
    }
    launched = [(n, launch(*args, timeout=900, backend="gloo")) for row in rows for n, args in runs[row]]
    return table_rows(launched)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="cycles, each running every variant once")
    ap.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    ap.add_argument("--tiny", action="store_true", help="the smallest sizes (the test's run)")
    ap.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS), help="which modes (all by default)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # several ranks share the cores: extra threads only contend
    start = machine()
    t0 = time.time()
    rows = measure(args.settings, args.steps, args.tiny, args.rows)
    print(f"machine: {start}")
    print(f"ms: the slowest rank's step, median of {args.steps} cycles; ratios: median over cycles of the ratio")
    print("within a cycle, [its quartiles over cycles]; torch/torch: torch's step timed twice in each cycle, the")
    print("second over the first (the A/A control: the spread a ratio has here when nothing differs); check: ours on")
    print("/ ours off - 1, every: ours every / ours off - 1; each cycle starts one variant later; float32\n")
    print(format_table(rows, args.settings))
    if not args.tiny:
        print("\nthe check alone: one all_gather_tensor of 16 float32 per rank, per call (slowest rank, median of 5")
        print("rounds of 100 calls, the settings taking turns); 'adds': median over rounds of (setting - off)\n")
        print(format_check_rows(check_rows(args.settings), args.settings))
    print(f"\n(total {time.time() - t0:.0f} s; load average at the end {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
