"""The planner (pylib.analysis.planner): its predictions equal what short real runs of pylib.compose hold and move,
byte for byte; its enumeration is exactly the set of plans compose_problems accepts; its ranking is the cost
model's order; bad inputs are refused with the constraint named."""

import itertools
import time

import pytest

from pylib.analysis import planner as P
from pylib.analysis.activations import live_counts, peak_saved_bytes
from pylib.analysis.pp import peak_in_flight
from pylib.compose import compose_problems
from pylib.experiments.plan_runs import measure_plans
from pylib.plan import Recompute, RunOptions
from pylib.plan.config import ModelConfig, MoEConfig
from pylib.plan.presets import tiny
from pylib.runtime import ParallelConfig, rank_groups
from pylib.viz.planner import compare

DENSE = tiny().with_(position="rope")
MOE = DENSE.with_(moe=MoEConfig(n_experts=4, top_k=2))
SHARED = DENSE.with_(moe=MoEConfig(n_experts=4, top_k=2, n_shared_experts=1))  # a shared expert in each MoE layer
GATHER = DENSE.with_(moe=MoEConfig(n_experts=4, top_k=2, n_shared_experts=1, dispatcher="allgather"))
B, S = 8, 16  # global batch [B, S]: 8 sequences of 16 tokens


def pc(**kw) -> ParallelConfig:
    return ParallelConfig(**kw)


# One short step of each plan, on 4 and 8 gloo ranks: TP with and without SP, CP ring and Ulysses, PP 1F1B and
# interleaved, DP with ZeRO 0..3, and for the MoE model EP, ETP and folding.
DENSE_PLANS = [
    P.Plan(pc(tp=2, dp=2), RunOptions(sequence_parallel=True, zero_stage=0, n_microbatches=2)),
    P.Plan(pc(tp=2, dp=2), RunOptions(sequence_parallel=False, zero_stage=1)),
    P.Plan(pc(cp=2, dp=2), RunOptions(cp_kind="ring", zero_stage=2, n_microbatches=2)),
    P.Plan(pc(tp=2, cp=2), RunOptions(sequence_parallel=True, cp_kind="ulysses", zero_stage=3)),
    P.Plan(pc(dp=2, pp=2), RunOptions(zero_stage=1, n_microbatches=4)),
    P.Plan(pc(tp=2, pp=2), RunOptions(sequence_parallel=True, n_microbatches=4, v=2)),
    P.Plan(pc(tp=2, cp=2, pp=2), RunOptions(sequence_parallel=True, cp_kind="ring", zero_stage=2, n_microbatches=2)),
]
MOE_PLANS = [
    P.Plan(pc(tp=2, dp=2, ep=2), RunOptions(sequence_parallel=True, zero_stage=1, n_microbatches=2)),
    P.Plan(pc(cp=2, dp=2, ep=4), RunOptions(cp_kind="ulysses", zero_stage=3)),
    P.Plan(pc(tp=2, dp=2, ep=2, etp=2), RunOptions(sequence_parallel=True, zero_stage=2, n_microbatches=2)),
    P.Plan(pc(dp=2, pp=2, ep=2), RunOptions(n_microbatches=4, v=2)),
]
SHARED_PLANS = [
    P.Plan(pc(tp=2, dp=2, ep=2), RunOptions(sequence_parallel=True, zero_stage=1, n_microbatches=2)),
    P.Plan(pc(dp=2, pp=2, ep=2), RunOptions(zero_stage=3, n_microbatches=4, v=2)),
]


@pytest.fixture(scope="module")
def measured():
    out = {}
    for cfg, plans in ((DENSE, DENSE_PLANS), (MOE, MOE_PLANS), (SHARED, SHARED_PLANS), (GATHER, SHARED_PLANS)):
        for plan in plans:
            assert not P.problems(cfg, plan, plan.par.world_size, B, S), plan.describe()
        records = measure_plans(cfg, plans, batch=B, seq=S)
        out.update({(cfg, plan): (cfg, records[plan]) for plan in plans})
    return out


def _checks(measured, kind: str, routing: str = "measured"):
    out = []
    for (_, plan), (cfg, records) in measured.items():
        out += [(plan, c) for c in compare(cfg, plan, records, batch=B, seq=S, routing=routing) if kind in c.quantity]
    assert out, kind
    return out


