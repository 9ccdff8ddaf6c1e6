"""The composed TP x SP x CP x EP x DP x PP model trains exactly like the single-device reference.

Five real runs (module-scoped, one launch each) cover the axes, the ZeRO stages, the schedules and both CP kernels:

    run        ranks  axes                       model                         DP      schedule          CP
    dense16    16     tp2 cp2 dp2 pp2            SwiGLU, GQA, RoPE, float64    ZeRO-1  1f1b m=2          ring
    moe8        8     tp2 dp4 ep4 etp1 (folded)  MoE every 2nd layer, float64  DDP     m=2               -
    five16     16     tp2 cp2 dp2 pp2 ep2        MoE + aux/z loss + capacity   ZeRO-3  interleaved v=2   Ulysses
    mqa8        8     tp2 dp2 pp2, SP off        MQA (replicated K/V), float32 ZeRO-2  gpipe m=2         -
    super16    16     tp4 cp2 dp2 ep4            MoE every 2nd layer, float64  ZeRO-2  m=1               ring
    dplast8     8     tp2 dp2 pp2 ep2, dp last   MoE every 2nd layer, float64  ZeRO-1  1f1b m=2          -

MOE_PATHS adds nine small runs (2 and 4 ranks, SGD) of a MoE with one shared expert (issue 32): the all-to-all, the
all-gather (over the etp x ep grid) and the padded all-to-all dispatcher on dp2 x ep2, tp2 (+SP) x ep2 (also with
etp2) and pp2 x ep2, each equal to the reference and its traffic to the formulas like the runs above.

dplast8 uses Megatron's `--use-tp-pp-dp-mapping` order, tp-cp-ep-pp-dp, which Megatron-Core accepts when etp*ep =
tp*cp (the dense and the expert layout then agree on every rank's stage).

Each test states one claim and checks it on the runs it concerns: the loss curve and the final parameters against
the reference, the traffic per axis against the modes' formulas, the held bytes against the DP formulas, the
reduction table, and seed B's 1/(tp*cp*dp) superposition of the FFN activation.
"""

import pytest
import torch

from pylib.analysis.compose import dp_held_bytes, per_axis
from pylib.compose import format_reduction_table, format_report, formula_traffic, reference_ffn_bytes, traced_traffic
from pylib.experiments.compose_training import compare_with_reference, train, train_reference
from pylib.model import ModelConfig, MoEConfig
from pylib.plan import RunOptions
from pylib.plan.presets import tiny, tiny_gqa, tiny_moe
from pylib.runtime import ParallelConfig, launch

pytestmark = pytest.mark.timeout(240)

BATCH, SEQ, STEPS = 8, 16, 5
DATA = "pattern"  # a generated toy language (pylib.model.pattern_tokens): a few steps visibly lower the loss
DENSE = tiny_gqa()
MOE = tiny_moe()
MOE_AUX = tiny().with_(
    position="rope",
    moe=MoEConfig(n_experts=4, top_k=2, every=2, aux_loss_coef=0.1, z_loss_coef=0.01, capacity_factor=1.0),
)
SHARED = tiny_moe().with_(moe=MoEConfig(n_experts=4, top_k=2, every=2, n_shared_experts=1))
GATHER = SHARED.with_(moe=MoEConfig(n_experts=4, top_k=2, every=2, n_shared_experts=1, dispatcher="allgather"))
PADDED = SHARED.with_(
    moe=MoEConfig(n_experts=4, top_k=2, every=2, n_shared_experts=1, capacity_factor=1.5, pad_to_capacity=True)
)
SGD = dict(optimizer=torch.optim.SGD, lr=0.5)  # a gradient's scale shows in the parameters (Adam would hide it)
MQA = ModelConfig(
    vocab_size=32, d_model=16, n_layers=2, n_heads=4, n_kv_heads=1, d_ff=32, position="rope", dtype="float32"
)

