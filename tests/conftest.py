"""What the test files share: the float64 tolerances a parallel run is compared with, and the helpers they use.

Import them as `from tests.conftest import FLOAT64_ATOL, assert_float64_close` (the repository root is on pytest's
path, so `tests` is a namespace package).
"""

import sys

# pytest caches each test module with its asserts rewritten (in __pycache__), unless bytecode writing is off: this
# sandbox's environment sets PYTHONDONTWRITEBYTECODE=1, which made every run rewrite all 130-odd modules again (a
# collection took 10.4 s against 6.8 s cached, on each worker). The suite turns writing back on for itself, as
# Python's default is, before it imports anything else: what is imported from here on (torch's modules are compiled
# at install; the test modules and pylib's) is cached.
sys.dont_write_bytecode = False

import pytest  # noqa: E402 - after the switch above
import torch  # noqa: E402

from pylib.model.moe import MoE  # noqa: E402

# tests/site checks the BUILT site (a real browser, the link and label checks): `make site-test` runs it after
# `make book`. Left out of the main suite so that `make test` needs neither a build nor a browser, and never checks
# a stale _build/html. Naming the folder (`pytest tests/site`) still collects it.
collect_ignore = ["site", "hub"]

# A parallel mode computes the reference's numbers with the same operations in another order (a sum split over
# ranks, the ring's running softmax merge, a bucketed all-reduce, a pipeline's per-micro-batch accumulation). In
# float64 that changes a result by rounding alone: a few units of 2.2e-16 on values of order 1, summed over at most a
# few thousand terms at the suite's sizes, so about 1e-14. A real mistake (a rank's term missing or counted twice, a
# wrong scale, the wrong rows) moves a value by 1e-3 or more. 1e-12 lies between, with two orders of room each side.
FLOAT64_ATOL = 1e-12
# DP's gradients are sums over every token of the batch and reach magnitudes where 1e-12 absolute is a handful of
# ulps; the DP checks add this relative term (1e-10 of the value) so the bound scales with the gradient.
FLOAT64_RTOL = 1e-10


def assert_float64_close(actual, expected, msg=None, *, rtol=0.0):
    """`actual` equals `expected` to float64 rounding (FLOAT64_ATOL, plus `rtol` of the value where given)."""
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=FLOAT64_ATOL, msg=msg)


def seeded_moe(cfg, d_model=8, d_ff=16, kind="gelu", seed=0, dtype="float64"):
    """The reference MoE layer (`pylib.model.moe.MoE`) of `cfg` with weights drawn from `seed`, in `dtype`; the
    caller's random state is left as it was."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return MoE(d_model, d_ff, cfg, kind).to(getattr(torch, dtype))


def value_error_message(call) -> str:
    """What `call()` raises as a ValueError, or "no error" (a rank's answer that every rank can return in step)."""
    try:
        call()
    except ValueError as exc:
        return str(exc)
    return "no error"


def seeded_forward_saving(layer, seed: int):
    """`layer` run forward on a float64 input [1, 6, 8] drawn from `seed`, under `saved_activations` (its parameters
    left out): (what autograd saved, the generator to draw the output gradient from, the input, the parameters, the
    output)."""
    from pylib.model import saved_activations

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 6, 8, generator=g, dtype=torch.float64, requires_grad=True)
    params = list(layer.parameters())
    with saved_activations(exclude=params) as saved:
        y = layer(x)
    return saved, g, x, params, y


def one_device_step(cfg, batch, seq, seed=1):
    """The single-device reference a pipeline test compares with: the loss of `build_model(cfg)` on
    `random_tokens(cfg, batch, seq, seed)` and every parameter's gradient after its backward."""
    from pylib.model import build_model, random_tokens

    model = build_model(cfg)
    loss = model.loss(*random_tokens(cfg, batch, seq, seed=seed))
    loss.backward()
    return loss.item(), {k: p.grad.clone() for k, p in model.named_parameters()}


def merge_stage_dicts(per_rank: list[dict]) -> dict:
    """One dict from each pipeline rank's dict of its own stage's entries (no name held by two ranks)."""
    merged = {}
    for d in per_rank:
        assert not set(d) & set(merged), f"held by two ranks: {sorted(set(d) & set(merged))}"
        merged.update(d)
    return merged


def assert_cp_attention_equals_full(cases, per_rank, cp):
    """A CP attention's outputs and q/k/v gradients, gathered from `per_rank` (each rank's list of
    (out, dq, dk, dv, ...) per case), equal single-device attention's on every case ((q, k, v, w), causal,
    layout): the loss is sum(out * w)."""
    from pylib.cp import unshard_sequence
    from pylib.model import attention_core

    for i, (tensors, causal, layout) in enumerate(cases):
        q, k, v, w = (x.clone().requires_grad_() for x in tensors)
        out = attention_core(q, k, v, causal=causal)
        (out * w).sum().backward()
        for j, (name, expected) in enumerate(zip(("out", "dq", "dk", "dv"), (out.detach(), q.grad, k.grad, v.grad))):
            got = unshard_sequence([per_rank[r][i][j] for r in range(cp)], 2, layout)
            assert_float64_close(got, expected, f"{name} of case {i}")


# `make test` runs the modules on two workers, a module's tests on one (`--dist loadfile`), each worker taking the
# next module as it finishes one, in collection order (`--no-loadscope-reorder`; xdist's default order, most tests
# first, would start the longest module, the lab harness's 13 tests, near the end while the other worker waits). So
# the longest modules start first: summed test times of a whole-suite run here (2,894 s over both workers, on a
# machine loaded by other work, so about 2.7x the idle times) put the lab harness first (369 s) after the
# calibration (454 s, before its fit was made about 3x faster), then the launcher's process tests (241 s), the
# figures' card checks (169 s) and the clipping checks (153 s); every other module took under 125 s.
LONGEST_FIRST = (
    "test_labs_harness.py",
    "test_analysis_calibration.py",
    "test_runtime_launch.py",
    "test_viz_card.py",
    "test_clip.py",
)


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each module's tests, and the other modules, keep their order


def pipeline_suite(worker, sizes=(2, 4), timeout=150):
    """A module fixture for a pipeline test file: for each p in `sizes` (each a slow case, id "pp{p}"),
    (p, results of `worker(p)` launched on p ranks), so the file's runs start once per p."""

    @pytest.fixture(
        scope="module", params=[pytest.param(p, marks=pytest.mark.slow) for p in sizes], ids=[f"pp{p}" for p in sizes]
    )
    def suite(request):
        from pylib.runtime import launch

        return request.param, launch(worker, request.param, request.param, timeout=timeout)

    return suite


def pipeline_grads(pipe) -> dict:
    """Every parameter's gradient of a PipelineParallel after its step, by name."""
    return {k: p.grad for k, p in pipe.named_parameters()}