def _unequal(checks):
    return [(plan.describe(), c) for plan, c in checks if c.predicted != c.measured]


@pytest.mark.slow
def test_predicted_parameter_gradient_and_optimizer_bytes_equal_every_ranks_measurement(measured):
    for kind in ("params", "grads", "optim"):
        checks = _checks(measured, kind)
        assert not _unequal(checks), _unequal(checks)
        assert all(c.measured > 0 for _, c in checks)
    # the ZeRO stages really differ: ZeRO-3 holds a dp-cp share of the parameters of ZeRO-0
    optim = {(p.par, p.options.zero_stage): c.measured for p, c in _checks(measured, "optim") if c.rank == 0}
    assert optim[(pc(tp=2, dp=2), 1)] < 0.6 * optim[(pc(tp=2, dp=2), 0)]


@pytest.mark.slow
def test_predicted_saved_activation_bytes_per_chunk_and_schedule_peak_equal_the_probe(measured):
    chunks = _checks(measured, "saved activations")
    assert not _unequal(chunks), _unequal(chunks)
    peaks = _checks(measured, "activation peak")  # dense plans (MoE microbatches route differently)
    assert not _unequal(peaks), _unequal(peaks)
    # interleaved: two chunks per rank; 1F1B with m = 4 on pp = 2: rank 0 keeps 2 microbatches, rank 1 one
    assert any(c.quantity.endswith("chunk 1") for _, c in chunks)
    one = pc(dp=2, pp=2)
    chunk = {c.rank: c.measured for p, c in chunks if p.par == one}
    peak = {c.rank: c.measured for p, c in peaks if p.par == one}
    assert peak[0] == 2 * chunk[0] and peak[3] == chunk[3]  # rank 3: dp 1, pp 1 (order tp-cp-ep-dp-pp)


@pytest.mark.slow
def test_predicted_bytes_sent_per_axis_equal_the_tracer_for_every_rank_and_axis(measured):
    checks = _checks(measured, "sent on")
    assert not _unequal(checks), _unequal(checks)
    axes = {c.quantity.removeprefix("sent on ") for _, c in checks if c.measured}
    assert {"tp", "cp", "pp", "dp-cp", "ep", "etp", "edp"} <= axes, axes


@pytest.mark.slow
def test_with_expected_routing_only_the_expert_axes_differ_from_the_run(measured):
    checks = _checks(measured, "sent on", routing="expected")
    off = _unequal(checks)
    assert {c.quantity for _, c in off} <= {"sent on ep", "sent on etp"}, off
    for _, c in off:  # an expectation under uniform routing: within a quarter of what this seed's router sent
        assert not c.exact and abs(c.predicted - c.measured) < 0.25 * c.measured, c


# ------------------------------------------------------------------------------------------------ enumeration


def _brute_force(cfg, world: int, batch: int, seq: int) -> set:
    """Every combination of every knob, kept when compose_problems accepts it, then written canonically."""
    divs = [d for d in range(1, world + 1) if world % d == 0]
    ms = [m for m in range(1, batch + 1) if batch % m == 0]
    vs = [v for v in range(1, cfg.n_layers + 1) if cfg.n_layers % v == 0]
    moe = cfg.moe is not None
    out = set()
    for tp, cp, dp, pp, ep, etp in itertools.product(divs, repeat=6):
        if not moe and (ep, etp) != (1, 1):
            continue  # a dense model has no expert axes
        par = pc(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, etp=etp)
        if par.problems(world):  # the mesh alone fails: compose_problems rejects every option below too
            continue
        for sp, kind, zero, v, m in itertools.product((False, True), P.CP_KINDS, P.ZERO_STAGES, vs, ms):
            schedule = "interleaved" if v > 1 else "1f1b"
            plan = P.Plan(par, RunOptions(sp, kind, schedule=schedule, n_microbatches=m, v=v, zero_stage=zero))
            if not compose_problems(cfg, par, world, batch=batch, seq=seq, options=plan.options):
                out.add(P.canonical(plan, has_experts=moe))
    return out


