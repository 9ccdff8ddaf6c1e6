"""Activation recomputation (none / selective / full), run for real: gradients exactly equal to no recomputation in
float64, saved bytes measured equal to pylib.analysis.recompute's formulas byte for byte, and the extra forward work
(FLOPs, collectives) counted against the formulas, in the TP/SP layer, the CP attention, the pipeline stages and the
composed model."""

from dataclasses import replace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from pylib.analysis import planner as P
from pylib.analysis import recompute as R
from pylib.analysis.tp import korthikanti_bytes
from pylib.model import ModelConfig, build_model, random_hidden, random_tokens, saved_activations, torch_dtype
from pylib.plan import Recompute, RunOptions, problems
from pylib.plan.mesh import ParallelConfig
from pylib.runtime import launch, trace
from pylib.runtime.recompute import run_layers
from pylib.tp import TPBlock, TPTransformer, scatter_to_sequence_parallel_region

B, S = 2, 8


def _cfg(mlp="gelu", kv=None, position="none", causal=True, n_layers=1, dtype="float64"):
    return ModelConfig(
        d_model=16,
        n_heads=4,
        n_kv_heads=kv,
        d_ff=64,
        mlp=mlp,
        position=position,
        causal=causal,
        dtype=dtype,
        n_layers=n_layers,
        vocab_size=32,
    )


CFGS = [_cfg(), _cfg("swiglu", 2, "rope"), _cfg(causal=False, kv=1)]


def test_groups_follow_megatrons_uniform_and_block_methods():
    assert Recompute("none").groups(4) == (((0, 1, 2, 3), False),)
    assert Recompute("selective").groups(4) == (((0, 1, 2, 3), False),)
    assert Recompute("full", "uniform", 1).groups(4) == tuple(((i,), True) for i in range(4))
    assert Recompute("full", "uniform", 2).groups(5) == (((0, 1), True), ((2, 3), True), ((4,), True))
    assert Recompute("full", "block", 1).groups(4) == (((0,), True), ((1, 2, 3), False))
    assert Recompute("full", "block", 3).groups(2) == (((0,), True), ((1,), True))


def test_bad_choices_are_named():
    with pytest.raises(ValueError, match=r"recompute='some' must be one of \('none', 'selective', 'full'\)"):
        RunOptions(recompute=Recompute("some"))
    with pytest.raises(ValueError, match="recompute_num_layers=0 must be >= 1"):
        Recompute("full", num_layers=0)
    zero3 = RunOptions(zero_stage=3, recompute=Recompute("full", num_layers=2))
    assert any("spans several ZeRO-3 units" in p for p in problems(_cfg(), ParallelConfig(dp=2), options=zero3))
    with pytest.raises(ValueError, match="recompute_method='every' must be one of"):
        Recompute("full", "every")
    with pytest.raises(ValueError, match="recompute='partial' must be one of"):
        R.layer_saved_bytes(_cfg(), B, S, recompute="partial")


def _block_run(cfg, sp, regather, recompute):
    """One TPBlock (recomputed whole under "full"): saved bytes, gradients, traced ops, backward matmul FLOPs."""
    block = TPBlock.from_full(build_model(cfg).layers[0], sequence_parallel=sp, regather=regather, recompute=recompute)
    x = random_hidden(B, S, cfg.d_model, dtype=torch_dtype(cfg.dtype))
    x = (scatter_to_sequence_parallel_region(x) if sp else x).detach().requires_grad_()
    with trace() as tr:
        with saved_activations(exclude=block.parameters()) as saved:
            y = run_layers([block], x, recompute=recompute)
        with FlopCounterMode(display=False) as flops:
            y.square().sum().backward()
    events = [(e.op, e.phase, e.payload_bytes) for e in tr.events]
    return saved.bytes, [p.grad for p in block.parameters()] + [x.grad], events, flops.get_total_flops()


def _block_runs(cases):
    return [[_block_run(cfg, sp, rg, rc) for rc in R.RECOMPUTE] for cfg, sp, rg in cases]


