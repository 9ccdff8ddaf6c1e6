"""The zero-bubble schedules composed with TP and DP: `RunOptions(schedule="zb-h1" | "zb-v" | "dualpipev")` through
`ParallelTransformer`, on 4 gloo ranks, equal the single-device reference in float64 (the loss and every gradient).

    mesh      schedules (m)                                  DP wrapper
    pp2 tp2   zb-h1 (2), zb-v (2), dualpipev (4)             -
    pp2 dp2   zb-h1 (2), zb-v (2), dualpipev (4), 1f1b (2)   DDP, ZeRO-1, ZeRO-2

A W accumulates the weight gradient a fused backward would, so the data-parallel reduction must wait for the last
W of each chunk: `last_weight_gradients` finds it (a split B accumulates nothing), and the W runs as one pass of the
gradient buckets (`GradientBuckets.one_backward`), since it restarts autograd once per layer. The launched tests
check the result (ZeRO-1's reduce-scatter is wrong if either is missing) and that every bucket is reduced as often
as under 1F1B. ZeRO-3 and tied embeddings on the V are refused by name before any rank starts."""

import pytest

from pylib.compose.model import last_weight_gradients
from pylib.compose.probe import SavedProbe
from pylib.model import batches, build_model
from pylib.plan import RunOptions
from pylib.plan.presets import tiny_gqa
from pylib.plan.problems import problems
from pylib.plan.schedules import build
from pylib.runtime import ParallelConfig, launch
from tests.conftest import FLOAT64_ATOL

pytestmark = pytest.mark.timeout(240)

CFG = tiny_gqa()  # V = 32, h = 16, 4 layers (2p = 4 stages for the V at p = 2), GQA, SwiGLU, RoPE, float64
BATCH, SEQ = 8, 8
# (schedule, v, m, zero_stage) per mesh
RUNS = {
    "pp2 tp2": (ParallelConfig(tp=2, pp=2), [("zb-h1", 1, 2, 0), ("zb-v", 2, 2, 0), ("dualpipev", 2, 4, 0)]),
    "pp2 dp2": (
        ParallelConfig(dp=2, pp=2),
        [
            ("zb-h1", 1, 2, 0),
            ("zb-h1", 1, 2, 1),
            ("zb-h1", 1, 2, 2),
            ("zb-v", 2, 2, 1),
            ("dualpipev", 2, 4, 0),
            ("1f1b", 1, 2, 0),
            ("1f1b", 1, 2, 1),
            ("1f1b", 1, 2, 2),
        ],
    ),
}


def test_the_chunks_reduction_waits_for_its_last_w_not_its_last_b():
    for p, m in ((2, 2), (4, 4), (4, 6)):
        sched = build("zb-h1", p, m)
        for r in range(p):
            acts = sched[r]
            last_w = max(i for i, a in enumerate(acts) if a.op == "W")
            assert last_weight_gradients(acts) == {0: acts[last_w].mb}
            # rank r's last W is of microbatch m-1 only on rank 0: ZB-H1 defers the others' by r microbatches
            assert (acts[last_w].mb == m - 1) == all(a.op != "B" for a in acts[last_w:])
    fused = build("1f1b", 4, 4)
    assert all(last_weight_gradients(fused[r]) == {0: 3} for r in range(4))
    dpv = build("dualpipev", 2, 4, 2)
    assert all(set(last_weight_gradients(dpv[r])) == {0, 1} for r in range(2))


def test_a_forwards_bytes_are_held_until_its_w_when_the_backward_is_split():
    probe = SavedProbe(set)
    probe.bytes = {(mb, 0): 10 for mb in range(4)}
    zb, fused = build("zb-h1", 2, 4), build("1f1b", 2, 4)
    # rank 1 defers each W by one microbatch: its F of the next microbatch lands before the W frees the last
    assert probe.peak(fused[1]) == 10 and probe.peak(zb[1]) == 20
    assert probe.peak(fused[0]) == probe.peak(zb[0]) == 20


