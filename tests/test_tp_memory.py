"""Activation memory of one TP layer: measured (what autograd saves) equals the formula derived in
pylib.analysis.tp exactly, with TP only and TP + SP at several t; SP cuts the part outside the TP region (seed A's
green zone: LayerNorm) to 1/t; and our formula differs from Korthikanti et al. 2022 only by the listed terms."""

import itertools

import pytest

from pylib.analysis.tp import compare_with_korthikanti, korthikanti_bytes, saved_activation_bytes
from pylib.model import ModelConfig, build_model, random_hidden, saved_activations, torch_dtype
from pylib.runtime import launch
from pylib.tp import TPBlock, scatter_to_sequence_parallel_region

B, S = 2, 8


def _cfg(mlp="gelu", kv=None, position="none", causal=True, dtype="float64", d_ff=64):
    return ModelConfig(
        d_model=16,
        n_heads=4,
        n_kv_heads=kv,
        d_ff=d_ff,
        mlp=mlp,
        position=position,
        causal=causal,
        dtype=dtype,
        n_layers=1,
    )


def _measure(cases, b=B):
    """Saved bytes of one TPBlock forward (weights excluded), and of its first LayerNorm alone."""
    out = []
    for cfg, sp, regather in cases:
        block = TPBlock.from_full(build_model(cfg).layers[0], sequence_parallel=sp, regather=regather)
        x = random_hidden(b, S, cfg.d_model, dtype=torch_dtype(cfg.dtype))
        x = (scatter_to_sequence_parallel_region(x) if sp else x).detach().requires_grad_()
        params = list(block.parameters())
        with saved_activations(exclude=params) as layer:
            block(x)
        with saved_activations(exclude=params) as ln:
            block.ln1(x)
        out.append((layer.bytes, ln.bytes))
    return out


CASES = [
    (_cfg(mlp, kv, position, causal, dtype), sp, regather)
    for (mlp, kv, position, causal, dtype), (sp, regather) in itertools.product(
        [
            ("gelu", None, "none", True, "float64"),
            ("gelu", None, "none", False, "float32"),
            ("swiglu", 2, "rope", True, "float64"),
            ("swiglu", 1, "none", True, "float32"),
            ("gelu", 2, "rope", False, "float64"),
        ],
        [(False, False), (True, False), (True, True)],
    )
]


@pytest.mark.parametrize("t", [1, 2, pytest.param(4, marks=pytest.mark.slow)])  # t=4: the same code, 1 s more
def test_saved_activations_per_layer_equal_the_derived_formula(t):
    for rank, measured in enumerate(launch(_measure, t, CASES)):
        for (cfg, sp, regather), (layer_bytes, _) in zip(CASES, measured):
            derived = saved_activation_bytes(cfg, B, S, t, sequence_parallel=sp, regather=regather)
            assert layer_bytes == derived, f"t={t} rank {rank} sp={sp} regather={regather} {cfg}"


def test_a_single_sequence_slice_owns_its_memory():
    """b = 1: the sequence slice of [1, s, h] is contiguous, and a view of it would keep all of [1, s, h] alive;
    the measurement would show it. scatter_to_sequence_parallel_region gives the slice its own storage."""
    cases = [(_cfg(), True, False), (_cfg(), True, True)]
    for t in (2, 4):
        for (cfg, sp, regather), (layer_bytes, _) in zip(cases, launch(_measure, t, cases, 1)[0]):
            assert layer_bytes == saved_activation_bytes(cfg, 1, S, t, sequence_parallel=sp, regather=regather)


def test_sequence_parallel_cuts_the_layernorm_activations_to_one_over_t():
    """Seed A section 4: outside the TP region every rank holds everything under TP alone, 1/t of it under SP."""
    cfg = _cfg()
    cases = [(cfg, False, False), (cfg, True, False), (cfg, True, True)]
    for t in (2, 4):
        (tp, tp_ln), (sp, sp_ln), (rg, rg_ln) = launch(_measure, t, cases)[0]
        assert sp_ln * t == tp_ln == rg_ln * t
        # the whole layer saves less by exactly the two LayerNorms' (1 - 1/t) ...
        assert tp - sp == 2 * (tp_ln - sp_ln)
        # ... and with regather also the two gathered inputs of the TP region, [b, s, h] each, by (1 - 1/t)
        e = torch_dtype(cfg.dtype).itemsize
        assert tp - rg == 2 * (tp_ln - sp_ln) + 2 * B * S * cfg.d_model * e * (t - 1) // t


