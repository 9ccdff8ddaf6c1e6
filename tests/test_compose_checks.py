"""The composed model refuses configurations that cannot run, naming every violated constraint at once; and the
data layout helpers agree with the modes' own sharding (no processes needed)."""

import pytest
import torch

from pylib.compose import ComposeConfigError, check_compose, compose_problems, holder_labels
from pylib.cp import shard_sequence
from pylib.model import ModelConfig, MoEConfig
from pylib.plan import RunOptions
from pylib.plan.presets import tiny
from pylib.runtime import ParallelConfig, launch

DENSE = tiny()
MOE = DENSE.with_(moe=MoEConfig(n_experts=4, top_k=2, every=2))


def test_every_violated_constraint_is_listed_not_only_the_first():
    cfg = ModelConfig(
        vocab_size=30,
        d_model=18,
        n_layers=3,
        n_heads=6,
        n_kv_heads=3,
        d_ff=30,
        moe=MoEConfig(n_experts=6, top_k=2, d_ff=10, every=3),
    )
    pc = ParallelConfig(tp=4, cp=3, dp=2, pp=2, ep=4, etp=3)
    options = RunOptions(
        sequence_parallel=False,
        cp_kind="ulysses",
        schedule="interleaved",
        n_microbatches=3,
        v=2,
    )  # a bad single field (zero_stage=4) is refused when RunOptions is built: tests/test_validation.py
    problems = compose_problems(cfg, pc, 32, batch=9, seq=20, options=options)
    expected = [
        "world_size=32 != tp*cp*dp*pp = 4*3*2*2 = 48",  # sizes vs world
        "etp*ep*pp = 3*4*2 = 24 does not divide world_size=32",  # folding
        "tp=4 does not divide n_heads=6",  # heads vs tp
        "tp=4 does not divide d_ff=30",  # dense h_ffn vs tp
        "tp=4 does not divide vocab_size=30",
        "ep=4 does not divide n_experts=6",  # experts vs ep
        "etp=3 does not divide expert h_ffn=10",  # expert h_ffn vs etp
        "need sequence_parallel=True to train",  # MoE with TP > 1 without SP (a training rule)
        "n_layers=3 is not divisible by pp × v = 2 × 2 = 4",  # layers vs pp*v
        "interleaved 1F1B needs m divisible by p: m=3, p=2",  # microbatches vs schedule
        "dp=2 does not divide the global batch size B=9",  # batch vs dp
        "sequence length s=20 is not divisible by 6",  # sequence vs 2*cp (zig-zag)
    ]
    for text in expected:
        assert any(text in p for p in problems), (text, problems)
    assert len(problems) >= len(expected)
    with pytest.raises(ComposeConfigError) as info:
        check_compose(cfg, pc, 32, batch=9, seq=20, options=options)
    assert info.value.problems == problems
    assert f"({len(problems)} problem(s))" in str(info.value)


def test_sequence_must_split_over_cp_zigzag_then_tp_and_batch_over_dp_then_microbatches():
    pc = ParallelConfig(tp=4, cp=2, dp=2)
    problems = compose_problems(DENSE, pc, 16, options=RunOptions(n_microbatches=3), batch=8, seq=12)
    assert any("tp does not divide 6" in p for p in problems), problems  # s/cp = 6 tokens over tp=4 (SP)
    assert any(
        "n_microbatches=3 does not divide the batch per data-parallel rank B/dp = 8/2 = 4" in p for p in problems
    ), problems
    assert compose_problems(DENSE, pc, 16, options=RunOptions(n_microbatches=2), batch=8, seq=16) == []
    # without SP the CP rank's sequence need not split over tp
    assert not any(
        "tp does not divide" in p
        for p in compose_problems(DENSE, pc, 16, options=RunOptions(sequence_parallel=False), seq=12)
    )


