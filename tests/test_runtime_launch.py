"""pylib.runtime.launch: results, failures, deadlines, output, and no process left behind."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from pylib.runtime import LaunchTimeout, RankFailedError, launch

REPO = Path(__file__).resolve().parents[1]


def _children_of(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = f.read()
        except OSError:
            continue
        ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
        state = next(line.split()[1] for line in status.splitlines() if line.startswith("State:"))
        if ppid == pid and state != "Z":
            kids.append(int(entry))
    return kids


def _rank_and_sum(scale):
    rank = dist.get_rank()
    x = torch.tensor([float(rank)])
    dist.all_reduce(x)
    return {"rank": rank, "world": dist.get_world_size(), "sum": x * scale}


def test_launch_returns_one_result_per_rank_in_rank_order():
    results = launch(_rank_and_sum, 4, 2.0)
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert all(r["world"] == 4 for r in results)
    assert all(float(r["sum"]) == 12.0 for r in results)  # (0+1+2+3) * 2


def test_launch_passes_keyword_arguments_and_returns_cpu_tensors():
    def fn(*, n):
        return torch.arange(n) + dist.get_rank()

    out = launch(fn, 2, n=3)
    assert out[1].tolist() == [1, 2, 3] and out[1].device.type == "cpu"


def test_launch_prints_each_rank_output_labelled_in_rank_order(capsys):
    def fn():
        time.sleep(0.05 * (3 - dist.get_rank()))  # later ranks finish first
        print(f"hello from {dist.get_rank()}")

    launch(fn, 3)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "hello" in ln]
    assert lines == ["[rank 0] hello from 0", "[rank 1] hello from 1", "[rank 2] hello from 2"]


@pytest.mark.slow  # a fresh Python process imports torch and launches from its __main__: 4 s
def test_a_function_defined_in_main_runs_like_a_notebook_cell(tmp_path):
    script = tmp_path / "notebook_like.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch, torch.distributed as dist
            from pylib.runtime import launch
            torch.ones(512, 512) @ torch.ones(512, 512)   # the parent already ran a multithreaded op
            def cell_function(k):
                x = torch.ones(64, 64) @ torch.ones(64, 64)
                t = torch.tensor([float(dist.get_rank() + k)])
                dist.all_reduce(t)
                return float(t) + float(x[0, 0]) * 0
            print(launch(cell_function, 3, 10))
            """
        )
    )
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[33.0, 33.0, 33.0]"


def _raise_on_rank_2():
    if dist.get_rank() == 2:
        raise ValueError("rank two is broken")
    dist.barrier()  # the others wait for rank 2, which never arrives
    return "unreachable"


def test_a_rank_that_raises_is_named_promptly_with_its_traceback_and_leaves_no_process():
    t0 = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        launch(_raise_on_rank_2, 4, timeout=30)
    elapsed = time.monotonic() - t0
    assert info.value.rank == 2
    assert "rank 2 failed first" in str(info.value)
    assert "ValueError: rank two is broken" in str(info.value)
    assert elapsed < 5, f"failure took {elapsed:.1f}s to surface"
    assert _children_of(os.getpid()) == []


def test_a_rank_that_dies_without_reporting_is_named():
    def fn():
        if dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()

    with pytest.raises(RankFailedError) as info:
        launch(fn, 3, timeout=30)
    assert info.value.rank == 1
    assert "died without reporting (signal 9)" in str(info.value)
    assert _children_of(os.getpid()) == []


def test_the_root_cause_is_named_not_the_peers_that_lost_their_connection():
    def fn():
        if dist.get_rank() == 0:
            time.sleep(0.3)  # rank 3 is the cause; ranks 1 and 2 only see it go away
        if dist.get_rank() == 3:
            os._exit(3)
        dist.barrier()

    with pytest.raises(RankFailedError) as info:
        launch(fn, 4, timeout=30)
    assert info.value.rank == 3


@pytest.mark.slow
def test_a_hanging_rank_is_ended_at_the_deadline_and_listed_as_silent():
    def fn():
        if dist.get_rank() == 1:
            time.sleep(60)
        return dist.get_rank()

    t0 = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        launch(fn, 3, timeout=4.0)  # room for ranks 0 and 2 to start and return on a loaded 2-core machine
    assert 3.9 < time.monotonic() - t0 < 9
    assert info.value.silent_ranks == [1]
    assert "ranks [1] never returned" in str(info.value)
    assert _children_of(os.getpid()) == []


def test_bad_world_size_and_backend_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        launch(_rank_and_sum, 0, 1.0)
    with pytest.raises(ValueError, match="backend must be"):
        launch(_rank_and_sum, 2, 1.0, backend="mpi")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs one GPU per rank"):
            launch(_rank_and_sum, 2, 1.0, backend="nccl")


def _script(tmp_path, body: str) -> Path:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    return path


