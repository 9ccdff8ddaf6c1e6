"""The harness end to end, through its command line: every lab passes solved, every learner version fails its checks
with "not done yet", the report has its documented shape, a GPU check is blocked on CPU, and a rank that raises or a
lab that hangs fails the run naming the lab, the cell and the rank.

The four harness runs start together in one fixture (they mostly wait on kernels importing torch), so the module
costs about as long as its slowest run.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
import torch

from pylib.labs.files import Lab, find_labs
from pylib.labs.notebook import EXERCISE_NUMBER, tags

ROOT = Path(__file__).resolve().parent.parent
LABS = find_labs()
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]  # every lab end to end: ~50 s of the suite


def _fixture_lab(path: Path, cells: list[tuple[str, list[str]]]) -> Path:
    nb = nbformat.v4.new_notebook()
    for source, cell_tags in cells:
        cell = nbformat.v4.new_code_cell(source)
        if cell_tags:
            cell.metadata["tags"] = cell_tags
        nb.cells.append(cell)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


PARAMETERS = ('world_size = 2\nbackend = "gloo"\ndevice = "cpu"\nsolution = True\nchecks_report = None', ["parameters"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("labs")
    rank_lab = _fixture_lab(
        tmp / "02_rank_fails.ipynb",
        [
            PARAMETERS,
            (
                "import torch.distributed as dist\n\nfrom pylib.runtime import launch\n"
                "from pylib.labs.checks import begin, check, summary\n\nbegin(checks_report)\n"
                'check("before the failure", True)',
                [],
            ),
            (
                'def broken():\n    if dist.get_rank() == 1:\n        raise ValueError("rank one is broken")\n'
                "    dist.barrier()",
                [],
            ),
            ("launch(broken, world_size, backend=backend)", ["run"]),
            ('check("after the failure", True)', []),
            ("summary()", []),
        ],
    )
    dying_lab = _fixture_lab(
        tmp / "04_kernel_dies.ipynb",
        [PARAMETERS, ("import os\nimport signal\n\nos.kill(os.getpid(), signal.SIGKILL)", []), ("summary()", [])],
    )
    slow_lab = _fixture_lab(  # the lab times out while its ranks run: the kernel dies inside launch
        tmp / "03_hangs.ipynb",
        [
            PARAMETERS,
            ("import time\n\nfrom pylib.runtime import launch\n\nlaunch(lambda: time.sleep(600), 2, timeout=None)", []),
            ("summary()", []),
        ],
    )
    commands = {
        "solution": ["run", "--all", "--out", str(tmp / "solution")],
        "learner": ["run", "--all", "--learner", "--out", str(tmp / "learner")],
        "rank": ["run", str(rank_lab), str(dying_lab), "--out", str(tmp / "rank")],
        "timeout": ["run", str(slow_lab), "--timeout", "40", "--out", str(tmp / "timeout")],
    }
    scratch = tempfile.mkdtemp(prefix="h", dir="/tmp")  # the runs' TMPDIR (short: kernels bind Unix sockets there)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "TMPDIR": scratch,
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "pylib.labs", *args],
            cwd=ROOT,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for name, args in commands.items()
    }
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=540)
        report_path = Path(commands[name][commands[name].index("--out") + 1]) / "report.json"
        out[name] = dict(
            rc=proc.returncode,
            stdout=stdout,
            stderr=stderr,
            out_dir=report_path.parent,
            report=json.loads(report_path.read_text()) if report_path.exists() else None,
        )
    out["left in TMPDIR"] = sorted(os.listdir(scratch))
    shutil.rmtree(scratch, ignore_errors=True)
    return out


def _labs_by_name(report):
    return {r["lab"]: r for r in report["labs"]}


def test_every_lab_passes_in_solution_mode_through_the_harness(runs):
    run = runs["solution"]
    assert run["rc"] == 0, run["stdout"] + run["stderr"]
    report = run["report"]
    assert report["passed"] and report["mode"] == "solution"
    assert sorted(_labs_by_name(report)) == [lab.name for lab in LABS]
    for lab in report["labs"]:
        assert lab["status"] == "passed", lab
        assert lab["counts"]["failed"] == 0 and lab["counts"]["passed"] >= 5, lab["counts"]
        assert lab["parameters"]["solution"] is True
        assert Path(lab["executed"]).exists()
    assert "labs passed" in run["stdout"]


def test_learner_versions_fail_their_checks_with_not_done_yet(runs):
    run = runs["learner"]
    assert run["rc"] == 1, run["stdout"] + run["stderr"]
    report = run["report"]
    assert not report["passed"] and report["mode"] == "learner"
    for lab in LABS:
        result = _labs_by_name(report)[lab.name]
        assert result["status"] == "failed"
        assert result["error"] is None, f"{lab.name}: a cell raised outside the checks: {result['error']}"
        assert result["parameters"]["solution"] is False
        failed = [c for c in result["checks"] if c["status"] == "failed"]
        assert failed, f"{lab.name}: no check failed in the learner version"
        named = {int(n) for c in failed for n in re.findall(r"Exercise (\d+) not done yet", c["message"])}
        cells = [c for c in lab.read().cells if "exercise" in tags(c)]
        exercises = {int(n) for c in cells for n in EXERCISE_NUMBER.findall(c.source)}
        assert named == exercises, f"{lab.name}: failed checks name exercises {named}, the lab has {exercises}"
    assert "not done yet" in run["stderr"]


def test_the_learner_sees_one_line_per_unfinished_exercise_and_no_tracebacks(runs):
    err = runs["learner"]["stderr"]
    assert "Traceback" not in err, err[:3000]
    for lab in LABS:
        cells = [c for c in lab.read().cells if "exercise" in tags(c)]
        exercises = sorted({int(n) for c in cells for n in EXERCISE_NUMBER.findall(c.source)})
        block = err.split(f"lab {lab.name} failed", 1)[1].split("✗ lab ", 1)[0]
        lines = [int(n) for n in re.findall(r"^  ✗ exercise (\d+) not done yet: ", block, flags=re.M)]
        assert lines == exercises, f"{lab.name}: {lines} != {exercises}\n{block}"


def test_report_json_has_the_documented_shape(runs):
    report = runs["solution"]["report"]
    assert report["schema"] == "pylib.labs.report/1"
    assert set(report) >= {"schema", "mode", "passed", "started", "seconds", "overrides", "machine", "totals", "labs"}
    assert set(report["machine"]) >= {"python", "executable", "torch", "platform", "cpus", "cuda_gpus"}
    assert report["totals"]["labs"] == len(report["labs"]) == report["totals"]["labs_passed"]
    totals = {s: sum(lab["counts"][s] for lab in report["labs"]) for s in ("passed", "failed", "blocked", "not_run")}
    assert report["totals"]["checks"] == totals
    lab_keys = {"lab", "path", "mode", "status", "seconds", "executed", "parameters", "counts", "checks", "error"}
    check_keys = {
        "name",
        "kind",
        "status",
        "seconds",
        "message",
        "detail",
        "needs",
        "rank",
        "cell",
        "execution_count",
        "first_line",
        "tags",
    }
    for lab in report["labs"]:
        assert set(lab) >= lab_keys
        assert isinstance(lab["seconds"], float) and lab["seconds"] > 0
        for c in lab["checks"]:
            assert set(c) >= check_keys
            assert c["status"] in ("passed", "failed", "blocked") and c["kind"] in ("check", "step")
            assert isinstance(c["seconds"], float)
            cells = Lab(Path(lab["path"])).read().cells  # solution mode ran the solved lab (solutions put back)
            assert isinstance(c["cell"], int) and 0 <= c["cell"] < len(cells)
            assert c["first_line"] and c["first_line"] in cells[c["cell"]].source
    html = (runs["solution"]["out_dir"] / "report.html").read_text()
    assert html.startswith("<!doctype html>") and all(lab.name in html for lab in LABS)
    assert "<script" not in html and "http" not in html  # self-contained


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the check runs instead")
def test_gpu_check_is_reported_blocked_on_cpu_and_does_not_fail_the_lab(runs):
    lab = _labs_by_name(runs["solution"]["report"])["00_collectives"]
    blocked = [c for c in lab["checks"] if c["status"] == "blocked"]
    assert [c["needs"] for c in blocked] == ["gpu:4"], blocked
    assert "CUDA GPUs, 0 visible" in blocked[0]["message"]
    assert lab["status"] == "passed" and runs["solution"]["report"]["totals"]["checks"]["blocked"] >= 1
    assert "blocked" in runs["solution"]["stdout"]


def test_a_rank_that_raises_fails_the_harness_naming_lab_cell_and_rank(runs):
    run = runs["rank"]
    assert run["rc"] == 1, run["stdout"] + run["stderr"]
    err = run["stderr"]
    assert "02_rank_fails" in err
    assert "cell 3 (In [" in err and "`launch(broken, world_size, backend=backend)` [run]" in err, err
    assert "RankFailedError on rank 1" in err and "ValueError: rank one is broken" in err, err
    lab = run["report"]["labs"][0]
    assert lab["status"] == "failed"
    assert (lab["error"]["cell"], lab["error"]["rank"], lab["error"]["ename"]) == (3, 1, "RankFailedError")
    assert [c["status"] for c in lab["checks"]] == ["passed"]  # the check before the failure was recorded
    assert lab["counts"]["not_run"] == 1  # the check after it never ran, and says so


def test_a_dead_kernel_fails_its_lab_and_leaves_no_folder(runs):
    lab = _labs_by_name(runs["rank"]["report"])["04_kernel_dies"]
    assert lab["status"] == "failed" and lab["error"]["ename"] == "DeadKernelError"
    assert not [n for n in runs["left in TMPDIR"] if n.startswith("pylib-")], runs["left in TMPDIR"]


def test_a_lab_past_its_timeout_is_stopped_and_reported(runs):
    run = runs["timeout"]
    assert run["rc"] == 1, run["stdout"] + run["stderr"]
    lab = run["report"]["labs"][0]
    assert lab["status"] == "timeout" and lab["seconds"] < 120  # 40 s deadline, generous under load
    assert lab["error"]["cell"] == 1 and "timeout of 40 s" in lab["error"]["evalue"]
    assert "03_hangs" in run["stderr"] and "time.sleep(600)" in run["stderr"]
    # the kernel was killed inside launch: the harness swept its launch folder (and its ranks died with it)
    assert not [n for n in runs["left in TMPDIR"] if n.startswith("pylib-launch-")], runs["left in TMPDIR"]


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "State:\tZ" not in f.read()
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_run_writes_the_report_with_the_running_lab_interrupted(tmp_path, sig):
    quick = _fixture_lab(
        tmp_path / "01_quick.ipynb",
        [
            PARAMETERS,
            ("from pylib.labs.checks import begin, check, summary\n\nbegin(checks_report)", []),
            ('check("quick", True)', []),
            ("summary()", []),
        ],
    )
    stuck = _fixture_lab(
        tmp_path / "02_stuck.ipynb",
        [
            PARAMETERS,
            (
                "import os\nimport time\n\nfrom pylib.labs.checks import begin, check, summary\n\nbegin(checks_report)",
                [],
            ),
            ('check("started", True)\nopen("kernel.pid", "w").write(str(os.getpid()))\ntime.sleep(600)', []),
            ('check("never", True)', []),
            ("summary()", []),
        ],
    )
    scratch = tempfile.mkdtemp(prefix="h", dir="/tmp")
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "TMPDIR": scratch,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "pylib.labs", "run", str(quick), str(stuck), "--out", str(out)],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    pid_file = tmp_path / "kernel.pid"
    deadline = time.monotonic() + 300
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    kernel = int(pid_file.read_text())
    proc.send_signal(sig)
    try:
        stdout, stderr = proc.communicate(timeout=60)
    finally:  # a harness that did not stop must not outlive this test (the next tests count leftover processes)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if _pid_alive(kernel):
            os.kill(kernel, signal.SIGKILL)
    assert proc.returncode == 128 + sig, stdout + stderr
    report = json.loads((out / "report.json").read_text())
    assert report["interrupted"] == sig.name and not report["passed"]
    assert [(r["lab"], r["status"]) for r in report["labs"]] == [("01_quick", "passed"), ("02_stuck", "interrupted")]
    stuck_result = report["labs"][1]
    assert [c["name"] for c in stuck_result["checks"]] == ["started"] and stuck_result["counts"]["not_run"] == 1
    assert "interrupted" in (out / "report.html").read_text()
    assert not _pid_alive(kernel), "the interrupted lab's kernel outlived the harness"
    assert not os.listdir(scratch), os.listdir(scratch)
    shutil.rmtree(scratch, ignore_errors=True)


def _quick_lab(tmp_path) -> Path:
    setup = ("from pylib.labs.checks import begin, check, summary\n\nbegin(checks_report)", [])
    return _fixture_lab(tmp_path / "01_quick.ipynb", [PARAMETERS, setup, ("summary()", [])])


def test_bad_harness_inputs_exit_2_naming_the_value_or_the_path(tmp_path, capsys):
    from pylib.labs.cli import main

    quick = _quick_lab(tmp_path)
    not_nb = tmp_path / "05_not_a_notebook.ipynb"
    not_nb.write_text('{"a": 1}')
    not_json = tmp_path / "06_not_json.ipynb"
    not_json.write_text("this is not JSON")
    out = str(tmp_path / "out")
    cases = [
        (["run", str(not_nb), "--out", out], f"{not_nb}: not a valid notebook"),
        (["run", str(not_json), "--out", out], f"{not_json}: not a valid notebook"),
        (["run", str(quick), "--timeout", "0", "--out", out], "--timeout must be a finite number of seconds > 0"),
        (["run", str(quick), "--timeout", "-5", "--out", out], "--timeout must be a finite number of seconds > 0"),
        (["run", str(quick), "-p", "world_size=two", "--out", out], "world_size is an int (default 2), not a str"),
        (["run", str(quick), "-p", "world_size=2.5", "--out", out], "world_size is an int (default 2), not a float"),
        (["run", str(quick), "-p", "world_size=0", "--out", out], "world_size must be a positive, finite number"),
        (["run", str(quick), "-p", "backend=True", "--out", out], "backend is a str (default 'gloo'), not a bool"),
        (["run", str(quick), "--out", "/proc/no/such/place"], "--out /proc/no/such/place: cannot write there"),
        (["lint", str(not_json)], f"{not_json}: not a valid notebook"),
    ]
    for argv, message in cases:
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse refuses its own arguments with exit 2
            rc = exc.code
        err = capsys.readouterr().err
        assert rc == 2 and message in err, (argv, rc, err)
    assert not (tmp_path / "out").exists()  # nothing ran


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has GPUs: the lab would run")
def test_nccl_asked_for_on_a_machine_without_gpus_is_blocked_not_failed(tmp_path, capsys):
    from pylib.labs.cli import main

    quick = _quick_lab(tmp_path)
    rc = main(["run", str(quick), "-p", "backend=nccl", "-p", "device=cuda", "--out", str(tmp_path / "out")])
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    lab = report["labs"][0]
    assert rc == 0 and lab["status"] == "blocked" and lab["counts"]["failed"] == 0
    assert "needs 2 CUDA GPUs, 0 visible" in lab["error"]["evalue"]
    assert "blocked" in capsys.readouterr().out


def _stopped_before_pylib_ran(returncode: int, stderr: str) -> bool:
    """The interpreter stopped before any line of pylib ran: killed by the signal's default action before Python
    installs its handler, "Fatal Python error: init_import_site" while it imports `site`, or a KeyboardInterrupt
    raised inside the import machinery while `runpy` looks for the package (a traceback whose frames are all the
    interpreter's own, `<frozen runpy>`: importlib's frames are left out of tracebacks)."""
    if "init_import_site" in stderr:
        return True
    if returncode != -signal.SIGINT:
        return False
    frames = re.findall(r'File "([^"]+)"', stderr)
    return not stderr.strip() or (
        stderr.rstrip().endswith("KeyboardInterrupt") and all(f.startswith("<frozen ") for f in frames)
    )


@pytest.mark.slow
def test_sigint_at_any_moment_of_a_lab_run_writes_the_report_and_exits_130(tmp_path):
    """From the first instants (the interpreter importing the harness, parsing its arguments) to a lab's kernel
    starting: every SIGINT ends the run with the report written and exit code 130, never a traceback (issue 35).
    Only the interpreter's own start-up, before the first line of pylib runs (~50 ms here), is out of reach."""
    stuck = _fixture_lab(
        tmp_path / "01_stuck.ipynb",
        [PARAMETERS, ("import time\n\ntime.sleep(600)", [])],
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    seen = []
    for delay in (0.0, 0.05, 0.15, 0.3, 0.6, 1.0, 2.0):
        out = tmp_path / f"out{delay}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "pylib.labs", "run", str(stuck), "--out", str(out)],
            cwd=ROOT,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        try:
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        if _stopped_before_pylib_ran(proc.returncode, stderr):
            seen.append((delay, "interpreter start-up"))
            continue
        assert proc.returncode == 130, (delay, stdout + stderr)
        assert "Traceback" not in stderr, (delay, stderr)
        report = json.loads((out / "report.json").read_text())
        assert report["interrupted"] == "SIGINT" and not report["passed"], delay
        seen.append((delay, [r["status"] for r in report["labs"]] or report["not_started"]))
    assert sum(isinstance(s, list) for _, s in seen) >= 5, seen
