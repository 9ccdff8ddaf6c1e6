"""HSDP (ZeRO-3 inside a shard group of s ranks, all-reduce across the r replicas) trains exactly like one device on
the whole batch, and what each link class carries is `hsdp_traffic_by_link` byte for byte; ZeRO-3 with m
micro-batches moves 3m(d-1)/d Psi_pad per step (it gathers again in every micro-batch).

float64, the odd-sized model of the DP chapter (its flat buffers need padding), one Adam step, on gloo ranks."""

import pytest
import torch
import torch.distributed as dist

from pylib.analysis.dp import held_bytes, hsdp_link_totals, hsdp_traffic_by_link, traffic_by_op, traffic_per_step
from pylib.dp import FullyShardedDataParallel, assemble, hybrid_groups, micro_batch
from pylib.model import build_model, random_tokens
from pylib.plan.mesh import hsdp_groups
from pylib.plan.presets import tiny_odd
from pylib.runtime import launch, trace
from tests.conftest import FLOAT64_RTOL, assert_float64_close

CFG = tiny_odd()
BATCH, SEQ, LR = 8, 8, 1e-2


def _one_step(shard_size, m):
    """One Adam step of ZeRO-3 (shard_size None: over every rank) or HSDP over (d/s replicas) x (s shards), the
    rank's rows cut into m micro-batches; the loss, the reduced gradient shards, the updated parameter shards and
    what each group carried."""
    rank, d = dist.get_rank(), dist.get_world_size()
    model = build_model(CFG)
    if shard_size is None:
        fsdp = FullyShardedDataParallel(model, lr=LR)
        groups = None
    else:
        shard, replica = hybrid_groups(shard_size)
        fsdp = FullyShardedDataParallel(model, shard, replicate=replica, lr=LR)
        groups = {shard.name: shard.ranks, replica.name: replica.ranks}
    ids, targets = random_tokens(CFG, BATCH, SEQ, seed=0)
    ids, targets = micro_batch(ids, rank, d), micro_batch(targets, rank, d)
    loss_sum = 0.0
    with trace() as tr:
        for k in range(m):
            loss = model.loss(micro_batch(ids, k, m), micro_batch(targets, k, m)) / m
            loss.backward()
            loss_sum += loss.item()
        fsdp.finish_gradient_sync()
        grads = {k: g.clone() for k, g in fsdp.gradient_shards().items()}
        fsdp.step()
    sent: dict[str, dict[str, int]] = {}
    for e in tr.events:
        by_op = sent.setdefault(e.axis, {})
        by_op[e.op] = by_op.get(e.op, 0) + e.bytes_sent
    return dict(
        loss=loss_sum,
        grads=grads,
        params={k: p.detach().clone() for k, p in fsdp.parameter_shards().items()},
        layouts=fsdp.layouts,
        sent=sent,
        groups=groups,
        tags={e.tag for e in tr.events},
        memory=fsdp.memory().as_dict(),
    )


