"""Shared experts, group-limited routing, the all-gather dispatcher and pad-to-capacity: the expert-parallel layer
equals the reference MoE in float64.

The shared MLP is cut over the dense TP group (column / row, sequence-parallel gather and reduce-scatter) and
replicated over EP, as Megatron-Core's SharedExpertMLP; the routed experts go through the dispatcher as before.
Every rank holds a different sequence shard; the reference sees all of them with each token labelled by its rank
(capacity per rank). Forward, input gradients, router gradients (summed over every rank), the shared slices'
gradients (summed over the data-parallel ranks holding the same slice) and every expert slice's gradient match.
"""

import pytest
import torch
import torch.distributed as dist

from pylib.ep import ExpertParallelMoE
from pylib.plan.config import MoEConfig, expert_capacity
from pylib.runtime import Mesh, ParallelConfig, launch
from tests.conftest import assert_float64_close, seeded_moe

H, F, B = 8, 16, 2

CASES = {
    "shared-top2": (MoEConfig(n_experts=8, top_k=2, n_shared_experts=1), "gelu"),
    "shared2-swiglu-drop-aux": (
        MoEConfig(n_experts=8, top_k=2, n_shared_experts=2, capacity_factor=0.6, aux_loss_coef=0.1),
        "swiglu",
    ),
    "grouped-sigmoid-drop": (
        MoEConfig(n_experts=8, top_k=2, score="sigmoid", n_groups=4, topk_groups=1, capacity_factor=0.7),
        "gelu",
    ),
    "grouped-shared-v3-like": (
        MoEConfig(n_experts=8, top_k=4, score="sigmoid", n_groups=4, topk_groups=2, n_shared_experts=1),
        "swiglu",
    ),
    "allgather-shared-drop": (
        MoEConfig(n_experts=8, top_k=2, dispatcher="allgather", n_shared_experts=1, capacity_factor=0.6),
        "gelu",
    ),
    "allgather-grouped-aux": (
        MoEConfig(n_experts=8, top_k=4, dispatcher="allgather", n_groups=2, topk_groups=1, aux_loss_coef=0.1),
        "swiglu",
    ),
    "pad-drop-position": (
        MoEConfig(n_experts=8, top_k=2, pad_to_capacity=True, capacity_factor=0.7, drop_policy="position"),
        "gelu",
    ),
    "pad-no-drop-shared": (
        MoEConfig(n_experts=8, top_k=2, pad_to_capacity=True, capacity_factor=4.0, n_shared_experts=1),
        "swiglu",
    ),
}
DROPPING = {"shared2-swiglu-drop-aux", "grouped-sigmoid-drop", "allgather-shared-drop", "pad-drop-position"}


def _data(s):
    g = torch.Generator().manual_seed(1)
    return torch.randn(B, s, H, generator=g, dtype=torch.float64), torch.randn(
        B, s, H, generator=g, dtype=torch.float64
    )


