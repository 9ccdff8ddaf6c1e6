"""The book's two editions share rank runs (pylib.i18n.editions): a launch is replayed only when it is the same
launch — same function by what it does, same arguments, same place in the kernel's sequence, same inherited state —
and only in a language its ranks did not ask for when they asked for one."""

import os
import threading
import time

import pytest
import torch

from pylib import i18n
from pylib.i18n import editions as replay
from pylib.runtime import RankFailedError, launch


@pytest.fixture
def store(tmp_path, monkeypatch):
    """Sharing on, into a fresh folder; `kernel()` starts a new kernel's chain (as the other edition's would)."""
    monkeypatch.setenv(replay.ENV, str(tmp_path))
    monkeypatch.setattr(replay, "_chain", b"")
    monkeypatch.setattr(replay, "_shared", True)

    class Store:
        path = tmp_path

        @staticmethod
        def kernel():
            replay._chain = b""

        @staticmethod
        def entries():
            return sorted(p.name.split("-")[1] for p in tmp_path.glob("*.pkl"))

    yield Store
    i18n.set_language(None)


def pid_and(x):
    print(f"rank says {x}")
    return os.getpid(), x


def pid_and_language(x):
    return os.getpid(), i18n.tr("expert"), x


def test_the_other_kernel_replays_the_same_launch_and_its_output(store, capsys):
    first = launch(pid_and, 2, 3)
    printed = capsys.readouterr().out
    store.kernel()
    again = launch(pid_and, 2, 3)
    assert again == first  # the same process ids: no rank was started
    assert capsys.readouterr().out == printed and "rank says 3" in printed
    assert store.entries() == ["any.pkl"]


def test_other_arguments_another_place_in_the_sequence_or_other_inherited_state_run_again(store):
    first = launch(pid_and, 2, 3)
    second = launch(pid_and, 2, 3)  # the same call, second in this kernel: its own place
    assert {p for p, _ in second}.isdisjoint(p for p, _ in first)
    store.kernel()
    assert launch(pid_and, 2, 4)[0][1] == 4  # first place, other arguments: runs
    store.kernel()
    torch.set_default_dtype(torch.float64)  # what forked ranks inherit changed: runs
    try:
        other = launch(pid_and, 2, 3)
    finally:
        torch.set_default_dtype(torch.float32)
    assert {p for p, _ in other}.isdisjoint(p for p, _ in first)
    store.kernel()
    assert launch(pid_and, 2, 3) == first  # the same launch from the same state: replayed


def test_a_run_whose_ranks_asked_for_the_language_is_kept_for_that_language_only(store):
    i18n.set_language("en")
    en = launch(pid_and_language, 2, 1)
    store.kernel()
    i18n.set_language("zh")
    zh = launch(pid_and_language, 2, 1)
    assert {p for p, *_ in zh}.isdisjoint(p for p, *_ in en) and zh[0][1] != en[0][1]
    store.kernel()
    assert launch(pid_and_language, 2, 1) == zh
    assert store.entries() == ["en.pkl", "zh.pkl"]


def _notebook_function(constant, filename):
    """A function as a notebook cell defines it: compiled from source under the cell's own file name."""
    scope = {"K": constant, "os": os}
    exec(compile("def step(x):\n    return os.getpid(), x * K\n", filename, "exec"), scope)
    return scope["step"]


def test_a_notebook_function_is_known_by_what_it_does_and_the_globals_it_reads(store):
    first = launch(_notebook_function(2, "/tmp/ipykernel_1/cell3.py"), 2, 5)
    store.kernel()
    assert launch(_notebook_function(2, "/tmp/ipykernel_9/cell7.py"), 2, 5) == first  # typed elsewhere: the same
    store.kernel()
    other = launch(_notebook_function(3, "/tmp/ipykernel_9/cell7.py"), 2, 5)  # a global it reads changed
    assert other[0][1] == 15


def test_what_cannot_be_fingerprinted_or_fails_is_never_stored(store):
    lock = threading.Lock()
    launch(_uses, 2, lock)
    assert store.entries() == []
    with pytest.raises(RankFailedError):
        launch(_fails, 2)
    assert store.entries() == []


def _uses(lock):
    return lock is not None


def _fails():
    raise ValueError("no")


CALLS = []


@replay.shared
def costly(n, words=False):
    """A pure function of the chapter's own process, as a planner search is."""
    CALLS.append(n)
    return (n * n, i18n.tr("expert")) if words else n * n


def test_a_shared_function_is_called_once_for_both_editions_and_words_once_per_language(store):
    CALLS.clear()
    assert costly(3) == 9 and costly(3, words=True) == (9, "expert")
    store.kernel()
    i18n.set_language("zh")
    assert costly(3) == 9  # no words: the other kernel takes it
    assert costly(3, words=True)[1] != "expert"  # words: said again in this language
    assert CALLS == [3, 3, 3]


def sleeps(seconds):
    time.sleep(seconds)
    return os.getpid()


def test_a_replay_lasts_as_long_as_the_run_did(store):
    t0 = time.monotonic()
    first = launch(sleeps, 2, 0.6)
    ran = time.monotonic() - t0
    store.kernel()
    t0 = time.monotonic()
    assert launch(sleeps, 2, 0.6) == first
    assert time.monotonic() - t0 >= 0.9 * ran >= 0.5