RUNS = {
    "dense16": (
        DENSE,
        ParallelConfig(tp=2, cp=2, dp=2, pp=2),
        16,
        RunOptions(zero_stage=1, schedule="1f1b", n_microbatches=2, cp_kind="ring"),
        dict(bucket_bytes=4096),
    ),
    "moe8": (
        MOE,
        ParallelConfig(tp=2, dp=4, ep=4, etp=1),
        8,
        RunOptions(zero_stage=0, n_microbatches=2),
        dict(optimizer=torch.optim.SGD, lr=0.5),
    ),
    "five16": (
        MOE_AUX,
        ParallelConfig(tp=2, cp=2, dp=2, pp=2, ep=2),
        16,
        RunOptions(zero_stage=3, schedule="interleaved", v=2, n_microbatches=2, cp_kind="ulysses"),
        {},
    ),
    "mqa8": (
        MQA,
        ParallelConfig(tp=2, dp=2, pp=2),
        8,
        RunOptions(zero_stage=2, schedule="gpipe", n_microbatches=2, sequence_parallel=False),
        {},
    ),
    "super16": (MOE, ParallelConfig(tp=4, cp=2, dp=2, ep=4), 16, RunOptions(zero_stage=2, n_microbatches=1), {}),
    "dplast8": (
        MOE,
        ParallelConfig(tp=2, dp=2, pp=2, ep=2, order="tp-cp-ep-pp-dp"),
        8,
        RunOptions(zero_stage=1, schedule="1f1b", n_microbatches=2),
        {},
    ),
}
# Shared experts and the other two dispatch paths (issue 32), each on dp2 x ep2 (ep carved from dp), tp2 (+SP) x ep2
# and pp2 x ep2, one ZeRO stage each
MOE_PATHS = {
    "shared-dp2ep2": (SHARED, ParallelConfig(dp=2, ep=2), 2, RunOptions(zero_stage=1, n_microbatches=2), SGD),
    "shared-tp2ep2": (SHARED, ParallelConfig(tp=2, dp=2, ep=2), 4, RunOptions(zero_stage=3, n_microbatches=2), SGD),
    "shared-pp2ep2": (
        SHARED,
        ParallelConfig(pp=2, dp=2, ep=2),
        4,
        RunOptions(zero_stage=2, schedule="1f1b", n_microbatches=2),
        SGD,
    ),
    "gather-dp2ep2": (GATHER, ParallelConfig(dp=2, ep=2), 2, RunOptions(zero_stage=0, n_microbatches=2), SGD),
    "gather-tp2ep2": (GATHER, ParallelConfig(tp=2, dp=2, ep=2), 4, RunOptions(zero_stage=1, n_microbatches=2), SGD),
    "gather-tp2ep2etp2": (
        GATHER,
        ParallelConfig(tp=2, dp=2, ep=2, etp=2),
        4,
        RunOptions(zero_stage=3, n_microbatches=2),
        SGD,
    ),
    "gather-pp2ep2": (
        GATHER,
        ParallelConfig(pp=2, dp=2, ep=2),
        4,
        RunOptions(zero_stage=1, schedule="1f1b", n_microbatches=2),
        SGD,
    ),
    "padded-pp2ep2": (
        PADDED,
        ParallelConfig(pp=2, dp=2, ep=2),
        4,
        RunOptions(zero_stage=1, schedule="1f1b", n_microbatches=2),
        SGD,
    ),
    "padded-tp2ep2etp2": (
        PADDED,
        ParallelConfig(tp=2, dp=2, ep=2, etp=2),
        4,
        RunOptions(zero_stage=2, n_microbatches=2),
        SGD,
    ),
}
RUNS |= MOE_PATHS
_cache: dict[str, tuple] = {}


def run(name: str):
    """(results per rank, reference, the run's spec): launched once per test process (`make test` keeps a module's
    tests on one xdist worker)."""
    if name not in _cache:
        cfg, pc, world, options, kw = RUNS[name]
        steps = 1 if name == "super16" else STEPS
        run_kw = dict(steps=steps, batch=BATCH, seq=SEQ, data=DATA, record=("ffn",), timeout=200)
        results = launch(train, world, cfg, pc, options, **run_kw, **kw)
        ref_kw = {k: kw[k] for k in ("optimizer", "lr") if k in kw}
        like = None
        if cfg.moe is not None and (cfg.moe.aux_loss_coef or cfg.moe.capacity_factor):
            like = (pc, options)
        ref = train_reference(cfg, steps=steps, batch=BATCH, seq=SEQ, data=DATA, like=like, **ref_kw)
        _cache[name] = (results, ref, (cfg, pc, world, options, kw))
    return _cache[name]


def _assert_trains_like_reference(name, tol):
    results, ref, _ = run(name)
    err = compare_with_reference(results, ref)
    assert err["missing"] == [], err  # every reference parameter is held somewhere
    assert err["loss_err"] <= tol and err["param_err"] <= tol, err
    assert ref["losses"][-1] < ref["losses"][0]  # it did train


@pytest.mark.slow
def test_tp2_cp2_dp2_pp2_on_16_ranks_trains_like_the_reference():
    _assert_trains_like_reference("dense16", 1e-12)


