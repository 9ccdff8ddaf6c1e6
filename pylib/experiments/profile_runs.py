"""The book's runs under torch.profiler: one traced training step of each mode, its merged trace, and what the
tracer and the recorder saw in the same step (what the trace's numbers are checked against).

    out = profiled_run("pp_1f1b", "runs/pp")   # runs/pp/trace.json (every rank, one clock) and the ranks' records

Each run launches its ranks with `Profile` (`pylib.runtime.profile`), runs one warm-up step, then the step the
figures show inside a `region("step")` range and a `trace()`: every rank returns its tracer's events of that step
(op, axis, tag, phase, times) and what the mode's own recorder measured. The runs (tiny model, float64):

    tp_sp         tp=2, sequence parallelism: the step's all-gathers and reduce-scatters
    cp_overlap    ring attention on cp=2 ranks, forward + backward, each K/V transfer posted before the compute
    cp_blocking   the same, each transfer waited for before the compute (overlap=False)
    pp_1f1b       1F1B, p=2, m=4, every forward padded to T_F and every backward to T_B (`PipelineRecorder`'s
                  compute_delay): the bubble, with the allocator's memory recorded (`profile_memory=True`)
    zero3         ZeRO-3 on dp=2: each unit's parameters all-gathered in forward and again in backward
"""

from __future__ import annotations

import gzip
import os
import shutil
import time
from contextlib import nullcontext

import torch

from pylib.compose import ParallelTransformer
from pylib.cp import ring_attention, shard_sequence
from pylib.model import build_model, random_tokens
from pylib.plan.mesh import ParallelConfig
from pylib.plan.options import RunOptions
from pylib.plan.presets import tiny
from pylib.pp.pipeline import PipelineParallel
from pylib.pp.recorder import PipelineRecorder
from pylib.runtime import Mesh, launch, trace
from pylib.runtime.profile import Profile, region

CFG = tiny().with_(n_layers=2)
BATCH, SEQ = 8, 16
PP_M = 4
T_F, T_B = 0.015, 0.03  # seconds each pipeline forward / backward is padded to (compute_delay)
CP_SHAPE = dict(b=1, n_head=4, s=256, d_head=16)

MESHES = {
    "tp_sp": (ParallelConfig(tp=2), RunOptions(sequence_parallel=True)),
    "zero3": (ParallelConfig(dp=2), RunOptions(zero_stage=3)),
}
RUNS = ("tp_sp", "cp_overlap", "cp_blocking", "pp_1f1b", "zero3")


def _events(tr) -> list[dict]:
    keep = ("op", "axis", "tag", "phase", "t_start", "t_end", "payload_bytes", "bytes_sent")
    return [{k: getattr(e, k) for k in keep} for e in tr.events]


def _composed(name: str, steps: int = 1):
    par, options = MESHES[name]

    model = ParallelTransformer.from_full(build_model(CFG), Mesh(par), options)
    ids, targets = random_tokens(CFG, BATCH, SEQ, seed=1)
    model.step(ids, targets)  # warm-up
    seconds = []
    for i in range(steps):  # each timed (the profiler's overhead); the last is the step the trace keeps
        last = i == steps - 1
        with region("step") if last else nullcontext(), trace() as tr:
            t0 = time.perf_counter()
            res = model.step(ids, targets)
            seconds.append(time.perf_counter() - t0)
    return dict(events=_events(tr), loss=res.loss, seconds=seconds)


def _ring(overlap: bool):
    s = CP_SHAPE
    g = torch.Generator().manual_seed(0)
    full = [torch.randn(s["b"], s["n_head"], s["s"], s["d_head"], generator=g, dtype=torch.float64) for _ in range(3)]
    r, n = torch.distributed.get_rank(), torch.distributed.get_world_size()
    q, k, v = (shard_sequence(x, 2, r, n, "zigzag") for x in full)

    def once():
        ql, kl, vl = (x.clone().requires_grad_() for x in (q, k, v))
        ring_attention(ql, kl, vl, causal=True, overlap=overlap).sum().backward()

    once()  # warm-up
    with region("step"), trace() as tr:
        once()
    return dict(events=_events(tr))


def _pipeline():
    model = build_model(CFG)
    pipe = PipelineParallel(model)
    ids, targets = random_tokens(CFG, BATCH, SEQ, seed=1)
    pipe.step(ids, targets, n_microbatches=PP_M)  # warm-up
    pipe.zero_grad()
    rec = PipelineRecorder(compute_delay=(T_F, T_B))
    with region("step"), trace() as tr:
        run = pipe.step(ids, targets, n_microbatches=PP_M, recorder=rec)
    return dict(
        events=_events(tr),
        timeline=[e.as_dict() for e in run.timeline],
        activation_bytes=dict(run.activation_bytes),
        peak_activation_bytes=run.peak_activation_bytes,
        peak_in_flight=run.peak_in_flight,
    )


def rank_step(name: str, steps: int = 1):
    """One rank's part of run `name`: build, warm up, then the step inside `region("step")` and a `trace()`."""
    if name in MESHES:
        return _composed(name, steps)
    if name.startswith("cp_"):
        return _ring(name == "cp_overlap")
    return _pipeline()


def profiled_run(
    name: str, out_dir: str | None, *, steps: int = 1, world_size: int = 2, timeout: float = 120.0
) -> dict:
    """Run `name` (one of `RUNS`) on `world_size` gloo ranks under the profiler, traces in `out_dir` (None: the
    same run without a profiler, for its step time). Returns dict(name, trace=the merged trace's path or None,
    ranks=[each rank's record of the step]); a composed run (`MESHES`) runs `steps` steps after its warm-up and its
    records hold `seconds`, each step's wall time (the trace keeps the last)."""
    if name not in RUNS:
        raise ValueError(f"profiled_run: name={name!r} must be one of {RUNS}")
    prof = None if out_dir is None else Profile(out_dir, profile_memory=name == "pp_1f1b", window="step")
    ranks = launch(rank_step, world_size, name, steps, backend="gloo", timeout=timeout, profile=prof)
    return dict(name=name, trace=None if prof is None else prof.merged_path, ranks=ranks)


def gzipped(path: str, dest: str) -> str:
    """A gzip copy of a trace (what the book offers for download; Perfetto opens it as it is), written whole and then
    renamed into place, so that a reader of dest never sees half a file; returns dest."""
    dest = os.fspath(dest)
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    part = f"{dest}.{os.getpid()}.part"
    with open(path, "rb") as src, gzip.open(part, "wb", compresslevel=9) as out:
        shutil.copyfileobj(src, out)
    os.replace(part, dest)
    return dest
