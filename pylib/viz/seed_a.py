"""Part I of the book (seed A): the layer's data flow, the token-locality test, and seed-number checks.

    flow = layer_flow(model.layers[0], x)            # the six stages, from the modules a real forward calls
    draw_layer_flow(flow, colours=None)              # the Pre-LN layer as a figure (traffic-light colours optional)
    split_check(fn, [x], seq_dims=[1])               # run fn on the whole sequence and on halves on 2 real ranks
    compare_printed(values, printed, decimals=3)     # is each printed number the value rounded, or a slip?
    draw_three_axes(holdings, ...)                   # which elements of [batch, seq, d] each rank holds
    primitive_names(ops)                             # traced op names -> seed A's names ("All-Reduce", "P2P")
    markdown_table(header, rows, caption=, name=)    # a labelled MyST table, printed by a cell

Shapes use the seeds' names: x [b, s, h]; q, k, v [b, n_head, s, d_head]. Torch stores nn.Linear weights as
[out, in]; seed A writes x @ W, i.e. W as [in, out]. `ModuleCall.weight_shape` is torch's [out, in].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal

import torch
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch, Rectangle

from . import style

# ------------------------------------------------------------------------------------------------ palette

# The names a chapter gives draw_layer_flow's boxes and draw_three_axes' ranks, in the book's palette: seed A's
# traffic lights (a stage that is token-local, needs care, is token-global), a neutral stage, ranks 0 .. 3.
COLOURS = {
    "green": style.GREEN,
    "yellow": style.AMBER,
    "red": style.RED,
    "neutral": style.tint(style.BLUE, 0.45),
    **{f"rank{r}": style.rank_colour(r) for r in range(4)},
}

# ------------------------------------------------------------------------------------------------ the layer flow

# Seed A numbers the Pre-LN layer ① .. ⑥; each stage is made of these submodules of a Block (in call order).
STAGE_TITLES = {
    1: "LayerNorm",
    2: "QKV projection",
    3: "attention",
    4: "output projection W_o, + residual",
    5: "LayerNorm",
    6: "MLP, + residual",
}
STAGE_OF_MODULE = {
    "ln1": 1,
    "attn.q_proj": 2,
    "attn.k_proj": 2,
    "attn.v_proj": 2,
    "attn.core": 3,
    "attn.o_proj": 4,
    "ln2": 5,
    "mlp.gate_proj": 6,
    "mlp.up_proj": 6,
    "mlp.down_proj": 6,
}
CIRCLED = {1: "①", 2: "②", 3: "③", 4: "④", 5: "⑤", 6: "⑥"}


@dataclass(frozen=True)
class ModuleCall:
    """One call a block's forward made: a leaf module, or the attention core (a method, not a module)."""

    name: str  # qualified name inside the block, e.g. "attn.q_proj"; "attn.core" for the attention core
    kind: str  # the module's class name, or "attention core"
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    weight_shape: tuple[int, ...] | None  # torch layout [out, in]; None when the module has no weight


@dataclass
class FlowStage:
    """One of seed A's six stages and the calls that make it."""

    number: int
    title: str
    calls: list[ModuleCall] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{CIRCLED[self.number]} {self.title}"

    @property
    def module_names(self) -> list[str]:
        return [c.name for c in self.calls]


def record_block_calls(block: torch.nn.Module, x: torch.Tensor) -> list[ModuleCall]:
    """Run `block(x)` once and return, in execution order, every leaf module it called and the attention core.

    Leaf modules are seen through forward hooks; the attention core, a method of the block's attention module,
    is wrapped for the duration of the call (the instance attribute shadows the method, and is removed after)."""
    calls: list[ModuleCall] = []
    handles = []

    def hook_for(name, module):
        w = getattr(module, "weight", None)
        weight_shape = tuple(w.shape) if isinstance(w, torch.Tensor) else None

        def hook(_mod, inputs, output):
            calls.append(
                ModuleCall(name, type(module).__name__, tuple(inputs[0].shape), tuple(output.shape), weight_shape)
            )

        return hook

    for name, module in block.named_modules():
        if name and not list(module.children()):
            handles.append(module.register_forward_hook(hook_for(name, module)))
    attn = getattr(block, "attn", None)
    original_core = getattr(attn, "core", None)
    if original_core is not None:

        def core(q, k, v, *args, **kwargs):
            out = original_core(q, k, v, *args, **kwargs)
            calls.append(ModuleCall("attn.core", "attention core", tuple(q.shape), tuple(out.shape), None))
            return out

        attn.core = core
    try:
        with torch.no_grad():
            block(x)
    finally:
        for h in handles:
            h.remove()
        if original_core is not None:
            del attn.core
    return calls


