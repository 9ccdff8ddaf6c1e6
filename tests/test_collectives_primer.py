"""The collectives primer's runs (pylib.experiments.collective_runs, book/part0/collectives.md): the inputs, the ring
all-reduce built from sends (its result, its steps, its traced bytes), the byte table against the formulas and the
adjoint test of every autograd collective. Fast ones on 2-4 gloo ranks; the 8-rank sweep is marked slow."""

import pytest
import torch
import torch.distributed as dist

from pylib.experiments import collective_runs as R
from pylib.runtime import collectives as C
from pylib.runtime import launch, trace

# ------------------------------------------------------------------------------------------------ pure


def test_block_values_name_rank_and_block():
    assert R.block_values(2, 4).tolist() == [20.0, 21.0, 22.0, 23.0]
    with pytest.raises(ValueError, match="more than 10"):
        R.block_values(0, 11)


def test_contributors_read_the_digits_of_a_sum_of_powers_of_ten():
    total = sum(R.power_of_ten(r, 3) for r in (0, 2, 3))
    assert total.tolist() == [1101.0] * 3
    assert R.contributors(1101.0) == (0, 2, 3)
    assert R.contributors(1.0) == (0,)
    with pytest.raises(ValueError, match="powers of ten"):
        R.contributors(2.0)


def test_ring_phase_names_the_steps():
    assert [R.ring_phase(s, 4) for s in range(7)] == ["input"] + ["reduce-scatter"] * 3 + ["all-gather"] * 3


def test_formula_bytes_all_reduce_is_reduce_scatter_plus_all_gather():
    for n in (2, 3, 4, 8):
        s = 8 * 840
        assert R.formula_bytes("all_reduce", s, n) == 2 * (n - 1) * s // n
        assert R.formula_bytes("all_reduce", s, n) == (
            R.formula_bytes("reduce_scatter", s, n) + R.formula_bytes("all_gather", s, n)
        )


def test_collective_bytes_rows_raise_on_a_count_that_is_not_the_formula():
    good = {4: {op: (800, R.formula_bytes(op, 800, 4), R.formula_bytes(op, 800, 4)) for op in R.FORMULAS}}
    rows = R.collective_bytes_rows(good)
    assert [r[0] for r in rows] == ["all-reduce", "reduce-scatter", "all-gather", "all-to-all"]
    assert rows[0][2] == "1,200"
    bad = {4: dict(good[4], all_gather=(800, 600, 599))}
    with pytest.raises(AssertionError, match="all_gather on 4 ranks"):
        R.collective_bytes_rows(bad)


def test_conjugate_rows_raise_on_a_failed_adjoint_test():
    rows = R.conjugate_rows({"all_gather": ([("forward", "all_gather"), ("backward", "reduce_scatter")], (2.0, 2.0))})
    assert rows == [["all_gather", "all-gather", "reduce-scatter", "1.000000"]]
    assert R.conjugate_rows({"copy": ([("backward", "all_reduce")], (1.0, 1.0))})[0][1] == "—"
    with pytest.raises(AssertionError, match="not the transpose"):
        R.conjugate_rows({"wrong g": ([("forward", "all_reduce"), ("backward", "all_reduce")], (1.0, 4.0))})


def test_ring_step_table_marks_the_chunk_received():
    held = [[[(0,), (0,)], [(1,), (1,)]], [[(0, 1), (0,)], [(1,), (0, 1)]]]
    rows = R.ring_step_table(held)
    assert rows[0] == ["0", "input", "0 0", "1 1"]
    assert rows[1] == ["1", "reduce-scatter", "*01 0", "1 *01"]


# ------------------------------------------------------------------------------------------------ on ranks


def _ring_rank(numel):
    r = dist.get_rank()
    steps = []
    with trace() as tr:
        R.ring_all_reduce(R.power_of_ten(r, numel), steps=steps)
    x = R.random_on_rank(7, (numel,))
    err = (R.ring_all_reduce(x) - C.all_reduce_(x.clone())).abs().max().item()
    return dict(
        steps=steps,
        err=err,
        sends=tr.count(op="send"),
        sent=tr.total("bytes_sent"),
        recv=tr.total("bytes_recv"),
        sizes={e.payload_bytes for e in tr.events},
    )


