"""Reliability figures of the rank runtime and the lab harness, measured: launches held, faults survived, bad
inputs refused, hangs, leaks, and what the cross-rank agreement check costs.

    python bench/reliability.py                  # 1,000 launches (a few minutes on 2 CPU cores)
    python bench/reliability.py --launches 100   # a quicker pass

Every figure is counted from real runs in this process:

* launches held: back-to-back `launch` calls of 2 gloo ranks that all-reduce, then the processes, file descriptors,
  `pylib-launch-*` folders and resident memory this process holds afterwards, against before;
* faults survived: one rank raises, is killed, segfaults, aborts inside gloo, exits, disagrees with its peers,
  hangs...; each must be reported naming that rank and its cause, within 5 s (faults) or just after the deadline
  (hangs), with no process left behind;
* bad inputs refused: wrong arguments to `launch`, `MoEConfig`, `ParallelConfig`, the collectives (inside ranks),
  CP attention and the lab harness's command line; each must raise an error whose message names the constraint
  (a substring written next to the case). An input that is accepted counts as "accepted silently" (a wrong result
  nobody is told about); one that takes longer than 10 s to be refused counts as a hang;
* bad inputs by class: configs (ModelConfig, MoEConfig, RunOptions, Recompute, MixedPrecision, ParallelConfig, the DP
  wrapper), planner (Cluster, Workload, CostModel, SearchSpace, enumerate_plans' sizes) and messages (tr, PYLIB_LANG,
  the labs folder, lab parameters): NaN, inf, negatives, zero, bools for ints, floats for ints, strings, unknown names,
  huge sizes, each counted named / silent / obscure / slow (> 1 s), with the valid but large sizes timed.

    python bench/reliability.py --bad-inputs-only                          # that last section alone, in seconds
    PYTHONPATH=/path/to/other/checkout python bench/reliability.py --bad-inputs-only   # measured on another pylib
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.append(str(Path(__file__).resolve().parents[1]))  # after $PYTHONPATH: another pylib can be measured

from pylib.runtime import LaunchTimeout, RankFailedError, agreement_check, launch  # noqa: E402
from pylib.runtime import collectives as C  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bad_values import BAD_FIELDS, INF, NAN, named_as  # noqa: E402  (the bad field values tests/test_validation.py refuses too)

HANG_S = 10.0  # a refusal slower than this counts as a hang


# ------------------------------------------------------------------------------------------- what this process holds


def _children() -> list[int]:
    me, kids = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                kids.append(int(entry))
    return kids


def _descendants_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
        except OSError:
            pass
    return alive


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _folders() -> int:
    mine = f"pylib-launch-{os.getpid()}-"
    return sum(name.startswith(mine) for name in os.listdir(tempfile.gettempdir()))


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kib / 1024


def _holdings() -> dict:
    return dict(processes=len(_children()), fds=_fds(), folders=_folders(), rss_mib=_rss_mib())


# ------------------------------------------------------------------------------------------------- launches held


def _sum_ranks():
    t = torch.tensor([float(dist.get_rank())])
    C.all_reduce_(t)
    return float(t)


def launches_held(n: int) -> dict:
    launch(_sum_ranks, 2, backend="gloo")  # warm: the first launch imports what later ones inherit
    before = _holdings()
    wrong, t0 = 0, time.perf_counter()
    for _ in range(n):
        with contextlib.redirect_stdout(io.StringIO()):
            wrong += launch(_sum_ranks, 2, timeout=60, backend="gloo") != [1.0, 1.0]
    seconds = time.perf_counter() - t0
    after = _holdings()
    return dict(n=n, wrong=wrong, seconds=seconds, before=before, after=after)


# ---------------------------------------------------------------------------------------------------- faults


def _raise():
    if dist.get_rank() == 1:
        raise ValueError("rank one is broken")
    dist.barrier()


def _sigkill():
    if dist.get_rank() == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def _segfault():
    if dist.get_rank() == 1:
        import ctypes

        ctypes.string_at(0)
    dist.barrier()


def _abort():
    if dist.get_rank() == 0:
        os.abort()
    dist.barrier()


def _exit_code():
    if dist.get_rank() == 2:
        os._exit(3)
    dist.barrier()


def _system_exit():
    if dist.get_rank() == 1:
        sys.exit(2)
    dist.barrier()


def _keyboard_interrupt():
    if dist.get_rank() == 0:
        raise KeyboardInterrupt
    dist.barrier()


def _memory_error():
    if dist.get_rank() == 2:
        raise MemoryError("simulated out of memory")
    dist.barrier()


def _gloo_size_mismatch():  # raw torch.distributed: gloo aborts the rank that receives too much
    dist.all_reduce(torch.ones(3 if dist.get_rank() == 0 else 5))


def _pylib_dtype_mismatch():
    C.all_reduce_(torch.ones(3, dtype=torch.int32 if dist.get_rank() == 1 else torch.float32))


def _pylib_shape_mismatch():
    C.all_gather_tensor(torch.ones(4 if dist.get_rank() == 2 else 3))


def _unpicklable_result():
    return (lambda: 0) if dist.get_rank() == 1 else 0  # a lambda pickles with cloudpickle; a lock does not


def _unpicklable_lock():
    import threading

    return threading.Lock() if dist.get_rank() == 1 else 0


def _child_then_raise():
    child = subprocess.Popen(["sleep", "300"]).pid
    print(f"child {child}", flush=True)
    if dist.get_rank() == 1:
        raise RuntimeError("failed after starting a child process")
    dist.barrier()


def _sleep_while_peers_wait():
    if dist.get_rank() == 1:
        time.sleep(120)
    dist.all_reduce(torch.ones(2))


def _return_early():
    if dist.get_rank() == 2:
        return "left early"
    dist.barrier()


def _everyone_waits():  # a deadlock: every rank receives first
    dist.recv(torch.zeros(1), src=(dist.get_rank() + 1) % dist.get_world_size())


FAULTS = [
    # (name, fn, world, timeout, error type, rank, text the message must hold)
    ("raises ValueError", _raise, 4, 30, RankFailedError, 1, "ValueError: rank one is broken"),
    ("killed (SIGKILL)", _sigkill, 4, 30, RankFailedError, 2, "signal 9"),
    ("segfault", _segfault, 3, 30, RankFailedError, 1, "Fatal Python error: Segmentation fault"),
    ("os.abort()", _abort, 3, 30, RankFailedError, 0, "Fatal Python error: Aborted"),
    ("os._exit(3)", _exit_code, 4, 30, RankFailedError, 2, "exit code 3"),
    ("sys.exit(2)", _system_exit, 3, 30, RankFailedError, 1, "SystemExit"),
    ("KeyboardInterrupt in a rank", _keyboard_interrupt, 3, 30, RankFailedError, 0, "KeyboardInterrupt"),
    ("MemoryError", _memory_error, 3, 30, RankFailedError, 2, "MemoryError: simulated out of memory"),
    ("raw gloo size mismatch", _gloo_size_mismatch, 2, 30, RankFailedError, 0, "doesn't match expected size"),
    ("dtype mismatch (pylib)", _pylib_dtype_mismatch, 3, 30, RankFailedError, None, "disagree on the dtype"),
    ("shape mismatch (pylib)", _pylib_shape_mismatch, 3, 30, RankFailedError, None, "disagree on the shape"),
    ("unpicklable result", _unpicklable_lock, 2, 30, RankFailedError, 1, "cannot be pickled"),
    ("child process, then raise", _child_then_raise, 2, 30, RankFailedError, 1, "failed after starting a child"),
    ("sleeps while peers wait", _sleep_while_peers_wait, 4, 4.0, LaunchTimeout, 1, "rank 1 was NOT inside"),
    ("returns early, peers wait", _return_early, 3, 4.0, LaunchTimeout, None, "ranks [2] had returned"),
    ("deadlock: all receive", _everyone_waits, 3, 4.0, LaunchTimeout, None, "never returned"),
    ("control: a lambda result (allowed)", _unpicklable_result, 2, 30, None, None, ""),
]


def faults() -> list[dict]:
    rows = []
    for name, fn, world, timeout, error, rank, text in FAULTS:
        t0 = time.perf_counter()
        got, message, named, children = None, "", None, []
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                launch(fn, world, timeout=timeout, backend="gloo")
        except (RankFailedError, LaunchTimeout) as exc:
            got, message = type(exc), str(exc)
            named = exc.rank if isinstance(exc, RankFailedError) else (exc.culprits[0] if exc.culprits else None)
            outputs = exc.outputs
            children = [int(w.split()[1]) for o in outputs for w in o.splitlines() if w.startswith("child ")]
        latency = time.perf_counter() - t0
        if error is LaunchTimeout:
            latency -= timeout  # how long after the deadline the hang was reported
        time.sleep(0.05)
        ok = got is error and (rank is None or named == rank) and text in message
        rows.append(
            dict(
                name=name,
                ok=ok,
                rank=named,
                latency=latency,
                hang=error is LaunchTimeout,
                control=error is None,
                left=len(_children()) + len(_descendants_alive(children)),
            )
        )
    return rows


# ----------------------------------------------------------------------------------------------- bad inputs


def _refuses(call, text: str) -> tuple[str, float]:
    """("refused" | "unclear" | "accepted", seconds): refused means an exception whose message holds `text`."""
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            call()
    except Exception as exc:  # noqa: BLE001 - any refusal counts, if it names the constraint
        return ("refused" if text in str(exc) else f"unclear: {type(exc).__name__}: {exc}"), time.perf_counter() - t0
    return "accepted", time.perf_counter() - t0


def _noop():
    return None


def launch_inputs() -> list[tuple[str, object, str]]:
    cases = []
    for ws in (0, -1, 1.5, "2", None, True, 2.0):
        cases.append(
            (
                f"launch(world_size={ws!r})",
                lambda ws=ws: launch(_noop, ws, backend="gloo"),
                "world_size must be a positive",
            )
        )
    for t in (0, -5, float("nan"), -math.inf):
        cases.append(
            (f"launch(timeout={t!r})", lambda t=t: launch(_noop, 2, timeout=t, backend="gloo"), "timeout must be > 0")
        )
    for t in ("10", True, [1], b"1"):
        cases.append(
            (
                f"launch(timeout={t!r})",
                lambda t=t: launch(_noop, 2, timeout=t, backend="gloo"),
                "timeout must be a number",
            )
        )
    for fn in ("not a function", 3, None, [print]):
        cases.append((f"launch(fn={fn!r})", lambda fn=fn: launch(fn, 2, backend="gloo"), "fn must be callable"))
    for b in ("mpi", "", "GLOO", None):
        cases.append((f"launch(backend={b!r})", lambda b=b: launch(_noop, 2, backend=b), "backend must be"))
    if not torch.cuda.is_available():
        cases.append(("launch(backend='nccl') without GPUs", lambda: launch(_noop, 2, backend="nccl"), "GPU per rank"))
    return cases


def config_inputs() -> list[tuple[str, object, str]]:
    from pylib.plan.config import ModelConfig, MoEConfig
    from pylib.runtime import ParallelConfig

    moe = [
        (dict(n_experts=4.5), "must be an integer"),
        (dict(n_experts="8"), "must be an integer"),
        (dict(n_experts=0), "must be >= 1"),
        (dict(top_k=0), "must be between 1 and n_experts"),
        (dict(top_k=9), "must be between 1 and n_experts"),
        (dict(top_k=1.0), "must be an integer"),
        (dict(capacity_factor=0), "must be > 0"),
        (dict(capacity_factor=-1.0), "must be > 0"),
        (dict(score="relu"), "must be 'softmax' or 'sigmoid'"),
        (dict(drop_policy="random"), "must be 'probs' or 'position'"),
        (dict(every=0), "must be >= 1"),
        (dict(every=True), "must be an integer"),
        (dict(bias_update_rate=-0.1), "must be >= 0"),
        (dict(d_ff=0), "must be a positive integer"),
        (dict(d_ff=2.5), "must be a positive integer"),
    ]
    model = [
        (dict(d_model=18), "does not divide d_model"),
        (dict(n_kv_heads=3), "does not divide n_heads"),
        (dict(mlp="relu"), "must be 'gelu' or 'swiglu'"),
        (dict(position="alibi"), "must be 'none' or 'rope'"),
        (dict(dtype="int8"), "is not a float dtype name"),
        (dict(n_layers=0), "must be >= 1"),
        (dict(vocab_size=0), "must be >= 1"),
        (dict(position="rope", d_model=12, n_heads=4), "rope needs an even d_head"),
    ]
    parallel = [(dict(tp=0), "must be a positive integer"), (dict(dp=-1), "must be a positive integer")]
    parallel += [(dict(tp=1.5), "must be a positive integer"), (dict(etp=0), "must be a positive integer")]
    cases = [(f"MoEConfig({kw})", lambda kw=kw: MoEConfig(**kw), text) for kw, text in moe]
    cases += [(f"ModelConfig({kw})", lambda kw=kw: ModelConfig(**kw), text) for kw, text in model]
    cases += [(f"ParallelConfig({kw})", lambda kw=kw: ParallelConfig(**kw), text) for kw, text in parallel]
    return cases


def _message(call) -> str:
    try:
        call()
    except Exception as exc:  # noqa: BLE001
        return str(exc)
    return "accepted"


def _collective_misuses():
    """Inside 2 ranks: each misuse raises the same error on both ranks, so they stay in step."""
    from pylib.cp import ring_attention, ulysses_attention

    r = dist.get_rank()
    f32 = torch.ones(4)
    cases = {
        "all_reduce_ dtype differs": lambda: C.all_reduce_(torch.ones(3, dtype=torch.int32 if r else torch.float32)),
        "all_reduce_ shape differs": lambda: C.all_reduce_(torch.ones(3 + r)),
        "all_reduce_ reduce op differs": lambda: C.all_reduce_(torch.ones(2), op="max" if r else "sum"),
        "all_reduce_ op='prod'": lambda: C.all_reduce_(torch.ones(2), op="prod"),
        "all_reduce_ op='avg' on int64": lambda: C.all_reduce_(torch.ones(2, dtype=torch.int64), op="avg"),
        "all_reduce_ non-contiguous": lambda: C.all_reduce_(torch.ones(4, 4).t()),
        "all_reduce_async op='avg' on int32": lambda: C.all_reduce_async(torch.ones(2, dtype=torch.int32), op="avg"),
        "different collectives": lambda: C.all_reduce_(f32) if r else C.all_gather_tensor(f32),
        "all_gather_tensor shape differs": lambda: C.all_gather_tensor(torch.ones(3 + r)),
        "all_gather_tensor dim differs": lambda: C.all_gather_tensor(torch.ones(2, 2), dim=r),
        "reduce_scatter indivisible": lambda: C.reduce_scatter_tensor(torch.ones(3)),
        "reduce_scatter dtype differs": lambda: C.reduce_scatter_tensor(
            torch.ones(4, dtype=torch.float64 if r else torch.float32)
        ),
        "all_to_all indivisible": lambda: C.all_to_all_tensor(torch.ones(3, 2), 0, 1),
        "all_to_all_rows splits disagree": lambda: C.all_to_all_rows(
            torch.ones(2, 1), [1, 3] if r == 0 else [1, 1], [1, 1]
        ),
        "all_to_all_rows wrong split count": lambda: C.all_to_all_rows(torch.ones(2, 1), [2], [2]),
        "all_to_all_rows split sum": lambda: C.all_to_all_rows(torch.ones(2, 1), [1, 1], [1, 2]),
        "all_gather_rows sizes disagree": lambda: C.all_gather_rows(torch.ones(1 + r, 2), [1, 1 + r]),
        "all_gather_rows wrong row count": lambda: C.all_gather_rows(torch.ones(3, 2), [1, 1]),
        "reduce_scatter_rows wrong total": lambda: C.reduce_scatter_rows(torch.ones(3, 2), [1, 1]),
        "ring_attention shape differs": lambda: ring_attention(
            *[torch.ones(1, 2, 4 + 2 * r, 8)] * 3, layout="contiguous"
        ),
        "ring_attention q float32, k/v float64": lambda: ring_attention(
            torch.ones(1, 2, 4, 8), *[torch.ones(1, 2, 4, 8, dtype=torch.float64)] * 2, layout="contiguous"
        ),
        "ring_attention zigzag odd s_local": lambda: ring_attention(*[torch.ones(1, 2, 3, 8)] * 3),
        "ring_attention 3-D q": lambda: ring_attention(*[torch.ones(2, 4, 8)] * 3),
        "ulysses heads not divisible by cp": lambda: ulysses_attention(
            *[torch.ones(1, 3, 4, 8)] * 3, layout="contiguous"
        ),
        "ulysses dtype mixed": lambda: ulysses_attention(
            torch.ones(1, 2, 4, 8), *[torch.ones(1, 2, 4, 8, dtype=torch.float64)] * 2, layout="contiguous"
        ),
    }
    out = {name: _message(call) for name, call in cases.items()}
    out["in step afterwards"] = float(C.all_reduce_(torch.ones(1))[0]) == 2.0
    return out


COLLECTIVE_TEXT = {
    "all_reduce_ dtype differs": "disagree on the dtype",
    "all_reduce_ shape differs": "disagree on the shape",
    "all_reduce_ reduce op differs": "disagree on reduce op",
    "all_reduce_ op='prod'": "must be one of",
    "all_reduce_ op='avg' on int64": "the average of integers is not an integer",
    "all_reduce_ non-contiguous": "needs a contiguous tensor",
    "all_reduce_async op='avg' on int32": "the average of integers is not an integer",
    "different collectives": "disagree on which collective to call",
    "all_gather_tensor shape differs": "disagree on the shape",
    "all_gather_tensor dim differs": "disagree on dim",
    "reduce_scatter indivisible": "is not divisible by the group size",
    "reduce_scatter dtype differs": "disagree on the dtype",
    "all_to_all indivisible": "is not divisible by the group size",
    "all_to_all_rows splits disagree": "expects 3 rows from rank 1",
    "all_to_all_rows wrong split count": "needs 2 split sizes",
    "all_to_all_rows split sum": "sum to 3, tensor has 2 rows",
    "all_gather_rows sizes disagree": "the row counts `sizes`",
    "all_gather_rows wrong row count": "this member holds 3 rows",
    "reduce_scatter_rows wrong total": "input has 3 rows but sizes",
    "ring_attention shape differs": "ring_attention over [0, 1]: the ranks disagree on the shape",
    "ring_attention q float32, k/v float64": "must share one dtype",
    "ring_attention zigzag odd s_local": "s_local=3 is odd",
    "ring_attention 3-D q": "must be [b, heads, s_local, d_head]",
    "ulysses heads not divisible by cp": "n_head",
    "ulysses dtype mixed": "must share one dtype",
}


def harness_inputs(tmp: Path) -> list[tuple[str, object, str]]:
    import nbformat

    from pylib.labs.cli import main

    def lab(path: Path) -> Path:
        nb = nbformat.v4.new_notebook()
        cell = nbformat.v4.new_code_cell(
            'world_size = 2\nbackend = "gloo"\ndevice = "cpu"\nsolution = True\nchecks_report = None'
        )
        cell.metadata["tags"] = ["parameters"]
        nb.cells = [cell, nbformat.v4.new_code_cell("summary()")]
        nbformat.write(nb, path)
        return path

    good = lab(tmp / "01_good.ipynb")
    not_nb, not_json = tmp / "02_not_nb.ipynb", tmp / "03_not_json.ipynb"
    not_nb.write_text('{"cells": 3}')
    not_json.write_text("not json at all")
    out = str(tmp / "out")

    def cli(*argv):
        def call():
            try:
                rc = main(list(argv))
            except SystemExit as exc:
                rc = exc.code
            if rc != 2:
                raise AssertionError(f"exit {rc}")
            raise ValueError(captured.getvalue())

        captured = io.StringIO()

        def run():
            with contextlib.redirect_stderr(captured):
                call()

        return run

    rows = [
        ("--timeout 0", cli("run", str(good), "--timeout", "0", "--out", out), "finite number of seconds > 0"),
        ("--timeout -1", cli("run", str(good), "--timeout", "-1", "--out", out), "finite number of seconds > 0"),
        ("--timeout abc", cli("run", str(good), "--timeout", "abc", "--out", out), "takes seconds"),
        ("--timeout inf", cli("run", str(good), "--timeout", "inf", "--out", out), "finite number of seconds"),
        ("--timeout nan", cli("run", str(good), "--timeout", "nan", "--out", out), "finite number of seconds"),
        ("-p world_size=two", cli("run", str(good), "-p", "world_size=two", "--out", out), "is an int"),
        ("-p world_size=2.5", cli("run", str(good), "-p", "world_size=2.5", "--out", out), "is an int"),
        ("-p world_size=0", cli("run", str(good), "-p", "world_size=0", "--out", out), "at least 1 rank"),
        ("-p world_size=True", cli("run", str(good), "-p", "world_size=True", "--out", out), "is an int"),
        ("-p backend=mpi", cli("run", str(good), "-p", "backend=mpi", "--out", out), "must be 'gloo' or 'nccl'"),
        (
            "-p backend=nccl -p device=cpu",
            cli("run", str(good), "-p", "backend=nccl", "--out", out),
            "runs its ranks on",
        ),
        ("-p device=cuda (gloo)", cli("run", str(good), "-p", "device=cuda", "--out", out), "runs its ranks on"),
        ("-p nosuch=1", cli("run", str(good), "-p", "nosuch=1", "--out", out), "no selected lab has parameter"),
        ("-p solution=False", cli("run", str(good), "-p", "solution=False", "--out", out), "--learner"),
        ("-p checks_report=x", cli("run", str(good), "-p", "checks_report=x", "--out", out), "harness's own"),
        ("-p =3", cli("run", str(good), "-p", "=3", "--out", out), "NAME=VALUE"),
        ("a JSON file that is not a notebook", cli("run", str(not_nb), "--out", out), f"{not_nb}: not a valid"),
        ("a notebook that is not JSON", cli("run", str(not_json), "--out", out), f"{not_json}: not a valid"),
        ("an unknown lab name", cli("run", "no_such_lab", "--out", out), "no lab matches 'no_such_lab'"),
        ("an unwritable --out", cli("run", str(good), "--out", "/proc/nowhere"), "--out /proc/nowhere: cannot"),
        ("--all with names", cli("run", "--all", str(good), "--out", out), "not both"),
        ("lint a non-JSON notebook", cli("lint", str(not_json)), f"{not_json}: not a valid"),
        ("new with a bad name", cli("new", str(tmp / "bad name.ipynb")), "a lab is named NN_name.ipynb"),
    ]
    return rows


def bad_inputs(tmp: Path) -> list[dict]:
    rows = []
    for name, call, text in launch_inputs() + config_inputs() + harness_inputs(tmp):
        verdict, seconds = _refuses(call, text)
        rows.append(dict(name=name, verdict=verdict, seconds=seconds))
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        inside = launch(_collective_misuses, 2, timeout=120, backend="gloo")[0]
    seconds = (time.perf_counter() - t0) / len(COLLECTIVE_TEXT)
    for name, text in COLLECTIVE_TEXT.items():
        got = inside[name]
        verdict = "accepted" if got == "accepted" else ("refused" if text in got else f"unclear: {got}")
        rows.append(dict(name=f"in ranks: {name}", verdict=verdict, seconds=seconds))
    if not inside["in step afterwards"]:
        rows.append(dict(name="in ranks: still in step", verdict="unclear: ranks out of step", seconds=0.0))
    return rows


# -------------------------------------------------------------------- bad inputs by class: configs, planner, messages
#
# Each case is (class, what was tried, the call, the words its refusal must hold). Outcomes: "named" (a TypeError or
# ValueError whose message holds every word: the field and, where it matters, the value or the folder), "silent" (no
# error, or an error after the input was half applied), "obscure" (an error that does not name it), "slow" (any
# answer after SLOW_S; a call still running at CUT_S is stopped and counted slow).

SLOW_S = 1.0
CUT_S = 5.0


class _Cut(Exception):
    pass


def _configs_cases() -> list[tuple]:
    from pylib.plan.config import ModelConfig, MoEConfig
    from pylib.plan.options import MixedPrecision, RunOptions
    from pylib.plan.recompute import Recompute
    from pylib.runtime import ParallelConfig

    owners = (ModelConfig, MoEConfig, RunOptions, Recompute, MixedPrecision, ParallelConfig)
    cases = []
    for owner in owners:
        for name, values in BAD_FIELDS[owner.__name__].items():
            for value in values:
                cases.append(
                    (
                        "configs",
                        f"{owner.__name__}({name}={value!r})",
                        lambda o=owner, k=name, v=value: o(**{k: v}),
                        (named_as(owner.__name__, name),),
                    )
                )
    cases.append(
        (
            "configs",
            "RunOptions(recompute=('full', 'uniform', 0))",
            lambda: RunOptions(recompute=("full", "uniform", 0)),
            ("recompute_num_layers",),
        )
    )
    cases += _wrap_cases()
    return cases


def _wrap_cases() -> list[tuple]:
    """The DP wrapper refuses before it touches the module: a refusal that left the module cast counts as silent."""
    from pylib.dp import wrap
    from pylib.model import build_model
    from pylib.plan.config import ModelConfig
    from pylib.plan.options import MixedPrecision

    def call(stage, **kw):
        def run():
            model = build_model(ModelConfig())
            try:
                wrap(model, stage, None, **kw)
            finally:
                if next(model.parameters()).dtype != torch.float32:
                    raise _HalfApplied(f"the refused wrap left the model in {next(model.parameters()).dtype}")

        return run

    bf16 = MixedPrecision("bfloat16")
    cases = [("configs", "wrap(model, 'zero4', precision=bf16)", call("zero4", precision=bf16), ("zero4",))]
    for factor in (NAN, INF, -1, 0, True, "2"):
        cases.append(
            (
                "configs",
                f"wrap(gradient_divide_factor={factor!r}, precision=bf16)",
                call("ddp", precision=bf16, gradient_divide_factor=factor),
                ("gradient_divide_factor",),
            )
        )
    cases.append(("configs", "wrap(precision='bf16')", call("ddp", precision="bf16"), ("precision",)))
    for size in (0, 1.5):
        cases.append(
            (
                "configs",
                f"wrap(bucket_bytes={size!r}, precision=bf16)",
                call("ddp", precision=bf16, bucket_bytes=size),
                ("bucket_bytes",),
            )
        )
    return cases


class _HalfApplied(Exception):
    pass


def _planner_cases() -> list[tuple]:
    from pylib.analysis import planner as P
    from pylib.analysis.efficiency import CostModel
    from pylib.plan.config import ModelConfig

    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=4, n_heads=4, d_ff=64)
    cases = []
    builds = {
        "Cluster": lambda **kw: P.Cluster(**{"world_size": 8, **kw}),
        "Workload": lambda **kw: P.Workload(**{"batch": 8, "seq": 16, **kw}),
        "CostModel": CostModel,
    }
    for owner, build in builds.items():
        for name, values in BAD_FIELDS[owner].items():
            for value in values:
                cases.append(
                    ("planner", f"{owner}({name}={value!r})", lambda b=build, k=name, v=value: b(**{k: v}), (name,))
                )
    for name, values in BAD_FIELDS["SearchSpace"].items():
        for value in values:
            # what a careless user does: build the space and search it
            cases.append(
                (
                    "planner",
                    f"enumerate_plans(space=SearchSpace({name}={value!r}))",
                    lambda k=name, v=value: P.enumerate_plans(cfg, 8, 8, 16, P.SearchSpace(**{k: v})),
                    (name.rstrip("s"),),
                )
            )
    for world, batch, seq, field in (
        (2**40, 8, 16, "world_size"),
        (8, 10**12, 16, "batch"),
        (8, 8, 2**40, "seq"),
        (0, 8, 16, "world_size"),
        (8, 8.0, 16, "batch"),
        (True, 8, 16, "world_size"),
        (8, 8, -16, "seq"),
    ):
        cases.append(
            (
                "planner",
                f"enumerate_plans(world_size={world!r}, batch={batch!r}, seq={seq!r})",
                lambda w=world, b=batch, s=seq: P.enumerate_plans(cfg, w, b, s),
                (field,),
            )
        )
    return cases


def _with_environment(name: str, value: str, call):
    def run():
        before = os.environ.get(name)
        os.environ[name] = value
        try:
            return call()
        finally:
            if before is None:
                del os.environ[name]
            else:
                os.environ[name] = before

    return run


def _import_under(value: str):
    def run():
        root = str(Path(__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), root) if p)
        env = {**os.environ, "PYLIB_LANG": value, "PYTHONPATH": path}
        done = subprocess.run(
            [sys.executable, "-c", "import pylib.plan.config"],
            env=env,
            capture_output=True,
            text=True,
            timeout=CUT_S,
            cwd="/",
        )
        if done.returncode:
            raise ValueError(done.stderr.strip().splitlines()[-1])

    return run


def _messages_cases(tmp: Path) -> list[tuple]:
    from pylib.i18n import set_language, tr
    from pylib.labs.files import find_labs, select_labs
    from pylib.labs.runner import resolve_overrides
    from pylib.plan import check
    from pylib.plan.config import ModelConfig
    from pylib.runtime import ParallelConfig

    def language(name):
        def run():
            try:
                set_language(name)
            finally:
                set_language(None)

        return run

    missing = tmp / "no-such-labs"
    labs = {lab.name[:2]: lab for lab in find_labs()}
    cases = [
        ("messages", "tr('{n} ranks') without n", lambda: tr("{n} ranks"), ("'n'", "{n} ranks")),
        ("messages", "tr('{n} ranks of {m}', n=2)", lambda: tr("{n} ranks of {m}", n=2), ("'m'", "{n} ranks of {m}")),
        ("messages", "tr('{0} ranks', n=2)", lambda: tr("{0} ranks", n=2), ("0", "{0} ranks")),
        ("messages", "set_language('klingon')", language("klingon"), ("klingon",)),
        ("messages", "set_language('')", language(""), ("''",)),
        ("messages", "import pylib under PYLIB_LANG=klingon", _import_under("klingon"), ("PYLIB_LANG", "klingon")),
        (
            "messages",
            "a refused plan under PYLIB_LANG=klingon (set after import)",
            _with_environment(
                "PYLIB_LANG", "klingon", lambda: check(ModelConfig(), ParallelConfig(dp=2), 2, batch=3, seq=16)
            ),
            ("PYLIB_LANG", "does not divide"),
        ),
        (
            "messages",
            "tr under PYLIB_LANG=xx (set after import)",
            _with_environment("PYLIB_LANG", "xx", lambda: tr("{n} ranks", n=2)),
            ("PYLIB_LANG", "2 ranks"),
        ),
        ("messages", "find_labs(a folder that does not exist)", lambda: find_labs(missing), (str(missing),)),
        (
            "messages",
            "select_labs(['00'], a folder that does not exist)",
            lambda: select_labs(["00"], missing),
            (str(missing),),
        ),
        ("messages", "find_labs(a file, not a folder)", lambda: find_labs(Path(__file__)), (str(Path(__file__)),)),
    ]
    overrides = [
        ("00", {"h": -4}, "h"),
        ("00", {"b": 0}, "b"),
        ("00", {"world_size": 0}, "world_size"),
        ("00", {"s": -1}, "s"),
        ("02", {"n_heads": 0}, "n_heads"),
        ("04", {"top_k": -2}, "top_k"),
        ("05", {"m": 0}, "m"),
        ("06", {"lr": INF}, "lr"),
        ("06", {"lr": -0.01}, "lr"),
        ("06", {"steps": 0}, "steps"),
        ("07", {"seq": -16}, "seq"),
        ("92", {"microbatch_counts": []}, "microbatch_counts"),
        ("92", {"microbatch_counts": [0, 2]}, "microbatch_counts"),
        ("00", {"lang": "klingon"}, "klingon"),
    ]
    for number, values, field in overrides:
        if number in labs:
            cases.append(
                (
                    "messages",
                    f"lab {labs[number].name} -p {values}",
                    lambda lab=labs[number], v=values: resolve_overrides([lab], v),
                    (field,),
                )
            )
    return cases


def _judge(call, words) -> tuple[str, float, str]:
    """(outcome, seconds, message) of one bad input (see the section's comment)."""

    def cut(signum, frame):
        raise _Cut()

    old = signal.signal(signal.SIGALRM, cut)
    signal.setitimer(signal.ITIMER_REAL, CUT_S)
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            call()
        outcome, text = "silent", "accepted"
    except _Cut:
        outcome, text = "slow", f"still running after {CUT_S:g} s"
    except _HalfApplied as exc:
        outcome, text = "silent", str(exc)
    except (TypeError, ValueError) as exc:
        text = f"{type(exc).__name__}: {exc}"
        outcome = "named" if all(w in str(exc) for w in words) else "obscure"
    except Exception as exc:  # noqa: BLE001 - any other error is obscure to the user who made the mistake
        outcome, text = "obscure", f"{type(exc).__name__}: {exc}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    seconds = time.perf_counter() - t0
    if seconds > SLOW_S and outcome != "slow":
        outcome = "slow"
    return outcome, seconds, text


INPUT_OUTCOMES = ("named", "silent", "obscure", "slow")


def classed_bad_inputs(tmp: Path) -> list[dict]:
    rows = []
    for cls, what, call, words in _configs_cases() + _planner_cases() + _messages_cases(tmp):
        outcome, seconds, text = _judge(call, words)
        rows.append(dict(cls=cls, name=what, outcome=outcome, seconds=seconds, text=text))
    return rows


def large_sizes() -> list[dict]:
    """Valid but large sizes the planner must still answer quickly: a prime world size, batch or sequence; 2**20 ranks
    (its largest world size) with one sequence."""
    from pylib.analysis import planner as P
    from pylib.plan.config import ModelConfig

    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=4, n_heads=4, d_ff=64)
    rows = []
    for world, batch, seq in ((1_000_003, 1_000_003, 16), (8, 999_983, 16), (2**20, 1, 16), (7, 7, 999_983)):
        outcome, seconds, text = _judge(lambda w=world, b=batch, s=seq: P.enumerate_plans(cfg, w, b, s), ())
        plans = "refused" if outcome != "silent" else "answered"
        rows.append(
            dict(
                name=f"enumerate_plans(world_size={world}, batch={batch}, seq={seq})",
                seconds=seconds,
                outcome="slow" if outcome == "slow" else plans,
                text=text,
            )
        )
    return rows


