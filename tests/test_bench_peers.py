"""bench/peers.py: ours against torch's own implementation of each mode, one table of ratios."""

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import peers  # noqa: E402  (bench/peers.py)


def _launched():
    """Two ranks' rows as the rank functions return them: (mode, size, peer, {variant: [seconds of each cycle]})."""
    rank0 = [("TP", "b=1", "DTensor", {"ours on": [0.012, 0.010, 0.030], "ours off": [0.008, 0.009, 0.020],
                                       "torch": [0.010, 0.020, 0.040],
                                       "torch again": [0.022, 0.018, 0.044]})]  # fmt: skip
    rank1 = [("TP", "b=1", "DTensor", {"ours on": [0.011, 0.014, 0.031], "ours off": [0.008, 0.010, 0.020],
                                       "torch": [0.020, 0.010, 0.040],
                                       "torch again": [0.010, 0.020, 0.040]})]  # fmt: skip
    ep = [
        (
            "EP dispatch",
            "16 tokens",
            "(none in torch)",
            {"ours on": [0.003], "ours every": [0.004], "ours off": [0.002]},
        )
    ]
    return [(2, [rank0, rank1]), (2, [ep, ep])]


def test_the_table_times_the_slowest_rank_and_pairs_the_ratios_within_a_cycle():
    tp, ep = peers.table_rows(_launched())
    # slowest rank of each cycle: on (0.012, 0.014, 0.031), off (0.008, 0.010, 0.020), torch (0.020, 0.020, 0.040)
    assert tp["seconds"] == pytest.approx({"ours on": 0.014, "ours off": 0.010, "torch": 0.020, "torch again": 0.022})
    assert tp["ours on/torch"] == pytest.approx(0.7)  # median of 0.6, 0.7, 0.775
    assert tp["ours off/torch"] == pytest.approx(0.5)  # median of 0.4, 0.5, 0.5
    assert tp["check"] == pytest.approx(0.5)  # median of 1.5, 1.4, 1.55, less 1
    # the A/A control, torch again (0.022, 0.020, 0.044) over torch: 1.1, 1.0, 1.1; quartiles of the ratio too
    assert tp["torch/torch"] == pytest.approx(1.1) and tp["ours on/torch quartiles"][0] <= 0.7
    assert tp["torch/torch quartiles"] == pytest.approx((1.0, 1.1))
    assert "ours on/torch" not in ep and ep["check"] == pytest.approx(0.5)  # no peer: the check's cost alone
    assert ep["every"] == pytest.approx(1.0) and "every" not in tp  # step 1 before every call: ours every / off
    text = peers.format_table([tp, ep], ["on", "every", "off"])
    assert "ours on/torch" in text.splitlines()[0] and "0.70 [" in text and "+50%" in text and "+100%" in text
    assert "torch/torch" in text.splitlines()[0] and "1.10 [1.00-1.10]" in text
    assert f"{os.cpu_count()} CPUs, torch {torch.__version__}" in peers.machine()


@pytest.mark.slow
def test_peers_runs_every_row_against_torch_on_tiny_sizes():
    rows = peers.measure(("on", "off"), steps=1, tiny=True)
    modes = [r["mode"] for r in rows]
    assert modes == [
        "TP",
        "TP+SP",
        "1f1b",
        "DDP",
        "ZeRO-3",
        "ZeRO-3 every unit",
        "ring (CP)",
        "EP dispatch",
        "EP+ETP (etp=2)",
    ]
    for r in rows[:-2]:
        assert "cannot run" not in r["peer"], r["peer"]  # FSDP2 included: it runs on gloo CPU
        assert r["ours on/torch"] > 0 and r["ours off/torch"] > 0
    assert all(r["seconds"]["ours on"] > 0 and "check" in r for r in rows)
    (check,) = peers.check_rows(("on", "off", "full"), calls=2, rounds=1, worlds=(2,))
    assert check["ranks"] == 2 and all(check["us"][s] > 0 for s in ("on", "off", "full"))
    assert {"on adds", "full adds"} <= set(check) and "full adds us" in peers.format_check_rows(
        [check], ["on", "off", "full"]
    )


def _collectives_per_step(wrapping):
    """How many all-gathers and reduce-scatters one step of ours and of FSDP2 issues, each wrapped as `peers`
    wraps them for the ZeRO-3 rows (counted at torch.distributed, under both)."""
    import collections

    import torch.distributed as dist

    from pylib.dp import micro_batch
    from pylib.model import ModelConfig, random_tokens
    from pylib.pp.split import lm_loss
    from pylib.runtime.collectives import resolve_group

    counts = collections.Counter()

    def counted(fn, kind):
        def call(*args, **kwargs):
            counts[kind] += 1
            return fn(*args, **kwargs)

        return call

    for name in ("all_gather_single", "reduce_scatter_single", "all_gather_into_tensor", "reduce_scatter_tensor"):
        if hasattr(dist, name):
            setattr(dist, name, counted(getattr(dist, name), name.split("_")[0]))
    cfg = ModelConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, d_ff=32, dtype="float32")
    g = resolve_group(None)
    ids, targets = (micro_batch(t, g.rank, g.size) for t in random_tokens(cfg, 4, 8, seed=0))
    model, _trainer = peers._ours_dp(cfg, g, "zero3", wrapping)  # kept: its hooks gather and reduce
    theirs = peers._torch_dp(cfg, g, wrapping)
    out = {}
    for side, step in (("ours", lambda: model.loss(ids, targets).backward()),
                       ("torch", lambda: lm_loss(theirs(ids), targets).backward())):  # fmt: skip
        step()  # FSDP2's first step sets itself up
        counts.clear()
        step()
        out[side] = dict(counts)
    return out


@pytest.mark.parametrize("wrapping", ["layers", "every"])
def test_the_zero3_rows_issue_as_many_collectives_as_fsdp2(wrapping):
    """Like with like: wrapped the same, ours and FSDP2 gather and reduce-scatter the same number of times a step
    (FSDP2's default wrapping keeps the root unit for backward: 5 + 4 gathers and 5 reduce-scatters a step at 4
    layers; here at 2 layers, 3 + 2 and 3)."""
    from pylib.runtime import launch

    for r in launch(_collectives_per_step, 2, wrapping):
        assert r["ours"] == r["torch"], r
        units = 3 if wrapping == "layers" else 5  # 2 layers and the root / and embed, ln_f, lm_head apart
        assert r["ours"] == {"all": 2 * units - (wrapping == "layers"), "reduce": units}
