"""Part I's helpers: the layer flow (pylib.seedcheck.layer_flow, pylib.viz.layer_flow), the token-locality check
(pylib.experiments.split_check), the printed-number checks (pylib.seedcheck.printed)."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

from pylib.experiments.split_check import split_check
from pylib.model import Block, ModelConfig, build_model  # noqa: E402
from pylib.runtime import collectives  # noqa: E402
from pylib.seedcheck.layer_flow import layer_flow, record_block_calls
from pylib.seedcheck.primitives import primitive_names
from pylib.seedcheck.printed import compare_printed, round_half_up
from pylib.tables import format_rows, markdown_table
from pylib.viz import style  # noqa: E402
from pylib.viz.layer_flow import COLOURS, draw_layer_flow
from pylib.viz.three_axes import draw_three_axes


@pytest.fixture(scope="module")
def seed_a():
    model = build_model(ModelConfig.seed_a())
    with torch.no_grad():
        x = model.embed(torch.arange(8).view(2, 4))
    return model, x


def test_layer_flow_groups_the_reference_block_into_seed_a_six_stages(seed_a):
    model, x = seed_a
    flow = layer_flow(model.layers[0], x)
    assert [s.number for s in flow] == [1, 2, 3, 4, 5, 6]
    assert [s.module_names for s in flow] == [
        ["ln1"],
        ["attn.q_proj", "attn.k_proj", "attn.v_proj"],
        ["attn.core"],
        ["attn.o_proj"],
        ["ln2"],
        ["mlp.up_proj", "mlp.down_proj"],
    ]
    up = flow[5].calls[0]
    assert (up.in_shape, up.out_shape, up.weight_shape) == ((2, 4, 4), (2, 4, 8), (8, 4))  # torch [out, in]
    assert flow[2].calls[0].in_shape == (2, 1, 4, 4)  # q [b, n_head, s, d_head]


def test_record_block_calls_leaves_the_block_as_it_was(seed_a):
    model, x = seed_a
    block = model.layers[0]
    record_block_calls(block, x)
    assert "core" not in vars(block.attn)  # the wrapper is gone; the method is the class's again
    assert not block._forward_hooks and all(not m._forward_hooks for m in block.modules())


def test_layer_flow_rejects_a_post_ln_block(seed_a):
    _, x = seed_a

    class PostLN(Block):
        def forward(self, x, positions=None):
            x = self.ln1(x + self.attn(x, positions))
            return self.ln2(x + self.mlp(x))

    block = PostLN(ModelConfig.seed_a())
    with pytest.raises(ValueError, match="ln1 \\(stage 1\\) was called after stage 4"):
        layer_flow(block, x)


def test_split_check_passes_token_local_modules_and_fails_attention(seed_a):
    model, x = seed_a
    block = model.layers[0]
    ln = split_check(block.ln1, [x], [1])
    assert ln.matches and ln.mark == "✓" and ln.comm_events == 0
    assert ln.local_in_shapes == [[(2, 2, 4)], [(2, 2, 4)]] and ln.local_out_shapes == [(2, 2, 4), (2, 2, 4)]
    with torch.no_grad():
        q, k, v = block.attn.project(block.ln1(x))
    attn = split_check(block.attn.core, [q, k, v], [2, 2, 2])
    assert not attn.matches and attn.mark == "✗" and attn.max_abs_err > 0.1


def test_split_check_counts_the_communication_that_repairs_attention(seed_a):
    model, x = seed_a
    attn = model.layers[0].attn
    with torch.no_grad():
        q, k, v = attn.project(model.layers[0].ln1(x))
        whole = attn.core(q, k, v)

    def gathered(q, k, v):  # every rank all-gathers K and V along the sequence, then attends with its own Q
        return attn.core(q, collectives.all_gather(k, dim=2), collectives.all_gather(v, dim=2))

    check = split_check(gathered, [q, k, v], [2, 2, 2], reference=whole)
    assert check.matches and check.comm_events == 4  # 2 ranks x (K, V)


def test_split_check_names_an_indivisible_sequence(seed_a):
    _, x = seed_a
    with pytest.raises(ValueError, match="world_size=3 does not divide the sequence length 4"):
        split_check(F.gelu, [x], [1], world_size=3)


def test_round_half_up_sends_halves_away_from_zero():
    assert round_half_up(2.675, 2) == 2.68  # round() gives 2.67: 2.675 is stored just below the half
    assert round_half_up(0.2985, 3) == 0.299 and round(0.2985, 3) == 0.298
    assert round_half_up(-1.0225, 3) == -1.023
    assert round_half_up(0.90747, 3) == 0.907


def test_compare_printed_tells_exact_from_double_rounding_slip_from_mismatch():
    checks = compare_printed([[0.90747, 0.5, 0.123]], [[0.908, 0.5, 0.2]])
    assert [c.status for c in checks] == ["slip", "exact", "mismatch"]
    assert [c.index for c in checks] == [(0, 0), (0, 1), (0, 2)]
    with pytest.raises(ValueError, match="shape"):
        compare_printed([1.0, 2.0], [1.0])


def test_seed_a_config_reproduces_the_seed_printed_embedding_and_w_up_row(seed_a):
    """The chapter's construction, guarded: if the model's creation order changed, the seed's numbers would go."""
    model, x = seed_a
    torch.manual_seed(0)
    assert torch.equal(x[0], torch.randn(4, 4))
    block = model.layers[0]
    with torch.no_grad():
        h = block.ln1(x)
        h = h + block.attn(h)
        up = block.mlp.up_proj(block.ln2(h))
    printed = [[0.632, 0.729, 0.258, -0.508, 0.987, -0.241, -0.315, -0.160]]  # seed A, the cat row after W_up
    assert [c.status for c in compare_printed(up[0, 1:2], printed)] == ["exact"] * 8