def _check_ring(n, numel):
    out = launch(_ring_rank, n, numel)
    psi = numel * 8
    held = R.ring_contributors([o["steps"] for o in out])
    assert len(held) == 2 * (n - 1) + 1
    everyone = tuple(range(n))
    for r, o in enumerate(out):
        assert held[0][r] == [(r,)] * n  # the input: every chunk holds only the rank's own contribution
        assert held[n - 1][r][r] == everyone  # after the reduce-scatter: chunk r is complete on rank r
        assert all(held[2 * n - 2][r][c] == everyone for c in range(n))
        assert o["err"] < 1e-12
        assert o["sends"] == 2 * (n - 1)
        assert o["sent"] == o["recv"] == 2 * (n - 1) * psi // n == R.formula_bytes("all_reduce", psi, n)
        assert o["sizes"] == {psi // n}  # every message is one chunk


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_all_reduce_sums_in_2_n_minus_1_steps_of_one_chunk(n):
    _check_ring(n, 4 * n)


@pytest.mark.slow
def test_ring_all_reduce_on_8_ranks():
    _check_ring(8, 1024)


def test_ring_all_reduce_refuses_a_buffer_that_does_not_split():
    def rank():
        with pytest.raises(ValueError, match="divides by 2"):
            R.ring_all_reduce(torch.zeros(3, dtype=torch.float64))
        return True

    assert launch(rank, 2) == [True, True]


def _adjoint_rank(wrong):
    n = dist.get_world_size()

    class WrongG(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return C.all_reduce_(x.clone())

        @staticmethod
        def backward(ctx, dy):
            return C.all_reduce_(dy.clone())

    ops = {
        "copy_to_group": (C.copy_to_group, True, False),
        "reduce_from_group": (C.reduce_from_group, False, True),
        "split_to_group": (lambda t: C.split_to_group(t, 0), True, False),
        "gather_from_group": (lambda t: C.gather_from_group(t, 0), False, True),
        "all_gather": (lambda t: C.all_gather(t, 0), False, False),
        "reduce_scatter": (lambda t: C.reduce_scatter(t, 0), False, False),
        "all_to_all": (lambda t: C.all_to_all(t, 0, 1), False, False),
    }
    if wrong:
        ops = {"wrong g": (WrongG.apply, False, True)}
    out = {}
    for i, (name, (op, x_same, y_same)) in enumerate(ops.items()):
        x = R.random_on_rank(i, (2 * n, 2 * n), same=x_same).requires_grad_()
        with trace() as tr:
            y = op(x)
            dy = R.random_on_rank(100 + i, y.shape, same=y_same)
            (dx,) = torch.autograd.grad(y, x, dy)
        sides = torch.stack([(y * dy).sum() / (n if y_same else 1), (x * dx).sum() / (n if x_same else 1)])
        out[name] = ([(e.phase, e.op) for e in tr.events], C.all_reduce_(sides.detach()).tolist())
    return out


def test_every_autograd_collective_passes_the_adjoint_test_on_4_ranks():
    out = launch(_adjoint_rank, 4, False)
    rows = {r[0]: r[1:3] for r in R.conjugate_rows(out[0])}
    assert rows == {
        "copy_to_group": ["—", "all-reduce"],
        "reduce_from_group": ["all-reduce", "—"],
        "split_to_group": ["—", "all-gather"],
        "gather_from_group": ["all-gather", "—"],
        "all_gather": ["all-gather", "reduce-scatter"],
        "reduce_scatter": ["reduce-scatter", "all-gather"],
        "all_to_all": ["all-to-all", "all-to-all"],
    }
    assert all(o == out[0] for o in out)


def test_a_wrong_conjugate_fails_the_adjoint_test_by_the_group_size():
    ((events, (y_dy, x_dx)),) = launch(_adjoint_rank, 4, True)[0].values()
    assert abs(x_dx / y_dy - 4) < 1e-9
    with pytest.raises(AssertionError, match="not the transpose"):
        R.conjugate_rows({"wrong g": (events, (y_dy, x_dx))})
