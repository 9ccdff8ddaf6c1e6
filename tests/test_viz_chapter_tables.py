"""The TP and composition chapters' table rows (`pylib.viz.tp_tables`, `pylib.viz.compose_tables`) say what the
specs, layouts and traces they are handed say: formatting only, nothing invented."""

from fractions import Fraction

import torch

from pylib.model import build_model
from pylib.plan.heads import head_layout
from pylib.plan.presets import tiny
from pylib.runtime import AxisGroup
from pylib.tp import TPTransformer
from pylib.viz.compose_tables import (
    axis_phase_summary,
    fold,
    reduction_rule_rows,
    reduction_rules,
    rule_key,
    shard_axis_rows,
    spans,
    token_rows,
)
from pylib.viz.tp_tables import SPLIT_KINDS, head_layout_rows, shard_spec_rows, trace_summary_rows


def test_shard_spec_rows_are_the_specs_of_layer_0_and_the_ends():
    cfg = tiny().with_(n_layers=2, d_ff=64)
    model = TPTransformer.from_full(build_model(cfg), group=AxisGroup("tp", (0, 1), 0, None))
    specs = model.shard_specs()
    rows = shard_spec_rows(specs)
    kept = [s for s in specs if not s.name.startswith("layers.1")]
    assert [r[0] for r in rows] == [f"`{s.name}`" for s in kept]
    assert [(r[2], r[3]) for r in rows] == [(list(s.full_shape), list(s.local_shape)) for s in kept]
    assert {r[1] for r in rows} <= set(SPLIT_KINDS)


def test_head_layout_rows_name_the_last_ranks_heads_and_the_copies():
    rows = head_layout_rows(8, (8, 2), (1, 4))
    assert rows[0] == ["8 (MHA)", "Q 0–7, K/V 0–7 (split)", "Q 6–7, K/V 6–7 (split)"]
    lay = head_layout(8, 2, 4, 3)
    assert rows[1][2] == f"Q 6–7, K/V {lay.kv_first} (copy ×{lay.kv_replicas})" == "Q 6–7, K/V 1 (copy ×2)"


def test_trace_summary_counts_each_op_once_per_kind_and_shortens_layer_tags():
    events = [("forward", "all_reduce", f"layers.{i}.attn", 64, 32) for i in range(3)]
    events.append(("backward", "all_reduce", "embed", 64, 32))
    assert trace_summary_rows(events) == [
        ["forward", "all_reduce", "attn", 64, 3],
        ["backward", "all_reduce", "embed", 64, 1],
    ]


def test_spans_and_folded_names():
    assert spans([0, 1, 2, 3, 12, 13]) == "0–3, 12–13" and spans([5]) == "5"
    assert fold("layers.1.mlp.experts.experts.0.up_proj.weight") == "layers.1.mlp.experts.*.up_proj.weight"
    assert fold("layers.1.mlp.experts.*.up_proj.weight") == "layers.1.mlp.experts.*.up_proj.weight"
    assert rule_key("layers.3.mlp.experts.experts.2.down_proj.weight") == "layers.*.mlp.experts.*.down_proj.weight"


def test_token_rows_read_the_held_indices():
    S = 4
    held = {0: torch.tensor([[0, 1], [4, 5]]), 1: torch.tensor([[2, 3], [6, 7]])}
    cp_parts = {0: torch.tensor([[0, 1, 2, 3]]), 1: torch.tensor([[0, 1, 2, 3]])}
    mbs = {r: list(held[r].chunk(2)) for r in held}
    coords = [dict(tp=0, cp=0, dp=0, pp=0), dict(tp=1, cp=0, dp=0, pp=0)]
    rows = token_rows(coords, held, cp_parts, mbs, S)
    assert rows[0] == [0, "0 0 0 0", "0–1", "0 / 1", "0–3", "0–1", 4]
    assert rows[1][1] == "1 0 0 0" and rows[1][5] == "2–3"


def test_reduction_rules_group_parameters_by_rule_with_rows_as_columns():
    table = [
        dict(name="layers.0.attn.q_proj.weight", kind="column", pre=None, dp_group="dp-cp", dp_size=4, scale="1"),
        dict(name="layers.2.attn.o_proj.weight", kind="row", pre=None, dp_group="dp-cp", dp_size=4, scale="1"),
        dict(name="layers.1.mlp.experts.experts.0.up_proj.weight", kind="expert", pre=None, dp_group="edp",
             dp_size=2, scale=str(Fraction(1, 2))),
    ]  # fmt: skip
    rules = reduction_rules(table)
    assert list(rules.values()) == [
        ["layers.*.attn.q_proj.weight", "layers.*.attn.o_proj.weight"],
        ["layers.*.mlp.experts.*.up_proj.weight"],
    ]
    rows = reduction_rule_rows(rules, {"column": "a TP shard", "expert": "an expert"})
    assert rows[1][1:] == ["expert (EP)", "—", "edp (2)", "1/2", "an expert"]


def test_shard_axis_rows_and_phase_summary():
    cells = {"embed.weight": {"TP": "vocab [64, 16]→[32, 16]", "DP": "replicated"}}
    assert shard_axis_rows(cells, ["embed.weight"]) == [
        ["`embed.weight`", "vocab [64, 16]→[32, 16]", "—", "—", "—", "replicated"]
    ]
    traffic = {"phases": {"forward": {"all_gather": 4}, "backward": {"reduce_scatter": 4, "all_reduce": 1}}}
    assert axis_phase_summary(traffic) == "forward: all-gather ×4; backward: reduce-scatter ×4, all-reduce ×1"
