"""Every mode refuses token ids and targets outside the vocabulary (or not integers) before its embedding and its
loss, naming the rank, the value and the vocabulary size; ranks that must hold the same batch are checked to hold
it; the cross-rank check covers any number of dims and dims out of range on any rank; the pipeline agrees on its
boundary shapes and microbatch count before its first send (issue 35, items 2 and 3)."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from pylib.compose import ParallelTransformer
from pylib.cp import CPTransformer
from pylib.model import TokenError, build_model, check_tokens, random_tokens
from pylib.plan import RunOptions
from pylib.plan.presets import tiny
from pylib.plan.schedules import build
from pylib.pp.executor import Boundary, run_pipeline
from pylib.pp.split import PipelineChunk
from pylib.runtime import Mesh, ParallelConfig, launch
from pylib.runtime import collectives as C
from pylib.tp import TPTransformer

CFG = tiny().with_(dtype="float64")
V = CFG.vocab_size


def _bad(t: torch.Tensor, where, value) -> torch.Tensor:
    t = t.clone()
    t[where] = value
    return t


def test_the_reference_refuses_ids_and_targets_outside_the_vocabulary_naming_value_place_and_size():
    model = build_model(CFG)
    ids, targets = random_tokens(CFG, 2, 8)
    with pytest.raises(TokenError, match=rf"ids hold {V} at \(1, 3\), outside the vocabulary \[0, {V}\)"):
        model(_bad(ids, (1, 3), V))
    with pytest.raises(TokenError, match=r"targets hold -1 at \(0, 0\)"):
        model.loss(ids, _bad(targets, (0, 0), -1))
    with pytest.raises(TokenError, match="ids must be an integer tensor .* got float32"):
        model(ids.float())
    with pytest.raises(TokenError, match="got bool"):
        check_tokens(ids > 3, V)
    assert check_tokens(ids, V) is ids


def test_a_pipeline_first_and_last_stage_refuse_tokens_outside_the_vocabulary():
    model = build_model(CFG.with_(tie_embeddings=False))
    first, last = PipelineChunk.from_full(model, 0, 2), PipelineChunk.from_full(model, 1, 2)
    ids, targets = random_tokens(CFG, 2, 8)
    with pytest.raises(TokenError, match=f"ids hold {V + 5}"):
        first(_bad(ids, (0, 1), V + 5))
    x = torch.zeros(2, 8, CFG.d_model, dtype=torch.float64)
    with pytest.raises(TokenError, match=f"targets hold {V}"):
        last(x, _bad(targets, (1, 7), V))


def _message(call) -> str:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the message is what the test reads
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


class _Stage(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2, dtype=torch.float64)

    def forward(self, x, targets=None):
        y = self.lin(x)
        return y.pow(2).mean() if targets is not None else y


def _pipeline(m: int, shape) -> None:
    """Rank 0 holds stage 0, rank 1 stage 1 of a 1F1B pipeline of m microbatches of `shape`."""
    inputs = [torch.ones(1, 2, dtype=torch.float64)] * m
    run_pipeline(build("1f1b", 2, m), [_Stage()], Boundary(shape), inputs=inputs, targets=[torch.zeros(1)] * m)


def _in_ranks():
    r = dist.get_rank()
    out = {}
    ids, targets = random_tokens(CFG, 2, 8, seed=1)
    other = random_tokens(CFG, 2, 8, seed=2)[0]
    tp = TPTransformer.from_full(build_model(CFG))
    out["tp id out of range"] = _message(lambda: tp(_bad(ids, (0, 2), V + 1)))
    out["tp target out of range"] = _message(lambda: tp.loss(ids, _bad(targets, (1, 1), -3)))
    out["tp different ids"] = _message(lambda: tp(other if r == 1 else ids))
    out["tp different targets"] = _message(lambda: tp.loss(ids, _bad(targets, (0, 0), 0) if r else targets))
    cp = CPTransformer.from_full(build_model(CFG), layout="contiguous")
    out["cp id out of range"] = _message(lambda: cp(_bad(ids[:, :4], (0, 0), V)))
    mesh = Mesh(ParallelConfig(tp=2))
    model = ParallelTransformer.from_full(build_model(CFG), mesh, RunOptions(n_microbatches=1))
    out["compose different batches"] = _message(lambda: model.step(ids, targets if r == 0 else other))
    out["compose target out of range"] = _message(lambda: model.step(ids, _bad(targets, (1, 7), V)))
    out["compose float ids"] = _message(lambda: model.step(ids.double(), targets))
    out["compose trains"] = _message(lambda: model.step(ids, targets))
    # the agreement check: more than 8 dims, equal numel; more than 8 dims, different numel; dims out of range
    nine = (1,) * 8
    out["9 dims, equal numel"] = _message(
        lambda: C.all_reduce_(torch.ones(*nine, 2, 1) if r else torch.ones(*nine, 1, 2))
    )
    out["10 vs 9 dims"] = _message(lambda: C.all_reduce_(torch.ones(*nine, 2, 3) if r else torch.ones(*nine, 2)))
    out["dim out of range on rank 1"] = _message(lambda: C.all_gather_tensor(torch.ones(2, 2), dim=5 if r else 0))
    out["dim out of range on both"] = _message(lambda: C.reduce_scatter_tensor(torch.ones(2, 2), dim=-3))
    out["scatter_dim out of range"] = _message(lambda: C.all_to_all_tensor(torch.ones(2, 2), 0, 4 if r else 1))
    out["-1 and ndim-1 agree"] = tuple(C.all_gather_tensor(torch.ones(2, 1), dim=-1 if r else 1).shape)
    # the pipeline: a stage built with another activation shape; another microbatch count
    out["pipeline shape"] = _message(lambda: _pipeline(2, (1, 2) if r == 0 else (1, 3)))
    out["pipeline m"] = _message(lambda: _pipeline(2 if r == 0 else 4, (1, 2)))
    out["pipeline runs"] = _message(lambda: _pipeline(2, (1, 2)))
    out["still in step"] = float(C.all_reduce_(torch.ones(1))[0])
    return out


@pytest.fixture(scope="module")
def ranks():
    return launch(_in_ranks, 2, timeout=120)


@pytest.mark.slow
def test_tp_cp_and_composed_modes_refuse_tokens_outside_the_vocabulary_on_every_rank(ranks):
    for r, out in enumerate(ranks):
        assert (
            f"TokenError: rank {r}: ids hold {V + 1} at (0, 2), outside the vocabulary [0, {V})"
            in out["tp id out of range"]
        )
        assert f"rank {r}: targets hold -3 at (1, 1)" in out["tp target out of range"]
        assert f"rank {r}: ids hold {V} at (0, 0)" in out["cp id out of range"]
        assert f"rank {r}: targets hold {V} at (1, 7)" in out["compose target out of range"]
        assert "ids must be an integer tensor" in out["compose float ids"]
        assert out["compose trains"] == "accepted"


@pytest.mark.slow
def test_ranks_given_different_batches_fail_naming_the_ranks(ranks):
    for out in ranks:
        assert (
            "TPTransformer over world (ranks [0, 1]): the ranks were given different batches: the values of `ids` on "
            "ranks [1] differ from rank 0's" in out["tp different ids"]
        )
        assert "the values of `targets` on ranks [1]" in out["tp different targets"]
        assert "ParallelTransformer.step over world (ranks [0, 1])" in out["compose different batches"]
        assert "`targets` on ranks [1]" in out["compose different batches"]


@pytest.mark.slow
def test_the_agreement_check_sees_every_dim_and_dims_out_of_range_on_any_rank_before_data_moves(ranks):
    for out in ranks:
        assert (
            "disagree on the shape: rank 0 (1, 1, 1, 1, 1, 1, 1, 1, 1, 2), rank 1 (1, 1, 1, 1, 1, 1, 1, 1, 2, 1)"
            in (out["9 dims, equal numel"])
        )
        assert "rank 0 (1, 1, 1, 1, 1, 1, 1, 1, 2), rank 1 (1, 1, 1, 1, 1, 1, 1, 1, 2, 3)" in out["10 vs 9 dims"]
        assert (
            "all_gather_tensor over [0, 1]: dim=5 on rank 1 is out of range for a tensor of 2 dims"
            in (out["dim out of range on rank 1"])
        )
        assert "dim=-3 on rank 0 is out of range" in out["dim out of range on both"]
        assert "gather_dim=4 on rank 1 is out of range" in out["scatter_dim out of range"]
        assert out["-1 and ndim-1 agree"] == (2, 2)
        assert out["still in step"] == 2.0


@pytest.mark.slow
def test_pipeline_stages_agree_on_boundary_shapes_and_microbatches_before_the_first_send(ranks):
    for out in ranks:
        assert (
            "the two ends of the boundary into stage 1 disagree on the shape of microbatch 0's activation: "
            "rank 0 sends (1, 2), rank 1 expects (1, 3)" in out["pipeline shape"]
        )
        assert "disagree on the number of microbatches m: rank 0 2, rank 1 4" in out["pipeline m"]
        assert out["pipeline runs"] == "accepted"
