"""The pipeline executor on real gloo ranks: it trains exactly like the reference model, moves the bytes the
formula says, holds the activations the formula says, and runs exactly the schedule's order.

One launch per pipeline size runs every configuration (schedules x microbatch counts, five Adam steps, the
unscaled-loss pitfall, a traced step); the tests below each check one claim on those results.
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from pylib.analysis import pp as A
from pylib.model import build_model, random_tokens
from pylib.plan.presets import tiny_gqa
from pylib.plan.schedules import build
from pylib.pp.executor import Boundary, microbatches, run_pipeline
from pylib.pp.pipeline import PipelineParallel
from pylib.pp.timeline import bubble, peak_in_flight, replay
from pylib.runtime import AxisGroup, Mesh, ParallelConfig, launch, trace
from tests.conftest import assert_float64_close, merge_stage_dicts, one_device_step, pipeline_grads, pipeline_suite

pytestmark = pytest.mark.timeout(180)

CFG = tiny_gqa().with_(n_layers=8)
B, S = 8, 8
STEPS, LR = 5, 1e-2

# (schedule, m, v, group size N); b = 8 is divisible by every m
ONE_STEP = {
    2: [
        ("gpipe", 1, 1, None),
        ("gpipe", 4, 1, None),
        ("1f1b", 2, 1, None),
        ("1f1b", 8, 1, None),
        ("interleaved", 2, 2, None),
        ("interleaved", 4, 4, None),
        ("interleaved", 8, 2, 3),
    ],
    4: [("gpipe", 4, 1, None), ("1f1b", 2, 1, None), ("1f1b", 8, 1, None), ("interleaved", 4, 2, None)],
}
TRAIN = {2: [("gpipe", 2, 1), ("interleaved", 2, 2)], 4: [("1f1b", 4, 1), ("interleaved", 4, 2)]}
BLOCKING = {2: [("1f1b", 4, 1), ("interleaved", 4, 2)], 4: [("gpipe", 2, 1), ("interleaved", 4, 2)]}
PITFALL_M = 4


def _suite(pp):
    """Everything one rank does for the tests of one pipeline size."""
    model = build_model(CFG)
    ids, targets = random_tokens(CFG, B, S, seed=1)
    out = {"one_step": [], "train": [], "runs": []}
    for name, m, v, n in ONE_STEP[pp]:
        pipe = PipelineParallel(model, v=v)
        with trace() as tr:
            run = pipe.step(ids, targets, schedule=name, n_microbatches=m, group_size=n)
        out["one_step"].append((run.loss, pipeline_grads(pipe)))
        events = [(e.op, e.phase, e.payload_bytes, e.bytes_sent, e.bytes_recv, e.peer) for e in tr.events]
        out["runs"].append(dict(run=run, events=events))
    for name, m, v in TRAIN[pp]:
        pipe = PipelineParallel(model, v=v)
        opt = torch.optim.Adam(pipe.parameters(), lr=LR)
        losses = []
        for step in range(STEPS):
            step_ids, step_targets = random_tokens(CFG, B, S, seed=10 + step)
            pipe.zero_grad()
            losses.append(pipe.step(step_ids, step_targets, schedule=name, n_microbatches=m).loss)
            opt.step()
        out["train"].append((losses, {k: p.detach().clone() for k, p in pipe.named_parameters()}))
    out["blocking"] = []
    for name, m, v in BLOCKING[pp]:
        pipe = PipelineParallel(model, v=v)
        run = pipe.step(ids, targets, schedule=name, n_microbatches=m, blocking_sends=True)
        out["blocking"].append((run.loss, pipeline_grads(pipe)))
    pipe = PipelineParallel(model)
    pipe.step(ids, targets, schedule="1f1b", n_microbatches=PITFALL_M, scale_loss=False)
    out["unscaled"] = pipeline_grads(pipe)
    return out


suite = pipeline_suite(_suite)


@pytest.fixture(scope="module")
def reference():
    loss, grads = one_device_step(CFG, B, S)
    model = build_model(CFG)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        step_ids, step_targets = random_tokens(CFG, B, S, seed=10 + step)
        opt.zero_grad()
        step_loss = model.loss(step_ids, step_targets)
        step_loss.backward()
        opt.step()
        losses.append(step_loss.item())
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    return dict(loss=loss, grads=grads, losses=losses, params=params)


def test_pipeline_loss_and_every_gradient_equal_the_reference_for_every_schedule_and_m(suite, reference):
    pp, results = suite
    for i, (name, m, v, n) in enumerate(ONE_STEP[pp]):
        last = results[-1]["one_step"][i][0]  # rank p-1 holds the last stage (v chunks: chunk v-1 of rank p-1)
        assert last == pytest.approx(reference["loss"], abs=1e-12), (name, m, v)
        assert all(r["one_step"][i][0] is None for r in results[:-1])
        grads = merge_stage_dicts([r["one_step"][i][1] for r in results])
        assert set(grads) == set(reference["grads"]), (name, m, v)
        for k, g in reference["grads"].items():
            assert_float64_close(grads[k], g, f"{name} m={m} v={v} N={n}: {k}")


def test_blocking_sends_run_the_same_schedules_without_deadlock_and_with_the_same_gradients(suite, reference):
    pp, results = suite
    for i, (name, m, v) in enumerate(BLOCKING[pp]):
        assert results[-1]["blocking"][i][0] == pytest.approx(reference["loss"], abs=1e-12), name
        grads = merge_stage_dicts([r["blocking"][i][1] for r in results])
        for k, g in reference["grads"].items():
            assert_float64_close(grads[k], g, f"{name} m={m} v={v}: {k}")


def test_five_adam_steps_give_the_reference_parameters(suite, reference):
    pp, results = suite
    for i, (name, _m, _v) in enumerate(TRAIN[pp]):
        assert results[-1]["train"][i][0] == pytest.approx(reference["losses"], abs=1e-10), name
        params = merge_stage_dicts([r["train"][i][1] for r in results])
        for k, p in reference["params"].items():
            torch.testing.assert_close(params[k], p, rtol=0, atol=1e-10, msg=f"{name}: {k}")


def test_unscaled_microbatch_losses_give_gradients_m_times_too_large(suite, reference):
    _, results = suite
    grads = merge_stage_dicts([r["unscaled"] for r in results])
    for k, g in reference["grads"].items():
        torch.testing.assert_close(grads[k], PITFALL_M * g, rtol=0, atol=1e-11, msg=k)
    big = max((grads[k] - g).abs().max().item() for k, g in reference["grads"].items())
    assert big > 1e-3  # not the reference: dividing each microbatch's loss by m is what makes it right


def test_point_to_point_bytes_per_rank_equal_the_traffic_formula(suite):
    pp, results = suite
    nbytes = torch.finfo(torch.float64).bits // 8
    for i, (name, m, v, _n) in enumerate(ONE_STEP[pp]):
        b = B // m
        for r, res in enumerate(results):
            events = res["runs"][i]["events"]
            sends = [e for e in events if e[0] == "send"]
            recvs = [e for e in events if e[0] == "recv"]
            assert {e[2] for e in sends + recvs} <= {A.p2p_message_bytes(b, S, CFG.d_model, nbytes)}
            expected = A.p2p_bytes_per_rank(b, S, CFG.d_model, nbytes, pp, m, r, v)
            assert sum(e[3] for e in sends) == expected == sum(e[4] for e in recvs), (name, m, v, r)
            # half of it activations (forward), half gradients (backward), except on the end stages
            fwd = sum(e[3] for e in sends if e[1] == "forward")
            holds_last = r == pp - 1
            per_chunk = m * A.p2p_message_bytes(b, S, CFG.d_model, nbytes)
            assert fwd == (v - holds_last) * per_chunk, (name, m, v, r)
        total = sum(e[3] for res in results for e in res["runs"][i]["events"] if e[0] == "send")
        assert total == A.p2p_bytes_per_step(b, S, CFG.d_model, nbytes, pp, m, v)


def test_measured_in_flight_microbatches_and_activation_memory_match_the_formulas(suite):
    pp, results = suite
    for i, (name, m, v, n) in enumerate(ONE_STEP[pp]):
        for r, res in enumerate(results):
            run = res["runs"][i]["run"]
            assert run.peak_in_flight == A.peak_in_flight(name, pp, m, r, v, n), (name, m, v, r)
            assert peak_in_flight(run.timeline) == [run.peak_in_flight]
            per_chunk = {c: run.activation_bytes[(0, c)] for c in range(v)}
            if len(set(per_chunk.values())) == 1:  # every chunk of this rank saves the same bytes per microbatch
                assert set(run.activation_bytes.values()) == {per_chunk[0]}
                expected = A.activation_memory(name, pp, m, r, per_chunk[0], v, n)
                assert run.peak_activation_bytes == expected, (name, m, v, r)
            else:  # rank 0 (embedding) or rank p-1 (head and loss) with interleaving: bounded by the extremes
                peak = A.peak_in_flight(name, pp, m, r, v, n)
                assert min(per_chunk.values()) * peak <= run.peak_activation_bytes <= max(per_chunk.values()) * peak
    # the textbook numbers on rank 0: GPipe holds all m microbatches, 1F1B only p (when m >= p)
    first = {(name, m): res["run"].peak_in_flight for (name, m, v, n), res in zip(ONE_STEP[pp], results[0]["runs"])}
    assert first[("gpipe", 4)] == 4
    assert first[("1f1b", 8)] == pp


def test_executor_runs_exactly_the_schedules_action_lists(suite):
    pp, results = suite
    for i, (name, m, v, n) in enumerate(ONE_STEP[pp]):
        sched = build(name, pp, m, v, group_size=n)
        for r, res in enumerate(results):
            ran = [(e.kind, e.mb, e.chunk, e.what, e.peer) for e in res["runs"][i]["run"].timeline]
            assert ran == [(a.op, a.mb, a.chunk, a.what, a.peer) for a in sched[r]], (name, m, v, r)


def test_bubble_of_the_run_replayed_in_logical_time_equals_the_formula(suite):
    pp, results = suite
    for i, (name, m, v, _n) in enumerate(ONE_STEP[pp]):
        timeline = [e for res in results for e in res["runs"][i]["run"].timeline]
        b = bubble(replay(timeline, 1.0, 2.0))
        assert b.relative == pytest.approx([A.bubble_fraction(pp, m, v)] * pp, abs=1e-12), (name, m, v)
        wall = bubble(timeline)  # seconds: noisy on a shared CPU, but a real step has a real bubble
        assert wall.step_time > 0 and all(x > 0 for x in wall.relative)


# ------------------------------------------------------------------------------------------- generic stages


class _Stage(nn.Module):
    """A toy stage whose width changes: stage k maps widths[k] -> widths[k+1]; the last returns an MSE loss."""

    def __init__(self, k, widths, last):
        super().__init__()
        g = torch.Generator().manual_seed(k)
        self.lin = nn.Linear(widths[k], widths[k + 1], dtype=torch.float64)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(self.lin.weight.shape, generator=g, dtype=torch.float64))
            self.lin.bias.copy_(torch.randn(self.lin.bias.shape, generator=g, dtype=torch.float64))
        self.last = last

    def forward(self, x, target=None):
        y = torch.tanh(self.lin(x))
        return ((y - target) ** 2).mean() if self.last else y


WIDTHS = [3, 5, 7, 4, 2]  # 4 virtual stages, each with its own activation width


def _generic(v, name, m):
    rank, p = dist.get_rank(), dist.get_world_size()
    n_stages = p * v
    chunks = [_Stage(c * p + rank, WIDTHS, c * p + rank == n_stages - 1) for c in range(v)]
    x = torch.randn(6, WIDTHS[0], generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    y = torch.randn(6, WIDTHS[-1], generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    run = run_pipeline(
        build(name, p, m, v),
        chunks,
        inputs=list(x.chunk(m)),
        targets=list(y.chunk(m)),
        boundary=Boundary(lambda mb, stage: (6 // m, WIDTHS[stage])),
    )
    return run.loss, {c * p + rank: chunks[c].lin.weight.grad for c in range(v)}


def test_executor_is_generic_over_stage_modules_and_per_stage_activation_shapes():
    stages = [_Stage(k, WIDTHS, k == 3) for k in range(4)]
    x = torch.randn(6, WIDTHS[0], generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    y = torch.randn(6, WIDTHS[-1], generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    h = x
    for s in stages[:-1]:
        h = s(h)
    loss = stages[-1](h, y)
    loss.backward()
    for p, v, name, m in [(2, 2, "interleaved", 2), (4, 1, "1f1b", 3)]:
        results = launch(_generic, p, v, name, m, timeout=60)
        assert results[-1][0] == pytest.approx(loss.item(), abs=1e-12)
        grads = merge_stage_dicts([r[1] for r in results])
        for k, s in enumerate(stages):
            assert_float64_close(grads[k], s.lin.weight.grad)


def test_executor_names_what_is_missing():
    sched = build("1f1b", 2, 4)
    pp_group = AxisGroup("pp", (0, 1), 0, None)  # checked before any communication
    with pytest.raises(ValueError, match="p=2 ranks but the pipeline group has 3"):
        run_pipeline(sched, [nn.Linear(2, 2)], Boundary((1, 2)), group=AxisGroup("pp", (0, 1, 2), 0, None))
    with pytest.raises(ValueError, match="v=1 chunks per rank but this rank holds 2"):
        run_pipeline(sched, [nn.Linear(2, 2)] * 2, Boundary((1, 2)), group=pp_group)
    with pytest.raises(ValueError, match="first stage and needs m=4 microbatch inputs"):
        run_pipeline(sched, [nn.Linear(2, 2)], Boundary((1, 2)), group=pp_group, inputs=[torch.zeros(1, 2)] * 3)
    with pytest.raises(ValueError, match="m=5 microbatches do not divide the batch size b=12"):
        microbatches(torch.zeros(12, 3), 5)


def _two_pipelines():
    mesh = Mesh(ParallelConfig(dp=2, pp=2))
    ids, targets = random_tokens(CFG, 4, S, seed=100 + mesh.dp.rank)  # each data-parallel replica its own batch
    pipe = PipelineParallel(build_model(CFG), group=mesh.pp, v=2)
    run = pipe.step(ids, targets, schedule="interleaved", n_microbatches=2)
    peers = {e.peer for e in run.timeline if e.peer is not None}
    grads = pipeline_grads(pipe)
    return mesh.dp.rank, mesh.pp.ranks, run.loss, grads, peers, mesh.pp.rank


@pytest.mark.slow
def test_two_pipelines_side_by_side_on_a_mesh_each_match_the_reference_on_their_batch():
    results = launch(_two_pipelines, 4, timeout=60)
    for d in range(2):
        ref = build_model(CFG)
        ids, targets = random_tokens(CFG, 4, S, seed=100 + d)
        loss = ref.loss(ids, targets)
        loss.backward()
        mine = [r for r in results if r[0] == d]
        assert {r[1] for r in mine} == {(d, d + 2)}  # Megatron's layout: pp groups [0, 2] and [1, 3]
        assert [r[2] for r in mine if r[2] is not None] == [pytest.approx(loss.item(), abs=1e-12)]
        assert all(r[4] == {1 - r[5]} for r in mine)  # peers are named by their index in the pp group
        grads = merge_stage_dicts([r[3] for r in mine])
        for k, p in ref.named_parameters():
            assert_float64_close(grads[k], p.grad, k)


def _loose_interleaved():
    from pylib.pp.split import rank_chunks

    rank, p = dist.get_rank(), dist.get_world_size()
    ids, targets = random_tokens(CFG, 6, S, seed=4)
    sched = build("interleaved", p, 3, 2, group_size=2, strict=False)  # m % N = 1 < p: Megatron rejects it
    chunks = rank_chunks(build_model(CFG), rank, p, 2)
    run = run_pipeline(
        sched, chunks, Boundary((2, S, CFG.d_model)), inputs=microbatches(ids, 3), targets=microbatches(targets, 3)
    )
    return run.loss, {k: q.grad for c in chunks for k, q in c.named_parameters()}


def test_an_interleaved_order_megatron_rejects_still_trains_like_the_reference():
    ref = build_model(CFG)
    ids, targets = random_tokens(CFG, 6, S, seed=4)
    loss = ref.loss(ids, targets)
    loss.backward()
    results = launch(_loose_interleaved, 2, timeout=60)
    assert results[-1][0] == pytest.approx(loss.item(), abs=1e-12)
    grads = merge_stage_dicts([r[1] for r in results])
    for k, q in ref.named_parameters():
        assert_float64_close(grads[k], q.grad, k)


def _both_send_first(n):
    from pylib.runtime import collectives as C

    other = 1 - dist.get_rank()
    C.send(torch.zeros(n, dtype=torch.float64), other)  # both ranks send first (the executor's blocking_sends=True)
    C.recv(torch.empty(n, dtype=torch.float64), other)


@pytest.mark.slow
def test_a_blocking_gloo_send_waits_for_its_receiver_even_for_a_tiny_message():
    # the rendezvous semantics `simulate(..., sends="rendezvous")` models: two ranks that both send first hang
    from pylib.runtime import LaunchTimeout

    with pytest.raises(LaunchTimeout, match=r"ranks \[0, 1\] never returned"):
        launch(_both_send_first, 2, 2, backend="gloo", timeout=3)


_C10D = ("all_reduce", "all_gather_into_tensor", "all_gather", "broadcast", "barrier", "send", "recv", "isend", "irecv")


def _calls_per_step():
    """One 1F1B step (m = 4) per (recorder, check): the torch.distributed calls it made, by name, and what it
    returned: the losses, the gradients, the timeline's length, the traced ops."""
    from pylib.pp.recorder import PipelineRecorder
    from pylib.runtime import agreement_check

    model = build_model(CFG)
    ids, targets = random_tokens(CFG, B, S, seed=1)
    calls = {}
    for name in _C10D:
        real = getattr(dist, name)

        def counted(*args, _real=real, _name=name, **kw):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*args, **kw)

        setattr(dist, name, counted)
    out = {}
    for timeline in (True, False):
        for check in (True, False):
            pipe = PipelineParallel(model)
            pipe.zero_grad()  # the chunks share the model's parameters: each step's gradients from zero
            calls.clear()
            with agreement_check(check), trace() as tr:
                run = pipe.step(ids, targets, n_microbatches=4, recorder=PipelineRecorder(record_timeline=timeline))
            grads = {k: p.grad.clone() for k, p in pipe.named_parameters()}
            ops = [(e.op, e.phase) for e in tr.events]
            out[timeline, check] = dict(calls=dict(calls), losses=run.losses, grads=grads, n=len(run.timeline), ops=ops)
    return out


