"""The combine weights applied inside the experts ("gate_in_expert", `pylib.model.v3_storage.gated_expert`): y_i =
(g_i h_i) W_down^T equals g_i e_i with e_i = h_i W_down^T, and dL/dg_i = <dy_i W_down, h_i> needs no expert output.
Checked equal to the plain path in float64 (loss, output and every gradient, the router's included) on one device and
on two real EP ranks, and what autograd saves is measured with saved-tensor hooks and held equal to the planner's
count (`pylib.analysis.activations.storage_rows`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from pylib.analysis import activations as A
from pylib.analysis import planner as P
from pylib.model import MLP, saved_activations
from pylib.model.v3_storage import cached_swiglu_mlp, gated_expert
from pylib.plan.options import Fp8Recipe
from pylib.runtime import ParallelConfig
from tests.conftest import seeded_forward_saving

# The two-rank layouts the gate inside the experts runs on: EP 2, EP 2 padded to capacity, ETP 2.
EP_CASES = pytest.mark.parametrize(
    "par, capacity",
    [(dict(ep=2), False), (dict(ep=2), True), (dict(etp=2), False)],
    ids=["ep2", "ep2-padded", "etp2"],
)

TOL = dict(rtol=1e-12, atol=1e-12)


def _expert(kind: str, dtype=torch.float64) -> MLP:
    torch.manual_seed(0)
    mlp = MLP(16, 32, kind).to(dtype)
    for p in mlp.parameters():
        nn.init.normal_(p, std=0.25)
    return mlp


def _loss_and_grads(fn, mlp, x, w):
    x, w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    y = fn(x, w)
    dy = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)
    loss = (y * dy).sum()
    return (loss.detach(), y.detach(), *torch.autograd.grad(loss, [x, w, *mlp.parameters()]))


@pytest.mark.parametrize(
    "kind, path",
    [("swiglu", "autograd"), ("gelu", "autograd"), ("swiglu", "cached")],
    ids=["swiglu", "gelu", "swiglu-cached"],
)
def test_the_gate_inside_the_expert_equals_scaling_its_output_in_float64(kind, path):
    mlp = _expert(kind)
    x, w = torch.randn(24, 16, dtype=torch.float64), torch.rand(24, dtype=torch.float64)
    plain = _loss_and_grads(lambda t, g: mlp(t) * g[:, None], mlp, x, w)
    if path == "cached":  # the SwiGLU's inputs cached unquantized, its output rebuilt in backward
        inside = _loss_and_grads(lambda t, g: cached_swiglu_mlp(t, mlp, None, g), mlp, x, w)
    else:
        inside = _loss_and_grads(lambda t, g: gated_expert(t, mlp, g), mlp, x, w)
    for a, b in zip(inside, plain, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_a_gate_of_the_wrong_shape_is_refused():
    mlp = _expert("swiglu")
    with pytest.raises(ValueError, match=r"one combine weight per row: shape \(24,\)"):
        gated_expert(torch.randn(24, 16, dtype=torch.float64), mlp, torch.rand(24, 1, dtype=torch.float64))


@pytest.mark.parametrize("recipe", [None, Fp8Recipe("tensorwise")], ids=["bf16", "tensorwise"])
def test_the_gated_expert_keeps_no_output_only_one_weight_a_row(recipe):
    mlp = _expert("swiglu", torch.bfloat16)
    R, h = 128, 16
    x = torch.randn(R, h, dtype=torch.bfloat16, requires_grad=True)
    w = torch.rand(R, dtype=torch.bfloat16, requires_grad=True)

    def outside():
        return (mlp(x) if recipe is None else cached_swiglu_mlp(x, mlp, recipe)) * w[:, None]

    kept = {}
    for name, fn in (("plain", outside), ("inside", lambda: gated_expert(x, mlp, w, recipe))):
        with saved_activations(exclude=[*mlp.parameters(), x, w]) as saved:
            fn()
        kept[name] = saved.bytes
    # outside, the product keeps the expert output e [R, h] for the weight's gradient (the weight itself is
    # excluded here, the caller's); inside, the output is not kept, and the weight is (the caller's tensor: 0 here)
    assert kept["plain"] - kept["inside"] == R * h * 2


def _ep_worker(gate: bool, par: dict, capacity: bool):
    import torch.distributed as dist

    from pylib.ep import ExpertParallelMoE
    from pylib.plan.config import MoEConfig
    from pylib.runtime import Mesh
    from tests.conftest import seeded_moe

    mesh = Mesh(ParallelConfig(dp=2, **par))
    extra = dict(capacity_factor=1.5, pad_to_capacity=True) if capacity else {}
    moe = MoEConfig(n_experts=4, top_k=2, **extra)
    layer = ExpertParallelMoE.from_full(seeded_moe(moe, 8, 16, "swiglu"), ep_group=mesh.ep, etp_group=mesh.etp)
    layer.dispatcher.gate_in_expert = gate
    saved, g, x, params, y = seeded_forward_saving(layer, seed=5 + dist.get_rank())
    loss = (y * torch.randn(y.shape, generator=g, dtype=y.dtype)).sum()
    grads = torch.autograd.grad(loss, [x, *params], allow_unused=True)
    return saved.bytes, loss.detach(), y.detach(), [None if t is None else t.detach() for t in grads]


@pytest.mark.slow
@EP_CASES
def test_the_gate_inside_the_experts_equals_the_plain_layer_on_two_ranks(par, capacity):
    from pylib.runtime import launch

    plain, inside = (launch(_ep_worker, 2, gate, par, capacity) for gate in (False, True))
    for (b0, *p), (b1, *q) in zip(plain, inside, strict=True):
        torch.testing.assert_close(q[0], p[0], **TOL)  # the loss
        torch.testing.assert_close(q[1], p[1], **TOL)  # the output
        for a, b in zip(q[2], p[2], strict=True):  # x, the router, every local expert weight
            torch.testing.assert_close(a, b, **TOL)
        assert b1 < b0  # the expert outputs are not kept


@pytest.mark.slow
def test_an_ep_layer_with_the_gate_inside_saves_what_the_planner_counts_on_two_ranks():
    """Both ranks, float32 (one FP8 scale per cached tensor: one expert a rank), the report's storage with and
    without "gate_in_expert": autograd's saved bytes equal `moe_saved_rows` through `fp8_rows` and `storage_rows`,
    for the plain layer and for the same forward overlapped (`pylib.ep.overlap.moe_steps`)."""
    from pylib.model import ModelConfig
    from pylib.plan.config import MoEConfig
    from pylib.runtime import launch

    recipe = Fp8Recipe("tensorwise")
    moe = MoEConfig(n_experts=2, top_k=2)
    cfg = ModelConfig(d_model=8, d_ff=16, n_heads=2, n_layers=1, mlp="swiglu", dtype="float32", moe=moe)
    plan = P.Plan(ParallelConfig())
    for gate in (False, True):
        storage = ("swiglu_fp8", "fused_unpermute", *(("gate_in_expert",) if gate else ()))
        for measured, overlapped, R in launch(_ep_gate_storage_worker, 2, gate, recipe):
            rows = A.fp8_rows(A.moe_saved_rows(cfg, 6, expert_rows=R), cfg, recipe, plan, 1, 6, expert_rows=R)
            rows = A.storage_rows(rows, cfg, plan, (6, R, 6), recipe, storage)
            assert measured == sum(rows.values()), (gate, rows)
            assert overlapped == measured, (gate, overlapped, measured)  # `pylib.ep.overlap.moe_steps` keeps the same
            if gate:
                assert "combine weights at the experts [R]" in rows
                assert not any(item.startswith("expert outputs") for item in rows)


def _ep_gate_storage_worker(gate: bool, recipe):
    import torch.distributed as dist

    from pylib.ep import ExpertParallelMoE
    from pylib.ep.overlap import interleave, moe_steps
    from pylib.plan.config import MoEConfig
    from pylib.runtime import Mesh
    from tests.conftest import seeded_moe

    mesh = Mesh(ParallelConfig(dp=2, ep=2))
    moe = MoEConfig(n_experts=2, top_k=2)  # one expert a rank: one FP8 scale per cached tensor, as counted
    layer = ExpertParallelMoE.from_full(seeded_moe(moe, 8, 16, "swiglu", dtype="float32"), ep_group=mesh.ep)
    layer.experts.swiglu_fp8 = recipe
    layer.dispatcher.fused_unpermute = True
    layer.dispatcher.gate_in_expert = gate
    g = torch.Generator().manual_seed(5 + dist.get_rank())
    x = torch.randn(1, 6, 8, generator=g, requires_grad=True)
    with saved_activations(exclude=list(layer.parameters())) as saved:
        layer(x)
    with saved_activations(exclude=list(layer.parameters())) as overlapped:  # the same forward as a generator
        interleave([moe_steps(layer, x)])
    return saved.bytes, overlapped.bytes, int(sum(layer.last_state.rows_per_local_expert))


# ------------------------------------------------------------------------------------------ the overlapped forward


def _overlap_gate_worker(par: dict, capacity: bool):
    """One EP layer with the gate inside, two micro-batches three ways: the plain layer (blocking exchanges), the
    two forwards interleaved (`interleave`), and A's backward in pieces paired with B's forward (`Segments`). Each:
    losses, outputs, gradients, and the traced bytes by (op, phase, tag without the micro-batch)."""
    import torch.distributed as dist

    from pylib.ep import ExpertParallelMoE
    from pylib.ep.overlap import Segments, interleave, moe_steps
    from pylib.plan.config import MoEConfig
    from pylib.runtime import Mesh, trace
    from tests.conftest import seeded_moe

    mesh = Mesh(ParallelConfig(dp=2, **par))
    extra = dict(capacity_factor=1.5, pad_to_capacity=True) if capacity else {}
    moe = MoEConfig(n_experts=4, top_k=2, **extra)
    layer = ExpertParallelMoE.from_full(seeded_moe(moe, 8, 16, "swiglu"), ep_group=mesh.ep, etp_group=mesh.etp)
    layer.dispatcher.gate_in_expert = True
    g = torch.Generator().manual_seed(5 + dist.get_rank())
    xs = [torch.randn(1, 6, 8, generator=g, dtype=torch.float64) for _ in range(2)]
    dys = [torch.randn(1, 6, 8, generator=g, dtype=torch.float64) for _ in range(2)]
    out = {}
    for how in ("layers", "overlap", "paired"):
        layer.zero_grad(set_to_none=True)
        xa, xb = (x.clone().requires_grad_() for x in xs)
        with trace() as tr:
            if how == "layers":
                ya, yb = layer(xa), layer(xb)
                ((ya * dys[0]).sum() + (yb * dys[1]).sum()).backward()
            elif how == "overlap":
                ya, yb = interleave([moe_steps(layer, xa), moe_steps(layer, xb)], overlap=True)
                ((ya * dys[0]).sum() + (yb * dys[1]).sum()).backward()
            else:
                cut = Segments()
                (ya,) = interleave([moe_steps(layer, xa, cut=cut)], overlap=False)
                _, yb = interleave([cut.backward((ya * dys[0]).sum()), moe_steps(layer, xb)], overlap=True)
                (yb * dys[1]).sum().backward()
        sent = {}
        for e in tr.events:
            key = (e.op, e.phase, e.tag.split(".")[-1])
            sent[key] = sent.get(key, 0) + e.bytes_sent
        grads = [p.grad for p in layer.parameters()] + [xa.grad, xb.grad]
        out[how] = ([ya.detach(), yb.detach()], grads, sent)
    return out


@pytest.mark.slow
@EP_CASES
def test_the_overlapped_forward_sends_the_gates_with_the_rows_and_equals_the_blocking_layer(par, capacity):
    """`moe_steps` with gate_in_expert: outputs and every gradient bit for bit the blocking layer's (float64, two
    real ranks), interleaved and paired forward-under-backward, and the same bytes on the same exchanges (the
    weights' all-to-all, [R] a rank, included)."""
    from pylib.runtime import launch

    for rank in launch(_overlap_gate_worker, 2, par, capacity):
        outs, grads, sent = rank["layers"]
        assert any(tag == "dispatch" and op in ("all_to_all", "all_gather") for op, _, tag in sent)
        for how in ("overlap", "paired"):
            o, gr, s = rank[how]
            assert all(torch.equal(a, b) for a, b in zip(o, outs, strict=True)), how
            assert all(a is not None and torch.equal(a, b) for a, b in zip(gr, grads, strict=True)), how
            assert s == sent, how
