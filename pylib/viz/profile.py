"""A merged torch.profiler trace drawn as the book draws timelines: one row per rank, on the trace's one clock.

    fig = plot_profile(*lanes(trace), title="TP + SP, one step")   # lanes: `pylib.runtime.profile.lanes`

Each rank's row has two lanes. The upper lane is what the rank's thread computed: its operator slices in grey
(`profile.operators`: aten ops and autograd nodes, outside communication), and on top of them the pipeline's forward
and backward ranges where there are any. The lower lane is communication (`Span.kind`): every collective's range
(`profile.spans`, named by the tracer) in the communication colour, and every wait for an async op or a pipeline
receive in the waste colour: the time the rank's thread sat in a wait is communication that nothing hid. Nothing is
drawn that the trace does not hold: the bars are the trace's ranges, to the microsecond.
"""

from __future__ import annotations

from matplotlib.patches import Patch

from pylib.i18n import tr

from . import style

LANE = 0.36  # a lane's height; a rank's row holds two, 0.08 apart


COLOUR = {"F": style.FORWARD, "B": style.BACKWARD, "comm": style.COMM, "wait": style.WASTE}


@style.styled
def plot_profile(found, busy, *, title: str | None = None, xlim: tuple[float, float] | None = None, ax=None):
    """Draw a merged trace's lanes (see the module docstring): `found`, its named ranges (`profile.Span`s, with
    their `kind`), and `busy`, each rank's computing intervals (`profile.operators`), as `profile.lanes(trace)`
    returns them; times in milliseconds from the trace's origin. Returns the Figure."""
    n = len(busy)
    found = [s for s in found if s.kind != "region"]
    fig, ax = style.figure_axes(ax, figsize=(7.2, 0.62 * n + 1.5), grid=False)
    ms = 1e3
    if xlim is None:
        ends = [s.end for s in found] + [b for r in range(n) for _, b in busy[r]]
        xlim = (0.0, max(ends) * ms * 1.01)
    pixel = (xlim[1] - xlim[0]) / 2000  # gaps narrower than this cannot be seen: one bar
    for r in range(n):
        y = -r
        ax.broken_barh(_bars(busy[r], ms, pixel), (y + 0.04, LANE), facecolors=style.GRID, gid="operators")
        for k in ("F", "B", "comm", "wait"):
            mine = [(s.start, s.end) for s in found if s.rank == r and s.kind == k]
            top = k in ("F", "B")
            ax.broken_barh(
                _bars(mine, ms, 0.0 if top else pixel),
                (y + 0.04, LANE) if top else (y - 0.04 - LANE, LANE),
                facecolors=COLOUR[k],
                edgecolors=style.CARD if top else "none",
                linewidth=0.5,
                gid=k,
            )
    ax.set_xlim(*xlim)
    ax.set_ylim(-n + 0.45, 0.55)
    ax.set_yticks([-r for r in range(n)], [tr("rank {r}", r=r) for r in range(n)])
    ax.set_xlabel(tr("time ({unit})", unit="ms"), fontsize=style.legible_pt(fig, 9))
    ax.tick_params(labelsize=style.legible_pt(fig, 9))
    if title:
        ax.set_title(title, fontsize=style.legible_pt(fig, 10))
    shown = {s.kind for s in found}
    handles = [Patch(facecolor=style.GRID, label=tr("operators (aten)"))]
    names = {"F": tr("forward"), "B": tr("backward"), "comm": tr("collective"), "wait": tr("waiting")}
    handles += [Patch(facecolor=COLOUR[k], label=names[k]) for k in ("F", "B", "comm", "wait") if k in shown]
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.28),
        ncol=len(handles),
        fontsize=style.legible_pt(fig, 8),
    )
    fig.tight_layout()
    return fig


def _bars(intervals, scale: float, gap: float) -> list[tuple[float, float]]:
    """(start, width) bars of `intervals` (seconds) in the figure's unit, those closer than `gap` joined."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        a, b = a * scale, b * scale
        if out and a - out[-1][1] <= gap:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b - a) for a, b in out]