def test_a_step_makes_one_collective_for_its_check_and_one_for_its_timeline_and_none_else():
    """What a step costs beyond its sends and receives (torch's Schedule1F1B makes only those): the agreement
    check's one all-reduce in the first step (the later step with the same schedule and shapes is predicted: no
    communication), and the recorder's time origin (a traced one-element all-reduce, itself unchecked) only when a
    timeline is recorded. Switching either off changes no loss, no gradient bit and no traced byte of the data."""
    for rank, out in enumerate(launch(_calls_per_step, 2, timeout=60)):
        for (timeline, check), got in out.items():
            calls = dict(got["calls"])
            # rank 0 posts 4 activations and 4 receives of gradients; rank 1 the other way round
            p2p = {k: calls.pop(k) for k in ("send", "recv", "isend", "irecv") if k in calls}
            assert p2p == {"isend": 4, "irecv": 4}, (rank, timeline, check, p2p)
            first = (timeline, check) == (True, True)  # the steps run in out's order: this one checks, not later ones
            collectives = int(timeline) + int(check and first)
            assert calls == ({"all_reduce": collectives} if collectives else {}), (rank, timeline, check, calls)
            assert got["n"] == (16 if timeline else 0)
            base = out[True, True]
            assert got["losses"] == base["losses"]
            assert all(torch.equal(got["grads"][k], g) for k, g in base["grads"].items())
            sync = [("all_reduce", "pp-sync")] if timeline else []
            assert [o for o in got["ops"] if o[0] == "all_reduce"] == sync
            assert [o for o in got["ops"] if o[0] != "all_reduce"] == [o for o in base["ops"] if o[0] != "all_reduce"]