def print_classed(rows: list[dict], sizes: list[dict]) -> bool:
    """The counts per class and outcome, the cases not named, and the large sizes; True when all are named."""
    print("\n### Bad inputs by class\n")
    print("| class | cases | " + " | ".join(INPUT_OUTCOMES) + " | slowest |")
    print("|---|---|" + "---|" * len(INPUT_OUTCOMES) + "---|")
    for cls in dict.fromkeys(r["cls"] for r in rows):
        mine = [r for r in rows if r["cls"] == cls]
        counts = " | ".join(str(sum(r["outcome"] == o for r in mine)) for o in INPUT_OUTCOMES)
        print(f"| {cls} | {len(mine)} | {counts} | {max(r['seconds'] for r in mine):.2f} s |")
    counts = " | ".join(str(sum(r["outcome"] == o for r in rows)) for o in INPUT_OUTCOMES)
    print(f"| all | {len(rows)} | {counts} | {max(r['seconds'] for r in rows):.2f} s |")
    print("\n| valid but large | answer | seconds |")
    print("|---|---|---|")
    for r in sizes:
        print(f"| {r['name']} | {r['outcome']} | {r['seconds']:.2f} |")
    bad = [r for r in rows if r["outcome"] != "named"]
    if bad:
        print("\n### Bad inputs not named\n")
        for r in bad:
            print(f"- {r['cls']}: {r['outcome']}: {r['name']}: {r['text'][:200]}")
    return not bad and all(r["outcome"] == "answered" for r in sizes)


