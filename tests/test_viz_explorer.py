"""The matrix-view explorer (pylib.viz.explorer): its tables are pylib.analysis.shapes' numbers, every control
recomputes them, a plan that cannot run says why, and the same tables print as plain text."""

from pylib.analysis import shapes
from pylib.viz.explorer import PRESETS, Explorer, render_text, tables


def test_default_tables_are_the_shapes_of_the_default_plan():
    ex = Explorer()
    cfg, par, b, s, kw = ex.state()
    summary = shapes.summary(cfg, par, b, s, **kw)
    assert not summary.problems
    assert ex.text() == render_text(summary, ex.title())
    head, rows = tables(summary)["weights (seed B's [in, out]; per rank)"]
    (wq,) = [r for r in rows if r[0] == "W_Q"]
    assert wq[3] == f"[{cfg.d_model}, {cfg.d_model // par.tp}]"  # seed B's [in, out]: heads cut by TP
    assert "[8192, 1024]" in ex.out.value  # the same row in the HTML widget


def test_every_control_recomputes_the_tables():
    ex = Explorer()
    before = ex.out.value
    ex.axes["tp"].value = 16  # more TP ranks than K/V heads: the K/V head is replicated
    assert ex.out.value != before
    assert "[8192, 128]" in ex.out.value  # W_K [h, h_kv/8]: one K/V head of d_head = 128 per rank
    assert "one K/V head held by 2 TP ranks" in ex.text()
    ex.sp.value = False
    assert "all_reduce" in ex.text() and "all_gather" not in ex.text()
    ex.stage.value = "last"
    assert "pipeline rank 3" in ex.text()


def test_an_impossible_plan_names_the_constraint():
    ex = Explorer()
    ex.layers.value = 30  # pp = 4 does not divide 30 layers
    assert "n_layers=30 is not divisible by pp × v = 4 × 1 = 4" in ex.out.value
    ex.heads.value = 60  # 60 heads do not divide h = 8192: the model itself cannot be built
    assert "n_heads=60 does not divide d_model=8192" in ex.text()


def test_every_preset_loads_a_plan_that_runs():
    ex = Explorer()
    for name in PRESETS:
        ex.preset.value = name
        assert not ex.summary().problems, (name, ex.summary().problems)
        assert "traffic of this rank" in ex.out.value
    ex.preset.value = "DeepSeek-V3-class MoE"
    assert ex.experts.value == 256 and "expert input (expected)" in ex.text()
