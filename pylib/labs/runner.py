"""Run labs headlessly with papermill and collect, per lab, what every check and every failing cell said.

    report = run_labs(find_labs(), mode="solution", overrides={"world_size": 4}, out_dir=Path("labs/_runs/solution"))

Each lab runs in a fresh kernel of *this* Python (the interpreter running the harness, with this checkout's pylib
first on the kernel's path), in the lab's own folder, with the parameters cell overridden by papermill:
`checks_report` (a JSON-lines file the checks append to), `solution` (True in solution mode; the learner version
already says False), and the caller's overrides. A per-lab deadline covers kernel start and every cell. The executed
notebook is saved to `out_dir/<lab>.ipynb` whatever happens, so a failure can be opened and read.

A lab *passes* when every cell ran and no check failed (blocked checks do not fail a lab). Otherwise it *failed*
(a check failed, or a cell raised outside a check) or hit its *timeout*; the result names the cell (index in the
notebook that ran, its first line and tags, and In [n]) and, when a rank raised inside `launch`, the rank and its
traceback.
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
import os
import re
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from jupyter_client.manager import AsyncKernelManager

from pylib.i18n import normalise, tr
from pylib.runtime import leftovers

from . import interrupts
from .files import Lab
from .notebook import first_line, learner_version, localised, parameters, tags

MODES = ("solution", "learner")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RANK = re.compile(r"\brank (\d+) failed first\b")


class Interrupted(BaseException):
    """The harness got SIGINT or SIGTERM while a lab ran. `.result` is that lab's report entry (status
    "interrupted"), filled in by run_lab on the way out."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.result = signum, None


_KERNELS: list = []  # the kernel managers of the lab now running: stopped and cleaned up when it ends


class CurrentPythonKernelManager(AsyncKernelManager):
    """Start kernels with the interpreter running the harness (not whatever a `python3` kernelspec points to),
    talking over Unix sockets in a private folder rather than TCP ports: with TCP, a port chosen free can be taken
    by another process before the kernel binds it ("Address already in use"), which happened here when several
    harness runs started kernels at once. The folder is named after the harness process (see
    `pylib.runtime.leftovers`), removed when the lab ends however it ends, and swept by a later run if the harness
    itself was killed."""

    def __init__(self, *args, **kwargs):
        if sys.platform.startswith("linux") or sys.platform == "darwin":
            self._socket_dir = leftovers.owned_tempdir("pylib-lab-kernel")
            kwargs.setdefault("transport", "ipc")
            kwargs.setdefault("ip", os.path.join(self._socket_dir, "kernel"))
        super().__init__(*args, **kwargs)
        _KERNELS.append(self)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart and getattr(self, "_socket_dir", None):
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    def format_kernel_cmd(self, extra_arguments=None):
        return [sys.executable, "-m", "ipykernel_launcher", "-f", self.connection_file, *(extra_arguments or [])]


def _stop_kernels() -> None:
    """Kill what is left of this lab's kernels (a kernel leads its own session: its whole group goes) and remove
    their socket folders; then sweep the launch folders their ranks left (a kernel killed mid-launch cannot)."""
    while _KERNELS:
        km = _KERNELS.pop()
        process = getattr(getattr(km, "provisioner", None), "process", None)
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                process.kill()
            process.wait()
        if getattr(km, "_socket_dir", None):
            shutil.rmtree(km._socket_dir, ignore_errors=True)
    leftovers.sweep("pylib-launch")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


@contextlib.contextmanager
def _kernel_environment():
    """The kernel imports the same pylib as the harness: put its checkout first on PYTHONPATH for the run."""
    root = str(Path(__file__).resolve().parents[2])
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "PYDEVD_DISABLE_FILE_VALIDATION")}
    parts = [root] + [p for p in (saved["PYTHONPATH"] or "").split(os.pathsep) if p and p != root]
    os.environ["PYTHONPATH"] = os.pathsep.join(parts)
    os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # silence the debugger's frozen-modules warning
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _cell_index(ran_nb) -> dict[str, int]:
    return {c.get("id"): i for i, c in enumerate(ran_nb.cells)}


