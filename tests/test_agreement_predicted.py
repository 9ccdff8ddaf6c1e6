"""Predicted calls (issue 30): a group's ranks learn the order of their collectives and stop checking a call the
verified history predicts, with the same guarantee -- a rank whose call differs is named before data moves."""

import random
import time

import pytest
import torch
import torch.distributed as dist

from pylib.runtime import RankFailedError, launch
from pylib.runtime import agreement as A
from pylib.runtime import collectives as C
from tests.conftest import value_error_message as _message

STEP = 0.2  # seconds an odd rank waits at the store here (the default is 30 s)


def _replay(keys, p=None) -> list[str]:
    """A predictor (a new one by default) fed `keys` as every rank would see them: 'hit' (no communication), 'check'
    (steps 1-2) or 'meet' (every rank changed together: the store rendezvous, then steps 1-2)."""
    p, out = A._Predictor() if p is None else p, []
    for key in keys:
        expected = p.expected()
        if expected == key:
            p.hit(key)
            out.append("hit")
        else:
            out.append("check" if expected is None else "meet")
            p.checked_call(key)
    return out


@pytest.mark.parametrize("prologue", [[], ["init"], ["init", "ar"]])
def test_a_repeating_step_is_checked_while_learned_then_never_even_with_identical_layers(prologue):
    layer = ["ag", "rs", "ag", "rs"]  # TP+SP: the same all-gather and reduce-scatter in every layer
    step = ["ar"] + layer * 4 + ["ar", "ar"] + layer * 4 + ["ar"]  # the same all-reduce key in other places too
    seen = _replay(prologue + step * 5)
    laps = [seen[len(prologue) + k * len(step) :][: len(step)] for k in range(5)]
    assert laps[0].count("hit") < len(step)  # learning
    assert laps[2:] == [["hit"] * len(step)] * 3  # from the third step on: no communication at all
    assert sum(lap.count("meet") for lap in laps) <= 6  # the wrong guesses of the first steps, every rank alike


def _per_step(seen, step: int, prologue: int = 0) -> list[tuple[int, int]]:
    """(calls that communicated to check, store rendezvous among them) in each step of `step` calls."""
    laps = [seen[k : k + step] for k in range(prologue, len(seen), step)]
    return [(sum(s != "hit" for s in lap), lap.count("meet")) for lap in laps]


# The EP group's order in one step of `pylib.ep.overlap` (2 MoE layers, two micro-batches interleaved, ep=2), as
# real ranks made it: a = the splits exchange (all_to_all_rows of (2,)), b = the rows' async all-to-all (16,).
EP_OVERLAP_STEP = list("ababbbababbbbbbbbbbb")


def test_the_ep_overlap_step_is_learned_in_two_steps_then_costs_nothing():
    """The lap from a key's first occurrence never locked on this step: 14 checked calls and 14 rendezvous in every
    step. The earlier occurrence with the longest matching context locks on it in its second step."""
    per = _per_step(_replay(EP_OVERLAP_STEP * 6), len(EP_OVERLAP_STEP))
    assert per[2:] == [(0, 0)] * 4, per
    assert sum(n for n, _ in per) <= 12 and sum(m for _, m in per) <= 8, per


@pytest.mark.parametrize("n_layers", [4, 32, 96])
def test_a_deep_step_of_identical_layers_is_learned_in_two_steps_whatever_its_depth(n_layers):
    """TP+SP, every layer the same all-gather / reduce-scatter pair twice, after a two-call prologue: the lap from a
    key's first occurrence met once per few layers while learning (49 rendezvous at 96 layers); a layer's lap locked
    inside the run is put back in full when it breaks, so the history keeps measuring the step."""
    layer = ["ag", "rs", "ag", "rs"]
    step = ["ar"] + layer * n_layers + ["ar", "ar"] + layer * n_layers + ["ar"]
    per = _per_step(_replay(["init", "ar"] + step * 5), len(step), prologue=2)
    assert per[2:] == [(0, 0)] * 3, per
    assert sum(n for n, _ in per) <= 6 and sum(m for _, m in per) <= 3, per


