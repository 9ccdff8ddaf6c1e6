"""The TP block figure (pylib.viz.tp.fig_tp_block) draws what `tp_block_example` ran: the shards each rank held, the
shapes it computed, and the collectives f and g issued, forward and backward, which are each other's conjugates."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from pylib.experiments.tp_runs import tp_block_example  # noqa: E402
from pylib.plan.presets import tiny  # noqa: E402
from pylib.viz.tp import fig_tp_block  # noqa: E402

CFG = tiny().with_(n_layers=1, d_ff=64)  # h = 16, h_ffn = 64: the TP chapter's sizes


@pytest.fixture(scope="module")
def ex():
    return tp_block_example(CFG, t=2, b=2, s=8)


def example_without_ranks(t: int = 2, b: int = 2, s: int = 8) -> dict:
    """tp_block_example's answer, built in this process for the fast figure test: each rank's shards from
    `TPMLP.from_full` on its group (building needs no ranks), the shapes they give, the crossings as the slow test
    below checks the run traces them."""
    from pylib.model import build_model
    from pylib.runtime import AxisGroup
    from pylib.tp import TPMLP

    mlp = build_model(CFG).layers[0].mlp
    ranks = []
    for r in range(t):
        block = TPMLP.from_full(mlp, group=AxisGroup("tp", tuple(range(t)), r, None))
        specs = [(sp.name, sp.kind, tuple(sp.full_shape), tuple(sp.local_shape)) for sp in block.shard_specs()]
        h, part = CFG.d_model, block.up_proj.weight.shape[0]
        shapes = dict(x=(b, s, h), hidden=(b, s, part), partial=(b, s, h), y=(b, s, h))
        crossings = {"f": {"forward": [], "backward": ["all_reduce"]}, "g": {"forward": ["all_reduce"], "backward": []}}
        ranks.append(dict(crossings=crossings, specs=specs, shapes=shapes))
    return dict(t=t, b=b, s=s, h=CFG.d_model, h_ffn=CFG.d_ff, ranks=ranks)


@pytest.mark.slow
def test_the_block_on_two_ranks_equals_the_full_mlp_and_f_and_g_are_conjugate(ex):
    for rank in ex["ranks"]:
        assert rank["error"] < 1e-12
        f, g = rank["crossings"]["f"], rank["crossings"]["g"]
        assert f == {"forward": [], "backward": ["all_reduce"]}  # identity, then the all-reduce of dx
        assert g["forward"] == f["backward"] and g["backward"] == f["forward"]  # the conjugate pair
        assert rank["block_ops"] == {"forward": g["forward"], "backward": f["backward"]}
        h, ffn = CFG.d_model, CFG.d_ff
        assert dict((n, (k, local)) for n, k, _, local in rank["specs"]) == {
            "up_proj.weight": ("column", (ffn // 2, h)),
            "down_proj.weight": ("row", (h, ffn // 2)),
        }
        assert rank["shapes"] == dict(x=(2, 8, h), hidden=(2, 8, ffn // 2), partial=(2, 8, h), y=(2, 8, h))


@pytest.mark.slow
def test_the_example_built_without_ranks_is_what_the_ranks_ran(ex):
    fast = example_without_ranks()
    for ran, built in zip(ex["ranks"], fast["ranks"]):
        assert {k: ran[k] for k in built} == built


def test_the_figure_names_each_ranks_shards_and_the_traced_collectives():
    fig = fig_tp_block(example_without_ranks())
    texts = [t.get_text() for t in fig.findobj(Text) if t.get_text().strip()]
    plt.close(fig)
    assert sum("W_up [16, 32]" in t for t in texts) == 2 and sum("W_down [32, 16]" in t for t in texts) == 2
    assert sum("GELU\n[2, 8, 32]" == t for t in texts) == 2
    assert "forward: identity\nbackward: all-reduce" in texts  # f
    assert "forward: all-reduce\nbackward: identity" in texts  # g
    assert any("h_ffn = 64" in t for t in texts)


def test_the_block_example_refuses_a_swiglu_mlp():
    with pytest.raises(ValueError, match="GELU MLP"):
        tp_block_example(CFG.with_(mlp="swiglu"))
