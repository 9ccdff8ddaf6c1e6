"""ZB-V (Qi et al., Section 6): two chunks per rank in the V placement, as schedule data run by the one executor
and the one simulator. The pure part (no process): the placement, the bubble and the activations in flight against
the paper's claims for p up to 8, deadlock freedom for every p, m in a range under both send semantics and unequal
real costs, and the bad input named. The launched part (slow): real gloo ranks, p = 2 and 4, ZB-V, DualPipeV,
V-Half and V-Min (same V; their pure part: tests/test_pp_vhalf.py), the loss and every gradient of the
single-device reference in float64, the same bits as 1F1B's."""

import functools

import pytest
import torch

from pylib.analysis import pp as A
from pylib.model import build_model, random_tokens
from pylib.plan.presets import tiny_gqa
from pylib.plan.schedules import CONTROLLED, ScheduleError, build, rank_stage, stage_ranks, zb_v
from pylib.pp.pipeline import PipelineParallel
from pylib.pp.simulate import simulate
from pylib.pp.split import rank_chunks
from pylib.pp.timeline import bubble, peak_in_flight, replay
from tests.conftest import assert_float64_close, merge_stage_dicts, one_device_step, pipeline_grads, pipeline_suite

pytestmark = pytest.mark.timeout(180)

SWEEP = [(p, m) for p in (2, 3, 4, 8) for m in sorted({p, p + 1, 2 * p - 2, 2 * p - 1, 2 * p, 2 * p + 3}) if m >= p]


@functools.cache
def _zb_v(p, m):
    return zb_v(p, m)


@functools.cache
def _unit_timeline(p, m):
    return simulate(_zb_v(p, m), 1.0, 1.0, cost_w=1.0)


def test_the_v_puts_stage_r_and_stage_2p_minus_1_minus_r_on_rank_r_and_the_loss_on_rank_0():
    for p in (1, 2, 3, 4, 8):
        ranks = stage_ranks(p, 2, "v")
        assert ranks == tuple(range(p)) + tuple(reversed(range(p)))
        assert ranks[0] == ranks[-1] == 0  # the embedding and the loss on one rank
        assert all(rank_stage(r, c, p, "v") // p == c for r in range(p) for c in (0, 1))  # chunk = stage // p
    assert stage_ranks(4, 2) == (0, 1, 2, 3, 0, 1, 2, 3)  # the loop (interleaved) placement as it was


def test_zb_v_has_no_bubble_at_equal_costs_once_m_reaches_2p_minus_1_and_2p_minus_1_minus_m_units_before():
    # the busiest rank's idle time inside its own span, at T_F = T_B = T_W = 1 (the paper's condition)
    for p, m in SWEEP:
        own = max(bubble(_unit_timeline(p, m)).own_idle)
        assert own == max(2 * p - 1 - m, 0), (p, m)
        if m >= 2 * p - 1:
            assert A.split_bubble_time("zb-v", p, 1.0, 1.0, 1.0) == own == 0


def test_zb_v_holds_2p_chunk_activations_on_every_rank_which_is_p_stages_of_1f1b():
    # a chunk holds L/(2p) layers, half of a 1F1B stage: 2p chunk activations are 1F1B's rank-0 peak of p stages
    for p, m in SWEEP:
        peaks = peak_in_flight(_unit_timeline(p, m))
        assert [A.peak_in_flight("zb-v", p, m, r, 2) for r in range(p)] == peaks, (p, m)
        if m >= 2 * p - 1:
            assert peaks == [2 * p] * p, (p, m)
            assert max(peaks) / 2 == max(A.peak_in_flight("1f1b", p, m, r) for r in range(p))


def test_zb_v_messages_never_deadlock_for_any_p_m_semantics_or_real_costs():
    # the placement is computed at unit costs; blocking (rendezvous) and posted (eager) sends, and real costs that
    # differ from the placement's, must all run the lists to the end
    for p, m in SWEEP:
        sched = _zb_v(p, m)
        for sends in ("rendezvous", "eager"):
            for costs in ((1.0, 2.0, 0.5), (3.0, 1.0, 2.0)):  # the placement's own (1, 1, 1): the other tests
                simulate(sched, costs[0], costs[1], sends=sends, cost_w=costs[2])


def test_zb_v_turn_of_the_v_is_handed_over_in_memory_and_every_other_boundary_is_a_message():
    p, m = 4, 8
    sched = _zb_v(p, m)
    comm = [(r, a) for r in range(p) for a in sched[r] if a.is_comm]
    # 2p-1 boundaries, one of them (stages p-1 -> p) inside rank p-1: 2(2p-2) messages per microbatch, each both ways
    assert len([x for x in comm if x[1].op == "send"]) == 2 * (2 * p - 2) * m
    assert not any(a.message()[2:] in ((p - 1, p), (p, p - 1)) for _, a in comm)
    assert all(abs(r - a.peer) == 1 for r, a in comm)  # only neighbours talk
    sends = len([x for x in comm if x[1].op == "send"])
    assert A.p2p_bytes_per_step(1, 8, 16, 8, p, m, 2, placement="v") == sends * A.p2p_message_bytes(1, 8, 16, 8)
    assert A.p2p_bytes_per_step(1, 8, 16, 8, p, m, 2, placement="v") == 2 * A.p2p_bytes_per_step(1, 8, 16, 8, p, m)


def test_zb_v_actions_are_each_chunks_f_b_w_in_microbatch_order():
    for p, m in SWEEP:
        sched = _zb_v(p, m)
        for r in range(p):
            for c in (0, 1):
                for op in "FBW":
                    mbs = [a.mb for a in sched.compute(r) if a.op == op and a.chunk == c]
                    assert mbs == list(range(m)), (p, m, r, c, op)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(p=4, n_microbatches=3, v=2), r"zb-v needs m >= p microbatches: m=3, p=4"),
        (dict(p=4, n_microbatches=8, v=1), r"zb-v runs two chunks per rank in a V .* v must be 2, got v=1"),
        (dict(p=2, n_microbatches=4, v=2, group_size=2), r"group_size applies to the interleaved schedule only"),
    ],
)
def test_zb_v_refuses_sizes_it_cannot_run_naming_the_constraint(kw, message):
    with pytest.raises(ScheduleError, match=message):
        build("zb-v", **kw)