# Orders real gloo ranks made (2 to 4 ranks), one step each: r = reduce-scatter, g = all-gather, m / s = the loss's
# all-reduces (max, sum) of (b, s), A = an all-reduce of the activations (plain TP) or of gradients (composed), x / y
# = the MoE's all-to-alls of the splits / rows; then (checked calls, rendezvous among them) in all, as the module
# docstring cites them (the lap from a key's first occurrence: 7 (3), 12 (7), 12 (6), 15 (7)).
RECORDED = {
    "1-layer TP (one all-reduce key ends the embedding, the attention and the MLP)": ("AAAmssAAA", (9, 5)),
    "4-layer TP+SP": ("rgrgrgrgrgrgrgrgrgmssrgrgrgrgrgrgrgrgrg", (10, 5)),
    "tp=2 dp=2 with SP, its TP group": ("rgrgrgrgrgmssrgrgrgrgrgA", (9, 3)),
    "tp=2 ep=2 dp=2 with SP, a dense and an MoE layer (layers that differ), its TP (= EP) group": (
        "rgrgrgrxyygmssryygrgrgrgA",
        (16, 8),
    ),
}


@pytest.mark.parametrize("name", list(RECORDED))
def test_recorded_steps_are_learned_in_two_steps(name):
    order, in_all = RECORDED[name]
    step = list(order)
    per = _per_step(_replay(step * 5), len(step))
    assert per[2:] == [(0, 0)] * 3, per
    assert (sum(n for n, _ in per), sum(m for _, m in per)) == in_all, per


def test_training_and_evaluation_in_turn_lock_on_the_whole_cycle_before_the_history_fills():
    """100 training steps then 10 evaluation steps (forward only), over and over: 2-layer TP+SP orders as real
    ranks made them. The rule before checked 85 calls every cycle and its history was full in the 28th cycle (after
    which every call is checked); this one locks on the whole cycle."""
    train, evaluate = list("rgrgrgrgrgmssrgrgrgrgrg"), list("rgrgrgrgrgmss")
    cycle = train * 100 + evaluate * 10
    p = A._Predictor()
    per = [_replay(cycle, p).count("hit") for _ in range(20)]
    assert per[-3:] == [len(cycle)] * 3 and len(p.tape) < A._MAX_TAPE // 2, (per, len(p.tape))


def test_a_run_of_one_call_after_a_one_off_call_locks():
    """The lap from the first occurrence predicted the one-off call after every call of the run, forever."""
    seen = _replay(["x", "y"] + ["x"] * 30)
    assert seen[-25:] == ["hit"] * 25 and seen.count("meet") <= 2, seen


def _random_step(rng) -> list[str]:
    """A step over 2 to 5 keys: half of them layered (a head, a layer repeated 1 to 12 times, a tail, maybe the
    backward in reverse), half any order of 3 to 40 calls."""
    keys = "abcde"[: rng.randint(2, 5)]
    if rng.random() < 0.5:
        return [rng.choice(keys) for _ in range(rng.randint(3, 40))]
    head, layer, tail = ([rng.choice(keys) for _ in range(rng.randint(lo, hi))] for lo, hi in ((0, 3), (1, 4), (0, 3)))
    n = rng.randint(1, 12)
    step = head + layer * n + tail
    return step + layer[::-1] * n + head[::-1] if rng.random() < 0.5 else step


def test_random_repeating_steps_all_lock_within_five_steps():
    """The lap from a key's first occurrence had not locked by the sixth step in 61 of these 300 (a run of one key
    after a one-off call, for one, never locks on it)."""
    rng = random.Random(1)
    for _ in range(300):
        step = _random_step(rng)
        prologue = [rng.choice("abcdefz") for _ in range(rng.randint(0, 3))]
        seen = _replay(prologue + step * 7)
        assert seen[len(prologue) + 5 * len(step) :] == ["hit"] * 2 * len(step), (prologue, step)


def _brute_longest_context(tape) -> int:
    """The definition: of the earlier occurrences e of the last key, the one whose calls up to e match the tape's
    calls up to its end for the longest stretch; ties to the earliest."""
    x = len(tape) - 1

    def context(e):
        k = 0
        while k <= e and tape[e - k] == tape[x - k]:
            k += 1
        return k

    return min((e for e in range(x) if tape[e] == tape[x]), key=lambda e: (-context(e), e))


def test_the_lap_starts_at_the_earlier_occurrence_with_the_longest_context_ties_to_the_earliest():
    rng = random.Random(0)
    tried = 0
    for _ in range(400):
        tape = [rng.choice("abc"[: rng.randint(1, 3)]) for _ in range(rng.randint(2, 40))]
        if tape[-1] not in tape[:-1]:
            continue
        p = A._Predictor()
        for key in tape:
            p._append(key)
        assert p._longest_context() == _brute_longest_context(tape), tape
        tried += 1
    assert tried > 300


