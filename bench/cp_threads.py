"""Several CP ranks as threads of one process on one device: an in-process transport for pylib.cp's ring and Ulysses.

    with ThreadTransport(4) as tr:
        outs = tr.run(fn, q, k, v)      # fn(group, q, k, v) on 4 threads; group is that thread's cp AxisGroup

A reader with one GPU cannot launch four NCCL ranks on it, yet the ring's forward and backward are what needs
checking. Ring attention talks to its neighbours only through `collectives.batch_isend_irecv` and Ulysses only
through `collectives.all_to_all`, both looked up on the module `pylib.cp.ring` / `pylib.cp.ulysses` imported as
`C`. While a ThreadTransport is active it stands in for that `C` in those two modules: a send puts a copy of the
tensor in the mailbox of (source, destination, tag), a receive's wait() takes it out, and every other name is
passed through to the real module. So the real `RingAttention.forward/backward` and `ulysses_attention` run
unchanged, each thread being one cp rank with its own `AxisGroup("cp", (0..n-1), rank)`.

Backward also runs in each rank's own thread, through `backward_in_thread`: torch's autograd engine does all CUDA
backward work of a process on one thread per device, where a rank waiting for its neighbour's message would block
the very thread that neighbour's backward needs. The graphs of ring attention and Ulysses from leaf q, k, v are
trees (no node reached twice), so walking them node by node is the whole of what the engine would do.

Threads share the device and its default stream, so the ranks' kernels run one after another: the numbers are
the ring's, the wall time is the sum of every rank's work (the ring's compute overhead), never the overlap.
A receive that waits longer than `timeout` raises instead of hanging. Nothing is traced.
"""

from __future__ import annotations

import queue
import threading

import torch

import pylib.cp.ring as ring_module
import pylib.cp.ulysses as ulysses_module
from pylib.runtime import collectives as real_collectives
from pylib.runtime.mesh import AxisGroup


class _Received:
    """A posted receive: wait() blocks until the peer's tensor arrives, copies it into `tensor`."""

    def __init__(self, box: queue.Queue, tensor: torch.Tensor, timeout: float, what: str):
        self.box, self.tensor, self.timeout, self.what, self.done = box, tensor, timeout, what, False

    def wait(self) -> torch.Tensor:
        if not self.done:
            try:
                self.tensor.copy_(self.box.get(timeout=self.timeout))
            except queue.Empty:
                raise TimeoutError(f"in-process cp rank: no message for {self.what} after {self.timeout:g} s") from None
            self.done = True
        return self.tensor


class _Sent:
    def wait(self):
        return None