@pytest.mark.parametrize("cfg", [DENSE, MOE], ids=["dense", "moe"])
def test_enumeration_is_exactly_the_plans_compose_problems_accepts(cfg):
    plans = P.enumerate_plans(cfg, 4, 8, 16)
    assert len(plans) == len(set(plans))
    assert set(plans) == _brute_force(cfg, 4, 8, 16)
    # and the mesh-pruning shortcut in the brute force is sound: a bad mesh fails whatever the options
    assert compose_problems(cfg, pc(tp=3), 4, batch=8, seq=16)


def test_enumeration_restrictions_keep_only_the_asked_microbatch_sizes_and_virtual_stages():
    plans = P.enumerate_plans(
        DENSE, 8, 16, 16, P.SearchSpace(micro_batch_sizes=(2,), virtual_stages=(1,), zero_stages=(0,))
    )
    assert plans and all(p.micro_batch(16) == 2 and p.options.v == 1 and p.options.zero_stage == 0 for p in plans)
    assert {p.par.pp for p in plans} == {1, 2, 4}


# ------------------------------------------------------------------------------------------------ ranking, placement


def test_rank_plans_returns_the_cost_models_best_plans_in_order():
    cfg = ModelConfig(vocab_size=32000, d_model=2048, n_layers=16, n_heads=16, d_ff=8192, dtype="bfloat16")
    work, cluster = P.Workload(batch=64, seq=2048), P.Cluster(16, gpu_memory=16e9)
    plans = P.enumerate_plans(cfg, 16, 64, 2048, P.SearchSpace(micro_batch_sizes=(1, 2), virtual_stages=(1, 2)))
    best = P.rank_plans(cfg, work, cluster, top=5, plans=plans)
    every = sorted(
        (P.predict(cfg, p, work, cluster) for p in P.most_microbatches(plans)),
        key=lambda x: (not x.fits, x.step_time if x.fits else 0, x.peak_memory),
    )
    assert [x.plan for x in best] == [x.plan for x in every[:5]]
    assert all(a.step_time <= b.step_time for a, b in zip(best, best[1:]))
    # most_microbatches drops no plan that could win: every dropped plan is no faster than its kept sibling
    kept = set(P.most_microbatches(plans))
    for p in plans[:200]:
        if p not in kept:
            sib = next(
                k
                for k in kept
                if (k.par, k.options.sequence_parallel, k.options.cp_kind, k.options.zero_stage, k.options.v)
                == (p.par, p.options.sequence_parallel, p.options.cp_kind, p.options.zero_stage, p.options.v)
            )
            assert P.predict(cfg, sib, work, cluster).step_time <= P.predict(cfg, p, work, cluster).step_time


