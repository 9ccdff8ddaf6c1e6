"""Before each collective the ranks check that they make the same call; disagreement is a ValueError naming every
rank's value (issue 18), instead of garbage (float32 summed with int32) or a rank aborted by gloo."""

import pytest
import torch
import torch.distributed as dist

from pylib.runtime import agreement_check, launch
from pylib.runtime import collectives as C
from pylib.runtime.agreement import is_checking
from tests.conftest import value_error_message as _message


def _misuses():
    """Each misuse on 2 ranks; every rank raises the same error, so they stay in step for the next one."""
    r = dist.get_rank()
    out = {"default on under gloo": is_checking()}
    out["dtype"] = _message(lambda: C.all_reduce_(torch.ones(3, dtype=torch.float32 if r == 0 else torch.int32)))
    out["shape"] = _message(lambda: C.all_gather_tensor(torch.ones(3 if r == 0 else 5)))
    out["op"] = _message(lambda: C.all_reduce_(torch.ones(2)) if r == 0 else C.all_gather_tensor(torch.ones(2)))
    out["reduce op"] = _message(lambda: C.all_reduce_(torch.ones(2), op="sum" if r == 0 else "max"))
    out["dim"] = _message(lambda: C.all_gather_tensor(torch.ones(2, 2), dim=r))
    splits = ([1, 1], [1, 3]) if r == 0 else ([1, 1], [1, 1])  # rank 0 expects 3 rows from rank 1, which sends 1
    out["splits"] = _message(lambda: C.all_to_all_rows(torch.ones(2, 4), splits[1], splits[0]))
    out["sizes"] = _message(lambda: C.all_gather_rows(torch.ones(1 + r, 4), [1, 1 + r]))  # each consistent alone
    out["still in step"] = float(C.all_reduce_(torch.ones(1))[0])
    with agreement_check(False):
        out["switched off"] = is_checking()
    out["back on"] = is_checking()
    out["min"] = float(C.all_reduce_(torch.tensor([float(r) + 1]), op="min")[0])
    out["int avg"] = _message(lambda: C.all_reduce_(torch.ones(2, dtype=torch.int64), op="avg"))
    out["unknown op"] = _message(lambda: C.all_reduce_(torch.ones(2), op="prod"))
    out["async int avg"] = _message(lambda: C.all_reduce_async(torch.ones(2, dtype=torch.int64), op="avg"))
    out.update(_full_exchanges(r))
    from pylib.runtime import agreement

    agreement._setting.full_exchange = True  # the design before step 1 (bench/peers.py's "full"): the same errors
    out["dtype, full exchange"] = _message(
        lambda: C.all_reduce_(torch.ones(3, dtype=torch.float32 if r else torch.int32))
    )
    out["agreeing, full exchange"] = float(C.all_reduce_(torch.ones(1))[0])
    agreement._setting.full_exchange = False
    return out


def _full_exchanges(r):
    """How often the ranks fall back to the whole descriptor (step 2): never while they agree, once on a mismatch;
    and a step-1 difference the descriptors do not show (a rank's hash forced to differ) still stops the data."""
    from pylib.runtime import agreement

    encode, count = agreement._encode, [0]

    def counted(*args, **kwargs):
        count[0] += 1
        return encode(*args, **kwargs)

    agreement._encode = counted
    C.all_reduce_(torch.ones(2))
    C.all_gather_tensor(torch.ones(2, 3), dim=-1)
    splits = [1, 2] if r == 0 else [2, 1]  # rank 0 keeps 1 row and sends 2 to rank 1, which sends it 2 back
    C.all_to_all_rows(torch.ones(3, 4), splits, splits)
    C.all_gather_rows(torch.ones(1 + r, 4), [1, 2])
    C.all_reduce_async(torch.ones(2)).wait()
    out = {"full exchanges while agreeing": count[0]}
    _message(lambda: C.all_reduce_(torch.ones(2 + r)))
    out["full exchanges on one mismatch"] = count[0] - out["full exchanges while agreeing"]
    call_hash = agreement.call_hash
    agreement.call_hash = lambda *a: call_hash(*a) ^ r  # rank 1's hash differs, its descriptor does not
    out["hash differs, descriptors equal"] = _message(lambda: C.all_reduce_(torch.ones(2)))
    agreement.call_hash, agreement._encode = call_hash, encode
    out["pipeline gathers while agreeing"] = _pipeline_gathers(lambda mb, k: (1, 4))
    return out


