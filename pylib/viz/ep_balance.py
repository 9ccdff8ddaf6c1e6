"""Load balance while the composed model trains: the figure drawn from
`pylib.experiments.moe_balance_training.balance_during_training`.

    fig = plot_balance_during_training(imbalance, bias)

Left: one line per router, the worse MoE layer's max / mean expert load at every step (1 = even). Right: the
expert bias of the aux-loss-free run, one line per expert, as it moves by +-u each step against the load.
"""

from __future__ import annotations

from pylib.i18n import tr

from . import style


@style.styled
def plot_balance_during_training(imbalance: dict[str, list[float]], bias: list[list[float]]):
    """imbalance: {label: [max / mean load per step]}; bias: per step, the expert bias [E] of one MoE layer after
    the step (the aux-loss-free run)."""
    fig, (left, right) = style.subplots(1, 2, figsize=(7.2, 3.4), gridspec_kw=dict(width_ratios=(3, 2)))
    steps = max(len(v) for v in imbalance.values())
    for i, (label, values) in enumerate(imbalance.items()):
        left.plot(range(len(values)), values, color=style.rank_colour(i), lw=1.6, label=label)
    left.axhline(1.0, color=style.MUTED, lw=1, ls=":")
    left.text(steps - 1, 1.0, tr("perfect balance "), color=style.MUTED, fontsize=8, va="bottom", ha="right")
    left.set_xlabel(tr("training step"))
    left.set_ylabel(tr("max / mean load"))
    left.set_title(tr("expert load per step, summed over the ranks"), fontsize=9)
    n_experts = len(bias[0]) if bias else 0
    for e in range(n_experts):
        right.plot(range(len(bias)), [b[e] for b in bias], color=style.rank_colour(e), lw=1.2)
    right.axhline(0.0, color=style.MUTED, lw=1, ls=":")
    right.set_xlabel(tr("training step"))
    right.set_ylabel(tr("expert bias b_i"))
    right.set_title(tr("the bias of each expert (expert-bias run)"), fontsize=9)
    fig.legend(*left.get_legend_handles_labels(), fontsize=8, ncol=2, loc="lower center", bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    return fig