def _describe_cell(executed, ran_ids: dict[str, int], *, execution_count=None, executed_index=None) -> dict:
    """Where a cell is: its index in the notebook that ran (papermill's injected cells not counted), In [n],
    first line and tags. Found by execution count or by index in the executed notebook."""
    cell = None
    if execution_count is not None:
        cell = next((c for c in executed.cells if c.get("execution_count") == execution_count), None)
    elif executed_index is not None and 0 <= executed_index < len(executed.cells):
        cell = executed.cells[executed_index]
    if cell is None:
        return dict(cell=None, execution_count=execution_count, first_line="", tags=[])
    return dict(
        cell=ran_ids.get(cell.get("id")),
        execution_count=cell.get("execution_count"),
        first_line=first_line(cell),
        tags=[t for t in tags(cell) if t != "injected-parameters"],
    )


def _read_checks(path: Path) -> list[dict]:
    """The check records, the last one per name (a re-run check replaces its result), in first-seen order."""
    if not path.exists():
        return []
    by_name: dict[str, dict] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            if rec.get("kind") in ("check", "step"):
                by_name[rec["name"]] = rec
    return list(by_name.values())


def _read_kernel_info(path: Path) -> dict:
    """The "begin" line the checks write: what the lab's kernel ran on (python, torch, cuda_gpus)."""
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                if rec.get("kind") == "begin":
                    return {k: v for k, v in rec.items() if k != "kind"}
    return {}


def _check_calls(cell) -> int:
    """How many check(...) / step(...) calls a code cell's source holds (a decorator @check(...) counts)."""
    try:
        tree = ast.parse(cell.source)
    except SyntaxError:
        return 0
    return sum(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("check", "step")
        for node in ast.walk(tree)
    )


def _not_run(executed, checks: list[dict], error: dict | None) -> int:
    """Checks the lab never reached: those written in code cells that never ran, and those of the cell that raised
    beyond the ones it recorded before raising."""
    count = 0
    raised_in = error.get("execution_count") if error else None
    for cell in executed.cells:
        if cell.cell_type != "code":
            continue
        n = cell.get("execution_count")
        if n is None:
            count += _check_calls(cell)
        elif n == raised_in:
            count += max(0, _check_calls(cell) - sum(c.get("execution_count") == n for c in checks))
    return count


def _last_started_cell(executed) -> int | None:
    started = [i for i, c in enumerate(executed.cells) if c.get("metadata", {}).get("papermill", {}).get("start_time")]
    return started[-1] if started else None


@dataclass
class _Prepared:
    """What one lab run needs before its kernel starts: the notebook to run, where its outputs go, its parameters."""

    notebook: nbformat.NotebookNode
    checks_file: Path
    executed_path: Path
    params: dict  # what papermill injects
    effective: dict  # the values the lab runs with (its defaults, then the injected ones), for the report


def _prepare(lab: Lab, mode: str, overrides: dict | None, out_dir: Path) -> _Prepared:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    source = lab.read()
    ran_nb = learner_version(source) if mode == "learner" else source
    checks_file = out_dir / "checks" / f"{lab.name}.jsonl"
    checks_file.parent.mkdir(parents=True, exist_ok=True)
    checks_file.unlink(missing_ok=True)
    params = dict(overrides or {})
    if mode == "solution":
        params["solution"] = True
    params["checks_report"] = str(checks_file.resolve())
    effective = {**parameters(ran_nb), **params}
    if "lang" in params:
        ran_nb = localised(ran_nb, str(params["lang"]), lab)
    effective.pop("checks_report", None)
    return _Prepared(ran_nb, checks_file, out_dir / f"{lab.name}.ipynb", params, effective)


def kernel_arguments(lab: Lab, profile_dir: Path | None = None) -> list[str]:
    """The lab kernel's command-line arguments: quiet logs, and with a profile_dir a startup line that profiles every
    launch of the lab into profile_dir/<lab name> (IPython's exec_lines run before the first cell; the notebook
    itself, and so the report's cell numbers, stay as they are)."""
    args = ["--IPKernelApp.log_level=ERROR"]
    if profile_dir is not None:
        where = str(Path(profile_dir).resolve() / lab.name)
        line = f"import pylib.runtime as _r, pylib.runtime.profile as _p; _r.profile_launches(_p.Profile({where!r}))"
        args.append(f"--IPKernelApp.exec_lines={line}")
    return args


