"""The matrix-view explorer (pylib.viz.explorer): its tables are pylib.analysis.shapes' numbers, every control
recomputes them, a plan that cannot run says why, and the same tables print as plain text. The static explorer's
precomputed states are exactly what the live explorer and shapes.summary compute for those controls, linked in the
page without a kernel; the live controls are marked as needing one."""

import json

import ipywidgets as widgets
import pytest

from pylib.analysis import shapes
from pylib.plan import ParallelConfig, RunOptions
from pylib.viz.explorer import (
    PRESETS,
    STATIC_PLANS,
    TAB_TITLES,
    Explorer,
    render_details,
    render_tabs,
    render_text,
    static_explorer,
    static_states,
    tables,
)


def test_default_tables_are_the_shapes_of_the_default_plan():
    ex = Explorer()
    cfg, par, b, s, kw = ex.state()
    summary = shapes.summary(cfg, par, b, s, **kw)
    assert not summary.problems
    assert ex.text() == render_text(summary, ex.title())
    head, rows = tables(summary)["weights (seed B's [in, out]; per rank)"]
    (wq,) = [r for r in rows if r[0] == "W_Q"]
    assert wq[3] == f"[{cfg.d_model}, {cfg.d_model // par.tp}]"  # seed B's [in, out]: heads cut by TP
    assert "[8192, 1024]" in ex.panes[0].value  # the same row in the widget's weights tab
    assert [ex.tabs.get_title(i) for i in range(len(TAB_TITLES))] == TAB_TITLES


def test_every_control_recomputes_the_tables():
    ex = Explorer()
    before = ex.html()
    ex.axes["tp"].value = 16  # more TP ranks than K/V heads: the K/V head is replicated
    assert ex.html() != before
    assert "[8192, 128]" in ex.html()  # W_K [h, h_kv/8]: one K/V head of d_head = 128 per rank
    assert "one K/V head held by 2 TP ranks" in ex.text()
    ex.sp.value = False
    assert "all_reduce" in ex.text() and "all_gather" not in ex.text()
    ex.stage.value = "last"
    assert "pipeline rank 3" in ex.text()


def test_an_impossible_plan_names_the_constraint():
    ex = Explorer()
    ex.layers.value = 30  # pp = 4 does not divide 30 layers
    assert "n_layers=30 is not divisible by pp × v = 4 × 1 = 4" in ex.html()
    ex.heads.value = 60  # 60 heads do not divide h = 8192: the model itself cannot be built
    assert "n_heads=60 does not divide d_model=8192" in ex.text()


def test_every_preset_loads_a_plan_that_runs():
    ex = Explorer()
    for name in PRESETS:
        ex.preset.value = name
        assert not ex.summary().problems, (name, ex.summary().problems)
        assert "traffic of this rank" in ex.html()
    ex.preset.value = "DeepSeek-V3-class MoE"
    assert ex.experts.value == 256 and "expert input (expected)" in ex.text()


def test_the_live_explorer_is_marked_as_needing_a_kernel():
    assert "pb-needs-kernel" in Explorer().widget._dom_classes


STATES = static_states()
CASES = [(p, i) for p, plans in STATIC_PLANS.items() for i in range(len(plans))]


def _summary_from_controls(preset: str, controls: dict) -> shapes.Summary:
    """shapes.summary for the preset's plan with `controls` on top, built without any widget."""
    cfg, plan = PRESETS[preset]
    plan = {**plan, **controls}
    par = ParallelConfig(**{a: plan.get(a, 1) for a in ("tp", "cp", "dp", "pp", "ep", "etp")})
    fields = dict(cp_kind="cp_kind", m="n_microbatches", zero="zero_stage")  # control -> RunOptions field
    given = {fields[k]: plan[k] for k in fields if k in plan}
    options = RunOptions(sequence_parallel=plan.get("sp", False), **given)
    pp_rank = par.pp - 1 if plan.get("stage") == "last" else 0
    return shapes.summary(cfg, par, plan["b"], plan["s"], options, pp_rank=pp_rank)


@pytest.mark.parametrize("preset, i", CASES, ids=[f"{p[:12]}-{i}" for p, i in CASES])
def test_every_static_state_is_what_the_live_explorer_computes(preset, i):
    label, controls = STATIC_PLANS[preset][i]
    got_label, heading, tabs = STATES[preset][i]
    assert got_label == label
    summary = _summary_from_controls(preset, controls)
    assert not summary.problems, summary.problems  # every precomputed plan runs
    assert tabs == render_tabs(summary)  # = shapes.summary's tables, independently of the widgets
    live = Explorer(preset).set(**controls)  # = the live explorer, those controls set one by one
    assert [p.value for p in live.panes] == tabs and live.heading.value == heading


def test_static_states_differ_and_each_preset_starts_at_its_own_plan():
    for preset, plans in STATES.items():
        assert len({tuple(tabs) for _, _, tabs in plans}) == len(plans), preset  # no two plans show the same
        assert STATIC_PLANS[preset][0][1] == {}
        assert plans[0][2] == [p.value for p in Explorer(preset).panes]


def test_the_static_explorer_is_linked_in_the_page_and_light():
    box = static_explorer()
    preset, presets = box.children
    assert list(preset.options) == list(STATIC_PLANS) and len(presets.children) == len(STATIC_PLANS)
    linked = {(link.source[0].model_id, link.target[0].model_id) for link in box.links}
    assert (preset.model_id, presets.model_id) in linked  # the dropdown picks the preset in the browser
    for child, plans in zip(presets.children, STATES.values()):
        choice, stack = child.children
        assert len(stack.children) == len(plans) and (choice.model_id, stack.model_id) in linked
        for pane, (_, heading, tabs) in zip(stack.children, plans):  # the page shows the precomputed state
            assert pane.value == render_details(heading, tabs)
            assert pane.value.count("<details") == len(TAB_TITLES) and "<details open>" in pane.value
    assert not any("pb-needs-kernel" in getattr(w, "_dom_classes", ()) for w in _all(box))  # no kernel needed
    state = json.dumps(widgets.Widget.get_manager_state(widgets=_all(box), drop_defaults=True))
    assert len(state) < 400_000  # saved into the page: a few hundred kB at most


def _all(box):
    out, todo = [], [box]
    while todo:
        w = todo.pop()
        out.append(w)
        todo += list(getattr(w, "children", ()))
        for name in ("layout", "style"):
            if isinstance(getattr(w, name, None), widgets.Widget):
                out.append(getattr(w, name))
    return out
