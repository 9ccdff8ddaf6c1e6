"""Checks for lab notebooks: each one prints a ✓ / ✗ / ⊘ line for the reader and appends a JSON line for the harness.

    from pylib.labs.checks import ExerciseNotDone, begin, check, step, summary

    begin(checks_report)                              # the parameters cell's checks_report (None in a hand run)
    out = step("the exercise runs on 4 ranks", lambda: launch(worker, 4))
    check("forward equals the reference", lambda: torch.testing.assert_close(out[0]["y"], y_ref))
    check("the tracer saw one all-reduce", len(events) == 1)
    check("NCCL agrees with gloo", compare_on_gpus, needs="gpu:4")

    @check("several lines of asserting")              # a check can also decorate a function; it runs at once
    def _():
        assert ...

    summary()                                          # last cell: raises ChecksFailed if any check failed

A check is *passed*, *failed*, or *blocked*. Blocked means it needs hardware this machine does not have (`needs="gpu"`
for one CUDA device, `needs="gpu:4"` for four); it is recorded and printed, never silently skipped, and it does not
fail the lab. `condition` is a value (truthy passes) or a callable run inside the check: returning None or a truthy
value passes, returning False or raising fails, and the failure message is the exception's own (for a rank that
raised inside `pylib.runtime.launch`, the rank and the last line of its traceback, e.g. "rank 1: ExerciseNotDone:
Exercise 2 not done yet: ..."; the whole traceback goes to the report).

`step(name, fn)` is a check whose value is used later: it passes when `fn()` returns and gives back the value. If it
fails or is blocked it gives back an `Unavailable` placeholder; any later check that touches the placeholder is
recorded as failed (or blocked) with "needs step ..., which failed". So a learner notebook whose exercise raises
still runs every check cell to the end and reports each check, instead of stopping at the first cell.

Re-running a check cell by hand replaces that check's earlier result (records are keyed by name), so a learner can
fix an exercise, re-run its checks and the summary, and see the summary pass.
"""

from __future__ import annotations

import json
import re
import sys
import time
import traceback
from pathlib import Path

from pylib.i18n import tr

PASSED, FAILED, BLOCKED = "passed", "failed", "blocked"
_MARK = {PASSED: "✓", FAILED: "✗", BLOCKED: "⊘"}
_MISSING = object()


class ExerciseNotDone(RuntimeError):
    """Raised by an exercise's placeholder body: `raise ExerciseNotDone(2, "write the backward: ...")`."""

    def __init__(self, number: int, what: str):
        super().__init__(tr("Exercise {number} not done yet: {what}", number=number, what=what))
        self.number = number


class ChecksFailed(AssertionError):
    """Raised by `summary()` when at least one check failed (so a notebook run by hand also fails loudly)."""


class StepUnavailable(Exception):
    """Raised when a check uses the value of a step that failed or was blocked."""

    def __init__(self, step: str, status: str, reason: str):
        if status == FAILED:
            text = tr("needs step {step!r}, which failed: {reason}", step=step, reason=reason)
        else:
            text = tr("needs step {step!r}, which is blocked: {reason}", step=step, reason=reason)
        super().__init__(text)
        self.step, self.status, self.reason = step, status, reason


class Unavailable:
    """What `step` returns when its function failed or was blocked. Using it raises `StepUnavailable`."""

    def __init__(self, step: str, status: str, reason: str):
        self._why = (step, status, reason)

    def _raise(self, *_args, **_kwargs):
        raise StepUnavailable(*self._why)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        self._raise()

    __getitem__ = __iter__ = __len__ = __call__ = _raise

    def __bool__(self):
        return False

    def __repr__(self):
        step, status, reason = self._why
        return f"<unavailable: step {step!r} {status}: {reason}>"


# ----------------------------------------------------------------------------------------------------- the record


class _State:
    def __init__(self):
        self.report: Path | None = None
        self.records: dict[str, dict] = {}  # by name: re-running a check replaces its result


_state = _State()


def begin(report: str | Path | None = None) -> None:
    """Start a fresh list of checks. `report`: a file to append one JSON line per check to (the harness passes it
    through the parameters cell's `checks_report`); None prints only. The file's first line says what the kernel
    runs on ({"kind": "begin", "python": ..., "torch": ..., "cuda_gpus": ...})."""
    _state.records = {}
    _state.report = Path(report) if report else None
    import os

    from pylib.i18n import language

    os.environ["PYLIB_LANG"] = language()  # the ranks `launch` spawns speak the notebook's language too
    if _state.report is not None:
        import platform
        from importlib.metadata import PackageNotFoundError, version

        try:
            torch_version = version("torch")  # without importing it: a notebook that needs no torch starts fast
        except PackageNotFoundError:
            torch_version = None
        head = dict(kind="begin", python=platform.python_version(), torch=torch_version, cuda_gpus=gpu_count())
        _state.report.parent.mkdir(parents=True, exist_ok=True)
        _state.report.write_text(json.dumps(head) + "\n")


