"""pylib.plan is the torch-free planning layer: importing it (or pylib.analysis, or the planner) loads no torch,
and its ParallelConfig and problems() refuse bad input with a sentence naming the constraint and the numbers."""

import subprocess
import sys

import pytest

from pylib.plan import ParallelConfig, RunOptions, ZeroStage, problems, zero_stage
from pylib.plan.config import ModelConfig
from pylib.plan.split import chunk_layers, stage_layers

DENSE = ModelConfig(vocab_size=64, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=64)


@pytest.mark.parametrize(
    "module", ["pylib.plan", "pylib.plan.presets", "pylib.analysis", "pylib.analysis.planner, pylib.analysis.shapes"]
)
def test_importing_the_planning_layer_loads_no_torch(module):
    code = f"import sys, {module}; bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')]; "
    code += "assert not bad, bad[:5]"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_order_none_is_refused_with_a_sentence():
    with pytest.raises(ValueError, match="order=None must be a string"):
        ParallelConfig(order=None)
    with pytest.raises(ValueError, match="order=3 must be a string"):
        ParallelConfig(tp=2, order=3)


def test_non_integer_batch_and_sequence_are_problems():
    found = problems(DENSE, ParallelConfig(dp=2), 2, batch=8.0, seq=16)
    assert any("batch=8.0 must be a positive integer" in p for p in found), found
    found = problems(DENSE, ParallelConfig(dp=2), 2, batch=8, seq="16")
    assert any("seq='16' must be a positive integer" in p for p in found), found


def test_compose_problems_refuses_a_float_batch():
    from pylib.compose.checks import compose_problems

    assert any("batch=8.0" in p for p in compose_problems(DENSE, ParallelConfig(dp=2), 2, batch=8.0, seq=16))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(dp=2, pp=2, ep=2, order="tp-pp-cp-ep-dp"),  # edp = 4/(1*2*2) = 1, dp = 2: Megatron asserts pp last
        dict(dp=2, pp=2, etp=2, order="pp-tp-cp-ep-dp"),
    ],
)
def test_orders_megatron_refuses_are_refused(kwargs):
    """Megatron-Core's initialize_model_parallel: `order.endswith("pp") or pp == 1 or edp == dp`."""
    with pytest.raises(ValueError, match="does not end in pp.*put pp last in the order"):
        ParallelConfig(**kwargs)
    ParallelConfig(**{**kwargs, "order": "tp-cp-ep-dp-pp"})  # the same sizes with pp last are fine


def test_an_order_not_ending_in_pp_is_fine_when_the_data_parallel_sizes_agree():
    ParallelConfig(tp=2, etp=2, dp=2, pp=2, order="tp-pp-dp")  # edp = 8/(2*1*2) = 2 = dp
    with pytest.raises(ValueError, match="edp = world/\\(etp\\*ep\\*pp\\) = 8/\\(1\\*1\\*2\\) = 4"):
        ParallelConfig(tp=2, dp=2, pp=2, order="tp-pp-dp")  # etp=1 (our default; Megatron's would be etp=tp)


def test_zero_stage_has_one_vocabulary_in_two_spellings():
    assert [s.key for s in ZeroStage] == ["ddp", "zero1", "zero2", "zero3"]
    assert zero_stage("zero2") is ZeroStage.ZERO2 and zero_stage(2) is ZeroStage.ZERO2
    with pytest.raises(ValueError, match="must be one of"):
        zero_stage("zero4")
    assert RunOptions(zero_stage=3).zero_stage is ZeroStage.ZERO3 and RunOptions(zero_stage="zero3").zero_stage == 3
    with pytest.raises(ValueError, match="zero_stage=4 must be one of"):  # refused when the options are built
        RunOptions(zero_stage=4)


def test_the_layer_split_is_one_formula():
    assert stage_layers(8, 2, 2) == [[range(0, 2), range(4, 6)], [range(2, 4), range(6, 8)]]
    assert chunk_layers(8, 2, 2, 1) == stage_layers(8, 2, 2)[1]
    with pytest.raises(ValueError, match="n_layers=6 is not divisible by pp × v = 2 × 2 = 4"):
        chunk_layers(6, 2, 2, 0)


def test_zigzag_needs_the_sequence_divisible_by_two_cp_for_ring_and_ulysses_alike():
    """shard_sequence cuts a zig-zag sequence into 2 cp chunks whatever the attention: s = 12, cp = 4 fails."""
    for kind in ("ring", "ulysses"):
        found = problems(DENSE, ParallelConfig(cp=2), 2, batch=2, seq=6, options=RunOptions(cp_kind=kind))
        assert any("2*cp=4 chunks" in p for p in found), (kind, found)


def test_the_options_have_one_default_that_compose_and_analysis_ask():
    import dataclasses
    import inspect

    from pylib.analysis import planner, shapes
    from pylib.compose import ParallelTransformer
    from pylib.plan import SEQUENCE_PARALLEL

    assert RunOptions().sequence_parallel is SEQUENCE_PARALLEL
    users = [ParallelTransformer.from_full, shapes.activation_shapes, shapes.memory, shapes.traffic, shapes.summary]
    users += [shapes.check_plan]
    for fn in users:
        assert inspect.signature(fn).parameters["options"].default == RunOptions(), fn
    assert {f.name: f.default for f in dataclasses.fields(planner.Plan)}["options"] == RunOptions()
