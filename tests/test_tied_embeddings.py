"""Tied input/output embeddings in the composed model, as Megatron-Core runs them over pipeline stages.

The first stage holds the embedding, the last stage a copy used as the LM head; both start equal and their gradients
are summed over the embedding group (the first and last pipeline rank) after the data-parallel reduction, so the
copies stay equal step after step. Claims: the runs equal the single-device tied reference in float64 (loss, every
gradient, the global gradient norm, the weights after three clipped Adam steps) for pp = 2 with tp = 1, 2 and
dp = 2 (DDP and ZeRO-1), for pp = 4 (an embedding group that is not the pipeline group) and for one stage; the
embedding group moves one all-reduce per step; a checkpoint keeps the tied weight once; the planner counts the last
stage's copy.
"""

import pytest
import torch

from pylib.analysis.weights import local_parameters, model_parameter_count, parameter_counts
from pylib.compose import GradClip, ParallelTransformer
from pylib.compose.checkpoint import read_checkpoint, save_checkpoint
from pylib.model import batches, build_model
from pylib.plan import RunOptions
from pylib.plan.presets import tiny
from pylib.plan.problems import problems
from pylib.plan.schedules import build
from pylib.pp.executor import Boundary, microbatches, run_pipeline
from pylib.pp.split import allreduce_embedding_grads, embedding_group, rank_chunks, split_model, tied_weights
from pylib.runtime import Mesh, ParallelConfig, launch
from pylib.runtime.tracer import trace
from tests.conftest import FLOAT64_ATOL

CFG = tiny().with_(tie_embeddings=True)  # V = 32, h = 16, 4 layers, float64
BATCH, SEQ, STEPS, LR = 4, 8, 3, 1e-2
MAX_NORM = 0.5  # below the gradient norm of every step: each step clips, the tied weight counted once


def test_problems_accept_tied_embeddings_over_pipeline_stages():
    opts = RunOptions(schedule="1f1b", n_microbatches=2)
    assert problems(CFG, ParallelConfig(tp=2, dp=2, pp=2), 8, batch=BATCH, seq=SEQ, options=opts) == []


def test_pipeline_chunks_share_one_weight_on_one_stage_and_mark_equal_copies_across_stages():
    model = build_model(CFG)
    (one,) = split_model(model, 1)[0]
    assert one.lm_head.weight is one.embed.weight and tied_weights([one]) == []
    (first,), (last,) = split_model(model, 2)
    assert tied_weights([first]) == [first.embed.weight] and tied_weights([last]) == [last.lm_head.weight]
    assert last.lm_head.weight is not first.embed.weight
    assert torch.equal(last.lm_head.weight, first.embed.weight)  # the copy starts equal
    untied = split_model(build_model(CFG.with_(tie_embeddings=False)), 2)
    assert tied_weights(untied[0] + untied[1]) == []


def test_planner_counts_the_last_stages_copy_of_a_tied_embedding():
    V, h = CFG.vocab_size, CFG.d_model
    untied = CFG.with_(tie_embeddings=False)
    par = ParallelConfig(tp=2, pp=2)
    assert model_parameter_count(CFG) == model_parameter_count(untied) - V * h  # the model has one such tensor
    for rank in (0, 1):  # each stage holds what it holds untied: the last stage's LM head is the copy
        assert parameter_counts(CFG, par, pp_rank=rank) == parameter_counts(untied, par, pp_rank=rank)
    assert local_parameters(CFG, par, pp_rank=1)["lm_head.weight"] == (V // 2, h)
    one = ParallelConfig(tp=2)
    assert parameter_counts(CFG, one)["total"] == parameter_counts(untied, one)["total"] - V // 2 * h
    assert "lm_head.weight" not in local_parameters(CFG, one)


# -------------------------------------------------------------------------------------------- real runs


def _pipeline(pp):
    """pylib.pp alone: the 1F1B schedule over `pp` ranks, then the embedding group's sum of the copies' gradients."""
    mesh = Mesh(ParallelConfig(pp=pp))
    chunks = rank_chunks(build_model(CFG), mesh.pp.rank, pp)
    ids, targets = batches(CFG, BATCH, SEQ, 0, data="pattern")
    run_pipeline(
        build("1f1b", pp, 2),
        chunks,
        Boundary((BATCH // 2, SEQ, CFG.d_model)),
        group=mesh.pp,
        inputs=microbatches(ids, 2),
        targets=microbatches(targets, 2),
    )
    reduced = allreduce_embedding_grads(chunks, embedding_group(mesh))
    return reduced, {n: p.grad.clone() for c in chunks for n, p in c.named_parameters()}


@pytest.mark.slow
def test_pipeline_chunks_sum_the_tied_copies_gradients_over_the_embedding_group():
    ref = build_model(CFG)
    ref.loss(*batches(CFG, BATCH, SEQ, 0, data="pattern")).backward()
    want = ref.embed.weight.grad
    (n0, first), (n1, last) = launch(_pipeline, 2, 2)
    assert n0 == n1 == want.numel()
    assert float((first["embed.weight"] - want).abs().max()) <= FLOAT64_ATOL
    assert float((last["lm_head.weight"] - want).abs().max()) <= FLOAT64_ATOL


@pytest.fixture(scope="module")
def ref():
    """The single-device tied model: step-0 gradients, the losses and the weights after STEPS Adam steps."""
    model = build_model(CFG)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    grads, losses, norms = None, [], []
    for step in range(STEPS):
        loss = model.loss(*batches(CFG, BATCH, SEQ, step, data="pattern"))
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)))
        if grads is None:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return dict(grads=grads, losses=losses, norms=norms, params=params)