def assert_close(got, want, what: str = "value", *, atol: float = 1e-12, rtol: float = 0.0) -> None:
    """Raise AssertionError unless tensors `got` and `want` have one shape and |got - want| <= atol + rtol*|want|
    everywhere; the message names `what`, the largest difference and where it is. (`got` may be on a GPU.)

    Cheaper than torch.testing.assert_close, whose first call imports for seconds."""
    import torch

    got, want = torch.as_tensor(got).detach().cpu(), torch.as_tensor(want).detach().cpu()
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    if got.numel() == 0:
        return
    diff = (got.double() - want.double()).abs()
    excess = diff - (atol + rtol * want.double().abs())
    if bool((excess > 0).any()) or bool(diff.isnan().any()):
        where = tuple(
            int(i) for i in torch.unravel_index(torch.nan_to_num(excess, nan=float("inf")).argmax(), got.shape)
        )
        raise AssertionError(
            f"{what}: max |difference| {diff.max().item():.3g} at index {where} "
            f"(got {got[where].item():.6g}, expected {want[where].item():.6g}; tolerance atol={atol:g}, rtol={rtol:g})"
        )


def gpu_count() -> int:
    """CUDA devices visible to this process (0 without torch's CUDA build). On a machine with no GPU device node
    (/dev/nvidia0, ROCm's /dev/kfd) it is 0 without importing torch, which takes seconds."""
    import glob

    if "torch" not in sys.modules and not glob.glob("/dev/nvidia[0-9]*") and not glob.glob("/dev/kfd"):
        return 0
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def missing(needs) -> str | None:
    """Why this machine cannot run a check with these needs, or None when it can.

    needs: None, "gpu" (one CUDA device), "gpu:N" (N CUDA devices), or a list of these."""
    if needs is None:
        return None
    for need in [needs] if isinstance(needs, str) else list(needs):
        m = re.fullmatch(r"gpu(?::(\d+))?", need)
        if m is None:
            raise ValueError(f"unknown need {need!r}: use 'gpu' or 'gpu:N' (N CUDA devices)")
        want, have = int(m.group(1) or 1), gpu_count()
        if have < want:
            if want > 1:
                return tr("needs {want} CUDA GPUs, {have} visible on this machine", want=want, have=have)
            return tr("needs {want} CUDA GPU, {have} visible on this machine", want=want, have=have)
    return None