def test_a_lock_broken_soon_puts_back_every_call_it_predicted_and_one_held_long_keeps_a_lap():
    short = ["ar"] + ["ag", "rs"] * 20 + ["ar"]  # lap 2 locks inside the run and breaks at its end
    p = A._Predictor()
    _replay(short, p)
    assert p.tape == short  # the history is the order the ranks made, the run's length included
    long = ["ag", "rs"] * (A._HOLD + 10) + ["ar"]  # held past _HOLD calls: whole laps are left out
    p = A._Predictor()
    seen = _replay(long, p)
    assert seen[-1] == "meet" and len(p.tape) < 10, len(p.tape)


def test_a_change_every_rank_makes_together_is_checked_then_learned_again():
    seen = _replay(["a", "b"] * 4 + ["a", "c"] * 4)
    assert seen[:8] == ["check", "check", "check", "hit", "hit", "hit", "hit", "hit"]
    assert seen[9] == "meet" and seen[-4:] == ["hit"] * 4  # "c" where "b" was verified: met, checked, learned


def test_a_full_tape_keeps_its_later_half_and_the_predictor_goes_on_learning(monkeypatch):
    monkeypatch.setattr(A, "_MAX_TAPE", 16)
    p, seen, longest = A._Predictor(), [], 0
    for key in [str(k) for k in range(40)] + ["0", "1"] * 6 + ["x", "y", "z"] * 8:
        if p.expected() == key:
            p.hit(key)
            seen.append("hit")
        else:
            seen.append("check")
            p.checked_call(key)
        longest = max(longest, len(p.tape))
        assert p.codes == [p.first[k] for k in p.tape] and all(p.tape[i] == k for k, i in p.first.items())
    assert longest <= 16  # never more than the tape holds
    assert seen[:43] == ["check"] * 43  # 40 new calls; the first "0" and "1" were cut with the tape's older half
    assert seen[43:52] == ["hit"] * 9  # then learned again: a lap of 2, and past the next cuts a lap of 3
    assert seen[52:56] == ["check"] * 4 and seen[56:] == ["hit"] * 20


def test_a_run_that_switches_forever_keeps_a_bounded_history_and_few_checks_a_cycle(monkeypatch):
    """Training steps then evaluation steps, 40 times, on a history of 512 calls, shorter than one cycle (1,080):
    it fills again and again and is cut each time, and every cycle still checks only the calls around its two
    switches (a full history that stopped predicting would check all 1,080)."""
    monkeypatch.setattr(A, "_MAX_TAPE", 512)
    train = ["ar"] + ["ag", "rs"] * 4 + ["ar", "ar"] + ["ag", "rs"] * 4 + ["ar"]
    evaluate = ["ar", "ag2", "rs2", "ag2", "rs2", "ar"]
    p, per, longest = A._Predictor(), [], 0
    for _ in range(40):
        before = p.checked
        for key in train * 50 + evaluate * 5:
            if p.expected() == key:
                p.hit(key)
            else:
                p.checked_call(key)
            longest = max(longest, len(p.tape))
        per.append(p.checked - before)
    assert longest == 512 and max(per[1:]) <= 10, per


def test_prediction_timeout_takes_seconds_and_restores_the_previous_value():
    with A.prediction_timeout(2):
        assert A._setting.timeout == 2.0
    assert A._setting.timeout == 30.0
    for bad in (0, -1, True, "1"):
        with pytest.raises(ValueError, match="seconds > 0"):
            A.prediction_timeout(bad)


def _loop(n=3):
    """A two-call step on the world group, n times: learned and locked."""
    for _ in range(n):
        C.all_reduce_(torch.ones(4))
        C.all_gather_tensor(torch.ones(2, 3), dim=-1)


def _odd_rank(swap: bool):
    _loop()
    if dist.get_rank() == 2:  # the odd rank: another call where the verified order makes the all-reduce
        with A.prediction_timeout(STEP):
            t0 = time.monotonic()
            try:
                if swap:  # two calls swapped: the all-gather first
                    C.all_gather_tensor(torch.ones(2, 3), dim=-1)
                else:
                    C.all_reduce_(torch.ones(4, dtype=torch.int32))
            except ValueError as exc:
                raise ValueError(f"{exc} [after {time.monotonic() - t0:.2f} s]") from None
    C.all_reduce_(torch.ones(4))
    C.all_gather_tensor(torch.ones(2, 3), dim=-1)


