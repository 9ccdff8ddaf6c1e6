"""Permute / un-permute and the chunk regrouping are exact inverses, for any routing (property tests).

Routings are drawn at random with hypothesis: any number of tokens (zero included), experts that receive no token,
ranks whose every assignment is dropped (they send nothing). The last test runs the whole dispatch path of an
expert-parallel group in one process -- permute, the all-to-all as plain block shuffling, regroup by local
expert, experts, and everything in reverse -- and checks it against the direct per-token formula.
"""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pylib.ep.permute import permute, sort_chunks, unpermute
from tests.conftest import assert_float64_close


@st.composite
def routings(draw, n_experts=None, max_tokens=12):
    """(x [T, h], experts [T, k] distinct per token, keep [T, k], n_experts)."""
    n_experts = n_experts or draw(st.sampled_from([1, 2, 4, 8]))
    k = draw(st.integers(1, n_experts))
    T = draw(st.integers(0, max_tokens))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    # a skewed choice so that some experts get nothing: restrict the experts available to a random subset
    allowed = draw(st.integers(k, n_experts))
    pool = torch.randperm(n_experts, generator=g)[:allowed]
    experts = (
        torch.stack([pool[torch.randperm(allowed, generator=g)[:k]] for _ in range(T)])
        if T
        else (torch.zeros(0, k, dtype=torch.int64))
    )
    drop_all = draw(st.booleans()) and draw(st.booleans())  # ~1 in 4 draws: this "rank" sends nothing
    keep = torch.zeros(T, k, dtype=torch.bool) if drop_all else torch.rand(T, k, generator=g) < 0.8
    x = torch.randn(T, 3, generator=g, dtype=torch.float64)
    return x, experts, keep, n_experts


@settings(max_examples=40, deadline=None)
@given(routings())
def test_permute_groups_rows_by_expert_in_token_order(case):
    x, experts, keep, E = case
    rows, plan = permute(x, experts, E, keep)
    assert rows.shape[0] == int(keep.sum())
    assert torch.equal(plan.tokens_per_expert, torch.bincount(experts[keep], minlength=E))
    assert torch.equal(plan.expert_index, torch.sort(plan.expert_index).values)  # grouped by expert ...
    for e in range(E):
        toks = plan.token_index[plan.expert_index == e]
        assert torch.equal(toks, torch.sort(toks).values)  # ... token order inside an expert
    assert torch.equal(rows, x[plan.token_index])
    assert torch.equal(experts[plan.token_index, plan.slot_index], plan.expert_index)


@settings(max_examples=40, deadline=None)
@given(routings())
def test_unpermute_of_permute_is_the_weighted_sum_of_kept_copies(case):
    x, experts, keep, E = case
    T, k = experts.shape
    g = torch.Generator().manual_seed(T)
    w = torch.rand(T, k, generator=g, dtype=torch.float64)
    rows, plan = permute(x, experts, E, keep)
    out = unpermute(rows, plan, w)
    expected = ((w * keep).sum(1, keepdim=True)) * x
    assert_float64_close(out, expected)
    # with weights that share each token among its kept copies, un-permute inverts permute exactly
    share = keep.double() / keep.sum(1, keepdim=True).clamp(min=1)
    kept_any = keep.any(1, keepdim=True)
    assert_float64_close(unpermute(rows, plan, share), x * kept_any)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_sort_chunks_with_the_transposed_counts_is_its_inverse(a, b, seed):
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 3, (a, b), generator=g)  # zeros: empty blocks
    rows = torch.arange(int(counts.sum()), dtype=torch.float64).unsqueeze(1)
    moved = sort_chunks(rows, counts)
    assert torch.equal(sort_chunks(moved, counts.T), rows)
    # block (a_i, b_j) really moved to position (b_j, a_i)
    blocks = rows.split(counts.reshape(-1).tolist())
    expected = torch.cat([blocks[i * b + j] for j in range(b) for i in range(a)])
    assert torch.equal(moved, expected)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.data())
def test_simulated_expert_parallel_round_trip_equals_the_direct_formula(ep, data):
    """ep ranks, each with its own random routing; the all-to-all is simulated by moving blocks."""
    E = data.draw(st.sampled_from([n for n in (2, 4, 8) if n % ep == 0]))
    n_local = E // ep
    cases = []
    for _ in range(ep):
        x, experts, keep, _ = data.draw(routings(n_experts=E))
        cases.append((x, experts, keep))
    scale = torch.arange(1, E + 1, dtype=torch.float64)  # "expert e" multiplies its rows by e + 1

    # sender side: permute, and per-destination row counts
    sent, plans, counts = [], [], []
    for x, experts, keep in cases:
        rows, plan = permute(x, experts, E, keep)
        sent.append(rows.split(plan.rows_per_rank(ep).tolist()))
        plans.append(plan)
        counts.append(plan.tokens_per_expert.view(ep, n_local))
    # receiver side: rows from every source, regrouped by local expert, through the experts, and back
    returned = [[None] * ep for _ in range(ep)]
    for d in range(ep):
        recv_counts = torch.stack([counts[s][d] for s in range(ep)])  # [source, local expert]
        grouped = sort_chunks(torch.cat([sent[s][d] for s in range(ep)]), recv_counts)
        owner = torch.repeat_interleave(torch.arange(n_local), recv_counts.sum(0)) + d * n_local
        y = grouped * scale[owner].unsqueeze(1)
        back = sort_chunks(y, recv_counts.T).split(recv_counts.sum(1).tolist())
        for s in range(ep):
            returned[s][d] = back[s]
    for s, (x, experts, keep) in enumerate(cases):
        T, k = experts.shape
        w = torch.rand(T, k, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
        out = unpermute(torch.cat(returned[s]), plans[s], w)
        expected = ((w * keep) * scale[experts]).sum(1, keepdim=True) * x
        assert_float64_close(out, expected)
