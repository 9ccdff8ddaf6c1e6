"""Ulysses over real gloo ranks: equal to full attention forward and backward, four all-to-alls each way of the
formula's size, and clear errors when cp does not divide the heads."""

import pytest
import torch
import torch.distributed as dist

from pylib.analysis.cp import ulysses_traffic
from pylib.cp import shard_sequence, ulysses_attention
from pylib.runtime import launch, trace
from pylib.runtime.mesh import AxisGroup
from tests.conftest import assert_cp_attention_equals_full

B, S, D = 2, 16, 5
HEADS = {"mha": (4, 4), "gqa": (8, 4)}  # cp=4 needs 4 | n_kv_head


def _full(heads, seed=0):
    h, h_kv = HEADS[heads]
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, h, S, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, h_kv, S, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, h_kv, S, D, generator=g, dtype=torch.float64)
    w = torch.randn(B, h, S, D, generator=g, dtype=torch.float64)
    return q, k, v, w


def _rank(cases):
    r, n = dist.get_rank(), dist.get_world_size()
    results = []
    for (q, k, v, w), causal, layout in cases:
        ql, kl, vl = (shard_sequence(x, 2, r, n, layout).requires_grad_() for x in (q, k, v))
        with trace() as tr:
            out = ulysses_attention(ql, kl, vl, causal=causal, layout=layout)
            (out * shard_sequence(w, 2, r, n, layout)).sum().backward()
        results.append((out.detach(), ql.grad, kl.grad, vl.grad, [e.as_dict() for e in tr.events]))
    return results


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_ulysses_output_and_grads_equal_full_attention(causal, layout, cp):
    cases = [(_full(heads, seed=i), causal, layout) for i, heads in enumerate(HEADS)]
    per_rank = launch(_rank, cp, cases)
    assert_cp_attention_equals_full(cases, per_rank, cp)


@pytest.mark.parametrize("cp", [2, 4])
def test_ulysses_moves_four_all_to_alls_each_way_of_the_formula_size(cp):
    h, h_kv = HEADS["gqa"]
    f = ulysses_traffic(B, S, h, h_kv, D, cp, 8)
    for results in launch(_rank, cp, [(_full("gqa"), True, "zigzag")]):
        events = results[0][4]
        fwd = [e for e in events if e["phase"] == "forward"]
        bwd = [e for e in events if e["phase"] == "backward"]
        assert [e["op"] for e in fwd] == ["all_to_all"] * f["all_to_alls_forward"]
        assert [e["op"] for e in bwd] == ["all_to_all"] * f["all_to_alls_backward"]
        assert [e["tag"].rsplit(".", 1)[1] for e in fwd] == ["q", "k", "v", "out"]
        sent = [e["bytes_sent"] for e in fwd]
        assert sent == [f["sent_bytes"][name] for name in ("q", "k", "v", "out")]
        assert all(e["bytes_sent"] == (cp - 1) * e["payload_bytes"] // cp for e in fwd + bwd)
        assert [e["payload_bytes"] for e in fwd] == [f["local_bytes"][n] for n in ("q", "k", "v", "out")]
        assert sum(sent) == f["forward_bytes_sent"]
        assert sum(e["bytes_sent"] for e in bwd) == f["backward_bytes_sent"]


def test_ulysses_rejects_heads_not_divisible_by_cp_naming_the_numbers():
    group4 = AxisGroup("cp", (0, 1, 2, 3), 0, None)  # the checks run before any communication
    q = torch.zeros(1, 6, 4, 8)
    with pytest.raises(ValueError, match="cp=4 does not divide n_head=6"):
        ulysses_attention(q, q, q, group=group4)
    q = torch.zeros(1, 8, 4, 8)
    with pytest.raises(ValueError, match="cp=4 does not divide n_kv_head=2"):
        ulysses_attention(q, q[:, :2], q[:, :2], group=group4)
    with pytest.raises(ValueError, match=r"s_local=3 is odd \(s=12 is not divisible by 8\)"):
        ulysses_attention(q[:, :, :3], q[:, :, :3], q[:, :, :3], group=group4, layout="zigzag")