@pytest.mark.parametrize("swap", [False, True])
def test_a_rank_whose_call_differs_from_the_verified_order_names_itself_and_the_run_ends(swap):
    with pytest.raises(RankFailedError) as failed:
        launch(_odd_rank, 3, swap, timeout=30)
    assert failed.value.rank == 2
    message = str(failed.value)
    call = "all_gather(dim=1, float32 (2, 3))" if swap else "all_reduce(reduce_op='sum', int32 (4,))"
    assert f"rank 2 calls {call} where the group's verified order calls all_reduce(reduce_op='sum', float32 (4,))" in (
        message
    )
    assert "after all_gather(dim=1, float32 (2, 3)); the other ranks did not come to re-check within 0.2 s" in message
    waited = float(message.rsplit("[after ", 1)[1].split(" s]")[0])
    assert STEP <= waited < STEP + 2  # named once the timeout passed, not at gloo's


def _ep_overlap_steps(steps: int) -> list[int]:
    """`pylib.ep.overlap`'s interleaved step on 2 ranks (2 MoE layers, two micro-batches, ep=2): the calls checked
    and the store rendezvous of each step, over every group."""
    from pylib.ep.overlap import ExpertParallelStack, interleave
    from pylib.model import build_model
    from pylib.plan.config import MoEConfig
    from pylib.plan.presets import tiny
    from pylib.runtime import Mesh, ParallelConfig

    mesh = Mesh(ParallelConfig(dp=2, ep=2))
    cfg = tiny().with_(n_layers=2, moe=MoEConfig(n_experts=4, top_k=2, every=1))
    stack = ExpertParallelStack(build_model(cfg).layers, ep_group=mesh.ep)
    out = []
    for step in range(steps):
        g = torch.Generator().manual_seed(step + dist.get_rank())  # another routing on every step and rank
        xs = [torch.randn(2, 8, cfg.d_model, generator=g, dtype=torch.float64).requires_grad_() for _ in range(2)]
        before = sum(p.checked + p.rounds for p in A._PREDICTORS.values())
        ys = interleave([stack.steps(x) for x in xs], overlap=True)
        (ys[0].square().sum() + ys[1].square().sum()).backward()
        out.append(sum(p.checked + p.rounds for p in A._PREDICTORS.values()) - before)
    return out


@pytest.mark.slow
def test_the_ep_overlap_step_on_real_ranks_stops_checking_after_two_steps():
    for per_step in launch(_ep_overlap_steps, 2, 4, timeout=60):
        assert per_step[0] > 0 and per_step[2:] == [0, 0], per_step  # before: 28 (14 checked, 14 met) every step


def _all_change():
    r = dist.get_rank()
    _loop()
    state = A._predictor(C.resolve_group(None))
    before = (state.checked, state.rounds)
    _loop(1)
    locked = (state.checked, state.rounds) == before  # the third lap and this one: no communication
    out = {"locked costs nothing": locked}
    x = C.all_reduce_(torch.ones(6))  # every rank: a new shape where the verified order has (4,)
    out["changed together"] = (x.tolist() == [3.0] * 6, state.rounds - before[1])
    out["then checked"] = _message(lambda: C.all_gather_tensor(torch.ones(2, 3 + r), dim=0))
    return out


def test_ranks_that_change_together_meet_and_go_on_and_the_new_calls_are_checked_again():
    outs = launch(_all_change, 3, timeout=30)
    for out in outs:
        assert out["locked costs nothing"] is True
        assert out["changed together"] == (True, 1)  # one store rendezvous, then the all-reduce as usual
        assert "disagree on the shape: rank 0 (2, 3), rank 1 (2, 4), rank 2 (2, 5)" in out["then checked"]


