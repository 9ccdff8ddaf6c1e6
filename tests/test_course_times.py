"""What the instructor page (book/labs/instructor.md) shows: labs/times.json, measured by the harness, covers exactly
the labs there are, with the machine named; each lab's hardware profile is read from the lab itself (its ranks and
the needs of its GPU checks); `times` refuses reports it cannot trust."""

import copy
import json
from pathlib import Path

import pytest

from pylib.labs import course
from pylib.labs.cli import main
from pylib.labs.files import find_labs
from pylib.viz import lab_times

ROOT = Path(__file__).resolve().parent.parent
LABS = find_labs()


def test_the_committed_times_cover_every_lab_and_name_the_machine():
    times = course.read_times()
    assert sorted(times["labs"]) == [lab.name for lab in LABS]  # a new lab: measure, then `... times`
    assert set(times["machine"]) >= {"platform", "cpus", "torch", "load_average_1min"}
    for name, t in times["labs"].items():
        assert 0 < t["learner_seconds"] and 0 < t["solution_seconds"], name
        assert t["checks"] >= 5, name


def test_each_labs_profile_is_read_from_the_lab():
    profiles = course.lab_profiles()
    assert profiles["00_collectives"] == {"ranks": 4, "gpu_checks": ["gpu:4"]}
    assert profiles["07_capstone"]["ranks"] == 8 and profiles["03_context_parallel"]["ranks"] == 2
    assert sum(bool(p["gpu_checks"]) for p in profiles.values()) == 1
    table = lab_times.course_table(course.read_times(), profiles)
    assert table.count("\n| `") == len(LABS) and ":name: tbl-labs-times" in table


def _report(mode: str, passed: bool = True) -> dict:
    lab = dict(lab="00_collectives", seconds=12.34, parameters={}, counts=dict(passed=10, failed=0, blocked=1))
    machine = dict(platform="Linux", cpus=2, python="3.11", torch="2.13.0+cpu", cuda_gpus=0)
    return dict(mode=mode, passed=passed, started="2026-12-07T08:00:00", machine=machine, labs=[lab], overrides={})


def test_record_times_keeps_seconds_and_checks_and_refuses_what_it_cannot_trust():
    times = course.record_times(_report("solution"), _report("learner", passed=False))
    assert times["labs"]["00_collectives"] == dict(solution_seconds=12.3, learner_seconds=12.3, checks=11, blocked=1)
    assert times["measured"] == "2026-12-07" and times["machine"]["cpus"] == 2
    with pytest.raises(ValueError, match="did not pass"):
        course.record_times(_report("solution", passed=False), _report("learner"))
    with pytest.raises(ValueError, match="solution-mode report and a learner-mode"):
        course.record_times(_report("learner"), _report("solution"))
    other = copy.deepcopy(_report("learner"))
    other["labs"][0]["lab"] = "01_tensor_parallel"
    with pytest.raises(ValueError, match="different labs"):
        course.record_times(_report("solution"), other)


def test_times_command_writes_the_file_from_the_last_runs(tmp_path, capsys):
    for mode in ("solution", "learner"):
        (tmp_path / "_runs" / mode).mkdir(parents=True)
        (tmp_path / "_runs" / mode / "report.json").write_text(json.dumps(_report(mode)))
    assert main(["times", "--labs-dir", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "times.json").read_text())["labs"]["00_collectives"]["checks"] == 11
    assert main(["times", "--labs-dir", str(tmp_path / "nowhere")]) == 2
    assert "run --all and run --all --learner first" in capsys.readouterr().err
