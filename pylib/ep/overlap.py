"""EP communication hidden behind another micro-batch's compute: two micro-batches, one's all-to-all in flight
while the other computes.

An MoE layer's forward on one micro-batch is compute, then an exchange, then compute, then an exchange:

    attention, router, permute  |  dispatch all-to-all  |  experts  |  combine all-to-all  |  un-permute, next layer

Written as a generator (`block_steps`), the layer *issues* each all-to-all (`collectives.all_to_all_uneven_async`)
and yields it; whoever runs the generator waits for it and sends the rows back in. `interleave` runs several
micro-batches' generators either one after the other, each exchange waited for at once (`overlap=False`: the
blocking baseline), or round-robin (`overlap=True`): micro-batch A issues its dispatch and yields, B computes its
attention and router while A's rows travel, B issues its own dispatch, A's experts run while B's rows travel, and
so on, layer after layer:

    A  attn.0 [dispatch A.0 ~~~~~~~~~~~~~]  experts.0 [combine A.0 ~~~~~~~~~~~~~~~~~]  attn.1  ...
    B         attn.0        [dispatch B.0 ~~~~~~~~~~~~~~~]  experts.0  [combine B.0 ~~~~~~~~~~~~~] attn.1 ...

Both runs execute the same operations on the same tensors, so they give the same bits; only the order of the
micro-batches' pieces differs. Backward needs no schedule of its own: autograd runs the ready node created last
first, and since the forward created A's and B's nodes interleaved, the backward interleaves them in reverse; each
all-to-all's conjugate is issued where its forward waited and waited for where its forward issued
(`collectives.PendingRows`), so one micro-batch's gradient rows travel while the other's backward computes.

Shared experts (Megatron's --moe-shared-expert-overlap, `shared_overlap=True`): the shared MLP runs between
issuing the dispatch and yielding, so it computes while this micro-batch's own routed tokens travel.

Megatron-Core's version of the same idea (NVIDIA/Megatron-LM at d98e8a6, --overlap-moe-expert-parallel-comm):
`megatron/core/pipeline_parallel/combined_1f1b.py` pairs micro-batch i+1's forward with micro-batch i's backward
(`combined_forward_backward_step`), and `TransformerLayerSchedulePlan.run` in
`megatron/core/models/common/model_chunk_schedule_plan.py` cuts each layer into nodes (pre-dispatch compute,
dispatch, MLP, combine; `megatron/core/models/gpt/fine_grained_callables.py`) run on a computation and a
communication CUDA stream, so that one micro-batch's dispatch or combine runs under the other's attention or MLP.
Here both pairings exist. Forward with forward (and, through autograd's order, backward with backward):
`interleave([stack.steps(x_a), stack.steps(x_b)])`. Forward with backward, Megatron's: A's forward run with a
`Segments` (`stack.steps(x_a, cut=segments)`), which cuts the graph at every exchange, so that A's backward can run
one piece at a time as one more generator, `interleave([segments.backward(loss_a), stack.steps(x_b)])`: each of B's
forward exchanges travels while a piece of A's backward computes, and each of A's gradient exchanges while a piece
of B's forward computes. The two "streams" are gloo's threads and this one, and the cut points are the yields.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from pylib.model.moe import AddAuxiliaryLoss, Routing, capacity_keep_mask, tokens_per_expert
from pylib.plan.config import expert_capacity
from pylib.runtime import clock, collectives
from pylib.runtime.tracer import tag

from .aux_loss import group_aux_loss
from .dispatcher import AllToAllDispatcher, DispatchState
from .layer import ExpertParallelMoE
from .permute import sort_chunks

# ------------------------------------------------------------------------------------------ one layer, cut in four


def dispatch_issue(d: AllToAllDispatcher, x, experts, keep, capacity=None):
    """`AllToAllDispatcher.dispatch` up to its all-to-all, which is issued and not waited for.

    x [T, h], experts [T, k], keep [T, k] -> (PendingRows of the rows for my experts, DispatchState).
    The count exchange (E integers) and, with etp > 1, the ETP gather of the counts stay blocking."""
    rows, state = d.prepare(x, experts, keep, capacity)
    with tag("dispatch"):
        pending = collectives.all_to_all_uneven_async(rows, *state.splits(), d.ep_group)
    return pending, state


def gates_issue(d: AllToAllDispatcher, weights, state: DispatchState):
    """With `gate_in_expert`: the combine weights [T, k] sent where their rows go, one value a row, issued right after
    the rows (`AllToAllDispatcher.dispatch_gates` up to its all-to-all), not waited for."""
    with tag("dispatch"):
        return collectives.all_to_all_uneven_async(d.gate_rows(weights, state), *state.splits(), d.ep_group)


class RowsAndGates:
    """The rows' and their combine weights' all-to-alls in flight together (`gate_in_expert`): one exchange to
    `interleave` and `Segments`. wait() -> (rows, gates), each connected to the graph; cut() -> both cuts;
    `forward_work` / `backward_work` the two exchanges' works as one (None before backward issued any)."""

    def __init__(self, rows, gates):
        self.parts = (rows, gates)

    def wait(self):
        return tuple(p.wait() for p in self.parts)

    def cut(self):
        return [p.cut() for p in self.parts]

    @property
    def forward_work(self):
        return _Works([p.forward_work for p in self.parts])

    @property
    def backward_work(self):
        works = [p.backward_work for p in self.parts if p.backward_work is not None]
        return _Works(works) if works else None


