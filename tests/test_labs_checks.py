"""The check API used inside lab notebooks: pass / fail / blocked, steps and their dependants, the JSON lines the
harness reads, and failure messages that name the rank and the unfinished exercise."""

import json

import pytest
import torch
import torch.distributed as dist

from pylib.i18n import set_language
from pylib.labs import checks
from pylib.labs.checks import ChecksFailed, ExerciseNotDone, assert_close, begin, check, step, summary
from pylib.runtime import launch


@pytest.fixture
def report(tmp_path):
    path = tmp_path / "checks.jsonl"
    begin(path)
    yield path
    begin(None)


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_checks_record_pass_and_fail_as_json_lines_and_print_marks(report, capsys):
    assert check("truthy value", 1 + 1 == 2) is True
    assert check("callable returning None", lambda: None) is True
    assert check("false value", False, detail="two is not three") is False
    assert check("callable raising", lambda: 1 / 0) is False
    lines = _lines(report)
    assert lines[0]["kind"] == "begin" and "cuda_gpus" in lines[0]
    recs = {r["name"]: r for r in lines[1:]}
    assert [recs[n]["status"] for n in recs] == ["passed", "passed", "failed", "failed"]
    assert recs["false value"]["message"] == "two is not three"
    assert recs["callable raising"]["message"].startswith("ZeroDivisionError")
    assert "Traceback" in recs["callable raising"]["detail"]
    out = capsys.readouterr().out
    assert "✓ truthy value" in out and "✗ false value" in out and "two is not three" in out


def test_check_as_decorator_runs_the_function_once_as_the_check(report):
    calls = []

    @check("decorated")
    def _():
        calls.append(1)
        assert 2 + 2 == 5, "arithmetic is broken"

    assert calls == [1]
    rec = checks.results()[-1]
    assert (rec["name"], rec["status"]) == ("decorated", "failed")
    assert rec["message"].startswith("arithmetic is broken")  # pytest's assertion rewriting may add the expression


def test_check_that_needs_gpus_is_blocked_without_them_and_runs_with_them(report, monkeypatch):
    ran = []
    monkeypatch.setattr(checks, "gpu_count", lambda: 0)
    assert check("needs one GPU", lambda: ran.append("one"), needs="gpu") is None
    assert check("needs four GPUs", lambda: ran.append("four"), needs="gpu:4") is None
    assert ran == []
    recs = {r["name"]: r for r in checks.results()}
    assert recs["needs one GPU"]["status"] == "blocked"
    assert recs["needs four GPUs"]["message"] == "needs 4 CUDA GPUs, 0 visible on this machine"
    monkeypatch.setattr(checks, "gpu_count", lambda: 4)
    assert check("needs four GPUs", lambda: ran.append("four"), needs="gpu:4") is True
    assert ran == ["four"]
    with pytest.raises(ValueError, match="unknown need"):
        check("bad need", True, needs="tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_gpu_check_is_blocked_on_this_cpu_machine(report):
    assert check("real GPU check", lambda: torch.ones(1, device="cuda"), needs="gpu") is None
    assert checks.results()[-1]["status"] == "blocked"


def test_failed_step_fails_its_dependants_naming_the_step(report):
    value = step("produce", lambda: {"x": 1})
    assert value == {"x": 1}
    broken = step("broken step", lambda: [][0])
    assert not broken
    assert check("uses the broken step", lambda: broken[0] == 1) is False
    rec = checks.results()[-1]
    assert rec["message"].startswith("needs step 'broken step', which failed: IndexError")


def test_blocked_step_blocks_its_dependants(report, monkeypatch):
    monkeypatch.setattr(checks, "gpu_count", lambda: 0)
    on_gpu = step("gpu step", lambda: 1, needs="gpu")
    assert check("uses the gpu step", lambda: on_gpu["y"]) is None
    assert [r["status"] for r in checks.results()] == ["blocked", "blocked"]


def _unfinished_exercise_on_rank_one():
    if dist.get_rank() == 1:
        raise ExerciseNotDone(3, "write the backward")
    dist.barrier()
    return dist.get_rank()


def test_failure_inside_a_rank_names_the_rank_and_the_unfinished_exercise(report):
    out = step("two ranks", lambda: launch(_unfinished_exercise_on_rank_one, 2, backend="gloo", timeout=30))
    assert not out
    rec = checks.results()[-1]
    assert rec["status"] == "failed" and rec["rank"] == 1
    assert rec["message"] == "rank 1: pylib.labs.checks.ExerciseNotDone: Exercise 3 not done yet: write the backward"
    assert "rank 1 failed first" in rec["detail"] and "Traceback" in rec["detail"]


def test_rerunning_a_check_replaces_its_result(report):
    check("flaky", False)
    check("flaky", True)
    assert [(r["name"], r["status"]) for r in checks.results()] == [("flaky", "passed")]
    assert summary() == {"passed": 1, "failed": 0, "blocked": 0}


def test_summary_raises_naming_every_failed_check_and_passes_with_only_blocked(report, monkeypatch):
    monkeypatch.setattr(checks, "gpu_count", lambda: 0)
    check("fine", True)
    check("on a GPU", True, needs="gpu")
    assert summary() == {"passed": 1, "failed": 0, "blocked": 1}
    check("wrong", False)
    with pytest.raises(ChecksFailed, match=r"1 of 3 checks failed:\n  ✗ wrong"):
        summary()


def test_summary_without_any_check_fails(report):
    with pytest.raises(ChecksFailed, match="no check ran"):
        summary()


def test_exercise_placeholder_message():
    with pytest.raises(ExerciseNotDone, match=r"^Exercise 2 not done yet: shard the weights$"):
        raise ExerciseNotDone(2, "shard the weights")


def test_exercise_placeholder_message_is_chinese_under_zh():
    set_language("zh")
    try:
        message = str(ExerciseNotDone(2, "shard the weights"))
    finally:
        set_language(None)
    assert "尚未完成" in message and "not done yet" not in message, message


def test_assert_close_names_what_differs_and_where():
    a = torch.zeros(2, 3, dtype=torch.float64)
    assert_close(a, a.clone(), "same")
    b = a.clone()
    b[1, 2] = 1e-6
    with pytest.raises(AssertionError, match=r"rank 1's dx: max \|difference\| 1e-06 at index \(1, 2\)"):
        assert_close(b, a, "rank 1's dx")
    with pytest.raises(AssertionError, match=r"shape \(3,\), expected \(2, 3\)"):
        assert_close(torch.zeros(3), a, "y")
    assert_close(b, a, "loose", atol=1e-5)


def test_a_rank_that_died_is_explained_by_its_reason_not_its_last_output_line():
    from pylib.labs.checks import explain
    from pylib.runtime.launch import RankFailedError

    tb = (
        "rank 0 died without reporting (signal 6): what():  Received data size doesn't match expected size\n"
        "--- the last lines rank 0 printed ---\nterminate called ...\nExtension modules: numpy, torch (total: 2)"
    )
    err = RankFailedError(
        0, f"rank 0 failed first (died):\n{tb}", [dict(rank=0, time=0.0, kind="died", traceback=tb)], []
    )
    message, detail, rank = explain(err)
    assert rank == 0 and message.startswith("rank 0: rank 0 died without reporting (signal 6): what():")
    assert "doesn't match expected size" in message and "Extension modules" in detail
