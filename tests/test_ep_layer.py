"""The expert-parallel MoE equals the single-device reference MoE on the union of all ranks' tokens.

Every rank holds different tokens (a sequence shard, or a different micro-batch) and routes them itself; the
reference sees all tokens at once, with `drop_groups` labelling each token with its rank so capacity is applied
per rank as the EP run does (Megatron's rule). Forward outputs, input gradients, router gradients (after the
explicit sum over ranks) and every expert slice's gradient are compared in float64, for ep in {1, 2, 4} and
etp in {1, 2}, top-1 and top-2, softmax / sigmoid scoring, GELU / SwiGLU experts, with and without dropping and
with the auxiliary losses on.
"""

import pytest
import torch
import torch.distributed as dist

from pylib.ep import ExpertParallelMoE
from pylib.model.moe import auxiliary_loss
from pylib.plan.config import MoEConfig
from pylib.runtime import Mesh, ParallelConfig, launch
from tests.conftest import assert_float64_close, seeded_moe

H, F, B = 8, 16, 2

CASES = {
    "top1": (MoEConfig(n_experts=8, top_k=1), "gelu"),
    "top2": (MoEConfig(n_experts=8, top_k=2), "gelu"),
    "top2-mixtral-swiglu-aux": (
        MoEConfig(n_experts=8, top_k=2, topk_then_softmax=True, aux_loss_coef=0.1, z_loss_coef=0.01),
        "swiglu",
    ),
    "top1-drop-probs-aux": (MoEConfig(n_experts=8, top_k=1, capacity_factor=0.6, aux_loss_coef=0.1), "gelu"),
    "top2-drop-position-sigmoid": (
        MoEConfig(n_experts=8, top_k=2, score="sigmoid", capacity_factor=0.7, drop_policy="position"),
        "gelu",
    ),
}
DROPPING = {"top1-drop-probs-aux", "top2-drop-position-sigmoid"}


def _data(n, s):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, s, H, generator=g, dtype=torch.float64)
    dy = torch.randn(B, s, H, generator=g, dtype=torch.float64)
    return x, dy


def _split(t, n, r, dim):
    return t.chunk(n, dim)[r]


def _worker(ep, etp, s, dim):
    mesh = Mesh(ParallelConfig(dp=ep * etp, ep=ep, etp=etp))
    r, n = dist.get_rank(), dist.get_world_size()
    out = {}
    for name, (cfg, kind) in CASES.items():
        layer = ExpertParallelMoE.from_full(
            seeded_moe(cfg, H, F, kind), ep_group=mesh.ep, etp_group=mesh.etp, aux_group=mesh.world
        )
        x, dy = _data(n, s)
        x = _split(x, n, r, dim).clone().requires_grad_()
        y = layer(x)
        (y * _split(dy, n, r, dim)).sum().backward()
        router_local = layer.router.gate.weight.grad.clone()
        layer.reduce_router_grad(mesh.world)
        out[name] = dict(
            y=y.detach(),
            dx=x.grad,
            router_local=router_local,
            grads={ref: (p.grad, idx) for _, p, ref, idx in layer.param_map()},
            dropped=int((~layer.last_keep).sum()),
            aux=layer.last_aux_loss,
        )
    return out