class ThreadTransport:
    """The stand-in for `pylib.runtime.collectives` inside pylib.cp.ring and pylib.cp.ulysses; see the module."""

    def __init__(self, n: int, timeout: float = 120.0):
        if n < 1:
            raise ValueError(f"ThreadTransport needs at least one rank, got n={n}")
        self.n, self.timeout = n, timeout
        self._boxes: dict[tuple, queue.Queue] = {}
        self._lock = threading.Lock()
        self._saved = None

    # ---------------------------------------------------------------- the two collectives pylib.cp uses

    def _box(self, src: int, dst: int, tag) -> queue.Queue:
        with self._lock:
            return self._boxes.setdefault((src, dst, tag), queue.Queue())

    def resolve_group(self, group) -> AxisGroup:
        if not isinstance(group, AxisGroup):
            raise TypeError(f"in-process cp ranks need their AxisGroup, got {group!r}")
        return group

    def batch_isend_irecv(self, ops, group=None, *, phase=None, tag=None):
        g = self.resolve_group(group)
        works = []
        for kind, t, peer in ops:
            if kind == "send":
                self._box(g.rank, peer, tag).put(t.detach().clone())
                works.append(_Sent())
            else:
                works.append(_Received(self._box(peer, g.rank, tag), t, self.timeout, f"{tag} from rank {peer}"))
        return works

    def exchange_chunks(self, chunks: list[torch.Tensor], g: AxisGroup, tag) -> list[torch.Tensor]:
        """Chunk j to member j; returns the chunk each member sent to me, in member order."""
        for j, c in enumerate(chunks):
            self._box(g.rank, j, tag).put(c.detach().clone())
        got = []
        for j in range(g.size):
            try:
                got.append(self._box(j, g.rank, tag).get(timeout=self.timeout))
            except queue.Empty:
                raise TimeoutError(f"in-process cp rank {g.rank}: no {tag} chunk from rank {j}") from None
        return got

    def all_to_all(self, x, scatter_dim: int, gather_dim: int, group=None, *, tag=None):
        g = self.resolve_group(group)
        return x if g.size == 1 else _ThreadAllToAll.apply(x, scatter_dim, gather_dim, g, tag, self)

    def __getattr__(self, name):  # everything else: the real collectives module
        return getattr(real_collectives, name)

    # ---------------------------------------------------------------- activation and running ranks

    def __enter__(self) -> ThreadTransport:
        self._saved = (ring_module.C, ulysses_module.C)
        ring_module.C = ulysses_module.C = self
        return self

    def __exit__(self, *exc) -> None:
        ring_module.C, ulysses_module.C = self._saved

    def group(self, rank: int) -> AxisGroup:
        return AxisGroup("cp", tuple(range(self.n)), rank, None)

    def run(self, fn, *args, **kwargs) -> list:
        """fn(group, *args, **kwargs) on n threads; their results by rank. The first exception is re-raised."""
        if ring_module.C is not self:
            raise RuntimeError("ThreadTransport.run needs the transport active: use `with ThreadTransport(n) as tr:`")
        results, errors = [None] * self.n, [None] * self.n

        def body(r):
            try:
                results[r] = fn(self.group(r), *args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                errors[r] = exc

        threads = [threading.Thread(target=body, args=(r,), name=f"cp-rank-{r}", daemon=True) for r in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.timeout * 4)
        alive = [r for r, t in enumerate(threads) if t.is_alive()]
        if alive:
            raise TimeoutError(f"in-process cp ranks {alive} did not finish")
        for r, exc in enumerate(errors):
            if exc is not None:
                raise RuntimeError(f"in-process cp rank {r} failed: {exc!r}") from exc
        return results


def _call_node(node, grad) -> tuple:
    out = node.apply(grad) if hasattr(node, "apply") else node(grad)  # a Python Function's node, or a C++ one
    return out if isinstance(out, tuple) else (out,)


def backward_in_thread(out: torch.Tensor, dout: torch.Tensor) -> None:
    """out.backward(dout) computed in the calling thread, for a graph that is a tree: each node's one output
    gradient is passed to its node, whose input gradients go to the nodes that made those inputs; a leaf's
    gradient is added to its .grad. Raises if a node is reached twice (a graph this walk cannot do). Like the
    engine (without create_graph), it records no graph of the backward itself."""
    with torch.no_grad():
        _walk(out, dout)


def _walk(out: torch.Tensor, dout: torch.Tensor) -> None:
    seen = set()
    stack = [(out.grad_fn, dout)]
    while stack:
        node, grad = stack.pop()
        if node is None or grad is None:
            continue
        if id(node) in seen:
            raise RuntimeError(f"backward_in_thread: {type(node).__name__} is reached twice; the graph is not a tree")
        seen.add(id(node))
        if hasattr(node, "variable"):  # AccumulateGrad: a leaf
            leaf = node.variable
            leaf.grad = grad.detach().clone() if leaf.grad is None else leaf.grad + grad
            continue
        for (nxt, _), g in zip(node.next_functions, _call_node(node, grad)):
            stack.append((nxt, g))


class _ThreadAllToAll(torch.autograd.Function):
    """all-to-all between threads: forward scatters scatter_dim and gathers gather_dim; backward the reverse."""

    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, g, tag, transport):
        ctx.dims, ctx.g, ctx.tag, ctx.transport = (scatter_dim, gather_dim), g, tag, transport
        got = transport.exchange_chunks(list(x.chunk(g.size, dim=scatter_dim)), g, (tag, "forward"))
        return torch.cat(got, dim=gather_dim)

    @staticmethod
    def backward(ctx, dy):
        scatter_dim, gather_dim = ctx.dims
        got = ctx.transport.exchange_chunks(list(dy.chunk(ctx.g.size, dim=gather_dim)), ctx.g, (ctx.tag, "backward"))
        return torch.cat(got, dim=scatter_dim), None, None, None, None, None
