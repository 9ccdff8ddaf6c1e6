"""EP all-to-all hidden behind another micro-batch's compute (`pylib.ep.overlap`, `all_to_all_uneven_async`).

One launch of 2 gloo ranks (4 in the slow test) runs, in float64:
  * the async uneven all-to-all against the blocking one, forward and backward, bit for bit, and its trace record;
  * a 2-layer MoE stack on two micro-batches three ways -- the plain layers (blocking all-to-alls), the generator
    one micro-batch after the other (`interleave(overlap=False)`) and interleaved (`overlap=True`) -- with
    dropping, the aux loss and a shared expert, each also with the shared expert computed under the dispatch:
    loss, outputs, every parameter's and input's gradient equal bit for bit;
  * from the tracer's and the recorder's time stamps: every forward all-to-all of the interleaved run is in flight
    (issued before, waited for after) across a compute segment of the other micro-batch; in the blocking run none is;
  * the forward-under-backward pairing (combined 1F1B): micro-batch A's forward cut into pieces (`Segments`), then
    A's backward piece by piece interleaved with B's forward, then B's backward -- against the plain layers and the
    same pieces one after the other: loss, outputs, every gradient bit for bit; each of B's forward all-to-alls in
    flight across a piece of A's backward, each of A's backward all-to-alls across a piece of B's forward.
"""

import pytest
import torch
import torch.distributed as dist

from pylib.ep.overlap import ExpertParallelStack, OverlapRecorder, Segments, interleave
from pylib.model import build_model
from pylib.plan.config import MoEConfig
from pylib.plan.presets import tiny
from pylib.runtime import Mesh, ParallelConfig, collectives, launch, trace

CONFIGS = {
    "top2": MoEConfig(n_experts=4, top_k=2, every=1),
    "drop-aux-shared": MoEConfig(
        n_experts=4, top_k=2, every=1, capacity_factor=0.8, aux_loss_coef=0.1, n_shared_experts=1
    ),
}


def _async_op(ep_group):
    """The async all-to-all against the blocking one, on uneven splits: rows and input gradients, bit for bit."""
    r, n = ep_group.rank, ep_group.size
    g = torch.Generator().manual_seed(r)
    splits = [(r + j) % 3 + 1 for j in range(n)]  # rank r sends splits[j] rows to j
    received = [(j + r) % 3 + 1 for j in range(n)]  # rank j's splits[r]
    x = torch.randn(sum(splits), 3, generator=g, dtype=torch.float64)
    dy = torch.randn(sum(received), 3, generator=g, dtype=torch.float64)
    out = {}
    for name in ("sync", "async"):
        xi = x.clone().requires_grad_()
        with trace() as tr:
            if name == "sync":
                y = collectives.all_to_all_uneven(xi, received, splits, ep_group)
            else:
                pending = collectives.all_to_all_uneven_async(xi, received, splits, ep_group, tag="probe")
                y = pending.wait()
            (y * dy).sum().backward()
        out[name] = (y.detach(), xi.grad)
        if name == "async":
            out["events"] = [
                (e.phase, e.tag, e.extra.get("is_async", False), e.t_start, e.extra.get("t_wait"), e.bytes_sent)
                for e in tr.events
                if e.op == "all_to_all"
            ]
            out["works"] = [(w.t_launch, w.t_wait) for w in (pending.forward_work, pending.backward_work)]
    return out


def _two_microbatches(cfg_moe, seed: int):
    """The 2-layer MoE model of `cfg_moe` and two float64 micro-batches [2, 8, h], drawn from `seed` + this rank."""
    cfg = tiny().with_(n_layers=2, moe=cfg_moe)
    g = torch.Generator().manual_seed(seed + dist.get_rank())
    return build_model(cfg), [torch.randn(2, 8, cfg.d_model, generator=g, dtype=torch.float64) for _ in range(2)]


