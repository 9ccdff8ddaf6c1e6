"""Expert-parallel figures: the routing table, the all-to-all traffic matrix, the folding layout, load balance
under training and drops vs capacity factor.

Each takes data from real runs (`pylib.ep.routing_table`, `pylib.ep.traffic.traffic_matrix` of a trace,
`pylib.ep.folding.folding_groups` of the rank generator) and returns a matplotlib Figure in the book's style
(`pylib.viz.style`): a rank (or a group of ranks) in its rank colour.
"""

from __future__ import annotations

from matplotlib.colors import LinearSegmentedColormap
from matplotlib.patches import Rectangle

from ..i18n import tr
from . import style

# plot_traffic_matrix's scale: no bytes on the card, the most bytes in the palette's blue
BYTES = LinearSegmentedColormap.from_list("bytes", [style.CARD, style.BLUE])


@style.styled
def plot_routing_table(rows: list[dict], n_experts: int, ep: int, one_based: bool = False):
    """Tokens (rows) x experts (columns): a chosen expert is a cell filled in its owning rank's colour, labelled
    with its combine weight (hatched when dropped by capacity). Column bands show which rank holds which experts."""
    per = n_experts // ep
    off = 1 if one_based else 0
    fig, ax = style.subplots(figsize=(1.0 + 0.7 * n_experts, 0.9 + 0.45 * len(rows)), grid=False)
    for e in range(n_experts):
        ax.add_patch(Rectangle((e, -0.5), 1, len(rows), color=style.rank_colour(e // per), alpha=0.10, lw=0))
    for t, r in enumerate(rows):
        for e, w, rank, kept in zip(r["experts"], r["weights"], r["ranks"], r["kept"]):
            color = style.rank_colour(rank)
            ax.add_patch(
                Rectangle(
                    (e + 0.06, t - 0.44),
                    0.88,
                    0.88,
                    color=color,
                    alpha=0.85 if kept else 0.3,
                    hatch=None if kept else "//",
                    lw=0,
                )
            )
            ink = style.ink_on(color, 0.85) if kept else style.TEXT
            ax.text(e + 0.5, t, f"{w:.2f}", ha="center", va="center", fontsize=8, color=ink)
    ax.set_xlim(0, n_experts)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xticks([e + 0.5 for e in range(n_experts)])
    ax.set_xticklabels([f"E{e + off}\nGPU{e // per}" for e in range(n_experts)], fontsize=8)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r["token"] for r in rows])
    ax.set_title(tr("top-{k} routing: token -> experts -> owning rank (EP={ep})", k=len(rows[0]["experts"]), ep=ep))
    fig.tight_layout()
    return fig


@style.styled
def plot_traffic_matrix(matrix, title: str | None = None, labels=None):
    """A rank x rank heat map of bytes, each cell labelled; the diagonal (rows that stay local, never sent) is
    outlined. `matrix` from `pylib.ep.traffic.traffic_matrix` (a trace) or `pylib.analysis.ep.dispatch_matrix`."""
    n = len(matrix)
    fig, ax = style.subplots(figsize=(1.6 + 0.75 * n, 1.2 + 0.7 * n), grid=False)
    ax.imshow(matrix, cmap=BYTES, vmin=0)
    peak = max(max(row) for row in matrix) or 1
    for s in range(n):
        for d in range(n):
            v = matrix[s][d]
            ax.text(d, s, f"{v}", ha="center", va="center", fontsize=8, color=style.ink_on(BYTES(v / peak)))
        ax.add_patch(Rectangle((s - 0.5, s - 0.5), 1, 1, fill=False, ec=style.MUTED, lw=1.5, ls="--"))
    labels = labels or [f"rank {i}" for i in range(n)]
    ax.set_xticks(range(n))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_yticks(range(n))
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlabel(tr("to (destination)"))
    ax.set_ylabel(tr("from (source)"))
    ax.set_title(
        tr("dispatch all-to-all: bytes from rank (row) to rank (column)") if title is None else title, fontsize=9
    )
    fig.tight_layout()
    return fig


@style.styled
def plot_folding(groups: dict, world_size: int):
    """Two panels, dense layout (TP, CP, DP, PP) and expert layout (ETP, EP, EDP, PP): for each axis a strip of
    the `world_size` ranks, ranks of the same group sharing a colour. `groups` from
    `pylib.ep.folding.folding_groups`."""
    layouts = list(groups.items())
    n_axes = max(len(axes) for _, axes in layouts)
    # one panel above the other, so the figure stays within a page column (7.2 in) and its digits legible
    figsize = (min(7.2, 1.3 + 0.36 * world_size), 0.9 + (0.5 * n_axes + 0.45) * len(layouts))
    fig, axs = style.subplots(nrows=len(layouts), figsize=figsize, grid=False)
    for ax, (layout, axes) in zip(axs, layouts):
        for row, gs in enumerate(axes.values()):
            for gi, members in enumerate(gs):
                color = style.rank_colour(gi)
                alpha = 0.85 if len(members) > 1 else 0.25
                ink = style.ink_on(color, alpha)
                for r in members:
                    ax.add_patch(Rectangle((r + 0.05, row + 0.08), 0.9, 0.84, color=color, alpha=alpha, lw=0))
                    ax.text(r + 0.5, row + 0.5, str(r), ha="center", va="center", fontsize=8, color=ink)
        ax.set_xlim(0, world_size)
        ax.set_ylim(len(axes), 0)
        ax.set_yticks([i + 0.5 for i in range(len(axes))])
        ax.set_yticklabels([f"{a.upper()} ({len(g[0])})" for a, g in axes.items()], fontsize=8)
        ax.set_xticks([])
        ax.set_title(tr("{layout} layers: ", layout=layout) + " x ".join(a.upper() for a in axes), fontsize=9)
    fig.suptitle(tr("the same ranks, two groupings (same colour = same group)"), fontsize=10)
    fig.tight_layout()
    return fig


@style.styled
def plot_load_balance(histories: dict, title: str | None = None):
    """One line per training variant: the imbalance at each step (`pylib.ep.balance.BalanceRun.worst()`), with
    perfect balance (1.0) marked. `histories`: {label: [imbalance per step]}."""
    fig, ax = style.subplots(figsize=(6.4, 3.6))
    steps = 0
    for i, (label, values) in enumerate(histories.items()):
        ax.plot(range(len(values)), values, color=style.rank_colour(i), lw=1.8, label=label)
        steps = max(steps, len(values))
    ax.axhline(1.0, color=style.MUTED, lw=1, ls=":")
    ax.text(steps - 1, 1.0, tr("perfect balance "), color=style.MUTED, fontsize=8, va="bottom", ha="right")
    ax.set_xlabel(tr("training step"))
    ax.set_ylabel(tr("max / mean load"))
    ax.set_title(
        tr("load imbalance while training (max / mean assignments per expert)") if title is None else title, fontsize=9
    )
    ax.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    fig.tight_layout()
    return fig


@style.styled
def plot_dropped(factors, dropped: dict, title: str | None = None):
    """One line per router: the share of assignments (in %) a capacity limit drops at each capacity factor.
    `dropped`: {label: [share in 0..1 per factor]} from `pylib.ep.balance.dropped_share`."""
    fig, ax = style.subplots(figsize=(6.4, 3.0))
    for i, (label, values) in enumerate(dropped.items()):
        ax.plot(factors, [100 * v for v in values], marker="o", color=style.rank_colour(i), lw=1.8, label=label)
    ax.set_xlabel(tr("capacity factor"))
    ax.set_ylabel(tr("dropped (%)"))
    ax.set_title(tr("assignments dropped vs capacity factor") if title is None else title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def expert_holdings(param_map) -> list[tuple[int, int, int]]:
    """(expert id, first, stop) of the expert hidden units (h_ffn) a rank holds, from its
    `ExpertParallelMoE.param_map()`: the rows of each expert's up_proj it keeps."""
    out = []
    for _, _, ref, index in param_map:
        parts = ref.split(".")
        if parts[0] == "experts" and parts[2] == "up_proj":
            cut = index[0]
            out.append((int(parts[1]), cut.start, cut.stop))
    return out


@style.styled
def plot_expert_placement(holdings_per_rank, n_experts: int, d_ff: int, title: str | None = None):
    """The expert weights as one plane, experts (columns) x hidden units h_ffn (rows), each block filled in the
    colour of the rank that holds it. `holdings_per_rank[r]` = `expert_holdings(param_map)` of rank r."""
    fig, ax = style.subplots(figsize=(1.2 + 0.75 * n_experts, 2.6), grid=False)
    for rank, held in enumerate(holdings_per_rank):
        color = style.rank_colour(rank)
        ink = style.ink_on(color, 0.8)
        for e, lo, hi in held:
            ax.add_patch(Rectangle((e + 0.05, lo), 0.9, hi - lo, color=color, alpha=0.8, lw=0))
            ax.text(e + 0.5, (lo + hi) / 2, tr("rank {r}", r=rank), ha="center", va="center", fontsize=7, color=ink)
    ax.set_xlim(0, n_experts)
    ax.set_ylim(d_ff, 0)
    ax.set_xticks([e + 0.5 for e in range(n_experts)])
    ax.set_xticklabels([f"E{e}" for e in range(n_experts)], fontsize=8)
    ax.set_ylabel(tr("expert hidden unit (h_ffn)"))
    ax.set_title(title or tr("who holds which expert weights"), fontsize=9)
    fig.tight_layout()
    return fig
