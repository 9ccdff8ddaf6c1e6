"""Parallel folding: the dense layout TP x CP x DP x PP and the expert layout ETP x EP x EDP x PP put the same ranks
into groups two ways, and a real 8-rank block uses both at once (attention over the dense groups, the MoE over the
expert groups) and still equals the reference."""

import pytest
import torch
import torch.distributed as dist

from pylib.ep import ExpertParallelMoE
from pylib.ep.folding import folding_groups, folding_table, format_folding_table, rank_layout
from pylib.model.attention import attention_core
from pylib.model.transformer import Block
from pylib.plan.config import ModelConfig, MoEConfig
from pylib.runtime import Mesh, ParallelConfig, collectives, launch, rank_groups
from tests.conftest import assert_float64_close


@pytest.mark.parametrize(
    "cfg",
    [
        ParallelConfig(tp=2, cp=2, dp=2, pp=2, ep=4, etp=1),  # the book's example: edp = 2
        ParallelConfig(tp=2, cp=2, dp=2, pp=2, ep=2, etp=2),
        ParallelConfig(tp=2, cp=1, dp=4, pp=2, ep=4, etp=1),  # EP spans TP and DP ranks
    ],
)
def test_folding_table_places_every_rank_by_both_factorisations(cfg):
    world = 16
    edp = world // (cfg.etp * cfg.ep * cfg.pp)
    rows = folding_table(cfg, world)
    assert [r["rank"] for r in rows] == list(range(world))
    for r in rows:
        # independent of rank_groups: the order "tp-cp-ep-dp-pp" is a mixed-radix number, first axis fastest
        assert r["rank"] == r["tp"] + cfg.tp * (r["cp"] + cfg.cp * (r["dp"] + cfg.dp * r["pp"]))
        assert r["rank"] == r["etp"] + cfg.etp * (r["ep"] + cfg.ep * (r["edp"] + edp * r["pp_expert"]))
        assert r["pp"] == r["pp_expert"]  # a rank's pipeline stage does not depend on the layer type
    groups = folding_groups(cfg, world)
    for layout, axes in groups.items():
        for axis, gs in axes.items():
            assert sorted(m for g in gs for m in g) == list(range(world)), (layout, axis)
    assert len(groups["expert"]["ep"][0]) == cfg.ep and len(groups["expert"]["edp"][0]) == edp
    text = format_folding_table(cfg, world)
    assert len(text.splitlines()) == world + 1


def test_book_example_tp2_cp2_dp2_pp2_ep4_folds_one_tp_cp_block_into_one_ep_group():
    cfg = ParallelConfig(tp=2, cp=2, dp=2, pp=2, ep=4, etp=1)
    g = folding_groups(cfg, 16)
    assert g["expert"]["ep"] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert g["expert"]["ep"] == rank_groups(cfg, 16)["tp-cp"]
    assert g["expert"]["edp"] == g["dense"]["dp"] and g["expert"]["pp"] == g["dense"]["pp"]


# ---------------------------------------------------------------------------------------------- a real 8-rank run

MODEL = ModelConfig(
    d_model=8,
    n_heads=2,
    d_ff=16,
    n_layers=1,
    causal=True,
    dtype="float64",
    moe=MoEConfig(n_experts=8, top_k=2, capacity_factor=1.0, aux_loss_coef=0.1),
)
FOLD = ParallelConfig(tp=2, cp=2, dp=2, ep=4, etp=2)  # 8 ranks: ETP = TP; EP spans CP and DP; EDP = 1
S = 16  # sequence length; each rank holds S / (tp * cp) = 4 positions of its data-parallel micro-batch


def _block():
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return Block(MODEL).double()


def _batch(dp_rank):
    g = torch.Generator().manual_seed(10 + dp_rank)
    return torch.randn(1, S, MODEL.d_model, generator=g, dtype=torch.float64), torch.randn(
        1, S, MODEL.d_model, generator=g, dtype=torch.float64
    )


def _folded_block():
    mesh = Mesh(FOLD)
    seq = mesh["tp-cp"]  # the ranks holding pieces of one sequence (SP x CP), in sequence order
    block = _block()
    moe = ExpertParallelMoE.from_mesh(block.mlp, mesh)  # expert groups; aux loss over tp-cp (Megatron's)
    x, dy = _batch(mesh.dp.rank)
    part = S // seq.size
    pos = torch.arange(seq.rank * part, (seq.rank + 1) * part)
    x = x[:, pos].clone().requires_grad_()
    # attention over the dense groups: every rank's K and V gathered along the sequence over tp-cp
    h = block.ln1(x)
    q, k, v = block.attn.project(h)
    k_all = collectives.all_gather(k.contiguous(), 2, seq)
    v_all = collectives.all_gather(v.contiguous(), 2, seq)
    o = attention_core(q, k_all, v_all, causal=True, q_pos=pos, k_pos=torch.arange(S))
    x1 = x + block.attn.o_proj(o.transpose(1, 2).reshape(1, part, -1))
    y = x1 + moe(block.ln2(x1))
    (y * dy[:, pos]).sum().backward()
    # replicated weights: sum gradients over every rank that holds other tokens (SP/CP and DP)
    everyone = mesh["tp-dp-cp"]
    dense = {n: p.grad.clone() for n, p in block.named_parameters() if not n.startswith("mlp.") and p.grad is not None}
    for g in dense.values():
        collectives.all_reduce_(g, everyone)
    moe.reduce_router_grad(everyone)
    experts = {ref: (p.grad, idx) for _, p, ref, idx in moe.param_map() if ref.startswith("experts.")}
    return dict(
        y=y.detach(),
        dx=x.grad,
        pos=pos,
        dp=mesh.dp.rank,
        dense=dense,
        experts=experts,
        router=moe.router.gate.weight.grad,
        layout=rank_layout(mesh),
        rank=dist.get_rank(),
        dropped=int((~moe.last_keep).sum()),
    )


def test_attention_on_dense_groups_and_moe_on_expert_groups_coexist_on_8_ranks():
    results = launch(_folded_block, 8)
    block = _block()
    ys = {}
    for dp in range(2):  # the reference: one block, each micro-batch on its own, capacity per holding rank
        x, dy = _batch(dp)
        x.requires_grad_()
        block.mlp.drop_groups = torch.arange(S).div(S // 4, rounding_mode="floor")[None, :]
        y = block(x)
        (y * dy).sum().backward()
        ys[dp] = (y.detach(), x.grad)
    params = dict(block.named_parameters())
    for res in results:
        y_ref, dx_ref = ys[res["dp"]]
        assert_float64_close(res["y"], y_ref[:, res["pos"]])
        assert_float64_close(res["dx"], dx_ref[:, res["pos"]])
        for name, g in res["dense"].items():
            assert_float64_close(g, params[name].grad, name)
        assert_float64_close(res["router"], params["mlp.router.gate.weight"].grad)
        for ref, (g, idx) in res["experts"].items():  # EP spans both micro-batches: complete with no sync
            full = params["mlp." + ref].grad
            assert_float64_close(g, full[idx], ref)
    assert sum(res["dropped"] for res in results) > 0  # the per-rank capacity rule was exercised
    # the two layouts really differ on these ranks: rank 0's EP group is not one of its dense groups
    layout = results[0]["layout"]
    assert layout["expert"]["etp"] == layout["dense"]["tp"] == (0, 1)
    assert layout["expert"]["ep"] == (0, 2, 4, 6)  # crosses CP (0, 2) and DP (0, 4)
    assert layout["expert"]["ep"] not in layout["dense"].values()