class _Works:
    """Several `AllToAllWork`s as one: wait() waits for each (returns their outputs); issued at the first's launch,
    waited for at the last's wait."""

    def __init__(self, works):
        self.works = [w for w in works if w is not None]

    def wait(self):
        return tuple(w.wait() for w in self.works)

    @property
    def t_launch(self):
        return min((w.t_launch for w in self.works), default=None)

    @property
    def t_wait(self):
        waits = [w.t_wait for w in self.works]
        return None if None in waits or not waits else max(waits)


def dispatch_finish(d: AllToAllDispatcher, rows, state: DispatchState):
    """The received rows -> rows grouped by local expert (the ETP all-gather first, blocking, when etp > 1)."""
    if d.etp > 1:
        with tag("dispatch"):
            rows = collectives.all_gather_uneven(rows, state.etp_sizes, d.etp_group)
    return sort_chunks(rows, state.chunk_counts)


def combine_issue(d: AllToAllDispatcher, y, state: DispatchState):
    """`AllToAllDispatcher.combine` up to its all-to-all back, issued and not waited for."""
    y = sort_chunks(y, state.chunk_counts.T)
    with tag("combine"):
        if d.etp > 1:
            y = collectives.reduce_scatter_uneven(y, state.etp_sizes, d.etp_group)
        return collectives.all_to_all_uneven_async(y, *state.splits(back=True), d.ep_group)


class Uncut:
    """How a forward is kept whole (the default): `keep` and `exchange` hand back what they are given."""

    def keep(self, *tensors):
        return tensors

    def exchange(self, pending, kind: str):
        return pending


UNCUT = Uncut()