def test_draw_layer_flow_draws_a_box_per_stage_in_the_given_colours_on_the_card(seed_a):
    model, x = seed_a
    flow = layer_flow(model.layers[0], x)
    fig = draw_layer_flow(flow, colours={3: "red"}, legend={"red": "token-global"})
    ax = fig.axes[0]
    boxes = [p for p in ax.patches if isinstance(p, FancyBboxPatch)]
    assert len(boxes) == 8  # the input, six stages, the output
    assert fig.get_facecolor() == matplotlib.colors.to_rgba(style.CARD)
    red = matplotlib.colors.to_rgba(COLOURS["red"])
    assert [b.get_facecolor() for b in boxes].count(red) == 1
    texts = [t.get_text() for t in ax.texts]
    assert "③ attention" in texts and texts.count("residual") == 2


def test_draw_three_axes_requires_every_element_held_by_exactly_one_rank():
    idx = torch.arange(2 * 4 * 4).view(2, 4, 4)
    ok = draw_three_axes({"seq": [t.reshape(-1) for t in idx.chunk(2, dim=1)]}, (2, 4, 4))
    assert len(ok.axes) == 1
    with pytest.raises(ValueError, match="held by two ranks"):
        draw_three_axes({"bad": [idx.reshape(-1), idx[0].reshape(-1)]}, (2, 4, 4))
    with pytest.raises(ValueError, match="16 elements are held by no rank"):
        draw_three_axes({"bad": [idx[0].reshape(-1)]}, (2, 4, 4))


def test_markdown_table_is_a_labelled_myst_table():
    text = markdown_table(["a", "b"], [[1, "x|y"]], caption="A caption", name="tbl-x")
    assert text.splitlines()[:2] == [":::{table} A caption", ":name: tbl-x"]
    assert "| 1 | x\\|y |" in text and text.endswith(":::")
    with pytest.raises(ValueError, match="a row has 1 cells, the header 2"):
        markdown_table(["a", "b"], [[1]], caption="c", name="n")


def test_format_rows_prints_labelled_rows_with_fixed_decimals():
    text = format_rows([[0.5, -1.25], [1.0, 2.0]], ["cat", "here"], ["d1", "d2"])
    assert text.splitlines() == ["          d1      d2", "cat  [ 0.500, -1.250]", "here [ 1.000,  2.000]"]
    with pytest.raises(ValueError, match="2 rows"):
        format_rows([[1.0]], ["a", "b"])