# ------------------------------------------------------------ data, collectives, processes (issue 35): outcomes

DATA_OUTCOMES = ("named refusal", "silently wrong", "obscure", "hang", "orphan")
CASE_TIMEOUT = 20.0  # one launch per in-rank case; a case still running then counts as a hang


def _outcome_of(call, text: str) -> tuple[str, str]:
    """(outcome, detail) of a bad input: an exception naming `text` is a named refusal, another exception obscure,
    no exception silently wrong."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            call()
    except Exception as exc:  # noqa: BLE001 - every refusal is judged by its message
        msg = f"{type(exc).__name__}: {exc}"
        return ("named refusal" if text in msg else "obscure"), msg.splitlines()[0][:160]
    return "silently wrong", "accepted"


def _ranked_outcome(fn, args, text: str, world: int = 2) -> tuple[str, str]:
    """fn(*args) on `world` gloo ranks, as a user runs it: a rank that raises ends the launch, which names it."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            launch(fn, world, *args, timeout=CASE_TIMEOUT, backend="gloo")
    except LaunchTimeout:
        return "hang", f"still running after {CASE_TIMEOUT:g} s"
    except RankFailedError as exc:
        return ("named refusal" if text in str(exc) else "obscure"), _last_error_line(str(exc))
    return "silently wrong", "accepted on every rank"