def _stack_runs(mesh, cfg_moe, shared_overlap, etp_group=None):
    """The three ways of running the stack on two micro-batches; each: loss, outputs, grads, recorder, events."""
    model, xs = _two_microbatches(cfg_moe, seed=10)
    runs = {}
    for how in ("layers", "blocking", "overlap"):
        stack = ExpertParallelStack(model.layers, ep_group=mesh.ep, etp_group=etp_group, shared_overlap=shared_overlap)
        inputs = [x.clone().requires_grad_() for x in xs]
        rec = OverlapRecorder()
        with trace() as tr:
            if how == "layers":
                outs = [stack(x) for x in inputs]
            else:
                outs = interleave([stack.steps(x) for x in inputs], overlap=how == "overlap", recorder=rec)
            loss = sum((o * o).sum() for o in outs)
            loss.backward()
        events = [
            (e.tag, e.phase, e.t_start, e.extra["t_wait"])
            for e in tr.events
            if e.op == "all_to_all" and e.extra.get("is_async")
        ]
        grads = [p.grad for p in stack.parameters()] + [x.grad for x in inputs]
        runs[how] = dict(loss=loss.detach(), outs=[o.detach() for o in outs], grads=grads, compute=rec.compute)
        runs[how]["events"] = events
    return runs


def _fwd_bwd_runs(mesh, cfg_moe, shared_overlap, etp_group=None):
    """Micro-batch A forward then backward, B forward then backward, three ways: the plain layers ("layers"); A's
    forward cut into pieces, A's backward piece after piece, then B's forward ("blocking"); the same with A's
    backward interleaved with B's forward ("paired"). Each: losses, outputs, grads, and the pairing's recorder and
    its all-to-alls (A's backward ones, B's forward ones)."""
    model, xs = _two_microbatches(cfg_moe, seed=20)
    runs = {}
    for how in ("layers", "blocking", "paired"):
        stack = ExpertParallelStack(model.layers, ep_group=mesh.ep, etp_group=etp_group, shared_overlap=shared_overlap)
        xa, xb = [x.clone().requires_grad_() for x in xs]
        rec = OverlapRecorder()
        if how == "layers":
            out_a = stack(xa)
            loss_a = (out_a * out_a).sum()
            loss_a.backward()
            out_b = stack(xb)
        else:
            segments = Segments()
            (out_a,) = interleave([stack.steps(xa, cut=segments)], overlap=False)
            loss_a = (out_a * out_a).sum()
            with trace() as tr:
                _, out_b = interleave(
                    [segments.backward(loss_a), stack.steps(xb)], overlap=how == "paired", recorder=rec
                )
        loss_b = (out_b * out_b).sum()
        loss_b.backward()
        grads = [p.grad for p in stack.parameters()] + [xa.grad, xb.grad]
        runs[how] = dict(loss=(loss_a + loss_b).detach(), outs=[out_a.detach(), out_b.detach()], grads=grads)
        if how != "layers":
            runs[how]["compute"] = rec.compute
            runs[how]["events"] = [
                (e.tag, e.phase, e.t_start, e.extra["t_wait"])
                for e in tr.events
                if e.op == "all_to_all" and e.extra.get("is_async")
            ]
    return runs


def _worker(ep):
    mesh = Mesh(ParallelConfig(dp=ep, ep=ep))
    result = {"async_op": _async_op(mesh.ep)}
    for name, cfg_moe in CONFIGS.items():
        for shared_overlap in (False, True) if cfg_moe.n_shared_experts else (False,):
            result[(name, shared_overlap)] = _stack_runs(mesh, cfg_moe, shared_overlap)
            result[("fwd-bwd", name, shared_overlap)] = _fwd_bwd_runs(mesh, cfg_moe, shared_overlap)
    return result


@pytest.fixture(scope="module")
def two_ranks():
    return launch(_worker, 2, 2, backend="gloo", timeout=240)


def _identical(a, b):
    return torch.equal(a["loss"], b["loss"]) and all(
        torch.equal(x, y) for x, y in zip(a["outs"] + a["grads"], b["outs"] + b["grads"], strict=True)
    )


