"""The two dispatchers and pad-to-capacity on 4 EP ranks across top-k: each equals the loop-over-experts reference,
and the bytes the tracer records per rank equal the formulas of `pylib.analysis.ep.dispatcher_bytes` (closed form
for the all-gather and the padded all-to-all, whose shapes do not depend on the routing; from the actual routing
for the unpadded all-to-all). Above the crossover top-k the all-gather sends fewer bytes."""

import pytest
import torch
import torch.distributed as dist

from pylib.analysis.ep import alltoall_bytes, dispatch_matrix, dispatcher_bytes, dispatcher_crossover_top_k
from pylib.ep import ExpertParallelMoE
from pylib.plan.config import MoEConfig, expert_capacity
from pylib.runtime import Mesh, ParallelConfig, launch, trace
from tests.conftest import assert_float64_close, seeded_moe

H, F, E, T, EP = 8, 16, 16, 8, 4
TOP_KS = (1, 4, 12)
VARIANTS = {
    "alltoall": dict(),
    "allgather": dict(dispatcher="allgather"),
    "padded": dict(pad_to_capacity=True, capacity_factor=1.0),
}


def _cfg(k, variant):
    return MoEConfig(n_experts=E, top_k=k, score="sigmoid", **VARIANTS[variant])


def _x():
    return torch.randn(1, EP * T, H, generator=torch.Generator().manual_seed(3), dtype=torch.float64)


def _run():
    mesh = Mesh(ParallelConfig(dp=EP, ep=EP))
    r = dist.get_rank()
    out = {}
    for k in TOP_KS:
        for variant in VARIANTS:
            layer = ExpertParallelMoE.from_mesh(seeded_moe(_cfg(k, variant), H, F), mesh, aux_group=None)
            x = _x()[:, r * T : (r + 1) * T].clone().requires_grad_()
            with trace() as tr:
                y = layer(x)
                y.square().sum().backward()
            sent = {ph: sum(e.bytes_sent for e in tr.events if e.phase == ph) for ph in ("forward", "backward")}
            out[(k, variant)] = dict(y=y.detach(), dx=x.grad, sent=sent, experts=layer.last_routing.experts)
    return out


@pytest.mark.slow
def test_dispatchers_equal_the_reference_and_their_traced_bytes_equal_the_formulas():
    results = launch(_run, EP)
    totals = {}
    for k in TOP_KS:
        for variant in VARIANTS:
            cfg = _cfg(k, variant)
            moe = seeded_moe(cfg, H, F)
            x = _x().requires_grad_()
            y = moe(x, drop_groups=torch.arange(EP * T).div(T, rounding_mode="floor"))
            y.square().sum().backward()
            got = [res[(k, variant)] for res in results]
            for r, g in enumerate(got):
                assert_float64_close(g["y"], y.detach()[:, r * T : (r + 1) * T], f"k={k} {variant}")
                assert_float64_close(g["dx"], x.grad[:, r * T : (r + 1) * T], f"k={k} {variant}")
            if variant == "alltoall":  # from the routing: rows to other ranks and back, plus the count exchange
                per_rank = alltoall_bytes(dispatch_matrix([g["experts"] for g in got], E), H, 8)
                counts = (EP - 1) * (E // EP) * 8
                want = [p["dispatch_sent"] + p["combine_sent"] + counts for p in per_rank]
            else:  # closed form: the same for every rank whatever the routing
                C = expert_capacity(T, cfg) if cfg.pad_to_capacity else None
                total = dispatcher_bytes(cfg.dispatcher, T, k, H, 8, EP, n_experts=E, capacity=C)["total"]
                want = [total] * EP
            assert [g["sent"]["forward"] for g in got] == want, (k, variant)
            # backward: the conjugates move the same bytes, less what has no gradient (counts, gathered expert ids)
            no_grad = dict(alltoall=counts, allgather=(EP - 1) * T * k * 8, padded=0)[variant]
            back = [w - no_grad for w in want]
            assert [g["sent"]["backward"] for g in got] == back, (k, variant)
            totals[(k, variant)] = sum(want) / EP
    # k* = 2hb / (2hb/ep - 8 - b) = 8 here: the all-gather loses below it and wins above it
    assert dispatcher_crossover_top_k(H, 8, EP) == 8
    assert totals[(1, "allgather")] > totals[(1, "alltoall")] and totals[(4, "allgather")] > totals[(4, "alltoall")]
    assert totals[(12, "allgather")] < totals[(12, "alltoall")]


def test_pad_to_capacity_and_the_dispatcher_are_refused_with_the_numbers():
    with pytest.raises(ValueError, match="pad_to_capacity=True pads every expert to its capacity C"):
        MoEConfig(n_experts=8, top_k=2, pad_to_capacity=True)
    with pytest.raises(ValueError, match="dispatcher='allgather' has none"):
        MoEConfig(n_experts=8, top_k=2, pad_to_capacity=True, capacity_factor=1.0, dispatcher="allgather")
    with pytest.raises(ValueError, match="dispatcher='scatter' must be one of"):
        MoEConfig(n_experts=8, top_k=2, dispatcher="scatter")


def test_the_all_gather_dispatcher_with_etp_needs_the_grid_group():
    from pylib.runtime.mesh import AxisGroup

    moe = seeded_moe(MoEConfig(n_experts=8, top_k=2, dispatcher="allgather"), 8, 16)
    ep, etp = AxisGroup("ep", (0, 2), 0), AxisGroup("etp", (0, 1), 0)
    with pytest.raises(ValueError, match=r"etp x ep = 2 x 2 grid: pass grid_group"):
        ExpertParallelMoE(moe, ep, etp, None)


def test_the_crossover_is_near_ep_for_a_wide_model_and_absent_for_a_narrow_one():
    assert 8 < dispatcher_crossover_top_k(7168, 2, 8) < 8.05  # DeepSeek-V3's h in bf16 over 8 EP ranks
    assert dispatcher_crossover_top_k(4, 2, 8) == float("inf")  # 2hb/ep = 2 bytes < 8 + b: the ids alone lose
    ag = dispatcher_bytes("allgather", 100, 9, 7168, 2, 8)["total"]
    a2a = dispatcher_bytes("alltoall", 100, 9, 7168, 2, 8)["total"]
    assert (
        ag < a2a
        and dispatcher_bytes("allgather", 100, 8, 7168, 2, 8)["total"]
        > dispatcher_bytes("alltoall", 100, 8, 7168, 2, 8)["total"]
    )


def test_the_composed_model_accepts_shared_experts_both_dispatchers_and_padding():
    """Issue 32: what pylib.ep runs alone, pylib.compose places too (its runs: tests/test_compose_train.py)."""
    from pylib.compose import compose_problems
    from pylib.plan.presets import tiny

    par = ParallelConfig(dp=2, ep=2)
    for moe in [
        MoEConfig(n_experts=4, top_k=2, every=2, dispatcher="allgather"),
        MoEConfig(n_experts=4, top_k=2, every=2, n_shared_experts=1),
        MoEConfig(n_experts=4, top_k=2, every=2, n_groups=2, topk_groups=1, capacity_factor=1.0, pad_to_capacity=True),
    ]:
        assert compose_problems(tiny().with_(moe=moe), par, 2, batch=4, seq=8) == []
