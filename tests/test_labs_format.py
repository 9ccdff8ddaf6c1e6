"""Every lab follows the lab format (labs/README.md): stored stripped, a parameters cell with the required names,
exercises paired with solutions, begin/summary; the learner version carries no solution; the linter can fail."""

import argparse
import copy
import logging

import nbformat
import pytest

from pylib.labs.cli import parse_override
from pylib.labs.files import default_labs_dir, find_labs, select_labs
from pylib.labs.notebook import (
    EXERCISE_NUMBER,
    REQUIRED_PARAMETERS,
    lab_problems,
    learner_version,
    new_lab,
    parameters,
    tags,
    write_learner_versions,
)
from pylib.labs.runner import resolve_overrides

LABS = find_labs()


def test_the_repository_has_labs():
    names = [lab.name for lab in LABS]
    assert {"00_collectives", "01_tensor_parallel", "90_find_the_bug_tp"} <= set(names), names


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.name)
def test_lab_follows_the_lab_format(lab):
    assert lab_problems(lab.path) == []


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.name)
def test_lab_is_stored_with_outputs_stripped(lab):
    dirty = [i for i, c in enumerate(lab.read().cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert dirty == [], f"{lab.name}: cells {dirty} carry outputs (python -m pylib.labs lint --strip)"


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.name)
def test_lab_parameters_cell_has_the_required_names_and_solution_on(lab):
    params = parameters(lab.read())
    assert set(REQUIRED_PARAMETERS) <= set(params), sorted(params)
    assert params["solution"] is True and params["checks_report"] is None
    assert params["backend"] in ("gloo", "nccl") and params["device"] in ("cpu", "cuda")
    assert isinstance(params["world_size"], int) and params["world_size"] >= 2


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.name)
def test_learner_version_has_every_exercise_and_no_solution(lab):
    source = lab.read()
    learner = learner_version(source)
    solutions = [c.source for c in source.cells if "solution" in tags(c)]
    assert solutions, "the source lab carries its solutions"
    assert not any("solution" in tags(c) for c in learner.cells)
    assert not any(c.source.startswith("if solution:") for c in learner.cells)
    exercises = [c.source for c in source.cells if "exercise" in tags(c)]
    assert [c.source for c in learner.cells if "exercise" in tags(c)] == exercises
    assert parameters(learner)["solution"] is False
    assert len(learner.cells) == len(source.cells) - len(solutions)


def test_lab_problems_reports_each_broken_rule(tmp_path):
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('world_size = 2\nb, s = 2, 4\ndevice = "cpu"  # device="cuda"\nsolution = False')
    params.metadata["tags"] = ["parameters"]
    stray = nbformat.v4.new_code_cell("if solution:\n    pass")
    stray.metadata["tags"] = ["solution"]
    ran = nbformat.v4.new_code_cell("x = 1")
    ran.outputs = [nbformat.v4.new_output("stream", text="1\n")]
    nb.cells = [params, stray, ran]
    path = tmp_path / "7_Bad-Name.ipynb"
    nbformat.write(nb, path)
    text = "\n".join(lab_problems(path))
    for expected in (
        "NN_name.ipynb",
        "carry outputs",
        "only `name = literal` assignments",
        "line 3: one '=' per line",
        "lacks ['backend', 'checks_report']",
        "solution cell 1 must come right after an exercise cell",
        "at least one exercise cell",
        "begin(checks_report)",
        "summary()",
    ):
        assert expected in text, f"{expected!r} not reported in:\n{text}"


def test_new_lab_skeleton_follows_the_format(tmp_path):
    path = new_lab(tmp_path / "07_my_topic.ipynb")
    assert lab_problems(path) == []
    with pytest.raises(FileExistsError):
        new_lab(path)
    with pytest.raises(ValueError, match="NN_name"):
        new_lab(tmp_path / "my topic.ipynb")


