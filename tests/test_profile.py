"""The profile switch: every rank under torch.profiler, the tracer's names on its ranges, one merged trace whose
clocks agree, and nothing at all when it is off."""

import time

import pytest
import torch

from pylib.runtime import collectives as C
from pylib.runtime import launch, tag, trace, tracer
from pylib.runtime.profile import (
    SYNC,
    Profile,
    clock_offsets,
    lanes,
    load,
    merge,
    operators,
    region,
    spans,
    within,
)

pytestmark = pytest.mark.timeout(120)

STAGGER = 0.03  # rank r enters the collective r * STAGGER seconds late


def _staggered():
    """Each rank arrives late by its rank, then one all-reduce and one all-gather tagged "x", forward."""
    r = torch.distributed.get_rank()
    time.sleep(r * STAGGER)
    with region("step"), trace() as tr, tag("x"):
        C.all_reduce_(torch.ones(4))
        C.all_gather_tensor(torch.ones(2), 0)
    return [(e.op, e.axis, e.tag, e.phase) for e in tr.events], tracer.active_span() is not None


@pytest.fixture(scope="module", params=[pytest.param(3, marks=pytest.mark.slow)], ids=["3 ranks"])
def staggered(request, tmp_path_factory):
    prof = Profile(tmp_path_factory.mktemp("prof"), window="step")
    ranks = launch(_staggered, request.param, backend="gloo", profile=prof)
    return prof, ranks


def test_every_traced_collective_is_a_range_named_as_the_tracer_names_it(staggered):
    prof, ranks = staggered
    found = spans(load(prof.merged_path))
    for r, (events, _) in enumerate(ranks):
        mine = [(s.op, s.axis, s.tag, s.phase) for s in found if s.rank == r and s.phase != "region"]
        assert mine == events == [("all_reduce", "world", "x", "forward"), ("all_gather", "world", "x", "forward")]


