"""The planner explorer and tables (pylib.viz.planner): the default view is rank_plans' answer for the default
sizes, every control recomputes it, a change costs about a second, and the comparison table reports the largest
difference between prediction and measurement."""

import time
from dataclasses import replace

import pytest

from pylib.analysis import planner as P
from pylib.viz.planner import (
    EXPLORER_PRESETS,
    JOB_SEARCH,
    PRESETS,
    Check,
    PlannerExplorer,
    best_plans,
    compare_table,
    explorer_cluster,
    feasible_plans,
    megatron_workload,
    pareto_front,
    plans_text,
    preset_job,
)


@pytest.mark.slow
def test_default_view_is_the_cost_models_ranking_for_the_default_sizes():
    ex = PlannerExplorer()
    name, world, batch, seq, memory = ex.state()
    want = P.rank_plans(
        PRESETS[name][0], megatron_workload(batch, seq), explorer_cluster(world, memory), top=8, space=JOB_SEARCH
    )
    assert ex.text().splitlines()[1:] == plans_text(want).splitlines()
    assert want[0].plan.describe() in ex.out.value and "memory / GPU" in ex.out.value


@pytest.mark.slow
def test_every_control_recomputes_and_an_update_is_cheap():
    ex = PlannerExplorer()
    before = ex.out.value
    t0 = time.perf_counter()
    ex.seq.value = 32768
    assert time.perf_counter() - t0 < 4  # about a second on a 2-core CPU
    assert ex.out.value != before and "32768 tokens" in ex.text()
    ex.memory.value = "40 GB (A100 40G)"
    assert "of 40 GB" in ex.text()
    ex.world.value = 8
    assert ex.text().startswith("Llama-2-70B-class dense (GQA) on 8 GPUs") and " no " in ex.text()  # 70B on 8: no fit
    for name in EXPLORER_PRESETS:
        ex.preset.value = name
        assert ex.world.value == PRESETS[name][1] and name in ex.out.value


def test_comparison_table_reports_the_largest_difference_per_quantity():
    checks = [Check(0, "params", 100, 100), Check(1, "params", 80, 80), Check(0, "sent on ep", 90, 100, exact=False)]
    rows = {r[0]: r for r in compare_table(checks)}
    assert rows["params"] == ["params", "2", "100", "100", "0", "exact"]
    assert rows["sent on ep"][4:] == ["10", "expectation"]


@pytest.mark.slow  # two rankings of a 70B model: seconds
def test_the_static_explorer_is_a_form_showing_what_the_live_one_shows_and_the_live_one_is_marked():
    from pylib.viz.planner import GPU_MEMORY, live_state_html, static_explorer

    page, live = static_explorer(), PlannerExplorer()
    assert page.html == live.out.value  # the same title and ranking for the same controls
    assert [f.name for f in page.groups[0][1]] == ["preset", "world", "memory", "batch", "seq"]
    assert set(page.presets) == set(EXPLORER_PRESETS) and page.state["memory"] in GPU_MEMORY
    live.world.value = 8  # 70B on 8 GPUs: no plan fits, and the static one says why alike
    assert live_state_html(page.state | {"world": 8}) == live.out.value
    assert "pb-needs-kernel" in live.widget._dom_classes and "pb-needs-kernel" not in page._repr_html_()


def test_the_explorers_and_the_planner_chapter_ask_one_function_about_one_job(monkeypatch):
    import pathlib

    import pylib.viz.planner as V

    asked = []

    def recorder(job, top=8):
        asked.append(job)
        return []

    monkeypatch.setattr(V, "best_plans", recorder)
    ex = V.PlannerExplorer()
    V.static_explorer()
    default = V.preset_job()
    assert ex.state()[:4] == (default.preset, 64, 512, 4096)
    assert asked == [default, default] and default == V.DEFAULT_JOB  # the live and the static page: one job
    chapter = pathlib.Path(__file__).parents[1].joinpath("book/part4/planner.md").read_text()
    # the chapter's ranking and its knob table's baseline come from the same call about the same job
    assert "top70 = best_plans(job, top=10)" in chapter and "bp = top70[0].plan" in chapter
    assert "job = DEFAULT_JOB" in chapter and "top_of(" not in chapter


# ------------------------------------------------------------------------------------ memory against step time


def _small_job():
    """A job whose plans take a fraction of a second to predict: the 7B preset on 4 GPUs, 4 x 1024 tokens."""
    return replace(preset_job("Llama-2-7B-class dense"), world=4, batch=4, seq=1024)


def _point(memory, seconds):
    return P.Prediction(None, [], memory, True, seconds, 0.0, 0.0)


def test_pareto_front_keeps_the_plans_no_other_beats_on_memory_and_time():
    a, b, c, d, e = (_point(m, t) for m, t in [(10, 9.0), (20, 5.0), (30, 5.0), (15, 12.0), (40, 1.0)])
    assert pareto_front([c, e, d, a, b]) == [a, b, e]  # c: as slow as b, more memory; d: beaten by a
    assert pareto_front([]) == []


def test_feasible_plans_are_every_plan_that_fits_and_the_ranking_starts_on_their_front():
    job = _small_job()
    preds = feasible_plans(job)
    cfg, work, cluster = job.cfg, job.workload, job.cluster
    every = P.enumerate_plans(cfg, cluster.world_size, work.batch, work.seq, job.space)
    fits = {p for p in every if P.peak_memory(cfg, p, work, cluster) <= cluster.usable_memory}
    assert {x.plan for x in preds} == fits
    assert all(x.fits for x in preds) and len(preds) > 10
    front = pareto_front(preds)
    assert front[-1].plan == best_plans(job, top=1)[0].plan  # the ranking's first: the front's fastest
    for x in preds:  # nothing off the front beats a plan on it on both counts
        assert not any(x.peak_memory <= f.peak_memory and x.step_time < f.step_time for f in front)