def _run(par, options, folder=None):
    mesh = Mesh(par)
    model = ParallelTransformer.from_full(build_model(CFG), mesh, options, batch=BATCH, seq=SEQ, lr=LR)
    infos = {i.name: i for i in model.infos}
    out = dict(losses=[], norms=[], grads=[], embd_events=[], table=model.reduction_table())
    for step in range(STEPS):
        with trace() as tr:
            res = model.step(*batches(CFG, BATCH, SEQ, step, data="pattern"), clip=GradClip(MAX_NORM))
        out["losses"].append(res.loss)
        out["norms"].append(res.clip.norm)
        out["embd_events"].append([(e.op, e.phase, e.payload_bytes) for e in tr.events if e.axis == "embd"])
        if step == 0:
            for name, parts in model.gradient_pieces().items():
                i = infos[name]
                out["grads"] += [(name, i.ref_name, i.ref_index, lo, hi, v.clone()) for lo, hi, v in parts]
    out["params"] = model.parameter_pieces()
    if folder is not None:
        save_checkpoint(model, folder)
    return out


RUNS = {  # name: (ParallelConfig, world, RunOptions)
    "pp2 dp2 ddp": (ParallelConfig(dp=2, pp=2), 4, RunOptions(zero_stage=0, schedule="1f1b", n_microbatches=2)),
    "tp2 dp2 pp2 zero1": (
        ParallelConfig(tp=2, dp=2, pp=2),
        8,
        RunOptions(zero_stage=1, schedule="1f1b", n_microbatches=2),
    ),
    "pp4": (ParallelConfig(pp=4), 4, RunOptions(zero_stage=0, schedule="1f1b", n_microbatches=2)),
    "dp2 zero2, one stage": (ParallelConfig(dp=2), 2, RunOptions(zero_stage=2)),  # one parameter, no group
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tied")
    out = {
        name: launch(_run, world, par, opts, root / name.replace(" ", "-")) for name, (par, world, opts) in RUNS.items()
    }
    return out, root


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_tied_embeddings_over_stages_train_like_the_reference(runs, ref, name):
    results = runs[0][name]
    held = {"embed.weight": 0, "lm_head.weight": 0}
    for r in results:
        assert r["losses"] == pytest.approx(ref["losses"], abs=FLOAT64_ATOL)
        assert r["norms"] == pytest.approx(ref["norms"], abs=FLOAT64_ATOL)
        for local, ref_name, index, lo, hi, g in r["grads"]:
            want = ref["grads"][ref_name][index].reshape(-1)[lo:hi]
            assert float((g - want).abs().max()) <= FLOAT64_ATOL, (local, lo, hi)
            if ref_name == "embed.weight":
                held[local] += 1
        for ref_name, index, lo, hi, t in r["params"]:
            torch.testing.assert_close(t, ref["params"][ref_name][index].reshape(-1)[lo:hi], rtol=0, atol=FLOAT64_ATOL)
    copies = RUNS[name][0].pp > 1  # across stages: both copies checked, each against the one reference tensor
    assert held["embed.weight"] > 0 and (held["lm_head.weight"] > 0) == copies


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_the_embedding_group_all_reduces_once_per_step_in_grad_sync(runs, name):
    par, _, opts = RUNS[name]
    V, h = CFG.vocab_size, CFG.d_model
    for r in runs[0][name]:
        ends = {row["name"] for row in r["table"]} & {"embed.weight", "lm_head.weight"}
        pre = {row["name"]: row["pre"] for row in r["table"]}
        if par.pp == 1:  # embedding and LM head are one parameter, completed like any other
            assert ends == {"embed.weight"} and pre["embed.weight"] is None
            assert all(events == [] for events in r["embd_events"])
            continue
        for events in r["embd_events"]:
            if not ends:  # a middle stage holds no copy and joins no embedding group
                assert events == []
                continue
            assert all(pre[n] == "embd" for n in ends)
            (only,) = events
            shard = 1 if opts.zero_stage == 0 else par.dp  # ZeRO: each dp rank reduces its shard of the copy
            assert only == ("all_reduce", "grad_sync", V // par.tp * h * 8 // shard)


@pytest.mark.slow
def test_a_checkpoint_keeps_the_tied_weight_once(runs, ref):
    results, root = runs
    for name in RUNS:
        saved = read_checkpoint(root / name.replace(" ", "-"))
        assert "model.embed.weight" in saved and not any("lm_head" in k for k in saved)
        torch.testing.assert_close(
            saved["model.embed.weight"], ref["params"]["embed.weight"], rtol=0, atol=FLOAT64_ATOL
        )
