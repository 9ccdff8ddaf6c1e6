"""HSDP (ZeRO-3 inside a shard group of s ranks, all-reduce across the r replicas) trains exactly like one device on
the whole batch, and what each link class carries is `hsdp_traffic_by_link` byte for byte; ZeRO-3 with m
micro-batches moves 3m(d-1)/d Psi_pad per step (it gathers again in every micro-batch).

float64, the odd-sized model of the DP chapter (its flat buffers need padding), one Adam step, on gloo ranks."""

import pytest
import torch
import torch.distributed as dist

from pylib.analysis.dp import hsdp_link_totals, hsdp_traffic_by_link, traffic_by_op, traffic_per_step
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
    # one replica is ZeRO-3; shards of one rank are DDP's all-reduce of everything
    assert hsdp_link_totals(1200, 1, 4) == {"dp-shard": traffic_per_step(1200, 4, "zero3"), "dp-replicate": 0}
    assert hsdp_link_totals(1200, 4, 1)["dp-replicate"] == traffic_per_step(1200, 4, "ddp")
