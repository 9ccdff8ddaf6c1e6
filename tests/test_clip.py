"""Global gradient-norm clipping (`pylib.compose.clip`) equals `torch.nn.utils.clip_grad_norm_` on one device.

Fast checks run in one process (groups of one rank communicate nothing): the arguments refused by name, the norm
and the clipped gradients of the generic `clip_grads` for p = 2, 3 and inf, the non-finite rule, and who counts
what. The launched checks (slow) run one step of the composed model with a `GradClip` on one mesh per mode, each
against the reference in float64, several meshes inside one launch of 4 ranks to pay the start-up once:

    mesh                 model                                   what it checks
    tp4 (no SP)          GQA, 2 K/V heads: each copied on 2 ranks  TP slices summed, LayerNorm and K/V copies once
    tp4 + SP             GQA                                       the same after the SP gradient sums
    cp4                  GQA                                       CP replicas (complete after dp-cp) not added
    ep4 (dp4)            MoE, 4 experts                            experts over etp-ep-pp, dense over tp-pp
    pp4                  GQA                                       the stages' sums added
    dp4 DDP, ZeRO-1/2/3  GQA                                       replicas not added; shards added over dp-cp
    tp4, ep4 with p=inf  GQA, MoE                                  the largest |g|: partial maxima reduced by max
    tp2 ep2 (dp2)        MoE + shared experts, all-gather dispatch   the shared TP slices counted once, as dense
and the composed meshes on 8 and 16 ranks; then a NaN on one rank, skipped or raised on every rank alike.
"""

import math
from unittest import mock

import pytest
import torch

import pylib.compose.model as compose_model
from pylib.compose.clip import (
    ClipError,
    GradClip,
    NonFiniteGradientError,
    NormFamily,
    check_clip,
    clip_grads,
    counted_here,
)
from pylib.experiments.clipping import clipped_step, compare_clip, reference_clip
from pylib.plan import RunOptions
from pylib.plan.config import MoEConfig
from pylib.plan.presets import tiny_gqa, tiny_moe
from pylib.runtime import ParallelConfig, launch
from pylib.runtime.mesh import AxisGroup
from tests.conftest import FLOAT64_ATOL

DENSE, MOE = tiny_gqa(), tiny_moe()
# shared experts (dense TP slices, replicated over EP) and the all-gather dispatcher
SHARED = MOE.with_(moe=MoEConfig(n_experts=4, top_k=2, every=2, n_shared_experts=1, dispatcher="allgather"))
CLIP = GradClip(0.05)  # below every run's norm (about 0.5): every check clips
ALONE = AxisGroup("world", (0,), 0, None)  # one rank: the collectives return at once


# ------------------------------------------------------------------------------------- one process (fast)


@pytest.mark.parametrize("max_norm", [0, -1.0, math.nan, -math.inf, True, "1.0", None])
def test_a_max_norm_that_is_not_a_positive_number_is_refused_by_name(max_norm):
    with pytest.raises(ClipError, match="max_norm"):
        GradClip(max_norm)


@pytest.mark.parametrize("norm_type", [0.5, 0, -2, math.nan, "2"])
def test_a_norm_order_below_one_is_refused_by_name(norm_type):
    with pytest.raises(ClipError, match="norm_type"):
        check_clip(1.0, norm_type)


def test_on_nonfinite_must_be_skip_or_raise():
    with pytest.raises(ValueError, match="on_nonfinite"):
        GradClip(1.0, on_nonfinite="ignore")


def test_an_infinite_max_norm_measures_without_clipping():
    g = [torch.tensor([3.0, 4.0], dtype=torch.float64)]
    res = clip_grads([NormFamily("dense", tuple(g), ALONE)], g, GradClip(math.inf), ALONE)
    assert res.norm == 5.0 and res.coefficient == 1.0 and not res.clipped and g[0].tolist() == [3.0, 4.0]


def _grads(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen, dtype=torch.float64) for shape in ((5, 3), (7,), (2, 2, 2))]


@pytest.mark.parametrize("norm_type", [2.0, 3.0, math.inf])
def test_the_norm_and_the_clipped_gradients_equal_torch_clip_grad_norm(norm_type):
    mine, theirs = _grads(), _grads()
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in theirs]
    for p, g in zip(params, theirs):
        p.grad = g
    want = torch.nn.utils.clip_grad_norm_(params, 0.3, norm_type=norm_type, foreach=False)
    # two families over one rank: their squares add (their maxima take the larger)
    fams = [NormFamily("dense", tuple(mine[:2]), ALONE), NormFamily("expert", (mine[2],), ALONE)]
    res = clip_grads(fams, mine, GradClip(0.3, norm_type), ALONE)
    assert abs(res.norm - float(want)) <= FLOAT64_ATOL and res.clipped
    for a, p in zip(mine, params):  # (not torch.testing.assert_close: its first call imports for ~5 s)
        assert float((a - p.grad).abs().max()) <= FLOAT64_ATOL


