"""The CP formulas (pylib.analysis.cp) against independent counts, and the bf16-merge pitfall measured."""

import pytest
import torch

from pylib.analysis.cp import (
    attention_flops,
    balance_ratio,
    causal_work_per_rank,
    ring_traffic,
    ring_work_per_rank,
    ulysses_traffic,
)
from pylib.cp import ring_block_plan, sequence_positions, shard_sequence
from pylib.experiments.ring_merge_drift import merge_precision_drift


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("cp", [1, 2, 4, 8])
def test_causal_work_formula_counts_the_unmasked_entries_of_each_ranks_rows(layout, cp):
    s = 32
    for r, work in enumerate(causal_work_per_rank(s, cp, layout)):
        rows = sequence_positions(s, r, cp, layout)
        mask = torch.arange(s)[None, :] <= rows[:, None]  # each row's keys under the causal mask
        assert work == int(mask.sum())


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_work_formula_sums_the_block_schedule(layout, causal):
    s, cp = 32, 8
    n = s // cp
    for what in ("computed", "unmasked"):
        per_rank = [
            sum(
                getattr(p, what) for t in range(cp) if (p := ring_block_plan(t, r, cp, n, causal=causal, layout=layout))
            )
            for r in range(cp)
        ]
        assert per_rank == ring_work_per_rank(s, cp, layout, causal, what)
    if causal:
        assert ring_work_per_rank(s, cp, layout, True, "unmasked") == causal_work_per_rank(s, cp, layout)


def test_zigzag_balance_is_exact_and_contiguous_imbalance_approaches_2cp_minus_1():
    s = 1024
    for cp in (2, 4, 8, 16):
        n = s // cp
        assert balance_ratio(causal_work_per_rank(s, cp, "zigzag")) == 1.0
        # last rank / first rank = ((cp-1) n^2 + n(n+1)/2) / (n(n+1)/2) = 1 + 2(cp-1) n/(n+1) -> 2cp-1
        assert balance_ratio(causal_work_per_rank(s, cp, "contiguous")) == pytest.approx(1 + 2 * (cp - 1) * n / (n + 1))
    assert attention_flops(10, 64) == 2560


def test_traffic_formulas_at_a_real_size():
    # 128K tokens, 8 K/V heads of 128, bf16, cp=8: 16K tokens per rank, K and V = 2*8*16384*128*2 bytes = 64 MiB
    t = ring_traffic(1, 131072, 8, 128, 8, 2)
    assert t["kv_message_bytes"] == 64 * 2**20
    assert t["forward_bytes_sent"] == 7 * 64 * 2**20
    assert t["dkv_message_bytes"] == 128 * 2**20  # float32 accumulators
    u = ulysses_traffic(1, 131072, 64, 8, 128, 8, 2)
    assert u["local_bytes"]["q"] == 64 * 16384 * 128 * 2
    assert u["forward_bytes_sent"] == 7 * (2 * u["local_bytes"]["q"] + 2 * u["local_bytes"]["k"]) // 8
    assert ring_traffic(1, 64, 8, 128, 1, 2)["backward_bytes_sent"] == 0


def test_bf16_merge_error_grows_with_cp_while_float32_merge_stays_flat():
    rows = merge_precision_drift((1, 2, 4, 8))
    for row in rows:
        print(row)
    bf16 = [row["bf16_merge"] for row in rows]
    fp32 = [row["fp32_merge"] for row in rows]
    assert bf16[0] == fp32[0]  # one block: no merge at all
    assert bf16[0] < bf16[1] < bf16[2] < bf16[3]  # every extra block rounds the running out and lse again
    assert max(fp32[1:]) < 1.5 * min(fp32[1:])  # float32 accumulation: only the blocks' own bf16 rounding
    assert bf16[3] > 3 * fp32[3]


def test_ring_saves_q_k_v_out_and_lse_and_nothing_quadratic():
    import torch.distributed as dist

    from pylib.analysis.cp import ring_attention_saved_bytes
    from pylib.cp import ring_attention
    from pylib.model import saved_activations
    from pylib.runtime import launch

    b, s, h, h_kv, d = 2, 32, 4, 2, 8

    def rank(dtypes):
        r, n = dist.get_rank(), dist.get_world_size()
        result = []
        for dtype in dtypes:
            g = torch.Generator().manual_seed(0)
            q = torch.randn(b, h, s, d, generator=g).to(dtype)
            k, v = (torch.randn(b, h_kv, s, d, generator=g).to(dtype) for _ in range(2))
            q, k, v = (shard_sequence(x, 2, r, n, "zigzag").requires_grad_() for x in (q, k, v))
            with saved_activations() as saved:
                ring_attention(q, k, v, causal=True)
            result.append(saved.bytes)
        return result

    sizes = {torch.float64: 8, torch.bfloat16: 2}
    for cp in (1, 2, 4):
        for r, got in enumerate(launch(rank, cp, list(sizes))):
            want = [ring_attention_saved_bytes(b, s, h, h_kv, d, cp, size) for size in sizes.values()]
            assert got == want, (cp, r, got, want)
    assert ring_attention_saved_bytes(b, s, h, h_kv, d, 4, 2) * 4 == ring_attention_saved_bytes(b, s, h, h_kv, d, 1, 2)