def _worker(tp, ep, etp, s):
    mesh = Mesh(ParallelConfig(tp=tp, dp=4 // tp, ep=ep, etp=etp))
    r, n = dist.get_rank(), dist.get_world_size()
    out = {}
    for name, (cfg, kind) in CASES.items():
        moe = seeded_moe(cfg, H, F, kind)
        with torch.no_grad():  # a bias that changes the choice: the group rule sees scores + bias
            moe.router.expert_bias.copy_(torch.linspace(-0.1, 0.1, cfg.n_experts))
        layer = ExpertParallelMoE.from_mesh(moe, mesh, aux_group="world")
        x, dy = _data(s)
        x = x.chunk(n, 1)[r].clone().requires_grad_()
        y = layer(x)
        (y * dy.chunk(n, 1)[r]).sum().backward()
        layer.reduce_router_grad(mesh.world)
        layer.reduce_shared_grad(mesh.dp)
        maps = layer.param_map() + (layer.shared.param_map() if layer.shared is not None else [])
        out[name] = dict(
            y=y.detach(),
            dx=x.grad,
            grads={ref: (p.grad, idx) for _, p, ref, idx in maps},
            shared=layer.shared is not None,
            dropped=int((~layer.last_keep).sum()),
            dispatcher=type(layer.dispatcher).__name__,
            rows=layer.last_state.rows_per_local_expert,
            capacity=expert_capacity(x.numel() // H, cfg),
        )
    return out


def _reference(name, n, s):
    cfg, kind = CASES[name]
    moe = seeded_moe(cfg, H, F, kind)
    with torch.no_grad():
        moe.router.expert_bias.copy_(torch.linspace(-0.1, 0.1, cfg.n_experts))
    x, dy = _data(s)
    x.requires_grad_()
    owner = torch.arange(s).div(s // n, rounding_mode="floor")
    y = moe(x, drop_groups=owner[None, :].expand(B, s))
    (y * dy).sum().backward()
    return y.detach(), x.grad, dict(moe.named_parameters()), moe.last_routing


# one 4-rank run with every axis at 2 (tp for the shared MLP, ep and etp for the routed experts): a few seconds
@pytest.mark.slow
def test_shared_experts_and_group_limited_routing_match_the_reference_forward_and_gradients():
    n, s = 4, 16
    results = launch(_worker, n, 2, 2, 2, s)
    for name, (cfg, _) in CASES.items():
        y_ref, dx_ref, params, routing = _reference(name, n, s)
        for r, res in enumerate(results):
            got = res[name]
            assert got["shared"] == bool(cfg.n_shared_experts)
            assert_float64_close(got["y"], y_ref.chunk(n, 1)[r], name)
            assert_float64_close(got["dx"], dx_ref.chunk(n, 1)[r], name)
            for ref_name, (g, idx) in got["grads"].items():
                full = params[ref_name].grad
                full = torch.zeros_like(params[ref_name]) if full is None else full  # an idle expert
                g = torch.zeros_like(full[idx]) if g is None else g
                assert_float64_close(g, full[idx], f"{name}: {ref_name} rank {r}")
            want = "AllGatherDispatcher" if cfg.dispatcher == "allgather" else "AllToAllDispatcher"
            assert got["dispatcher"] == want
            if cfg.pad_to_capacity:  # fixed shapes: each local expert gets C rows from each of the etp*ep ranks
                assert got["rows"] == [4 * got["capacity"]] * 4
        if name in DROPPING:
            assert sum(res[name]["dropped"] for res in results) > 0, f"{name} dropped nothing: it tests nothing"
        if cfg.n_groups > 1:  # the limit binds: every token's experts lie in at most topk_groups groups
            groups = routing.experts.div(cfg.n_experts // cfg.n_groups, rounding_mode="floor")
            spans = [len(set(row)) for row in groups.tolist()]
            assert max(spans) <= cfg.topk_groups


def test_shared_experts_add_the_dense_mlp_to_the_routed_sum():
    cfg = MoEConfig(n_experts=4, top_k=1, n_shared_experts=2)
    moe = seeded_moe(cfg, H, F, "gelu")
    x = torch.randn(3, H, dtype=torch.float64)
    routed = moe(x) - moe.shared(x)
    plain = seeded_moe(MoEConfig(n_experts=4, top_k=1), H, F, "gelu")  # the same seed: the same router, experts
    assert moe.shared.up_proj.weight.shape == (2 * F, H)
    assert_float64_close(routed, plain(x))


def test_shared_experts_refuse_a_tp_that_does_not_divide_their_width():
    from pylib.runtime.mesh import AxisGroup

    moe = seeded_moe(MoEConfig(n_experts=4, top_k=1, n_shared_experts=1), H, 6, "gelu")
    with pytest.raises(ValueError, match="tp=4 does not divide the shared experts' h_ffn=6"):
        ExpertParallelMoE(
            moe, AxisGroup("ep", (0,), 0), AxisGroup("etp", (0,), 0), None, AxisGroup("tp", (0, 1, 2, 3), 0)
        )


def _shared_without_sp(kind):
    from pylib.ep.shared import SharedExperts

    mesh = Mesh(ParallelConfig(tp=2))
    full = seeded_moe(MoEConfig(n_experts=4, top_k=1, n_shared_experts=2), H, F, kind).shared
    mine = SharedExperts(full, mesh.tp, sequence_parallel=False)
    x, dy = _data(4)  # the same tokens on both TP ranks, as the TP region holds them without SP
    x.requires_grad_()
    y = mine(x)
    (y * dy).sum().backward()
    return dict(y=y.detach(), dx=x.grad, grads={ref: (p.grad, idx) for _, p, ref, idx in mine.param_map()})


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gelu", "swiglu"])
def test_shared_experts_without_sp_enter_and_leave_tp_by_f_and_g(kind):
    """sequence_parallel=False (the composed model's TP region without SP, evaluation only for a MoE model): the
    slices see the whole sequence on each TP rank, the input gradient is summed over tp (f's backward) and the
    output partial sums all-reduced (g): both ranks give the reference's output and input gradient."""
    full = seeded_moe(MoEConfig(n_experts=4, top_k=1, n_shared_experts=2), H, F, kind).shared
    x, dy = _data(4)
    x.requires_grad_()
    (full(x) * dy).sum().backward()
    for r in launch(_shared_without_sp, 2, kind):
        assert_float64_close(r["y"], full(x).detach(), kind)
        assert_float64_close(r["dx"], x.grad, kind)
        params = dict(full.named_parameters(prefix="shared"))
        for ref_name, (g, idx) in r["grads"].items():
            assert_float64_close(g, params[ref_name].grad[idx], ref_name)