def _execute(
    lab: Lab,
    prep: _Prepared,
    timeout: float,
    progress: bool,
    cells_only: bool = False,
    kernel_args: list[str] | None = None,
) -> tuple[str, dict | None]:
    """Run the notebook with papermill under one deadline; (status, error) with error None when every cell ran.
    `cells_only`: the deadline starts with the first cell (the kernel's start has its own 60 s), so a limit of a few
    seconds bounds what the notebook's code does, whatever the machine's load does to a kernel's start.
    kernel_args: the kernel's command-line arguments (`kernel_arguments`)."""
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    clock = {"deadline": time.monotonic() + (60.0 if cells_only else timeout), "started": not cells_only}

    def seconds_left(cell) -> int:
        if not clock["started"]:
            clock["deadline"], clock["started"] = time.monotonic() + timeout, True
        return max(1, int(clock["deadline"] - time.monotonic() + 0.999))

    bar = {"desc": lab.name, "position": 1, "leave": False, "unit": "cell"} if progress else False
    with _kernel_environment():
        try:
            pm.execute_notebook(
                prep.notebook,
                str(prep.executed_path),
                parameters=prep.params,
                kernel_name="python3",
                progress_bar=bar,
                cwd=str(lab.path.parent),
                start_timeout=60 if cells_only else max(1, int(min(60.0, timeout) + 0.999)),
                kernel_manager_class=CurrentPythonKernelManager,
                timeout_func=seconds_left,
                shutdown_kernel="immediate",
                extra_arguments=kernel_args if kernel_args is not None else kernel_arguments(lab),
            )
        except PapermillExecutionError as exc:
            return "failed", dict(
                exec_count=exc.exec_count,
                ename=exc.ename,
                evalue=strip_ansi(exc.evalue),
                traceback=strip_ansi("\n".join(exc.traceback)),
            )
        except Exception as exc:  # noqa: BLE001 - a timeout, a dead kernel, a kernel that never started
            timed_out = isinstance(exc, TimeoutError) or time.monotonic() >= clock["deadline"]
            what = f"the lab ran past its timeout of {timeout:g} s" if timed_out else f"{type(exc).__name__}: {exc}"
            error = dict(
                ename="Timeout" if timed_out else type(exc).__name__, evalue=what, traceback=strip_ansi(str(exc))
            )
            return ("timeout" if timed_out else "failed"), error
    return "passed", None


def _read_executed(prep: _Prepared):
    """The executed notebook papermill saved (it saves after every cell), else the notebook that was to run."""
    if prep.executed_path.exists():
        try:
            return nbformat.read(prep.executed_path, as_version=4)
        except Exception:  # noqa: BLE001 - a save cut short by an interrupt
            pass
    return prep.notebook


def _checks_with_cells(prep: _Prepared, executed, ran_ids) -> list[dict]:
    """Every check the lab recorded, with the cell it ran in."""
    checks = []
    for rec in _read_checks(prep.checks_file):
        where = _describe_cell(executed, ran_ids, execution_count=rec.get("execution_count"))
        checks.append({**rec, **where})
    return checks


def _locate_error(error: dict, executed, ran_ids, counts: dict) -> dict | None:
    """The error with its cell and rank; None when summary() raised only because checks failed (the failed checks
    are the explanation)."""
    exec_count = error.pop("exec_count", None)
    if exec_count is not None:
        where = _describe_cell(executed, ran_ids, execution_count=exec_count)
    else:
        where = _describe_cell(executed, ran_ids, executed_index=_last_started_cell(executed))
    m = _RANK.search(error["evalue"])
    error = {**where, **error, "rank": int(m.group(1)) if m else None}
    if error["ename"] == "ChecksFailed" and counts["failed"]:
        return None
    return error


_NO_CHECKS = dict(
    cell=None,
    execution_count=None,
    first_line="",
    tags=[],
    ename="NoChecks",
    evalue="the lab recorded no check (does a cell call begin(checks_report)?)",
    traceback="",
    rank=None,
)


