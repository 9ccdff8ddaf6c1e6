"""Every figure the book draws is on the shared style's card: each public figure function of pylib.viz, driven with
the small inputs of its own tests, returns a Figure whose background (and every axes' background) is `style.CARD`,
opaque, and leaves matplotlib's rcParams as it found them."""

import ast
import importlib
import inspect
import io
import pkgutil
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import pylib.viz  # noqa: E402
import pylib.viz.ep_balance as ep_balance  # noqa: E402
from pylib.analysis import pp as pp_analysis  # noqa: E402
from pylib.analysis.dp import hsdp_link_totals  # noqa: E402
from pylib.cp import allgather_block_plan, ring_rounds, sequence_positions  # noqa: E402
from pylib.ep.folding import folding_groups  # noqa: E402
from pylib.experiments.seed_a_routing import seed_a_routing_table  # noqa: E402
from pylib.experiments.tp_runs import column_row_example, layer_traces  # noqa: E402
from pylib.model import ModelConfig, build_model  # noqa: E402
from pylib.plan.mesh import hsdp_groups  # noqa: E402
from pylib.plan.presets import tiny, tiny_layer, tiny_odd
from pylib.plan.schedules import build  # noqa: E402
from pylib.pp.simulate import simulate  # noqa: E402
from pylib.pp.timeline import bubble  # noqa: E402
from pylib.runtime import ParallelConfig, launch  # noqa: E402
from pylib.runtime.mesh import AxisGroup  # noqa: E402
from pylib.runtime.profile import lanes  # noqa: E402
from pylib.seedcheck.axis_cuts import DIMS, MODES  # noqa: E402
from pylib.seedcheck.layer_flow import layer_flow  # noqa: E402
from pylib.viz import checkpoint as ckpt  # noqa: E402
from pylib.viz import (  # noqa: E402
    collectives,
    compose,
    cp,
    dp,
    ep,
    ep_dispatch,
    ep_overlap,
    matrix_dims,
    pp,
    profile,
    style,
    three_axes,
    tp,
)
from pylib.viz import fp8 as fp8_viz
from pylib.viz import layer_flow as flow
from tests.test_ep_overlap import two_micro_batch_timelines
from tests.test_profile import merged_example
from tests.test_viz_ring_overlap import timelines_of_two_steps
from tests.test_viz_tp_block import example_without_ranks

# A figure function, by its name: fig_*, plot_*, draw_*, *_figure. Each one needs a case in CASES below.
FIGURE_NAME = re.compile(r"^(fig|plot|draw)_|_figure$")


def public_figure_functions() -> set[str]:
    """ "module.function" for every public figure function of every module in pylib/viz."""
    found = set()
    for info in pkgutil.iter_modules(pylib.viz.__path__):
        module = importlib.import_module(f"pylib.viz.{info.name}")
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ == module.__name__ and not name.startswith("_") and FIGURE_NAME.search(name):
                found.add(f"{info.name}.{name}")
    return found


# ------------------------------------------------------------------------------------------------ inputs


def _lab_times():
    from pylib.labs.course import read_times
    from pylib.viz.lab_times import plot_times

    return plot_times(read_times())