def layer_flow(block: torch.nn.Module, x: torch.Tensor) -> list[FlowStage]:
    """Seed A's six stages ① .. ⑥, each with the calls a real forward of `block` made for it.

    Raises ValueError if the block calls a module seed A's numbering does not know, or calls them out of order
    (a Post-LN block, say, would call ln1 after attention)."""
    stages = {n: FlowStage(n, STAGE_TITLES[n]) for n in STAGE_TITLES}
    last = 0
    for call in record_block_calls(block, x):
        if call.name not in STAGE_OF_MODULE:
            raise ValueError(f"{call.name} ({call.kind}) is not part of seed A's six stages")
        n = STAGE_OF_MODULE[call.name]
        if n < last:
            raise ValueError(f"{call.name} (stage {n}) was called after stage {last}: not a Pre-LN layer")
        last = n
        stages[n].calls.append(call)
    missing = [n for n, s in stages.items() if not s.calls]
    if missing:
        raise ValueError(f"stages {missing} were never called by the block's forward")
    return [stages[n] for n in sorted(stages)]


def _stage_detail(stage: FlowStage, mlp_kind: str | None = None) -> str:
    def lin(c):
        out_f, in_f = c.weight_shape
        return f"{c.name.split('.')[-1]} [{in_f}→{out_f}]"

    kinds = {c.kind for c in stage.calls}
    if kinds == {"LayerNorm"}:
        c = stage.calls[0]
        return f"{c.name}: γ, β [{c.weight_shape[0]}], per row"
    if stage.number == 3:
        c = stage.calls[0]
        s = c.in_shape[2]
        return f"softmax(Q Kᵀ/√d_head) V, scores [{s}×{s}] per head"
    parts = [lin(c) for c in stage.calls if c.weight_shape is not None]
    if stage.number == 6:
        act = (mlp_kind or "gelu").upper()
        ups = [p for p, c in zip(parts, stage.calls) if not c.name.endswith("down_proj")]
        downs = [p for p, c in zip(parts, stage.calls) if c.name.endswith("down_proj")]
        return " · ".join(ups) + f" → {act} → " + " · ".join(downs)
    return " · ".join(parts)


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
    # Top to bottom: the input, the stages, a (+) after each stage that ends in a residual add, the output.
    items = [("input", None)]
    for stage in stages:
        items.append(("stage", stage))
        if "residual" in stage.title:
            items.append(("add", stage))
    items.append(("output", None))
    step = {"input": 0.95, "stage": 0.95, "add": 0.75, "output": 0.95}
    ys, y = [], 0.0
    for kind, _ in items:
        y -= step[kind]
        ys.append(y)
    top, bottom = 0.0, ys[-1] - 0.6 - (0.6 if legend else 0.0)
    fig, ax = style.subplots(figsize=(8.2, 0.85 * (top - bottom)), grid=False)
    ax.set_axis_off()
    ax.set_xlim(0, 9.6)
    ax.set_ylim(bottom, top)
    xm, xr, half = 3.7, 7.7, 0.3  # the main line, the residual line, half a box's height

    def box(yc, text, fill, sub=None):
        ax.add_patch(
            FancyBboxPatch(
                (0.5, yc - half),
                6.4,
                2 * half,
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

    def arrow(p0, p1):
        ax.add_patch(
            FancyArrowPatch(
                p0, p1, arrowstyle="-|>", mutation_scale=10, color=style.MUTED, linewidth=1.2, shrinkA=0, shrinkB=0
            )
        )

    first, last = stages[0].calls[0], stages[-1].calls[-1]
    branch = None
    prev_bottom = None
    for (kind, stage), yc in zip(items, ys):
        if kind == "add":
            r = 0.17
            arrow((xm, prev_bottom), (xm, yc + r))
            ax.add_patch(Circle((xm, yc), r, facecolor="none", edgecolor=style.MUTED, linewidth=1.2))
            ax.text(xm, yc, "+", ha="center", va="center", fontsize=11)
            ax.plot([xm, xr, xr], [branch, branch, yc], color=style.MUTED, linewidth=1.2)
            arrow((xr, yc), (xm + r, yc))
            ax.text(
                xr + 0.12,
                (branch + yc) / 2,
                "residual",
                rotation=90,
                ha="left",
                va="center",
                fontsize=9,
            )
            branch = yc - 0.4  # the next residual path leaves the main line just below this (+)
            prev_bottom = yc - r
            continue
        if prev_bottom is not None:
            arrow((xm, prev_bottom), (xm, yc + half))
        if kind == "input":
            box(yc, f"layer input x {list(first.in_shape)}   [b, s, h]", "none")
            branch = yc - half - 0.3
        elif kind == "output":
            box(yc, f"layer output {list(last.in_shape[:-1]) + [last.out_shape[-1]]}   → the next layer", "none")
        else:
            box(yc, stage.label, COLOURS[colours.get(stage.number, "neutral")], _stage_detail(stage, mlp_kind))
        prev_bottom = yc - half
    if legend:
        x, yl = 0.5, ys[-1] - 0.95
        for key, text in legend.items():
            ax.add_patch(Rectangle((x, yl - 0.15), 0.35, 0.3, facecolor=COLOURS[key], edgecolor=style.MUTED))
            ax.text(x + 0.45, yl, text, ha="left", va="center", fontsize=9)
            x += 0.75 + 0.092 * len(text)
    if title:
        ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------------ token locality


@dataclass
class SplitCheck:
    """A module run on the whole sequence and on `world_size` pieces of it, one piece per real rank."""

    full: torch.Tensor  # fn on the whole sequence
    pieces: torch.Tensor  # the ranks' outputs concatenated along the sequence
    local_in_shapes: list[list[tuple[int, ...]]]  # per rank, the shape of each input it held
    local_out_shapes: list[tuple[int, ...]]
    comm_events: int  # ops the ranks issued through pylib.runtime.collectives while running fn (summed over ranks)
    atol: float

    @property
    def max_abs_err(self) -> float:
        return (self.full - self.pieces).abs().max().item()

    @property
    def matches(self) -> bool:
        return self.max_abs_err <= self.atol

    @property
    def mark(self) -> str:
        return "✅" if self.matches else "❌"


def _split_worker(fn, inputs, seq_dims, out_dim):
    import torch.distributed as dist

    from pylib.runtime import trace

    rank, world = dist.get_rank(), dist.get_world_size()
    mine = [t.chunk(world, dim=d)[rank].contiguous() for t, d in zip(inputs, seq_dims)]
    with trace() as tr, torch.no_grad():
        out = fn(*mine)
    return out, [tuple(t.shape) for t in mine], len(tr.events)


def split_check(
    fn,
    inputs,
    seq_dims,
    world_size: int = 2,
    out_dim: int | None = None,
    atol: float = 1e-5,
    reference: torch.Tensor | None = None,
    **launch_kwargs,
) -> SplitCheck:
    """Is `fn` token-local? Run `fn(*inputs)` here on the whole sequence, then on `world_size` real ranks, each
    holding its contiguous piece of every input along that input's sequence dim (`seq_dims`), and compare.

    out_dim: the output's sequence dim (default seq_dims[0]). The pieces match the whole when every output row
    depends on its own token only (token-local) -- or, for a token-global module, never.
    reference: the whole-sequence result to compare with, for an `fn` that communicates (and so cannot run
    here, outside a rank); default fn(*inputs).
    The ranks use gloo unless `backend=` says otherwise: the inputs are CPU tensors, on a GPU node too."""
    from pylib.runtime import launch

    out_dim = seq_dims[0] if out_dim is None else out_dim
    for t, d in zip(inputs, seq_dims):
        if t.shape[d] % world_size:
            raise ValueError(
                f"world_size={world_size} does not divide the sequence length {t.shape[d]} "
                f"(dim {d} of an input of shape {tuple(t.shape)})"
            )
    if reference is None:
        with torch.no_grad():
            full = fn(*inputs)
    else:
        full = reference
    launch_kwargs.setdefault("backend", "gloo")
    results = launch(_split_worker, world_size, fn, list(inputs), list(seq_dims), out_dim, **launch_kwargs)
    pieces = torch.cat([r[0] for r in results], dim=out_dim)
    return SplitCheck(
        full.detach(),
        pieces,
        [r[1] for r in results],
        [tuple(r[0].shape) for r in results],
        sum(r[2] for r in results),
        atol,
    )


# ------------------------------------------------------------------------------------------------ printed numbers


def round_half_up(value: float, decimals: int) -> float:
    """Round as people do by hand: halves away from zero (Python's round() sends halves to the even digit)."""
    q = Decimal(1).scaleb(-decimals)
    return float(Decimal(repr(float(value))).quantize(q, rounding=ROUND_HALF_UP))


@dataclass(frozen=True)
class PrintedCheck:
    """One number printed in a source, against the value it stands for."""

    index: tuple[int, ...]
    printed: float
    value: float
    status: str  # "exact": printed is the value rounded; "slip": printed is the value rounded twice
    #              (first to decimals + 1, then to decimals); "mismatch": neither


def compare_printed(values, printed, decimals: int = 3) -> list[PrintedCheck]:
    """Classify every printed number against the computed value in the same position.

    values: a tensor (or nested lists); printed: nested lists of the same shape, as the source prints them.
    A "slip" is the familiar double rounding: 0.90747 printed to four places is 0.9075, and rounding that
    half-up to three gives 0.908, where the value itself rounds to 0.907."""
    v = torch.as_tensor(values, dtype=torch.float64)
    p = torch.as_tensor(printed, dtype=torch.float64)
    if v.shape != p.shape:
        raise ValueError(f"computed values have shape {tuple(v.shape)}, the printed numbers {tuple(p.shape)}")
    checks = []
    for idx in torch.cartesian_prod(*[torch.arange(n) for n in v.shape]).reshape(-1, v.dim()).tolist():
        value, shown = v[tuple(idx)].item(), round(p[tuple(idx)].item(), decimals)
        once = round_half_up(value, decimals)
        twice = round_half_up(round_half_up(value, decimals + 1), decimals)
        status = "exact" if once == shown else "slip" if twice == shown else "mismatch"
        checks.append(PrintedCheck(tuple(idx), shown, value, status))
    return checks


# ------------------------------------------------------------------------------------------------ three axes


@style.styled
def draw_three_axes(
    holdings: dict[str, list[torch.Tensor]], shape: tuple[int, int, int], token_names: list[list[str]] | None = None
):
    """One panel per parallelism: the [batch, seq, d] activation as batch rows of seq tokens of d features,
    each element coloured by the rank that holds it.

    holdings: title -> per rank, the flat indices (into a [b, s, d] tensor) of the elements that rank holds.
    Returns the Figure; raises ValueError if an element is held by no rank or by two."""
    b, s, d = shape
    panels = list(holdings.items())
    figsize = (8.2, (1.9 if token_names else 1.35) * len(panels) * b / 2 + 0.5)
    fig, axes = style.subplots(len(panels), 1, figsize=figsize, squeeze=False, grid=False)
    for ax, (title, per_rank) in zip(axes[:, 0], panels):
        owner = torch.full((b * s * d,), -1, dtype=torch.long)
        for r, idx in enumerate(per_rank):
            if (owner[idx] >= 0).any():
                raise ValueError(f"{title}: an element is held by two ranks")
            owner[idx] = r
        if (owner < 0).any():
            raise ValueError(f"{title}: {(owner < 0).sum().item()} elements are held by no rank")
        owner = owner.view(b, s, d)
        ax.set_axis_off()
        gap, pitch = 0.5, 1.5 if token_names else 1.0  # a sentence row: d squares per token, the words under them
        for i in range(b):
            y0 = (b - 1 - i) * pitch + (pitch - 1.0)
            for t in range(s):
                x0 = t * (d + gap)
                for f in range(d):
                    colour = COLOURS[f"rank{owner[i, t, f].item() % 4}"]
                    ax.add_patch(Rectangle((x0 + f, y0), 0.92, 0.85, facecolor=colour, edgecolor="none"))
                if token_names:
                    ax.text(x0 + d / 2, y0 - 0.08, token_names[i][t], ha="center", va="top", fontsize=9)
        ax.set_xlim(-0.2, s * (d + gap))
        ax.set_ylim(-0.15, b * pitch)
        ax.set_title(title, fontsize=10, loc="left")
    handles = [Rectangle((0, 0), 1, 1, facecolor=COLOURS[f"rank{r}"]) for r in range(len(panels[0][1]))]
    fig.legend(
        handles,
        [f"rank {r}" for r in range(len(handles))],
        loc="lower center",
        ncol=len(handles),
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


# ------------------------------------------------------------------------------------------------ primitives

# The tracer's op names, and the names seed A gives the primitives (a send and its receive are one P2P transfer).
PRIMITIVE_NAMES = {
    "all_reduce": "All-Reduce",
    "all_gather": "All-Gather",
    "reduce_scatter": "Reduce-Scatter",
    "all_to_all": "All-to-All",
    "send": "P2P",
    "recv": "P2P",
}


def primitive_names(ops) -> list[str]:
    """Seed A's names for a collection of traced op names (`CommEvent.op`), each once, in a fixed order.

    >>> primitive_names(["recv", "send", "send"])
    ['P2P']
    >>> primitive_names(["reduce_scatter", "all_gather"])
    ['All-Gather', 'Reduce-Scatter']
    """
    ops = set(ops)
    unknown = sorted(ops - PRIMITIVE_NAMES.keys())
    if unknown:
        raise ValueError(f"no seed A name for traced ops {unknown}; known: {sorted(PRIMITIVE_NAMES)}")
    return list(dict.fromkeys(PRIMITIVE_NAMES[op] for op in PRIMITIVE_NAMES if op in ops))


# ------------------------------------------------------------------------------------------------ tables


def markdown_table(header: list[str], rows: list[list], caption: str, name: str, align: str = "center") -> str:
    """A MyST `{table}` with a caption and a label, for a cell whose Markdown output is rendered as MyST."""

    def cell(v):
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = [f":::{{table}} {caption}", f":name: {name}", f":align: {align}", ""]
    lines.append("| " + " | ".join(cell(h) for h in header) + " |")
    lines.append("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a row has {len(row)} cells, the header {len(header)}: {row}")
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    lines.append(":::")
    return "\n".join(lines)


def format_rows(matrix, row_labels: list[str], col_labels: list[str] | None = None, decimals: int = 3) -> str:
    """A matrix printed the way seed A prints its numbers: one labelled row per token, fixed decimals.

    >>> print(format_rows([[0.5, -1.25]], ["cat"], ["d1", "d2"], decimals=2))
            d1     d2
    cat [ 0.50, -1.25]
    """
    m = torch.as_tensor(matrix, dtype=torch.float64)
    if m.dim() == 1:
        m = m[None]
    if m.dim() != 2 or m.shape[0] != len(row_labels):
        raise ValueError(f"need a [rows, cols] matrix with {len(row_labels)} rows, got shape {tuple(m.shape)}")
    cells = [[f"{v:.{decimals}f}" for v in row] for row in m.tolist()]
    width = max(len(c) for row in cells for c in row)
    pad = max(len(r) for r in row_labels)
    lines = []
    if col_labels is not None:
        lines.append(" " * (pad + 2) + "  ".join(c.rjust(width) for c in col_labels))
    for label, row in zip(row_labels, cells):
        lines.append(f"{label.ljust(pad)} [" + ", ".join(c.rjust(width) for c in row) + "]")
    return "\n".join(lines)