def moe_steps(layer: ExpertParallelMoE, x: torch.Tensor, shared_overlap: bool = False, cut: Uncut = UNCUT):
    """`ExpertParallelMoE.forward` as a generator that yields ("dispatch" | "combine", PendingRows) at each
    all-to-all and expects the waited rows sent back; returns the output [b, s_local, h]. Same operations, same
    bits. shared_overlap: compute the shared experts while the dispatch is in flight (else after the combine, as
    `forward` does). cut: `Segments` to cut the graph at the exchanges, for a backward run in pieces. The
    dispatcher's storage choices hold here too: with `gate_in_expert` the combine weights are issued right after
    the rows and travel with them (one exchange, `RowsAndGates`), the experts apply them and the combine is a plain
    sum; `fused_unpermute` fuses the combine's weighting and sum."""
    if not isinstance(layer.dispatcher, AllToAllDispatcher):
        raise ValueError(
            f"overlapping needs the all-to-all dispatcher, this layer has {type(layer.dispatcher).__name__} "
            f"(cfg.dispatcher = {layer.cfg.dispatcher!r})"
        )
    if x.shape[-1] != layer.d_model:
        raise ValueError(f"x has hidden size h={x.shape[-1]}, the MoE layer expects h={layer.d_model}")
    cfg, d = layer.cfg, layer.dispatcher
    shape = x.shape
    xt = x.reshape(-1, shape[-1])
    routing = layer.router(xt)
    capacity = expert_capacity(xt.shape[0], cfg)
    keep = capacity_keep_mask(routing, cfg, capacity)
    if torch.is_grad_enabled():
        layer.routed_counts += tokens_per_expert(routing.experts, cfg.n_experts)
    pending, state = dispatch_issue(d, xt, routing.experts, keep, capacity if cfg.pad_to_capacity else None)
    if d.gate_in_expert:  # the combine weights travel with their rows, as `dispatch_gates` sends them
        pending = RowsAndGates(pending, gates_issue(d, routing.weights, state))
    shared = layer.shared(x) if layer.shared is not None and shared_overlap else None
    later, (x_later, shared) = Routing(*cut.keep(*routing)), cut.keep(x, shared)  # used after the exchanges
    rows, gates = _received(d, (yield "dispatch", cut.exchange(pending, "dispatch")), state)
    sizes = state.rows_per_local_expert
    y = layer.experts(rows, sizes) if gates is None else layer.experts(rows, sizes, gates)
    y = yield "combine", cut.exchange(combine_issue(d, y, state), "combine")
    out = d.unpermute_home(y, state, None if d.gate_in_expert else later.weights)
    if layer.shared is not None:
        out = out + (shared if shared is not None else layer.shared(x_later)).reshape(out.shape)
    aux = group_aux_loss(later, cfg, layer.aux_group)
    if aux is not None:
        out = AddAuxiliaryLoss.apply(out, aux)
        layer.last_aux_loss = aux.detach()
    layer.last_routing = Routing(*(t.detach() for t in routing))
    layer.last_keep, layer.last_state = keep, state
    return out.view(shape)


def _received(d: AllToAllDispatcher, got, state: DispatchState):
    """What the dispatch's wait handed back -> (rows grouped by local expert, their combine weights [R] or None)."""
    if not d.gate_in_expert:
        return dispatch_finish(d, got, state), None
    rows, gates = got
    return dispatch_finish(d, rows, state), dispatch_finish(d, gates, state).squeeze(-1)


def block_steps(block: nn.Module, x: torch.Tensor, shared_overlap: bool = False, cut: Uncut = UNCUT):
    """One Pre-LN layer (`pylib.model.transformer.Block` with an `ExpertParallelMoE` as its mlp) as a generator:
    x + attn(ln1(x)), then + the MoE of ln2 of that, yielding at the MoE's two all-to-alls."""
    x = x + block.attn(block.ln1(x))
    (residual,) = cut.keep(x)  # added after the exchanges
    return residual + (yield from moe_steps(block.mlp, block.ln2(x), shared_overlap, cut))


# ------------------------------------------------------------------------------------------ a stack of layers