def run_lab(
    lab: Lab,
    *,
    mode: str = "solution",
    overrides: dict | None = None,
    out_dir: Path,
    timeout: float = 300.0,
    progress: bool = False,
    cells_only: bool = False,
    profile_dir: Path | None = None,
) -> dict:
    """Execute one lab; return its report entry (see pylib.labs.report for the shape). `cells_only`: the timeout
    counts from the first cell (see _execute). profile_dir: run every launch of the lab under torch.profiler, launch
    k's traces in profile_dir/<lab>/launch{k} (`pylib.runtime.profile_launches`, set in the lab's kernel before its
    first cell)."""
    prep = _prepare(lab, mode, overrides, out_dir)
    start = time.monotonic()
    try:
        status, error = _execute(lab, prep, timeout, progress, cells_only, kernel_arguments(lab, profile_dir))
    except (KeyboardInterrupt, Interrupted) as exc:
        stop = exc if isinstance(exc, Interrupted) else Interrupted(signal.SIGINT)
        _stop_kernels()
        what = f"the harness was interrupted ({stop}) while this lab ran"
        error = dict(ename="Interrupted", evalue=what, traceback="")
        stop.result = _lab_result(lab, prep, mode, "interrupted", error, time.monotonic() - start)
        raise stop from None
    finally:
        _stop_kernels()
    return _lab_result(lab, prep, mode, status, error, time.monotonic() - start)


def _lab_result(lab: Lab, prep: _Prepared, mode: str, status: str, error: dict | None, seconds: float) -> dict:
    """The lab's report entry, from what its run left on disk: the executed notebook and the checks file."""
    executed = _read_executed(prep)
    ran_ids = _cell_index(prep.notebook)
    checks = _checks_with_cells(prep, executed, ran_ids)
    counts = {s: sum(c["status"] == s for c in checks) for s in ("passed", "failed", "blocked")}
    if error is not None:
        error = _locate_error(error, executed, ran_ids, counts)
    counts["not_run"] = _not_run(executed, checks, error)
    if status == "passed" and counts["failed"]:
        status = "failed"
    if status == "passed" and not checks:
        status, error = "failed", dict(_NO_CHECKS)
    return dict(
        lab=lab.name,
        path=str(lab.path),
        mode=mode,
        status=status,
        seconds=round(seconds, 3),
        executed=str(prep.executed_path),
        kernel=_read_kernel_info(prep.checks_file),
        parameters=prep.effective,
        counts=counts,
        checks=checks,
        error=error,
    )


def resolve_overrides(labs: list[Lab], overrides: dict) -> dict[str, dict]:
    """Per lab, the overrides that lab declares. A name that no selected lab declares is an error (a typo would
    otherwise be ignored); `solution` is the harness's own switch (--solution / --learner)."""
    if "solution" in overrides:
        raise ValueError("do not pass -p solution=...: run with --solution (default) or --learner")
    if "checks_report" in overrides:
        raise ValueError("checks_report is the harness's own parameter")
    defaults = {lab.name: parameters(lab.read()) for lab in labs}
    declared = {name: set(values) for name, values in defaults.items()}
    unknown = [k for k in overrides if not any(k in names for names in declared.values())]
    if unknown:
        every = sorted(set().union(*declared.values())) if declared else []
        raise ValueError(f"no selected lab has parameter(s) {unknown} (their parameters: {every})")
    per_lab = {lab.name: {k: v for k, v in overrides.items() if k in declared[lab.name]} for lab in labs}
    for name, values in defaults.items():
        for key, value in per_lab[name].items():
            check_override_type(key, value, values[key], name)
        check_backend_device({**values, **per_lab[name]}, name)
    return per_lab


def _kind(value) -> str:
    return {bool: "a bool", int: "an int", float: "a float", str: "a str"}.get(type(value), type(value).__name__)


def check_override_type(name: str, value, default, lab: str = "the lab") -> None:
    """An override must have the type of the parameter's default in the lab's parameters cell (an int where the
    default is an int: `-p world_size=two` or `2.5` is refused before any kernel starts; an int is accepted for a
    float); a default of None accepts anything. Its value must be possible too: a parameter whose default is a
    positive number (a size, a count, a rate) takes a positive, finite number (`-p h=-4`, `-p lr=nan` are refused
    here, not by torch seconds into the run); a list of positive integers (microbatch counts) a non-empty one; `lang`
    a language pylib speaks."""
    if default is not None:
        ok = type(value) is type(default) or (type(default) is float and type(value) is int)
        if not ok:
            raise ValueError(
                f"-p {name}={value!r}: {lab}'s {name} is {_kind(default)} (default {default!r}), not {_kind(value)}"
            )
    if _positive(default) and not _positive(value):
        raise ValueError(
            tr(
                "-p {name}={value!r}: {lab}'s {name} must be a positive, finite number (its default is {default!r})",
                name=name,
                value=value,
                lab=lab,
                default=default,
            )
        )
    if isinstance(default, list) and default and all(_positive(v) and type(v) is int for v in default):
        if not value or not all(_positive(v) and type(v) is int for v in value):
            raise ValueError(
                tr(
                    "-p {name}={value!r}: {lab}'s {name} must be a non-empty list of positive integers "
                    "(its default is {default!r})",
                    name=name,
                    value=value,
                    lab=lab,
                    default=default,
                )
            )
    if name == "lang":
        normalise(value)  # raises naming the languages pylib speaks


