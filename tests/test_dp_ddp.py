"""DDP's buckets: reverse parameter order, launched during backward in order, traced, gradient accumulation with
no_sync, per-parameter reduction groups, and a parameter without a gradient."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from pylib.analysis.dp import traffic_per_step
from pylib.dp import (
    DistributedDataParallel,
    ZeroDataParallel,
    assemble,
    micro_batch,
    overlap_from_trace,
)
from pylib.experiments.dp_training import train_reference
from pylib.model import build_model, random_tokens
from pylib.plan.presets import tiny_odd
from pylib.runtime import Mesh, ParallelConfig, launch, trace, tracer
from tests.conftest import FLOAT64_RTOL, assert_float64_close

CFG = tiny_odd()
BATCH, SEQ = 8, 8


@pytest.fixture(scope="module")
def reference():
    return train_reference(CFG, global_batch=BATCH, seq=SEQ, steps=1)  # also warms the optimizer in the parent


def _one_backward(bucket_bytes):
    """One DDP backward on this rank's slice; the trace, the overlap report, the bucket layouts, the gradients."""
    rank, d = dist.get_rank(), dist.get_world_size()
    model = build_model(CFG)
    ddp = DistributedDataParallel(model, bucket_bytes=bucket_bytes)
    ids, targets = random_tokens(CFG, BATCH, SEQ, seed=0)
    with trace() as tr:
        loss = model.loss(micro_batch(ids, rank, d), micro_batch(targets, rank, d))
        t_backward = tracer.now()
        loss.backward()
        ddp.finish_gradient_sync()
    report = ddp.overlap()
    from_trace = overlap_from_trace(tr.events, report.backward_end, backward_start=t_backward, tag="ddp")
    views = all(
        p.grad.untyped_storage().data_ptr() in {b.grad.untyped_storage().data_ptr() for b in ddp.buckets.buckets}
        for p in model.parameters()
    )
    names = [n for n, _ in model.named_parameters()]
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return dict(
        events=[e.as_dict() for e in tr.events],
        report=report,
        from_trace=from_trace,
        layouts=ddp.layouts,
        views=views,
        names=names,
        grads=grads,
    )


@pytest.fixture(scope="module")
def backward_run(reference):
    return launch(_one_backward, 2, 600)


def test_buckets_take_parameters_in_reverse_order_up_to_the_size_cap(backward_run):
    r = backward_run[0]
    order = [e.name for lay in r["layouts"] for e in lay.entries]
    assert order == list(reversed(r["names"]))  # the last layer's gradients are ready first
    assert len(r["layouts"]) > 3
    for lay in r["layouts"]:  # 600 bytes: only a parameter bigger than the cap gets a bucket over it
        assert lay.bytes <= 600 or len(lay.entries) == 1


def test_every_bucket_is_all_reduced_during_backward_in_bucket_order(backward_run):
    for r in backward_run:
        ars = [e for e in r["events"] if e["op"] == "all_reduce"]
        assert [e["tag"] for e in ars] == [f"ddp.{lay.key}" for lay in r["layouts"]]
        assert all(e["phase"] == "backward" and e["extra"]["is_async"] for e in ars)
        report = r["report"]
        assert report.launched_during_backward == len(r["layouts"])
        launches = [b.t_launch for b in report.buckets]
        assert launches == sorted(launches) and launches[-1] < report.backward_end
        # the first bucket (LM head) leaves while most of backward is still to run
        assert launches[0] < report.backward_end
        assert 0.0 <= report.hidden_fraction <= 1.0


def test_overlap_read_from_the_trace_equals_what_the_buckets_recorded(backward_run):
    for r in backward_run:
        a, b = r["report"], r["from_trace"]
        assert [(x.t_launch, x.t_done, x.payload_bytes) for x in a.buckets] == [
            (x.t_launch, x.t_done, x.payload_bytes) for x in b.buckets
        ]
        assert all(x.t_done >= x.t_launch for x in a.buckets)


def test_gradients_are_views_into_the_buckets_and_equal_the_reference(backward_run, reference):
    for r in backward_run:
        assert r["views"]
        for name, g in reference["grads"].items():
            assert_float64_close(r["grads"][name], g, rtol=FLOAT64_RTOL)