def _reference(name, n, s, dim):
    cfg, kind = CASES[name]
    moe = seeded_moe(cfg, H, F, kind)
    x, dy = _data(n, s)
    x.requires_grad_()
    owner = torch.arange(x.shape[dim]).div(x.shape[dim] // n, rounding_mode="floor")  # the rank holding each token
    groups = owner[:, None].expand(B, s) if dim == 0 else owner[None, :].expand(B, s)
    y = moe(x, drop_groups=groups)
    (y * dy).sum().backward()
    aux = auxiliary_loss(moe.last_routing, cfg)
    return y.detach(), x.grad, dict(moe.named_parameters()), aux


def _check(results, n, s, dim):
    for name in CASES:
        y_ref, dx_ref, params, aux_ref = _reference(name, n, s, dim)
        for r, res in enumerate(results):
            got = res[name]
            assert_float64_close(got["y"], _split(y_ref, n, r, dim))
            assert_float64_close(got["dx"], _split(dx_ref, n, r, dim))
            for ref_name, (g, idx) in got["grads"].items():
                full = params[ref_name].grad
                full = torch.zeros_like(params[ref_name]) if full is None else full  # an idle expert
                g = torch.zeros_like(full[idx]) if g is None else g
                assert_float64_close(g, full[idx], f"{name}: {ref_name} rank {r}")
        if name in DROPPING:
            assert sum(res[name]["dropped"] for res in results) > 0, f"{name} dropped nothing: the case tests nothing"
        if aux_ref is not None:  # each rank adds its share; together they are the reference loss on the union
            assert_float64_close(sum(res[name]["aux"] for res in results), aux_ref)


# (2, 1), (4, 1) and (2, 2) stay in the inner loop: EP alone at two sizes and EP with ETP. The one-rank case, ETP
# alone and the 8-rank (4, 2) prove nothing those three do not, at more cost: slow.
@pytest.mark.parametrize(
    "ep, etp",
    [
        pytest.param(1, 1, marks=pytest.mark.slow),
        (2, 1),
        (4, 1),
        pytest.param(1, 2, marks=pytest.mark.slow),
        (2, 2),
        pytest.param(4, 2, marks=pytest.mark.slow),
    ],
)
def test_ep_moe_matches_reference_moe_forward_and_gradients(ep, etp):
    n, s = ep * etp, 4 * ep * etp
    results = launch(_worker, n, ep, etp, s, 1)
    _check(results, n, s, 1)


def test_ep_moe_matches_reference_when_ranks_hold_different_micro_batches():
    n, s = 2, 8
    results = launch(_worker, n, 2, 1, s, 0)
    _check(results, n, s, 0)


def test_router_gradient_is_partial_on_each_rank_and_its_sum_is_the_reference():
    n, s = 4, 16
    results = launch(_worker, n, 4, 1, s, 1)
    for name in ("top2", "top1-drop-probs-aux"):
        ref = _reference(name, n, s, 1)[2]["router.gate.weight"].grad
        local = [res[name]["router_local"] for res in results]
        assert all((g - ref).abs().max() > 1e-6 for g in local)  # no rank alone has the full gradient
        assert_float64_close(sum(local), ref)
        for res in results:  # after reduce_router_grad every rank holds it
            assert_float64_close(res[name]["grads"]["router.gate.weight"][0], ref)


def test_shard_specs_and_param_map_describe_exactly_what_a_rank_holds():
    from pylib.runtime.mesh import AxisGroup

    cfg, kind = CASES["top2-mixtral-swiglu-aux"]
    moe = seeded_moe(cfg, H, F, kind)
    # layout only (no traffic): rank 5 of an ETP x EP = 2 x 4 grid, ep index 2, etp index 1
    ep, etp = AxisGroup("ep", (1, 3, 5, 7), 2), AxisGroup("etp", (4, 5), 1)
    layer = ExpertParallelMoE(moe, ep, etp, None)
    assert list(layer.expert_ids) == [4, 5]
    full = dict(moe.named_parameters())
    for _, p, ref, idx in layer.param_map():
        assert torch.equal(p.detach(), full[ref].detach()[idx]), ref
    specs = {(s.name, s.axis): s for s in layer.shard_specs()}
    assert specs[("router.gate.weight", "ep")].kind == "replicated"
    for name, d, kind_ in [
        ("up_proj.weight", 1, "column"),
        ("gate_proj.weight", 1, "column"),
        ("down_proj.weight", 2, "row"),
    ]:
        e_spec, t_spec = specs[(f"experts.*.{name}", "ep")], specs[(f"experts.*.{name}", "etp")]
        held = torch.stack([getattr(x, name.split(".")[0]).weight for x in layer.experts.experts])
        assert t_spec.local_shape == tuple(held.shape) and t_spec.dim == d and t_spec.kind == kind_
        assert e_spec.full_shape == (8, *full[f"experts.0.{name}"].shape) and e_spec.dim == 0
        assert e_spec.fraction * t_spec.fraction == pytest.approx(1 / 8)  # one of ep * etp = 8 pieces