def _positive(value) -> bool:
    """A positive, finite int or float (not a bool)."""
    return type(value) in (int, float) and 0 < value < math.inf


def blocked_reason(values: dict) -> str | None:
    """Why this machine cannot run a lab with these parameters (NCCL or CUDA asked for with too few GPUs), or None.

    Such a lab is reported *blocked*, as a check that needs a GPU is, rather than run to fail every check."""
    if values.get("backend") != "nccl" and values.get("device") != "cuda":
        return None
    from .checks import gpu_count

    want = int(values.get("world_size", 1)) if values.get("backend") == "nccl" else 1
    have = gpu_count()
    if have >= want:
        return None
    asked = f"backend={values.get('backend')!r}, device={values.get('device')!r}"
    return f"{asked} needs {want} CUDA GPU{'s' if want > 1 else ''}, {have} visible on this machine"


def _blocked_result(lab: Lab, mode: str, values: dict, why: str, out_dir: Path) -> dict:
    return dict(
        lab=lab.name,
        path=str(lab.path),
        mode=mode,
        status="blocked",
        seconds=0.0,
        executed=str(Path(out_dir) / f"{lab.name}.ipynb"),
        kernel={},
        parameters={k: v for k, v in values.items() if k != "checks_report"},
        counts=dict(passed=0, failed=0, blocked=0, not_run=0),
        checks=[],
        error=dict(
            cell=None,
            execution_count=None,
            first_line="",
            tags=[],
            ename="Blocked",
            evalue=f"not run: {why}",
            traceback="",
            rank=None,
        ),
    )


BACKEND_DEVICE = {"gloo": "cpu", "nccl": "cuda"}


def check_backend_device(values: dict, lab: str = "the lab") -> None:
    """A lab's `backend` and `device` must go together: gloo ranks compute on the CPU, NCCL ranks on their GPU.
    (NCCL refuses CPU tensors; gloo cannot run every collective on CUDA tensors.) Raises naming the fix."""
    backend, device = values.get("backend"), values.get("device")
    if backend is None or device is None:
        return
    if backend not in BACKEND_DEVICE:
        raise ValueError(f"{lab}: backend={backend!r} must be 'gloo' or 'nccl'")
    want = BACKEND_DEVICE[backend]
    if device != want:
        other = next(b for b, d in BACKEND_DEVICE.items() if d == device) if device in BACKEND_DEVICE.values() else None
        fix = f"-p device={want}" + (f" (or -p backend={other})" if other else "")
        raise ValueError(f"{lab}: backend={backend!r} runs its ranks on {want!r}, not device={device!r}: pass {fix}")


def machine() -> dict:
    """What the labs ran on (recorded in the report; the GPU count comes from the labs' kernels, see run_labs)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = None
    return dict(
        python=platform.python_version(),
        executable=sys.executable,
        torch=torch_version,
        platform=platform.platform(),
        cpus=os.cpu_count(),
        cuda_gpus=None,
    )


def run_labs(
    labs: list[Lab],
    *,
    mode: str = "solution",
    overrides: dict | None = None,
    out_dir: Path,
    timeout: float = 300.0,
    progress: bool | None = None,
    echo=print,
    profile_dir: Path | None = None,
) -> dict:
    """Run every lab in order (a progress bar over labs and, inside each, over cells); return the whole report.

    The report (report.json and report.html in `out_dir`) is written after every lab, so what ran is on disk
    whatever happens next. On SIGINT or SIGTERM (`Interrupted`; see `interrupt_on_sigterm`) the running lab is
    recorded as *interrupted*, the labs not started are listed, the report is written, and the exception goes on
    to the caller with `.report` set. A lab whose parameters ask for GPUs this machine lacks is *blocked*.
    progress: None shows bars only when stderr is a terminal. `echo` prints one line per finished lab. profile_dir:
    every lab's launches run under torch.profiler, their traces in profile_dir/<lab>/launch{k} (`run_lab`)."""
    run = _Progress(mode, dict(overrides or {}), Path(out_dir), [lab.name for lab in labs])
    try:
        return _run_each(labs, run, mode, dict(overrides or {}), out_dir, timeout, progress, echo, profile_dir)
    except (KeyboardInterrupt, Interrupted) as exc:  # at any moment: the report says what ran and what did not
        stop = exc if isinstance(exc, Interrupted) else Interrupted(signal.SIGINT)
        if stop.result is not None and stop.result not in run.results:
            run.add(stop.result)
        stop.report = run.write(interrupted=str(stop))
        raise stop from None