SIZES = [(2048, 1, 12288, 96), (4096, 4, 8192, 64), (8, 2, 16, 4), (512, 3, 1024, 16)]  # (s, b, h, a)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_korthikanti_terms_add_up_to_the_papers_closed_forms(t):
    for s, b, h, a in SIZES:
        cfg = ModelConfig(d_model=h, n_heads=a, d_ff=4 * h, n_layers=1, dtype="float32", vocab_size=8)
        for sp in (False, True):
            rows = compare_with_korthikanti(cfg, b, s, t, sequence_parallel=sp, regather=True)
            paper = sum(r.paper_bytes for r in rows)
            assert paper == pytest.approx(korthikanti_bytes(s, b, h, a, t, sequence_parallel=sp), rel=1e-12)
    # the three forms the paper prints
    s, b, h, a = SIZES[0]
    sbh = s * b * h
    assert korthikanti_bytes(s, b, h, a) == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert korthikanti_bytes(s, b, h, a, t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert korthikanti_bytes(s, b, h, a, t, sequence_parallel=True) == pytest.approx(sbh / t * (34 + 5 * a * s / h))


@pytest.mark.parametrize("sp, regather", [(False, False), (True, True), (True, False)])
def test_our_layer_differs_from_korthikanti_only_by_the_listed_terms(sp, regather):
    """Where a row says "same", ours = paper * e / 2 (same tensor, e-byte instead of 2-byte elements); "paper only"
    rows are dropout (0 for us), "ours only" rows the paper neglects; "different" rows say why."""
    for t in (1, 2, 4):
        for cfg in (_cfg(d_ff=64), _cfg(causal=False), _cfg("swiglu", position="rope", dtype="float32")):
            e = torch_dtype(cfg.dtype).itemsize
            for r in compare_with_korthikanti(cfg, B, S, t, sequence_parallel=sp, regather=regather):
                if r.relation == "same":
                    assert r.ours_bytes == r.paper_bytes * e / 2, r
                elif r.relation == "paper only":
                    assert r.ours_bytes == 0 and r.paper_bytes > 0 and "dropout" in r.why, r
                elif r.relation == "ours only":
                    assert r.paper_bytes == 0, r
                else:
                    assert r.relation == "different" and r.why, r
            relations = {
                r.item: r.relation
                for r in compare_with_korthikanti(cfg, B, S, t, sequence_parallel=sp, regather=regather)
            }
            # the paper's own model (GELU, h_ffn = 4h) differs only by SP's gathered inputs when we do not regather
            gathered = sp and not regather and t > 1
            expect_different = ({"QKV input (LN1 output)", "MLP input (LN2 output)"} if gathered else set()) | (
                {"MLP hidden"} if cfg.mlp == "swiglu" else set()
            )
            assert {k for k, v in relations.items() if v == "different"} == expect_different


def test_measured_bytes_sit_where_the_paper_puts_them_after_removing_the_listed_differences():
    """Real measurement, paper's formula: measured - ours-only terms == (paper - dropout terms) * e / 2, for the
    paper's own layer shape (MHA, GELU, h_ffn = 4h, no RoPE), TP and TP + SP with regather."""
    cfg = _cfg(d_ff=64, causal=True)
    e = torch_dtype(cfg.dtype).itemsize
    cases = [(cfg, False, False), (cfg, True, True)]
    for t in (1, 2, 4):
        measured = launch(_measure, t, cases)[0]
        for (_, sp, regather), (layer_bytes, _) in zip(cases, measured):
            rows = compare_with_korthikanti(cfg, B, S, t, sequence_parallel=sp, regather=regather)
            ours_only = sum(r.ours_bytes for r in rows if r.relation == "ours only")
            dropout = sum(r.paper_bytes for r in rows if r.relation == "paper only")
            paper = korthikanti_bytes(S, B, cfg.d_model, cfg.n_heads, t, sequence_parallel=sp)
            assert layer_bytes - ours_only == pytest.approx((paper - dropout) * e / 2, rel=1e-12)
