"""nbgrader interop: `python -m pylib.labs nbgrader OUT/` writes each lab as an nbgrader source notebook (solution
regions between the markers, each check cell an autograder test cell worth its gradable checks, the rest locked),
and nbgrader itself releases and autogrades it: a solved submission gets full marks, a half-done one partial marks,
an untouched one what its unsolved checks earn (none in lab 00, the suspect's passing tests in lab 90).

nbgrader is not in the labs' install (it brings JupyterLab and a database layer): `make nbgrader-setup` puts it in
its own venv, .venv-nbgrader, and `make nbgrader-test` runs the end-to-end test with it, naming the venv in
NBGRADER_VENV (the kernel that grades is this repository's .venv, which has torch and pylib, as a hub's user
environment does). Without it the end-to-end test is skipped, naming the command (it takes about a minute: two labs
released, five submissions autograded); the export's own tests always run."""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from pylib.labs import checks
from pylib.labs.files import find_labs, select_labs
from pylib.labs.nbgrader import export, nbgrader_notebook
from pylib.labs.notebook import EXERCISE_NUMBER, tags

ROOT = Path(__file__).resolve().parent.parent
LABS = find_labs()
NBGRADER_VENV = Path(os.environ["NBGRADER_VENV"]) if os.environ.get("NBGRADER_VENV") else None  # make nbgrader-test
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


def _grader(cell) -> dict:
    return cell.metadata["nbgrader"]


@pytest.mark.parametrize("lab", LABS, ids=[lab.name for lab in LABS])
def test_each_lab_exports_as_an_nbgrader_source_notebook(lab):
    nb = nbgrader_notebook(lab)
    solved = lab.read()
    exercises = [c for c in solved.cells if "exercise" in tags(c)]
    answers = [c for c in nb.cells if _grader(c)["solution"]]
    assert len(answers) == len(exercises) and all(c.source.count(BEGIN) == c.source.count(END) == 1 for c in answers)
    assert not any("if solution:" in c.source for c in nb.cells)  # the solutions sit between the markers
    numbers = sorted({int(n) for c in answers for n in EXERCISE_NUMBER.findall(c.source.split(BEGIN)[0])})
    assert numbers == list(range(1, len(numbers) + 1))  # each answer cell keeps its exercise's placeholder
    tests = [c for c in nb.cells if _grader(c)["grade"]]
    assert tests and all(_grader(c)["locked"] and not _grader(c)["solution"] for c in tests)
    for cell in tests:
        points = int(re.search(r"^cell_points\((\d+)\)", cell.source, re.M).group(1))
        assert _grader(cell)["points"] == points > 0
    assert all(_grader(c)["locked"] for c in nb.cells if not _grader(c)["solution"])
    ids = [_grader(c)["grade_id"] for c in nb.cells]
    assert len(set(ids)) == len(ids) and all(_grader(c)["schema_version"] == 3 for c in nb.cells)


def test_a_check_that_needs_a_gpu_is_locked_but_not_graded():
    nb = nbgrader_notebook(select_labs(["00"])[0])
    gpu = [c for c in nb.cells if 'needs=f"gpu:' in c.source]
    assert gpu and all(not _grader(c)["grade"] and _grader(c)["locked"] for c in gpu)


def test_cell_points_is_the_share_of_the_cells_runnable_checks_that_passed(capsys):
    checks.begin(None)
    checks.check("runs", True)
    checks.check("wrong", False)
    checks.check("right", lambda: None)
    checks.check("on 4096 GPUs", True, needs="gpu:4096")  # blocked here: neither earns nor costs
    assert checks.cell_points(3) == 2.0
    checks.begin(None)
    checks.check("on 4096 GPUs", True, needs="gpu:4096")
    assert checks.cell_points(5) == 0.0


def test_export_writes_a_course_folder(tmp_path):
    paths = export(select_labs(["00", "90"]), tmp_path / "course")
    assert paths == [
        tmp_path / "course" / "source" / n / f"{n}.ipynb" for n in ("00_collectives", "90_find_the_bug_tp")
    ]
    config = (tmp_path / "course" / "nbgrader_config.py").read_text()
    assert "ClearSolutions.code_stub" in config and str((tmp_path / "course").resolve()) in config


def _nbgrader(course: Path, *args: str) -> str:
    kernels = course.parent / "jupyter" / "kernels" / "python3"  # the kernel that grades: this .venv, this pylib
    kernels.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec = {"argv": argv, "display_name": "labs", "language": "python", "env": {"PYTHONPATH": str(ROOT)}}
    (kernels / "kernel.json").write_text(json.dumps(spec))
    env = {
        **os.environ,
        "PATH": f"{NBGRADER_VENV / 'bin'}{os.pathsep}{os.environ['PATH']}",  # nbgrader runs `alembic` from its venv
        "JUPYTER_PATH": str(course.parent / "jupyter"),
    }
    done = subprocess.run(
        [str(NBGRADER_VENV / "bin" / "nbgrader"), *args], cwd=course, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def _half_done(source: Path) -> nbformat.NotebookNode:
    """The solved notebook with its first exercise's solution taken out again (the stub nbgrader releases)."""
    nb = nbformat.read(source, as_version=4)
    cell = next(c for c in nb.cells if c.metadata["nbgrader"]["solution"])
    head, rest = cell.source.split(BEGIN, 1)
    cell.source = head + "pass" + rest.split(END, 1)[1]
    return nb


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(
    NBGRADER_VENV is None or not (NBGRADER_VENV / ".installed").exists(), reason="needs nbgrader: make nbgrader-test"
)
def test_nbgrader_releases_and_autogrades_two_labs_with_full_and_partial_marks(tmp_path):
    course = tmp_path / "course"
    names = ["00_collectives", "90_find_the_bug_tp"]
    export(select_labs(names), course)
    for name in names:
        _nbgrader(course, "generate_assignment", name, "--force")
        release = course / "release" / name / f"{name}.ipynb"
        assert BEGIN not in release.read_text() and "YOUR CODE HERE" in release.read_text()
        source = course / "source" / name / f"{name}.ipynb"
        students = {"solved": nbformat.read(source, as_version=4), "blank": nbformat.read(release, as_version=4)}
        if name == "00_collectives":  # three exercises: one left undone
            students["half"] = _half_done(source)
        for student, nb in students.items():
            (course / "submitted" / student / name).mkdir(parents=True)
            nbformat.write(nb, course / "submitted" / student / name / f"{name}.ipynb")
        _nbgrader(course, "autograde", name)
    _nbgrader(course, "export")
    with open(course / "grades.csv") as f:
        scores = {
            (r["assignment"], r["student_id"]): (float(r["score"]), float(r["max_score"])) for r in csv.DictReader(f)
        }
    print(scores)
    for name in names:
        score, most = scores[(name, "solved")]
        assert score == most > 0, (name, scores)
    most = scores[("00_collectives", "solved")][1]
    assert 0 < scores[("00_collectives", "half")][0] < most, scores  # two exercises of three: partial marks
    assert scores[("00_collectives", "blank")][0] == 0, scores  # every check of lab 00 waits on an exercise
    most = scores[("90_find_the_bug_tp", "solved")][1]
    assert 0 < scores[("90_find_the_bug_tp", "blank")][0] < most, scores  # the suspect passes its own tests
    shutil.rmtree(course / "autograded", ignore_errors=True)
