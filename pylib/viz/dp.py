"""Data-parallel figures, drawn from real runs: ZeRO's per-rank memory bars and the bucket / backward overlap.

    fig = plot_zero_memory({"ddp": mem, "zero1": mem1, ...}, formula={...})   # HeldBytes dicts, measured
    fig = plot_bucket_overlap([report_rank0, report_rank1])                   # OverlapReports from traces

Colours are mid-tones on a transparent background, so the figures read on light and dark pages.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

PARAMS = "#3b78c4"
GRADS = "#c8691e"
OPTIM = "#2e9467"
TRANSIENT = "#8a63c6"
BACKWARD = "#7a818c"
BUCKETS = ("#3b78c4", "#1b8f9c")
TEXT = "#7a818c"

STAGE_LABELS = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def _style(ax) -> None:
    ax.set_facecolor("none")
    ax.figure.patch.set_alpha(0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_color(TEXT)
    ax.tick_params(colors=TEXT)
    ax.xaxis.label.set_color(TEXT)
    ax.yaxis.label.set_color(TEXT)
    ax.title.set_color(TEXT)


def plot_zero_memory(
    measured: dict,
    *,
    formula: dict | None = None,
    unit: str = "KiB",
    title: str | None = None,
    show_peak: bool = True,
    ax=None,
):
    """Stacked bars of the bytes one rank holds per stage: parameters, gradients, optimizer state.

    measured: stage -> `HeldBytes` (or its dict) from a real run. formula: stage -> {"params", "grads", "optim"}
    (e.g. `pylib.analysis.dp.held_bytes`), drawn as a dashed outline at its total. show_peak: hatch on top what is
    resident only for a while -- ZeRO-3's gathered unit, ZeRO-2's buckets on the wire (peak - held)."""
    scale = _UNITS[unit]
    stages = list(measured)
    if ax is None:
        fig, ax = plt.subplots(figsize=(1.6 * len(stages) + 2.5, 4))
    else:
        fig = ax.figure
    _style(ax)
    width = 0.6
    for i, stage in enumerate(stages):
        m = measured[stage]
        m = m if isinstance(m, dict) else m.as_dict()
        bottom = 0.0
        for key, color in (("params", PARAMS), ("grads", GRADS), ("optim", OPTIM)):
            h = m[key] / scale
            ax.add_patch(Rectangle((i - width / 2, bottom), width, h, facecolor=color, edgecolor="none", gid=key))
            bottom += h
        if show_peak:
            extra = (m.get("peak_params", m["params"]) - m["params"]) + (m.get("peak_grads", m["grads"]) - m["grads"])
            if extra > 0:
                ax.add_patch(
                    Rectangle(
                        (i - width / 2, bottom),
                        width,
                        extra / scale,
                        facecolor="none",
                        edgecolor=TRANSIENT,
                        hatch="///",
                        linewidth=0.8,
                        gid="transient",
                    )
                )
        ax.text(i, bottom, f"{bottom:,.1f}", ha="center", va="bottom", color=TEXT, fontsize=8)
        if formula is not None and stage in formula:
            total = sum(formula[stage][k] for k in ("params", "grads", "optim")) / scale
            ax.plot(
                [i - width / 2 - 0.06, i + width / 2 + 0.06],
                [total, total],
                linestyle="--",
                color=TEXT,
                linewidth=1.2,
                gid="formula",
            )
    tops = []
    for stage in stages:
        m = measured[stage] if isinstance(measured[stage], dict) else measured[stage].as_dict()
        tops.append(max(m["params"], m.get("peak_params", 0)) + max(m["grads"], m.get("peak_grads", 0)) + m["optim"])
    ax.set_xlim(-0.6, len(stages) - 0.4)
    ax.set_ylim(0, 1.15 * max(tops) / scale)
    ax.set_xticks(range(len(stages)), [STAGE_LABELS.get(s, s) for s in stages])
    ax.set_ylabel(f"held by one rank ({unit})")
    handles = [
        Patch(color=PARAMS, label="parameters"),
        Patch(color=GRADS, label="gradients"),
        Patch(color=OPTIM, label="optimizer state"),
    ]
    if show_peak:
        handles.append(Patch(facecolor="none", edgecolor=TRANSIENT, hatch="///", label="transient (peak)"))
    if formula is not None:
        handles.append(plt.Line2D([], [], linestyle="--", color=TEXT, label="formula"))
    ax.legend(handles=handles, frameon=False, labelcolor=TEXT, fontsize=8, loc="upper right")
    ax.set_title(title or "Model state per rank, measured", color=TEXT)
    fig.tight_layout()
    return fig


def plot_bucket_overlap(reports, *, title: str | None = None, unit: str = "ms", ax=None):
    """Backward and each gradient bucket's collective, per rank, on one time axis.

    reports: one `OverlapReport` (or a list, one per rank) -- e.g. `overlap_from_trace(tracer.events, ...)`. Each
    rank gets a row for backward (start to end) and one row per bucket (launch to completion); the part of the
    bucket bars right of the dashed line is communication that backward could not hide."""
    reports = reports if isinstance(reports, (list, tuple)) else [reports]
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    t0 = min(min([r.backward_start or r.backward_end] + [b.t_launch for b in r.buckets]) for r in reports)
    rows = sum(1 + len(r.buckets) for r in reports)
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 0.28 * rows + 1.4))
    else:
        fig = ax.figure
    _style(ax)
    y, ticks, labels = 0, [], []
    height = 0.75
    right = 0.0
    for rank, r in enumerate(reports):
        start = (r.backward_start if r.backward_start is not None else t0) - t0
        end = r.backward_end - t0
        ax.add_patch(
            Rectangle(
                (start * scale, -y - height / 2),
                (end - start) * scale,
                height,
                facecolor=BACKWARD,
                edgecolor="none",
                gid="backward",
            )
        )
        ticks.append(-y)
        labels.append(f"rank {rank} backward" if len(reports) > 1 else "backward")
        top = y
        y += 1
        for k, b in enumerate(r.buckets):
            a, z = (b.t_launch - t0) * scale, (b.t_done - t0) * scale
            ax.add_patch(
                Rectangle(
                    (a, -y - height / 2),
                    max(z - a, 1e-9),
                    height,
                    facecolor=BUCKETS[k % 2],
                    edgecolor="none",
                    gid="bucket",
                )
            )
            ticks.append(-y)
            labels.append(b.tag.split(".", 1)[-1])
            right = max(right, z)
            y += 1
        ax.plot([end * scale] * 2, [-top + 0.5, -y + 0.5], linestyle="--", color=TEXT, linewidth=1)
        right = max(right, end * scale)
    ax.set_xlim(0, right * 1.03 if right > 0 else 1)
    ax.set_ylim(-y + 0.4, 0.6)
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.set_xlabel(f"time since backward began ({unit})")
    hidden = sum(r.hidden_fraction for r in reports) / len(reports)
    ax.set_title(title or f"Gradient buckets during backward: {hidden:.0%} of communication hidden", color=TEXT)
    fig.tight_layout()
    return fig