@pytest.mark.slow
def test_moe_tp2_ep4_etp1_on_8_ranks_folded_trains_like_the_reference():
    """SGD, not Adam: Adam is nearly blind to a gradient's scale, SGD checks the experts' edp/(dp*cp) = 1/2."""
    _assert_trains_like_reference("moe8", 1e-12)
    results, _, _ = run("moe8")
    r0 = results[0]
    # the folding: rank 0's EP group mixes TP and DP ranks of the dense layout
    assert r0["coords"]["ep"] == 0 and r0["coords"]["edp"] == 0
    experts = [r for r in r0["reduction_table"] if r["kind"] == "expert"]
    assert experts and all(r["dp_group"] == "edp" and r["dp_size"] == 2 and r["scale"] == "1/2" for r in experts)


@pytest.mark.slow
def test_all_five_axes_tp2_cp2_dp2_pp2_ep2_train_like_the_reference():
    """MoE with load-balancing and z losses and a capacity factor, ZeRO-3, interleaved 1F1B, Ulysses: equal to the
    reference run with the composed run's grouping (aux loss per replica microbatch, capacity per holding rank)."""
    _assert_trains_like_reference("five16", 1e-12)
    results, ref, (cfg, *_rest) = run("five16")
    plain = train_reference(cfg, steps=STEPS, batch=BATCH, seq=SEQ, data=DATA)  # one group, capacity over all
    differs = compare_with_reference(results, plain)
    assert differs["loss_err"] > 1e-6 and differs["param_err"] > 1e-6  # the grouping is what makes them equal


