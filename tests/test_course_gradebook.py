"""The gradebook: `python -m pylib.labs grade SUBMISSIONS/` runs every student's notebooks with a time limit and writes
one CSV and one HTML table, whatever a notebook does: a finished lab passes (its GPU check blocked on this CPU
machine), an unfinished one names the exercise not done, a cell that loops is stopped at the limit, a kernel that
exits ends only its own notebook, a file written outside the notebook's folder lands in its temporary copy (never
beside the submissions), a notebook that is not one is a row with the reason, and HTML in a message is escaped.

Tiny notebooks with a 2 s limit (from the first cell), graded in one run of the command."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
PARAMETERS = "solution = False\nchecks_report = None"
SETUP = "from pylib.labs.checks import ExerciseNotDone, begin, check, step, summary\n\nbegin(checks_report)"
NOTEBOOKS = {
    "alice/01_tiny.ipynb": [
        'check("one plus one", 1 + 1 == 2)',
        'check("the same on 2 GPUs", True, needs="gpu:2")',
    ],
    "bob/01_tiny.ipynb": [
        'def answer():\n    raise ExerciseNotDone(1, "return 42")',
        'check("the answer", lambda: answer() == 42)',
    ],
    "carol/01_tiny.ipynb": ['check("before the loop", True)', "while True:\n    pass"],
    "dave/01_tiny.ipynb": ["import os\n\nos._exit(0)", 'check("after the exit", True)'],
    "erin/01_tiny.ipynb": [
        'open("../escaped.txt", "w").write("out")\nopen("here.txt", "w").write("in")',
        'check("<script>alert(1)</script>", False)',
    ],
}


def _notebook(path: Path, cells: list[str]) -> None:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(PARAMETERS)
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(SETUP)] + [nbformat.v4.new_code_cell(c) for c in cells]
    nb.cells.append(nbformat.v4.new_code_cell("summary()"))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grade")
    submissions = tmp / "submitted"
    for name, cells in NOTEBOOKS.items():
        _notebook(submissions / name, cells)
    (submissions / "frank").mkdir()
    (submissions / "frank" / "01_tiny.ipynb").write_text("{ not a notebook")
    before = sorted(p.relative_to(tmp) for p in tmp.rglob("*"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "pylib.labs", "grade", str(submissions), "--out", str(tmp / "book"), "--timeout", "2"],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    with open(tmp / "book" / "gradebook.csv") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    after = sorted(p.relative_to(tmp) for p in tmp.rglob("*") if "book" not in p.relative_to(tmp).parts)
    return dict(done=done, rows=rows, html=(tmp / "book" / "gradebook.html").read_text(), before=before, after=after)


pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def test_every_submission_is_one_row_and_the_command_succeeds(graded):
    assert graded["done"].returncode == 0, graded["done"].stdout + graded["done"].stderr
    assert sorted(graded["rows"]) == ["alice", "bob", "carol", "dave", "erin", "frank"]
    assert "1 of 6 notebook(s) passed" in graded["done"].stdout


def test_a_finished_lab_passes_with_its_gpu_check_blocked(graded):
    alice = graded["rows"]["alice"]
    assert (alice["status"], alice["passed"], alice["failed"], alice["blocked"]) == ("passed", "1", "0", "1")
    assert alice["reason"] == "" and float(alice["seconds"]) > 0


def test_an_unfinished_lab_names_the_exercise_not_done(graded):
    bob = graded["rows"]["bob"]
    assert bob["status"] == "failed" and bob["failed"] == "1"
    assert bob["reason"] == "Exercise 1 not done yet: return 42"


def test_a_cell_that_loops_is_stopped_at_the_limit(graded):
    carol = graded["rows"]["carol"]
    assert carol["status"] == "timeout" and carol["passed"] == "1", carol
    assert "timeout of 2 s" in carol["reason"] and float(carol["seconds"]) < 60


def test_a_kernel_that_exits_ends_only_its_own_notebook(graded):
    dave = graded["rows"]["dave"]
    assert dave["status"] == "failed" and dave["not_run"] == "1", dave
    assert "DeadKernelError" in dave["reason"] or "died" in dave["reason"], dave
    assert graded["rows"]["erin"]["status"] == "failed"  # the next student still ran


def test_files_written_by_a_notebook_stay_in_its_temporary_copy(graded):
    assert graded["after"] == graded["before"]  # nothing new beside or inside the submissions
    erin = graded["rows"]["erin"]
    assert erin["failed"] == "1" and erin["reason"].startswith("<script>")  # the cell that wrote ran


def test_a_notebook_that_is_not_one_is_a_row_with_its_reason(graded):
    frank = graded["rows"]["frank"]
    assert frank["status"] == "failed" and "not a notebook" in frank["reason"]


def test_the_html_table_escapes_what_notebooks_say(graded):
    page = graded["html"]
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count("<tr") == 1 + len(graded["rows"])