def _last_error_line(text: str) -> str:
    lines = [x for x in text.splitlines() if "Error" in x or "error" in x]
    return (lines[-1] if lines else text.splitlines()[0]).strip()[:160]


def _cfg():
    from pylib.model import ModelConfig

    return ModelConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, d_ff=32, dtype="float64")


def _tokens(bad_ids=None, bad_targets=None, seed=0):
    from pylib.model import random_tokens

    ids, targets = random_tokens(_cfg(), 2, 8, seed=seed)
    if bad_ids is not None:
        ids = bad_ids(ids.clone())
    if bad_targets is not None:
        targets = bad_targets(targets.clone())
    return ids, targets


def _put(value):
    def change(t):
        if isinstance(value, str):  # a dtype name
            return t.to(getattr(torch, value))
        t[1, 3] = value
        return t

    return change


def _rank_differs(t):
    if dist.get_rank() == 1:
        t[0, 0] = (int(t[0, 0]) + 1) % _cfg().vocab_size
    return t


def _tp_forward(bad_ids, bad_targets):
    from pylib.model import build_model
    from pylib.tp import TPTransformer

    ids, targets = _tokens(bad_ids, bad_targets)
    TPTransformer.from_full(build_model(_cfg())).loss(ids, targets).backward()


def _cp_forward(bad_ids, bad_targets):
    from pylib.cp import CPTransformer
    from pylib.cp.layout import shard_sequence
    from pylib.model import build_model

    ids, targets = _tokens(bad_ids, bad_targets)
    model = CPTransformer.from_full(build_model(_cfg()), layout="contiguous")
    mine = [shard_sequence(t, 1, dist.get_rank(), 2, "contiguous") for t in (ids, targets)]
    model.loss(*mine).backward()


