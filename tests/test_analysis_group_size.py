"""The interleaved schedule's group size N as a planner knob (`Plan.group_size`, Megatron-Core's
`microbatch_group_size_per_vp_stage`): the activations from the schedule's own warm-up, the bubble measured on the
schedule, Megatron's rule for N, and what the search does with it."""

from dataclasses import replace

import pytest

from pylib.analysis import activations as A
from pylib.analysis import planner as P
from pylib.analysis import pp as pp_analysis
from pylib.plan import RunOptions
from pylib.plan.mesh import ParallelConfig as pc
from pylib.plan.presets import megatron_gpt
from pylib.plan.schedules import ScheduleError, compute_order, logical_times

GPT = megatron_gpt(1024, 8, 16)
WORK = P.Workload(64, 1024)
CLUSTER = P.Cluster(8)
PLAN = P.Plan(pc(dp=2, pp=4), RunOptions(n_microbatches=16, v=2))  # p 4, m 16 (2 sequences each), v 2


def test_megatrons_rule_gives_the_n_the_search_tries():
    """p <= N <= m, and m % N == 0 or m % N >= p: for p 4, m 16 a last group of 1, 2 or 3 is out (N 5, 7, 13-15)."""
    assert P.group_sizes_for(4, 16, 2, "megatron") == (None, 6, 8, 9, 10, 11, 12, 16)
    assert P.group_sizes_for(4, 16, 2) == (None,) and P.group_sizes_for(4, 16, 1, "megatron") == (None,)
    assert P.group_sizes_for(4, 16, 2, (2, 4, 5, 8)) == (None, 8)


def test_an_invalid_n_is_a_problem_naming_the_constraint():
    small, rest = (P.problems(GPT, replace(PLAN, group_size=n), 8, 64, 1024) for n in (2, 7))
    assert len(small) == 1 and "p <= N <= m" in small[0] and "N=2" in small[0] and "deadlock" in small[0]
    assert len(rest) == 1 and "m % N == 0 or m % N >= p" in rest[0] and "m % N = 2" in rest[0]
    one_chunk = P.problems(GPT, replace(PLAN.with_options(v=1), group_size=8), 8, 64, 1024)
    assert any("interleaved schedule only" in x for x in one_chunk)
    with pytest.raises(ValueError, match="p <= N <= m"):
        P.predict(GPT, replace(PLAN, group_size=2), WORK, CLUSTER)


def test_a_valid_n_lifts_the_default_ns_complaint():
    """m = 10 on p = 4 breaks N = p (10 % 4 = 2) but runs with N = 5, 6 (a last group of 4) or 10."""
    ten = PLAN.with_options(n_microbatches=10)
    work = P.Workload(20, 1024)
    assert any("m divisible by p" in x for x in P.problems(GPT, ten, 8, 20, 1024))
    assert not P.problems(GPT, replace(ten, group_size=5), 8, 20, 1024)
    plans = P.enumerate_plans(
        GPT, 8, 20, 1024, P.SearchSpace(meshes=(PLAN.par,), group_sizes="megatron", zero_stages=(0,))
    )
    assert {p.group_size for p in plans if p.options.v == 2 and p.options.n_microbatches == 10} == {5, 6, 10}
    assert P.predict(GPT, replace(ten, group_size=5), work, CLUSTER).fits


def test_memory_falls_as_n_falls_to_p():
    """The warm-up, 2(p - r - 1) + (v - 1) N forwards (schedules.warmup_forwards), is what the planner's peak holds:
    each step of N adds v - 1 chunk activations (until the rank holds all m v). With equal chunks (ranks 0 to
    p - 2 here) the bytes follow; on the last rank, whose last chunk keeps the logits, a ragged last group (m % N
    > 0) also holds several of those heavy chunks at once, so there N = 6 holds more than N = 8."""
    ns = P.group_sizes_for(4, 16, 2, "megatron")
    dividing = [n for n in ns if 16 % (n or 4) == 0]
    for r in range(4):
        acts = {n: P.rank_memory(GPT, replace(PLAN, group_size=n), WORK, r)["activations"] for n in ns}
        for n in ns:
            pairs = max(sum(x) for x in A.live_counts("interleaved", 4, 16, 2, r, n))
            assert pairs == pp_analysis.peak_in_flight("interleaved", 4, 16, r, 2, n) == 2 * (3 - r) + (n or 4) + 1
        falls = [acts[n] for n in (ns if r < 3 else dividing)]
        assert falls == sorted(falls) and falls[0] < falls[-1], r
    last = {n: P.rank_memory(GPT, replace(PLAN, group_size=n), WORK, 3)["activations"] for n in (6, 8)}
    assert last[6] > last[8]


def test_the_simulated_bubble_is_the_models_for_every_valid_n():
    """The schedule run against its dependencies (schedules.logical_times) idles (p - 1) / (v m) for each N
    Megatron accepts, and the planner's bubble for such a plan is that measurement."""
    for p, v, m in ((2, 2, 6), (3, 3, 9), (4, 2, 16), (4, 4, 10), (5, 2, 13)):
        for n in (x or p for x in P.group_sizes_for(p, m, v, "megatron")):
            measured = pp_analysis.simulated_bubble_fraction("interleaved", p, m, v, n)
            assert measured == pytest.approx(pp_analysis.bubble_fraction(p, m, v)), (p, v, m, n)
    assert pp_analysis.simulated_bubble_fraction("1f1b", 4, 10) == pytest.approx(3 / 10)
    base, wide = (P.predict(GPT, replace(PLAN, group_size=n), WORK, CLUSTER) for n in (None, 16))
    assert wide.bubble_time == pytest.approx(base.bubble_time) and wide.step_time == pytest.approx(base.step_time)
    assert wide.peak_memory > base.peak_memory


def test_n_below_p_deadlocks_megatrons_order():
    """Why Megatron asks N >= p: at Llama 3's p 16, v 8 (m 32) its warm-up with any N < p dividing m deadlocks."""
    for n in (1, 2, 4, 8):
        orders = [compute_order("interleaved", 16, 32, r, 8, n, strict=False) for r in range(16)]
        with pytest.raises(ScheduleError, match="deadlock"):
            logical_times(orders, 16 * 8)


def test_the_search_keeps_n_p_unless_asked_and_then_still_picks_it():
    default = P.enumerate_plans(GPT, 8, 64, 1024, P.SearchSpace(meshes=(PLAN.par,), zero_stages=(0,)))
    every = P.enumerate_plans(
        GPT, 8, 64, 1024, P.SearchSpace(meshes=(PLAN.par,), zero_stages=(0,), group_sizes="megatron")
    )
    assert all(p.group_size is None for p in default) and set(default) < set(every)
    assert all(not P.problems(GPT, p, 8, 64, 1024) for p in every)
    assert P.canonical(replace(PLAN, group_size=4)).group_size is None
    assert "N=16" in replace(PLAN, group_size=16).describe()
    best = P.rank_plans(GPT, WORK, CLUSTER, top=1, plans=every)[0]
    assert best.plan.group_size is None  # same bubble, least memory
