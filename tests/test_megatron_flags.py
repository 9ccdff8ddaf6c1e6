"""pylib.plan.megatron: every plan the planner enumerates written as Megatron-LM's flags and read back; every option
mapped or named as unmapped; Megatron's own example script read as its layout; bad values named."""

import re
from dataclasses import fields
from pathlib import Path

import pytest

from pylib.analysis import planner as P
from pylib.plan import ParallelConfig, Recompute, RunOptions
from pylib.plan.megatron import MAPPING, from_megatron_args, megatron_args
from pylib.plan.presets import tiny, tiny_moe

B = 8


def _round_trip(plan, world, moe):
    argv = megatron_args(plan.par, plan.run_options, global_batch=B, moe=moe)
    par, options, batch = from_megatron_args(argv, world)
    return argv, par, options, batch


@pytest.mark.parametrize("cfg, world", [(tiny(), 8), (tiny_moe(), 4)], ids=["dense", "moe"])
def test_every_enumerated_plan_round_trips_through_megatron_flags(cfg, world):
    moe = cfg.moe is not None
    space = P.SearchSpace(recompute=("none", "selective", ("full", "block", 2)))
    zero_01 = [p for p in P.enumerate_plans(cfg, world, B, 16, space)]
    plans = [p for p in zero_01 if p.group_size is None]
    assert len(plans) > 50
    for plan in plans:
        argv, par, options, batch = _round_trip(plan, world, moe)
        assert (par, options, batch) == (plan.par, plan.run_options, B), (plan.describe(), argv)
        # the flags read back write the same flags
        assert megatron_args(par, options, global_batch=batch, moe=moe) == argv


def test_every_field_of_the_mesh_and_the_options_has_a_mapping_row():
    recompute = {"recompute"} | {f"recompute.{f.name}" for f in fields(Recompute) if f.name != "granularity"}
    assert set(MAPPING) == {f.name for f in fields(ParallelConfig)} | {f.name for f in fields(RunOptions)} | recompute
    assert [k for k, flags in MAPPING.items() if not flags] == ["dp", "cp_layout", "schedule"]


def test_every_flag_in_the_mapping_is_written_or_read():
    plans = [
        (
            ParallelConfig(tp=2, cp=2, ep=2, etp=2, dp=2, pp=2, order="tp-cp-ep-pp-dp"),
            RunOptions(cp_kind="ulysses", zero_stage=2),
        ),
        (ParallelConfig(tp=2, ep=2, etp=1, dp=2, pp=2), RunOptions(schedule="interleaved", v=2, zero_stage=1)),
        (ParallelConfig(dp=4), RunOptions(recompute=Recompute("full", "block", 2))),
        (ParallelConfig(dp=4), RunOptions(zero_stage=3, recompute="selective")),
    ]
    written = {t for par, o in plans for t in megatron_args(par, o, global_batch=8, moe=True) if t.startswith("--")}
    read_only = {"--num-layers-per-virtual-pipeline-stage", "--recompute-modules"}  # Megatron's other spellings
    mapped = {f for flags in MAPPING.values() for f in flags}
    assert mapped - read_only <= written
    # the other spellings are read: v from layers per chunk, the default module list
    argv = ["--num-layers", "80", "--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage"]
    argv += [
        "10",
        "--recompute-granularity",
        "selective",
        "--recompute-modules",
        "core_attn",
        "--micro-batch-size",
        "1",
    ]
    par, options, batch = from_megatron_args(argv + ["--global-batch-size", "512"], 64)
    assert (par.dp, options.v, options.schedule, options.recompute, options.n_microbatches) == (
        16,
        2,
        "interleaved",
        Recompute("selective"),
        32,
    )


