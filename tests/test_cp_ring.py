"""Ring attention over real gloo ranks: equal to full attention forward and backward, traffic by formula, the
round table from the trace, and per-rank causal work (contiguous unbalanced, zig-zag balanced)."""

import pytest
import torch
import torch.distributed as dist

from pylib.analysis.cp import balance_ratio, causal_work_per_rank, ring_traffic, ring_work_per_rank
from pylib.cp import (
    RingStats,
    TorchKernel,
    format_round_table,
    ring_attention,
    ring_rounds,
    shard_sequence,
    unshard_sequence,
)
from pylib.model import attention_core
from pylib.runtime import launch, tag, trace
from pylib.runtime.mesh import AxisGroup
from tests.conftest import assert_cp_attention_equals_full, assert_float64_close

B, S, D = 2, 16, 5  # batch > 1, odd head dim
HEADS = {"mha": (4, 4), "gqa": (4, 2)}


def _full(heads, seed=0, s=S, dtype=torch.float64):
    h, h_kv = HEADS[heads]
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, h, s, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, h_kv, s, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, h_kv, s, D, generator=g, dtype=torch.float64)
    w = torch.randn(B, h, s, D, generator=g, dtype=torch.float64)  # loss = sum(out * w): a generic dout
    return tuple(x.to(dtype) for x in (q, k, v, w))


def _reference(q, k, v, w, causal):
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    out = attention_core(q, k, v, causal=causal)
    (out * w).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


def _rank_ring(cases, **kw):
    r, n = dist.get_rank(), dist.get_world_size()
    results = []
    for (q, k, v, w), causal, layout in cases:
        ql, kl, vl = (shard_sequence(x, 2, r, n, layout).requires_grad_() for x in (q, k, v))
        out = ring_attention(ql, kl, vl, causal=causal, layout=layout, **kw)
        (out * shard_sequence(w, 2, r, n, layout)).sum().backward()
        results.append((out.detach(), ql.grad, kl.grad, vl.grad))
    return results


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_ring_attention_output_and_grads_equal_full_attention(causal, layout, cp):
    cases = [(_full(heads, seed=i), causal, layout) for i, heads in enumerate(HEADS)]  # MHA and GQA
    per_rank = launch(_rank_ring, cp, cases)
    assert_cp_attention_equals_full(cases, per_rank, cp)


def test_blocking_variant_and_a_plugged_in_kernel_give_the_same_result():
    class CountingKernel(TorchKernel):
        calls = 0

        def forward(self, *a, **kw):
            CountingKernel.calls += 1
            return super().forward(*a, **kw)

    def rank():
        cases = [(_full("gqa"), True, "zigzag")]
        a = _rank_ring(cases)
        b = _rank_ring(cases, overlap=False, kernel=CountingKernel())
        return a, b, CountingKernel.calls

    for a, b, calls in launch(rank, 4):
        for x, y in zip(a[0], b[0]):
            assert torch.equal(x, y)
        assert calls == 4  # zig-zag computes a block at every one of the cp steps


def _rank_traced(dtype):
    r, n = dist.get_rank(), dist.get_world_size()
    q, k, v, w = _full("gqa", dtype=dtype)
    q, k, v = (shard_sequence(x, 2, r, n, "zigzag").requires_grad_() for x in (q, k, v))
    with trace() as tr, tag("layers.0.attn"):
        out = ring_attention(q, k, v, causal=True)
        (out.float() * shard_sequence(w, 2, r, n, "zigzag").float()).sum().backward()
    return [e.as_dict() for e in tr.events]


@pytest.mark.parametrize("cp, dtype", [(2, torch.float64), (4, torch.float64), (4, torch.bfloat16)])
def test_ring_sends_cp_minus_1_kv_blocks_forward_of_the_formula_size(cp, dtype):
    h_kv = HEADS["gqa"][1]
    elem = torch.tensor([], dtype=dtype).element_size()
    f = ring_traffic(B, S, h_kv, D, cp, elem)
    for rank, events in enumerate(launch(_rank_traced, cp, dtype)):

        def sel(phase, kind, op="send", events=events):
            return [e for e in events if e["phase"] == phase and e["op"] == op and f".ring.{kind}." in e["tag"]]

        fwd = sel("forward", "kv")
        assert len(fwd) == f["forward_kv_transfers"] == cp - 1
        assert all(e["payload_bytes"] == e["bytes_sent"] == f["kv_message_bytes"] for e in fwd)
        assert all(e["peer"] == (rank + 1) % cp for e in fwd)
        assert all(e["peer"] == (rank - 1) % cp for e in sel("forward", "kv", "recv"))
        assert sum(e["bytes_sent"] for e in fwd) == f["forward_bytes_sent"]
        bwd_kv, bwd_dkv = sel("backward", "kv"), sel("backward", "dkv")
        assert len(bwd_kv) == f["backward_kv_transfers"] and len(bwd_dkv) == f["backward_dkv_transfers"] == cp
        assert all(e["bytes_sent"] == f["dkv_message_bytes"] for e in bwd_dkv)  # float32 accumulators for bf16
        assert sum(e["bytes_sent"] for e in bwd_kv + bwd_dkv) == f["backward_bytes_sent"]
        assert all(e["tag"].startswith("layers.0.attn.ring.") for e in events)
        assert len(events) == 2 * (2 * (cp - 1) + cp)  # every send has its recv; nothing else is traced


