"""Run a function on N ranks of a real torch.distributed process group and bring back each rank's result.

    results = launch(fn, 4, x, scale=2.0)     # fn(x, scale=2.0) runs on ranks 0..3; results[r] is rank r's return

CPU (gloo): the ranks are *forked* from the caller, so a function defined in a notebook cell works as is and a
launch costs about a tenth of a second. Each forked rank runs with one intra-op thread (a child forked from a
process that already ran a multithreaded op can otherwise hang in its first matmul).
GPU (NCCL): one GPU per rank; the ranks are *spawned* (CUDA does not survive fork) and the function travels by
value with cloudpickle, so notebook functions work there too.

Failure handling, the part that makes multi-process code teachable:
  * a rank that raises ends the whole run at once: every other rank is killed and `RankFailedError` names the
    rank that failed *first* with its traceback (failures are timestamped in the ranks; a peer's "connection
    closed" is a consequence, not a cause, and is ranked after real errors);
  * a rank that dies without reporting (a signal, a C++ abort in gloo, a segfault) is named with the tail of its
    own output: gloo's reason for aborting, or the Python stack `faulthandler` writes on a fatal signal;
  * a run that outlives `timeout` seconds is killed and `LaunchTimeout` lists the ranks that never answered and
    which of them is *not* inside the collective its peers wait in (read from the stacks the ranks dump just
    before the deadline): that rank is the one to look at. `timeout=None` (or math.inf) means no limit;
  * nothing outlives the call: each rank leads its own process group, and the whole group (the rank and every
    process it started) is killed on every exit path (also Ctrl-C and SIGTERM). A descendant that leaves the group
    (a child that calls setsid, a daemon that double-forks) is found too: each rank is a Linux child subreaper
    (PR_SET_CHILD_SUBREAPER), so every process it started stays in its process tree however its parents exit,
    and the launcher walks that tree (/proc) and kills it before the rank goes. (Not covered: a descendant that
    left the group of a rank that itself died from a signal; the kernel hands it to init.) Each rank asks the
    kernel to kill it if the caller dies (PR_SET_PDEATHSIG), and the next launch sweeps what a caller killed with
    SIGKILL left (its folder, and its ranks' process groups; see `pylib.runtime.leftovers`).
Each rank's stdout and stderr come back and are printed labelled by rank, in rank order, when the run ends.
Ranks meet through a store file in a fresh temporary directory, so two launches on one machine never collide.

For multi-node runs the same worker functions run under torchrun; see `pylib.runtime.torchrun`.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import datetime
import faulthandler
import math
import multiprocessing as mp
import numbers
import os
import re
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_for

import cloudpickle
import torch
import torch.distributed as dist

from pylib.i18n import editions as replay
from pylib.i18n import language_asked, tr

from . import leftovers

# Errors that a rank raises because a *peer* went away; they never explain a failure on their own.
_CONSEQUENCE_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "closed connection",
    "Socket closed",
    "Timed out waiting",
    "Connection refused",
    "NCCL communicator was aborted",
)


class RankFailedError(RuntimeError):
    """A rank raised (or died). `.rank` failed first; `.failures` lists every failure seen, earliest first."""

    def __init__(self, rank: int, message: str, failures: list[dict], outputs: list[str]):
        super().__init__(message)
        self.rank, self.failures, self.outputs = rank, failures, outputs


class LaunchTimeout(RuntimeError):
    """The run outlived its deadline. `.silent_ranks` never returned; `.where[r]` says where each was stuck
    ("all_reduce" for a collective, else the innermost frame of its own code); `.culprits` are the silent ranks
    that were *not* inside a collective while others waited in one (empty when no rank waited in a collective)."""

    def __init__(self, message: str, silent_ranks: list[int], outputs: list[str], where=None, culprits=None):
        super().__init__(message)
        self.silent_ranks, self.outputs = silent_ranks, outputs
        self.where, self.culprits = dict(where or {}), list(culprits or [])


def _to_cpu(obj):
    """Tensors in a rank's result, detached and on the CPU (a GPU tensor unpickled in the caller would start CUDA
    there), looking into dicts (and their subclasses), lists, tuples and named tuples."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        out = copy.copy(obj)  # the same type (a Counter stays a Counter, a defaultdict keeps its factory)
        for k, v in obj.items():
            out[k] = _to_cpu(v)
        return out
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple: its fields are positional arguments
        return type(obj)(*(_to_cpu(v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


_NO_LIMIT_PG_SECONDS = 7 * 24 * 3600.0  # the process group's timeout under launch(timeout=None): a week
_LONGEST_WAIT = 3600.0  # one wait on the result pipes (select() refuses an infinite timeout)


_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to kill this rank when its caller dies, and to keep every process the rank starts in its
    tree (a child subreaper: an orphaned descendant is re-parented to the rank, not to init)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)
        except OSError:
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


@dataclass(frozen=True)
class _World:
    """What every rank process of one launch is started with: the world size, the backend, the rendezvous file,
    the timeout and its wall-clock deadline, the launching process and the pickled job (fn, args, kwargs)."""

    size: int
    backend: str
    store_path: str
    timeout: float
    deadline_wall: float
    parent_pid: int
    job: object
    profile: object = None  # a pylib.runtime.profile.Profile, or None


def _rank_main(rank, w: _World, result_conn, control_conn, out_path, others):
    """Body of one rank process (forked or spawned): rank `rank` of the launch `w`, reporting on result_conn,
    told to leave on control_conn, logging to out_path; `others` are the inherited pipe ends it closes."""
    world, backend, store_path, timeout = w.size, w.backend, w.store_path, w.timeout
    parent_pid, job, deadline_wall = w.parent_pid, w.job, w.deadline_wall
    for conn in others:  # forked ranks inherit every pipe; keep only our own so EOFs mean what they say
        conn.close()
    os.setpgid(0, 0)  # lead a process group of our own: killing it ends every process this rank starts
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller handles Ctrl-C and kills us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the caller's handler (launch installs one while it runs)
    replay.share_between_editions(False)  # a rank's own calls of shared functions are its own
    log = open(out_path, "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    # A segfault, abort or bus error writes the Python stack of every thread to the log before the rank dies.
    faulthandler.enable(file=log, all_threads=True)
    # Just before the caller's deadline, write every thread's stack to the log: a hang shows where it hangs.
    if math.isfinite(timeout):
        faulthandler.dump_traceback_later(max(0.05, deadline_wall - time.time() - min(0.5, 0.1 * timeout)), file=log)
    try:
        if backend == "nccl":  # before anything is unpickled: a CUDA tensor in the job opens a context on the
            torch.cuda.set_device(rank)  # current device, which must be this rank's GPU, not GPU 0
        fn, args, kwargs = cloudpickle.loads(job) if isinstance(job, bytes) else job
        torch.set_num_threads(1)
        if backend == "gloo" and sys.platform.startswith("linux"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        pg_seconds = max(float(timeout), 1.0) if math.isfinite(timeout) else _NO_LIMIT_PG_SECONDS
        pg_timeout = datetime.timedelta(seconds=pg_seconds)
        store = dist.FileStore(store_path, world)
        init = dict(backend=backend, store=store, rank=rank, world_size=world, timeout=pg_timeout)
        if backend == "nccl":
            init["device_id"] = torch.device("cuda", rank)
        dist.init_process_group(**init)
        asked = language_asked()
        with w.profile.session(rank, current_device()) if w.profile is not None else contextlib.nullcontext():
            result = _to_cpu(fn(*args, **kwargs))
        try:
            payload = cloudpickle.dumps(("ok", rank, time.time(), (result, language_asked() != asked)))
        except Exception as exc:
            raise TypeError(f"rank {rank}'s return value cannot be pickled: {exc}") from exc
    except BaseException as exc:  # noqa: BLE001 - everything a rank raises is reported
        payload = cloudpickle.dumps(("error", rank, time.time(), type(exc).__name__, traceback.format_exc()))
    faulthandler.cancel_dump_traceback_later()
    log.flush()
    result_conn.send_bytes(payload)
    try:  # wait until the caller has every result (peers may still be talking to us), then leave
        control_conn.recv_bytes()
    except (EOFError, OSError):
        pass
    log.flush()
    os._exit(0)


def _pick_backend(backend: str, world_size: int) -> str:
    if backend == "auto":
        usable = torch.cuda.is_available() and torch.cuda.device_count() >= world_size
        return "nccl" if usable else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl', not {backend!r}")
    if backend == "nccl":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n < world_size:
            raise ValueError(f"backend='nccl' needs one GPU per rank: world_size={world_size} but {n} GPUs visible")
    return backend


def _is_consequence(failure: dict) -> bool:
    text = failure.get("traceback", "")
    return any(m.lower() in text.lower() for m in _CONSEQUENCE_MARKERS)


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _print_outputs(outputs: list[str]) -> None:
    """Each rank's captured output, every line prefixed with its rank (`[rank r]`, in the reader's language)."""
    for r, text in enumerate(outputs):
        prefix = tr("[rank {r}]", r=r)
        for line in text.splitlines():
            print(f"{prefix} {line}")


def _tail(text: str, n: int = 15) -> str:
    lines = text.splitlines()
    return "\n".join(lines[-n:])


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def _rank_stack(text: str) -> list[tuple[str, str, str]]:
    """(file, line, function) of the rank's main thread in the last stack dump of its log, innermost first,
    ending at the rank's entry point (a forked rank's stack also holds the caller's frames below it)."""
    dump = text.rpartition("Timeout (")[2]
    for block in re.split(r"\n(?=Thread 0x|Current thread 0x)", dump):
        frames = [m.group("file", "line", "func") for m in map(_FRAME.match, block.splitlines()) if m]
        for i, (file, _, func) in enumerate(frames):
            if func == "_rank_main" and file.endswith(os.path.join("runtime", "launch.py")):
                return frames[:i]
    return []


def _where_stuck(text: str) -> str | None:
    """Where a silent rank was at the deadline: the collective it waited in ("all_reduce", as the outermost frame
    of torch.distributed names it), else "file:line in function" of its own innermost frame; None without a dump."""
    frames = _rank_stack(text)
    if not frames:
        return None
    inside_dist = [f for f in frames if f"{os.sep}torch{os.sep}distributed{os.sep}" in f[0]]
    if inside_dist and frames[0] in inside_dist:
        outermost = [f for f in inside_dist if f[0].endswith("distributed_c10d.py")] or inside_dist
        return outermost[-1][2]
    file, line, func = frames[0]
    return f"{os.path.basename(file)}:{line} in {func}"


def _is_collective(where: str | None) -> bool:
    return where is not None and " in " not in where


def _death_reason(text: str) -> str:
    """The line of a dead rank's output that says why: a C++ exception's what() (gloo's "Received data size
    doesn't match expected size"), a fatal Python error (a segfault), else its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for marker in ("what():", "Fatal Python error:", "terminate called"):
        hits = [line for line in lines if marker in line and not line.startswith("File ")]
        if hits:
            return hits[-1]
    return lines[-1] if lines else "it printed nothing"


def _hang_report(text: str, n_output: int = 8, n_stack: int = 14) -> str:
    """The last lines a silent rank printed, then the innermost frames of the stack dump it wrote at the deadline."""
    out, sep, dump = text.partition("Timeout (")
    parts = [_tail(out, n_output)] if out.strip() else []
    if sep:
        parts.append("\n".join(("Timeout (" + dump).splitlines()[:n_stack]) + "\n  ...")
    return "\n".join(parts)


def _check_arguments(fn, world_size, timeout) -> float:
    """Refuse bad arguments before any process starts; return the timeout in seconds (math.inf: no limit)."""
    if not callable(fn):
        raise TypeError(f"launch runs a function on every rank: fn must be callable, not {type(fn).__name__} {fn!r}")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, not {world_size!r}")
    if timeout is None:
        timeout = math.inf
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(
            f"timeout must be a number of seconds > 0 (or None / math.inf for no limit), not {type(timeout).__name__} "
            f"{timeout!r}"
        )
    timeout = float(timeout)
    if not timeout > 0:  # also NaN
        raise ValueError(f"timeout must be > 0 seconds (or None / math.inf for no limit), not {timeout!r}")
    if dist.is_available() and dist.is_initialized():
        raise RuntimeError("launch() starts its own ranks; call it from a plain process, not from inside a rank")
    return timeout


def _prepare_backend(backend: str, world_size: int):
    """(backend, multiprocessing context): fork for gloo, spawn for NCCL (CUDA does not survive a fork)."""
    backend = _pick_backend(backend, world_size)
    if backend == "gloo":
        # torch.optim imports torch._dynamo when the first optimizer is built, and the first
        # autograd.backward(y, grad_tensors=g) imports torch.fx's symbolic shapes and sympy (~2.5 s of CPU in all).
        # torch._dynamo brings both. Import it once here, before forking, so ranks inherit it instead of each paying.
        import torch._dynamo  # noqa: F401
    return backend, mp.get_context("spawn" if backend == "nccl" else "fork")


class _Run:
    """One launch's processes, pipes and folder: started by `start`, read by `collect`, ended by `close`.

    Rendezvous is through a file in a fresh directory: no port to collide on, no server thread in this process
    (a thread holding a lock at the moment of a fork leaves it held forever in the child), and no name lookups
    (a TCP store resolves addresses, which stalled 5 s on one launch in ~30 in this sandbox)."""

    def __init__(self, ctx, world_size: int, timeout: float):
        self.ctx, self.world, self.timeout = ctx, world_size, timeout
        leftovers.sweep("pylib-launch")  # what launches whose caller was killed left behind
        self.workdir = leftovers.owned_tempdir("pylib-launch")
        self.store_path = os.path.join(self.workdir, "store")
        self.out_paths = [os.path.join(self.workdir, f"rank{r}.log") for r in range(world_size)]
        self.result_pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]  # (read, write)
        self.control_pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]
        self.procs: list = []
        self.deadline = time.monotonic() + timeout

    def start(self, backend: str, job, profile=None) -> None:
        """Start every rank; the parent keeps only the read ends of results and the write ends of control."""
        forked = self.ctx.get_start_method() == "fork"
        deadline = time.time() + self.timeout
        for r in range(self.world):
            mine = {id(self.result_pipes[r][1]), id(self.control_pipes[r][0])}
            others = [c for pair in self.result_pipes + self.control_pipes for c in pair if id(c) not in mine]
            p = self.ctx.Process(
                target=_rank_main,
                args=(
                    r,
                    _World(self.world, backend, self.store_path, self.timeout, deadline, os.getpid(), job, profile),
                    self.result_pipes[r][1],
                    self.control_pipes[r][0],
                    self.out_paths[r],
                    others if forked else [],
                ),
                daemon=True,
                name=f"pylib-rank-{r}",
            )
            p.start()
            self.procs.append(p)
            try:  # the rank does the same first thing; doing it here too leaves no moment it is in our group
                os.setpgid(p.pid, p.pid)
            except OSError:  # the rank got there first (or has already died)
                pass
        leftovers.record_groups(self.workdir, [p.pid for p in self.procs])
        for r in range(self.world):
            self.result_pipes[r][1].close()
            self.control_pipes[r][0].close()

    def _died(self, r: int) -> dict:
        self.procs[r].join(0.2)
        code = self.procs[r].exitcode
        why = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return dict(rank=r, time=time.time(), kind="died", traceback=f"rank {r} died without reporting ({why})")

    def collect(self) -> tuple[dict, list[dict], list[int]]:
        """(results by rank, failures, silent ranks): read results until every rank answered, the deadline passed,
        or 50 ms after the first failure (gathering the failures that raced it)."""
        results: dict[int, object] = {}
        failures: list[dict] = []
        readers = {self.result_pipes[r][0]: r for r in range(self.world)}
        first_failure_at = None
        while readers:
            now = time.monotonic()
            if first_failure_at is not None and now - first_failure_at > 0.05:
                break
            remaining = self.deadline - now
            if remaining <= 0:
                break
            wait_s = min(remaining, _LONGEST_WAIT) if first_failure_at is None else 0.05
            for conn in wait_for(list(readers), timeout=wait_s):
                r = readers.pop(conn)
                try:
                    msg = cloudpickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    failures.append(self._died(r))
                else:
                    if msg[0] == "ok":
                        results[r] = msg[3]
                    else:
                        failures.append(dict(rank=r, time=msg[2], kind=msg[3], traceback=msg[4]))
                if failures and first_failure_at is None:
                    first_failure_at = time.monotonic()
        return results, failures, sorted(readers.values())

    def release(self) -> None:
        """Every rank answered: kill what the ranks started (their trees, while they still hold them), then EOF on
        the control pipes tells each rank it may exit; give them a moment to."""
        _kill_descendants(self.procs)
        for r in range(self.world):
            self.control_pipes[r][1].close()
        for p in self.procs:
            p.join(max(0.0, min(5.0, self.deadline - time.monotonic())))

    def outputs(self) -> list[str]:
        return [_read(p) for p in self.out_paths]

    def close(self) -> None:
        _kill(self.procs)
        for pair in self.result_pipes + self.control_pipes:
            for c in pair:
                c.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _own_frames(text: str) -> str:
    """A rank's output with the frames below its entry point left out of each stack dump (a forked rank's stack
    goes on through the caller's frames, down to how the caller itself was started)."""
    out, skipping = [], False
    for line in text.splitlines():
        m = _FRAME.match(line)
        if m is None:
            skipping = False
        elif skipping:
            continue
        elif m.group("func") == "_rank_main":
            skipping = True
            continue
        out.append(line)
    return "\n".join(out)


def _explain_deaths(failures: list[dict], outputs: list[str]) -> None:
    """A rank that died without reporting: add the line of its output that says why, and the output's tail."""
    for f in failures:
        if f["kind"] == "died":
            text = outputs[f["rank"]]
            f["reason"] = _death_reason(text)
            f["traceback"] += f": {f['reason']}"
            if text.strip():
                f["traceback"] += f"\n--- the last lines rank {f['rank']} printed ---\n{_tail(_own_frames(text), 25)}"


def _failure_error(failures: list[dict], outputs: list[str]) -> RankFailedError:
    """One error naming the rank that failed first (a peer's lost connection ranks after real errors)."""
    _explain_deaths(failures, outputs)
    failures.sort(key=lambda f: (_is_consequence(f), f["time"]))
    first = failures[0]
    also = ", ".join(f"rank {f['rank']} ({f['kind']})" for f in failures[1:])
    msg = f"rank {first['rank']} failed first ({first['kind']}):\n{first['traceback'].rstrip()}"
    if also:
        msg += f"\n(then also: {also}; the other ranks were stopped)"
    return RankFailedError(first["rank"], msg, failures, outputs)


def _timeout_error(timeout: float, silent: list[int], done: list[int], outputs: list[str]) -> LaunchTimeout:
    """The ranks that never answered, which of them was not inside the collective the others waited in, and for
    each its last output and where it was stuck."""
    where = {r: _where_stuck(outputs[r]) for r in silent}
    waiting = {r: w for r, w in where.items() if _is_collective(w)}
    culprits = [r for r in silent if waiting and where[r] is not None and not _is_collective(where[r])]
    head = f"launch timed out after {timeout:g} s: ranks {silent} never returned"
    lines = [head + (f" (ranks {done} did)" if done else "")]
    if waiting:
        ops = sorted(set(waiting.values()))
        lines.append(f"ranks {sorted(waiting)} were waiting inside {', '.join(ops)}")
        for r in culprits:
            lines.append(f"rank {r} was NOT inside a collective (it was at {where[r]}): the others wait for it")
        if done and not culprits:
            lines.append(f"ranks {done} had returned, so nothing could answer ranks {sorted(waiting)}")
    tails = "\n".join(
        f"--- rank {r}: last output, then where it was stuck ---\n{_hang_report(outputs[r])}"
        for r in silent
        if outputs[r]
    )
    return LaunchTimeout("\n".join(lines) + (f"\n{tails}" if tails else ""), silent, outputs, where, culprits)


class _TerminateAsInterrupt:
    """While launch runs in the main thread, SIGTERM raises (SystemExit(143)) instead of ending the process
    on the spot, so the ranks, their children and the folder are cleaned up on the way out. A caller's own
    SIGTERM handler is left alone."""

    def __enter__(self):
        self.saved = None
        if threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                self.saved = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise SystemExit(128 + signum)

    def __exit__(self, *exc):
        if self.saved is not None:
            signal.signal(signal.SIGTERM, self.saved)
        return False


_EVERY_LAUNCH: list = [None, 0]  # the profile every launch of this process takes (`profile_launches`), launches made


def profile_launches(profile) -> None:
    """Profile every later `launch` of this process that passes no `profile=` of its own, launch k into its own
    folder (`profile.numbered(k)`: out_dir/launch{k}); None stops. The lab harness's switch (`run_lab(profile_dir=)`
    calls it in the lab's kernel before the first cell): a lab's cells call launch themselves."""
    if profile is not None and not callable(getattr(profile, "numbered", None)):
        raise TypeError(f"profile_launches takes a pylib.runtime.profile.Profile or None, not {type(profile).__name__}")
    _EVERY_LAUNCH[:] = [profile, 0]


def launch(fn, world_size: int, *args, backend: str = "auto", timeout: float = 60.0, profile=None, **kwargs) -> list:
    """Run `fn(*args, **kwargs)` on `world_size` ranks with torch.distributed initialised; return results by rank.

    backend: "auto" (NCCL with one GPU per rank when enough GPUs are visible, else gloo), "gloo" or "nccl".
    timeout: seconds (> 0) for the whole run, and the process group's own timeout; None or math.inf: no limit.
    Tensors in the results are detached and moved to the CPU; under NCCL, tensors among the arguments are sent as
    CPU tensors too (move them to `current_device()` inside `fn`).
    profile: a `pylib.runtime.profile.Profile`: every rank runs `fn` under torch.profiler and writes its trace, and
    the traces are merged into `profile.merged_path` once every rank has returned. None (the default): no profiler,
    unless `profile_launches` set one for every launch of this process.
    """
    timeout = _check_arguments(fn, world_size, timeout)
    if profile is None and _EVERY_LAUNCH[0] is not None:
        profile = _EVERY_LAUNCH[0].numbered(_EVERY_LAUNCH[1])
        _EVERY_LAUNCH[1] += 1
    if profile is not None and not (callable(getattr(profile, "session", None)) and callable(profile.merge)):
        raise TypeError(f"profile must be a pylib.runtime.profile.Profile or None, not {type(profile).__name__}")
    backend, ctx = _prepare_backend(backend, world_size)
    # a profiled launch is never replayed by the other edition's build: what it makes is the trace files its ranks write
    shared = replay.slot(fn, args, kwargs, world_size, backend) if profile is None else contextlib.nullcontext()
    with shared as stored:  # None unless the book's editions share runs
        earlier = stored.get() if stored is not None else None
        if earlier is not None:
            results, outputs = earlier
            _print_outputs(outputs)
            return results
        job = _job(fn, args, kwargs, backend)
        start = time.monotonic()
        with _TerminateAsInterrupt():
            results, outputs, asked_language = _launch(ctx, backend, job, world_size, timeout, profile)
        if stored is not None:
            stored.put((results, outputs), time.monotonic() - start, asked_language)
    if profile is not None:
        profile.merge(world_size)
    return results


def _job(fn, args: tuple, kwargs: dict, backend: str):
    """What each rank receives. Forked (gloo) ranks inherit it as it is. Spawned (NCCL) ranks get it by value
    (cloudpickle, so notebook functions travel), with its tensors as CPU tensors: unpickling one in a rank then
    never opens a CUDA context on a GPU that is not the rank's own (the rank moves what it needs to
    current_device())."""
    if backend != "nccl":
        return fn, args, kwargs
    return cloudpickle.dumps((fn, _to_cpu(args), _to_cpu(kwargs)))


def _launch(ctx, backend: str, job, world_size: int, timeout: float, profile=None) -> tuple[list, list[str], bool]:
    """(results by rank, the ranks' printed outputs, whether any rank asked for the language)."""
    run = _Run(ctx, world_size, timeout)
    try:
        run.start(backend, job, profile)
        results, failures, silent = run.collect()
        if failures or silent:
            _kill(run.procs)
        else:
            run.release()
            _kill(run.procs)
        outputs = run.outputs()
        _print_outputs(outputs)
        if failures:
            raise _failure_error(failures, outputs)
        if silent:
            raise _timeout_error(timeout, silent, sorted(results), outputs)
        return [results[r][0] for r in range(world_size)], outputs, any(results[r][1] for r in range(world_size))
    finally:
        run.close()


def _kill_groups(procs) -> None:
    """SIGKILL each rank's process group: whatever the rank started (a subprocess, a pool) goes with it."""
    for p in procs:
        if p.pid is not None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _processes():
    """(pid, parent pid, process group) of every live process (zombies left out), read from /proc (Linux; elsewhere
    none)."""
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
            except OSError:
                continue
            if fields[0] != "Z":
                yield int(entry), int(fields[1]), int(fields[2])


def _live_group_members(pgids: set[int]) -> list[int]:
    """Pids (not zombies) whose process group is one of `pgids`.

    A signal 0 to each group answers first: when no group has a process left (the usual end of a run, every rank
    reaped), /proc is not read at all. Only when one still has a member (perhaps a zombie, which /proc tells
    apart) are all processes read: that scan costs about 10 ms with a hundred processes on the machine."""
    if not pgids or not any(_group_exists(g) for g in pgids):
        return []
    return [pid for pid, _, pgid in _processes() if pgid in pgids]


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process we may not signal is in it: it exists
        return True
    return True


def _process_table() -> dict[int, list[int]]:
    """parent pid -> its children's pids (zombies left out)."""
    children: dict[int, list[int]] = {}
    for pid, parent, _ in _processes():
        children.setdefault(parent, []).append(pid)
    return children


def _descendants(roots: set[int]) -> list[int]:
    """Every live descendant of the processes `roots` (children, their children, ...), whatever their session or
    process group: a rank is a child subreaper, so what it started stays below it. No roots: nothing is read."""
    if not roots:
        return []
    children, found, todo = _process_table(), [], list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_descendants(procs, rounds: int = 5) -> None:
    """SIGKILL every descendant of the live ranks, again until none is left (one may fork while we kill)."""
    roots = {p.pid for p in procs if p.pid is not None and p.exitcode is None}
    for _ in range(rounds):
        found = _descendants(roots)
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.005)


def _kill(procs) -> None:
    """SIGKILL what every rank started (its process tree, also what left its group), every rank and its process
    group, reap the ranks, and wait (briefly) until nothing of their groups runs: a SIGKILL is delivered
    asynchronously, and launch() must not return while a rank's child still lives."""
    _kill_descendants(procs)
    _kill_groups(procs)
    for p in procs:
        if p.exitcode is None and p.pid is not None:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        if p.pid is not None:
            p.join(2.0)
    pgids, deadline = {p.pid for p in procs if p.pid is not None}, time.monotonic() + 2.0
    while _live_group_members(pgids) and time.monotonic() < deadline:
        time.sleep(0.01)


def current_device() -> torch.device:
    """The device this rank computes on: its GPU under NCCL (one GPU per rank), else the CPU.

    Code that runs inside ranks creates its tensors with `device=current_device()`, so the same function runs on
    gloo here and on NCCL on a GPU node."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