def test_ulysses_needs_whole_heads_per_rank_after_tp():
    gqa = DENSE.with_(n_kv_heads=2)
    problems = compose_problems(gqa, ParallelConfig(tp=2, cp=2), 4, options=RunOptions(cp_kind="ulysses"))
    assert len(problems) == 1 and "n_kv_head=1" in problems[0] and "after tp=2" in problems[0], problems
    assert compose_problems(gqa, ParallelConfig(tp=2, cp=2), 4, options=RunOptions(cp_kind="ring")) == []


@pytest.mark.parametrize(
    "cfg, pc, world, options",
    [
        (DENSE, ParallelConfig(tp=2, cp=2, dp=2, pp=2), 16, RunOptions(schedule="1f1b", n_microbatches=2)),
        (
            MOE,
            ParallelConfig(tp=2, cp=2, dp=2, pp=2, ep=2),
            16,
            RunOptions(schedule="interleaved", n_microbatches=2, v=2),
        ),
        (MOE, ParallelConfig(tp=2, dp=4, ep=4), 8, RunOptions(zero_stage=3)),
        (MOE, ParallelConfig(tp=4, cp=2, dp=2, ep=4), 16, RunOptions(cp_kind="ring", zero_stage=2)),
        (MOE, ParallelConfig(tp=2, dp=2, pp=2, ep=2, order="tp-cp-ep-pp-dp"), 8, RunOptions(n_microbatches=2)),
        (DENSE, ParallelConfig(tp=2, dp=2, pp=2, etp=2, order="tp-cp-ep-pp-dp"), 8, RunOptions(n_microbatches=2)),
    ],
)
def test_the_configurations_the_tests_run_are_valid(cfg, pc, world, options):
    assert compose_problems(cfg, pc, world, batch=8, seq=16, options=options) == []


def test_a_dense_model_with_ep_is_refused_and_with_etp_accepted_as_megatron_does():
    """Megatron's arguments assert num_experts for ep > 1; expert_tensor_parallel_size only lays out the expert
    ranks (it defaults to tp), and its own dp-last tests of a dense model set it to tp*cp."""
    problems = compose_problems(DENSE, ParallelConfig(tp=2, dp=2, ep=2, etp=2), 4)
    assert len(problems) == 1 and "ep=2 but the model has no MoE layers" in problems[0], problems
    assert compose_problems(DENSE, ParallelConfig(tp=2, dp=2, etp=2), 4) == []


def test_moe_under_tp_without_sp_is_a_training_rule_only():
    no_sp = RunOptions(sequence_parallel=False)
    pc = ParallelConfig(tp=2, dp=2, ep=2)
    train = compose_problems(MOE, pc, 4, options=no_sp)
    assert len(train) == 1 and "MoELayer.forward" in train[0] and "tp=2" in train[0], train
    assert compose_problems(MOE, pc, 4, options=no_sp, training=False) == []  # built and evaluated
    assert compose_problems(MOE, pc, 4) == []  # with SP it trains
    assert compose_problems(DENSE, ParallelConfig(tp=2, dp=2), 4, options=no_sp) == []  # dense: TP without SP is fine
    assert compose_problems(MOE, ParallelConfig(dp=2, ep=2), 2, options=no_sp) == []  # tp = 1: nothing to repeat


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("shared", [0, 1])
def test_moe_tp2_without_sp_is_built_refused_in_training_and_evaluates_like_one_device(shared):
    """As Megatron-Core's MoELayer.forward (d98e8a6): the model is built, a training step and a training-mode forward
    raise naming the rule, and the eval-mode forward under no_grad gives one device's loss. With shared experts
    their TP slices enter and leave by Megatron's f and g (no SP: both TP ranks hold the same tokens)."""
    from pylib.experiments.compose_pitfalls import build_train_evaluate
    from pylib.experiments.compose_training import train_reference

    cfg = MOE.with_(dtype="float64", moe=MoEConfig(n_experts=4, top_k=2, every=2, n_shared_experts=shared))
    pc = ParallelConfig(tp=2, dp=2, ep=2)
    out = launch(build_train_evaluate, 4, cfg, pc, RunOptions(sequence_parallel=False), batch=4, seq=8)
    ref = train_reference(cfg, steps=1, batch=4, seq=8, data="pattern")["losses"][0]
    for r in out:
        assert r["build"] is None
        assert len(r["train"]) == 1 and "need sequence_parallel=True to train" in r["train"][0], r["train"]
        assert r["train_forward"] == r["train"]
    by_replica = {r["dp_cp"]: r["eval_loss"] for r in out}  # the TP pair of a replica holds the same tokens
    assert all(abs(r["eval_loss"] - by_replica[r["dp_cp"]]) < 1e-14 for r in out)
    assert abs(sum(by_replica.values()) / len(by_replica) - ref) < 1e-12
    with_sp = launch(build_train_evaluate, 4, cfg, pc, RunOptions(), batch=4, seq=8)
    assert all(r["build"] is None and r["train"] is None and r["train_forward"] is None for r in with_sp)