def _splits():
    r = dist.get_rank()
    residuals, real = [0], A.split_residuals

    def counted(*args):
        residuals[0] += 1
        return real(*args)

    A.split_residuals = counted
    out = {}
    counts = torch.tensor([1, 2]) if r == 0 else torch.tensor([3, 1])  # rows for member 0, member 1
    received, splits = C.exchange_splits(counts)
    for _ in range(3):  # the dispatch, the combine (swapped) and the backward of both: never a residual
        x = torch.ones(int(counts.sum()), 4, requires_grad=True)
        y = C.all_to_all_uneven(x, splits)
        C.all_to_all_uneven(y, splits.swapped()).sum().backward()
    out["exchanged residuals"] = residuals[0]
    out["exchanged splits"] = (list(splits.output), list(splits.input), received.tolist())
    for _ in range(3):  # raw splits, consistent: learned and predicted, the residual still runs every call
        C.all_to_all_rows(torch.ones(2, 4), [1, 1], [1, 1])
    out["raw residuals"] = residuals[0] - out["exchanged residuals"]
    bad = ([1, 3], [1, 1]) if r == 0 else ([1, 1], [1, 1])  # rank 0 expects 3 rows from rank 1, which sends 1
    out["raw bad, predicted"] = _message(lambda: C.all_to_all_rows(torch.ones(2, 4), *bad))
    out["another group"] = _message(lambda: C.all_to_all_rows(torch.ones(2, 4), C.ExchangedSplits((1, 1), (1, 1), 0)))
    out["both"] = _message(lambda: C.all_to_all_rows(torch.ones(2, 4), splits, [1, 1]))
    A.split_residuals = real
    return out


def test_splits_from_an_exchange_skip_the_check_and_raw_bad_splits_are_still_named():
    outs = launch(_splits, 2, timeout=30)
    assert outs[0]["exchanged splits"] == ([1, 3], [1, 2], [1, 3])  # rank 1 counted 3 rows for rank 0
    assert outs[1]["exchanged splits"] == ([2, 1], [3, 1], [2, 1])
    for out in outs:
        assert out["exchanged residuals"] == 0
        assert out["raw residuals"] >= 3  # predicted calls with raw splits still check them
        assert (
            "rank 0 expects 3 rows from rank 1 (its output_splits[1]), but rank 1 sends it 1"
            in out["raw bad, predicted"]
        )
        assert "another group" in out["another group"] and "no input_splits" in out["both"]


def _communicated() -> int:
    """Calls this rank's groups checked with communication so far: steps 1-2, store rendezvous, and predicted calls
    whose raw row counts were still compared (`bench/peers.py`'s `checked/step`)."""
    return sum(p.checked + p.rounds + p.row_checks for p in A._PREDICTORS.values())


def _etp_steps():
    from pylib.ep import ExpertParallelMoE
    from pylib.ep.overlap import interleave, moe_steps
    from pylib.plan.config import MoEConfig
    from pylib.runtime import Mesh, ParallelConfig
    from tests.conftest import seeded_moe

    r = dist.get_rank()
    mesh = Mesh(ParallelConfig(dp=4, ep=2, etp=2))
    moe = seeded_moe(MoEConfig(n_experts=4, top_k=2))
    layer = ExpertParallelMoE.from_full(moe, ep_group=mesh.ep, etp_group=mesh.etp, aux_group=mesh.world)
    out = {"per step": [], "etp rows": []}
    for step in range(5):  # another routing every step: the ETP row counts change, the calls do not
        x = torch.randn(1, 6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(10 * step + r))
        before = _communicated()
        layer(x.requires_grad_()).sum().backward()
        out["per step"].append(_communicated() - before)
        out["etp rows"].append(tuple(layer.last_state.etp_rows))
    out["etp row checks"] = A._predictor(mesh.etp).row_checks
    out["overlap row checks"] = []
    for step in range(3):  # two micro-batches interleaved (`pylib.ep.overlap`): its exchanges take the same values
        xs = [
            torch.randn(1, 6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(9 + 4 * step + 2 * r + k))
            for k in range(2)
        ]
        before = sum(p.row_checks for p in A._PREDICTORS.values())
        ys = interleave([moe_steps(layer, x.requires_grad_()) for x in xs], overlap=True)
        (ys[0].sum() + ys[1].sum()).backward()
        out["overlap row checks"].append(sum(p.row_checks for p in A._PREDICTORS.values()) - before)
    etp = mesh.etp
    rows = torch.ones(1 + etp.rank, 8, dtype=torch.float64)
    bad = [1, 2] if etp.rank == 0 else [3, 2]  # member 1 miscounts member 0's rows (its own entry is right)
    out["corrupted raw"] = _message(lambda: C.all_gather_uneven(rows, bad, etp))
    return out