def _pipeline_gathers(shape_of, p=2):
    """How many all-gathers agree_pipeline makes (besides its one small all-reduce) for a 1F1B step, m = 2."""
    from pylib.plan.schedules import build
    from pylib.runtime import agreement
    from pylib.runtime.collectives import resolve_group

    gather, count = agreement._gather_rows, [0]

    def counted(*args):
        count[0] += 1
        return gather(*args)

    agreement._gather_rows = counted
    try:
        agreement.agree_pipeline(resolve_group(None), build("1f1b", p, 2), torch.float32, shape_of)
    finally:
        agreement._gather_rows = gather
    return count[0]


def _unrelated_views():
    """3 stages: rank 0 holds another shape for the boundary into stage 2, which only ranks 1 and 2 cross."""
    r = dist.get_rank()
    return _pipeline_gathers(lambda mb, k: (1, 5) if r == 0 and k == 2 else (1, 4), p=3)


@pytest.mark.slow
def test_pipeline_ranks_whose_views_differ_only_where_neither_sends_pay_the_gathers_and_go_on():
    assert launch(_unrelated_views, 3, timeout=60) == [2, 2, 2]


@pytest.fixture(scope="module")
def misuses():
    return launch(_misuses, 2, timeout=60)


def test_ranks_that_disagree_on_dtype_shape_op_or_row_counts_get_one_error_naming_each_rank(misuses):
    out = misuses[0]
    same = {k: v for k, v in out.items() if k != "op"}  # "op": each rank names the op it called first
    assert same == {k: v for k, v in misuses[1].items() if k != "op"}  # every rank raised the same error
    assert out["default on under gloo"] is True
    assert "disagree on the dtype: rank 0 float32, rank 1 int32" in out["dtype"]
    assert "all_gather_tensor over [0, 1]: the ranks disagree on the shape: rank 0 (3,), rank 1 (5,)" == out["shape"]
    assert "disagree on which collective to call" in out["op"] and "rank 0 all_reduce, rank 1 all_gather" in out["op"]
    assert "reduce op: rank 0 'sum', rank 1 'max'" in out["reduce op"]
    assert "disagree on dim: rank 0 0, rank 1 1" in out["dim"]
    assert "rank 0 expects 3 rows from rank 1 (its output_splits[1]), but rank 1 sends it 1" in out["splits"]
    assert "the row counts `sizes`: rank 0 [1, 1], rank 1 [1, 2]" in out["sizes"]
    assert out["still in step"] == 2.0


def test_ranks_that_agree_pay_one_small_all_reduce_and_only_a_mismatch_exchanges_whole_descriptors(misuses):
    for out in misuses:
        assert out["full exchanges while agreeing"] == 0
        assert out["full exchanges on one mismatch"] == 1
        assert "all_reduce_ over [0, 1]: the ranks' calls differ" in out["hash differs, descriptors equal"]
        assert "disagree on the dtype: rank 0 int32, rank 1 float32" in out["dtype, full exchange"]
        assert out["agreeing, full exchange"] == 2.0
        assert out["pipeline gathers while agreeing"] == 0


