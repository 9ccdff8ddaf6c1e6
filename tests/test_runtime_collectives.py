"""Each traced collective's backward is its conjugate, and the tracer's byte counts follow the formulas.

Gradient checks compare against one process that holds every rank's tensors. Each op has a contract about what is
replicated: `copy_to_group` and `split_to_group` take an input that is the *same* tensor on every rank (one
parameter of the single-device model), `reduce_from_group` and `gather_from_group` feed a consumer that is the
same on every rank (its loss counted once). Elsewhere inputs and consumers differ per rank. With rank r's
consumer L_r = <op(x)_r, w_r> and L = sum_r L_r (or L = L_0 for a replicated consumer), the gradient each rank
gets must equal the single-process dL/dx_r.
"""

import pytest
import torch
import torch.distributed as dist

from pylib.runtime import collectives as C
from pylib.runtime import launch, trace
from tests.conftest import assert_float64_close

N = 4


REPLICATED_INPUT = {"copy_to_group", "split_to_group"}
REPLICATED_CONSUMER = {"reduce_from_group", "gather_from_group"}


def _inputs(rank, name, shape=(4, 6)):
    g = torch.Generator().manual_seed(0 if name in REPLICATED_INPUT else rank)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def _weights(rank, name, shape):
    g = torch.Generator().manual_seed(100 + (0 if name in REPLICATED_CONSUMER else rank))
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def _run_op(name):
    rank = dist.get_rank()
    x = _inputs(rank, name).requires_grad_()
    with trace() as tr:
        if name == "copy_to_group":
            y = C.copy_to_group(x)
        elif name == "reduce_from_group":
            y = C.reduce_from_group(x)
        elif name == "split_to_group":
            y = C.split_to_group(x, 0)
        elif name == "gather_from_group":
            y = C.gather_from_group(x, 1)
        elif name == "all_gather":
            y = C.all_gather(x, 1)
        elif name == "reduce_scatter":
            y = C.reduce_scatter(x, 0)
        elif name == "all_to_all":
            y = C.all_to_all(x, 0, 1)
        (y * _weights(rank, name, y.shape)).sum().backward()
    return y.detach(), x.grad, [e.as_dict() for e in tr.events]


def _reference(name):
    """The same ops on one process holding all N ranks' inputs; returns per-rank outputs and grads."""
    if name in REPLICATED_INPUT:
        shared = _inputs(0, name).requires_grad_()
        xs = [shared] * N
    else:
        xs = [_inputs(r, name).requires_grad_() for r in range(N)]
    if name == "copy_to_group":
        ys = list(xs)
    elif name == "reduce_from_group":
        s = sum(xs)
        ys = [s] * N
    elif name == "split_to_group":
        ys = [x.chunk(N, 0)[r] for r, x in enumerate(xs)]
    elif name in ("gather_from_group", "all_gather"):
        cat = torch.cat(xs, 1)
        ys = [cat] * N
    elif name == "reduce_scatter":
        ys = list(sum(xs).chunk(N, 0))
    elif name == "all_to_all":
        ys = [torch.cat([xs[src].chunk(N, 0)[r] for src in range(N)], 1) for r in range(N)]
    if name in REPLICATED_CONSUMER:
        loss = (ys[0] * _weights(0, name, ys[0].shape)).sum()
    else:
        loss = sum((y * _weights(r, name, y.shape)).sum() for r, y in enumerate(ys))
    loss.backward()
    return [y.detach() for y in ys], [x.grad for x in xs]


@pytest.mark.parametrize(
    "name",
    [
        "copy_to_group",
        "reduce_from_group",
        "split_to_group",
        "gather_from_group",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
    ],
)
def test_backward_is_the_conjugate_collective(name):
    results = launch(_run_op, N, name)
    ys, grads = _reference(name)
    for r, (y, g, _) in enumerate(results):
        assert_float64_close(y, ys[r])
        assert_float64_close(g, grads[r])


BYTES = 4 * 6 * 8  # one rank's float64 [4, 6] input