def test_round_table_printed_from_the_trace_rotates_kv_one_rank_per_round():
    events = launch(_rank_traced, 4, torch.float64)
    rows = ring_rounds(events, tag="layers.0.attn")
    assert [row["round"] for row in rows] == [1, 2, 3, 4]
    for t, row in enumerate(rows):  # seed A: GPU r uses K_{r-t}V_{r-t} at round t+1, received from r-1
        assert row["holds"] == [(r - t) % 4 for r in range(4)]
        assert row["recv_from"] == (None if t == 0 else [(r - 1) % 4 for r in range(4)])
    table = format_round_table(rows)
    print(table)
    assert table.splitlines()[1].split() == ["1", "K0V0", "K1V1", "K2V2", "K3V3"]
    assert "recv K3V3 from 3" in table.splitlines()[2]  # the seed's "收 K₃V₃" on GPU0
    with pytest.raises(ValueError, match="no forward ring transfers"):
        ring_rounds(events, tag="layers.1")


def _rank_work(layout, causal):
    r, n = dist.get_rank(), dist.get_world_size()
    q, k, v, w = _full("mha")
    q, k, v = (shard_sequence(x, 2, r, n, layout).requires_grad_() for x in (q, k, v))
    stats = RingStats()
    out = ring_attention(q, k, v, causal=causal, layout=layout, stats=stats)
    (out * shard_sequence(w, 2, r, n, layout)).sum().backward()
    return stats


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_each_rank_computes_exactly_the_scheduled_blocks_and_no_fully_masked_one(causal):
    per_head = B * HEADS["mha"][0]
    for cp in (2, 4):
        for layout in ("contiguous", "zigzag"):
            stats = launch(_rank_work, cp, layout, causal)
            for what in ("computed", "unmasked"):
                expected = [per_head * x for x in ring_work_per_rank(S, cp, layout, causal, what)]
                for phase in ("forward", "backward"):
                    assert [s.work(phase, what) for s in stats] == expected, (cp, layout, what, phase)
            if causal:  # the entries that count are exactly the causal mask's
                assert [s.work("forward") for s in stats] == [per_head * x for x in causal_work_per_rank(S, cp, layout)]
            assert all(len(s.select("forward")) == len(s.select("backward")) == cp for s in stats)


def test_zigzag_balances_causal_work_while_contiguous_grows_unbalanced_with_cp():
    ratios = {}
    for cp in (2, 4, 8):  # the mask count, for every rank of a cp-rank ring
        for layout in ("contiguous", "zigzag"):
            ratios[cp, layout] = balance_ratio(causal_work_per_rank(64, cp, layout))
    assert ratios[2, "contiguous"] < ratios[4, "contiguous"] < ratios[8, "contiguous"]
    assert ratios[2, "contiguous"] > 1.5
    assert all(ratios[cp, "zigzag"] <= 1.05 for cp in (2, 4, 8))
    for cp in (2, 4):  # and measured on real rings: what each rank's kernel actually evaluated
        measured = {
            lay: [s.work("forward", "computed") for s in launch(_rank_work, cp, lay, True)]
            for lay in ("contiguous", "zigzag")
        }
        assert balance_ratio(measured["contiguous"]) > 1.5
        assert balance_ratio(measured["zigzag"]) <= 1.05
        print(cp, measured)