def _papermill_inspect(nb, caplog) -> tuple[list[str], list[str]]:
    """(names papermill's own parameter parser finds in the parameters cell, the warnings it logged)."""
    from papermill.translators import PythonTranslator

    cell = nb.cells[[i for i, c in enumerate(nb.cells) if "parameters" in tags(c)][0]]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="papermill"):
        found = [p.name for p in PythonTranslator.inspect(cell)]
    return found, [r.getMessage() for r in caplog.records]


def test_skeleton_and_every_lab_parameters_cell_parse_in_papermill_without_warnings(tmp_path, caplog):
    """papermill's parser skips, with "Unable to parse line n", a line holding two '=' (one in a comment)."""
    skeleton = nbformat.read(new_lab(tmp_path / "07_my_topic.ipynb"), as_version=4)
    for name, nb in [("skeleton", skeleton)] + [(lab.name, lab.read()) for lab in LABS]:
        found, warnings = _papermill_inspect(nb, caplog)
        assert warnings == [], (name, warnings)
        assert found == list(parameters(nb)), name
    broken = copy.deepcopy(skeleton)
    cell = next(c for c in broken.cells if "parameters" in tags(c))
    cell.source = cell.source.replace('"cpu"  # "cpu"', '"cpu"  # device="cpu"')
    found, warnings = _papermill_inspect(broken, caplog)
    assert "device" not in found and any("Unable to parse line 3" in w for w in warnings), warnings


def test_select_labs_by_number_name_short_name_and_path():
    first = LABS[0]
    for name in (first.name, first.name[:2], first.name[3:], str(first.path)):
        assert [lab.name for lab in select_labs([name])] == [first.name]
    with pytest.raises(ValueError, match="no lab matches 'nonexistent'"):
        select_labs(["nonexistent"])
    assert default_labs_dir() == first.path.parent


def test_write_learner_versions_writes_each_lab(tmp_path):
    written = write_learner_versions(LABS, tmp_path / "course")
    assert [p.name for p in written] == [lab.path.name for lab in LABS]
    for path, lab in zip(written, LABS):
        nb = nbformat.read(path, as_version=4)
        numbers = {int(n) for c in nb.cells for n in EXERCISE_NUMBER.findall(c.source)}
        assert numbers, f"{lab.name}'s learner version has no exercise placeholder"
        assert parameters(nb)["solution"] is False


def test_parameter_overrides_parse_as_literals_or_strings():
    assert parse_override("world_size=4") == ("world_size", 4)
    assert parse_override("backend=nccl") == ("backend", "nccl")
    assert parse_override("lr=0.5") == ("lr", 0.5)
    assert parse_override("device='cuda'") == ("device", "cuda")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_override("world_size")


def test_overrides_go_to_the_labs_that_declare_them_and_typos_are_rejected():
    per_lab = resolve_overrides(LABS, {"world_size": 2, "h_ffn": 128})
    for lab in LABS:
        declared = set(parameters(lab.read()))
        assert per_lab[lab.name] == {k: v for k, v in {"world_size": 2, "h_ffn": 128}.items() if k in declared}
    with pytest.raises(ValueError, match=r"no selected lab has parameter\(s\) \['wrold_size'\]"):
        resolve_overrides(LABS, {"wrold_size": 2})
    with pytest.raises(ValueError, match="--learner"):
        resolve_overrides(LABS, {"solution": False})


def test_backend_and_device_must_go_together_nccl_with_cuda_and_gloo_with_cpu():
    assert resolve_overrides(LABS, {"backend": "nccl", "device": "cuda"})  # the instructors' GPU command
    assert resolve_overrides(LABS, {})  # every lab's defaults: gloo on the CPU
    with pytest.raises(
        ValueError, match=r"backend='nccl' runs its ranks on 'cuda', not device='cpu': pass -p device=cuda"
    ):
        resolve_overrides(LABS, {"backend": "nccl"})
    with pytest.raises(ValueError, match=r"pass -p device=cpu \(or -p backend=nccl\)"):
        resolve_overrides(LABS, {"device": "cuda"})
    with pytest.raises(ValueError, match="must be 'gloo' or 'nccl'"):
        resolve_overrides(LABS, {"backend": "mpi"})