@pytest.mark.parametrize(
    "name, fwd, bwd",
    [
        # (op, payload, sent) per phase; n = 4
        ("copy_to_group", [], [("all_reduce", BYTES, 2 * 3 * BYTES // 4)]),
        ("reduce_from_group", [("all_reduce", BYTES, 2 * 3 * BYTES // 4)], []),
        ("split_to_group", [], [("all_gather", BYTES, 3 * BYTES // 4)]),
        ("all_gather", [("all_gather", 4 * BYTES, 3 * BYTES)], [("reduce_scatter", 4 * BYTES, 3 * BYTES)]),
        ("reduce_scatter", [("reduce_scatter", BYTES, 3 * BYTES // 4)], [("all_gather", BYTES, 3 * BYTES // 4)]),
        ("all_to_all", [("all_to_all", BYTES, 3 * BYTES // 4)], [("all_to_all", BYTES, 3 * BYTES // 4)]),
    ],
)
def test_tracer_records_op_phase_and_bytes_by_formula(name, fwd, bwd):
    for _, _, events in launch(_run_op, N, name):
        got = {
            ph: [(e["op"], e["payload_bytes"], e["bytes_sent"]) for e in events if e["phase"] == ph]
            for ph in ("forward", "backward")
        }
        assert got == {"forward": fwd, "backward": bwd}
        assert all(e["group"] == (0, 1, 2, 3) and e["axis"] == "world" for e in events)


def _uneven_all_to_all():
    rank = dist.get_rank()
    # rank r sends (r + j) % 3 rows to rank j; rows carry their (source, destination) so arrival is checkable
    send_counts = [(rank + j) % 3 for j in range(N)]
    recv_counts = [(src + rank) % 3 for src in range(N)]
    rows = torch.cat(
        [
            torch.tensor([[rank, j, float(i)]] * c, dtype=torch.float64).reshape(c, 3)
            for j, c in enumerate(send_counts)
            for i in [0]
        ]
    ).requires_grad_()
    with trace() as tr:
        out = C.all_to_all_uneven(rows, recv_counts, send_counts)
        (out * (rank + 1)).sum().backward()
    return out.detach(), rows.grad, send_counts, recv_counts, [e.as_dict() for e in tr.events]


def test_uneven_all_to_all_delivers_rows_and_sends_gradients_back_along_the_same_routes():
    results = launch(_uneven_all_to_all, N)
    for rank, (out, grad, send, recv, events) in enumerate(results):
        expected = [[src, rank] for src in range(N) for _ in range(recv[src])]
        assert out[:, :2].tolist() == expected
        # each row's gradient is (destination rank + 1)
        dest = [j for j, c in enumerate(send) for _ in range(c)]
        assert grad[:, 0].tolist() == [float(d + 1) for d in dest]
        fwd = [e for e in events if e["phase"] == "forward"][0]
        assert fwd["bytes_sent"] == 3 * 8 * (sum(send) - send[rank])
        assert fwd["bytes_recv"] == 3 * 8 * (sum(recv) - recv[rank])


def _ring_exchange():
    rank, n = dist.get_rank(), dist.get_world_size()
    mine = torch.full((3,), float(rank))
    got = torch.empty(3)
    with trace() as tr:
        works = C.batch_isend_irecv([("send", mine, (rank + 1) % n), ("recv", got, (rank - 1) % n)])
        for w in works:
            w.wait()
    return got, [e.as_dict() for e in tr.events]


def test_ring_point_to_point_is_traced_with_peers_and_exact_bytes():
    for rank, (got, events) in enumerate(launch(_ring_exchange, N)):
        assert got.tolist() == [float((rank - 1) % N)] * 3
        assert [(e["op"], e["peer"], e["bytes_sent"], e["bytes_recv"]) for e in events] == [
            ("send", (rank + 1) % N, 12, 0),
            ("recv", (rank - 1) % N, 0, 12),
        ]


def _tags_and_phases():
    from pylib.runtime import phase, tag

    x = torch.ones(4, dtype=torch.float64, requires_grad=True)
    with trace() as tr:
        with tag("layers.0"), tag("mlp"):
            y = C.copy_to_group(x)
        y.sum().backward()  # the backward all-reduce keeps the forward's tag
        with phase("optimizer"):
            C.all_reduce_(x.grad)
    return [(e.op, e.phase, e.tag) for e in tr.events], tr.count(tag="layers.0")


def test_tags_follow_ops_into_backward_and_phases_can_be_named():
    events, under_layer = launch(_tags_and_phases, 2)[0]
    assert events == [("all_reduce", "backward", "layers.0.mlp"), ("all_reduce", "optimizer", "")]
    assert under_layer == 1


def test_groups_of_one_rank_are_the_identity_and_record_nothing():
    def fn():
        from pylib.runtime import Mesh, ParallelConfig

        mesh = Mesh(ParallelConfig(tp=1, dp=2))
        x = torch.ones(2, requires_grad=True)
        with trace() as tr:
            y = C.all_gather(C.copy_to_group(x, mesh.tp), 0, mesh.tp)
            y.sum().backward()
        return len(tr.events), y.shape[0]

    assert launch(fn, 2) == [(0, 2), (0, 2)]


def test_indivisible_sizes_are_refused_with_the_numbers():
    def fn():
        C.reduce_scatter(torch.ones(3, 2), 0)

    with pytest.raises(Exception, match="size 3 is not divisible by the group size 2"):
        launch(fn, 2)


UNEVEN_ROWS = [2, 0, 3, 1]  # rows held by each of the 4 members (one holds none)


def _uneven_gather_and_scatter():
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(UNEVEN_ROWS[rank], 3, generator=g, dtype=torch.float64).requires_grad_()
    z = torch.randn(sum(UNEVEN_ROWS), 3, generator=g, dtype=torch.float64).requires_grad_()
    w_y = torch.randn(sum(UNEVEN_ROWS), 3, generator=g, dtype=torch.float64)
    w_s = torch.randn(UNEVEN_ROWS[rank], 3, generator=g, dtype=torch.float64)
    with trace() as tr:
        y = C.all_gather_uneven(x, UNEVEN_ROWS)
        s = C.reduce_scatter_uneven(z, UNEVEN_ROWS)
        ((y * w_y).sum() + (s * w_s).sum()).backward()
    return x.detach(), z.detach(), w_y, w_s, y.detach(), s.detach(), x.grad, z.grad, [e.as_dict() for e in tr.events]


def test_uneven_all_gather_and_reduce_scatter_are_conjugate_with_ring_byte_counts():
    results = launch(_uneven_gather_and_scatter, N)
    xs = [r[0].clone().requires_grad_() for r in results]
    zs = [r[1].clone().requires_grad_() for r in results]
    gathered = torch.cat(xs)
    scattered = sum(zs).split(UNEVEN_ROWS)
    loss = sum((gathered * r[2]).sum() + (scattered[k] * r[3]).sum() for k, r in enumerate(results))
    loss.backward()
    row = 3 * 8
    total = row * sum(UNEVEN_ROWS)
    for k, (_, _, _, _, y, s, gx, gz, events) in enumerate(results):
        torch.testing.assert_close(y, gathered.detach(), rtol=0, atol=0)
        assert_float64_close(s, scattered[k].detach())
        assert_float64_close(gx, xs[k].grad)
        assert_float64_close(gz, zs[k].grad)
        got = [(e["op"], e["phase"], e["payload_bytes"], e["bytes_sent"], e["bytes_recv"]) for e in events]
        ag = ("all_gather", total, total - row * UNEVEN_ROWS[(k + 1) % N], total - row * UNEVEN_ROWS[k])
        rs = ("reduce_scatter", total, total - row * UNEVEN_ROWS[k], total - row * UNEVEN_ROWS[(k - 1) % N])
        assert (
            got
            == [
                (ag[0], "forward", *ag[1:]),
                (rs[0], "forward", *rs[1:]),
                (ag[0], "backward", *ag[1:]),  # the reduce-scatter's conjugate, backward runs in reverse order
                (rs[0], "backward", *rs[1:]),
            ]
        )


def _async_collectives():
    from pylib.runtime import tag

    rank = dist.get_rank()
    a = torch.arange(8, dtype=torch.float64) + 10 * rank
    b, c = a.clone(), a.clone()
    with trace() as tr, tag("bucket"):
        w_sum = C.all_reduce_async(a, phase="backward")
        w_avg = C.all_reduce_async(b, op="avg", phase="backward")
        w_rs = C.reduce_scatter_async(c, phase="backward", tag="rs")
        busy = torch.randn(64, 64, dtype=torch.float64)  # this rank computes while the three are in flight
        for _ in range(8):
            busy = torch.tanh(busy @ busy)
        got = (w_sum.wait(), w_avg.wait(), w_rs.wait())
    sync = C.all_reduce_(torch.arange(8, dtype=torch.float64) + 10 * rank)  # the blocking op, same input
    rows = [(e.op, e.phase, e.tag, e.payload_bytes, e.bytes_sent, e.extra.get("is_async")) for e in tr.events]
    times = [(w.t_launch, w.t_done, e.t_start, e.t_end) for w, e in zip((w_sum, w_avg, w_rs), tr.events)]
    return got, sync, rows, times, w_sum.is_completed()


def test_async_all_reduce_and_reduce_scatter_match_the_blocking_ops_and_are_traced_at_launch():
    results = launch(_async_collectives, N)
    full = sum(torch.arange(8, dtype=torch.float64) + 10 * r for r in range(N))  # sum over ranks, built here
    for rank, ((s, avg, rs), sync, rows, times, completed) in enumerate(results):
        torch.testing.assert_close(s, full, rtol=0, atol=0)
        torch.testing.assert_close(sync, full, rtol=0, atol=0)
        assert_float64_close(avg, full / N)
        torch.testing.assert_close(rs, full.chunk(N)[rank], rtol=0, atol=0)
        assert rows == [
            ("all_reduce", "backward", "bucket", 64, 2 * 3 * 64 // 4, True),
            ("all_reduce", "backward", "bucket", 64, 2 * 3 * 64 // 4, True),
            ("reduce_scatter", "backward", "rs", 64, 3 * 64 // 4, True),
        ]
        for t_launch, t_done, t_start, t_end in times:
            # the trace keeps the launch and the backend's completion, which the wait has seen by now
            assert t_start == t_launch and t_end == t_done and t_done >= t_launch
        assert completed


def test_async_ops_on_a_group_of_one_rank_return_the_tensor_at_once():
    def fn():
        from pylib.runtime import Mesh, ParallelConfig

        mesh = Mesh(ParallelConfig(tp=1, dp=2))
        x = torch.ones(4)
        with trace() as tr:
            w = C.all_reduce_async(x, mesh.tp, op="avg")
            r = C.reduce_scatter_async(x, 0, mesh.tp)
        return w.is_completed(), w.wait() is x, r.wait() is x, len(tr.events)

    assert launch(fn, 2) == [(True, True, True, 0)] * 2