@pytest.mark.parametrize(
    "cfg, par, options, message",
    [
        (CFG, ParallelConfig(dp=2, pp=2), RunOptions(schedule="zb-h1", n_microbatches=2, zero_stage=3), "ZeRO-3"),
        (CFG, ParallelConfig(dp=2, pp=2), RunOptions(schedule="v-half", v=2, n_microbatches=2, zero_stage=3), "ZeRO-3"),
        (
            CFG.with_(tie_embeddings=True),
            ParallelConfig(pp=2),
            RunOptions(schedule="zb-v", v=2, n_microbatches=2),
            "tie_embeddings=False",
        ),
        (CFG, ParallelConfig(pp=2), RunOptions(schedule="dualpipev", v=2, n_microbatches=3), "m >= 2p"),
        (CFG, ParallelConfig(pp=2), RunOptions(schedule="dualpipe", v=2, n_microbatches=4), "placement='dual'"),
    ],
)
def test_what_a_zero_bubble_schedule_cannot_compose_with_is_refused_by_name(cfg, par, options, message):
    found = problems(cfg, par, par.world_size, batch=BATCH, seq=SEQ, options=options)
    assert any(message in p for p in found), found


def test_the_zero_bubble_schedules_compose_with_tp_and_dp_when_nothing_is_refused():
    for _, (par, runs) in RUNS.items():
        for name, v, m, zero in runs:
            opts = RunOptions(schedule=name, v=v, n_microbatches=m, zero_stage=zero)
            assert problems(CFG, par, 4, batch=BATCH, seq=SEQ, options=opts) == [], (par, name)


# -------------------------------------------------------------------------------------------- real runs


def _run(par, runs):
    from pylib.compose import ParallelTransformer
    from pylib.runtime import Mesh
    from pylib.runtime.tracer import trace

    mesh, out = Mesh(par), []
    for name, v, m, zero in runs:
        opts = RunOptions(schedule=name, v=v, n_microbatches=m, zero_stage=zero)
        model = ParallelTransformer.from_full(build_model(CFG), mesh, opts, batch=BATCH, seq=SEQ)
        with trace() as tr:
            res = model.step(*batches(CFG, BATCH, SEQ, 0, data="pattern"))
        infos = {i.name: i for i in model.infos}
        grads = [
            (infos[n].ref_name, infos[n].ref_index, lo, hi, g.clone())
            for n, parts in model.gradient_pieces().items()
            for lo, hi, g in parts
        ]
        dp_ops = sorted((e.op, e.tag) for e in tr.events if e.axis.startswith("dp") and e.phase == "backward")
        out.append(dict(loss=res.loss, grads=grads, dp_ops=dp_ops))
    return out


@pytest.fixture(scope="module")
def reference():
    model = build_model(CFG)
    loss = model.loss(*batches(CFG, BATCH, SEQ, 0, data="pattern"))
    loss.backward()
    return loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


_launched: dict[str, list] = {}


def launched(mesh: str):
    """The results per rank of mesh's runs: launched once per test process."""
    if mesh not in _launched:
        par, runs = RUNS[mesh]
        _launched[mesh] = launch(_run, 4, par, runs, timeout=200)
    return RUNS[mesh][1], _launched[mesh]


@pytest.mark.slow
@pytest.mark.parametrize("mesh", list(RUNS))
def test_zero_bubble_schedules_with_tp_or_dp_equal_the_reference_loss_and_every_gradient(mesh, reference):
    runs, results = launched(mesh)
    want_loss, want = reference
    for i, (name, _, _, zero) in enumerate(runs):
        seen = set()
        for r in results:
            row = r[i]
            assert row["loss"] == pytest.approx(want_loss, abs=FLOAT64_ATOL), (mesh, name, zero)
            for ref_name, index, lo, hi, g in row["grads"]:
                err = float((g - want[ref_name][index].reshape(-1)[lo:hi]).abs().max()) if g.numel() else 0.0
                assert err <= FLOAT64_ATOL, (mesh, name, zero, ref_name, err)
                seen.add(ref_name)
        assert seen == set(want), (mesh, name, set(want) - seen)  # every gradient is held somewhere


@pytest.mark.slow
def test_each_bucket_is_reduced_as_often_under_a_split_backward_as_under_1f1b():
    runs, results = launched("pp2 dp2")
    fused = {zero: i for i, (name, _, _, zero) in enumerate(runs) if name == "1f1b"}
    for i, (name, v, _, zero) in enumerate(runs):
        if name == "1f1b" or v != 1:
            continue
        for r in results:
            assert r[i]["dp_ops"] == r[fused[zero]]["dp_ops"] and r[i]["dp_ops"], (name, zero, r[i]["dp_ops"])
            tags = [tag for _, tag in r[i]["dp_ops"]]
            per_bucket = 1 if zero < 2 else 2  # ZeRO-2 keeps no full gradient: it reduces after each of the m = 2
            assert all(tags.count(t) == per_bucket for t in tags), (name, zero, tags)