def _cell() -> int | None:
    """The execution count (In [n]) of the running notebook cell, None outside IPython.

    IPython stores a cell's input in its history (`_ih`) before running it, so the running cell is In [len - 1];
    `shell.execution_count` is not used because IPython 9 increments it before the cell runs and 8 after."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    history = getattr(shell, "user_ns", {}).get("_ih") if shell is not None else None
    return len(history) - 1 if history else None


def explain(exc: BaseException) -> tuple[str, str, int | None]:
    """(message, detail, rank) for a failure: a short message for the ✗ line, the full text for the report, and the
    rank that failed first when the failure came from inside `pylib.runtime.launch`."""
    launch = sys.modules.get("pylib.runtime.launch")  # not imported: no rank ran, and importing it imports torch
    RankFailedError = getattr(launch, "RankFailedError", ())  # noqa: N806 - the class, or () which matches nothing
    LaunchTimeout = getattr(launch, "LaunchTimeout", ())  # noqa: N806

    if isinstance(exc, RankFailedError):
        first = exc.failures[0] if exc.failures else {}
        lines = [line for line in first.get("traceback", "").splitlines() if line.strip()]
        if first.get("kind") == "died":  # its first line says how it died and why (see launch._explain_deaths)
            lines = lines[:1]
        last = lines[-1].strip() if lines else str(exc).splitlines()[0]
        return f"rank {exc.rank}: {last}", str(exc), exc.rank
    if isinstance(exc, LaunchTimeout):
        return str(exc).splitlines()[0], str(exc), None
    if isinstance(exc, StepUnavailable):
        return str(exc), str(exc), None
    text = str(exc).strip()
    if isinstance(exc, AssertionError):
        message = text or tr("assertion failed")
    else:
        message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    lines = message.splitlines()
    if len(lines) > 8:
        message = "\n".join(lines[:8] + ["..."])
    detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return message, detail, None


def _truth(value) -> tuple[bool, str]:
    if value is None or value is True:
        return True, ""
    if value is False:
        return False, tr("the condition is False")
    try:
        return bool(value), tr("the condition is falsy")
    except Exception as exc:  # e.g. a many-element tensor
        return False, tr("cannot tell whether {kind} is true: {exc}", kind=type(value).__name__, exc=exc)


def _record(name, kind, status, seconds, message="", detail="", needs=None, rank=None) -> dict:
    rec = dict(
        name=name,
        kind=kind,
        status=status,
        seconds=round(seconds, 4),
        message=message,
        detail=detail,
        needs=needs,
        rank=rank,
        execution_count=_cell(),
    )
    _state.records[name] = rec
    if _state.report is not None:
        with open(_state.report, "a") as f:
            f.write(json.dumps(rec) + "\n")
    line = f"{_MARK[status]} {name}"
    if status == PASSED:
        line += tr("  ({seconds:.2f} s)", seconds=seconds)
    elif status == BLOCKED:
        line += tr("  [blocked: {message}]", message=message)
    else:
        line += "\n" + "\n".join("    " + ln for ln in message.splitlines())
    print(line, flush=True)
    return rec


def _run(name, kind, condition, needs, detail):
    why = missing(needs)
    if why is not None:
        return _record(name, kind, BLOCKED, 0.0, why, needs=needs), _MISSING
    t0 = time.perf_counter()
    value = condition
    try:
        if callable(condition):
            value = condition()
        ok, message = (True, "") if kind == "step" else _truth(value)
        status, full, rank = (PASSED, "", None) if ok else (FAILED, "", None)
        if not ok:
            message = detail or message
    except StepUnavailable as exc:
        status = BLOCKED if exc.status == BLOCKED else FAILED
        message, full, rank = str(exc), str(exc), None
    except Exception as exc:  # noqa: BLE001 - a check reports whatever its code raised
        status = FAILED
        message, full, rank = explain(exc)
        if detail:
            message = f"{detail}\n{message}"
    return _record(name, kind, status, time.perf_counter() - t0, message, full, needs, rank), value


def check(name: str, condition=_MISSING, *, needs=None, detail: str | None = None):
    """Record one check; returns True (passed), False (failed) or None (blocked).

    condition: a value (truthy passes) or a callable (passes unless it raises or returns False). Without a
    condition, `check(name)` is a decorator that runs the decorated function as the check at once.
    needs: None, "gpu" or "gpu:N" -- on a machine without them the check is blocked, not run.
    detail: a message shown when the check fails (before the exception's own message)."""
    if condition is _MISSING:

        def run_decorated(fn):
            check(name, fn, needs=needs, detail=detail)
            return fn

        return run_decorated
    rec, _ = _run(name, "check", condition, needs, detail)
    return {PASSED: True, FAILED: False, BLOCKED: None}[rec["status"]]


def step(name: str, fn, *, needs=None):
    """Run `fn()` as a check that passes when it returns; give back its value, or an `Unavailable` placeholder."""
    if not callable(fn):
        raise TypeError(f"step {name!r} needs a callable, got {type(fn).__name__}")
    rec, value = _run(name, "step", fn, needs, None)
    if rec["status"] == PASSED:
        return value
    return Unavailable(name, rec["status"], rec["message"].splitlines()[0] if rec["message"] else "")


def results() -> list[dict]:
    """Every check recorded since `begin`, in the order first run."""
    return list(_state.records.values())


def cell_points(points: float) -> float:
    """`points` times the share of the running cell's checks that passed, blocked ones left out (a check that needs
    a GPU the grader lacks earns and costs nothing); 0 when none of them could run. The value of an nbgrader
    autograder test cell's last line is its partial credit (`python -m pylib.labs nbgrader`)."""
    here = [r for r in _state.records.values() if r["execution_count"] == _cell() and r["status"] != BLOCKED]
    if not here:
        return 0.0
    return round(points * sum(r["status"] == PASSED for r in here) / len(here), 3)


def summary() -> dict:
    """Print the tally; raise ChecksFailed naming every failed check (a lab's last cell calls this)."""
    counts = {s: sum(r["status"] == s for r in _state.records.values()) for s in (PASSED, FAILED, BLOCKED)}
    total = sum(counts.values())
    print(
        tr(
            "{total} checks: {passed} passed, {failed} failed, {blocked} blocked",
            total=total,
            passed=counts[PASSED],
            failed=counts[FAILED],
            blocked=counts[BLOCKED],
        )
    )
    if total == 0:
        raise ChecksFailed(tr("no check ran: a lab must record at least one check"))
    failed = [r for r in _state.records.values() if r["status"] == FAILED]
    if failed:
        lines = [tr("{failed} of {total} checks failed:", failed=len(failed), total=total)]
        lines += [f"  ✗ {r['name']}: {r['message'].splitlines()[0] if r['message'] else ''}" for r in failed]
        raise ChecksFailed("\n".join(lines))
    return counts
