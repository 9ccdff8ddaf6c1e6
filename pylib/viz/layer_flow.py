"""Article A's Pre-LN layer drawn as its six stages, from the calls a real forward made
(`pylib.seedcheck.layer_flow.layer_flow`), in article A's traffic-light colours when a chapter gives them.

    draw_layer_flow(layer_flow(model.layers[0], x), colours={3: "red"})   # a stage that is token-global
"""

from __future__ import annotations

from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch, Rectangle

from pylib import i18n
from pylib.seedcheck.layer_flow import FlowStage

from . import style

# The names a chapter gives draw_layer_flow's boxes and draw_three_axes' ranks, in the book's palette: article A's
# traffic lights (a stage that is token-local, needs care, is token-global), a neutral stage, ranks 0 .. 3.
COLOURS = {
    "green": style.GREEN,
    "yellow": style.AMBER,
    "red": style.RED,
    "neutral": style.tint(style.BLUE, 0.45),
    **{f"rank{r}": style.rank_colour(r) for r in range(4)},
}


def _stage_detail(stage: FlowStage, mlp_kind: str | None = None) -> str:
    def lin(c):
        out_f, in_f = c.weight_shape
        return f"{c.name.split('.')[-1]} [{in_f}→{out_f}]"

    kinds = {c.kind for c in stage.calls}
    if kinds == {"LayerNorm"}:
        c = stage.calls[0]
        return i18n.tr("{name}: γ, β [{n}], per row", name=c.name, n=c.weight_shape[0])
    if stage.number == 3:
        c = stage.calls[0]
        s = c.in_shape[2]
        return i18n.tr("softmax(Q Kᵀ/√d_head) V, scores [{s}×{s}] per head", s=s)
    parts = [lin(c) for c in stage.calls if c.weight_shape is not None]
    if stage.number == 6:
        act = (mlp_kind or "gelu").upper()
        ups = [p for p, c in zip(parts, stage.calls) if not c.name.endswith("down_proj")]
        downs = [p for p, c in zip(parts, stage.calls) if c.name.endswith("down_proj")]
        return " · ".join(ups) + f" → {act} → " + " · ".join(downs)
    return " · ".join(parts)


# The figure's geometry: the main line, the residual line, half a box's height; the vertical step per item.
XM, XR, HALF = 3.7, 7.7, 0.3
STEP = {"input": 0.95, "stage": 0.95, "add": 0.75, "output": 0.95}


def _items(stages: list[FlowStage]) -> list[tuple[str, FlowStage | None]]:
    """Top to bottom: the input, the stages, a (+) after each stage that ends in a residual add, the output."""
    items = [("input", None)]
    for stage in stages:
        items.append(("stage", stage))
        if "residual" in stage.title:
            items.append(("add", stage))
    items.append(("output", None))
    return items


def _box(ax, yc, text, fill, sub=None):
    ax.add_patch(
        FancyBboxPatch(
            (0.5, yc - HALF),
            6.4,
            2 * HALF,
            boxstyle="round,pad=0.02,rounding_size=0.12",
            facecolor=fill,
            edgecolor=style.MUTED,
            linewidth=1.0,
        )
    )
    ink = style.TEXT if fill == "none" else style.ink_on(fill)
    ax.text(0.7, yc + (0.1 if sub else 0.0), text, ha="left", va="center", fontsize=10.5, color=ink, weight="bold")
    if sub:
        ax.text(0.7, yc - 0.15, sub, ha="left", va="center", fontsize=8.5, color=ink)


def _arrow(ax, p0, p1):
    ax.add_patch(
        FancyArrowPatch(
            p0, p1, arrowstyle="-|>", mutation_scale=10, color=style.MUTED, linewidth=1.2, shrinkA=0, shrinkB=0
        )
    )


def _residual_add(ax, yc, prev_bottom, branch, r=0.17):
    """The (+) on the main line at height yc, fed by the residual path that left the main line at `branch`."""
    _arrow(ax, (XM, prev_bottom), (XM, yc + r))
    ax.add_patch(Circle((XM, yc), r, facecolor="none", edgecolor=style.MUTED, linewidth=1.2))
    ax.text(XM, yc, "+", ha="center", va="center", fontsize=11)
    ax.plot([XM, XR, XR], [branch, branch, yc], color=style.MUTED, linewidth=1.2)
    _arrow(ax, (XR, yc), (XM + r, yc))
    ax.text(XR + 0.12, (branch + yc) / 2, i18n.tr("residual"), rotation=90, ha="left", va="center", fontsize=9)


def _legend(ax, yl, legend: dict[str, str]):
    x = 0.5
    for key, text in legend.items():
        ax.add_patch(Rectangle((x, yl - 0.15), 0.35, 0.3, facecolor=COLOURS[key], edgecolor=style.MUTED))
        ax.text(x + 0.45, yl, text, ha="left", va="center", fontsize=9)
        x += 0.75 + 0.092 * len(text)


@style.styled
def draw_layer_flow(
    stages: list[FlowStage],
    colours: dict[int, str] | None = None,
    mlp_kind: str = "gelu",
    legend: dict[str, str] | None = None,
    title: str | None = None,
):
    """The Pre-LN layer as boxes ① .. ⑥ with its two residual paths, one box per stage of `stages`.

    colours: stage number -> a key of COLOURS ("green", "yellow", "red"); default all "neutral".
    legend: colour key -> text, drawn under the flow. Returns the matplotlib Figure."""
    colours = colours or {}
    items = _items(stages)
    ys, y = [], 0.0
    for kind, _ in items:
        y -= STEP[kind]
        ys.append(y)
    top, bottom = 0.0, ys[-1] - 0.6 - (0.6 if legend else 0.0)
    fig, ax = style.subplots(figsize=(8.2, 0.85 * (top - bottom)), grid=False)
    ax.set_axis_off()
    ax.set_xlim(0, 9.6)
    ax.set_ylim(bottom, top)
    first, last = stages[0].calls[0], stages[-1].calls[-1]
    branch = prev_bottom = None
    for (kind, stage), yc in zip(items, ys):
        if kind == "add":
            _residual_add(ax, yc, prev_bottom, branch)
            branch = yc - 0.4  # the next residual path leaves the main line just below this (+)
            prev_bottom = yc - 0.17
            continue
        if prev_bottom is not None:
            _arrow(ax, (XM, prev_bottom), (XM, yc + HALF))
        if kind == "input":
            _box(ax, yc, i18n.tr("layer input x {shape}   [b, s, h]", shape=list(first.in_shape)), "none")
            branch = yc - HALF - 0.3
        elif kind == "output":
            _box(
                ax,
                yc,
                i18n.tr(
                    "layer output {shape}   → the next layer", shape=list(last.in_shape[:-1]) + [last.out_shape[-1]]
                ),
                "none",
            )
        else:
            _box(ax, yc, stage.label, COLOURS[colours.get(stage.number, "neutral")], _stage_detail(stage, mlp_kind))
        prev_bottom = yc - HALF
    if legend:
        _legend(ax, ys[-1] - 0.95, legend)
    if title:
        ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return fig