def test_etp_row_counts_gathered_with_the_counts_are_never_checked_again_and_a_corrupted_raw_list_is_named():
    """ep 2 x etp 2: from the third step on no collective of the layer communicates to check (with the raw ETP row
    counts, 4 checks a step, every step); interleaved micro-batches (`pylib.ep.overlap`) compare no row counts
    either (10 a step with the raw lists); and a raw list one member miscounts is still named before data moves."""
    outs = launch(_etp_steps, 4, timeout=60)
    for out in outs:
        steps = out["per step"]
        assert steps[0] > 0 and steps[-2:] == [0, 0], steps  # learned, then no check at all (before: 4 a step)
        assert out["overlap row checks"] == [0, 0, 0]  # its ETP sizes and EP splits are trusted too (before: 10)
        assert out["etp row checks"] == 0  # the ETP all-gather / reduce-scatter never compared their row counts
        assert len(set(out["etp rows"])) > 1  # ... though they changed from step to step
        message = out["corrupted raw"]
        assert "the ranks disagree on the row counts `sizes`" in message and "[1, 2]" in message and "[3, 2]" in message


def _gathered_sizes():
    r = dist.get_rank()
    counts = torch.tensor([1 + r, 2 * r])  # member r holds 1 + 3r rows
    gathered, sizes = C.gather_sizes(counts)
    out = {"gathered": gathered.tolist(), "sizes": sizes.sizes}
    residual_free = A._predictor(C.resolve_group(None))
    x = torch.ones(1 + 3 * r, 2, requires_grad=True)
    # nothing predicted yet, so every rank checks: one rank's gathered sizes beside another's raw list are named
    out["mixed"] = _message(lambda: C.all_gather_rows(x.detach(), sizes if r == 0 else list(sizes.sizes)))
    for _ in range(3):  # gathered sizes, forward and backward (the backward reduce-scatter takes them too)
        y = C.all_gather_uneven(x, sizes)
        C.reduce_scatter_uneven(y * 2, sizes).sum().backward()
    out["row checks"] = residual_free.row_checks
    out["another group"] = _message(lambda: C.all_gather_rows(x, C.GatheredSizes(sizes.sizes, object())))
    return out


def test_sizes_from_gather_sizes_skip_the_check_and_a_raw_list_beside_them_is_named():
    outs = launch(_gathered_sizes, 2, timeout=30)
    for out in outs:
        assert out["gathered"] == [[1, 0], [2, 2]] and out["sizes"] == (1, 4)
        assert out["row checks"] == 0
        assert "gathered over another group" in out["another group"]
        assert "the ranks disagree on gathered sizes: rank 0 1, rank 1 0" in out["mixed"]


def _pipeline_steps(odd: bool):
    """1F1B steps on 2 ranks: two alike (the second predicted), then every rank with another m (they meet and
    check again), then that again (predicted); with `odd`, rank 1 alone is given longer sequences instead."""
    from pylib.model import build_model, random_tokens
    from pylib.plan.presets import tiny
    from pylib.pp.pipeline import PipelineParallel

    cfg = tiny()
    pipe = PipelineParallel(build_model(cfg))
    state = A._pipeline_state(C.resolve_group(None))
    seen = []

    def step(m, seq=4):
        ids, targets = random_tokens(cfg, 4, seq, seed=0)
        pipe.step(ids, targets, n_microbatches=m)
        seen.append((state.checked, state.predicted, state.rounds))

    step(2)
    step(2)
    if odd:
        with A.prediction_timeout(STEP):
            step(2, seq=8 if dist.get_rank() == 1 else 4)
    step(4)
    step(4)
    return seen


def test_a_pipeline_step_verified_once_is_predicted_and_a_change_of_every_rank_is_checked_again():
    for seen in launch(_pipeline_steps, 2, False, timeout=60):
        # (checked, predicted, store meetings) after each step
        assert seen == [(1, 0, 0), (1, 1, 0), (2, 1, 1), (2, 2, 1)]


def test_a_rank_whose_pipeline_step_differs_from_the_verified_one_names_itself():
    with pytest.raises(RankFailedError) as failed:
        launch(_pipeline_steps, 2, True, timeout=30)
    assert failed.value.rank == 1
    message = str(failed.value)
    assert (
        "run_pipeline over [0, 1]: rank 1 runs run_pipeline(1f1b, p=2, m=2, v=1, float64 boundaries (2, 8, 16)) "
        "where the group verified run_pipeline(1f1b, p=2, m=2, v=1, float64 boundaries (2, 4, 16)); the other ranks "
        "did not come to re-check within 0.2 s"
    ) in message