def _run_each(labs, run: _Progress, mode, overrides, out_dir, timeout, progress, echo, profile_dir=None) -> dict:
    from tqdm.auto import tqdm

    from .report import lab_line

    per_lab = resolve_overrides(labs, overrides)
    if progress is None:
        progress = sys.stderr.isatty()
    leftovers.sweep("pylib-lab-kernel")  # what harness runs that were killed left behind
    with tqdm(total=len(labs), desc=f"labs ({mode})", unit="lab", position=0, disable=not progress) as bar:
        for lab in labs:
            bar.set_postfix_str(lab.name)
            values = {**parameters(lab.read()), **per_lab[lab.name]}
            why = blocked_reason(values)
            if why is not None:
                result = _blocked_result(lab, mode, values, why, out_dir)
            else:
                result = run_lab(
                    lab,
                    mode=mode,
                    overrides=per_lab[lab.name],
                    out_dir=out_dir,
                    timeout=timeout,
                    progress=progress,
                    profile_dir=profile_dir,
                )
            run.add(result)
            run.write()
            (bar.write if progress else echo)(lab_line(result))
            bar.update(1)
    return run.write()


def interrupted_report(labs: list[Lab], mode: str, overrides: dict, out_dir: Path, stop: Interrupted) -> dict:
    """The report of a run interrupted before its first lab started: every lab listed as not started."""
    return _Progress(mode, dict(overrides), Path(out_dir), [lab.name for lab in labs]).write(interrupted=str(stop))


class _Progress:
    """The results so far, and the report built from them (written after every lab)."""

    def __init__(self, mode: str, overrides: dict, out_dir: Path, names: list[str]):
        self.mode, self.overrides, self.out_dir, self.names = mode, overrides, out_dir, names
        self.started, self.results = time.time(), []

    def add(self, result: dict) -> None:
        self.results.append(result)

    def write(self, interrupted: str | None = None) -> dict:
        from .report import build_report, write_report

        host = machine()
        host["cuda_gpus"] = next((r["kernel"]["cuda_gpus"] for r in self.results if "cuda_gpus" in r["kernel"]), None)
        done = {r["lab"] for r in self.results}
        report = build_report(
            self.results,
            mode=self.mode,
            overrides=self.overrides,
            started=self.started,
            seconds=time.time() - self.started,
            machine=host,
            out_dir=self.out_dir,
            interrupted=interrupted,
            not_started=[n for n in self.names if n not in done],
        )
        # not interrupted halfway: a signal that arrives while the files are written is delivered after
        blocked = {signal.SIGINT, signal.SIGTERM}
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        try:
            write_report(report, self.out_dir)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        return report


@contextlib.contextmanager
def interrupt_on_sigterm():
    """While the block runs (in the main thread), SIGTERM and SIGINT raise `Interrupted`, so the harness records the
    running lab and writes its report instead of vanishing."""

    def _raise(signum, frame):
        raise Interrupted(signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # SIGINT too: a harness started as a background job of a non-interactive shell inherits SIGINT ignored, and
    # Python then never raises KeyboardInterrupt; with this handler Ctrl-C or `kill -INT` ends the run (report
    # written, kernels killed) however the harness was started, as SIGTERM does.
    saved = {sig: signal.signal(sig, _raise) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        noted = interrupts.pending()  # a signal that came while `python -m pylib.labs` was starting
        if noted is not None:
            interrupts.clear()
            raise Interrupted(noted)
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
