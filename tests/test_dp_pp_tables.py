"""pylib.viz.dp_tables and pylib.viz.pp_tables: each returns the labelled MyST table its chapter shows, one row per
measured item, the numbers as given."""

from __future__ import annotations

import pytest

from pylib.plan import ZeroStage
from pylib.viz import dp_tables, pp_tables


def _rows(table: str) -> list[str]:
    return [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]


def test_share_names_whole_a_dth_or_the_ratio_for_a_zero_stage_its_name_or_its_int():
    measured = {"ddp": {"optim": 400}, "zero1": {"optim": 100}, "zero2": {"optim": 200}}
    assert dp_tables.share(measured, ZeroStage.DDP, "optim", 4) == "whole"
    assert dp_tables.share(measured, "zero1", "optim", 4) == "1/4"
    assert dp_tables.share(measured, 2, "optim", 4) == "0.50"
    with pytest.raises(ValueError, match="must be one of"):
        dp_tables.share(measured, "half", "optim", 4)


def test_dp_tables_carry_their_labels_and_one_row_per_item():
    runs = {2: (0.0, {"all_reduce": 8, "reduce_scatter": 4, "all_gather": 4}, 8)}
    table = dp_tables.all_reduce_two_ways(8, runs)
    assert ":name: tbl-dp-allreduce" in table and len(_rows(table)) == 1
    acc = dp_tables.accumulate({"a": (10, 1.0, 1.0, 0.0), "b": (20, 2.0, 1.0, 0.0)}, 2, 4)
    assert ":name: tbl-dp-accumulate" in acc and len(_rows(acc)) == 2
    events = [{"op": "all_reduce", "phase": "backward"}] * 3
    assert "all-reduce ×3 (backward)" in dp_tables.zero_traffic(
        {"ddp": dict(events=events, padding=0, sent=1, formula=1, loss_err=0.0, param_err=0.0)}, 4, 5
    )


def test_pp_tables_carry_their_labels():
    table = pp_tables.blocking([[2, "1f1b", (1, 2), 0.5, 0.5, 0.5]])
    assert ":name: tbl-pp-blocking" in table and "1 : 2" in _rows(table)[0]
    held = {(2, 1): [[(0, 0, [0, 1], True, False)], [(0, 1, [2, 3], False, True)]]}
    stages = pp_tables.stages(4, held)
    assert ":name: tbl-pp-stages" in stages and "+ embedding" in _rows(stages)[0]