def test_the_v_refuses_a_layer_count_it_cannot_cut_before_any_rank_starts():
    model = build_model(tiny_gqa().with_(n_layers=6))
    with pytest.raises(ValueError, match=r"n_layers=6 into 2p = 4 stages .* a multiple of 4"):
        rank_chunks(model, 0, 2, 2, placement="v")
    odd = build_model(tiny_gqa().with_(n_layers=5))
    with pytest.raises(ValueError, match="odd layer count"):
        rank_chunks(odd, 0, 1, 2, placement="v")
    with pytest.raises(ValueError, match="v must be 2, got v=3"):
        rank_chunks(model, 0, 1, 3, placement="v")
    tied = build_model(tiny_gqa().with_(n_layers=8, tie_embeddings=True))
    with pytest.raises(ValueError, match="tie_embeddings=True with the V placement"):
        rank_chunks(tied, 0, 2, 2, placement="v")


# --------------------------------------------------------------------------------------------- on real ranks
# One launch per p runs ZB-V, DualPipeV and DualPipe (tests/test_pp_dualpipe.py holds their pure part) and a 1F1B
# baseline with the same microbatches.

CFG = tiny_gqa().with_(n_layers=8)
B, S = 8, 8
RUNS = {
    2: [("1f1b", 4), ("zb-v", 4), ("dualpipev", 4), ("dualpipe", 4), ("v-half", 4), ("v-min", 4)],
    4: [("1f1b", 8), ("zb-v", 4), ("zb-v", 8), ("dualpipev", 8), ("dualpipe", 8), ("v-half", 8), ("v-min", 2)],
}
PLACEMENT = {"1f1b": "loop", "zb-v": "v", "dualpipev": "v", "dualpipe": "dual", "v-half": "v", "v-min": "v"}


def _suite(pp):
    model = build_model(CFG)
    ids, targets = random_tokens(CFG, B, S, seed=1)
    out = []
    for name, m in RUNS[pp]:
        v = 1 if name == "1f1b" else 2
        pipe = PipelineParallel(model, v=v, placement=PLACEMENT[name])
        run = pipe.step(ids, targets, schedule=name, n_microbatches=m)
        grads = pipeline_grads(pipe)
        if name == "dualpipe":  # two copies of every parameter: keep them apart, by chunk
            grads = {(c, k): q.grad for c, chunk in enumerate(pipe.chunks) for k, q in chunk.named_parameters()}
        out.append((run, grads))
    return out


suite = pipeline_suite(_suite)


@pytest.fixture(scope="module")
def reference():
    return one_device_step(CFG, B, S)