class ExpertParallelStack(nn.Module):
    """Reference `Block`s whose MoE is replaced by its `ExpertParallelMoE` (attention and norms replicated).

    forward(x [b, s, h]): the layers one after another, each all-to-all blocking (the plain EP layer).
    steps(x, cut=UNCUT): the same as a generator, yielding ("dispatch.<layer>" | "combine.<layer>", PendingRows);
    with cut=Segments() the graph is cut at each exchange, so that `Segments.backward` can run it in pieces."""

    def __init__(self, blocks, *, ep_group=None, etp_group=None, aux_group=None, shared_overlap: bool = False):
        super().__init__()
        self.shared_overlap = bool(shared_overlap)
        self.blocks = nn.ModuleList()
        for i, block in enumerate(blocks):
            moe = getattr(block, "mlp", None)
            if moe is None or not hasattr(moe, "router"):
                raise ValueError(f"block {i} has no MoE as its mlp: every layer of an overlapped stack is an MoE layer")
            local = copy.deepcopy(block)
            local.mlp = ExpertParallelMoE.from_full(moe, ep_group=ep_group, etp_group=etp_group, aux_group=aux_group)
            self.blocks.append(local)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x

    def steps(self, x: torch.Tensor, cut: Uncut = UNCUT):
        for i, block in enumerate(self.blocks):
            inner, value = block_steps(block, x, self.shared_overlap, cut), None
            while True:
                try:
                    with tag(f"layers.{i}"):  # entered and left within one segment: no tag leaks across a yield
                        name, pending = inner.send(value)
                except StopIteration as done:
                    x = done.value
                    break
                value = yield f"{name}.{i}", pending
        return x


# ------------------------------------------------------------------------------------------ the schedule


@dataclass
class OverlapRecorder:
    """What `interleave` saw, on the host clock the tracer uses (`clock.now()`): every compute segment between two
    yields (micro-batch, name, start, end), every wait (micro-batch, exchange name, start, end) and every
    exchange (micro-batch, name, PendingRows: its `forward_work` / `backward_work` hold issue and wait times)."""

    compute: list[tuple[int, str, float, float]] = field(default_factory=list)
    waits: list[tuple[int, str, float, float]] = field(default_factory=list)
    exchanges: list[tuple[int, str, object]] = field(default_factory=list)


def _segment_name(ended_by: str | None, after: str | None = None) -> str:
    """A compute segment is named by what it mostly is: before a dispatch the attention (with the previous layer's
    un-permute and this layer's router), before a combine the experts, after the last exchange the last un-permute.
    A backward (`Segments.backward`) names its pieces itself ("grad.<the forward piece>"); its last one, after
    `after`, is the backward of the first layer's attention."""
    if ended_by is None:
        return "grad.attn.0" if after is not None and after.startswith("grad.") else "out"
    if ended_by.startswith("grad."):
        return ended_by
    kind, layer = ended_by.split(".")
    return f"{'attn' if kind == 'dispatch' else 'experts'}.{layer}"


def interleave(gens, *, overlap: bool = True, recorder: OverlapRecorder | None = None) -> list:
    """Run micro-batch generators (`ExpertParallelStack.steps`, or a `Segments.backward`) to the end; return their
    outputs in order.

    overlap=False: one after another, each exchange waited for as soon as it is issued (the blocking baseline).
    overlap=True: round-robin; micro-batch i's exchange is waited for only after every other micro-batch has run
    its next compute segment, so that segment runs while i's rows travel. The tracer tag "mb<i>" names each
    micro-batch's ops. Two forwards paired: `interleave([steps(x_a), steps(x_b)])`; a backward paired with a
    forward (Megatron-Core's combined 1F1B): `interleave([segments_a.backward(loss_a), steps(x_b)])`."""
    n = len(gens)
    outs: list = [None] * n
    last: list = [None] * n  # each generator's last yielded name

    def advance(i, value):
        t0 = clock.now()
        with tag(f"mb{i}"):
            try:
                item = gens[i].send(value)
            except StopIteration as done:
                outs[i], item = done.value, None
        if recorder is not None:
            name = _segment_name(None if item is None else item[0], last[i])
            recorder.compute.append((i, name, t0, clock.now()))
            if item is not None:
                recorder.exchanges.append((i, item[0], item[1]))
        last[i] = None if item is None else item[0]
        return item

    def wait(i, item):
        if item[1] is None:  # a backward's exchange over a group of one: nothing in flight
            return None
        t0 = clock.now()
        rows = item[1].wait()
        if recorder is not None:
            recorder.waits.append((i, item[0], t0, clock.now()))
        return rows

    if not overlap:
        for i in range(n):
            item = advance(i, None)
            while item is not None:
                item = advance(i, wait(i, item))
        return outs
    items = [advance(i, None) for i in range(n)]
    while any(item is not None for item in items):
        for i in range(n):
            if items[i] is not None:
                items[i] = advance(i, wait(i, items[i]))
    return outs