def test_merged_clocks_make_one_collectives_ranges_overlap_on_every_rank(staggered):
    prof, _ = staggered
    trace_ = load(prof.merged_path)
    names = {e["pid"]: e["args"]["name"] for e in trace_["traceEvents"] if e.get("name") == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1", 2: "rank 2"}
    found = spans(trace_)
    for op in ("all_reduce", "all_gather"):
        ranges = [s for s in found if s.op == op]
        assert len(ranges) == 3
        # nobody leaves a blocking collective before the last rank entered it: on one clock, the ranges share a moment
        assert max(s.start for s in ranges) < min(s.end for s in ranges), ranges
    # the stagger is visible: rank 2 entered the all-reduce about 2 * STAGGER after rank 0
    first = {s.rank: s.start for s in found if s.op == "all_reduce"}
    assert first[2] - first[0] > 1.5 * STAGGER


def test_the_alignment_undoes_a_shifted_clock(staggered):
    prof, _ = staggered
    raw = [load(prof.rank_path(r)) for r in range(3)]
    assert clock_offsets(raw) == [0.0, 0.0, 0.0]  # one machine, one clock: the sync ranges already meet
    for e in raw[1]["traceEvents"]:  # rank 1's clock one second ahead
        if "ts" in e and e.get("ph") != "M":
            e["ts"] += 1e6
    (sync0,) = [e["dur"] for e in raw[0]["traceEvents"] if e.get("name") == SYNC]
    (sync1,) = [e["dur"] for e in raw[1]["traceEvents"] if e.get("name") == SYNC]
    # the second found again, to within the two sync ranges' lengths (a few hundred microseconds here)
    assert abs(clock_offsets(raw)[1] - 1e6) <= sync0 + sync1
    assert merge(raw, "step")["otherData"]["offsets_us"] == clock_offsets(raw)


def test_the_window_keeps_only_the_step(staggered):
    prof, _ = staggered
    found = spans(load(prof.merged_path))
    assert not [s for s in found if s.tag == "profile"]  # the clock sync happened before the step
    steps = [s for s in found if s.what == "step"]
    assert len(steps) == 3 and min(s.start for s in steps) == 0.0
    for s in steps:
        assert len(within(found, s)) == 3  # the step itself, its all-reduce and its all-gather


def test_a_profile_opens_ranges_only_while_it_records(staggered):
    _, ranks = staggered
    assert all(on for _, on in ranks)
    assert tracer.active_span() is None  # in the caller


def _users_own_profiler():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
        C.all_reduce_(torch.ones(4), tag="x")
    return [e.name for e in p.events()], tracer.active_span() is None


@pytest.mark.slow
def _tagged_all_reduce():
    C.all_reduce_(torch.ones(4), tag="x")
    return tracer.active_span() is not None


def test_without_a_profile_no_range_is_opened():
    for names, off in launch(_users_own_profiler, 2, backend="gloo"):
        assert off
        assert not [n for n in names if " | " in n]  # the collective ran, no range of ours around it
        assert any("allreduce" in n or "all_reduce" in n for n in names)


def test_profile_checks_its_fields_and_launch_its_profile(tmp_path):
    with pytest.raises(TypeError, match="out_dir"):
        Profile(3)
    with pytest.raises(TypeError, match="profile_memory"):
        Profile(tmp_path, profile_memory="yes")
    with pytest.raises(TypeError, match="window"):
        Profile(tmp_path, window=1)
    with pytest.raises(TypeError, match="profile must be"):
        launch(lambda: 0, 2, profile=str(tmp_path))
    assert Profile(tmp_path).merged_path == str(tmp_path / "trace.json")


def test_merge_refuses_a_trace_without_the_clock_sync():
    bare = {"traceEvents": [{"ph": "X", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0.0, "dur": 1.0}]}
    with pytest.raises(ValueError, match="rank 0's trace holds 0 ranges named"):
        merge([bare])
    assert SYNC == "clock-sync@world | profile | clock-sync"


def _rank_trace(pid: int, sync: tuple[float, float], ranges: dict[str, tuple[float, float]]) -> dict:
    """A rank's trace as kineto writes it: its host process, the clock sync, named ranges, a profiler mark."""
    events = [{"ph": "X", "name": SYNC, "pid": pid, "tid": 1, "ts": sync[0], "dur": sync[1] - sync[0]}]
    events += [{"ph": "X", "name": n, "pid": pid, "tid": 1, "ts": a, "dur": b - a} for n, (a, b) in ranges.items()]
    events.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "ts": 0.0, "dur": 9e9})
    events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}})
    return {"traceEvents": events}


def test_merge_shifts_a_rank_whose_clock_runs_ahead_until_its_sync_meets_rank_0s():
    name = "all_reduce@tp | layers.0 | forward"
    t0 = _rank_trace(100, (1000.0, 1010.0), {name: (2000.0, 2050.0)})
    # rank 1's clock reads 5 s ahead; it entered the all-reduce 30 us after rank 0 and left with it
    t1 = _rank_trace(200, (5_001_004.0, 5_001_012.0), {name: (5_002_030.0, 5_002_051.0)})
    merged = merge([t0, t1])
    assert clock_offsets([t0, t1]) == [0.0, 5_001_004.0 - 1010.0]
    names = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}  # one row per rank; kineto's own "Spans" row left out
    found = [s for s in spans(merged) if s.op == "all_reduce"]
    assert [(s.rank, s.axis, s.tag, s.phase) for s in found] == [
        (0, "tp", "layers.0", "forward"),
        (1, "tp", "layers.0", "forward"),
    ]
    assert max(s.start for s in found) < min(s.end for s in found)
    assert min(s.start for s in spans(merged)) == 0.0  # times read from the earliest event