def _accumulate(micro):
    """Each rank splits its slice into `micro` micro-batches; all but the last backward run under no_sync."""
    rank, d = dist.get_rank(), dist.get_world_size()
    model = build_model(CFG)
    ddp = DistributedDataParallel(model, bucket_bytes=1024)
    ids, targets = random_tokens(CFG, BATCH, SEQ, seed=0)
    ids, targets = micro_batch(ids, rank, d), micro_batch(targets, rank, d)
    with trace() as tr:
        for i in range(micro):
            loss = model.loss(micro_batch(ids, i, micro), micro_batch(targets, i, micro)) / micro
            if i < micro - 1:
                with ddp.no_sync():
                    loss.backward()
            else:
                loss.backward()
        ddp.finish_gradient_sync()
    psi = sum(p.numel() * p.element_size() for p in model.parameters())
    return {n: p.grad.clone() for n, p in model.named_parameters()}, tr.total("bytes_sent"), psi


def test_no_sync_accumulates_micro_batches_and_reduces_once(reference):
    d = 2
    for grads, sent, psi in launch(_accumulate, d, 2):
        assert sent == traffic_per_step(psi, d, "ddp")  # one all-reduce of everything, not one per micro-batch
        for name, g in reference["grads"].items():
            assert_float64_close(grads[name], g, rtol=FLOAT64_RTOL)


def _per_parameter_groups():
    """Four ranks as dp=2 x cp=2: MLP weights averaged over "dp" (2 ranks), everything else over "dp-cp" (4)."""
    mesh = Mesh(ParallelConfig(dp=2, cp=2))
    rank = dist.get_rank()

    def group_for(name, p):
        return mesh.dp if ".mlp." in name else None

    out = {}
    for kind in ("ddp", "zero2"):
        model = build_model(CFG)
        if kind == "ddp":
            dp = DistributedDataParallel(model, mesh["dp-cp"], bucket_bytes=1024, group_for=group_for)
        else:
            dp = ZeroDataParallel(model, 2, mesh["dp-cp"], bucket_bytes=1024, group_for=group_for)
        ids, targets = random_tokens(CFG, BATCH, SEQ, seed=0)
        with trace() as tr:
            model.loss(micro_batch(ids, rank, 4), micro_batch(targets, rank, 4)).backward()
            dp.finish_gradient_sync()
        if kind == "ddp":
            held = {b.layout.key: b.grad.clone() for b in dp.buckets.buckets}
        else:
            held = {k: v.clone() for k, v in dp.gradient_shards().items()}
        axes = {(e["axis"], e["group"]) for e in (ev.as_dict() for ev in tr.events)}
        specs = {sp.name: sp.axis for sp in dp.shard_specs() if sp.kind == "replicated"}
        out[kind] = (dp.layouts, held, axes, specs)
    return out


def test_group_for_averages_each_parameter_over_its_own_group():
    results = launch(_per_parameter_groups, 4)
    # each rank's own gradient, computed here on its slice
    local = []
    for rank in range(4):
        model = build_model(CFG)
        ids, targets = random_tokens(CFG, BATCH, SEQ, seed=0)
        model.loss(micro_batch(ids, rank, 4), micro_batch(targets, rank, 4)).backward()
        local.append({n: p.grad for n, p in model.named_parameters()})
    dp_pairs = {0: (0, 2), 2: (0, 2), 1: (1, 3), 3: (1, 3)}  # ParallelConfig(dp=2, cp=2): rank = i_cp + 2 i_dp
    for kind in ("ddp", "zero2"):
        for rank in range(4):
            layouts, _, axes, specs = results[rank][kind]
            assert specs == {n: ("dp" if ".mlp." in n else "dp-cp") for n in local[rank]}  # the layout, as data
            assert axes == {("dp", dp_pairs[rank]), ("dp-cp", (0, 1, 2, 3))}
            for lay in layouts:
                members = lay.group
                if kind == "ddp":
                    grads = assemble([lay], [results[rank][kind][1]])
                else:
                    grads = assemble([lay], [results[m][kind][1] for m in members])
                for name, g in grads.items():
                    expected = sum(local[m][name] for m in members) / len(members)
                    assert members == (dp_pairs[rank] if ".mlp." in name else (0, 1, 2, 3))
                    assert_float64_close(g, expected, rtol=FLOAT64_RTOL)


