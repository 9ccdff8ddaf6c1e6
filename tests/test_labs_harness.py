"""The harness end to end, through its command line: every lab passes solved, every learner version fails its checks
with "not done yet", the report has its documented shape, a GPU check is blocked on CPU, and a rank that raises or a
lab that hangs fails the run naming the lab, the cell and the rank.

The four harness runs start together in one fixture (they mostly wait on kernels importing torch), so the module
costs about as long as its slowest run.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from pylib.labs.notebook import EXERCISE_NUMBER, find_labs, tags

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
            ("summary()", []),
        ],
    )
    slow_lab = _fixture_lab(
        tmp / "03_hangs.ipynb",
        [PARAMETERS, ("import time\n\ntime.sleep(600)", []), ("summary()", [])],
    )
    commands = {
        "solution": ["run", "--all", "--out", str(tmp / "solution")],
        "learner": ["run", "--all", "--learner", "--out", str(tmp / "learner")],
        "rank": ["run", str(rank_lab), "--out", str(tmp / "rank")],
        "timeout": ["run", str(slow_lab), "--timeout", "40", "--out", str(tmp / "timeout")],
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
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


def test_report_json_has_the_documented_shape(runs):
    report = runs["solution"]["report"]
    assert report["schema"] == "pylib.labs.report/1"
    assert set(report) >= {"schema", "mode", "passed", "started", "seconds", "overrides", "machine", "totals", "labs"}
    assert set(report["machine"]) >= {"python", "executable", "torch", "platform", "cpus", "cuda_gpus"}
    assert report["totals"]["labs"] == len(report["labs"]) == report["totals"]["labs_passed"]
    totals = {s: sum(lab["counts"][s] for lab in report["labs"]) for s in ("passed", "failed", "blocked")}
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
            cells = nbformat.read(lab["path"], as_version=4).cells  # solution mode ran the source lab
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


def test_a_lab_past_its_timeout_is_stopped_and_reported(runs):
    run = runs["timeout"]
    assert run["rc"] == 1, run["stdout"] + run["stderr"]
    lab = run["report"]["labs"][0]
    assert lab["status"] == "timeout" and lab["seconds"] < 120  # 40 s deadline, generous under load
    assert lab["error"]["cell"] == 1 and "timeout of 40 s" in lab["error"]["evalue"]
    assert "03_hangs" in run["stderr"] and "time.sleep(600)" in run["stderr"]