def merged_example() -> dict:
    """A small two-rank merged trace: a pipeline forward and backward on each rank with operators inside, a
    collective, an async launch and its wait (what the figure tests draw)."""
    ranks = []
    for r in range(2):
        t = 100.0 * r  # rank 1 starts its forward later
        named = {
            "F0@pp | pp.stage0 | forward": (t + 0.0, t + 300.0),
            "all_reduce@tp | layers.0 | forward": (t + 120.0, t + 180.0),
            "B0@pp | pp.stage0 | backward": (t + 400.0, t + 900.0),
            "all_reduce_async@dp | grads | backward": (t + 500.0, t + 505.0),
            "wait all_reduce@dp | grads | backward": (t + 900.0, t + 1000.0),
        }
        trace = _rank_trace(10 + r, (-20.0, -10.0), named)
        # operators: two in the forward around the all-reduce, two in the backward around the async launch, one
        # wrapper holding the whole backward (an autograd node whose backward communicates: not computing itself)
        for a, b in ((t + 10, t + 110), (t + 190, t + 290), (t + 410, t + 495), (t + 510, t + 890), (t + 395, t + 995)):
            trace["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 10 + r, "tid": 1,
                                         "ts": a, "dur": b - a})  # fmt: skip
        ranks.append(trace)
    return merge(ranks)


def test_operators_are_the_computing_slices_outside_communication():
    trace = merged_example()
    t0 = min(s.start for s in spans(trace))  # the merged origin: the clock sync
    ops = [(round((a - t0) * 1e6), round((b - t0) * 1e6)) for a, b in operators(trace, 0)]
    assert ops == [(30, 130), (210, 310), (430, 515), (530, 910)]  # the origin: the sync, 20 us before 0
    kinds = [(s.op, s.kind) for s in spans(trace) if s.rank == 0]
    assert kinds == [("clock-sync", "comm"), ("F0", "F"), ("all_reduce", "comm"), ("B0", "B"),
                     ("all_reduce_async", "comm"), ("wait all_reduce", "wait")]  # fmt: skip


@pytest.mark.slow  # matplotlib's first import
def test_the_figure_draws_every_named_range_of_the_trace():
    from pylib.viz.profile import plot_profile

    trace = merged_example()
    fig = plot_profile(*lanes(trace))
    ax = fig.axes[0]
    drawn = {gid: 0 for gid in ("F", "B", "comm", "wait")}
    for coll in ax.collections:
        if coll.get_gid() in drawn:
            drawn[coll.get_gid()] += len(coll.get_paths())
    assert drawn == {"F": 2, "B": 2, "comm": 6, "wait": 2}  # comm: the clock sync, the all-reduce, the launch
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]


@pytest.mark.slow
def test_the_lab_harness_switch_profiles_every_launch_of_the_lab_each_into_its_own_folder(tmp_path):
    from pylib.labs.files import find_labs
    from pylib.labs.runner import kernel_arguments
    from pylib.runtime import profile_launches

    lab = find_labs()[0]
    assert kernel_arguments(lab) == ["--IPKernelApp.log_level=ERROR"]  # off: the kernel as before
    (line,) = [a.partition("=")[2] for a in kernel_arguments(lab, tmp_path) if a.startswith("--IPKernelApp.exec_lines")]
    try:
        exec(line, {})  # what the lab's kernel runs before its first cell
        for _ in range(2):
            launch(_tagged_all_reduce, 2, backend="gloo")
    finally:
        profile_launches(None)
    for k in range(2):
        merged = load(str(tmp_path / lab.name / f"launch{k}" / "trace.json"))
        assert sorted((s.rank, s.op, s.tag) for s in spans(merged) if s.tag == "x") == [
            (0, "all_reduce", "x"),
            (1, "all_reduce", "x"),
        ]
    assert not (tmp_path / lab.name / "launch2").exists()
    assert launch(_tagged_all_reduce, 2, backend="gloo") == [False, False]  # after None: no profile again
    with pytest.raises(TypeError, match="profile_launches takes"):
        profile_launches("traces")