@pytest.mark.parametrize("t", [1, 2, pytest.param(4, marks=pytest.mark.slow)])
def test_tp_block_gradients_bytes_flops_and_collectives(t):
    cases = [(cfg, sp, rg) for cfg in CFGS for sp, rg in ((False, False), (True, False), (True, True))]
    for rank, per_rank in enumerate(launch(_block_runs, t, cases)):
        for (cfg, sp, rg), runs in zip(cases, per_rank):
            where = f"t={t} rank {rank} sp={sp} regather={rg} {cfg.mlp} kv={cfg.kv_heads}"
            none = runs[0]
            for rc, (saved, grads, events, flops) in zip(R.RECOMPUTE, runs):
                assert all(torch.equal(a, b) for a, b in zip(grads, none[1])), f"{where} {rc}: gradients differ"
                assert saved == R.layer_saved_bytes(cfg, B, S, t, sequence_parallel=sp, regather=rg, recompute=rc), (
                    f"{where} {rc}"
                )
                assert flops - none[3] == R.extra_forward_flops(cfg, B, S, t, rc), f"{where} {rc}"
                redo = [(op, p) for op, ph, p in events if ph == "recompute"]
                if not rg:
                    expect = R.extra_collectives(cfg, B, S, t, sequence_parallel=sp, recompute=rc)
                    assert redo == [(c.op, c.payload_bytes) for c in expect], f"{where} {rc}"
                # everything else on the wire is unchanged
                assert [e for e in events if e[1] != "recompute"] == none[2], f"{where} {rc}"


