"""What students launch holds no solutions: each lab is stored as its learner notebook (labs/NN_name.ipynb, what a
launch link clones and opens) plus labs/solutions/NN_name.json, which the harness puts back for CI and the book's
build. The two are kept in sync: the learner notebook plus its solutions is the solved lab, every solution follows
its exercise, and splitting the solved lab again gives back both files byte for byte."""

import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from pylib.labs import solutions
from pylib.labs.cli import main
from pylib.labs.files import Lab, find_labs
from pylib.labs.notebook import lab_problems, learner_version, parameters, tags

ROOT = Path(__file__).resolve().parent.parent
LABS = find_labs()
PAGE = ROOT / "book" / "labs" / "index.md"


@pytest.mark.parametrize("lab", LABS, ids=[lab.name for lab in LABS])
def test_the_notebook_a_launch_link_opens_holds_no_solution(lab):
    stored = lab.read_stored()
    assert not [c for c in stored.cells if "solution" in tags(c)]
    assert not [c for c in stored.cells if c.source.lstrip().startswith("if solution:")]
    assert parameters(stored)["solution"] is False
    assert stored.metadata["pylib_lab"] == {"version": "learner"}
    text = nbformat.writes(stored)
    hidden = [e["cell"]["source"] for e in solutions.read(solutions.path_for(lab.path))["cells"]]
    assert hidden and not [s for s in hidden if "".join(s) in text]


@pytest.mark.parametrize("lab", LABS, ids=[lab.name for lab in LABS])
def test_learner_notebook_plus_its_solutions_is_the_solved_lab(lab):
    solved = lab.read()
    assert solutions.sync_problems(lab.path) == [] and lab_problems(lab.path) == []
    assert parameters(solved)["solution"] is True
    for i, cell in enumerate(solved.cells):  # every exercise is followed by its solution, every solution by its own
        if "exercise" in tags(cell):
            assert "solution" in tags(solved.cells[i + 1]), f"{lab.name}: exercise cell {i} has no solution"
        if "solution" in tags(cell):
            assert "exercise" in tags(solved.cells[i - 1]), f"{lab.name}: solution cell {i} follows no exercise"
    assert nbformat.writes(learner_version(solved)) == nbformat.writes(lab.read_stored())


def test_the_labs_page_launches_and_links_the_learner_notebooks():
    launched = re.findall(r'data-lab="(labs/[\w.-]+\.ipynb)"', PAGE.read_text())
    assert launched == [f"labs/{lab.path.name}" for lab in LABS]
    for path in launched:
        assert nbformat.read(ROOT / path, as_version=4).metadata["pylib_lab"] == {"version": "learner"}


def _copy_lab(folder: Path, name="00_collectives") -> Path:
    """The repository's lab `name`, both files, copied to `folder`."""
    (folder / "solutions").mkdir(parents=True)
    shutil.copy(ROOT / "labs" / f"{name}.ipynb", folder / f"{name}.ipynb")
    shutil.copy(ROOT / "labs" / "solutions" / f"{name}.json", folder / "solutions" / f"{name}.json")
    return folder / f"{name}.ipynb"


def test_sync_names_a_solution_whose_exercise_is_gone(tmp_path):
    path = _copy_lab(tmp_path)
    data = json.loads(solutions.path_for(path).read_text())
    data["cells"][0]["after"] = "no-such-cell"
    solutions.path_for(path).write_text(json.dumps(data))
    (problem,) = lab_problems(path)[:1]
    assert "no-such-cell" in problem and "does not have" in problem


def test_sync_names_a_solution_left_in_the_learner_notebook_and_one_after_a_non_exercise(tmp_path):
    path = _copy_lab(tmp_path / "a")
    solved = Lab(path).read()
    nbformat.write(solved, path)  # the solved lab stored where the learner notebook belongs, solutions file still there
    assert any("already has cells tagged 'solution'" in p for p in solutions.sync_problems(path))
    path = _copy_lab(tmp_path / "b")
    data = json.loads(solutions.path_for(path).read_text())
    stored = nbformat.read(path, as_version=4)
    data["cells"][0]["after"] = stored.cells[0].id  # the title, not an exercise
    solutions.path_for(path).write_text(json.dumps(data))
    assert any("not an exercise cell" in p for p in solutions.sync_problems(path))


def test_sync_names_a_learner_notebook_that_says_solution_true(tmp_path):
    path = _copy_lab(tmp_path)
    nb = nbformat.read(path, as_version=4)
    i = next(i for i, c in enumerate(nb.cells) if "parameters" in tags(c))
    nb.cells[i].source = nb.cells[i].source.replace("solution = False", "solution = True")
    nbformat.write(nb, path)
    assert any("must say `solution = False`" in p for p in solutions.sync_problems(path))


def test_new_writes_a_learner_notebook_and_solutions_and_split_gives_them_back(tmp_path, capsys):
    labs = tmp_path / "labs"
    assert main(["new", str(labs / "08_my_topic.ipynb")]) == 0
    stored = (labs / "08_my_topic.ipynb").read_text()
    kept = (labs / "solutions" / "08_my_topic.json").read_text()
    assert lab_problems(labs / "08_my_topic.ipynb") == []
    assert main(["learner", str(tmp_path / "solved"), "--solved", "--labs-dir", str(labs)]) == 0
    assert any("solution" in tags(c) for c in nbformat.read(tmp_path / "solved" / "08_my_topic.ipynb", 4).cells)
    (labs / "08_my_topic.ipynb").unlink()
    (labs / "solutions" / "08_my_topic.json").unlink()
    assert main(["split", str(tmp_path / "solved" / "08_my_topic.ipynb"), "--labs-dir", str(labs)]) == 0
    assert (labs / "08_my_topic.ipynb").read_text() == stored
    assert (labs / "solutions" / "08_my_topic.json").read_text() == kept


def test_split_refuses_a_notebook_without_solutions(tmp_path, capsys):
    learner = _copy_lab(tmp_path / "x")
    assert main(["split", str(learner), "--labs-dir", str(tmp_path)]) == 2
    assert "no cell tagged 'solution'" in capsys.readouterr().err
