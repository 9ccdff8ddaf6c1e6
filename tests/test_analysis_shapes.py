"""pylib.analysis.shapes predicts, from sizes alone, what the real sharded modules hold and move: every local
parameter shape, every activation seed B lists, every score block of ring attention, and the traced bytes of one
training step -- for each mode alone (TP, SP, CP ring and Ulysses, DP, PP, EP, ETP) and for the composed model of
pylib.compose (TP x SP x CP x DP, and TP x SP x PP x EP x DP with MoE layers and micro-batches)."""

from dataclasses import replace

import pytest
import torch

from pylib.analysis import shapes, weights
from pylib.experiments.mode_probes import probe_compose, probe_modes
from pylib.model import ModelConfig, MoEConfig
from pylib.plan import RunOptions, ZeroStage, zero_stage
from pylib.plan.presets import probe_config
from pylib.runtime import ParallelConfig, launch

CFG = probe_config()
MOE = CFG.with_(moe=MoEConfig(n_experts=8, top_k=2, d_ff=32, every=2))
MQA = CFG.with_(n_kv_heads=1, mlp="gelu")  # tp=2 > n_kv_head=1: the K/V head is replicated on both TP ranks
B, S, N, M = 4, 16, 2, 2  # batch, sequence, ranks per mode, pipeline micro-batches