def _cp_rank():
    from pylib.cp import RingStats, ring_attention, shard_sequence
    from pylib.runtime import trace

    r, n = dist.get_rank(), dist.get_world_size()
    x = torch.randn(1, 2, 16, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    out = {}
    for layout in ("contiguous", "zigzag"):
        q = shard_sequence(x, 2, r, n, layout)
        stats = RingStats()
        with trace() as tr:
            ring_attention(q, q, q, causal=True, layout=layout, stats=stats)
        out[layout] = ([e.as_dict() for e in tr.events], stats.work("forward", "computed"))
    return out


def _dp_rank():
    from pylib.experiments.dp_training import train_data_parallel

    cfg = tiny_odd()
    return {s: train_data_parallel(cfg, s, steps=1, bucket_bytes=1024, keep_events=False) for s in ("ddp", "zero3")}


@pytest.fixture(scope="module")
def runs():
    """The real runs some figures draw: a 4-rank causal ring (both layouts), 2-rank DP (DDP and ZeRO-3), the 2-rank
    column / row TP example."""
    return dict(cp=launch(_cp_rank, 4), dp=launch(_dp_rank, 2), tp=column_row_example(t=2))


def _seed_a_flow():
    model = build_model(ModelConfig.seed_a())
    with torch.no_grad():
        x = model.embed(torch.arange(8).view(2, 4))
    return layer_flow(model.layers[0], x)


def _three_axes():
    idx = torch.arange(2 * 4 * 4).view(2, 4, 4)
    holdings = {
        "sequence": [t.reshape(-1) for t in idx.chunk(2, dim=1)],
        "batch": [t.reshape(-1) for t in idx.chunk(2, dim=0)],
    }
    return three_axes.draw_three_axes(holdings, (2, 4, 4), [["the", "cat", "sat", "down"], ["a", "dog", "ran", "off"]])


def _expert_holdings():
    from pylib.ep import ExpertParallelMoE
    from pylib.model.moe import MoE
    from pylib.plan.config import MoEConfig

    with torch.random.fork_rng():
        torch.manual_seed(0)
        moe = MoE(8, 16, MoEConfig(n_experts=4, top_k=2)).double()
    held = []
    for rank in range(4):  # ep = 2, etp = 2, as in tests/test_ep_balance.py
        ep_group = AxisGroup("ep", (rank % 2, rank % 2 + 2), rank // 2, None)
        etp_group = AxisGroup("etp", (rank - rank % 2, rank - rank % 2 + 1), rank % 2, None)
        held.append(ep.expert_holdings(ExpertParallelMoE(moe, ep_group, etp_group, None).param_map()))
    return held


def _cp_specs():
    from pylib.cp import CPTransformer

    model = build_model(tiny_layer())
    group = [AxisGroup("cp", (0, 1, 2, 3), r, None) for r in range(4)]
    return [CPTransformer.from_full(model, group=g, layout="zigzag").shard_specs(2, 16) for g in group]


def _bubble_rows():
    rows = []
    for name, v in [("1f1b", 1), ("interleaved", 2)]:
        for m in (4, 8, 16):
            measured = bubble(simulate(build(name, 4, m, v))).mean_relative
            rows.append(dict(schedule=name, m=m, formula=pp_analysis.bubble_fraction(4, m, v), measured=measured))
    return rows


def _stage_specs(p, v):
    from pylib.pp.split import shard_specs

    model = build_model(tiny().with_(n_layers=8, dtype="float32"))
    return [shard_specs(model, r, p, v) for r in range(p)]


def _flat_layout():
    from pylib.dp.layout import single_flat

    params = [("c.bias", (3,)), ("c.weight", (3, 5)), ("b.weight", (7, 3)), ("a.bias", (5,)), ("a.weight", (5, 2))]
    return single_flat("unit", params, element_size=8, parts=3)


def _dim_orth():
    cuts = {m: dict.fromkeys(DIMS, 1.0) for m in MODES}
    for mode, dim in [
        ("TP", "n_head"),
        ("TP", "h_ffn"),
        ("SP", "s"),
        ("CP", "s"),
        ("DP", "b"),
        ("PP", "L"),
        ("EP", "E"),
    ]:
        cuts[mode][dim] = 0.5
    return matrix_dims.fig_dim_orth(cuts)


def _superposition():
    pieces = [
        dict(rows=[i], positions=[0, 1], hidden_cols=[0, 1, 2, 3], coords=dict(tp=0, cp=0, dp=i)) for i in range(2)
    ]
    return matrix_dims.fig_superposition(pieces, 2, 2, 4, 1, 1, 2)


def _report_rows():
    """compose.report_rows' shape for two ranks: bytes held by kind, and (bytes sent, ops) per mesh axis."""
    return [
        dict(rank=r, params=100 + r, grads=100, optim=200, activations=50, traffic={"tp": (64, 64), "dp": (32, 32)})
        for r in range(2)
    ]


def _collective_shards():
    """The primer's four collectives on 4 ranks, computed in one process from the same blocks (10*rank + j)."""
    from pylib.experiments.collective_runs import block_values

    xs = torch.stack([block_values(r, 4) for r in range(4)])
    after = {
        "all-reduce": [xs.sum(0)] * 4,
        "reduce-scatter": [xs.sum(0)[r : r + 1] for r in range(4)],
        "all-gather": [xs.diagonal()] * 4,
        "all-to-all": [xs[:, r] for r in range(4)],
    }
    before = {name: xs for name in after} | {"all-gather": xs.diagonal()[:, None]}
    return collectives.fig_collective_shards([(name, before[name], after[name]) for name in after])


def _ring_steps():
    """The ring all-reduce's contributors on 4 ranks, as pylib.experiments.collective_runs.ring_contributors
    gives them: a real 4-rank run of ring_all_reduce."""
    from pylib.experiments.collective_runs import power_of_ten, ring_all_reduce, ring_contributors

    def rank():
        steps = []
        ring_all_reduce(power_of_ten(dist.get_rank(), 8), steps=steps)
        return steps

    return collectives.fig_ring_steps(ring_contributors(launch(rank, 4)))


def _plan_frontier():
    """The planner's figure for a job small enough to predict in a fraction of a second (the chapter's: 64 GPUs)."""
    from dataclasses import replace

    from pylib.viz import planner

    job = replace(planner.preset_job("Llama-2-7B-class dense"), world=4, batch=4, seq=1024)
    return planner.fig_plan_frontier(
        planner.feasible_plans(job), planner.best_plans(job, top=1)[0], job.cluster.usable_memory
    )


def _moe_memory():
    """The planner chapter's DeepSeek-V3 figure: its published layout, the report's recomputation and the fit."""
    from pylib.analysis import calibration as C
    from pylib.viz import planner

    check = C.moe_layout_check()
    pairs = [
        ("report's recomputation", check.report),
        ("in FP8, with the report's storage", check.v3_report),
        ("+ the MoE layer recomputed", check.fitting),
    ]
    return planner.fig_moe_memory(pairs, check.cluster.gpu_memory)


def _schedules_on_chapter_axes():
    """pp.md's use: the chapter makes the axes with style.subplots and hands each to a pp figure function."""
    fig, axes = style.subplots(2, 1, figsize=(9, 5))
    for ax, name in zip(axes, ("gpipe", "1f1b")):
        pp.plot_schedule(build(name, 4, 8), ax=ax)
    return fig


def _spiky_activation():
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(0))
    x[:, :4] *= 1e5
    return x


CASES = {
    "tp.fig_column_vs_row": lambda runs: tp.fig_column_vs_row(runs["tp"]),
    "tp.fig_sp_region": lambda runs: tp.fig_sp_region(layer_traces(t=2, b=1, s=8)),
    "tp.fig_tp_block": lambda runs: tp.fig_tp_block(example_without_ranks()),
    "tp.fig_vocab_padding": lambda runs: tp.fig_vocab_padding([(37, 4, 8, 64), (128256, 8, 128, 129024)]),
    "cp.ring_rounds_figure": lambda runs: cp.ring_rounds_figure(ring_rounds([r["zigzag"][0] for r in runs["cp"]])),
    "cp.zigzag_balance_figure": lambda runs: cp.zigzag_balance_figure(
        {layout: [r[layout][1] for r in runs["cp"]] for layout in ("contiguous", "zigzag")}
    ),
    "cp.causal_ownership_figure": lambda runs: cp.causal_ownership_figure(16, 4),
    "cp.sequence_split_figure": lambda runs: cp.sequence_split_figure(_cp_specs(), 16),
    "cp.allgather_figure": lambda runs: cp.allgather_figure(
        [
            dict(
                positions=sequence_positions(16, r, 4).tolist(),
                blocks=allgather_block_plan(r, 4, 4, causal=True, layout="zigzag"),
                sent=1536,
            )
            for r in range(4)
        ],
        16,
    ),
    "cp.ring_overlap_figure": lambda runs: cp.ring_overlap_figure(timelines_of_two_steps()),
    "ep_overlap.ep_overlap_figure": lambda runs: ep_overlap.ep_overlap_figure(two_micro_batch_timelines()),
    "cp.merge_drift_figure": lambda runs: cp.merge_drift_figure(
        [dict(cp=c, bf16_merge=1e-3 * c, fp32_merge=2e-4) for c in (1, 2, 4, 8)]
    ),
    "ep.plot_routing_table": lambda runs: ep.plot_routing_table(seed_a_routing_table(), 8, 4),
    "ep.plot_traffic_matrix": lambda runs: ep.plot_traffic_matrix(
        [[0, 64, 32, 0], [32, 0, 0, 96], [0, 0, 32, 32], [64, 32, 0, 0]]
    ),
    "ep.plot_folding": lambda runs: ep.plot_folding(
        folding_groups(ParallelConfig(tp=2, cp=2, dp=2, pp=2, ep=4), 16), 16
    ),
    "ep.plot_load_balance": lambda runs: ep.plot_load_balance({"a": [2.0, 1.5, 1.2], "b": [1.9, 1.9, 2.0]}),
    "ep.plot_dropped": lambda runs: ep.plot_dropped([0.5, 1.0], {"r": [0.5, 0.1]}),
    "ep_balance.plot_balance_during_training": lambda runs: ep_balance.plot_balance_during_training(
        {"a": [2.0, 1.5, 1.2], "b": [1.9, 1.8, 2.0]}, [[0.0, 0.0], [0.01, -0.01], [0.02, -0.02]]
    ),
    "ep.plot_expert_placement": lambda runs: ep.plot_expert_placement(_expert_holdings(), 4, 16),
    "ep_dispatch.plot_node_bytes": lambda runs: ep_dispatch.plot_node_bytes(
        {"a": dict(intra=260, inter=500, inter_dedup=246), "b": dict(intra=266, inter=476, inter_dedup=119)},
        {"expected a": 246.0, "expected b": 128.0},
    ),
    "ep_dispatch.plot_dispatcher_bytes": lambda runs: ep_dispatch.plot_dispatcher_bytes(
        [1, 4, 8, 12], {"x": [1, 4, 8, 12], "y": [6, 7, 8, 9]}, {"x": [1, 4, 8, 12], "y": [6, 7, 8, 9]}, 7.0
    ),
    "profile.plot_profile": lambda runs: profile.plot_profile(*lanes(merged_example())),
    "pp.plot_timeline": lambda runs: pp.plot_timeline(simulate(build("1f1b", 2, 4), cost_comm=0.2), title="1F1B"),
    "pp.plot_schedule": lambda runs: pp.plot_schedule(build("interleaved", 4, 8, 2)),
    "pp.plot_bubble_sweep": lambda runs: pp.plot_bubble_sweep(_bubble_rows()),
    "pp.plot_stage_map": lambda runs: pp.plot_stage_map(_stage_specs(2, 2)),
    "dp.plot_zero_memory": lambda runs: dp.plot_zero_memory(
        {s: runs["dp"][0][s]["memory"] for s in ("ddp", "zero3")}, unit="B"
    ),
    "dp.plot_bucket_overlap": lambda runs: dp.plot_bucket_overlap([r["ddp"]["overlap"] for r in runs["dp"]]),
    "dp.plot_dp_matrix": lambda runs: dp.plot_dp_matrix(4, 8, 9, 22),
    "dp.plot_hsdp_mesh": lambda runs: dp.plot_hsdp_mesh(
        *hsdp_groups(range(8), 4), hsdp_link_totals(17_632, 2, 4), unit="KiB"
    ),  # the chapter's 2 x 4 mesh, with the bytes its formula gives (the traced run equals it: test_dp_hsdp.py)
    "dp.plot_flat_layout": lambda runs: dp.plot_flat_layout(_flat_layout()),
    "dp.plot_zero3_resident": lambda runs: dp.plot_zero3_resident(
        runs["dp"][0]["zero3"]["timeline"], sum(runs["dp"][0]["zero3"]["unit_bytes"].values()) // 2, unit="B"
    ),
    "layer_flow.draw_layer_flow": lambda runs: flow.draw_layer_flow(
        _seed_a_flow(), colours={1: "green", 3: "red", 5: "green"}, legend={"green": "token-local", "red": "global"}
    ),
    "three_axes.draw_three_axes": lambda runs: _three_axes(),
    "matrix_dims.fig_dim_orth": lambda runs: _dim_orth(),
    "matrix_dims.fig_col_row": lambda runs: matrix_dims.fig_col_row(runs["tp"]),
    "matrix_dims.fig_superposition": lambda runs: _superposition(),
    "collectives.fig_collective_shards": lambda runs: _collective_shards(),
    "collectives.fig_ring_steps": lambda runs: _ring_steps(),
    "compose.plot_rank_mesh": lambda runs: compose.plot_rank_mesh(ParallelConfig(tp=2, cp=2, dp=2, pp=2, ep=4), 16),
    "compose.plot_token_placement": lambda runs: compose.plot_token_placement(
        torch.arange(8).repeat_interleave(4).reshape(4, 8), microbatch_rows=1, dp_rows=2
    ),
    "compose.plot_rank_report": lambda runs: compose.plot_rank_report(_report_rows(), unit="B"),
    "planner.fig_plan_frontier": lambda runs: _plan_frontier(),
    "planner.fig_moe_memory": lambda runs: _moe_memory(),
    "lab_times.plot_times": lambda runs: _lab_times(),  # book/labs/instructor.md, from the committed labs/times.json
    "checkpoint.plot_resharding": lambda runs: ckpt.plot_resharding(
        {r: {"model": 5120 + 256 * r, "exp_avg": 5632, "exp_avg_sq": 5632} for r in range(8)},
        {b: {a: 1024 * (1 + (a + b) % 3) for a in range(8) if (a + b) % 4} for b in range(8)},
        saved_on="tp2 dp2 pp2",
        loaded_on="tp4 dp2",
    ),
    "fp8.plot_formats": lambda runs: fp8_viz.plot_formats(),
    "fp8.plot_scaling": lambda runs: fp8_viz.plot_scaling(_spiky_activation()),
    "fp8.plot_loss_parity": lambda runs: fp8_viz.plot_loss_parity(
        {"fp32": [5.0, 4.0, 3.1], "bf16": [5.0, 4.0, 3.0], "delayed": [5.0, 4.01, 3.02]}, 0.02
    ),
}
# Figures a chapter assembles itself from axes it made (not a public function of pylib.viz).
ASSEMBLED = {
    "pp.plot_schedule on style.subplots axes": lambda runs: _schedules_on_chapter_axes(),
    "pp.plot_schedule zero bubble (B, W split)": lambda runs: pp.plot_schedule(build("zb-h2", 4, 8)),
}


def test_every_public_figure_function_has_a_case():
    found = public_figure_functions()
    assert not found - set(CASES), f"add a case to CASES in {__file__} for {sorted(found - set(CASES))}"
    assert not set(CASES) - found, f"CASES names figure functions pylib.viz does not have: {sorted(set(CASES) - found)}"


@pytest.mark.parametrize("name", sorted(CASES) + sorted(ASSEMBLED))
def test_figure_is_drawn_on_the_card_and_legible_at_page_width(name, runs):
    """Each figure, drawn once: a Figure on the card (its background and every axes' is `style.CARD`) that leaves
    rcParams as it found them, and whose smallest text, shown in the content column (scaled down when wider), is at
    least style.LEGIBLE_PX pixels high: no digits a reader cannot read. On a phone too: in the 390-px screen's
    column (style.PHONE_COLUMN_PX), held at the width show_as_svg writes for it (style.phone_metadata)."""
    before = dict(matplotlib.rcParams)
    fig = {**CASES, **ASSEMBLED}[name](runs)
    assert isinstance(fig, Figure), f"{name} returned a {type(fig).__name__}, not a matplotlib Figure"
    card = matplotlib.colors.to_rgba(style.CARD)
    assert fig.get_facecolor() == card, f"{name}: figure background {fig.get_facecolor()}"
    for ax in fig.axes:
        assert ax.get_facecolor() == card, f"{name}: axes {ax.get_title()!r} background {ax.get_facecolor()}"
    assert dict(matplotlib.rcParams) == before, f"{name} left rcParams changed"
    fig.canvas.draw()  # tick labels exist once drawn
    px = style.smallest_text_px(fig)
    svg = io.StringIO()
    fig.savefig(svg, format="svg", bbox_inches="tight")  # as the notebook saves it (style.show_as_svg)
    width_pt = float(re.search(r'<svg[^>]*\swidth="([0-9.]+)pt"', svg.getvalue())[1])
    phone_width = style.phone_metadata(fig, svg.getvalue()).get("width")
    phone_px = style.shown_text_px(fig, style.PHONE_COLUMN_PX, width_pt, phone_width)
    plt.close(fig)
    assert px >= style.LEGIBLE_PX, f"{name}: smallest text {px:.1f} px at a {style.COLUMN_PX} px column"
    assert phone_px >= style.LEGIBLE_PX, f"{name}: smallest text {phone_px:.1f} px on a phone, shown {phone_width} px"


def test_figure_modules_return_figures_and_leave_showing_and_the_backend_to_the_notebook():
    """A figure function returns its Figure: showing it, or choosing a backend, is the caller's (a chapter glues the
    figure through the inline backend, which style.show_as_svg sets to SVG, its format and not its backend; a test
    draws with Agg). No module of pylib.viz calls show(), ion(), switch_backend() or matplotlib.use()."""
    for info in pkgutil.iter_modules(pylib.viz.__path__):
        tree = ast.parse(inspect.getsource(importlib.import_module(f"pylib.viz.{info.name}")))
        calls = [n.func for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
        found = [
            ast.unparse(f)
            for f in calls
            if f.attr in ("show", "ion", "switch_backend")
            or (f.attr == "use" and isinstance(f.value, ast.Name) and f.value.id in ("matplotlib", "mpl"))
        ]
        assert not found, f"pylib/viz/{info.name}.py calls {found}"