def test_holder_labels_follow_the_cp_layout_then_the_sp_split():
    S, cp, tp = 16, 2, 2
    labels = holder_labels(S, cp, tp, "zigzag")
    pos = torch.arange(S)
    for c in range(cp):
        mine = shard_sequence(pos, 0, c, cp, "zigzag")  # what local_batch gives CP rank c
        for t, part in enumerate(mine.chunk(tp)):  # SP: contiguous pieces of the CP rank's tokens
            assert (labels[part] == c * tp + t).all()


def _build_refused():
    from pylib.compose import ParallelTransformer
    from pylib.model import build_model
    from pylib.runtime import Mesh

    try:
        ParallelTransformer.from_full(build_model(DENSE.with_(n_heads=2, d_ff=30)), Mesh(ParallelConfig(tp=4)))
    except ComposeConfigError as exc:
        return exc.problems
    return []


@pytest.mark.timeout(60)
def test_from_full_inside_ranks_raises_with_every_problem():
    problems = launch(_build_refused, 4)
    assert problems[0] == problems[3]
    assert any("tp=4 does not divide n_heads=2" in p for p in problems[0])
    assert any("tp=4 does not divide d_ff=30" in p for p in problems[0])


def test_shared_experts_and_both_dispatchers_are_accepted_and_the_shared_h_ffn_must_split_over_tp():
    """Issue 32: the composed model places shared experts and runs the all-gather dispatcher (the runs:
    tests/test_compose_train.py, MOE_PATHS). What still cannot run is named before any rank starts: the shared MLP
    (n_shared_experts x the expert h_ffn) is cut over tp as the dense MLP is."""
    pc = ParallelConfig(tp=2, dp=2, ep=2)
    for moe in (
        MoEConfig(n_experts=4, top_k=2, every=2, n_shared_experts=1),
        MoEConfig(n_experts=4, top_k=2, every=2, n_shared_experts=2, dispatcher="allgather"),
        MoEConfig(n_experts=4, top_k=2, every=2, capacity_factor=1.5, pad_to_capacity=True, n_shared_experts=1),
    ):
        assert compose_problems(DENSE.with_(moe=moe), pc, 4, batch=8, seq=16) == []
    odd = DENSE.with_(moe=MoEConfig(n_experts=4, top_k=2, every=2, d_ff=6, n_shared_experts=1))
    found = compose_problems(odd, ParallelConfig(tp=4, ep=2, dp=1), 4)
    assert any("tp=4 does not divide the shared experts' h_ffn=6" in p for p in found), found
    assert not any("shared experts" in p for p in compose_problems(odd, ParallelConfig(tp=2, dp=2, ep=2), 4))
    with pytest.raises(ComposeConfigError, match="shared experts' h_ffn=6"):
        check_compose(odd, ParallelConfig(tp=4, ep=2, dp=1), 4)
