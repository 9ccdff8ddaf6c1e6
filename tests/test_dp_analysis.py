"""The pure parts of data parallelism: bucket planning, flat-buffer shards, and the formulas checked against the
ZeRO paper's own numbers."""

import math

import pytest
import torch

from pylib.analysis.dp import (
    STAGES,
    held_bytes,
    memory_rows,
    paper_bytes,
    traffic_by_op,
    traffic_per_step,
    zero3_peak_param_bytes,
)
from pylib.dp import assemble, join_shards, layout_table, padded_numel, plan_buckets, single_flat, unflatten
from pylib.plan import ZeroStage

PARAMS = [("c.bias", (3,)), ("c.weight", (3, 5)), ("b.weight", (7, 3)), ("a.bias", (5,)), ("a.weight", (5, 2))]


def test_buckets_never_split_a_parameter_and_stay_under_the_cap():
    for cap in (8, 40, 100, 160, 10_000):
        layouts = plan_buckets(PARAMS, element_size=4, bucket_bytes=cap, parts=3)
        assert [e.name for lay in layouts for e in lay.entries] == [n for n, _ in PARAMS]
        for lay in layouts:
            assert lay.bytes <= cap or len(lay.entries) == 1
            assert lay.padded_numel % 3 == 0 and 0 <= lay.padding < 3
            offsets = [e.offset for e in lay.entries]
            assert offsets == [sum(e.numel for e in lay.entries[:i]) for i in range(len(lay.entries))]
        # a bucket closes only when the next parameter would overflow it
        for a, b in zip(layouts, layouts[1:]):
            assert a.bytes + b.entries[0].numel * 4 > cap
    assert len(plan_buckets(PARAMS, element_size=4, bucket_bytes=10_000)) == 1


@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7])
def test_shards_cover_every_parameter_element_exactly_once(parts):
    lay = single_flat("unit", PARAMS, element_size=8, parts=parts)
    assert lay.padded_numel == padded_numel(lay.numel, parts) == math.ceil(lay.numel / parts) * parts
    covered = {name: [0] * lay.entry(name).numel for name, _ in PARAMS}
    for i in range(parts):
        lo, hi = lay.shard_range(i)
        assert hi - lo == lay.shard_numel
        for name, a, b in lay.owned(i):
            for k in range(a, b):
                covered[name][k] += 1
    assert all(c == [1] * len(c) for c in covered.values())


def test_shards_joined_and_unflattened_give_back_the_parameters():
    tensors = {n: torch.randn(*s, dtype=torch.float64) for n, s in PARAMS}
    layouts = plan_buckets(PARAMS, element_size=8, bucket_bytes=64, parts=3)
    members = [{} for _ in range(3)]
    for lay in layouts:
        flat = torch.zeros(lay.padded_numel, dtype=torch.float64)
        for e in lay.entries:
            flat[e.offset : e.offset + e.numel] = tensors[e.name].reshape(-1)
        for i in range(3):
            lo, hi = lay.shard_range(i)
            members[i][lay.key] = flat[lo:hi]
        assert torch.equal(join_shards(lay, [m[lay.key] for m in members]), flat)
        assert set(unflatten(lay, flat)) == {e.name for e in lay.entries}
    back = assemble(layouts, members)
    assert all(torch.equal(back[n], t) for n, t in tensors.items())
    rows = layout_table(layouts)
    assert sum(r["numel"] for r in rows) == sum(t.numel() for t in tensors.values())
    with pytest.raises(ValueError, match="has 3 shards, got 2"):
        join_shards(layouts[0], [members[0][layouts[0].key]] * 2)


def test_traffic_formulas_relate_the_stages_as_the_paper_says():
    psi = 8 * 1000 * 12  # bytes, divisible by every d below
    for d in (1, 2, 4, 8, 12):
        ddp = traffic_per_step(psi, d, "ddp")
        assert ddp == 2 * (d - 1) * psi / d
        assert traffic_per_step(psi, d, "zero1") == traffic_per_step(psi, d, "zero2") == ddp
        assert traffic_per_step(psi, d, "zero3") == 1.5 * ddp
        rs_ag = traffic_by_op(psi, d, "zero1")
        assert rs_ag["reduce_scatter"] == rs_ag["all_gather"] == ddp / 2  # an all-reduce is RS + AG


def test_paper_formulas_reproduce_the_zero_papers_figure_1():
    # ZeRO (Rajbhandari et al. 2020), Figure 1: Psi = 7.5B parameters, N_d = 64, K = 12
    gb = {s: sum(paper_bytes(7_500_000_000, 64, s).values()) / 1e9 for s in STAGES}
    assert round(gb["ddp"], 1) == 120.0
    assert round(gb["zero1"], 1) == 31.4
    assert round(gb["zero2"], 1) == 16.6
    assert round(gb["zero3"], 2) == 1.88  # the figure prints 1.9


def test_what_we_hold_is_the_papers_layout_without_the_master_copy():
    n, e = 1_000, 4
    for d in (1, 2, 8):
        for stage in STAGES:
            ours, paper = held_bytes(n, e, d, stage), paper_bytes(n, d, stage, k=2 * e)
            # fp32 everywhere, two Adam moments: the paper's formula with 2-byte copies replaced by e-byte ones
            assert ours["optim"] == paper["optim"]
            assert ours["params"] == paper["params"] * e / 2 and ours["grads"] == paper["grads"] * e / 2
    assert held_bytes(10, 8, 4, "zero3", padded_params=12) == {"params": 24, "grads": 24, "optim": 48}
    rows = memory_rows(n, e, 4)
    assert [r["stage"] for r in rows] == list(STAGES)
    assert rows[0]["paper_total"] == 16 * n and rows[0]["ours_total"] == 16 * n  # (2+2+12)n vs (4+4+8)n


def test_zero3_peak_is_the_shards_plus_the_largest_units():
    assert zero3_peak_param_bytes(100, [40, 70, 10]) == 170
    assert zero3_peak_param_bytes(100, [40, 70, 10], resident_units=2) == 210


def test_unknown_stage_is_refused_naming_the_allowed_values():
    for bad in ("zero4", 4, "ZeRO-1"):
        with pytest.raises(ValueError, match=r"zero_stage=.* must be one of \(0, 1, 2, 3, 'ddp', 'zero1'"):
            traffic_per_step(100, 2, bad)


def test_a_stage_is_a_zero_stage_its_name_or_its_int():
    for stage in ZeroStage:
        want = held_bytes(1000, 4, 4, stage.key, padded_params=1004)
        assert held_bytes(1000, 4, 4, stage, padded_params=1004) == want
        assert held_bytes(1000, 4, 4, int(stage), padded_params=1004) == want
        assert traffic_by_op(4016, 4, stage) == traffic_by_op(4016, 4, stage.key)