@pytest.mark.slow
def test_dp_last_order_tp_cp_ep_pp_dp_trains_like_the_reference():
    """Megatron's dp-last order: rank = tp + 2 pp + 4 dp (dense) = ep + 2 pp + 4 edp (experts), so the pipeline
    pairs are two apart and the data-parallel pairs four apart, and the run equals one device."""
    _assert_trains_like_reference("dplast8", 1e-12)
    results, _, (_cfg, pc, world, *_rest) = run("dplast8")
    for rank, r in enumerate(results):
        assert r["coords"]["pp"] == rank // 2 % 2 and r["coords"]["dp"] == rank // 4  # dp varies slowest
        assert r["coords"]["ep"] == rank % 2 and r["coords"]["edp"] == rank // 4
        assert r["stage_layers"] == results[rank % 2 + 2 * (rank // 2 % 2)]["stage_layers"]  # same stage, same layers


@pytest.mark.slow
def test_float32_mqa_gpipe_zero2_without_sp_trains_like_the_reference():
    _assert_trains_like_reference("mqa8", 2e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MOE_PATHS))
def test_shared_experts_and_each_dispatcher_train_like_the_reference(name):
    """Shared experts (a dense MLP cut over TP, replicated over EP, reduced over dp-cp as the dense weights) with
    the all-to-all dispatcher, the all-gather dispatcher (over the etp x ep grid) and the all-to-all padded to
    capacity: SGD, so every gradient's value, scale included, shows in the parameters."""
    _assert_trains_like_reference(name, 1e-12)
    results, _, (cfg, pc, *_rest) = run(name)
    shared = [row for r in results for row in r["reduction_table"] if ".mlp.shared." in row["name"]]
    assert shared and all(row["kind"] in ("column", "row") for row in shared)
    assert all(row["dp_group"] == "dp-cp" and row["pre"] is None and row["scale"] == "1" for row in shared)
    for r in results:
        held = {row["name"] for row in r["reduction_table"]}
        specs = {s.name for s in r["shard_specs"] if s.axis == "pp"}
        assert {n for n in held if ".mlp.shared." in n} <= specs  # every shared slice has its shard specs
        traffic, forwards = r["traffic"][0], len(r["moe_routing"])  # MoE forwards of this rank in step 0
        assert forwards == (2 if pc.pp == 1 or r["coords"]["pp"] == 1 else 0)  # layer 1, m = 2 microbatches
        grid = traffic.get("ep" if pc.etp == 1 else "etp-ep", {"ops": {}})["ops"]
        if cfg.moe.dispatcher == "allgather":  # per forward 4 gathers and 3 reduce-scatters, no all-to-all
            assert "all_to_all" not in {op for t in traffic.values() for op in t["ops"]}
            assert grid.get("all_gather", 0) == 4 * forwards and grid.get("reduce_scatter", 0) == 3 * forwards
        else:  # dispatch and combine, forward and backward; the count exchange unless padded to capacity
            a2a = traffic.get("ep", {"ops": {}})["ops"].get("all_to_all", 0)
            assert a2a == forwards * (4 if cfg.moe.pad_to_capacity else 5)


@pytest.mark.slow
def test_every_rank_reports_the_global_loss_and_the_replicas_average_to_it():
    for name in ("dense16", "five16", "moe8"):
        results, ref, (cfg, pc, world, options, kw) = run(name)
        for step in range(STEPS):
            losses = {r["losses"][step] for r in results}
            assert max(losses) - min(losses) < 1e-12
            local = [r["local_losses"][step] for r in results if r["holds_last"]]
            assert len(local) == pc.tp * pc.cp * pc.dp
            assert abs(sum(local) / len(local) - ref["losses"][step]) < 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_traffic_per_axis_equals_the_sum_of_the_per_mode_formulas(name):
    results, _, (cfg, pc, world, options, kw) = run(name)
    for r in results:
        traced = traced_traffic(r)
        assert traced == per_axis(formula_traffic(cfg, pc, r, options, batch=BATCH, seq=SEQ)), (name, r["rank"])
    axes = set().union(*(r["traffic"][0] for r in results))
    expected = {
        "tp" if pc.tp > 1 else None,
        "cp" if pc.cp > 1 else None,
        "pp" if pc.pp > 1 else None,
        ("etp-ep" if cfg.moe.dispatcher == "allgather" and pc.etp > 1 else "ep") if pc.ep > 1 else None,
        "dp-cp" if pc.dp * pc.cp > 1 else None,
    } - {None}
    assert expected <= axes


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_held_parameter_gradient_and_optimizer_bytes_equal_the_dp_formulas(name):
    results, _, (cfg, pc, world, options, kw) = run(name)
    for r in results:
        states = 0 if kw.get("optimizer") is torch.optim.SGD else 2  # plain SGD keeps no state, Adam two moments
        want = dp_held_bytes(r["layouts"], options.zero_stage, optimizer_states=states)
        got = {k: r["memory"][k] for k in ("params", "grads", "optim")}
        assert got == want, (name, r["rank"])
        assert r["peak_activation_bytes"] > 0


@pytest.mark.slow
def test_each_gradient_reduction_runs_once_per_step_whatever_the_microbatches():
    """m = 2 microbatches, yet the DP wrapper reduces each bucket once (no_sync before a chunk's last backward)
    and the TP sums are one all-reduce each, after the DP reduction."""
    for name in ("dense16", "moe8"):
        results, _, (cfg, pc, world, options, kw) = run(name)
        for r in results:
            n_buckets = {}
            for lay in r["layouts"]:
                n_buckets[lay.axis] = n_buckets.get(lay.axis, 0) + 1
            t = r["traffic"][0]
            op = "reduce_scatter" if options.zero_stage == 1 else "all_reduce"
            assert t["dp-cp"]["phases"]["backward"] == {op: n_buckets["dp-cp"]}
            if "edp" in n_buckets:
                assert t["edp"]["phases"]["backward"] == {op: n_buckets["edp"]}
            assert t["tp"]["phases"]["sp_grads"] == {"all_reduce": 1}
            assert r["reduced"]["sp_elements"] > 0
    results, *_ = run("dense16")
    assert len(results[0]["layouts"]) > 1  # several buckets (bucket_bytes=4096), each reduced once


@pytest.mark.slow
def test_reduction_table_names_the_group_and_weight_of_every_parameter():
    results, _, _ = run("dense16")
    table = {r["name"]: r for r in results[0]["reduction_table"]}
    assert table["layers.0.ln1.weight"]["pre"] == "tp" and table["layers.0.ln1.weight"]["dp_group"] == "dp-cp"
    assert table["layers.0.attn.q_proj.weight"]["pre"] is None and table["embed.weight"]["dp_size"] == 4
    results, _, _ = run("mqa8")  # MQA: one K/V head copied on both TP ranks; without SP no LayerNorm sum
    table = {r["name"]: r for r in results[0]["reduction_table"]}
    assert table["layers.0.attn.k_proj.weight"]["pre"] == "tp/kv"
    assert table["layers.0.ln1.weight"]["pre"] is None
    results, _, _ = run("five16")  # interleaved: the last rank's chunks hold layers 1 and 3, both MoE
    table = {r["name"]: r for r in results[-1]["reduction_table"]}
    assert table["layers.1.mlp.router.gate.weight"]["pre"] == "tp"
    assert table["layers.3.mlp.experts.experts.0.up_proj.weight"]["dp_group"] == "edp"
    text = format_reduction_table(results[-1]["reduction_table"])
    assert "layers.*.mlp.router.gate.weight" in text and "edp (4)" in text


@pytest.mark.slow
def test_shard_specs_say_how_each_rank_holds_every_parameter_on_every_axis():
    results, *_ = run("five16")
    for r in results:
        specs = r["shard_specs"]
        names = {t["name"] for t in r["reduction_table"]}
        for axis_kind in (("pp", "stage"), (None, "zero3")):
            covered = {s.name for s in specs if s.kind == axis_kind[1] and axis_kind[0] in (None, s.axis)}
            assert covered == names
        q = [s for s in specs if s.name.endswith("attn.q_proj.weight")]
        assert q and all(s.full_shape == (16, 16) and s.local_shape == (8, 16) for s in q if s.axis == "tp")
        experts = [s for s in specs if s.axis == "ep" and s.kind == "expert"]
        assert all(s.full_shape[0] == 4 and s.local_shape[0] == 2 for s in experts)  # 4 experts over ep=2
        assert bool(experts) == (r["coords"]["pp"] == 1)  # interleaved: pp rank 1 holds the MoE layers 1 and 3


@pytest.mark.slow
def test_superposition_tp4_cp2_dp2_ffn_activation_is_one_sixteenth_per_rank():
    """Seed B: TP splits h_ffn, CP the sequence, DP the batch -- orthogonal axes, so each rank's FFN hidden
    activation [b/dp, s/cp, h_ffn/tp] is 1/16 of [b, s, h_ffn]. Measured on the real tensors (a hook on every
    down_proj). A MoE layer's experts take whatever tokens are routed to them: per rank the bytes vary, but they
    add up to the reference's, so the mean is still 1/16 -- EP changes which experts a rank holds, not the ratio."""
    results, _, (cfg, pc, world, options, kw) = run("super16")
    ref = reference_ffn_bytes(cfg, batch=BATCH, seq=SEQ, data=DATA)
    n = pc.tp * pc.cp * pc.dp
    assert n == 16 and world == 16
    for r in results:
        assert r["ffn_hidden_bytes"][0] * 16 == ref[0]  # layer 0 is dense: exactly 1/16 on every rank
    moe_total = sum(r["ffn_hidden_bytes"][1] for r in results)
    assert moe_total == ref[1] and moe_total / 16 == ref[1] / 16
    assert len({r["ffn_hidden_bytes"][1] for r in results}) > 1  # routing makes the per-rank share uneven


@pytest.mark.slow
def test_pipeline_changes_which_layers_a_rank_holds_not_the_ratio():
    results, _, (cfg, pc, world, options, kw) = run("dense16")
    ref = reference_ffn_bytes(cfg, batch=BATCH, seq=SEQ, data=DATA)
    for r in results:
        held = r["ffn_hidden_bytes"]
        assert sorted(held) == [2 * r["coords"]["pp"], 2 * r["coords"]["pp"] + 1]  # L/pp = 2 layers of 4
        for layer, nbytes in held.items():
            assert nbytes * (pc.tp * pc.cp * pc.dp) == ref[layer]  # each at 1/8 (no pp in the ratio)


@pytest.mark.slow
def test_the_per_rank_report_prints_every_rank_and_axis():
    results, *_ = run("five16")
    text = format_report(results)
    lines = text.splitlines()
    assert len(lines) == 17
    for axis in ("tp", "cp", "ep", "pp", "dp-cp", "edp", "tp-cp"):
        assert axis in lines[0].split()


def _probes_and_zero_stages():
    kw = dict(steps=1, batch=BATCH, seq=SEQ, data=DATA)
    zero1, zero3 = (RunOptions(zero_stage=z, n_microbatches=2) for z in (1, 3))
    pc = ParallelConfig(tp=2, dp=2, pp=2)
    return [
        train(DENSE, pc, zero1, activation_probe="pipeline", **kw)["activation_bytes"],
        train(DENSE, pc, zero1, **kw)["activation_bytes"],
        train(DENSE, pc, zero3, **kw)["activation_bytes"],
        train(DENSE, pc, zero3, activation_probe="pipeline", **kw)["activation_bytes"],
    ]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_saved_activations_are_measured_alike_by_both_probes_and_do_not_depend_on_the_zero_stage():
    """The stage probe equals pylib.pp's probe under ZeRO-1. ZeRO-3 gathers each unit's parameters for its
    forward and autograd saves views of them; they are freed right after and gathered again for backward, so the
    stage probe leaves them out (and gives ZeRO-1's numbers) where the pipeline's probe counts them."""
    for pipeline1, stage1, stage3, pipeline3 in launch(_probes_and_zero_stages, 8):
        assert pipeline1 == stage1 == stage3 and min(stage1.values()) > 0
        assert all(pipeline3[k] > stage3[k] for k in stage3)