def _reference():
    model = build_model(CFG)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    ids, targets = random_tokens(CFG, BATCH, SEQ, seed=0)
    loss = model.loss(ids, targets)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    opt.step()
    return loss.item(), grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def _check_equal_to_one_device(results, d, s):
    ref_loss, ref_grads, ref_params = _reference()
    assert sum(r["loss"] for r in results) / d == pytest.approx(ref_loss, rel=1e-12, abs=1e-12)
    # the ranks of each replica together hold every element once; every replica holds the same
    for replica in range(d // s):
        members = results[replica * s : (replica + 1) * s]
        layouts = members[0]["layouts"]
        assert all(lay.parts == s for lay in layouts)
        grads = assemble(layouts, [r["grads"] for r in members])
        params = assemble(layouts, [r["params"] for r in members])
        for name in ref_grads:
            assert_float64_close(grads[name], ref_grads[name], rtol=FLOAT64_RTOL)
            assert_float64_close(params[name], ref_params[name], rtol=FLOAT64_RTOL)
    # each rank holds ZeRO-3's state over its shard group of s, not over d
    n = sum(p.numel() for p in ref_params.values())
    for r in results:
        phi_pad = sum(lay.padded_numel for lay in r["layouts"])
        held = {k: r["memory"][k] for k in ("params", "grads", "optim")}
        assert held == held_bytes(n, 8, s, "zero3", padded_params=phi_pad)


def _check_traffic(results, d, s, m):
    r_ = d // s
    for rank, r in enumerate(results):
        psi_pad = sum(lay.padded_bytes for lay in r["layouts"])
        assert psi_pad % s == 0
        assert r["sent"] == {k: ops for k, ops in hsdp_traffic_by_link(psi_pad, r_, s, m).items() if ops}
        totals = hsdp_link_totals(psi_pad, r_, s, m)
        assert totals == {
            "dp-shard": 3 * m * (s - 1) * psi_pad // s,
            "dp-replicate": 2 * m * (r_ - 1) * psi_pad // (r_ * s),
        }
        shards, replicas = hsdp_groups(range(d), s)
        assert r["groups"] == {"dp-shard": shards[rank // s], "dp-replicate": replicas[rank % s]}
        assert r["tags"] == {f"hsdp.{lay.key}" for lay in r["layouts"]}


@pytest.mark.slow
@pytest.mark.parametrize("r, s", [(2, 2), (1, 4)], ids=["2x2", "1x4"])
def test_hsdp_on_four_ranks_equals_one_device_and_its_link_formulas(r, s):
    d, m = r * s, 1
    results = launch(_one_step, d, s, m, timeout=120)
    _check_equal_to_one_device(results, d, s)
    _check_traffic(results, d, s, m)


@pytest.mark.slow
@pytest.mark.parametrize("r, s", [(2, 4), (4, 2)], ids=["2x4", "4x2"])
def test_hsdp_on_eight_ranks_equals_one_device_and_its_link_formulas(r, s):
    d, m = r * s, 1
    results = launch(_one_step, d, s, m, timeout=240)
    _check_equal_to_one_device(results, d, s)
    _check_traffic(results, d, s, m)


@pytest.mark.slow
def test_hsdp_with_two_micro_batches_reduces_each_on_both_links():
    d, s, m = 4, 2, 2
    results = launch(_one_step, d, s, m, timeout=120)
    _check_equal_to_one_device(results, d, s)
    _check_traffic(results, d, s, m)


@pytest.mark.slow
@pytest.mark.parametrize("m", [1, 2])
def test_zero3_moves_three_m_passes_of_the_parameters_per_step(m):
    """pylib's ZeRO-3 keeps no gather across micro-batches: each one gathers twice and reduce-scatters once."""
    d = 2
    results = launch(_one_step, d, None, m, timeout=120)
    ref_loss, ref_grads, _ = _reference()
    assert sum(r["loss"] for r in results) / d == pytest.approx(ref_loss, rel=1e-12, abs=1e-12)
    grads = assemble(results[0]["layouts"], [r["grads"] for r in results])
    for name, g in ref_grads.items():
        assert_float64_close(grads[name], g, rtol=FLOAT64_RTOL)
    for r in results:
        psi_pad = sum(lay.padded_bytes for lay in r["layouts"])
        assert r["sent"] == {"world": traffic_by_op(psi_pad, d, "zero3", m)}
        assert sum(r["sent"]["world"].values()) == traffic_per_step(psi_pad, d, "zero3", m) == 3 * m * psi_pad // 2


def test_hsdp_cut_of_a_group_and_its_refusals():
    assert hsdp_groups((10, 11, 12, 13, 14, 15), 3) == ([(10, 11, 12), (13, 14, 15)], [(10, 13), (11, 14), (12, 15)])
    assert hsdp_groups(range(4), 4) == ([(0, 1, 2, 3)], [(0,), (1,), (2,), (3,)])
    with pytest.raises(ValueError, match=r"shard_size=3 must be a positive divisor of the data-parallel size d=8"):
        hsdp_groups(range(8), 3)
    with pytest.raises(ValueError, match=r"Psi_pad=10 bytes must split into s=4 equal shards"):
        hsdp_traffic_by_link(10, 2, 4)
    with pytest.raises(ValueError, match=r"n_microbatches=0 must be an integer >= 1"):
        traffic_by_op(8, 2, "zero3", 0)
    from pylib.dp import wrap

    with pytest.raises(
        ValueError, match="replicate= \\(HSDP\\) shards the parameters over `group`: needs zero_stage 3, got"
    ):
        wrap(build_model(CFG), "zero2", replicate=object())
    # one replica is ZeRO-3; shards of one rank are DDP's all-reduce of everything
    assert hsdp_link_totals(1200, 1, 4) == {"dp-shard": traffic_per_step(1200, 4, "zero3"), "dp-replicate": 0}
    assert hsdp_link_totals(1200, 4, 1)["dp-replicate"] == traffic_per_step(1200, 4, "ddp")


# ------------------------------------------------------------------------------------------------ the planner


def _planner():
    from pylib.analysis import planner

    return planner


def test_planner_prices_each_hsdp_link_with_its_formula_on_its_own_layouts():
    P = _planner()
    from pylib.plan import RunOptions
    from pylib.plan.presets import llama2_7b
    from pylib.runtime import ParallelConfig

    cfg, m = llama2_7b(), 2
    plan = P.Plan(ParallelConfig(dp=16), RunOptions(zero_stage=3, n_microbatches=m), hsdp_shard=4)
    layouts = P.flat_layouts(cfg, plan, 0)
    assert {lay.parts for lay in layouts} == {4}  # sharded over s, not over dp x cp
    psi_pad = sum(lay.padded_bytes for lay in layouts)
    by_axis = P.rank_traffic(cfg, plan, 32, 256, 0)
    want = _formula_per_buffer(layouts, r=4, s=4, m=m)
    for axis in ("dp-shard", "dp-replicate"):
        assert by_axis[axis]["bytes_sent"] == want[axis]
    # per buffer the ring rounds down; over the whole model it is the formula on Psi_pad to within a byte a buffer
    totals = hsdp_link_totals(psi_pad, 4, 4, m)
    assert abs(by_axis["dp-shard"]["bytes_sent"] - totals["dp-shard"]) <= 3 * m * len(layouts)
    assert by_axis["dp-replicate"]["bytes_sent"] == totals["dp-replicate"]
    # the memory: the state of ZeRO-3 over s = 4, not over 16
    hsdp_held = P.rank_memory(cfg, plan, P.Workload(32, 256), 0)
    zero3_held = P.rank_memory(cfg, P.Plan(plan.par, plan.options), P.Workload(32, 256), 0)
    assert hsdp_held["params"] == psi_pad // 4 and zero3_held["params"] < hsdp_held["params"]


def _formula_per_buffer(layouts, *, r, s, m):
    out = {"dp-shard": 0, "dp-replicate": 0}
    for lay in layouts:
        for axis, total in hsdp_link_totals(lay.padded_bytes, r, s, m).items():
            out[axis] += total
    return out


def test_planner_prices_the_shard_group_inside_a_node_and_the_replicas_across():
    P = _planner()
    from pylib.plan import RunOptions
    from pylib.runtime import ParallelConfig

    cluster = P.Cluster(64)  # 8 nodes of 8
    par = ParallelConfig(dp=64)
    assert P.hsdp_crosses_nodes(par, 64, 8, 8) == {"dp-shard": False, "dp-replicate": True}
    assert P.hsdp_crosses_nodes(par, 64, 16, 8) == {"dp-shard": True, "dp-replicate": True}
    assert P.hsdp_crosses_nodes(ParallelConfig(tp=2, dp=32), 64, 4, 8) == {"dp-shard": False, "dp-replicate": True}
    assert P.hsdp_crosses_nodes(ParallelConfig(tp=2, dp=32), 64, 8, 8)["dp-shard"]  # 2 x 8 ranks: two nodes
    plan = P.Plan(par, RunOptions(zero_stage=3), hsdp_shard=8)
    speeds = P._bandwidths(plan, cluster)
    assert speeds["dp-shard"] and not speeds["dp-replicate"] and not speeds["dp-cp"]
    assert "dp-shard" not in P._bandwidths(P.Plan(par, RunOptions(zero_stage=3)), cluster)


def test_hsdp_is_an_opt_in_choice_of_the_search_and_is_chosen_where_it_wins():
    P = _planner()
    from pylib.plan.presets import llama2_7b
    from pylib.runtime import ParallelConfig

    cfg = llama2_7b()
    only_dp = dict(meshes=(ParallelConfig(dp=512),), micro_batch_sizes=(1, 2), sequence_parallel=(False,))
    default = P.enumerate_plans(cfg, 512, 1024, 4096, P.SearchSpace(**only_dp))
    assert all(p.hsdp_shard is None for p in default)
    space = P.SearchSpace(**only_dp, hsdp_shards=(8, 3))
    plans = P.enumerate_plans(cfg, 512, 1024, 4096, space)
    hsdp = [p for p in plans if p.hsdp_shard is not None]
    assert hsdp and {p.hsdp_shard for p in hsdp} == {8} and all(p.options.zero_stage == 3 for p in hsdp)
    assert len(plans) == len(default) + len(hsdp)
    best = P.rank_plans(cfg, P.Workload(1024, 4096, grad_reduce="float32"), P.Cluster(512), top=1, space=space)[0]
    assert best.plan.hsdp_shard == 8 and "HSDP 64x8" in best.plan.describe()


def test_planner_refuses_hsdp_without_zero3_or_with_a_shard_size_that_does_not_cut_the_group():
    P = _planner()
    from pylib.plan import RunOptions
    from pylib.plan.presets import tiny_odd
    from pylib.runtime import ParallelConfig

    par = ParallelConfig(dp=8)
    bad = P.problems(tiny_odd(), P.Plan(par, RunOptions(zero_stage=2), hsdp_shard=3), 8, 8, 8)
    assert "hsdp_shard=3 shards the parameters: it needs zero_stage=3, got 2" in bad
    assert "hsdp_shard=3 must divide dp x cp = 8 and lie strictly between 1 and 8" in bad
    assert P.problems(tiny_odd(), P.Plan(par, RunOptions(zero_stage=3), hsdp_shard=8), 8, 8, 8)
    assert not P.problems(tiny_odd(), P.Plan(par, RunOptions(zero_stage=3), hsdp_shard=4), 8, 8, 8)


def test_hsdp_hiding_tokens_is_where_the_backward_equals_its_traffic_on_each_link():
    import math

    from pylib.analysis import seconds

    links = seconds.links()
    nv, ib = links["nvlink"], links["ib"]
    n = 6_738_415_616  # Llama-2-7B's parameters
    for r, s, shard_link in ((64, 8, nv), (1, 512, ib), (8, 8, nv)):
        t = seconds.hsdp_hiding_tokens(r, s, shard_link, ib)
        n_pad = -(-n // s) * s
        # backward: the parameters' second all-gather (bf16) and the gradients' reduce-scatter (bf16) on the shard
        # group, the shard's all-reduce on the replica group
        params, grads = hsdp_traffic_by_link(2 * n_pad, r, s), hsdp_traffic_by_link(2 * n_pad, r, s)
        shard_bytes = params["dp-shard"]["all_gather"] / 2 + grads["dp-shard"]["reduce_scatter"]
        replica_bytes = grads["dp-replicate"].get("all_reduce", 0)
        wire = shard_bytes / shard_link.beta + replica_bytes / ib.beta
        assert math.isclose(seconds.backward_seconds(n_pad, t), wire, rel_tol=1e-12)
    # ZeRO-3 across 64 nodes needs ~4.5x the tokens per micro-batch that HSDP with one node per replica needs
    zero3, hsdp = seconds.hsdp_hiding_tokens(1, 512, ib, ib), seconds.hsdp_hiding_tokens(64, 8, nv, ib)
    assert 4 < zero3 / hsdp < 5 and hsdp < 4096 < zero3


def test_search_space_refuses_a_bad_shard_size_naming_the_field():
    P = _planner()
    for bad in ((0,), (), (2.5,), 8):
        with pytest.raises((TypeError, ValueError), match="SearchSpace: hsdp_shards="):
            P.SearchSpace(hsdp_shards=bad)


def _mixed_step(shard_size):
    """One bf16 step with fp32 gradient reduction (Megatron's main_grad): HSDP over (d/s) x s, or ZeRO-3 over d."""
    from pylib.dp import wrap
    from pylib.plan.options import MixedPrecision

    rank, d = dist.get_rank(), dist.get_world_size()
    model = build_model(CFG)
    recipe = MixedPrecision("bfloat16", grad_reduce="float32")
    if shard_size is None:
        trainer = wrap(model, "zero3", precision=recipe, lr=LR)
    else:
        shard, replica = hybrid_groups(shard_size)
        trainer = wrap(model, "zero3", shard, precision=recipe, replicate=replica, lr=LR)
    ids, targets = random_tokens(CFG, BATCH, SEQ, seed=0)
    with trace() as tr:
        loss = model.loss(micro_batch(ids, rank, d), micro_batch(targets, rank, d))
        trainer.scale_loss(loss).backward()
        trainer.finish_gradient_sync()
        grads = {k: g.clone() for k, g in trainer.gradient_shards().items()}
    sent: dict[str, dict[str, int]] = {}
    for e in tr.events:
        by_op = sent.setdefault(e.axis, {})
        by_op[e.op] = by_op.get(e.op, 0) + e.bytes_sent
    return dict(grads=grads, layouts=trainer.layouts, sent=sent, dtypes={g.dtype for g in grads.values()})


@pytest.mark.slow
def test_hsdp_reduces_fp32_main_grads_and_sends_16_bit_gathers_and_32_bit_reductions():
    d, s = 4, 2
    hsdp, zero3 = launch(_mixed_step, d, s, timeout=120), launch(_mixed_step, d, None, timeout=120)
    for r in hsdp:
        assert r["dtypes"] == {torch.float32}
        phi_pad = sum(lay.padded_numel for lay in r["layouts"])
        gathers = hsdp_traffic_by_link(2 * phi_pad, d // s, s)  # bf16 parameters
        reductions = hsdp_traffic_by_link(4 * phi_pad, d // s, s)  # fp32 gradients
        assert r["sent"] == {
            "dp-shard": {
                "all_gather": gathers["dp-shard"]["all_gather"],
                "reduce_scatter": reductions["dp-shard"]["reduce_scatter"],
            },
            "dp-replicate": reductions["dp-replicate"],
        }
    # the same fp32 sums as ZeRO-3 over all four ranks, in another order: equal to fp32 rounding
    ours = assemble(hsdp[0]["layouts"], [r["grads"] for r in hsdp[:s]])
    theirs = assemble(zero3[0]["layouts"], [r["grads"] for r in zero3])
    for name, g in theirs.items():
        torch.testing.assert_close(ours[name], g, rtol=1e-5, atol=1e-7)