def test_step_one_hashes_every_field_of_the_call_and_sees_any_rank_that_differs():
    from pylib.runtime.agreement import all_equal, call_hash, hash_row

    def h(op="all_reduce", t=None, params=(0,), dims=0, rows_only=False, sizes=None):
        return call_hash(op, [torch.ones(2, 3) if t is None else t], list(params), dims, rows_only, sizes)

    base = h()
    changed = {
        "op": h(op="all_gather"),
        "dtype": h(t=torch.ones(2, 3, dtype=torch.float64)),
        "shape": h(t=torch.ones(3, 2)),
        "dims": h(t=torch.ones(2, 3, 1)),
        "param": h(params=(1,)),
        "sizes": h(sizes=[1, 2, 1, 1]),
    }
    assert all(other != base for other in changed.values()), changed
    assert 0 <= base < 2**63
    assert h(params=(-1,), dims=1) == h(params=(1,), dims=1)  # dim -1 and ndim - 1 are one call
    assert h(t=torch.ones(5, 3), rows_only=True) == h(rows_only=True)  # uneven rows: dim 0 may differ
    assert h(params=(2,), dims=1) is None  # this rank's dim is out of range

    def verdict(*hashes):
        return all_equal([max(col) for col in zip(*(hash_row(x) for x in hashes))])

    assert verdict(base, base, base, base)
    assert not verdict(base, base, base + 1, base)  # one rank differs: max(h) > min(h)
    assert not verdict(base, base - 1, base + 1, base)  # equal sum, unequal hashes
    assert not verdict(base, None, base, base) and not verdict(None, None)  # out of range anywhere: never equal


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_the_split_residual_is_zero_exactly_when_every_rank_expects_the_rows_its_peers_send(n):
    from pylib.runtime.agreement import _PRIMES, split_residuals

    gen = torch.Generator().manual_seed(n)
    sends = torch.randint(0, 50, (n, n), generator=gen).tolist()  # sends[i][j]: rows rank i sends rank j

    def verdict(expects):
        sums = [sum(col) for col in zip(*(split_residuals(n, i, sends[i], expects[i]) for i in range(n)))]
        return all(r % prime == 0 for r, prime in zip(sums, _PRIMES))

    consistent = [[sends[j][i] for j in range(n)] for i in range(n)]  # rank i expects from j what j sends i
    assert verdict(consistent)
    for i in range(n):
        for j in range(n):
            wrong = [list(r) for r in consistent]
            wrong[i][j] += 1
            assert not verdict(wrong), (i, j)
    swapped = [list(reversed(r)) for r in consistent]
    assert verdict(swapped) == (swapped == consistent)


def test_the_agreement_check_can_be_switched_off_and_back(misuses):
    assert misuses[0]["switched off"] is False and misuses[0]["back on"] is True
    with pytest.raises(TypeError, match="True, False or None"):
        agreement_check("off")


def test_all_reduce_takes_min_and_refuses_integer_averages_and_unknown_ops(misuses):
    out = misuses[0]
    assert out["min"] == 1.0
    assert "op='avg' of a int64 tensor" in out["int avg"] and "op='sum'" in out["int avg"]
    assert "op='prod' must be one of ['sum', 'avg', 'max', 'min']" in out["unknown op"]
    assert "all_reduce_async: op='avg'" in out["async int avg"]


def _cp_misuses():
    from pylib.cp import ring_attention, ulysses_attention

    r = dist.get_rank()
    s_local = 4 if r == 0 else 6
    q = torch.randn(1, 2, s_local, 8, dtype=torch.float64)
    out = {
        "ring shape": _message(lambda: ring_attention(q, q, q, layout="contiguous")),
        "ulysses shape": _message(lambda: ulysses_attention(q, q, q, layout="contiguous")),
    }
    q32 = torch.randn(1, 2, 4, 8)
    kv = torch.randn(1, 2, 4, 8, dtype=torch.float64)
    out["ring dtype"] = _message(lambda: ring_attention(q32, kv, kv, layout="contiguous"))
    out["ulysses dtype"] = _message(lambda: ulysses_attention(q32, kv, kv, layout="contiguous"))
    return out


def test_cp_attention_refuses_mismatched_shapes_across_ranks_and_mixed_dtypes():
    out = launch(_cp_misuses, 2, timeout=60)[0]
    assert (
        "ring_attention over [0, 1]: the ranks disagree on the shape of tensor 0: rank 0 (1, 2, 4, 8)"
        in out["ring shape"]
    )
    assert "the ranks disagree on the shape" in out["ulysses shape"]
    for key in ("ring dtype", "ulysses dtype"):
        assert "q, k, v must share one dtype; got torch.float32, torch.float64, torch.float64" in out[key]


def test_expert_capacity_follows_megatrons_order_of_operations():
    from pylib.plan.config import MoEConfig, expert_capacity

    # Megatron-Core: ceil((T * k / E) * cf) = ceil(20 * 1.1) = 22; ceil(1.1 * 100 / 5) would give 23
    assert expert_capacity(100, MoEConfig(n_experts=5, top_k=1, capacity_factor=1.1)) == 22
    assert expert_capacity(64, MoEConfig(n_experts=8, top_k=2, capacity_factor=1.0)) == 16


@pytest.mark.parametrize("field, value", [("n_experts", 4.5), ("top_k", 1.0), ("every", True), ("n_experts", "8")])
def test_moe_config_refuses_counts_that_are_not_integers(field, value):
    from pylib.plan.config import MoEConfig

    with pytest.raises(TypeError, match=f"{field}={value!r} must be an integer"):
        MoEConfig(**{field: value})
