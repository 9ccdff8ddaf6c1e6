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
  * a run that outlives `timeout` seconds is killed and `LaunchTimeout` lists the ranks that never answered;
  * no rank outlives the call: they are killed on every exit path (also Ctrl-C), and each asks the kernel to
    kill it if the caller dies (PR_SET_PDEATHSIG).
Each rank's stdout and stderr come back and are printed labelled by rank, in rank order, when the run ends.
Ranks meet through a store file in a fresh temporary directory, so two launches on one machine never collide.

For multi-node runs the same worker functions run under torchrun; see `pylib.runtime.torchrun`.
"""

from __future__ import annotations

import copy
import ctypes
import datetime
import faulthandler
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from multiprocessing.connection import wait as wait_for

import cloudpickle
import torch
import torch.distributed as dist

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
    """The run outlived its deadline. `.silent_ranks` never returned."""

    def __init__(self, message: str, silent_ranks: list[int], outputs: list[str]):
        super().__init__(message)
        self.silent_ranks, self.outputs = silent_ranks, outputs


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


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _rank_main(
    rank,
    world,
    backend,
    store_path,
    timeout,
    result_conn,
    control_conn,
    out_path,
    parent_pid,
    job,
    others,
    deadline_wall,
):
    """Body of one rank process (forked or spawned)."""
    for conn in others:  # forked ranks inherit every pipe; keep only our own so EOFs mean what they say
        conn.close()
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller handles Ctrl-C and kills us
    log = open(out_path, "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    # Just before the caller's deadline, write every thread's stack to the log: a hang shows where it hangs.
    faulthandler.dump_traceback_later(max(0.05, deadline_wall - time.time() - min(0.5, 0.1 * timeout)), file=log)
    try:
        fn, args, kwargs = cloudpickle.loads(job) if isinstance(job, bytes) else job
        torch.set_num_threads(1)
        if backend == "gloo" and sys.platform.startswith("linux"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        pg_timeout = datetime.timedelta(seconds=max(float(timeout), 1.0))
        store = dist.FileStore(store_path, world)
        init = dict(backend=backend, store=store, rank=rank, world_size=world, timeout=pg_timeout)
        if backend == "nccl":
            torch.cuda.set_device(rank)
            init["device_id"] = torch.device("cuda", rank)
        dist.init_process_group(**init)
        result = _to_cpu(fn(*args, **kwargs))
        try:
            payload = cloudpickle.dumps(("ok", rank, time.time(), result))
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
    for r, text in enumerate(outputs):
        for line in text.splitlines():
            print(f"[rank {r}] {line}")


def _tail(text: str, n: int = 15) -> str:
    lines = text.splitlines()
    return "\n".join(lines[-n:])


def _hang_report(text: str, n_output: int = 8, n_stack: int = 14) -> str:
    """The last lines a silent rank printed, then the innermost frames of the stack dump it wrote at the deadline."""
    out, sep, dump = text.partition("Timeout (")
    parts = [_tail(out, n_output)] if out.strip() else []
    if sep:
        parts.append("\n".join(("Timeout (" + dump).splitlines()[:n_stack]) + "\n  ...")
    return "\n".join(parts)


def _check_arguments(world_size) -> None:
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, not {world_size!r}")
    if dist.is_available() and dist.is_initialized():
        raise RuntimeError("launch() starts its own ranks; call it from a plain process, not from inside a rank")


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
        self.workdir = tempfile.mkdtemp(prefix="pylib-launch-")
        self.store_path = os.path.join(self.workdir, "store")
        self.out_paths = [os.path.join(self.workdir, f"rank{r}.log") for r in range(world_size)]
        self.result_pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]  # (read, write)
        self.control_pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]
        self.procs: list = []
        self.deadline = time.monotonic() + timeout

    def start(self, backend: str, job) -> None:
        """Start every rank; the parent keeps only the read ends of results and the write ends of control."""
        forked = self.ctx.get_start_method() == "fork"
        for r in range(self.world):
            mine = {id(self.result_pipes[r][1]), id(self.control_pipes[r][0])}
            others = [c for pair in self.result_pipes + self.control_pipes for c in pair if id(c) not in mine]
            p = self.ctx.Process(
                target=_rank_main,
                args=(
                    r,
                    self.world,
                    backend,
                    self.store_path,
                    self.timeout,
                    self.result_pipes[r][1],
                    self.control_pipes[r][0],
                    self.out_paths[r],
                    os.getpid(),
                    job,
                    others if forked else [],
                    time.time() + self.timeout,
                ),
                daemon=True,
                name=f"pylib-rank-{r}",
            )
            p.start()
            self.procs.append(p)
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
            wait_s = remaining if first_failure_at is None else 0.05
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
        """Every rank answered: EOF on the control pipes tells each rank it may exit; give them a moment to."""
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


def _failure_error(failures: list[dict], outputs: list[str]) -> RankFailedError:
    """One error naming the rank that failed first (a peer's lost connection ranks after real errors)."""
    failures.sort(key=lambda f: (_is_consequence(f), f["time"]))
    first = failures[0]
    also = ", ".join(f"rank {f['rank']} ({f['kind']})" for f in failures[1:])
    msg = f"rank {first['rank']} failed first ({first['kind']}):\n{first['traceback'].rstrip()}"
    if also:
        msg += f"\n(then also: {also}; the other ranks were stopped)"
    return RankFailedError(first["rank"], msg, failures, outputs)


def _timeout_error(timeout: float, silent: list[int], done: list[int], outputs: list[str]) -> LaunchTimeout:
    """The ranks that never answered, each with its last output and where it was stuck."""
    tails = "\n".join(
        f"--- rank {r}: last output, then where it was stuck ---\n{_hang_report(outputs[r])}"
        for r in silent
        if outputs[r]
    )
    return LaunchTimeout(
        f"launch timed out after {timeout:g} s: ranks {silent} never returned"
        + (f" (ranks {done} did)" if done else "")
        + (f"\n{tails}" if tails else ""),
        silent,
        outputs,
    )


def launch(fn, world_size: int, *args, backend: str = "auto", timeout: float = 60.0, **kwargs) -> list:
    """Run `fn(*args, **kwargs)` on `world_size` ranks with torch.distributed initialised; return results by rank.

    backend: "auto" (NCCL with one GPU per rank when enough GPUs are visible, else gloo), "gloo" or "nccl".
    timeout: seconds for the whole run, and the process group's own timeout.
    Tensors in the results are detached and moved to the CPU.
    """
    _check_arguments(world_size)
    backend, ctx = _prepare_backend(backend, world_size)
    job = cloudpickle.dumps((fn, args, kwargs)) if backend == "nccl" else (fn, args, kwargs)
    run = _Run(ctx, world_size, timeout)
    try:
        run.start(backend, job)
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
        return [results[r] for r in range(world_size)]
    finally:
        run.close()


def _kill(procs) -> None:
    for p in procs:
        if p.exitcode is None and p.pid is not None:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        if p.pid is not None:
            p.join(2.0)


def current_device() -> torch.device:
    """The device this rank computes on: its GPU under NCCL (one GPU per rank), else the CPU.

    Code that runs inside ranks creates its tensors with `device=current_device()`, so the same function runs on
    gloo here and on NCCL on a GPU node."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