class _WithUnused(nn.Module):
    """Three linear layers and, between them in registration order, one that forward never uses."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(4, 4).double()
        self.unused = nn.Linear(4, 4).double()
        self.b = nn.Linear(4, 4).double()
        self.c = nn.Linear(4, 4).double()

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def _unused_parameter():
    rank = dist.get_rank()
    model = _WithUnused()
    ddp = DistributedDataParallel(model, bucket_bytes=160)  # weight + bias of one layer per bucket
    # another mode's reduction as a tensor hook (as SP's TP all-reduce of a replicated weight would be): it runs
    # before the gradient is accumulated, so the bucket gets its result (x3 stands for a sum over 3 replicas)
    model.c.weight.register_hook(lambda g: 3 * g)
    x = torch.randn(8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with trace() as tr:
        model(x.chunk(2)[rank]).pow(2).sum().backward()
        ddp.finish_gradient_sync()
    grads = {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}
    return [e.tag for e in tr.events], [lay.key for lay in ddp.layouts], grads


def test_a_bucket_with_an_unused_parameter_is_reduced_at_the_end_and_order_is_kept():
    """Also: a gradient hook another mode put on a parameter has run before its bucket is reduced."""
    results = launch(_unused_parameter, 2)
    tags0, keys, _ = results[0]
    assert len(keys) == 4
    for tags, _, _ in results:  # every rank issues the buckets in the same order, the blocked one included
        assert tags == [f"ddp.{k}" for k in keys]
    model = _WithUnused()
    x = torch.randn(8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (model(x).pow(2).sum() / 2).backward()  # mean of the two ranks' sums
    for _, _, grads in results:
        for n, p in model.named_parameters():
            if n.startswith("unused"):
                assert grads[n] is None
            else:
                expected = 3 * p.grad if n == "c.weight" else p.grad
                assert_float64_close(grads[n], expected, rtol=FLOAT64_RTOL)


class _TwoHeads(nn.Module):
    """A trunk and two heads; a sample goes through head A or head B as `use_b` says (a Python branch, so a head
    no sample takes is not in the graph at all)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.trunk, self.head_a, self.head_b, self.out = (nn.Linear(4, 4).double() for _ in range(4))

    def forward(self, x, use_b):
        h = torch.tanh(self.trunk(x))
        parts = [head(h[m]) for head, m in ((self.head_a, ~use_b), (self.head_b, use_b)) if m.any()]
        return self.out(torch.cat(parts)).pow(2).mean()


def _heads_by_rank(stage):
    rank = dist.get_rank()
    model = _TwoHeads()
    dp = DistributedDataParallel(model, bucket_bytes=160) if stage == "ddp" else ZeroDataParallel(model, 2)
    x = torch.randn(8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    use_b = torch.arange(8) >= 4  # rank 0: head A only; rank 1: head B only
    with trace() as tr:
        model(x.chunk(2)[rank], use_b.chunk(2)[rank]).backward()
        dp.finish_gradient_sync()
    if stage == "ddp":
        grads = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    else:
        grads = dp.gradient_shards()
    return [e.tag for e in tr.events], dp.layouts, grads


@pytest.mark.parametrize("stage", ["ddp", "zero2"])
def test_a_parameter_used_on_one_rank_only_gets_the_average_on_every_rank(stage):
    results = launch(_heads_by_rank, 2, stage)
    assert results[0][0] == results[1][0]  # the same collectives in the same order on both ranks
    ref = _TwoHeads()
    x = torch.randn(8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    use_b = torch.arange(8) >= 4
    (0.5 * (ref(x[:4], use_b[:4]) + ref(x[4:], use_b[4:]))).backward()
    for rank, (_, layouts, grads) in enumerate(results):
        if stage == "ddp":
            got = grads
        else:
            got = assemble(layouts, [r[2] for r in results])
        for n, p in ref.named_parameters():
            assert got[n] is not None, f"rank {rank}: {n} has no gradient"
            torch.testing.assert_close(got[n], p.grad, rtol=1e-12, atol=1e-15)


def _reduce_every_micro_batch():
    """Two micro-batches, each backward reducing (no no_sync) and no finish() in between; a probe hook registered
    after the wrapper's checks, when the second backward computes its first gradient, that nothing is on the wire."""
    rank, d = dist.get_rank(), dist.get_world_size()
    model = build_model(CFG)
    ddp = DistributedDataParallel(model, bucket_bytes=1024)
    on_the_wire = []
    model.lm_head.weight.register_hook(lambda g: on_the_wire.append(len(ddp.buckets._in_flight)))
    ids, targets = random_tokens(CFG, BATCH, SEQ, seed=0)
    ids, targets = micro_batch(ids, rank, d), micro_batch(targets, rank, d)
    for i in range(2):
        (model.loss(micro_batch(ids, i, 2), micro_batch(targets, i, 2)) / 2).backward()
    ddp.finish_gradient_sync()
    return on_the_wire, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_reducing_every_micro_batch_waits_before_accumulating_into_a_bucket_on_the_wire(reference):
    for on_the_wire, grads in launch(_reduce_every_micro_batch, 2):
        assert on_the_wire == [0, 0]
        for name, g in reference["grads"].items():
            assert_float64_close(grads[name], g, rtol=FLOAT64_RTOL)
