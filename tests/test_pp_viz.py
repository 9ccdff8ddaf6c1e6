"""The pipeline figures draw what the timeline holds: one bar per forward/backward, the idle time hatched."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from pylib.analysis import pp as A  # noqa: E402
from pylib.model import build_model, random_tokens  # noqa: E402
from pylib.plan.presets import tiny  # noqa: E402
from pylib.plan.schedules import build  # noqa: E402
from pylib.pp.pipeline import PipelineParallel  # noqa: E402
from pylib.pp.simulate import simulate  # noqa: E402
from pylib.pp.timeline import bubble, idle_intervals  # noqa: E402
from pylib.runtime import launch  # noqa: E402
from pylib.viz.pp import plot_bubble_sweep, plot_schedule, plot_stage_map, plot_timeline  # noqa: E402

pytestmark = pytest.mark.timeout(90)

CFG = tiny()


def _patches(fig, gid):
    return [p for ax in fig.axes for p in ax.patches if p.get_gid() == gid]


@pytest.mark.parametrize("name, v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_schedule_figure_draws_every_compute_and_shades_exactly_the_bubble(name, v):
    sched = build(name, 4, 8, v)
    fig = plot_schedule(sched)
    events = simulate(sched, sends="eager")
    assert len(_patches(fig, "compute")) == 2 * 4 * 8 * v
    shaded = sum(p.get_width() for p in _patches(fig, "bubble"))
    assert shaded == pytest.approx(sum(bubble(events).idle))
    assert f"{A.bubble_fraction(4, 8, v):.3f}" in fig.axes[0].get_title()


def _timeline():
    pipe = PipelineParallel(build_model(CFG))
    ids, targets = random_tokens(CFG, 4, 8)
    return [e.as_dict() for e in pipe.step(ids, targets, schedule="1f1b", n_microbatches=4).timeline]


def test_timeline_figure_from_a_real_run_draws_its_events_and_idle_time():
    timeline = [e for rank in launch(_timeline, 2, timeout=60) for e in rank]
    fig = plot_timeline(timeline, title="1F1B, measured")
    assert len(_patches(fig, "compute")) == 2 * 2 * 4
    idle = sum(t1 - t0 for r in range(2) for t0, t1 in idle_intervals(timeline, r))
    assert sum(p.get_width() for p in _patches(fig, "bubble")) == pytest.approx(idle)
    assert len(_patches(fig, "comm")) == sum(
        1 for e in timeline if e["kind"] in ("send", "recv") and e["end"] > e["start"]
    )


def test_bubble_sweep_figure_plots_formula_and_measurements():
    rows = [
        dict(
            schedule=name,
            m=m,
            formula=A.bubble_fraction(4, m, v),
            measured=bubble(simulate(build(name, 4, m, v))).mean_relative,
        )
        for name, v in [("1f1b", 1), ("interleaved", 2)]
        for m in (4, 8, 16)
    ]
    fig = plot_bubble_sweep(rows)
    lines = fig.axes[0].get_lines()
    assert len(lines) == 4
    formula_1f1b = [ln for ln in lines if ln.get_label() == "1f1b: formula"][0]
    assert list(formula_1f1b.get_ydata()) == pytest.approx([0.75, 0.375, 0.1875])


def test_stage_map_draws_one_cell_per_block_and_one_arrow_per_stage_boundary():
    from pylib.pp.split import shard_specs

    model = build_model(tiny().with_(n_layers=8, dtype="float32"))
    for p, v in [(4, 1), (2, 2), (2, 4)]:
        fig = plot_stage_map([shard_specs(model, r, p, v) for r in range(p)])
        assert len(_patches(fig, "stage-cell")) == 8 + 2  # embedding, 8 layers, ln_f + LM head
        arrows = [t for t in fig.axes[0].texts if t.get_gid() == "p2p"]
        assert len(arrows) == p * v - 1
        assert f"{p * v - 1} stage boundaries" in fig.axes[0].get_title()
        matplotlib.pyplot.close(fig)


def test_stage_map_refuses_specs_that_cut_a_tensor():
    from pylib.runtime.sharding import ShardSpec

    cut = ShardSpec("layers.0.mlp.up_proj.weight", "tp", 0, "column", (32, 16), (16, 16))
    with pytest.raises(ValueError, match="is cut on rank 0"):
        plot_stage_map([[cut]])


def test_timelines_share_one_time_axis_when_given_xlim_and_label_only_bars_wide_enough():
    sched = build("interleaved", 4, 8, 2)
    squeezed = plot_schedule(sched, xlim=(0, 100))
    assert squeezed.axes[0].get_xlim() == (0, 100)

    def drawn(fig):
        return sum(len(t.get_text()) for t in fig.axes[0].texts)

    assert 0 < drawn(squeezed) < drawn(plot_schedule(sched))  # narrower bars: shorter labels ("3" for "3.1")


@pytest.mark.parametrize("name", ["zb-h1", "zb-h2"])
def test_zero_bubble_figure_draws_w_in_its_own_colour_and_names_f_b_w_in_the_legend(name):
    import matplotlib.colors as mc

    from pylib.viz import pp, style

    sched = build(name, 4, 8)
    fig = plot_schedule(sched)  # the schedule's own costs: F 1, B 1, W 1
    events = simulate(sched, 1.0, 1.0, sends="eager", cost_w=1.0)
    bars = _patches(fig, "compute")
    assert len(bars) == 3 * 4 * 8  # an F, a B and a W per (rank, microbatch)
    colours = [mc.to_hex(b.get_facecolor()) for b in bars]
    for kind, colour in [("F", style.FORWARD), ("B", style.BACKWARD), ("W", pp.WEIGHT_GRAD)]:
        assert colours.count(colour) == sum(1 for e in events if e.kind == kind) == 4 * 8, kind
    assert len({style.FORWARD, style.BACKWARD, pp.WEIGHT_GRAD, style.WASTE}) == 4
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend[:3] == ["F: forward", "B: input gradient", "W: weight gradient"]
    shaded = sum(p.get_width() for p in _patches(fig, "bubble"))
    assert shaded == pytest.approx(sum(bubble(events).idle))


def test_fused_schedule_figure_keeps_the_two_kind_legend():
    fig = plot_schedule(build("1f1b", 4, 8))
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend[:2] == ["forward", "backward"] and "W: weight gradient" not in legend
