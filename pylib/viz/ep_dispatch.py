"""Figures of the MoE variants large runs use: bytes across nodes with and without node-limited routing, and the
bytes per rank of the all-to-all and all-gather dispatchers over top-k with their crossover.

Both take numbers from real runs (the tracer's records, split by `pylib.ep.traffic.node_split`) beside the formulas
of `pylib.analysis.ep`, and return a matplotlib Figure in the book's style (`pylib.viz.style`).
"""

from __future__ import annotations

from ..i18n import tr
from . import style


@style.styled
def plot_node_bytes(measured: dict, limits: dict, title: str | None = None):
    """Grouped bars: for each routing variant (`measured`: {label: {"intra": rows, "inter": rows, "inter_dedup":
    rows}} summed over the ranks), the rows a dispatch sends inside a node, across nodes (one copy per expert, what
    the all-to-all moves) and across nodes once per (token, node). `limits`: {label: a horizontal mark, e.g. the
    cap T * M of node-limited routing}."""
    kinds = [
        ("intra", tr("within a node")),
        ("inter", tr("across nodes")),
        ("inter_dedup", tr("across, once per node")),
    ]
    fig, ax = style.subplots(figsize=(6.4, 3.2))
    width = 0.8 / len(measured)
    for i, (label, rows) in enumerate(measured.items()):
        xs = [j + (i - (len(measured) - 1) / 2) * width for j in range(len(kinds))]
        bars = ax.bar(xs, [rows[k] for k, _ in kinds], width * 0.95, color=style.rank_colour(i), label=label)
        for bar in bars:
            ax.text(
                bar.get_x() + bar.get_width() / 2,
                bar.get_height(),
                f"{bar.get_height():.0f}",
                ha="center",
                va="bottom",
                fontsize=7,
                color=style.TEXT,
            )
    for label, y in limits.items():
        ax.axhline(y, color=style.MUTED, lw=1, ls=":")
        ax.text(len(kinds) - 0.5, y, label, color=style.MUTED, fontsize=7, ha="right", va="bottom")
    ax.set_xticks(range(len(kinds)))
    ax.set_xticklabels([name for _, name in kinds], fontsize=8)
    ax.set_ylabel(tr("rows in one dispatch (all ranks)"))
    ax.set_title(tr("where the dispatch's rows go") if title is None else title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


@style.styled
def plot_dispatcher_bytes(top_ks, traced: dict, formula: dict, crossover: float, title: str | None = None):
    """Bytes one rank sends in a layer's forward against top-k: the tracer's (markers, `traced`: {label: [bytes
    per k]}) on the formula's (lines, `formula`: {label: [bytes per k]}, same labels), the crossover top-k marked."""
    fig, ax = style.subplots(figsize=(6.4, 3.2))
    for i, label in enumerate(formula):
        colour = style.rank_colour(i)
        ax.plot(top_ks, formula[label], color=colour, lw=1.6, label=tr("{what} (formula)", what=label))
        ax.plot(
            top_ks, traced[label], ls="none", marker="o", ms=5, color=colour, label=tr("{what} (traced)", what=label)
        )
    ax.axvline(crossover, color=style.MUTED, lw=1, ls=":")
    ax.text(
        crossover,
        ax.get_ylim()[1],
        tr(" crossover k* = {k:.1f}", k=crossover),
        color=style.MUTED,
        fontsize=7,
        va="top",
        ha="left",
    )
    ax.set_xlabel(tr("top-k"))
    ax.set_ylabel(tr("bytes sent per rank (forward)"))
    ax.set_title(tr("all-to-all vs all-gather dispatcher") if title is None else title, fontsize=9)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    fig.tight_layout()
    return fig