def test_off_without_the_builds_folder_or_when_a_chapter_turns_it_off(tmp_path, monkeypatch):
    monkeypatch.setattr(replay, "_shared", False)
    monkeypatch.setenv(replay.ENV, str(tmp_path))
    launch(pid_and, 2, 3)
    monkeypatch.setattr(replay, "_shared", True)
    monkeypatch.delenv(replay.ENV)
    launch(pid_and, 2, 3)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_fingerprints_are_the_same_in_another_process():
    """The other edition's kernel is another process: a model, a config, tensors and a notebook function must give
    the same fingerprint there (a plain pickle of an nn.Module does not)."""
    import subprocess
    import sys

    code = """
import os, torch
from pylib.plan import ParallelConfig, RunOptions
from pylib.plan.presets import tiny_gqa
from pylib.i18n import editions as replay
torch.manual_seed(0)
scope = {"K": 2, "os": os}
exec(compile("def step(x):\\n    return x * K\\n", "/tmp/cell.py", "exec"), scope)
values = (torch.nn.Linear(4, 3), tiny_gqa(), ParallelConfig(tp=2), RunOptions(), torch.arange(5.0), scope["step"])
print(replay.fingerprint(scope["step"], values, {"dtype": torch.float64}, 2, "gloo").hex())
"""
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        for _ in range(2)
    ]
    assert runs[0] == runs[1] and len(runs[0]) == 64


@replay.shared
def outer(n):
    return costly(n) + 1  # a shared call inside a shared call is part of it


def test_what_a_shared_run_calls_is_part_of_it_so_the_chains_stay_in_step(store):
    CALLS.clear()
    assert outer(4) == 17 and costly(5) == 25
    store.kernel()
    assert outer(4) == 17 and costly(5) == 25  # both replayed: the inner call did not move the first kernel's chain
    assert CALLS == [4, 5]


@replay.shared
def seeded(n):
    torch.manual_seed(n)
    return torch.rand(1).item()


def test_a_shared_function_leaves_the_callers_generator_where_it_was(store):
    torch.manual_seed(7)
    before = torch.random.get_rng_state()
    seeded(3)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_equal_values_fingerprint_alike_whether_or_not_they_are_one_object():
    """One edition computes a result that later arguments share objects with; the other unpickles it from the store
    as separate copies. The fingerprint is of values, so both editions' next keys agree (they did not while an object
    met again hashed as a "seen" marker: the planner chapter's chain split at a different search on each build)."""
    from pylib.plan import RunOptions

    shared_options = RunOptions(zero_stage=1)
    one_object = ([shared_options, shared_options], {"a": shared_options})
    copies = ([RunOptions(zero_stage=1), RunOptions(zero_stage=1)], {"a": RunOptions(zero_stage=1)})
    assert replay.fingerprint(len, one_object, {}, 1, "gloo") == replay.fingerprint(len, copies, {}, 1, "gloo")
    assert replay.fingerprint(len, one_object, {}, 1, "gloo") != replay.fingerprint(len, (copies[0], {}), {}, 1, "gloo")
    cycle: list = [1]
    cycle.append(cycle)  # a value inside itself still fingerprints (a marker where it meets itself)
    assert replay.fingerprint(len, (cycle,), {}, 1, "gloo") == replay.fingerprint(len, (cycle,), {}, 1, "gloo")


def write_and_read(name, text):
    """Rank 0 appends `text` to the file `name` of the working directory, removes 'old.txt' and renames the folder
    'partial' to 'done'; every rank returns what the file then holds."""
    import torch.distributed as dist

    if dist.get_rank() == 0:
        with open(name, "a") as f:
            f.write(text)
        if os.path.exists("old.txt"):
            os.remove("old.txt")
        if os.path.isdir("partial"):  # a save's temporary folder, renamed when complete
            os.rename("partial", "done")
    dist.barrier()
    with open(name) as f:
        return os.getpid(), f.read()


def test_a_working_folders_files_are_part_of_the_run_and_a_replay_makes_them_again(store, tmp_path, monkeypatch):
    """The checkpoints chapter's case: each edition works in its own fresh folder, its ranks write files there that
    later runs read. With the folder named (`working_folder`), the second kernel, in another folder, replays the run:
    no rank starts, and its own folder ends as the first one did: the file written, the file removed, the folder
    renamed (gone under its old name, as the checkpoints chapter checks of a save's temporary folder)."""
    homes = [tmp_path / "edition-a", tmp_path / "edition-b"]
    for home in homes:
        (home / "ckpt").mkdir(parents=True)
        (home / "old.txt").write_text("stale")
        (home / "partial" / "inner").mkdir(parents=True)
        (home / "partial" / "inner" / "piece").write_text("x")
    monkeypatch.chdir(homes[0])
    replay.working_folder(homes[0])
    try:
        first = launch(write_and_read, 2, "ckpt/log.txt", "step 1;")
        store.kernel()
        monkeypatch.chdir(homes[1])
        replay.working_folder(homes[1])
        again = launch(write_and_read, 2, "ckpt/log.txt", "step 1;")
        assert again == first  # replayed: the same rank process ids
        assert (homes[1] / "ckpt" / "log.txt").read_text() == "step 1;" and not (homes[1] / "old.txt").exists()
        assert not (homes[1] / "partial").exists() and (homes[1] / "done" / "inner" / "piece").read_text() == "x"
        later = launch(write_and_read, 2, "ckpt/log.txt", "step 2;")  # the next run reads the replayed file
        assert later[0][1] == "step 1;step 2;"
    finally:
        replay.working_folder(None)