def test_ring_rejects_a_zigzag_shard_of_odd_length_and_mismatched_heads():
    group4 = AxisGroup("cp", (0, 1, 2, 3), 0, None)  # the checks run before any communication
    q = torch.zeros(1, 4, 3, 8)
    with pytest.raises(ValueError, match=r"2\*cp=8 chunks.*s_local=3 is odd \(s=12 is not divisible by 8\)"):
        ring_attention(q, q, q, group=group4, layout="zigzag")
    with pytest.raises(ValueError, match="n_kv_head=3 does not divide n_head=4"):
        ring_attention(q, q[:, :3], q[:, :3], group=group4, layout="contiguous")


def test_ring_attention_runs_without_launch_as_a_group_of_one():
    q, k, v, _ = _full("gqa")
    out = ring_attention(q, k, v, causal=True)
    torch.testing.assert_close(out, attention_core(q, k, v, causal=True), rtol=0, atol=1e-13)


def _rank_mesh(full, w):
    from pylib.cp import ulysses_attention
    from pylib.runtime import Mesh, ParallelConfig

    mesh = Mesh(ParallelConfig(tp=2, cp=2))  # cp groups are {0, 2} and {1, 3}: global ranks != cp ranks
    g = mesh.cp
    results = []
    for fn in (ring_attention, ulysses_attention):
        q, k, v = (shard_sequence(x, 2, g.rank, g.size, "zigzag").requires_grad_() for x in full)
        with trace() as tr:
            out = fn(q, k, v, group=g, causal=True)
            (out * shard_sequence(w, 2, g.rank, g.size, "zigzag")).sum().backward()
        results.append((out.detach(), q.grad, k.grad, v.grad))
        assert all(e.group == g.ranks and e.axis == "cp" for e in tr.events)
    return g.ranks, results


def test_ring_and_ulysses_run_over_a_cp_subgroup_of_a_mesh():
    q, k, v, w = _full("gqa")
    expected = _reference(q, k, v, w, True)
    per_rank = launch(_rank_mesh, 4, (q, k, v), w)
    for members in ([0, 2], [1, 3]):
        assert all(per_rank[m][0] == tuple(members) for m in members)
        for kind in range(2):
            for j in range(4):
                got = unshard_sequence([per_rank[m][1][kind][j] for m in members], 2, "zigzag")
                assert_float64_close(got, expected[j])


def _rank_dkv_reduce_scatter(full, w):
    from pylib.model import expand_kv
    from pylib.runtime import collectives as C

    r, n = dist.get_rank(), dist.get_world_size()
    q, k, v = full
    ql, kl, vl = (shard_sequence(x, 2, r, n, "contiguous").requires_grad_() for x in (q, k, v))
    with trace() as ring_tr:
        out = ring_attention(ql, kl, vl, causal=False, layout="contiguous")
        (out * shard_sequence(w, 2, r, n, "contiguous")).sum().backward()
    # The same gradient the textbook way: my rows' partial dK/dV for *every* block, then one reduce-scatter.
    scale = D**-0.5
    lse = torch.logsumexp(ql.detach() @ expand_kv(k, q.shape[1]).transpose(-1, -2) * scale, dim=-1)
    dout = shard_sequence(w, 2, r, n, "contiguous")
    kernel = TorchKernel()
    partial = torch.stack(
        [
            torch.stack(kernel.backward(dout, ql.detach(), kj, vj, out.detach(), lse, causal=False, scale=scale)[1:])
            for kj, vj in zip(k.chunk(n, 2), v.chunk(n, 2))
        ]
    )  # [cp, 2, b, n_kv_head, s/cp, d_head]
    with trace() as rs_tr:
        summed = C.reduce_scatter_tensor(partial, 0)[0]
    ring_dkv = sum(e.bytes_sent for e in ring_tr.events if e.op == "send" and ".dkv." in e.tag)
    return torch.stack([kl.grad, vl.grad]), summed, ring_dkv, rs_tr.events[0].bytes_sent


def test_ring_dkv_equals_a_reduce_scatter_of_every_ranks_partial_dkv_and_moves_one_block_more():
    from pylib.analysis.cp import dkv_reduce_scatter_bytes

    q, k, v, w = _full("gqa")
    for cp in (2, 4):
        block = ring_traffic(B, S, HEADS["gqa"][1], D, cp, 8)["kv_message_bytes"]
        for ring_grad, summed, ring_bytes, rs_bytes in launch(_rank_dkv_reduce_scatter, cp, (q, k, v), w):
            assert_float64_close(ring_grad, summed)
            assert rs_bytes == dkv_reduce_scatter_bytes(B, S, HEADS["gqa"][1], D, cp, 8) == (cp - 1) * block
            assert ring_bytes == cp * block == rs_bytes + block