@pytest.mark.slow
def test_two_launches_at_once_do_not_collide(tmp_path):
    script = _script(
        tmp_path,
        """
        import torch, torch.distributed as dist
        from pylib.runtime import launch
        def fn():
            t = torch.ones(1) * (dist.get_rank() + 1)
            for _ in range(20):
                dist.all_reduce(t)
                t /= dist.get_world_size()
            return float(t)
        print(sum(launch(fn, 4)))
        """,
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=90) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert float(out.strip().splitlines()[-1]) == pytest.approx(4 * 2.5)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_no_rank_survives_when_the_caller_is_interrupted_or_killed(tmp_path):
    script = _script(
        tmp_path,
        """
        import os, signal, sys, time
        from pylib.runtime import launch
        # Ctrl-C as in a terminal, however the suite was started (a job put in the background of a
        # non-interactive shell inherits SIGINT ignored, and Python then leaves it ignored)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        def fn():
            time.sleep(120)
        print(os.getpid(), flush=True)
        launch(fn, 3, timeout=300)
        """,
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for sig in (signal.SIGINT, signal.SIGKILL):
        p = subprocess.Popen(
            [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        pid = int(p.stdout.readline())
        deadline = time.monotonic() + 120  # generous: the caller imports torch first, slow on a loaded machine
        while len(_children_of(pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        ranks = _children_of(pid)
        assert len(ranks) >= 3
        time.sleep(0.3)  # let the ranks reach their sleep
        p.send_signal(sig)
        try:
            p.wait(timeout=60)
        finally:  # a caller that did not stop must not outlive this test (later tests count leftover processes)
            if p.poll() is None:
                p.kill()
                p.wait()
        deadline = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{r}") and _alive(r) for r in ranks) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [r for r in ranks if _alive(r)], f"ranks outlived a {sig.name} of their caller"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "State:\tZ" not in f.read()
    except OSError:
        return False


def test_ranks_compute_on_the_cpu_under_gloo():
    from pylib.runtime import current_device

    assert launch(lambda: str(current_device()), 2, backend="gloo") == ["cpu", "cpu"]


# ------------------------------------------------------------------------------------------ hardening (issue 18)


def _start_sleeper():
    """A rank that starts a child process of its own and returns its pid."""
    return subprocess.Popen(["sleep", "300"]).pid


def test_processes_a_rank_starts_do_not_survive_launch_returning_or_raising():
    pids = launch(_start_sleeper, 2)
    assert not [p for p in pids if _alive(p)], "a rank's child outlived launch()"

    def start_then_fail():
        pid = subprocess.Popen(["sleep", "300"]).pid
        print(f"child {pid}", flush=True)
        if dist.get_rank() == 1:
            raise RuntimeError("after starting a child")
        dist.barrier()

    with pytest.raises(RankFailedError) as info:
        launch(start_then_fail, 2, timeout=30)
    children = [int(line.split()[1]) for text in info.value.outputs for line in text.splitlines() if "child" in line]
    assert len(children) == 2 and not [p for p in children if _alive(p)]


def _start_escapees():
    """A rank that starts a child in a session of its own (setsid) and a daemon that double-forks out of its tree
    (its intermediate parent exits at once); returns both pids."""
    own_session = subprocess.Popen(["sleep", "300"], start_new_session=True).pid
    daemon = subprocess.run(
        ["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
    )
    return [own_session, int(daemon.stdout)]


@pytest.mark.slow
def test_descendants_that_leave_the_ranks_process_group_are_ended_too():
    pids = [p for rank in launch(_start_escapees, 2) for p in rank]
    assert len(pids) == 4 and not [p for p in pids if _alive(p)], "a descendant that called setsid outlived launch()"

    def escape_then_fail():
        print("escaped " + " ".join(map(str, _start_escapees())), flush=True)
        if dist.get_rank() == 1:
            raise RuntimeError("after starting escapees")
        dist.barrier()

    with pytest.raises(RankFailedError) as info:
        launch(escape_then_fail, 2, timeout=30)
    out = [line.split()[1:] for text in info.value.outputs for line in text.splitlines() if "escaped" in line]
    pids = [int(p) for row in out for p in row]
    assert len(pids) == 4 and not [p for p in pids if _alive(p)]


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_stale_launch_folders_are_swept_by_owner_liveness(tmp_path, monkeypatch):
    import tempfile

    from pylib.runtime import leftovers

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    me = os.getpid()
    dead = tmp_path / f"pylib-launch-{_dead_pid()}-12345-abcd"
    reused = tmp_path / f"pylib-launch-{me}-1-abcd"  # our pid, but another start time: its owner is gone
    live = tmp_path / f"pylib-launch-{me}-{leftovers.start_time(me)}-abcd"
    other = tmp_path / "pylib-launch-legacy"  # no owner in the name: never touched
    for d in (dead, reused, live, other):
        d.mkdir()
    assert launch(lambda: dist.get_rank(), 2) == [0, 1]
    assert not dead.exists() and not reused.exists()
    assert live.exists() and other.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("pylib-launch-") and p != live] == [other.name]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_caller_leaves_no_folder_and_no_rank_child_after_the_next_launch(tmp_path, sig, monkeypatch):
    import tempfile

    tdir = tmp_path / "tmp"
    tdir.mkdir()
    script = _script(
        tmp_path,
        """
        import subprocess, time
        from pylib.runtime import launch
        def fn():
            print(subprocess.Popen(["sleep", "300"]).pid, flush=True)
            time.sleep(300)
        launch(fn, 2, timeout=300)
        """,
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tdir)}
    p = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    logs = []
    while time.monotonic() < deadline:
        logs = [f for d in tdir.glob("pylib-launch-*") for f in d.glob("rank*.log")]
        if len(logs) == 2 and all(f.read_text().strip() for f in logs):
            break
        time.sleep(0.1)
    children = [int(f.read_text().split()[0]) for f in logs]
    assert len(children) == 2
    p.send_signal(sig)
    p.wait(timeout=60)
    if sig == signal.SIGTERM:  # the caller cleaned up on its way out
        assert not list(tdir.glob("pylib-launch-*"))
    else:  # nothing could run in the caller: the next launch sweeps its folder and its ranks' groups
        monkeypatch.setattr(tempfile, "tempdir", str(tdir))
        launch(lambda: None, 1)
        assert not list(tdir.glob("pylib-launch-*"))
    deadline = time.monotonic() + 10
    while any(_alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [c for c in children if _alive(c)], f"a rank's child outlived a {sig.name} of the caller"


def test_a_rank_aborted_by_gloo_is_named_with_gloos_reason():
    def fn():
        n = 3 if dist.get_rank() == 0 else 5
        dist.all_reduce(torch.ones(n))

    with pytest.raises(RankFailedError) as info:
        launch(fn, 2, timeout=30)
    text = str(info.value)
    assert "died without reporting (signal 6)" in text
    assert "doesn't match expected size" in text.splitlines()[1], text  # the reason is on the rank's own line


def test_a_segfaulting_rank_reports_its_python_stack():
    def crash_here():
        import ctypes

        ctypes.string_at(0)

    def fn():
        if dist.get_rank() == 1:
            crash_here()
        dist.barrier()

    with pytest.raises(RankFailedError) as info:
        launch(fn, 2, timeout=30)
    assert info.value.rank == 1
    text = str(info.value)
    assert "signal 11" in text and "Fatal Python error: Segmentation fault" in text
    assert "in crash_here" in text, text


@pytest.mark.slow
def test_a_hang_names_the_rank_that_is_not_inside_the_collective_its_peers_wait_in():
    def fn():
        if dist.get_rank() == 1:
            time.sleep(60)
        dist.all_reduce(torch.ones(2))

    with pytest.raises(LaunchTimeout) as info:
        launch(fn, 4, timeout=4.0)
    err = info.value
    assert err.silent_ranks == [0, 1, 2, 3]
    assert err.culprits == [1]
    assert {r: err.where[r] for r in (0, 2, 3)} == {0: "all_reduce", 2: "all_reduce", 3: "all_reduce"}
    assert "rank 1 was NOT inside a collective" in str(err) and "in fn" in err.where[1]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(timeout=0), ValueError, "timeout must be > 0"),
        (dict(timeout=-5), ValueError, "timeout must be > 0"),
        (dict(timeout=float("nan")), ValueError, "timeout must be > 0"),
        (dict(timeout="10"), TypeError, "timeout must be a number of seconds"),
        (dict(timeout=True), TypeError, "timeout must be a number of seconds"),
    ],
)
def test_bad_timeouts_are_refused_before_any_rank_starts(kwargs, error, match):
    t0 = time.monotonic()
    with pytest.raises(error, match=match):
        launch(_rank_and_sum, 2, 1.0, **kwargs)
    assert time.monotonic() - t0 < 0.5 and _children_of(os.getpid()) == []


def test_no_timeout_means_no_limit():
    import math

    assert [r["rank"] for r in launch(_rank_and_sum, 2, 1.0, timeout=None)] == [0, 1]
    assert [r["rank"] for r in launch(_rank_and_sum, 2, 1.0, timeout=math.inf)] == [0, 1]


def test_a_function_that_is_not_callable_is_refused_at_once():
    t0 = time.monotonic()
    with pytest.raises(TypeError, match="fn must be callable"):
        launch("not a function", 2)
    assert time.monotonic() - t0 < 0.5


def test_a_spawned_ranks_job_carries_its_tensor_arguments_as_cpu_tensors():
    import cloudpickle

    from pylib.runtime.launch import _job

    x = torch.arange(6.0).reshape(2, 3).t()  # a non-contiguous view
    job = _job(lambda t, *, scale: t * scale, (x,), dict(scale=torch.tensor(2.0), tag="t"), "nccl")
    assert isinstance(job, bytes), "spawned ranks get the job by value"
    fn, args, kwargs = cloudpickle.loads(job)
    assert args[0].device.type == "cpu" and torch.equal(args[0], x)
    assert kwargs["scale"].device.type == "cpu" and kwargs["tag"] == "t"
    assert torch.equal(fn(*args, scale=kwargs["scale"]), 2 * x)
    fn2, args2, _ = _job(print, (x,), {}, "gloo")
    assert fn2 is print and args2[0] is x, "forked ranks inherit the job as it is"