def _in_flight_across_other(runs, phases=("forward",)):
    """For each all-to-all of `phases`: does [issue, wait] intersect a compute segment of the other micro-batch?"""
    found = []
    for tag, phase, issued, waited in runs["events"]:
        if phase not in phases:
            continue
        mb = int(tag.split(".")[0][2:])  # "mb0.dispatch" -> 0
        others = [(a, b) for i, _, a, b in runs["compute"] if i != mb]
        found.append(any(a < waited and issued < b for a, b in others))
    return found


def test_async_all_to_all_equals_blocking_forward_and_backward(two_ranks):
    for rank in two_ranks:
        op = rank["async_op"]
        assert torch.equal(op["sync"][0], op["async"][0]) and torch.equal(op["sync"][1], op["async"][1])


def test_async_all_to_all_is_traced_with_issue_and_wait_times(two_ranks):
    for rank in two_ranks:
        events = rank["async_op"]["events"]
        assert [(p, t, a) for p, t, a, *_ in events] == [("forward", "probe", True), ("backward", "probe", True)]
        assert all(t0 <= t_wait for *_, t0, t_wait, _ in events)
        assert all(sent > 0 for *_, sent in events)  # uneven rows to the other rank
        for t_launch, t_wait in rank["async_op"]["works"]:
            assert t_launch <= t_wait


def test_async_all_to_all_of_one_rank_is_the_identity():
    x = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    one = collectives.AxisGroup("ep", (0,), 0, None)
    pending = collectives.all_to_all_uneven_async(x, [3], [3], one)
    y = pending.wait()
    y.sum().backward()
    assert torch.equal(y, x) and torch.equal(x.grad, torch.ones_like(x))
    with pytest.raises(RuntimeError, match="already waited"):
        pending.wait()


@pytest.mark.parametrize("case", [("top2", False), ("drop-aux-shared", False), ("drop-aux-shared", True)])
def test_interleaved_micro_batches_equal_the_blocking_run_bit_for_bit(two_ranks, case):
    for rank in two_ranks:
        runs = rank[case]
        assert _identical(runs["blocking"], runs["layers"])  # the generator is the layer, cut at its exchanges
        assert _identical(runs["overlap"], runs["blocking"])


def test_each_forward_all_to_all_is_in_flight_across_the_other_micro_batch_compute(two_ranks):
    for rank in two_ranks:
        runs = rank[("top2", False)]
        assert len(runs["overlap"]["events"]) == 16  # 2 micro-batches x 2 layers x (dispatch, combine) x fwd/bwd
        assert all(_in_flight_across_other(runs["overlap"]))
        assert not any(_in_flight_across_other(runs["blocking"]))


def test_backward_interleaves_the_micro_batches_conjugate_all_to_alls(two_ranks):
    """Autograd runs the node created last first: the backward exchanges of the two micro-batches alternate, and
    each but the last is issued before the other micro-batch's previous one is waited for."""
    for rank in two_ranks:
        back = [e for e in rank[("top2", False)]["overlap"]["events"] if e[1] == "backward"]
        assert [e[0].split(".")[0] for e in back] == ["mb1", "mb0"] * 4
        assert all(later[2] < earlier[3] for earlier, later in zip(back, back[1:]))


FWD_BWD_CASES = [
    ("fwd-bwd", "top2", False),
    ("fwd-bwd", "drop-aux-shared", False),
    ("fwd-bwd", "drop-aux-shared", True),
]


@pytest.mark.parametrize("case", FWD_BWD_CASES)
def test_backward_paired_with_forward_equals_the_plain_layers_bit_for_bit(two_ranks, case):
    for rank in two_ranks:
        runs = rank[case]
        assert all(g is not None for g in runs["layers"]["grads"])
        assert _identical(runs["blocking"], runs["layers"])  # the backward in pieces is the backward
        assert _identical(runs["paired"], runs["layers"])


