"""CP ranks as threads (bench/cp_threads.py): the in-process transport the one-GPU check drives the real ring
and Ulysses code with. Its results must equal the gloo ranks' exactly, and a stuck rank must raise, not hang."""

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from cp_threads import ThreadTransport, backward_in_thread  # noqa: E402

from pylib.cp import ring_attention, shard_sequence, ulysses_attention  # noqa: E402
from pylib.runtime import launch  # noqa: E402


def _inputs(s=16):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, s, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, s, 8, generator=g, dtype=torch.float64) for _ in range(2))
    return (q, k, v), torch.randn(1, 4, s, 8, generator=g, dtype=torch.float64)


def _shard_and_run(r, n, group, full, dout, kind, in_thread):
    q, k, v = (shard_sequence(x, 2, r, n, "zigzag").requires_grad_() for x in full)
    fn = ring_attention if kind == "ring" else ulysses_attention
    out = fn(q, k, v, group=group, causal=True, layout="zigzag", kernel="torch")
    d = shard_sequence(dout, 2, r, n, "zigzag")
    backward_in_thread(out, d) if in_thread else out.backward(d)
    return [t.detach() for t in (out, q.grad, k.grad, v.grad)]


def _gloo_rank(full, dout, kind):
    return _shard_and_run(dist.get_rank(), dist.get_world_size(), None, full, dout, kind, False)


@pytest.mark.parametrize("kind", ["ring", "ulysses"])
def test_thread_ranks_give_exactly_the_gloo_ranks_results(kind):
    full, dout = _inputs()
    gloo = launch(_gloo_rank, 2, full, dout, kind, backend="gloo")
    with ThreadTransport(2) as tr:
        threads = tr.run(lambda g: _shard_and_run(g.rank, g.size, g, full, dout, kind, True))
    for a, b in zip(gloo, threads):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_a_rank_whose_peer_never_sends_raises_instead_of_hanging():
    def lonely(group):
        buf = torch.zeros(2)
        works = ThreadTransport.batch_isend_irecv(tr, [("recv", buf, (group.rank - 1) % group.size)], group, tag="x")
        works[0].wait()

    with ThreadTransport(2, timeout=0.2) as tr:
        with pytest.raises(RuntimeError, match="rank 0 failed: TimeoutError.*no message for x from rank 1"):
            tr.run(lonely)


def test_the_transport_is_only_active_inside_its_with_block_and_refuses_a_graph_that_is_not_a_tree():
    import pylib.cp.ring as ring

    real = ring.C
    tr = ThreadTransport(2)
    with pytest.raises(RuntimeError, match="needs the transport active"):
        tr.run(lambda g: None)
    with tr:
        assert ring.C is tr
    assert ring.C is real
    x = torch.ones(3, requires_grad=True)
    y = x * 2
    with pytest.raises(RuntimeError, match="reached twice"):
        backward_in_thread(y + y, torch.ones(3))