def test_primitive_names_give_seed_a_names_of_traced_ops_once_each_in_a_fixed_order():
    assert primitive_names(["recv", "send", "send", "recv"]) == ["P2P"]
    assert primitive_names(["reduce_scatter", "all_gather", "all_gather"]) == ["All-Gather", "Reduce-Scatter"]
    assert primitive_names(["all_to_all", "all_reduce"]) == ["All-Reduce", "All-to-All"]
    assert primitive_names([]) == []
    with pytest.raises(ValueError, match=r"no article A name for traced ops \['broadcast'\]"):
        primitive_names(["all_reduce", "broadcast"])


def test_primitive_names_of_a_traced_tensor_parallel_layer_with_and_without_sp():
    """The dimensions chapter's reading of a trace, on a real 2-rank TP layer."""

    def rank():
        from pylib.runtime import trace
        from pylib.tp import TPBlock, scatter_to_sequence_parallel_region

        cfg = ModelConfig.seed_a().with_(n_heads=2, dtype="float64")
        x = torch.randn(1, 8, 4, dtype=torch.float64)
        out = {}
        for sp in (False, True):
            block = TPBlock.from_full(build_model(cfg).layers[0], sequence_parallel=sp)
            xin = (scatter_to_sequence_parallel_region(x) if sp else x).requires_grad_()
            with trace() as tr:
                block(xin).sum().backward()
            out[sp] = [e.op for e in tr.events]
        return out

    from pylib.runtime import launch

    ops = launch(rank, 2)[0]
    assert primitive_names(ops[False]) == ["All-Reduce"]
    assert primitive_names(ops[True]) == ["All-Gather", "Reduce-Scatter"]


def test_dims_rows_mark_a_mode_by_whether_its_traced_primitives_are_seed_a_s():
    from pylib.seedcheck.seed_a_tables import SEED_A_DIMS, dims_rows

    ops = {"DP": ["all_reduce"], "TP": ["all_reduce"], "SP": ["all_gather", "reduce_scatter"], "PP": ["send"],
           "CP": ["recv"], "EP": ["all_to_all"]}  # fmt: skip
    rank = {m: [{"op": op, "phase": "backward" if m == "DP" else "forward"} for op in o] for m, o in ops.items()}
    rows = dims_rows([rank])
    assert [r[0] for r in rows] == list(SEED_A_DIMS) and all(r[-1] == "✓" for r in rows)
    assert rows[0][4:6] == ["none", "All-Reduce"]  # DP: silent forward, all-reduce backward
    rank["EP"] = [{"op": "all_gather", "phase": "forward"}]
    assert dims_rows([rank])[-1][-1] == "✗"


def test_ring_round_rows_print_seed_a_s_table_and_its_end_row():
    from pylib.seedcheck.seed_a_tables import ring_round_rows

    rounds = [{"round": 1, "holds": [0, 1], "recv_from": None}, {"round": 2, "holds": [1, 0], "recv_from": [1, 0]}]
    rows = ring_round_rows(rounds)
    assert [r[0] for r in rows] == ["round 1", "pass ↓", "round 2", "end"]
    assert rows[1][1] == "K1V1 from GPU 1" and rows[-1][1:] == ["Q0 saw 2 of 2 ✓", "Q1 saw 2 of 2 ✓"]


def test_traffic_light_colours_and_the_remedy_verdict():
    from pylib.seedcheck.traffic_light import traffic_light, verdict

    assert [traffic_light(False, ["w"]), traffic_light(True, ["w"]), traffic_light(True, [])] == [
        "red", "yellow", "green"]  # fmt: skip
    assert verdict(["TP column"], ["TP column"]) == "agrees"
    assert verdict(["cut"], ["SP cut", "CP cut"]) == "agrees; article A is less specific"
    with pytest.raises(ValueError, match="article A names"):
        verdict(["TP column"], ["EP experts"])


def test_selection_guide_per_gpu_traffic_is_bounded_for_tp_cp_and_dp_alike():
    """traffic-plan: DP is not the only mode whose per-GPU bytes stay bounded as it grows."""
    from pylib.experiments.selection_guide import selection_guide

    n = selection_guide().n
    assert n["tp_layer_8"] < n["tp_layer_64"] < n["tp_bound"]
    assert n["cp_ring_8"] < n["cp_ring_64"] < n["cp_bound"]
    assert n["dp_8"] < n["dp_1024"] < 2 * n["dp_shard"]
    assert n["sp_fwd_tp"] == n["sp_fwd_sp"] and n["sp_green_tp"] == 8 * n["sp_green_sp"]
