"""The TP figures are drawn from real runs: the column/row example's numbers are the ranks' real shards and
they reproduce the one-device products; the SP figure's arrows are the collectives the trace recorded."""

import numpy as np

from pylib.analysis.tp import layer_collectives
from pylib.experiments.tp_runs import column_row_example, layer_traces
from pylib.viz.tp import fig_column_vs_row, fig_sp_region


def test_column_vs_row_figure_shows_shards_that_concatenate_and_partial_sums_that_add_up():
    ex = column_row_example(t=2)
    np.testing.assert_allclose(np.concatenate(ex.col_outputs, axis=1), ex.reference_y, atol=1e-6)
    np.testing.assert_allclose(sum(ex.partials), ex.reduced, atol=1e-6)
    np.testing.assert_allclose(ex.reduced, ex.reference_z, atol=1e-5)
    # each partial sum alone is full-size and wrong: that is why the row split needs the all-reduce
    assert all(p.shape == ex.reference_z.shape and not np.allclose(p, ex.reference_z, atol=1e-3) for p in ex.partials)
    assert [w.shape for w in ex.col_weights] == [(4, 4), (4, 4)]  # seed B layout [d_in, d_out/t]
    fig = fig_column_vs_row(ex)
    shown = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert {f"{v:.1f}" for v in ex.partials[0].ravel()} <= shown  # the partial sums' numbers are on the figure


def test_sp_region_figure_draws_the_traced_collectives():
    traces = layer_traces(t=2, b=1, s=8)
    t, b, s, h = traces["t"], traces["b"], traces["s"], traces["h"]
    for mode, sp in (("TP", False), ("TP + SP", True)):
        got = [(e["phase"], e["op"], e["payload_bytes"]) for e in traces["events"][mode]]
        want = [(c.phase, c.op, c.payload_bytes) for c in layer_collectives(b, s, h, t, 4, sequence_parallel=sp)]
        assert got == want
    fig = fig_sp_region(traces)
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert labels.count("all-gather") == 4 and labels.count("reduce-scatter") == 4 and labels.count("all-reduce") == 4