def _compose_step(bad_ids, bad_targets, pc=None):
    from pylib.compose import ParallelTransformer
    from pylib.model import build_model
    from pylib.plan import RunOptions
    from pylib.runtime import Mesh, ParallelConfig

    mesh = Mesh(pc or ParallelConfig(tp=2))
    model = ParallelTransformer.from_full(build_model(_cfg()), mesh, RunOptions(n_microbatches=1))
    model.step(*_tokens(bad_ids, bad_targets), measure_memory=False)


def _single(kind: str, bad_ids, bad_targets):
    from pylib.model import build_model
    from pylib.pp.split import PipelineChunk

    ids, targets = _tokens(bad_ids, bad_targets)
    model = build_model(_cfg())
    if kind == "reference":
        return float(model.loss(ids, targets))
    if kind == "pp first stage":
        return PipelineChunk.from_full(model, 0, 2)(ids)
    x = torch.zeros(2, 8, 16, dtype=torch.float64)
    return float(PipelineChunk.from_full(model, 1, 2)(x, targets))


class _TwoStage(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2, dtype=torch.float64)

    def forward(self, x, targets=None):
        y = self.lin(x)
        return y.pow(2).mean() if targets is not None else y


def _pipeline(m0, m1, shape0, shape1, dtype1=torch.float64):
    from pylib.plan.schedules import build
    from pylib.pp.executor import Boundary, run_pipeline

    r = dist.get_rank()
    m, shape = (m0, shape0) if r == 0 else (m1, shape1)
    boundary = Boundary(shape, torch.float64 if r == 0 else dtype1)
    inputs = [torch.ones(*shape0, dtype=torch.float64)] * m
    run_pipeline(build("1f1b", 2, m), [_TwoStage()], boundary, inputs=inputs, targets=[torch.zeros(1)] * m)


