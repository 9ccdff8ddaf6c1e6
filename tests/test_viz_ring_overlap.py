"""The ring-overlap timeline (pylib.viz.cp.ring_overlap_figure) draws the measured run's compute and transfers:
ring_overlap_timings keeps each rank's last repeat as a timeline, whose order is the one the code path promises."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from pylib.experiments.ring_overlap import ring_overlap_timings  # noqa: E402
from pylib.viz import style  # noqa: E402
from pylib.viz.cp import ring_overlap_figure  # noqa: E402


def timelines_of_two_steps() -> dict:
    """A cp = 2 ring's timeline, in seconds, shaped as ring_overlap_timings returns it: forward steps 0 and 1, the
    K/V block for step 1 overlapped with step 0 (issued before, waited for after) or fetched before it starts."""

    def rank(shift: float, overlap: bool) -> dict:
        compute = [
            dict(phase="forward", step=0, start=0.010 + shift, end=0.030 + shift),
            dict(phase="forward", step=1, start=0.031 + shift, end=0.040 + shift),
            dict(phase="backward", step=0, start=0.045 + shift, end=0.085 + shift),
            dict(phase="backward", step=1, start=0.086 + shift, end=0.100 + shift),
        ]
        kv = (0.009, 0.031) if overlap else (0.002, 0.009)
        transfers = [dict(phase="forward", name="kv.1", start=kv[0] + shift, end=kv[1] + shift)]
        return dict(compute=compute, transfers=transfers)

    return {name: [rank(0.0, name == "overlap"), rank(0.004, name == "overlap")] for name in ("overlap", "blocking")}


def test_the_figure_draws_every_compute_interval_and_transfer_of_every_rank():
    tl = timelines_of_two_steps()
    fig = ring_overlap_figure(tl)
    bars = [p for ax in fig.axes for p in ax.patches if isinstance(p, Rectangle)]
    texts = [t.get_text() for t in fig.findobj(Text)]
    drawn = sum(len(r["compute"]) + len(r["transfers"]) for v in tl.values() for r in v)
    assert len(fig.axes) == 2 and len(bars) == drawn
    assert texts.count("F0") == 4 and texts.count("B1") == 4 and texts.count("kv.1") == 4
    assert "overlapped (overlap=True)" in texts and "blocking (overlap=False)" in texts
    ax = fig.axes[0]  # overlapped, rank 0: the transfer's bar covers step 0's compute bar
    kv = min((p for p in ax.patches if p.get_height() < 0.65), key=lambda p: (p.get_y(), p.get_x()))
    step0 = min((p for p in ax.patches if p.get_height() > 0.65), key=lambda p: (p.get_y(), p.get_x()))
    assert kv.get_x() <= step0.get_x() and kv.get_x() + kv.get_width() >= step0.get_x() + step0.get_width()
    fig.canvas.draw()
    assert style.smallest_text_px(fig) >= style.LEGIBLE_PX
    plt.close(fig)


@pytest.mark.slow
def test_the_measured_timeline_puts_each_transfer_where_the_orders_say():
    res = ring_overlap_timings(cp=2, s=64, n_head=2, n_kv_head=1, d_head=8, repeats=1)
    for name, in_flight in (("overlap", True), ("blocking", False)):
        for rank in res["timelines"][name]:
            steps = {(c["phase"], c["step"]): c for c in rank["compute"]}
            assert {k for k in steps} == {("forward", 0), ("forward", 1), ("backward", 0), ("backward", 1)}
            (kv,) = [t for t in rank["transfers"] if t["phase"] == "forward"]
            assert kv["name"] == "kv.1"
            step0 = steps[("forward", 0)]
            if in_flight:
                assert kv["start"] <= step0["start"] and kv["end"] >= step0["end"]
            else:
                assert kv["end"] <= step0["start"]
            assert all(0 <= x["start"] <= x["end"] for x in rank["compute"] + rank["transfers"])
