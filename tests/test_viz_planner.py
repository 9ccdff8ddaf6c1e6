"""The planner explorer and tables (pylib.viz.planner): the default view is rank_plans' answer for the default
sizes, every control recomputes it, a change costs about a second, and the comparison table reports the largest
difference between prediction and measurement."""

import time

from pylib.analysis import planner as P
from pylib.viz.planner import (
    EXPLORER_PRESETS,
    JOB_SEARCH,
    PRESETS,
    Check,
    PlannerExplorer,
    compare_table,
    explorer_cluster,
    megatron_workload,
    plans_text,
)


def test_default_view_is_the_cost_models_ranking_for_the_default_sizes():
    ex = PlannerExplorer()
    name, world, batch, seq, memory = ex.state()
    want = P.rank_plans(
        PRESETS[name][0], megatron_workload(batch, seq), explorer_cluster(world, memory), top=8, space=JOB_SEARCH
    )
    assert ex.text().splitlines()[1:] == plans_text(want).splitlines()
    assert want[0].plan.describe() in ex.out.value and "memory / GPU" in ex.out.value


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


def test_the_static_explorer_links_precomputed_states_in_the_page_and_the_live_one_is_marked():
    import ipywidgets as widgets

    from pylib.viz.planner import STATIC_STATES, static_explorer

    box = static_explorer(STATIC_STATES[:2], top=2)
    choose, stack = box.children
    assert isinstance(stack, widgets.Stack) and len(stack.children) == len(choose.options) == 2
    assert all("memory / GPU" in page.value for page in stack.children)
    assert "pb-needs-kernel" in PlannerExplorer().widget._dom_classes


def test_the_explorers_and_the_planner_chapter_ask_one_function_about_one_job(monkeypatch):
    import pathlib

    import pylib.viz.planner as V

    asked = []

    def recorder(job, top=8):
        asked.append(job)
        return []

    monkeypatch.setattr(V, "best_plans", recorder)
    ex = V.PlannerExplorer()
    V.static_explorer(V.STATIC_STATES, top=2)
    default = V.preset_job()
    assert asked[0] == default == V.DEFAULT_JOB and ex.state()[:4] == (default.preset, 64, 512, 4096)
    assert default in asked[1:]  # the static page's 70B state is the same job
    chapter = pathlib.Path(__file__).parents[1].joinpath("book/part4/planner.md").read_text()
    # the chapter's ranking and its knob table's baseline come from the same call about the same job
    assert "top70 = best_plans(job, top=10)" in chapter and "bp = top70[0].plan" in chapter
    assert "job = DEFAULT_JOB" in chapter and "top_of(" not in chapter