def test_v_schedules_on_gloo_ranks_give_the_reference_loss_every_gradient_and_1f1b_bits(suite, reference):
    # each chunk runs its W's in microbatch order, as 1F1B runs its backwards: the same sums in the same order
    pp, results = suite
    loss, grads = reference
    base = merge_stage_dicts([r[0][1] for r in results])
    for i, (name, m) in enumerate(RUNS[pp]):
        if name == "dualpipe":
            continue  # two copies of each parameter: test_dualpipe_on_gloo_ranks_...
        holder = pp - 1 if name == "1f1b" else 0  # the V's loss is on rank 0
        assert results[holder][i][0].loss == pytest.approx(loss, abs=1e-12), (name, m)
        assert all(res[i][0].loss is None for r, res in enumerate(results) if r != holder)
        mine = merge_stage_dicts([r[i][1] for r in results])
        assert set(mine) == set(grads)
        for k, g in grads.items():
            assert_float64_close(mine[k], g, f"{name} p={pp} m={m}: {k}")
        if m == RUNS[pp][0][1]:
            assert all(torch.equal(mine[k], g) for k, g in base.items()), name


def test_executor_runs_the_v_action_lists_with_the_activations_and_bubble_they_promise(suite):
    # ZB-V: 2p chunks in flight, no bubble once m >= 2p-1; DualPipeV: 2p+1, DeepSeek's bubble at unit costs;
    # V-Half and V-Min: the simulator's bubble for the same lists
    pp, results = suite
    for i, (name, m) in enumerate(RUNS[pp]):
        if name in ("1f1b", "dualpipe"):
            continue
        sched = build(name, pp, m, 2)
        for r, res in enumerate(results):
            run = res[i][0]
            assert [(e.kind, e.mb, e.chunk, e.what, e.peer) for e in run.timeline] == [
                (a.op, a.mb, a.chunk, a.what, a.peer) for a in sched[r]
            ], (name, m, r)
            assert run.peak_in_flight == peak_in_flight(simulate(sched, 1.0, 1.0, cost_w=1.0))[r]
        timeline = [e for res in results for e in res[i][0].timeline]
        own = max(bubble(replay(timeline, 1.0, 1.0, 1.0)).own_idle)
        if name == "zb-v":
            assert own == max(2 * pp - 1 - m, 0), m
        elif name in CONTROLLED:  # tests/test_pp_vhalf.py holds the simulator's numbers against the paper's
            assert own == max(bubble(simulate(sched, 1.0, 1.0, cost_w=1.0)).own_idle), (name, m)
        else:
            assert own == A.split_bubble_time(name, pp, 1.0, 1.0, 1.0)
            assert {res[i][0].peak_in_flight for res in results} == {2 * pp + 1}


def test_dualpipe_on_gloo_ranks_gives_the_reference_loss_and_every_gradient_in_both_copies(suite, reference):
    # each end rank holds one copy's half of the losses (mb 0..m/2-1 on rank p-1, m/2..m-1 on rank 0); each
    # parameter lives twice, on rank r (chunk 0) and rank p-1-r (chunk 1), both with the sum of the two halves
    pp, results = suite
    loss, grads = reference
    i, (_, m) = next((i, x) for i, x in enumerate(RUNS[pp]) if x[0] == "dualpipe")
    halves = [results[r][i][0] for r in (pp - 1, 0)]
    assert [len(h.losses) for h in halves] == [m // 2, m // 2]
    assert (halves[0].loss + halves[1].loss) / 2 == pytest.approx(loss, abs=1e-12)
    assert all(res[i][0].loss is None for res in results[1:-1])
    copies: dict[str, list] = {}
    for res in results:
        for (_, k), g in res[i][1].items():
            copies.setdefault(k, []).append(g)
    assert set(copies) == set(grads) and {len(c) for c in copies.values()} == {2}  # two parameter copies
    for k, (a, b) in copies.items():
        assert torch.equal(a, b), k  # a + b = b + a: the copies stay equal bit for bit
        assert_float64_close(a, grads[k], f"dualpipe p={pp} m={m}: {k}")


def test_executor_runs_dualpipes_lists_with_p_plus_1_activations_and_deepseeks_bubble(suite):
    pp, results = suite
    i, (name, m) = next((i, x) for i, x in enumerate(RUNS[pp]) if x[0] == "dualpipe")
    sched = build(name, pp, m, 2)
    for r, res in enumerate(results):
        run = res[i][0]
        assert [(e.kind, e.mb, e.chunk, e.what, e.peer) for e in run.timeline] == [
            (a.op, a.mb, a.chunk, a.what, a.peer) for a in sched[r]
        ], r
        assert run.peak_in_flight == pp + 1  # DeepSeek's PP+1, PP = p stages
    own = max(bubble(replay([e for res in results for e in res[i][0].timeline], 1.0, 1.0, 1.0)).own_idle)
    assert own == A.dualpipe_bubble(pp, 3.0, 2.0, 1.0)  # F&B back to back on a CPU: T_F + T_B + T_W