def test_backward_runs_piece_by_piece_in_turn_with_the_other_micro_batch_forward(two_ranks):
    for rank in two_ranks:
        compute = rank[("fwd-bwd", "top2", False)]["paired"]["compute"]
        order = [(mb, name) for mb, name, *_ in compute]
        a = ["grad.out", "grad.experts.1", "grad.attn.1", "grad.experts.0", "grad.attn.0"]
        b = ["attn.0", "experts.0", "attn.1", "experts.1", "out"]
        assert order == [pair for pieces in zip(a, b) for pair in ((0, pieces[0]), (1, pieces[1]))]


def test_each_all_to_all_of_the_pairing_is_in_flight_across_the_other_micro_batch_compute(two_ranks):
    """B's forward all-to-alls under A's backward pieces, A's backward all-to-alls under B's forward pieces."""
    for rank in two_ranks:
        runs = rank[("fwd-bwd", "top2", False)]
        for how in ("paired", "blocking"):
            mbs = [(tag.split(".")[0], phase) for tag, phase, *_ in runs[how]["events"]]
            assert sorted(set(mbs)) == [("mb0", "backward"), ("mb1", "forward")] and len(mbs) == 8
        assert all(_in_flight_across_other(runs["paired"], ("forward", "backward")))
        assert not any(_in_flight_across_other(runs["blocking"], ("forward", "backward")))


def test_a_cut_all_to_all_hands_the_backward_over_at_the_cut():
    """A group of one: the cut is on the rows; backward from the wait stops at the leaf, then goes on from the end."""
    x = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    one = collectives.AxisGroup("ep", (0,), 0, None)
    pending = collectives.all_to_all_uneven_async(2 * x, [3], [3], one)
    end, leaf = pending.cut()
    (3 * pending.wait()).sum().backward()
    assert x.grad is None and torch.equal(leaf.grad, torch.full_like(x, 3.0))
    torch.autograd.backward(end, leaf.grad)
    assert torch.equal(x.grad, torch.full_like(x, 6.0))
    with pytest.raises(RuntimeError, match="before waiting"):
        pending.cut()


