"""The reference MoE's routing rules that an expert-parallel run must reproduce: per-rank capacity, the
auxiliary-loss-free bias update, the aux-loss shares, and top-1 sigmoid weights."""

import torch
import torch.distributed as dist

from pylib.ep import ExpertParallelMoE, group_aux_loss
from pylib.model.moe import auxiliary_loss, updated_expert_bias
from pylib.plan.config import MoEConfig
from pylib.runtime import launch
from tests.conftest import assert_float64_close, seeded_moe

H, F = 8, 16


def _x(b, s, seed=1):
    return torch.randn(b, s, H, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_capacity_per_drop_group_equals_running_each_group_alone():
    for policy in ("probs", "position"):
        cfg = MoEConfig(n_experts=4, top_k=2, capacity_factor=0.75, drop_policy=policy)
        moe = seeded_moe(cfg, H, F)
        x = _x(2, 12)
        groups = torch.arange(12).div(4, rounding_mode="floor").expand(2, 12)  # 3 sequence shards
        together = moe(x, drop_groups=groups)
        dropped = int((~moe.last_keep).sum())
        alone = torch.cat([moe(part) for part in x.chunk(3, dim=1)], dim=1)
        assert_float64_close(together, alone)
        assert dropped > 0
        # and it is a different rule from one capacity over all tokens
        assert not torch.allclose(moe(x), together)


def test_expert_bias_rule_lowers_overloaded_and_raises_underloaded_experts():
    bias = torch.zeros(4, dtype=torch.float64)
    new = updated_expert_bias(bias, torch.tensor([7, 1, 2, 2]), rate=0.01)  # mean 3
    assert new.tolist() == [-0.01, 0.01, 0.01, 0.01]
    assert torch.equal(updated_expert_bias(bias, torch.tensor([3, 3, 3, 3]), 0.01), bias)


def test_aux_loss_free_bias_updates_balance_a_skewed_router():
    cfg = MoEConfig(n_experts=4, top_k=1, score="sigmoid", bias_update_rate=0.02)
    moe = seeded_moe(cfg, H, F)
    with torch.no_grad():
        moe.router.gate.weight[0] += 1.0  # expert 0 wins for most tokens
    x = _x(4, 16)

    def imbalance():
        with torch.no_grad():
            moe(x)
        load = torch.bincount(moe.last_routing.experts.reshape(-1), minlength=4).double()
        return (load.max() / load.mean()).item()

    before = imbalance()
    for _ in range(30):
        moe(x)  # grad enabled: counts accumulate
        moe.update_expert_bias()
    after = imbalance()
    assert before > 2.0 and after < 0.6 * before
    assert moe.router.expert_bias[0] < 0 < moe.router.expert_bias[1:].min()


def test_top1_sigmoid_weight_is_the_raw_sigmoid_so_the_router_learns():
    moe = seeded_moe(MoEConfig(n_experts=4, top_k=1, score="sigmoid"), H, F)
    x = _x(1, 6).reshape(6, H)
    r = moe.router(x)
    torch.testing.assert_close(r.weights, torch.sigmoid(x @ moe.router.gate.weight.T).gather(1, r.experts))
    moe(x.unsqueeze(0)).sum().backward()
    assert moe.router.gate.weight.grad.abs().max() > 0


def _bias_and_aux(cfg):
    r, n = dist.get_rank(), dist.get_world_size()
    layer = ExpertParallelMoE.from_full(seeded_moe(cfg, H, F), ep_group=None)
    layer(_x(2, 16).chunk(n, 1)[r])
    share = group_aux_loss(layer.last_routing, cfg, None)  # over this rank's tokens alone
    share_group = group_aux_loss(layer.last_routing, cfg, group=None if n == 1 else dist.group.WORLD)
    return layer.update_expert_bias(group=None), share, share_group


def test_ep_bias_update_and_aux_shares_match_the_reference_on_the_union():
    cfg = MoEConfig(n_experts=4, top_k=2, aux_loss_coef=0.1, z_loss_coef=0.01, bias_update_rate=0.05)
    results = launch(_bias_and_aux, 4, cfg)
    moe = seeded_moe(cfg, H, F)
    moe(_x(2, 16))
    ref_bias = moe.update_expert_bias()
    ref_aux = auxiliary_loss(moe.last_routing, cfg)
    assert ref_bias.abs().max() > 0  # the counts are not all equal, so the rule moved something
    for bias, _, _ in results:
        torch.testing.assert_close(bias, ref_bias, rtol=0, atol=0)
    assert_float64_close(sum(s for _, _, s in results), ref_aux)
    # without the group each rank's share is its own batch's loss: the sum is a different number
    assert abs(sum(s for _, s, _ in results) - ref_aux) > 1e-6