# ------------------------------------------------------------------------------------------ a backward in pieces


class Segments(Uncut):
    """A forward cut at its all-to-alls, so that its backward can run one piece at a time and pause between them.

    Run the forward with it (`stack.steps(x, cut=segments)`). Piece k is the compute between exchange k-1 and
    exchange k (the last piece: after the last exchange). `keep` hands each tensor that a later piece uses over as a
    detached leaf that requires grad, and remembers (tensor, leaf) in the current piece; `exchange` cuts the graph
    between the all-to-all's issue and its wait (`PendingRows.cut`) and starts the next piece. Megatron-Core's
    schedule nodes cut a layer the same way (`ScheduleNode`: inputs detached, outputs kept, backward from them)."""

    def __init__(self):
        self.kept: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[]]
        # exchange k's cuts: [(end of piece k, leaf the wait started from)], two with `RowsAndGates`
        self.cuts: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        self.pending: list = []  # exchange k's PendingRows (or RowsAndGates)
        self.names: list[str] = []  # piece k's name in the forward ("attn.0", "experts.0", ..., "out")
        self.spent = False  # its backward has run

    def keep(self, *tensors):
        out = []
        for t in tensors:
            if t is not None and t.grad_fn is not None:  # a leaf has no graph before it to cut
                leaf = t.detach().requires_grad_()
                self.kept[-1].append((t, leaf))
                t = leaf
            out.append(t)
        return tuple(out)

    def exchange(self, pending, kind: str):
        self.names.append(_segment_name(f"{kind}.{len(self.names) // 2}"))  # a dispatch, then a combine, per layer
        cuts = pending.cut()
        self.cuts.append(cuts if isinstance(cuts, list) else [cuts])
        self.pending.append(pending)
        self.kept.append([])
        return pending

    def backward(self, out: torch.Tensor, grad: torch.Tensor | None = None):
        """The backward of the cut forward, as a generator for `interleave`: the pieces last first, each one
        `torch.autograd.backward` from the gradients the pieces after it left on its leaves. A piece's backward
        ends by issuing the all-to-all of the gradient of the exchange before it (`_AllToAllRowsWait.backward`);
        the generator yields ("grad.<piece>", that exchange's `AllToAllWork`), and the backward of the piece before
        waits for it first thing (`_AllToAllRowsIssue.backward`), so what runs in between (another micro-batch's
        forward) runs while the gradient rows travel. out: the forward's output or a loss of it; grad: its
        gradient (None for a scalar). One backward per forward: a `Segments` cuts one forward."""
        if not out.requires_grad:
            raise ValueError("out does not require grad: run the cut forward with autograd enabled")
        if self.spent:
            raise RuntimeError("this forward's backward has already run: cut each forward with a new Segments")
        self.spent = True
        return self._pieces(out, grad)

    def _pieces(self, out, grad):
        """`backward`'s generator: piece k's backward from the gradients on its leaves, then its exchange's."""
        n, names = len(self.cuts), self.names + ["out"]
        for k in range(n, -1, -1):
            pairs = self.kept[k] + (self.cuts[k] if k < n else [])
            roots = [(t, leaf.grad) for t, leaf in pairs if leaf.grad is not None]
            roots += [(out, grad)] if k == n else []
            if roots:
                torch.autograd.backward([t for t, _ in roots], [g for _, g in roots])
            self.kept[k] = []  # the leaves' gradients are spent, the graph behind them freed
            if k < n:
                self.cuts[k] = None
            if k:
                work, self.pending[k - 1] = self.pending[k - 1].backward_work, None
                yield f"grad.{names[k]}", work