def test_a_nonfinite_gradient_even_in_an_uncounted_copy_skips_or_raises():
    g = _grads()
    copy = torch.tensor([math.nan])  # held and read by the optimizer, but not counted in the norm
    fams = [NormFamily("dense", tuple(g), ALONE)]
    res = clip_grads(fams, [*g, copy], GradClip(0.3), ALONE)
    assert res.skipped and res.nonfinite_rank == 0 and math.isnan(res.norm)
    assert torch.equal(g[0], _grads()[0])  # untouched
    with pytest.raises(NonFiniteGradientError, match="rank 0"):
        clip_grads(fams, [*g, copy], GradClip(0.3, on_nonfinite="raise"), ALONE)


def test_who_counts_each_kind_of_parameter():
    tp = [AxisGroup("tp", (0, 1, 2, 3), r, None) for r in range(4)]
    assert [counted_here("replicated", t) for t in tp] == [True, False, False, False]
    assert [counted_here("router", t) for t in tp] == [True, False, False, False]
    assert [counted_here("kv-replicated", t, 2) for t in tp] == [True, False, True, False]
    for kind in ("vocab", "column", "row", "expert"):
        assert all(counted_here(kind, t) for t in tp)
    with pytest.raises(ValueError, match="unknown parameter kind"):
        counted_here("tied", tp[0])


# ------------------------------------------------------------------------------------- launched (slow)

MAX = GradClip(0.01, norm_type=math.inf)  # the largest |g|: partial maxima reduced by max (about 0.1 here)
FOUR = {
    "tp4": (DENSE, ParallelConfig(tp=4), RunOptions(sequence_parallel=False), CLIP),
    "tp4-sp": (DENSE, ParallelConfig(tp=4), RunOptions(sequence_parallel=True), CLIP),
    "cp4": (DENSE, ParallelConfig(cp=4), RunOptions(), CLIP),
    "ep4": (MOE, ParallelConfig(dp=4, ep=4), RunOptions(), CLIP),
    "pp4": (DENSE, ParallelConfig(pp=4), RunOptions(n_microbatches=4), CLIP),
    **{f"dp4-zero{z}": (DENSE, ParallelConfig(dp=4), RunOptions(zero_stage=z), CLIP) for z in range(4)},
    "tp4-inf": (DENSE, ParallelConfig(tp=4), RunOptions(), MAX),
    "ep4-inf": (MOE, ParallelConfig(dp=4, ep=4), RunOptions(), MAX),
    "tp2-ep2-shared": (SHARED, ParallelConfig(tp=2, dp=2, ep=2), RunOptions(), CLIP),
}
COMPOSED = {
    "moe8": (MOE, ParallelConfig(tp=2, dp=2, pp=2, ep=4), RunOptions(n_microbatches=2), 8),
    "dense16-zero2": (DENSE, ParallelConfig(tp=2, cp=2, dp=2, pp=2), RunOptions(zero_stage=2, n_microbatches=2), 16),
}


def _each(configs):
    """Inside a rank: one clipped step per configuration, in turn."""
    torch.set_num_threads(1)
    return {name: clipped_step(cfg, pc, options, clip=clip) for name, (cfg, pc, options, clip) in configs.items()}


class _Runs:
    """The launched runs, each launched on first use and kept for the module's other tests."""

    def __init__(self):
        self.cache = {}

    def four(self) -> dict:
        if "four" not in self.cache:
            per_rank = launch(_each, 4, FOUR, timeout=400)
            self.cache["four"] = {name: [r[name] for r in per_rank] for name in FOUR}
        return self.cache["four"]

    def composed(self, name: str) -> list:
        if name not in self.cache:
            cfg, pc, options, world = COMPOSED[name]
            self.cache[name] = launch(clipped_step, world, cfg, pc, options, clip=CLIP, pitfalls=True, timeout=400)
        return self.cache[name]


@pytest.fixture(scope="module")
def runs():
    """Module-scoped, so that under pytest-xdist the tests sharing a launch run on one worker (tests/conftest.py)."""
    return _Runs()


def _assert_equals_reference(results, cfg, clip=CLIP):
    ref = reference_clip(cfg, clip)
    err = compare_clip(results, ref)
    assert err["missing"] == [], err
    assert err["norm_err"] <= FLOAT64_ATOL and err["grad_err"] <= FLOAT64_ATOL, err
    assert err["coefficient_spread"] == 0.0, err
    assert all(not r["skipped"] and r["coefficient"] < 1.0 for r in results)  # it did clip
    return ref