def test_megatron_mixtral_example_reads_as_its_layout():
    """examples/mixtral/train_mixtral_8x7b_distributed.sh (NVIDIA/Megatron-LM 779c5b74), on 4 nodes of 8: TP 1,
    PP 4, EP 8, the distributed optimizer, --sequence-parallel (dropped at TP 1), 256 sequences of 1 per microbatch."""
    argv = (
        "--use-mcore-models --disable-bias-linear --seq-length 4096 --num-layers 32 --hidden-size 4096 "
        "--num-experts 8 --moe-router-topk 2 --moe-grouped-gemm --overlap-param-gather --overlap-grad-reduce "
        "--micro-batch-size 1 --global-batch-size 256 --lr 1e-4 --bf16 --tensor-model-parallel-size 1 "
        "--pipeline-model-parallel-size 4 --expert-model-parallel-size 8 --use-distributed-optimizer "
        "--sequence-parallel"
    ).split()
    par, options, batch = from_megatron_args(argv, 32)
    assert par == ParallelConfig(tp=1, pp=4, ep=8, dp=8, etp=1)
    assert options == RunOptions(sequence_parallel=False, n_microbatches=32, zero_stage=1)
    assert batch == 256
    # Megatron's etp = tp when --expert-tensor-parallel-size is unset
    tp2 = from_megatron_args(["--tensor-model-parallel-size", "2", "--num-experts", "8", "--micro-batch-size=1"], 8)
    assert tp2[0].etp == 2 and tp2[2] == 4


@pytest.mark.parametrize(
    "par, options, moe, named",
    [
        (ParallelConfig(pp=2, dp=2), RunOptions(schedule="gpipe", n_microbatches=2), False, "gpipe"),
        (ParallelConfig(cp=2, dp=2), RunOptions(cp_layout="contiguous"), False, "contiguous"),
        (ParallelConfig(tp=2, dp=2, order="tp-dp-cp-ep-pp"), RunOptions(), False, "tp-dp-cp-ep-pp"),
        (ParallelConfig(ep=2, dp=2), RunOptions(), False, "moe=True"),
        (ParallelConfig(pp=2, dp=2), RunOptions(v=2), False, "v=2"),
        (ParallelConfig(dp=4), RunOptions(n_microbatches=3), False, "global_batch=8"),
    ],
)
def test_an_option_megatron_cannot_run_is_named(par, options, moe, named):
    with pytest.raises(ValueError, match="no Megatron-LM flags") as err:
        megatron_args(par, options, global_batch=8, moe=moe)
    assert named in str(err.value)


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--tensor-model-parallel-size", "four"], "--tensor-model-parallel-size 'four'"),
        (["--decoder-first-pipeline-num-layers", "7"], "--decoder-first-pipeline-num-layers"),
        (["--context-parallel-size", "2", "--cp-comm-type", "p2p", "a2a"], "--cp-comm-type"),
        (["--cp-comm-type", "allgather"], "allgather"),
        (["--recompute-granularity", "selective", "--recompute-modules", "mlp"], "mlp"),
        (["--recompute-granularity", "full"], "--recompute-method"),
        (["--use-megatron-fsdp"], "--data-parallel-sharding-strategy"),
        (["--global-batch-size", "6"], "--global-batch-size 6"),
        (["--micro-batch-size"], "--micro-batch-size needs a value"),
        (["--tensor-model-parallel-size", "3"], "world_size=8"),
    ],
)
def test_a_flag_pylib_cannot_hold_is_named(argv, named):
    argv = argv if "--micro-batch-size" in argv else argv + ["--micro-batch-size", "1"]
    with pytest.raises(ValueError) as err:
        from_megatron_args(argv, 8)
    assert named in str(err.value)


def test_the_cheat_sheet_table_lists_the_flags_of_the_mapping():
    """book/part4/cheatsheet.md prints the mapping as a Markdown table (prose, translated): same fields, same flags."""
    page = (Path(__file__).resolve().parents[1] / "book" / "part4" / "cheatsheet.md").read_text()
    rows = {}
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3:
            rows[cells[0].strip("`")] = tuple(re.findall(r"`(--[a-z0-9-]+)`", cells[1]))
    assert rows == MAPPING