def _collective(name: str, shape0, shape1, **kw):
    r = dist.get_rank()
    t = torch.ones(shape1 if r else shape0)
    kw = {k: (v[r] if isinstance(v, tuple) else v) for k, v in kw.items()}
    getattr(C, name)(t, **kw)


def _escape(then_raise: bool, how: str):
    if how == "setsid child":
        pid = subprocess.Popen(["sleep", "300"], start_new_session=True).pid
    else:  # a daemon: its parent shell exits at once, it runs on in a session of its own
        out = subprocess.run(["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
        pid = int(out.stdout)
    print(f"child {pid}", flush=True)
    if then_raise and dist.get_rank() == 1:
        raise RuntimeError("failed after starting a child")
    dist.barrier()
    return pid


def _alive(pid: int) -> bool:
    return bool(_descendants_alive([pid]))


def _process_case(then_raise: bool, how: str) -> tuple[str, str]:
    pids: list[int] = []
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            pids = launch(_escape, 2, then_raise, how, timeout=30, backend="gloo")
    except RankFailedError as exc:
        pids = [int(w.split()[1]) for o in exc.outputs for w in o.splitlines() if w.startswith("child ")]
    time.sleep(0.05)
    left = [p for p in pids if _alive(p)]
    for pid in left:  # ours: end them so that the next case starts clean
        os.kill(pid, signal.SIGKILL)
    return ("orphan", f"{len(left)} of {len(pids)} left running") if left else ("named refusal", "none left")


def _sigint_case(delay: float, tmp: Path) -> tuple[str, str]:
    """`python -m pylib.labs run` of a lab that sleeps, interrupted after `delay` s: handled = exit 130 and a
    report marked interrupted; a traceback or no report is obscure."""
    import json

    import nbformat

    lab = tmp / "01_sleeps.ipynb"
    if not lab.exists():
        nb = nbformat.v4.new_notebook()
        params = nbformat.v4.new_code_cell(
            'world_size = 2\nbackend = "gloo"\ndevice = "cpu"\nsolution = True\nchecks_report = None'
        )
        params.metadata["tags"] = ["parameters"]
        nb.cells = [params, nbformat.v4.new_code_cell("import time\ntime.sleep(600)")]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, lab)
    out = tmp / f"sigint-{delay}"
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pylib.labs", "run", str(lab), "--out", str(out)],
        cwd=root,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return "hang", "still running 60 s after SIGINT"
    report = out / "report.json"
    ok = report.exists() and json.loads(report.read_text()).get("interrupted") == "SIGINT"
    if proc.returncode == 130 and ok and "Traceback" not in err:
        return "named refusal", "exit 130, report written"
    # stopped before the first line of pylib ran: in the interpreter's start-up (importing `site`), or before Python
    # installed its SIGINT handler (the default action: no output at all). An uncaught KeyboardInterrupt also ends
    # with -SIGINT, after printing its traceback.
    if "init_import_site" in err or (proc.returncode == -signal.SIGINT and not err.strip()):
        return "obscure", "stopped in the interpreter's own start-up, before the first line of pylib ran"
    return "obscure", f"exit {proc.returncode}, report {'written' if ok else 'missing'}, traceback {'Traceback' in err}"


def _mixed(kw):
    from pylib.plan.options import MixedPrecision

    return MixedPrecision("float16", grad_reduce="float32", **kw)


def _skips_forever():
    from pylib.dp import LossScaler

    scaler = LossScaler(_mixed(dict(loss_scaling="dynamic", loss_scale=2.0**10)))
    for _ in range(200):  # every step overflows (a nan in the model): 200 skipped steps, the scale halved to 0
        scaler.update(True)


def _zero_gradients():
    import warnings

    from pylib.dp import MasterWeights

    weights = MasterWeights([torch.ones(3, dtype=torch.float16)], _mixed(dict(loss_scaling="dynamic")), torch.optim.SGD)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        weights.step([torch.zeros(3)])


def bad_data_cases(tmp: Path) -> list[dict]:
    """Bad data, collectives and process edges, each judged: named refusal, silently wrong, obscure, hang, orphan."""
    V = _cfg().vocab_size
    rows = []

    def add(cls, name, outcome):
        rows.append(dict(cls=cls, name=name, outcome=outcome[0], detail=outcome[1]))

    bad_values = [(V, f"hold {V}"), (V + 1000, f"hold {V + 1000}"), (-1, "hold -1"), ("float32", "integer tensor")]
    for kind in ("reference", "pp first stage", "pp last stage"):
        for value, text in bad_values + [("bool", "integer tensor")]:
            which = "targets" if kind == "pp last stage" or (kind == "reference" and value == -1) else "ids"
            bi, bt = (None, _put(value)) if which == "targets" else (_put(value), None)
            add("data", f"{kind}: {which} {value}", _outcome_of(lambda k=kind, a=bi, b=bt: _single(k, a, b), text))
    for mode, fn in (("tp", _tp_forward), ("cp", _cp_forward), ("compose tp2", _compose_step)):
        for value, text in bad_values:
            add("data", f"{mode}: ids {value}", _ranked_outcome(fn, (_put(value), None), text))
        for value, text in bad_values[:3]:
            add("data", f"{mode}: targets {value}", _ranked_outcome(fn, (None, _put(value)), text))
    agree = "were given different batches"
    add("data", "tp: rank 1 given other ids", _ranked_outcome(_tp_forward, (_rank_differs, None), agree))
    add("data", "tp: rank 1 given other targets", _ranked_outcome(_tp_forward, (None, _rank_differs), agree))
    add("data", "compose tp2: rank 1 other ids", _ranked_outcome(_compose_step, (_rank_differs, None), agree))
    add("data", "compose tp2: rank 1 other targets", _ranked_outcome(_compose_step, (None, _rank_differs), agree))
    from pylib.runtime import ParallelConfig

    dp2 = ParallelConfig(dp=2)
    add("data", "compose dp2: rank 1 other ids", _ranked_outcome(_compose_step, (_rank_differs, None, dp2), agree))

    nine = (1,) * 8
    shape = "disagree on the shape"
    for name, args, text in [
        ("all_reduce_ 10 dims, same numel, dim 9 differs", ("all_reduce_", (*nine, 1, 2), (*nine, 2, 1)), shape),
        ("all_reduce_ 10 vs 9 dims", ("all_reduce_", (*nine, 2), (*nine, 2, 3)), shape),
        ("all_gather_tensor 9 dims, dim 8 differs", ("all_gather_tensor", (*nine, 2), (*nine, 3)), shape),
        (
            "reduce_scatter_tensor 12 dims differ",
            ("reduce_scatter_tensor", (2, *nine, 1, 1, 2), (2, *nine, 1, 2, 1)),
            shape,
        ),
    ]:
        add("collectives", name, _ranked_outcome(_collective, args, text))
    out_of_range = "out of range"
    for name, args, kw in [
        ("all_gather_tensor dim=5 on rank 1", ("all_gather_tensor", (2, 2), (2, 2)), dict(dim=(0, 5))),
        ("all_gather_tensor dim=2 on both", ("all_gather_tensor", (2, 2), (2, 2)), dict(dim=2)),
        ("all_gather_tensor dim=-3 on both", ("all_gather_tensor", (2, 2), (2, 2)), dict(dim=-3)),
        ("reduce_scatter_tensor dim=3", ("reduce_scatter_tensor", (2, 2), (2, 2)), dict(dim=3)),
        ("reduce_scatter_tensor dim=2 on rank 0", ("reduce_scatter_tensor", (2, 2), (2, 2)), dict(dim=(2, 0))),
        ("reduce_scatter_async dim=4", ("reduce_scatter_async", (2, 2), (2, 2)), dict(dim=4)),
        (
            "all_to_all_tensor gather_dim=4 on rank 1",
            ("all_to_all_tensor", (2, 2), (2, 2)),
            dict(scatter_dim=0, gather_dim=(1, 4)),
        ),
        ("all_to_all_tensor scatter_dim=-5", ("all_to_all_tensor", (2, 2), (2, 2)), dict(scatter_dim=-5, gather_dim=1)),
        ("all_gather_tensor of a 0-dim tensor", ("all_gather_tensor", (), ()), dict(dim=0)),
    ]:
        add("collectives", name, _ranked_outcome(lambda n, a, b, k=kw: _collective(n, a, b, **k), args, out_of_range))
    boundary = "disagree on the shape of microbatch 0's activation"
    for name, args, text in [
        ("pipeline: stage 1 built for (1, 3), stage 0 sends (1, 2)", (2, 2, (1, 2), (1, 3)), boundary),
        ("pipeline: stage 1 built for (2, 2), same numel differs", (2, 2, (1, 4), (2, 2)), boundary),
        ("pipeline: stage 1 built for (1, 2, 1)", (2, 2, (1, 2), (1, 2, 1)), boundary),
        ("pipeline: m=2 on rank 0, m=4 on rank 1", (2, 4, (1, 2), (1, 2)), "number of microbatches m"),
        ("pipeline: m=4 on rank 0, m=2 on rank 1", (4, 2, (1, 2), (1, 2)), "number of microbatches m"),
        ("pipeline: boundary float32 on rank 1", (2, 2, (1, 2), (1, 2), torch.float32), "the boundary dtype"),
    ]:
        add("collectives", name, _ranked_outcome(_pipeline, args, text))

    for kw, text in [
        (dict(loss_scaling="dynamic", loss_scale=math.inf), "must be finite"),
        (dict(loss_scaling="static", loss_scale=math.inf), "must be finite"),
        (dict(loss_scaling="dynamic", loss_scale=math.nan), "must be finite"),
        (dict(loss_scaling="dynamic", loss_scale=1e-30), "must be between 1 and 2**64"),
        (dict(loss_scaling="static", loss_scale=0.5), "must be between 1 and 2**64"),
        (dict(loss_scaling="static", loss_scale=2.0**80), "must be between 1 and 2**64"),
    ]:
        add("training", f"MixedPrecision(float16, {kw})", _outcome_of(lambda kw=kw: _mixed(kw), text))
    add("training", "200 consecutive skipped fp16 steps", _outcome_of(_skips_forever, "consecutive steps skipped"))
    add("training", "all-zero gradients after unscaling", _outcome_of(_zero_gradients, "every gradient is zero"))

    for then_raise in (False, True):
        for how in ("setsid child", "double-forked daemon"):
            add(
                "processes",
                f"rank starts a {how}, then {'raises' if then_raise else 'returns'}",
                _process_case(then_raise, how),
            )
    for delay in (0.1, 0.2, 0.4, 0.7, 1.0, 1.5, 2.5):
        add("processes", f"SIGINT {delay:g} s into `python -m pylib.labs run`", _sigint_case(delay, tmp))
    return rows


# ------------------------------------------------------------------------- what the new checks cost per step


def _timed_steps(pc_kw: dict, reps: int, per_step_checks: bool):
    from pylib.compose import ParallelTransformer
    from pylib.model import build_model, random_tokens
    from pylib.plan import RunOptions
    from pylib.plan.presets import tiny
    from pylib.runtime import Mesh, ParallelConfig, agreement

    if not per_step_checks and hasattr(agreement, "checks_each_step"):
        agreement.checks_each_step = lambda: False  # only the once-per-step checks off (this forked rank only)
    cfg = tiny().with_(dtype="float32")
    mesh = Mesh(ParallelConfig(**pc_kw))
    options = RunOptions(n_microbatches=2, schedule="1f1b") if pc_kw.get("pp", 1) > 1 else RunOptions()
    model = ParallelTransformer.from_full(build_model(cfg), mesh, options)
    ids, targets = random_tokens(cfg, 8, 16, seed=0)
    for _ in range(3):
        model.step(ids, targets, measure_memory=False)
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        model.step(ids, targets, measure_memory=False)
        times.append(time.perf_counter() - t0)
    return times


def step_cost(reps: int = 20, rounds: int = 3) -> list[dict]:
    """A composed training step (tiny model, float32, gloo) with the once-per-step checks (batch agreement,
    pipeline agreement) on and off, interleaved on/off `rounds` times; the slowest rank's median per round, the
    best round reported. The token check (a min/max of the ids) runs in both."""
    rows = []
    for name, kw in (("tp2 pp2 (4 ranks, 1F1B m=2)", dict(tp=2, pp=2)), ("tp2 dp2 (4 ranks)", dict(tp=2, dp=2))):
        got = {True: [], False: []}
        for _ in range(rounds):
            for on in (False, True):
                per_rank = launch(_timed_steps, 4, kw, reps, on, timeout=600, backend="gloo")
                got[on].append(max(statistics.median(t) for t in per_rank))
        rows.append(dict(config=name, off_ms=min(got[False]) * 1e3, on_ms=min(got[True]) * 1e3))
    return rows


def _checks_alone(reps: int):
    """Microseconds per call of each new check, as one step of the tp2 pp2 run makes it (4 ranks)."""
    from pylib.model import check_tokens, random_tokens
    from pylib.plan.presets import tiny
    from pylib.plan.schedules import build
    from pylib.runtime import Mesh, ParallelConfig
    from pylib.runtime.agreement import agree_on_batch, agree_pipeline

    cfg = tiny()
    mesh = Mesh(ParallelConfig(tp=2, pp=2))
    ids, targets = random_tokens(cfg, 8, 16, seed=0)
    sched = build("1f1b", 2, 2)
    calls = {
        "agree_on_batch (world, ids + targets [8, 16])": lambda: agree_on_batch(
            "step", mesh.world, {"i": ids, "t": targets}
        ),
        "agree_pipeline (pp=2, m=2)": lambda: agree_pipeline(mesh.pp, sched, torch.float32, lambda mb, k: (4, 16, 64)),
        "check_tokens ([4, 16] ids)": lambda: check_tokens(ids[:4], cfg.vocab_size),
    }
    out = {}
    for name, call in calls.items():
        for _ in range(10):
            call()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            call()
        out[name] = (time.perf_counter() - t0) / reps * 1e6
    return out


def checks_alone(reps: int = 300) -> dict:
    per_rank = launch(_checks_alone, 4, reps, timeout=300, backend="gloo")
    return {name: max(r[name] for r in per_rank) for name in per_rank[0]}


def print_bad_data(rows: list[dict], cost: list[dict], alone: dict | None = None) -> None:
    print("\n### Bad data, collectives, training guards, processes (issue 35)\n")
    classes = sorted({r["cls"] for r in rows}, key=["data", "collectives", "training", "processes"].index)
    print("| class | cases | " + " | ".join(DATA_OUTCOMES) + " |")
    print("|---|---|" + "---|" * len(DATA_OUTCOMES))
    for cls in classes + ["all"]:
        mine = [r for r in rows if cls in ("all", r["cls"])]
        counts = [sum(r["outcome"] == o for r in mine) for o in DATA_OUTCOMES]
        print(f"| {cls} | {len(mine)} | " + " | ".join(str(c) for c in counts) + " |")
    bad = [r for r in rows if r["outcome"] != "named refusal"]
    if bad:
        print("\nNot refused by name:\n")
        for r in bad:
            print(f"- [{r['outcome']}] {r['cls']}: {r['name']} -- {r['detail']}")
    if cost:
        print("\n| composed step (gloo) | per-step checks off | on | extra |")
        print("|---|---|---|---|")
        for c in cost:
            extra = c["on_ms"] - c["off_ms"]
            share = extra / c["off_ms"]
            print(f"| {c['config']} | {c['off_ms']:.2f} ms | {c['on_ms']:.2f} ms | {extra:+.2f} ms ({share:+.1%}) |")
    if alone:
        print("\n| one new check, alone (4 gloo ranks, the slowest rank's mean) | µs per call |")
        print("|---|---|")
        for name, us in alone.items():
            print(f"| {name} | {us:.0f} |")


# ---------------------------------------------------------------------------------------- agreement check cost


def _time_all_reduce(numel: int, on: bool, reps: int):
    agreement_check(on)
    t = torch.ones(numel)
    for _ in range(5):
        C.all_reduce_(t)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        C.all_reduce_(t)
    return (time.perf_counter() - t0) / reps


def agreement_cost() -> list[dict]:
    """Time of one all_reduce_ with the check off and on (the slowest rank's mean), interleaved off/on/off/on so
    that a change in the machine's load hits both alike."""
    rows = []
    for world, numel, reps in ((2, 16, 300), (4, 16, 200), (4, 1 << 20, 20)):
        times = {False: [], True: []}
        for on in (False, True, False, True):
            times[on].append(max(launch(_time_all_reduce, world, numel, on, reps, timeout=300, backend="gloo")))
        rows.append(dict(world=world, numel=numel, off_us=min(times[False]) * 1e6, on_us=min(times[True]) * 1e6))
    return rows


# ---------------------------------------------------------------------------------------------------- report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launches", type=int, default=1000, help="back-to-back launches (1000)")
    p.add_argument("--bad-inputs-only", action="store_true", help="only the bad inputs by class (seconds)")
    p.add_argument(
        "--data-only", action="store_true", help="only the bad data, collectives, training guards and processes"
    )
    p.add_argument("--no-step-cost", action="store_true", help="(with --data-only) skip the composed-step timing")
    args = p.parse_args(argv)
    if args.launches < 1:
        p.error("--launches must be >= 1")
    if args.bad_inputs_only:
        import pylib

        print(f"## Bad inputs by class, against {Path(pylib.__file__).resolve().parent}")
        with tempfile.TemporaryDirectory(prefix="pylib-bench-") as tmp:
            ok = print_classed(classed_bad_inputs(Path(tmp)), large_sizes())
        return 0 if ok else 1
    if args.data_only:
        with tempfile.TemporaryDirectory(prefix="pylib-bench-") as tmp:
            rows = bad_data_cases(Path(tmp))
        print_bad_data(rows, [] if args.no_step_cost else step_cost(), None if args.no_step_cost else checks_alone())
        return 1 if any(r["outcome"] != "named refusal" for r in rows) else 0
    start_holdings = _holdings()

    held = launches_held(args.launches)
    fault_rows = faults()
    with tempfile.TemporaryDirectory(prefix="pylib-bench-") as tmp:
        input_rows = bad_inputs(Path(tmp))
        classed, sizes = classed_bad_inputs(Path(tmp)), large_sizes()
    cost = agreement_cost()
    end_holdings = _holdings()

    b, a = held["before"], held["after"]
    print(
        f"## Reliability of the rank runtime and the lab harness (torch {torch.__version__}, {os.cpu_count()} CPUs)\n"
    )
    print("| figure | measured |")
    print("|---|---|")
    print(
        f"| launches held | {held['n'] - held['wrong']} of {held['n']} back-to-back launches (2 gloo ranks) right, "
        f"{held['seconds'] / held['n'] * 1e3:.0f} ms each |"
    )
    print(
        f"| leaks over those launches | {a['processes'] - b['processes']} processes, {a['fds'] - b['fds']} file "
        f"descriptors, {a['folders'] - b['folders']} folders, {a['rss_mib'] - b['rss_mib']:+.1f} MiB resident |"
    )
    real = [r for r in fault_rows if not r["hang"] and not r["control"]]
    hangs = [r for r in fault_rows if r["hang"]]
    print(
        f"| faults survived | {sum(r['ok'] for r in real)} of {len(real)} reported naming the rank and its cause, "
        f"in {min(r['latency'] for r in real):.2f}-{max(r['latency'] for r in real):.2f} s "
        f"(all < 5 s: {all(r['latency'] < 5 for r in real)}) |"
    )
    print(
        f"| hangs ended | {sum(r['ok'] for r in hangs)} of {len(hangs)} reported at the deadline "
        f"(+{max(r['latency'] for r in hangs):.2f} s at most), the culprit named where one exists |"
    )
    print(f"| processes left after the faults | {sum(r['left'] for r in fault_rows)} |")
    refused = sum(r["verdict"] == "refused" for r in input_rows)
    accepted = [r["name"] for r in input_rows if r["verdict"] == "accepted"]
    unclear = [f"{r['name']}: {r['verdict']}" for r in input_rows if r["verdict"].startswith("unclear")]
    slow = [r["name"] for r in input_rows if r["seconds"] > HANG_S]
    print(
        f"| bad inputs refused | {refused} of {len(input_rows)} tried, each with a message naming the constraint "
        f"(slowest {max(r['seconds'] for r in input_rows):.2f} s) |"
    )
    print(f"| bad inputs accepted silently | {len(accepted)} |")
    print(f"| refusals that hung (> {HANG_S:g} s) | {len(slow)} |")
    for c in cost:
        extra = c["on_us"] - c["off_us"]
        print(
            f"| agreement check, all_reduce_ of {c['numel']} float32 on {c['world']} ranks | {c['off_us']:.0f} µs off, "
            f"{c['on_us']:.0f} µs on ({extra:+.0f} µs, {extra / c['off_us']:+.0%}) |"
        )
    print(
        f"| this process at the end vs the start | {end_holdings['processes'] - start_holdings['processes']} "
        f"processes, {end_holdings['fds'] - start_holdings['fds']} fds, "
        f"{end_holdings['folders'] - start_holdings['folders']} folders |"
    )
    print("\n### Faults\n")
    print("| fault | named rank | reported in | ok | processes left |")
    print("|---|---|---|---|---|")
    for r in fault_rows:
        when = f"+{r['latency']:.2f} s after the deadline" if r["hang"] else f"{r['latency']:.2f} s"
        print(f"| {r['name']} | {r['rank']} | {when} | {'yes' if r['ok'] else 'NO'} | {r['left']} |")
    if accepted or unclear:
        print("\n### Inputs not refused clearly\n")
        for line in accepted + unclear:
            print(f"- {line}")
    classed_ok = print_classed(classed, sizes)
    bad = (
        not classed_ok
        or held["wrong"]
        or any(a[k] != b[k] for k in ("processes", "fds", "folders"))
        or not all(r["ok"] and r["left"] == 0 for r in fault_rows)
        or any(r["latency"] >= 5 for r in real)
        or accepted
        or unclear
        or slow
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
