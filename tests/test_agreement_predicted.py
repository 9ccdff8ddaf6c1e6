"""Predicted calls (issue 30): a group's ranks learn the order of their collectives and stop checking a call the
verified history predicts, with the same guarantee -- a rank whose call differs is named before data moves."""

import time

import pytest
import torch
import torch.distributed as dist

from pylib.runtime import RankFailedError, launch
from pylib.runtime import agreement as A
from pylib.runtime import collectives as C
from tests.conftest import value_error_message as _message

STEP = 0.2  # seconds an odd rank waits at the store here (the default is 30 s)


def _replay(keys) -> list[str]:
    """One predictor fed `keys` as every rank would see them: 'hit' (no communication), 'check' (steps 1-2) or
    'meet' (every rank changed together: the store rendezvous, then steps 1-2)."""
    p, out = A._Predictor(), []
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


def test_a_change_every_rank_makes_together_is_checked_then_learned_again():
    seen = _replay(["a", "b"] * 4 + ["a", "c"] * 4)
    assert seen[:8] == ["check", "check", "check", "hit", "hit", "hit", "hit", "hit"]
    assert seen[9] == "meet" and seen[-4:] == ["hit"] * 4  # "c" where "b" was verified: met, checked, learned


def test_the_predictor_keeps_at_most_its_tape_and_then_checks_every_call(monkeypatch):
    monkeypatch.setattr(A, "_MAX_TAPE", 8)
    seen = _replay([str(k) for k in range(20)] + ["0", "1"] * 5)
    assert seen.count("hit") == 0 and "meet" not in seen  # nothing predicted past a full tape, nothing lost


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