def test_selective_removes_the_5as_over_h_term_and_full_keeps_the_input():
    """Korthikanti's closed forms: the selective and full columns are the paper's with the 5as/h term gone."""
    s, b, h, a = 2048, 1, 12288, 96
    sbh = s * b * h
    for t in (1, 2, 8):
        assert R.korthikanti_recompute_bytes(s, b, h, a, t, sequence_parallel=True, recompute="selective") == (
            pytest.approx(korthikanti_bytes(s, b, h, a, t, sequence_parallel=True) - 5 * a * s * sbh / (h * t))
        )
        assert R.korthikanti_recompute_bytes(s, b, h, a, t, recompute="selective") == pytest.approx(
            korthikanti_bytes(s, b, h, a, t) - 5 * a * s * sbh / (h * t)
        )
        assert R.korthikanti_recompute_bytes(s, b, h, a, t, sequence_parallel=True, recompute="full") == 2 * sbh / t
    # ours: selective drops the [b, a/t, s, s] probabilities and the [s, s] mask, the O(s^2) terms
    cfg = _cfg()
    for t in (1, 2, 4):
        none = R.layer_saved_bytes(cfg, B, S, t, sequence_parallel=True, regather=True)
        sel = R.layer_saved_bytes(cfg, B, S, t, sequence_parallel=True, regather=True, recompute="selective")
        e = 8
        expanded_k_minus_k = 0  # MHA: the core's k is the projection's k
        assert none - sel == e * B * (cfg.n_heads // t) * S * S + S * S + expanded_k_minus_k


def _model_run(cfg, sp, recompute):
    ref = build_model(cfg)
    model = TPTransformer.from_full(ref, sequence_parallel=sp, recompute=recompute)
    ids, targets = random_tokens(cfg, B, S, seed=3)
    with saved_activations(exclude=model.parameters()) as whole:
        loss = model.loss(ids, targets)
    with trace() as tr:
        loss.backward()
    model.finalize_grads()
    return whole.bytes, [p.grad for p in model.parameters()], tr.count(phase="recompute")


CHOICES = [
    Recompute("none"),
    Recompute("selective"),
    Recompute("full", "uniform", 1),
    Recompute("full", "uniform", 2),
    Recompute("full", "uniform", 3),
    Recompute("full", "block", 1),
    Recompute("full", "block", 2),
]


def _model_runs(cfg, sp):
    return [_model_run(cfg, sp, c) for c in CHOICES]


# t = 1 (one rank, no collective to re-send) is slow: the block test at t = 1 and the model at t = 2 prove its claim.
@pytest.mark.parametrize(
    "t, sp",
    [
        pytest.param(1, False, marks=pytest.mark.slow),
        (2, False),
        pytest.param(2, True, marks=pytest.mark.slow),  # SP on: the same choices, 1.4 s more
        pytest.param(4, True, marks=pytest.mark.slow),
    ],
)
@pytest.mark.slow
def test_tp_model_every_choice_same_gradients_and_the_group_formula(t, sp):
    cfg = _cfg("swiglu", 2, "rope", n_layers=4)
    for rank, runs in enumerate(launch(_model_runs, t, cfg, sp)):
        none_bytes, none_grads, _ = runs[0]
        layers_none = R.model_layers_saved_bytes(cfg, B, S, t, sequence_parallel=sp)
        for rc, (saved, grads, redo) in zip(CHOICES, runs):
            assert all(torch.equal(a, b) for a, b in zip(grads, none_grads)), (rank, rc)
            layers = R.model_layers_saved_bytes(cfg, B, S, t, sequence_parallel=sp, recompute=rc)
            assert saved - none_bytes == layers - layers_none, (rank, rc)
            groups = [g for g, whole in rc.groups(cfg.n_layers) if whole]
            expect = sum(
                len(R.extra_collectives(cfg, B, S, t, sequence_parallel=sp, recompute=rc.granularity, layers=len(g)))
                for g in groups
            )
            assert redo == expect, (rank, rc)


# ------------------------------------------------------------------------------------- composed model and planner

COMPOSE_PLANS = [
    # TP + SP over 2 pipeline stages (1F1B, m = 2): the groups of "full" are counted within each stage
    (ParallelConfig(tp=2, pp=2), RunOptions(sequence_parallel=True, n_microbatches=2)),
    # TP + SP + CP ring: the ring's K/V passes sit inside the recomputed core
    (ParallelConfig(tp=2, cp=2), RunOptions(sequence_parallel=True, cp_kind="ring")),
    # CP Ulysses with DP (ZeRO-2)
    (ParallelConfig(cp=2, dp=2), RunOptions(cp_kind="ulysses", zero_stage=2)),
    # ZeRO-3 gathers a recomputed layer's parameters once more for the second forward
    (ParallelConfig(tp=2, dp=2), RunOptions(sequence_parallel=True, zero_stage=3)),
]
RECOMPUTE_CHOICES = [
    Recompute("none"),
    Recompute("selective"),
    Recompute("full"),
    Recompute("full", "uniform", 2),
    Recompute("full", "block", 1),
]


def _compose_runs(cfg, par, options):
    from pylib.experiments.compose_training import train

    out = []
    for choice in RECOMPUTE_CHOICES:
        if options.zero_stage == 3 and choice.num_layers > 1:
            choice = replace(choice, method="block")  # refused with ZeRO-3 (test_bad_choices_are_named)
        r = train(cfg, par, replace(options, recompute=choice), steps=1, batch=4, seq=8, record=("events",))
        redo = sum(1 for e in r["events"][0] if e["phase"] == "recompute")
        out.append((choice, r["params"], dict(r["activation_bytes"]), r["peak_activation_bytes"], redo, r["coords"]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("par, options", COMPOSE_PLANS, ids=[p.describe() for p, _ in COMPOSE_PLANS])
def test_composed_model_every_choice_equal_parameters_and_planner_predicts_the_bytes(par, options):
    from pylib.analysis.activations import chunk_saved_bytes, peak_saved_bytes
    from pylib.plan.presets import tiny

    cfg = tiny().with_(position="rope")
    batch, seq = 4, 8
    for rank, runs in enumerate(launch(_compose_runs, par.world_size, cfg, par, options)):
        none_params = runs[0][1]
        for choice, params, chunks, peak, redo, coords in runs:
            where = f"{par.describe()} rank {rank} {choice}"
            # after one Adam step: the same parameters, bit for bit (float64), as without recomputation
            assert len(params) == len(none_params)
            for a, b in zip(params, none_params):
                assert a[0] == b[0] and torch.equal(a[-1], b[-1]), f"{where}: {a[0]}"
            plan = P.Plan(par, replace(options, recompute=choice))
            predicted = chunk_saved_bytes(cfg, plan.micro_batch(batch), seq, plan, coords["pp"], attention="math")
            assert [chunks[(0, c)] for c in range(plan.options.v)] == predicted, where
            assert peak == peak_saved_bytes(
                predicted, plan.options.schedule, par.pp, plan.options.n_microbatches, plan.options.v, coords["pp"]
            )
            work = P.Workload(batch, seq, precision="uniform", attention="math")
            assert P.rank_memory(cfg, plan, work, coords["pp"])["activations"] == peak, where
            # re-issued collectives: none without recompute; CP ring passes or TP/SP gathers when recomputing
            if choice.granularity == "none":
                assert redo == 0, where
            elif par.cp > 1 or (choice.granularity == "full" and par.tp > 1):
                assert redo > 0, where
            else:  # selective with the local core: nothing inside the core communicates
                assert redo == 0, where


# ------------------------------------------------------------------------------------------ CP attention and PP

GQA = _cfg("swiglu", 2, "rope", n_layers=2)
LAYER_CHOICES = [Recompute("none"), Recompute("selective"), Recompute("full"), Recompute("full", "block", 1)]


def _recomputed_layers(n_layers, choice):
    """How many layers run their attention again: all under selective, those in whole groups under full."""
    if choice.granularity == "selective":
        return n_layers
    return sum(len(g) for g, whole in choice.groups(n_layers) if whole)


def _cp_runs(cfg, kind, seq):
    import torch.distributed as dist

    from pylib.cp import CPTransformer, shard_sequence

    r, n = dist.get_rank(), dist.get_world_size()
    ids, targets = random_tokens(cfg, B, seq, seed=1)
    ids, targets = (shard_sequence(x, 1, r, n, "zigzag") for x in (ids, targets))
    out = []
    for choice in LAYER_CHOICES:
        model = CPTransformer.from_full(build_model(cfg), layout="zigzag", kind=kind, recompute=choice)
        with trace() as tr:
            with saved_activations(exclude=model.parameters()) as saved:
                loss = model.loss(ids, targets)
            loss.backward()
        redo = {}
        for e in tr.select(phase="recompute"):
            redo[e.op] = redo.get(e.op, 0) + 1
        out.append((saved.bytes, [p.grad for p in model.parameters()], redo))
    return out


@pytest.mark.parametrize("kind", ["ring", "ulysses"])
def test_cp_attention_every_choice_same_gradients_bytes_and_rerun_passes(kind):
    from pylib.analysis.activations import chunk_saved_bytes

    cp, seq = 2, 16
    for rank, runs in enumerate(launch(_cp_runs, cp, GQA, kind, seq)):
        options = RunOptions(sequence_parallel=False, cp_kind=kind)
        none_predicted = chunk_saved_bytes(GQA, B, seq, P.Plan(ParallelConfig(cp=cp), options))[0]
        for choice, (saved, grads, redo) in zip(LAYER_CHOICES, runs):
            assert all(torch.equal(a, b) for a, b in zip(grads, runs[0][1])), (rank, kind, choice)
            # the embedding and the head are the reference's here, not the vocab-parallel ones the formula counts:
            # compare what recomputation changes, which is all in the layers
            plan = P.Plan(ParallelConfig(cp=cp), replace(options, recompute=choice))
            predicted = chunk_saved_bytes(GQA, B, seq, plan)[0]
            assert saved - runs[0][0] == predicted - none_predicted, (rank, kind, choice)
            layers = _recomputed_layers(GQA.n_layers, choice)
            assert redo == R.cp_recompute_ops(kind, choice.granularity, cp, layers), (rank, kind, choice)


def _pp_runs(cfg, m):
    import torch.distributed as dist

    from pylib.pp import Boundary, build, microbatches, run_pipeline
    from pylib.pp.split import rank_chunks

    rank, p = dist.get_rank(), dist.get_world_size()
    ids, targets = random_tokens(cfg, B * m, S, seed=4)
    out = []
    for choice in LAYER_CHOICES + [Recompute("full", "uniform", 2)]:
        chunks = rank_chunks(build_model(cfg), rank, p, 2, choice)
        run = run_pipeline(
            build("interleaved", p, m, 2),
            chunks,
            inputs=microbatches(ids, m),
            targets=microbatches(targets, m),
            boundary=Boundary((B, S, cfg.d_model)),
        )
        grads = [q.grad for c in chunks for q in c.parameters()]
        out.append((choice, run.activation_bytes, run.peak_activation_bytes, grads, run.loss))
    return out


@pytest.mark.slow
def test_pipeline_stages_every_choice_same_gradients_and_bytes_per_chunk():
    from pylib.analysis.activations import chunk_saved_bytes, peak_saved_bytes

    cfg = _cfg("swiglu", 2, "rope", n_layers=8)
    p, m, v = 2, 4, 2
    for rank, runs in enumerate(launch(_pp_runs, p, cfg, m)):
        options = RunOptions(sequence_parallel=False, schedule="interleaved", v=v)
        none_predicted = chunk_saved_bytes(cfg, B, S, P.Plan(ParallelConfig(pp=p), options), rank)
        _, none_bytes, none_peak, none_grads, none_loss = runs[0]
        for choice, saved, peak, grads, loss in runs:
            assert loss == none_loss and all(torch.equal(a, b) for a, b in zip(grads, none_grads)), (rank, choice)
            plan = P.Plan(ParallelConfig(pp=p), replace(options, recompute=choice))
            predicted = chunk_saved_bytes(cfg, B, S, plan, rank)
            for c in range(v):  # what recomputation changes (the stage ends are the reference's modules here)
                assert saved[(0, c)] - none_bytes[(0, c)] == predicted[c] - none_predicted[c], (rank, choice, c)
            ends = [none_bytes[(0, c)] - none_predicted[c] for c in range(v)]
            assert peak == peak_saved_bytes([x + e for x, e in zip(predicted, ends)], "interleaved", p, m, v, rank)


def _moe_runs(cfg, par):
    from pylib.experiments.compose_training import train

    out = []
    for choice in RECOMPUTE_CHOICES[:3] + RECOMPUTE_CHOICES[4:]:
        r = train(cfg, par, RunOptions(sequence_parallel=True, recompute=choice), steps=1, batch=4, seq=8)
        rows = {}
        for layer, _send, _recv, etp_rows in r["moe_routing"]:
            rows.setdefault(layer, sum(etp_rows))
        out.append((choice, r["params"], dict(r["activation_bytes"]), rows, len(r["moe_routing"])))
    return out


@pytest.mark.slow
def test_composed_moe_model_every_choice_equal_parameters_and_bytes_at_the_measured_routing():
    """A MoE layer recomputed whole routes again (deterministically): the same parameters after the step, the routing
    logged once, and the bytes `chunk_saved_bytes` gives at the rows the experts received."""
    from pylib.analysis.activations import chunk_saved_bytes
    from pylib.plan.presets import tiny_moe

    cfg, par = tiny_moe(), ParallelConfig(tp=2, dp=2, ep=2)
    for rank, runs in enumerate(launch(_moe_runs, par.world_size, cfg, par)):
        _, none_params, _, _, none_log = runs[0]
        for choice, params, chunks, rows, log in runs:
            where = f"rank {rank} {choice}"
            assert all(torch.equal(a[-1], b[-1]) for a, b in zip(params, none_params)), where
            assert log == none_log, where
            plan = P.Plan(ParallelConfig(tp=par.tp), RunOptions(recompute=choice))
            predicted = chunk_saved_bytes(cfg, 4 // par.dp, 8, plan, attention="math", expert_rows=rows)
            assert chunks[(0, 0)] == predicted[0], where