def test_a_backward_in_pieces_refuses_a_forward_without_grad_and_a_second_run():
    """One layer on a group of one (no exchange in flight): the pieces' backward equals the plain one, and misuse
    is refused when the backward is asked for, before any piece runs."""
    from pylib.ep import ExpertParallelMoE
    from pylib.ep.overlap import moe_steps
    from tests.conftest import seeded_moe

    one = collectives.AxisGroup("ep", (0,), 0, None)
    layer = ExpertParallelMoE(seeded_moe(MoEConfig(n_experts=4, top_k=2, n_shared_experts=1)), one, one, None)
    x = torch.randn(1, 3, layer.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    grads = []
    for cut in (None, Segments()):
        layer.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        if cut is None:
            (layer(xi) ** 2).sum().backward()
        else:
            (out,) = interleave([moe_steps(layer, xi, cut=cut)], overlap=False)
            loss = (out**2).sum()
            interleave([cut.backward(loss)])
        grads.append([p.grad for p in layer.parameters()] + [xi.grad])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
    with pytest.raises(RuntimeError, match="already run"):
        cut.backward(loss)
    with torch.no_grad():
        (out,) = interleave([moe_steps(layer, x, cut=Segments())], overlap=False)
    with pytest.raises(ValueError, match="does not require grad"):
        Segments().backward(out)


FOUR_RANKS = {  # name: (ep, etp, MoE config, shared_overlap)
    "ep4-drop-aux-shared": (4, 1, CONFIGS["drop-aux-shared"], True),
    "ep2-etp2": (2, 2, CONFIGS["top2"], False),
    "ep4-pad-to-capacity": (
        4,
        1,
        MoEConfig(n_experts=4, top_k=2, every=1, capacity_factor=1.5, pad_to_capacity=True),
        False,
    ),
}


def _four_rank_identity():
    out = {}
    for name, (ep, etp, cfg_moe, shared_overlap) in FOUR_RANKS.items():
        mesh = Mesh(ParallelConfig(dp=4, ep=ep, etp=etp))
        runs = _stack_runs(mesh, cfg_moe, shared_overlap, etp_group=mesh.etp)
        out[name] = _identical(runs["overlap"], runs["blocking"]) and _identical(runs["blocking"], runs["layers"])
        fb = _fwd_bwd_runs(mesh, cfg_moe, shared_overlap, etp_group=mesh.etp)
        out[f"{name} fwd-bwd"] = _identical(fb["paired"], fb["layers"]) and _identical(fb["blocking"], fb["layers"])
    return out


@pytest.mark.slow
def test_interleaved_micro_batches_equal_the_blocking_run_on_four_ranks_with_etp_and_padding():
    for rank in launch(_four_rank_identity, 4, backend="gloo", timeout=240):
        assert rank == {key: True for name in FOUR_RANKS for key in (name, f"{name} fwd-bwd")}


def test_overlap_refuses_the_all_gather_dispatcher():
    from pylib.ep import ExpertParallelMoE
    from pylib.ep.overlap import moe_steps
    from tests.conftest import seeded_moe

    one = collectives.AxisGroup("ep", (0,), 0, None)
    layer = ExpertParallelMoE(seeded_moe(MoEConfig(n_experts=4, top_k=2, dispatcher="allgather")), one, one, None)
    with pytest.raises(ValueError, match="all-to-all dispatcher.*AllGatherDispatcher"):
        next(moe_steps(layer, torch.zeros(1, 2, 8, dtype=torch.float64)))


def test_in_flight_is_the_intersection_with_the_other_micro_batch_compute():
    from pylib.experiments.ep_overlap import in_flight

    compute = [dict(mb=0, start=0.0, end=1.0), dict(mb=1, start=1.0, end=2.0), dict(mb=0, start=2.0, end=3.0)]
    transfers = [
        dict(mb=0, start=0.9, end=2.1),  # spans B's compute
        dict(mb=1, start=2.0, end=2.5),  # under A's compute
        dict(mb=0, start=2.2, end=2.8),  # only under its own micro-batch's compute
        dict(mb=1, start=0.2, end=0.9),  # under A's compute, before its own
    ]
    assert in_flight(dict(compute=compute, transfers=transfers)) == [True, True, False, True]


def two_micro_batch_timelines() -> dict:
    """A small `ep_overlap_timings(...)["timelines"]`: A's dispatch in flight across B's attention, two ranks."""
    rank = dict(
        compute=[dict(mb=0, name="attn.0", start=0.0, end=0.01), dict(mb=1, name="attn.0", start=0.01, end=0.02)],
        transfers=[dict(mb=0, name="dispatch.0", start=0.009, end=0.021)],
    )
    return {"overlap": [rank, rank], "blocking": [rank, rank]}


@pytest.mark.slow  # matplotlib's first import
def test_the_timeline_figure_names_each_micro_batch_piece_and_is_legible():
    from pylib.viz import style
    from pylib.viz.ep_overlap import ep_overlap_figure

    fig = ep_overlap_figure(two_micro_batch_timelines())
    texts = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert {"Aa0", "Ba0", "Ad0"} <= texts
    assert style.smallest_text_px(fig) >= style.LEGIBLE_PX


def test_a_backward_piece_and_its_all_to_all_are_labelled_with_a_nabla():
    from pylib.ep.overlap import _segment_name
    from pylib.viz.ep_overlap import _label

    assert [_label(0, n) for n in ("grad.out", "grad.experts.1", "grad.attn.0", "grad.dispatch.1")] == [
        "A∇o",
        "A∇e1",
        "A∇a0",
        "A∇d1",
    ]
    assert _label(1, "out") == "" and _label(1, "combine.0") == "Bc0"
    assert _segment_name(None, after="grad.experts.0") == "grad.attn.0" and _segment_name(None, "combine.1") == "out"