def test_crosses_nodes_agrees_with_the_real_rank_groups():
    for par in (
        pc(tp=2, cp=2, dp=2, pp=2),
        pc(tp=4, dp=2, pp=2, ep=2, etp=2),
        pc(tp=2, dp=4, pp=2, order="dp-tp-cp-ep-pp"),
    ):
        groups = rank_groups(par, 16)
        for name in ("tp", "cp", "dp-cp", "pp", "ep", "etp", "etp-ep", "edp"):
            want = any(len({r // 4 for r in g}) > 1 for g in groups[name])
            assert P.crosses_nodes(par, 16, name, 4) == want, (par, name)


def test_schedule_peak_replays_the_microbatches_in_flight_of_pylib_analysis_pp():
    for p, m in ((4, 8), (4, 2), (2, 5)):
        for r in range(p):
            assert peak_saved_bytes([100], "1f1b", p, m, 1, r) == 100 * peak_in_flight("1f1b", p, m, r)
            assert live_counts("1f1b", p, m, 1, r) == ((peak_in_flight("1f1b", p, m, r),),)
    for p, m, v in ((2, 4, 2), (4, 8, 2), (2, 6, 3)):
        for r in range(p):  # equal chunks: the peak is the count of (microbatch, chunk) pairs alive at once
            assert peak_saved_bytes([100] * v, "interleaved", p, m, v, r) == 100 * peak_in_flight(
                "interleaved", p, m, r, v
            )


@pytest.mark.slow  # the search at full size (a few seconds by design)
def test_a_seven_billion_model_on_256_gpus_ranks_in_seconds_and_fits():
    from pylib.viz.planner import SEARCH, llama2_7b

    t0 = time.perf_counter()
    best = P.rank_plans(llama2_7b(), P.Workload(512, 4096), P.Cluster(256), top=5, space=SEARCH)
    assert time.perf_counter() - t0 < 20
    assert len(best) == 5 and all(x.fits for x in best)
    assert best[0].peak_memory <= P.Cluster(256).usable_memory


# ------------------------------------------------------------------------------------------------ errors


def test_bad_inputs_are_refused_with_the_constraint_named():
    with pytest.raises(ValueError, match="precision='fp8' must be one of"):
        P.Workload(8, 16, precision="fp8")
    with pytest.raises(ValueError, match="attention='sdpa' must be one of"):
        P.Workload(8, 16, attention="sdpa")
    with pytest.raises(ValueError, match="world_size=0"):
        P.Cluster(0)
    with pytest.raises(ValueError, match="batch=0"):
        P.enumerate_plans(DENSE, 4, 0, 16)
    with pytest.raises(ValueError, match="tp=3 does not divide n_heads=4"):
        P.predict(DENSE, P.Plan(pc(tp=3)), P.Workload(8, 16, precision="uniform"), P.Cluster(3))
    with pytest.raises(ValueError, match="precision='mixed' counts 16-bit parameters"):
        P.predict(DENSE, P.Plan(pc(dp=4)), P.Workload(8, 16), P.Cluster(4))
    with pytest.raises(ValueError, match="no plan runs"):
        P.rank_plans(DENSE, P.Workload(3, 16, precision="uniform"), P.Cluster(5))
    with pytest.raises(ValueError, match="routing='random'"):
        compare(DENSE, DENSE_PLANS[0], [], batch=B, seq=S, routing="random")


# ------------------------------------------------------------------------------------------------ recomputation

RECOMPUTE_PLANS = [
    P.Plan(pc(tp=2, pp=2), RunOptions(sequence_parallel=True, n_microbatches=2, recompute="selective")),
    P.Plan(pc(tp=2, cp=2), RunOptions(sequence_parallel=True, cp_kind="ring", recompute="full")),
    P.Plan(pc(tp=2, cp=2), RunOptions(sequence_parallel=False, cp_kind="ring", recompute="selective")),
    P.Plan(pc(cp=2, dp=2), RunOptions(cp_kind="ulysses", zero_stage=3, recompute=Recompute("full", method="block"))),
    P.Plan(pc(cp=2, dp=2), RunOptions(cp_kind="ulysses", zero_stage=1, n_microbatches=2, recompute="selective")),
    P.Plan(
        pc(tp=2, pp=2),
        RunOptions(
            sequence_parallel=True,
            n_microbatches=4,
            v=2,
            recompute=Recompute("full", num_layers=2),
            schedule="interleaved",
        ),
    ),
    P.Plan(pc(tp=4), RunOptions(sequence_parallel=True, recompute=Recompute("full", num_layers=2))),
]


@pytest.mark.slow
def test_predictions_under_every_recompute_choice_equal_the_runs_byte_for_byte():
    """Saved bytes per chunk, the schedule's peak, the model state and the bytes sent on every axis (the re-run
    collectives included) for plans with selective and full recomputation, on real runs of 4 ranks."""
    records = measure_plans(DENSE, RECOMPUTE_PLANS, batch=B, seq=S)
    checks = [(plan, c) for plan in RECOMPUTE_PLANS for c in compare(DENSE, plan, records[plan], batch=B, seq=S)]
    assert not _unequal(checks), _unequal(checks)
    kinds = {c.quantity.split(",")[0] for _, c in checks}
    assert {"saved activations", "activation peak", "sent on tp", "sent on cp"} <= kinds, kinds
    # recomputation really saved something: the first plan's chunks against the same plan without it
    base = RECOMPUTE_PLANS[1].with_options(recompute="none")
    work = P.Workload(B, S, precision="uniform", attention="math")
    full = P.rank_memory(DENSE, RECOMPUTE_PLANS[1], work, 0)["activations"]
    assert full * 4 < P.rank_memory(DENSE, base, work, 0)["activations"]
