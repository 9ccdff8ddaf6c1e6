"""Part II's helpers (pylib.seedcheck, pylib.viz.matrix_dims): seed B's symbols evaluated, tables read off
meta-device models, seed B's cut tables judged cell by cell against the probed ranks, and the figures."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from pylib.experiments.mode_probes import probe_modes  # noqa: E402
from pylib.plan.presets import llama2_70b, probe_config, probe_moe_config  # noqa: E402
from pylib.runtime import launch  # noqa: E402
from pylib.seedcheck.axis_cuts import MODES, SEED_AXIS_DIMS, axis_cuts, cut_dims, spec_dims  # noqa: E402
from pylib.seedcheck.cut_claims import SEED_WEIGHT_CUT, SEED_WORDS  # noqa: E402
from pylib.seedcheck.cut_judging import activation_cut_cells, judge_weight, weight_cut_cells  # noqa: E402
from pylib.seedcheck.meta_tables import meta_activations, meta_model, weight_rows  # noqa: E402
from pylib.seedcheck.primitives import primitives  # noqa: E402
from pylib.seedcheck.symbols import describe, evaluate, symbol_sizes  # noqa: E402
from pylib.viz.matrix_dims import fig_dim_orth, fig_superposition, superposition_pieces  # noqa: E402

CFG, MOE = probe_config(), probe_moe_config()


def test_evaluate_and_describe_use_seed_b_symbols():
    sizes = symbol_sizes(llama2_70b(), b=1, s=4096, N=8)
    assert evaluate("[b, n_head/N, s, d_head]", sizes) == (1, 8, 4096, 128)
    assert evaluate("[h, h_kv]", sizes) == (8192, 1024)
    with pytest.raises(ValueError, match="not a whole number"):
        evaluate("[n_kv_head/N/2]", sizes)
    with pytest.raises(ValueError, match="cannot evaluate"):
        evaluate("[__import__('os')]", sizes)
    assert describe((8192, 128), "[h, h_kv]", sizes, 8) == "[h, h_kv/N]"
    assert describe((8192, 7), "[h, h_kv]", sizes, 8) == "[h, 7]"


def test_weight_rows_of_a_meta_model_are_seed_b_shapes_in_seed_b_orientation():
    model = meta_model(llama2_70b(), n_layers=2)
    rows = {r.name: r for r in weight_rows(model, llama2_70b())}
    assert all(r.agrees for r in rows.values())
    assert rows["W_K"].torch_shape == (1024, 8192) and rows["W_K"].shape == (8192, 1024)
    assert rows["W_Q"].per_model == 80 and rows["LayerNorm γ"].per_model == 160
    assert "router" not in rows  # a dense model has none
    assert next(model.parameters()).device.type == "meta"


def test_meta_activations_record_the_score_matrix_without_computing_it():
    acts = meta_activations(llama2_70b(), 1, 512)
    assert acts["shapes"]["attention scores"] == (1, 64, 512, 512) == acts["scores"][0]
    assert acts["shapes"]["K"] == (1, 8, 512, 128) and acts["device"] == "meta"


@pytest.fixture(scope="module")
def runs():
    return launch(probe_modes, 2, CFG, MOE, 4, 16)


def test_cut_tables_flag_exactly_the_cells_where_seed_b_and_the_ranks_differ(runs):
    weights = {(c.row, c.mode): c.verdict for c in weight_cut_cells(runs, CFG, MOE) if c.verdict != "agrees"}
    assert weights == {
        ("token embedding", "TP"): "imprecise",
        ("LM head", "TP"): "imprecise",
        ("LM head", "PP"): "wrong",
    }
    acts = {(c.row, c.mode): c.verdict for c in activation_cut_cells(runs, CFG, MOE, 4, 16) if c.verdict != "agrees"}
    assert acts == {
        ("input hidden", "TP"): "wrong",
        ("Q", "SP"): "wrong",
        ("K, V", "SP"): "wrong",
        ("FFN intermediate", "SP"): "wrong",
        ("attention scores", "CP"): "imprecise",
        ("logits", "PP"): "wrong",
    }
    for cell in weight_cut_cells(runs, CFG, MOE):
        assert cell.seed in SEED_WORDS  # every word of seed B's table has its English


def test_judging_a_wrong_claim_says_wrong(runs):
    """The judge is not a rubber stamp: a claim the ranks contradict is marked wrong."""
    saved = SEED_WEIGHT_CUT["W_O"]["TP"]
    try:
        SEED_WEIGHT_CUT["W_O"]["TP"] = ("列切", "[h, h/N]")  # W_O is row-split, not column-split
        assert judge_weight(runs, "W_O", "TP", CFG, MOE).verdict == "wrong"
    finally:
        SEED_WEIGHT_CUT["W_O"]["TP"] = saved


def test_axis_cuts_find_one_dimension_per_mode(runs):
    cuts = axis_cuts(runs[0], CFG, MOE, 4, 16)
    found = {m: cut_dims(cuts[m]) for m in MODES}
    found["SP"] -= found["TP"]
    assert found == SEED_AXIS_DIMS
    said = {m: spec_dims(runs[0][m]["specs"]) for m in MODES}
    said["SP"] -= said["TP"]
    assert said == {**SEED_AXIS_DIMS, "DP": set()}  # each module's shard_specs() declare what its ranks hold
    assert fig_dim_orth(cuts).axes


def test_primitives_group_the_trace_by_op_phase_and_place(runs):
    tp = primitives(runs[0]["TP"]["events"])
    assert tp[("all_reduce", "forward")]["per_layer"] == 2
    assert tp[("all_reduce", "forward")]["where"]["attn"] == CFG.n_layers


def test_superposition_pieces_reject_overlap_and_find_gaps():
    run = dict(rows=[0], positions=[0, 1], hidden_cols=[0, 1])
    owner = superposition_pieces([run], 1, 2, 4)
    assert (owner[:, :, :2] == 0).all() and (owner[:, :, 2:] == -1).all()
    with pytest.raises(AssertionError, match="rank 1 holds elements another rank holds"):
        superposition_pieces([run, run], 1, 2, 4)
    pieces = [
        dict(rows=[i], positions=[0, 1], hidden_cols=[0, 1, 2, 3], coords=dict(tp=0, cp=0, dp=i)) for i in range(2)
    ]
    assert np.array_equal(np.unique(superposition_pieces(pieces, 2, 2, 4)), [0, 1])
    assert len(fig_superposition(pieces, 2, 2, 4, 1, 1, 2).axes) == 4
