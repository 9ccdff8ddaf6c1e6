"""The matrix-view explorer (pylib.viz.explorer): its tables are pylib.analysis.shapes' numbers, every control
recomputes them, a plan that cannot run says why, and the same tables print as plain text. The static explorer is a
form with every control of the live one, whose states (computed in the page by pylib.viz.live) are exactly what the
live explorer and shapes.summary compute; the live controls are marked as needing a kernel."""

import pytest

from pylib.analysis import shapes
from pylib.plan import ParallelConfig, RunOptions
from pylib.viz.explorer import (
    CONTROLS,
    DEFAULT,
    PRESETS,
    TAB_TITLES,
    Explorer,
    live_state_html,
    preset_controls,
    render_details,
    render_tabs,
    render_text,
    static_explorer,
    tables,
)


def test_default_tables_are_the_shapes_of_the_default_plan():
    ex = Explorer()
    cfg, par, b, s, kw = ex.state()
    summary = shapes.summary(cfg, par, b, s, **kw)
    assert not summary.problems
    assert ex.text() == render_text(summary, ex.title())
    head, rows = tables(summary)["weights (article B's [in, out]; per rank)"]
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


# Controls a reader moves in the static explorer's form, on top of a preset (each changes the tables).
MOVES = [
    ("Llama-2-70B (GQA, SwiGLU)", dict(sp=False)),
    ("Llama-2-70B (GQA, SwiGLU)", dict(tp=16, dp=2, b=2)),
    ("Llama-2-70B (GQA, SwiGLU)", dict(cp=4, dp=1, b=1, s=32768)),
    ("GPT-style 70B (MHA, GELU, 4h)", dict(cp=4, dp=1, b=1, s=32768, cp_kind="ulysses")),
    ("Mixtral-8x7B-class MoE", dict(etp=2)),
    ("Mixtral-8x7B-class MoE", dict(zero="zero1")),
    ("DeepSeek-V3-class MoE", dict(ep=32)),
    ("this chapter's probe model", dict(tp=1, cp=2, sp=False)),
]


@pytest.mark.parametrize("preset, controls", MOVES, ids=[f"{p[:12]}-{sorted(c)}" for p, c in MOVES])
def test_the_static_explorer_shows_what_the_live_explorer_computes(preset, controls):
    state = {"preset": preset, **preset_controls(preset), **controls}
    shown = live_state_html(state)
    assert shown != live_state_html({"preset": preset, **preset_controls(preset)})  # the move changes the page
    summary = _summary_from_controls(preset, controls)
    assert not summary.problems, summary.problems
    live = Explorer(preset).set(**controls)  # the live explorer, those controls set one by one
    assert [p.value for p in live.panes] == render_tabs(summary)  # = shapes.summary's tables, without widgets
    assert shown == render_details(live.heading.value, [p.value for p in live.panes])
    assert shown.count("<details") == len(TAB_TITLES) and "<details open>" in shown


def test_the_static_explorer_says_once_why_a_plan_does_not_fit():
    state = {"preset": DEFAULT, **preset_controls(DEFAULT), "layers": 30}
    shown = live_state_html(state)
    assert shown.count("n_layers=30 is not divisible by pp × v = 4 × 1 = 4") == 1 and "<details" not in shown


def test_the_static_explorer_is_a_form_with_every_control_of_the_live_one():
    page = static_explorer()
    names = [f.name for _, fields in page.groups for f in fields]
    assert sorted(names) == sorted(("preset", *CONTROLS))
    assert page.presets == {p: preset_controls(p) for p in PRESETS} and page.kind == "explorer"
    assert page.html == live_state_html(page.state) and page.state == {"preset": DEFAULT, **preset_controls(DEFAULT)}
    shown = page._repr_html_()
    for name in names:
        assert f"name='{name}'" in shown
    assert "pb-needs-kernel" not in shown and "_static/live-explorer.js" in shown
    assert len(shown) < 400_000  # saved into the page: the form, one state and the bundle