@pytest.mark.slow
@pytest.mark.timeout(480)
@pytest.mark.parametrize("name", list(FOUR))
def test_each_mode_on_four_ranks_clips_like_one_device(runs, name):
    _assert_equals_reference(runs.four()[name], FOUR[name][0], FOUR[name][3])


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_the_norm_is_reduced_over_the_model_parallel_group_or_the_world_one_scalar_each(runs):
    """DDP: dense over tp-pp, experts over etp-ep-pp (Megatron's two grad-stats groups); ZeRO: over the world."""
    four = runs.four()
    for name, want in (("tp4", {"tp-pp"}), ("ep4", {"tp-pp", "etp-ep-pp"}), ("dp4-zero1", {"world"})):
        for r in four[name]:
            norm_ops = [e for e in r["events"] if e["tag"].startswith("grad_norm")]
            flag = [e for e in r["events"] if e["tag"] == "found_nonfinite"]
            assert len(flag) == 1 and flag[0]["axis"] == "world" and flag[0]["payload_bytes"] == 8
            assert all(e["op"] == "all_reduce" and e["payload_bytes"] == 8 for e in norm_ops)
            assert {e["axis"] for e in norm_ops} <= want | {"world"}
    for r in four["ep4-inf"]:  # the inf norm: the family maxima are reduced by max, not added
        assert {e["extra"]["reduce_op"] for e in r["events"] if e["tag"].startswith("grad_norm")} == {"max"}


@pytest.mark.slow
@pytest.mark.timeout(480)
@pytest.mark.parametrize("name", list(COMPOSED))
def test_the_composed_model_clips_like_one_device(runs, name):
    _assert_equals_reference(runs.composed(name), COMPOSED[name][0])


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_counting_tp_copies_on_every_rank_overstates_the_norm_and_experts_with_dense_split_the_replicas(runs):
    results = runs.composed("moe8")
    right = {r["pitfalls"]["right"] for r in results}
    assert len(right) == 1
    assert all(r["pitfalls"]["tp_copies"] > r["pitfalls"]["right"] * (1 + 1e-6) for r in results)
    # experts summed over the dense tp-pp group: each replica sees only its EP ranks' experts, and they disagree
    by_dp = {r["coords"]["dp"]: r["pitfalls"]["experts_as_dense"] for r in results}
    assert len({round(v, 15) for v in by_dp.values()}) == 2
    assert all(v < r["pitfalls"]["right"] for r in results for v in [r["pitfalls"]["experts_as_dense"]])


def _poisoned(cfg, pc, options, clip, rank, kind):
    """One clipped step in which `rank` writes a NaN into the first held gradient of a `kind` parameter just
    before the norm; returns what the rank saw (its record, or the error it raised)."""
    real = compose_model.clip_held_gradients

    def poison(pieces, table, mesh, *args, **kw):
        if mesh.global_rank == rank:
            name = next(r.name for r in table if r.kind == kind and pieces.get(r.name))
            pieces[name][0][2].view(-1)[0] = math.nan
        return real(pieces, table, mesh, *args, **kw)

    with mock.patch.object(compose_model, "clip_held_gradients", poison):
        try:
            return clipped_step(cfg, pc, options, clip=clip)
        except NonFiniteGradientError as e:
            return dict(raised=str(e), rank_named=e.rank)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_nan_on_one_rank_skips_the_update_on_every_rank():
    # rank 3: TP rank 1 of DP replica 1 -- its LayerNorm copy is not counted in the norm, and no group of the
    # norm's reductions joins it to replica 0: only the world-wide flag tells rank 0
    pc, opts = ParallelConfig(tp=2, dp=2), RunOptions()
    results = launch(_poisoned, 4, DENSE, pc, opts, GradClip(0.05), 3, "replicated", timeout=200)
    for r in results:
        assert r["skipped"] and r["nonfinite_rank"] == 3 and math.isnan(r["norm"])
        for before, after in zip(r["params_before"], r["params"]):
            assert before[:1] == after[:1] and torch.equal(before[-1], after[-1])  # no rank stepped


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_nan_on_one_rank_raises_the_same_error_on_every_rank():
    pc, opts = ParallelConfig(tp=2, dp=2), RunOptions(zero_stage=1)
    clip = GradClip(0.05, on_nonfinite="raise")
    results = launch(_poisoned, 4, DENSE, pc, opts, clip, 2, "column", timeout=200)
    assert {r["rank_named"] for r in results} == {2}
    assert len({r["raised"] for r in results}) == 1 and "rank 2" in results[0]["raised"]
