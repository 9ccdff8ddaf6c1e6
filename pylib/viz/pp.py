"""Pipeline figures: schedule timelines with the bubble shaded, and the bubble against the number of microbatches.

    fig = plot_schedule(build("1f1b", 4, 8))                      # before running anything: the pure schedule
    fig = plot_timeline(runs_timeline, title="1F1B, measured")     # from a real run (pylib.pp executor Events)

One row per rank (rank 0 on top); forwards and backwards as bars labelled with the microbatch (and the chunk, when
interleaved: lighter bars for later chunks); the time a rank idles inside the step is hatched -- the bubble.
Colours are mid-tones and the background transparent, so the figures read on light and dark pages.
"""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from ..pp.simulate import simulate
from ..pp.timeline import as_events, bubble, idle_intervals

FORWARD = "#4E79A7"
BACKWARD = "#E8903C"
COMM = "#8C8C8C"
BUBBLE = "#C44E52"
TEXT = "#8A8A8A"


def _style(ax) -> None:
    ax.set_facecolor("none")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_color(TEXT)
    ax.tick_params(colors=TEXT)
    ax.xaxis.label.set_color(TEXT)
    ax.yaxis.label.set_color(TEXT)
    ax.title.set_color(TEXT)


def _shade(color: str, chunk: int, n_chunks: int) -> tuple:
    """Chunk 0 in the full colour, later chunks lighter."""
    rgb = matplotlib.colors.to_rgb(color)
    mix = 0.45 * chunk / max(n_chunks - 1, 1)
    return tuple(c + (1 - c) * mix for c in rgb)


def plot_timeline(
    timeline, *, title: str | None = None, unit: str = "s", show_comm: bool = True, shade_bubble: bool = True, ax=None
):
    """Draw a timeline (Events from `simulate` or from the executor, or their dicts); returns the Figure.

    The drawn bars are exactly the compute events; the hatched spans are exactly `timeline.idle_intervals`, so the
    shaded area per rank is the rank's idle time and the title's bubble is `timeline.bubble(...)`."""
    events = as_events(timeline)
    compute = [e for e in events if e.is_compute]
    ranks = sorted({e.rank for e in events})
    n_chunks = max((e.chunk for e in compute), default=0) + 1
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 0.55 * len(ranks) + 1.4))
    else:
        fig = ax.figure
    fig.patch.set_alpha(0)
    _style(ax)
    height = 0.8
    span = max(e.end for e in compute) - min(e.start for e in compute)
    for e in compute:
        y = -e.rank
        color = _shade(FORWARD if e.kind == "F" else BACKWARD, e.chunk, n_chunks)
        ax.add_patch(
            Rectangle(
                (e.start, y - height / 2),
                e.duration,
                height,
                facecolor=color,
                edgecolor=(1, 1, 1, 0.7),
                linewidth=0.6,
                gid="compute",
            )
        )
        if e.duration > span / 60:
            label = f"{e.mb}" if n_chunks == 1 else f"{e.mb}.{e.chunk}"
            ax.text(e.start + e.duration / 2, y, label, ha="center", va="center", fontsize=7, color="#1E1E1E")
    if shade_bubble:
        for r in ranks:
            for t0, t1 in idle_intervals(events, r):
                ax.add_patch(
                    Rectangle(
                        (t0, -r - height / 2),
                        t1 - t0,
                        height,
                        facecolor=BUBBLE,
                        alpha=0.18,
                        hatch="///",
                        edgecolor=BUBBLE,
                        linewidth=0,
                        gid="bubble",
                    )
                )
    if show_comm:
        for e in events:
            if not e.is_compute and e.duration > 0:
                ax.add_patch(
                    Rectangle(
                        (e.start, -e.rank - height / 2 - 0.08),
                        e.duration,
                        0.06,
                        facecolor=COMM,
                        edgecolor="none",
                        gid="comm",
                    )
                )
    t_min = min(e.start for e in events)
    t_max = max(e.end for e in events)
    ax.set_xlim(t_min, t_max + 0.01 * (t_max - t_min))
    ax.set_ylim(-len(ranks) + 0.4, 0.6)
    ax.set_yticks([-r for r in ranks], [f"rank {r}" for r in ranks])
    ax.set_xlabel("time" + (f" ({unit})" if unit else ""))
    b = bubble(events)
    head = f"{title}: " if title else ""
    ax.set_title(f"{head}bubble {b.mean_relative:.3f} of ideal ({b.mean_share:.1%} of the step)", fontsize=10)
    handles = [Patch(facecolor=FORWARD, label="forward"), Patch(facecolor=BACKWARD, label="backward")]
    if shade_bubble:
        handles.append(Patch(facecolor=BUBBLE, alpha=0.3, hatch="///", label="bubble"))
    if show_comm:
        handles.append(Patch(facecolor=COMM, label="send / recv wait"))
    legend = ax.legend(
        handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=len(handles), frameon=False, fontsize=8
    )
    for text in legend.get_texts():
        text.set_color(TEXT)
    fig.tight_layout()
    return fig


def plot_schedule(
    schedule, *, cost_f: float = 1.0, cost_b: float = 2.0, sends: str = "eager", title: str | None = None, ax=None
):
    """Draw a pure schedule (`pylib.pp.schedules`) from its simulated logical timeline."""
    events = simulate(schedule, cost_f, cost_b, sends=sends)
    name = title or f"{schedule.name}, p={schedule.p}, m={schedule.m}" + (f", v={schedule.v}" if schedule.v > 1 else "")
    return plot_timeline(events, title=name, unit="time steps", show_comm=False, ax=ax)


def plot_bubble_sweep(rows, *, title: str = "Bubble vs microbatches", ax=None):
    """rows: dicts with schedule, m, formula and one or more measured values (keys starting with "measured").
    Draws each schedule's formula as a line and the measurements as markers against m."""
    if ax is None:
        fig, ax = plt.subplots(figsize=(6, 4))
    else:
        fig = ax.figure
    fig.patch.set_alpha(0)
    _style(ax)
    colors = ["#4E79A7", "#E8903C", "#59A14F", "#B07AA1"]
    markers = ["o", "s", "^", "D"]
    names = list(dict.fromkeys(r["schedule"] for r in rows))
    for i, name in enumerate(names):
        mine = sorted((r for r in rows if r["schedule"] == name), key=lambda r: r["m"])
        ms = [r["m"] for r in mine]
        ax.plot(ms, [r["formula"] for r in mine], color=colors[i % 4], label=f"{name}: formula")
        keys = [k for k in mine[0] if k.startswith("measured")]
        for j, k in enumerate(keys):
            ax.plot(
                ms,
                [r[k] for r in mine],
                linestyle="none",
                marker=markers[j % 4],
                color=colors[i % 4],
                alpha=0.8,
                label=f"{name}: {k}",
            )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("microbatches m")
    ax.set_ylabel("bubble / ideal time")
    ax.set_title(title, fontsize=10)
    legend = ax.legend(frameon=False, fontsize=7)
    for text in legend.get_texts():
        text.set_color(TEXT)
    fig.tight_layout()
    return fig