# mode -> (model, plan, global batch b as shapes.py counts it, sequence parallel, cp kind)
PLANS = {
    "TP": (CFG, ParallelConfig(tp=N), B, False, "ring"),
    "SP": (CFG, ParallelConfig(tp=N), B, True, "ring"),
    "CP": (MOE, ParallelConfig(cp=N), B, False, "ring"),
    "CP ulysses": (CFG, ParallelConfig(cp=N), B, False, "ulysses"),
    "DP": (MOE, ParallelConfig(dp=N), B, False, "ring"),
    "PP": (MOE, ParallelConfig(pp=N), B, False, "ring"),
    "EP": (MOE, ParallelConfig(dp=N, ep=N), N * B, False, "ring"),  # EP folds over DP: each rank its own b
    "ETP": (MOE, ParallelConfig(tp=2, dp=N // 2, ep=N // 2, etp=2), N // 2 * B, False, "ring"),
    "TP kv-replicated": (MQA, ParallelConfig(tp=N), B, False, "ring"),
}


@pytest.fixture(scope="module")
def modes():
    return launch(probe_modes, N, CFG, MOE, B, S, n_microbatches=M, kv_replicated_cfg=MQA, ulysses=True)


def _plan_kw(mode, rank):
    cfg, par, b, sp, kind = PLANS[mode]
    return cfg, par, b, dict(options=RunOptions(sequence_parallel=sp, cp_kind=kind), pp_rank=rank if par.pp > 1 else 0)


def _normalise(name: str) -> str:
    return name.replace(".experts.experts.", ".experts.")  # ExpertParallelMoE's LocalExperts -> local index


@pytest.mark.parametrize("mode", list(PLANS))
def test_local_parameter_shapes_equal_the_real_sharded_modules(modes, mode):
    for rank, run in enumerate(modes):
        cfg, par, _, kw = _plan_kw(mode, rank)
        predicted = weights.local_parameters(cfg, par, pp_rank=kw["pp_rank"])
        held = {_normalise(n): s for n, s in run[mode]["params"].items()}
        if mode == "ETP":  # that run shards only the experts (its dense layers are the reference's)
            predicted = {n: s for n, s in predicted.items() if "mlp.experts" in n or "router" in n}
            held = {n: s for n, s in held.items() if n in predicted or "mlp.experts" in n}
        assert held == predicted, (mode, rank, set(held) ^ set(predicted))


@pytest.mark.parametrize("mode", list(PLANS))
def test_activation_shapes_equal_the_hooked_tensors_and_score_blocks(modes, mode):
    for rank, run in enumerate(modes):
        cfg, par, b, kw = _plan_kw(mode, rank)
        rec = run[mode]
        acts = shapes.activation_shapes(cfg, par, b, S, cp_rank=rank if par.cp > 1 else 0, **kw)
        compared = 0
        for a in acts:
            if a.local is None or a.name not in rec["acts"] or a.expected:
                continue
            if mode == "ETP" and a.name not in ("input hidden", "router logits", "block output"):
                continue  # that run shards only the experts (its attention is the reference's)
            assert rec["acts"][a.name] == a.local, (mode, rank, a.name, rec["acts"][a.name], a.local)
            compared += 1
        assert compared >= (3 if mode == "ETP" else 7), (mode, compared)
        if mode == "ETP":
            continue
        blocks = shapes.score_blocks(cfg, par, b, S, kw["options"], cp_rank=rank if par.cp > 1 else 0)
        assert rec["scores"] == blocks, (mode, rank, rec["scores"], blocks)


@pytest.mark.parametrize("mode", ["EP", "ETP"])
def test_expected_expert_rows_equal_the_mean_over_ranks_and_experts(modes, mode):
    """Rows reaching a local expert depend on the routing; their mean over every rank and local expert is the
    prediction exactly (no capacity limit: every assignment arrives, at etp ranks under ETP)."""
    cfg, par, b, kw = _plan_kw(mode, 0)
    (row,) = [a for a in shapes.activation_shapes(cfg, par, b, S, **kw) if a.name == "expert input"]
    rows = [r for run in modes for r in run[mode]["expert_rows"]]
    assert len(rows) == N * cfg.moe.n_experts // par.ep
    assert sum(rows) / len(rows) == row.local[0]


def _sent(events, op=None, **match):
    return sum(
        e["bytes_sent"] for e in events if (op is None or e["op"] == op) and all(e[k] == v for k, v in match.items())
    )


@pytest.mark.parametrize("mode", list(PLANS))
def test_traffic_equals_the_traced_bytes_of_one_step(modes, mode):
    for rank, run in enumerate(modes):
        cfg, par, b, kw = _plan_kw(mode, rank)
        ev = run[mode]["events"]
        options = replace(kw["options"], n_microbatches=M if par.pp > 1 else 1)
        rows = shapes.traffic(cfg, par, b, S, options, pp_rank=kw["pp_rank"])
        if mode == "ETP":
            continue  # expert traffic is routing-dependent; its payload is checked for EP below
        by_mode = shapes.traffic_by_mode(rows)
        if mode.startswith("TP") or mode == "SP":
            key = "SP" if mode == "SP" else "TP"
            assert _sent(ev) == by_mode[key], (mode, rank)
            for op in ("all_reduce", "all_gather", "reduce_scatter"):
                assert _sent(ev, op) == sum(r.sent for r in rows if r.op == op), (mode, op)
        elif mode == "CP":
            assert _sent(ev, "send") == by_mode["CP"]
            assert {e["op"] for e in ev} == {"send", "recv", "all_reduce"}  # + the loss's scalar all-reduce
        elif mode == "CP ulysses":
            assert _sent(ev, "all_to_all") == by_mode["CP"]
        elif mode == "DP":
            assert _sent(ev) == by_mode["DP"] and {e["op"] for e in ev} == {"all_reduce"}
        elif mode == "PP":
            p2p = [e for e in ev if e["op"] == "send"]
            assert sum(e["bytes_sent"] for e in p2p) == by_mode["PP"]
            (pp_row,) = [r for r in rows if r.mode == "PP"]  # (+ the pipeline's start-up sync, a scalar)
            assert {e["payload_bytes"] for e in p2p} == {pp_row.message}
        elif mode == "EP":
            (ep_row,) = [r for r in rows if r.mode == "EP" and r.when.startswith("dispatch")]
            ends = ("dispatch", "combine")
            moved = [e for e in ev if e["op"] == "all_to_all" and e["tag"].rsplit(".", 1)[-1] in ends]
            assert len(moved) == ep_row.count
            dispatch = [e for e in moved if e["phase"] == "forward" and e["tag"].endswith("dispatch")]
            assert {e["payload_bytes"] for e in dispatch} == {ep_row.message}  # B * K * h * dtype, no dropping


# The composed model (pylib.compose): every mode on one mesh. (name, model, plan, micro-batches, global batch)
COMPOSED = {
    "tp2 cp2 dp2 + SP": (CFG, ParallelConfig(tp=2, cp=2, dp=2), 1, 4),
    "tp2 pp2 dp2 ep2 + SP, MoE": (MOE, ParallelConfig(tp=2, pp=2, dp=2, ep=2), 2, 8),
}


@pytest.fixture(scope="module", params=list(COMPOSED))
def composed(request):
    cfg, pc, m, batch = COMPOSED[request.param]
    runs = launch(probe_compose, pc.world_size, cfg, pc, batch, S, RunOptions(sequence_parallel=True, n_microbatches=m))
    return cfg, pc, m, batch, [r["model"] for r in runs]


def test_composed_model_holds_and_moves_what_shapes_predicts(composed):
    """Parameters, activations, score blocks and the traffic of every axis of one training step of
    pylib.compose's model equal shapes.py's prediction on every rank (b = the micro-batch across DP)."""
    cfg, pc, m, batch, runs = composed
    b = batch // m
    options = RunOptions(sequence_parallel=True, cp_kind="ring", n_microbatches=m)
    for run in runs:
        c = run["coords"]
        held = {_normalise(n): s for n, s in run["params"].items()}
        assert held == weights.local_parameters(cfg, pc, pp_rank=c["pp"]), c
        compared = 0
        for a in shapes.activation_shapes(cfg, pc, b, S, options, pp_rank=c["pp"], cp_rank=c["cp"]):
            if a.local is not None and a.name in run["acts"] and not a.expected:
                assert run["acts"][a.name] == a.local, (a.name, c)
                compared += 1
        assert compared >= 7
        assert run["scores"] == shapes.score_blocks(cfg, pc, b, S, cp_rank=c["cp"])
        rows = shapes.traffic(cfg, pc, b, S, options, pp_rank=c["pp"])
        ev = [e for e in run["events"] if e["phase"] != "loss"]  # the reported loss's two scalar all-reduces
        by_mode = shapes.traffic_by_mode(rows)
        assert _sent(ev, axis="tp") == by_mode["SP"], c
        assert _sent(ev, "send", axis="cp") == by_mode.get("CP", 0), c
        assert _sent(ev, "send", axis="pp") == by_mode.get("PP", 0), c
        dense, expert = (
            [r for r in rows if r.mode == "DP" and "dense" in r.when],
            [r for r in rows if r.mode == "DP" and "expert" in r.when],
        )
        assert _sent(ev, axis="dp-cp") == sum(r.sent for r in dense), c
        assert _sent(ev, axis="edp") == sum(r.sent for r in expert), c
        if cfg.moe is not None:
            (ep_row,) = [r for r in rows if r.mode == "EP" and r.when.startswith("dispatch")]
            forward = [e for e in ev if e["axis"] == "ep" and e["phase"] == "forward"]
            dispatch = [e for e in forward if e["tag"].endswith("dispatch")]
            assert {e["payload_bytes"] for e in dispatch} == {ep_row.message}, c


def test_composed_model_computes_the_reference_loss(composed):
    from pylib.model import build_model, random_tokens

    cfg, _, _, batch, runs = composed
    ids, targets = random_tokens(cfg, batch, S, seed=0)
    with torch.no_grad():
        want = build_model(cfg).loss(ids, targets).item()
    assert all(abs(r["loss"] - want) < 1e-5 for r in runs)


# ------------------------------------------------------------------------------------------------ pure


def test_parameter_count_equals_the_meta_device_model():
    from pylib.model.transformer import Transformer

    cfg = ModelConfig(vocab_size=32000, d_model=8192, n_layers=4, n_heads=64, n_kv_heads=8, d_ff=28672, mlp="swiglu")
    with torch.device("meta"):
        model = Transformer(cfg)
    assert weights.model_parameter_count(cfg) == sum(p.numel() for p in model.parameters())
    moe = cfg.with_(moe=MoEConfig(n_experts=16, top_k=2, d_ff=2048, every=2))
    with torch.device("meta"):
        model = Transformer(moe)
    assert weights.model_parameter_count(moe) == sum(p.numel() for p in model.parameters())


def test_parallel_parameters_partition_the_model_when_nothing_is_replicated():
    """With TP (heads and K/V heads split), PP and EP, every rank's parameters add up to the model, plus the
    copies that TP keeps whole (LayerNorms, router) on each TP rank."""
    cfg = MOE
    par = ParallelConfig(tp=2, pp=2, dp=2, ep=4)
    total = 0
    for pp_rank in range(par.pp):
        for w in weights.weight_shapes(cfg, par, pp_rank=pp_rank):
            if w.local is None:
                continue
            if w.name.startswith("expert"):
                total += w.local_numel * w.count * par.ep  # the ep ranks hold different experts
            elif w.splits:
                total += w.local_numel * w.count * par.tp
            else:
                total += w.local_numel * w.count
    assert total == weights.model_parameter_count(cfg)


def test_check_plan_names_each_violated_constraint():
    problems = shapes.check_plan(CFG, ParallelConfig(tp=3, pp=3, cp=5), 4, 16, RunOptions(sequence_parallel=True))
    text = "; ".join(problems)
    for part in (
        "tp=3 does not divide n_heads=8",
        "n_layers=4 is not divisible by pp × v = 3 × 1 = 3",
        "2*cp=10 chunks: sequence length s=16 is not divisible by 10",  # zig-zag: 2 cp chunks (pylib.plan.problems)
    ):
        assert part in text, text
    with pytest.raises(ValueError, match="dp=3 does not divide the global batch size B=4"):
        shapes.activation_shapes(CFG, ParallelConfig(dp=3), 4, 16)
    assert shapes.summary(CFG, ParallelConfig(tp=3), 4, 16).problems


def test_kv_heads_replicate_when_tp_exceeds_them():
    assert shapes.kv_heads_per_rank(64, 8, 8) == (1, 1)
    assert shapes.kv_heads_per_rank(64, 8, 16) == (1, 2)
    assert shapes.kv_heads_per_rank(64, 8, 4) == (2, 1)
    with pytest.raises(ValueError, match="tp=4 does not divide n_kv_heads=6"):
        shapes.kv_heads_per_rank(12, 6, 4)


def test_memory_counts_the_local_parameters_and_shards_optimizer_state_under_zero():
    par = ParallelConfig(tp=2, dp=4)
    e = 4
    n = sum(math_prod(s) for s in weights.local_parameters(CFG, par).values())
    ddp = shapes.memory(CFG, par, 8, S)
    z1 = shapes.memory(CFG, par, 8, S, RunOptions(zero_stage=ZeroStage.ZERO1))
    assert ddp["params"] == n * e and ddp["grads"] == n * e and ddp["optim"] == 2 * n * e
    assert z1["params"] == n * e and z1["optim"] == 2 * n * e / 4


def math_prod(shape):
    out = 1
    for v in shape:
        out *= v
    return out


# The explorer (shapes.summary) and the planner (planner.predict) ask the same models: the same plan, the same answer.
SAME_PLANS = [
    (CFG, ParallelConfig(tp=2, dp=2), 4, True, "ring", "ddp", 1),
    (CFG, ParallelConfig(tp=2, cp=2, dp=2), 4, True, "ring", "zero1", 1),
    (CFG, ParallelConfig(cp=2, pp=2), 2, False, "ulysses", "ddp", 2),
    (MQA, ParallelConfig(tp=2, pp=2, dp=2), 2, True, "ring", "zero3", 4),
    (MOE, ParallelConfig(tp=2, pp=2, dp=2, ep=2), 4, True, "ring", "zero2", 2),
    (MOE, ParallelConfig(dp=4, ep=2, etp=2), 8, False, "ring", "ddp", 1),
    (MOE, ParallelConfig(cp=2, dp=2, ep=4), 2, False, "ring", "zero3", 1),
]


@pytest.mark.parametrize("case", range(len(SAME_PLANS)))
def test_the_explorer_and_the_planner_give_the_same_memory_and_traffic(case):
    from pylib.analysis import planner as P

    cfg, par, b, sp, kind, zero, m = SAME_PLANS[case]
    options = RunOptions(sequence_parallel=sp, cp_kind=kind, n_microbatches=m, zero_stage=zero_stage(zero))
    plan = P.Plan(par, replace(options, sequence_parallel=sp and par.tp > 1))
    workload = P.Workload(b * m, S, precision="uniform", attention="math")
    predicted = P.predict(cfg, plan, workload, P.Cluster(par.world_size))
    for rank in predicted.ranks:
        shown = shapes.summary(cfg, par, b, S, options, pp_rank=rank.pp_rank)
        assert not shown.problems, shown.problems
        assert {k: shown.memory[k] for k in rank.memory} == rank.memory, (case, rank.pp_rank)
        assert sum(t.sent for t in shown.traffic) == sum(a["bytes_sent"] for a in rank.traffic.values())
        ops = {}
        for t in shown.traffic:
            ops[t.op] = ops.get(t.op, 0) + t.count
        planned = {}
        for a in rank.traffic.values():
            for op, n in a["ops"].items():
                planned[op] = planned.get(op, 0) + n
        assert ops == {op: n for op, n in planned.items() if op != "recv"}, (case, rank.pp_rank)
