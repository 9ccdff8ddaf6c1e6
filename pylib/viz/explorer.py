"""An ipywidgets explorer of article B's matrix view: pick a model (presets, or sliders for every size) and the TP /
CP / DP / PP / EP sizes, see the per-rank shape of every weight and activation, the memory and the traffic.

    ex = Explorer()               # Llama-2-70B on TP 8 x PP 4 x DP 4 by default
    ex.widget                     # display it: every control, and the tables in tabs (needs a running kernel)
    print(ex.text())              # the same tables as plain text (for a page read without JavaScript)
    static_explorer()             # the same controls as a plain HTML form computed in the page: needs no kernel

Every number comes from `pylib.analysis.shapes` (tests/test_analysis_shapes.py checks it against the real sharded
modules and the tracer). On a static page no kernel answers the widgets, so `static_explorer` is a plain HTML form
with every control of the live explorer whose states `pylib.viz.live` computes in the page itself: this module's
`live_state_html`, run by Pyodide (ipywidgets is imported only by the widget explorer, so the rest of this module
runs there). The live explorer's container carries the CSS class `pb-needs-kernel`: the site disables its controls
until a kernel runs.
"""

from __future__ import annotations

import html

from pylib.analysis import shapes
from pylib.analysis.weights import TensorShape
from pylib.i18n import N_, shown, tr
from pylib.plan import ZERO_STAGE_NAMES, ParallelConfig, RunOptions, zero_stage
from pylib.plan.config import ModelConfig, MoEConfig
from pylib.plan.options import DTYPE_BYTES
from pylib.plan.presets import deepseek_v3_like, gpt_style_70b, llama2_70b, mixtral_8x7b, probe_moe_config
from pylib.tables import fmt_bytes, fmt_shape, text_table

PRESETS: dict[str, tuple[ModelConfig, dict]] = {
    "Llama-2-70B (GQA, SwiGLU)": (llama2_70b(), dict(tp=8, pp=4, dp=4, b=4, s=4096, sp=True, m=8)),
    "GPT-style 70B (MHA, GELU, 4h)": (gpt_style_70b(), dict(tp=8, pp=4, dp=4, b=4, s=4096, sp=True, m=8)),
    "Mixtral-8x7B-class MoE": (
        mixtral_8x7b(),
        dict(tp=2, pp=4, dp=8, ep=8, b=8, s=4096, sp=True, m=8),
    ),
    "DeepSeek-V3-class MoE": (deepseek_v3_like(), dict(dp=64, ep=64, b=64, s=4096, m=1)),
    "this chapter's probe model": (probe_moe_config(), dict(tp=2, dp=2, ep=2, b=4, s=16, sp=True, m=1)),
}
DEFAULT = "Llama-2-70B (GQA, SwiGLU)"
POWERS = [1, 2, 4, 8, 16, 32, 64, 128]
DTYPES = list(DTYPE_BYTES)  # the dtype names a config takes (pylib.plan.options)
ZERO = list(ZERO_STAGE_NAMES)  # the one ZeRO vocabulary (pylib.plan.options)


def _seed_shape(t: TensorShape, local: bool = True) -> str:
    return fmt_shape(t.seed_b if local else t.seed_b_full)


def _split(t: TensorShape) -> str:
    """Which axis cuts which dimension, by name: "tp: out/8" for a linear weight's output features (torch dim 0),
    "dp: b/4, tp: s/8" for an activation, "ep: E/8" for the experts."""
    syms = [x.strip() for x in t.symbol.strip("[]").split(",")]
    names = ["out", "in"] if t.linear else syms
    parts = []
    for axis, dim, n in t.splits:
        name = "E" if dim == -1 else names[dim] if dim < len(names) else f"dim {dim}"
        parts.append(f"{axis}: {name}/{n}")
    return ", ".join(parts) or "—"


# The tensors' names (shapes.summary's keys) as the tables show them; a name without words stays as it is.
_NAMES = frozenset(
    {
        N_("token embedding"),
        N_("final LayerNorm γ, β"),
        N_("router"),
        N_("expert W_gate"),
        N_("expert W_up"),
        N_("expert W_down"),
        N_("input hidden"),
        N_("attention scores"),
        N_("attention output"),
        N_("FFN intermediate"),
        N_("block output"),
        N_("router logits"),
        N_("expert input"),
        N_("expert intermediate"),
    }
)


def _name(name: str) -> str:
    return shown(_NAMES, name)


def tables(summary: shapes.Summary) -> dict[str, tuple[list[str], list[list[str]]]]:
    """The explorer's four tables as (header, rows) of strings, in the reader's language."""
    w_rows = [
        [_name(w.name), w.symbol, _seed_shape(w, False), _seed_shape(w), _split(w), str(w.count)]
        + [fmt_bytes(w.held_bytes)]
        for w in summary.weights
    ]
    a_rows = [
        [
            tr("{name} (expected)", name=_name(a.name)) if a.expected else _name(a.name),
            a.symbol,
            fmt_shape(a.full),
            fmt_shape(a.local),
            _split(a),
            fmt_bytes(a.local_bytes),
            a.note,
        ]
        for a in summary.activations
    ]
    m = summary.memory
    mem_rows = [
        [tr("parameters"), fmt_bytes(m["params"])],
        [tr("gradients"), fmt_bytes(m["grads"])],
        [tr("optimizer state (Adam: 2 moments)"), fmt_bytes(m["optim"])],
        [tr("activations saved for backward, at the 1F1B schedule's peak"), fmt_bytes(m["activations"])],
        *(
            [[tr("ZeRO-3: gathered parameters (running + prefetched)"), fmt_bytes(m["gathered"])]]
            if m["gathered"]
            else []
        ),
        [tr("total"), fmt_bytes(m["total"])],
    ]
    t_rows = [[t.mode, t.op, t.when, str(t.count), fmt_bytes(t.message), fmt_bytes(t.sent)] for t in summary.traffic]
    return {
        tr("weights (article B's [in, out]; per rank)"): (
            [tr("weight"), tr("article B"), tr("full"), tr("this rank"), tr("split by"), tr("count here")]
            + [tr("bytes here")],
            w_rows,
        ),
        tr("activations of one layer, one micro-batch (per rank)"): (
            [tr("activation"), tr("article B"), tr("full"), tr("this rank"), tr("split by"), tr("bytes"), tr("note")],
            a_rows,
        ),
        tr("memory of this rank"): ([tr("what"), tr("bytes")], mem_rows),
        tr("traffic of this rank, one step"): (
            [tr("mode"), tr("op"), tr("when"), tr("ops"), tr("message"), tr("sent")],
            t_rows,
        ),
    }


def _describe(cfg: ModelConfig, par: ParallelConfig, b: int, s: int, **kw) -> str:
    moe = f", MoE E={cfg.moe.n_experts} top-{cfg.moe.top_k}" if cfg.moe else ""
    return (
        f"h={cfg.d_model}, L={cfg.n_layers}, n_head={cfg.n_heads}, n_kv_head={cfg.kv_heads}, "
        f"h_ffn={cfg.d_ff}, V={cfg.vocab_size}{moe}, {cfg.dtype}; b={b}, s={s}; {par.describe()}"
        f"{' + SP' if kw['options'].sequence_parallel else ''}; "
    ) + tr("pipeline rank {r}", r=kw.get("pp_rank", 0))


def tab_titles() -> list[str]:
    """One tab per table of `tables`, in the reader's language."""
    return [tr("weights"), tr("activations"), tr("memory"), tr("traffic")]


TAB_TITLES = ["weights", "activations", "memory", "traffic"]  # one tab per table of `tables` (English)
_CSS = (
    "<style>.pb-x{overflow-x:auto;max-width:100%}.pb-x table{border-collapse:collapse;font-size:0.85em}"
    ".pb-x td,.pb-x th{padding:1px 6px;text-align:left;border-bottom:1px solid #ddd}</style>"
)


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    """A compact HTML table of escaped strings (the page saves every static state: no per-cell styles)."""
    th = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<div class='pb-x'><table><tr>{th}</tr>{body}</table></div>"


def render_tabs(summary: shapes.Summary) -> list[str]:
    """The four tables as HTML strings, one per tab (TAB_TITLES); a plan that does not fit: the reasons, in each."""
    if summary.problems:
        items = "".join(f"<li>{html.escape(p)}</li>" for p in summary.problems)
        head = html.escape(tr("This plan does not fit the model:"))
        return [f"<div><b>{head}</b><ul>{items}</ul></div>"] * len(TAB_TITLES)
    return [
        f"{_CSS if i == 0 else ''}<p><b>{html.escape(name)}</b></p>{_html_table(head, rows)}"
        for i, (name, (head, rows)) in enumerate(tables(summary).items())
    ]


def render_html(summary: shapes.Summary, title: str = "") -> str:
    """Everything on one page: the title and the four tables (what the tabs show, one after another)."""
    if summary.problems:
        return render_tabs(summary)[0]
    head = f"<p><b>{html.escape(title)}</b></p>" if title else ""
    return head + _CSS + "".join(t.replace(_CSS, "") for t in render_tabs(summary))


def render_text(summary: shapes.Summary, title: str = "") -> str:
    if summary.problems:
        return tr("This plan does not fit the model:") + "\n  " + "\n  ".join(summary.problems)
    out = [title] if title else []
    for name, (head, rows) in tables(summary).items():
        out.append(f"\n{name}")
        out += text_table(head, rows)
    return "\n".join(out)


# The explorer's controls, by name: the model's sizes, then the plan.
CONTROLS = (
    "h", "layers", "heads", "kv_heads", "h_ffn", "vocab", "experts", "top_k", "expert_ffn",
    "b", "s", "dtype", "tp", "cp", "dp", "pp", "ep", "etp", "sp", "cp_kind", "zero", "m", "stage",
)  # fmt: skip


def preset_controls(preset: str) -> dict:
    """Every control's value for a preset: its model's sizes and its plan (the others at their defaults)."""
    cfg, plan = PRESETS[preset]
    return dict(
        h=cfg.d_model, layers=cfg.n_layers, heads=cfg.n_heads, kv_heads=cfg.kv_heads, h_ffn=cfg.d_ff,
        vocab=cfg.vocab_size, experts=cfg.moe.n_experts if cfg.moe else 0, top_k=cfg.moe.top_k if cfg.moe else 1,
        expert_ffn=(cfg.moe.d_ff or cfg.d_ff) if cfg.moe else cfg.d_ff, b=plan["b"], s=plan["s"], dtype=cfg.dtype,
        **{a: plan.get(a, 1) for a in ("tp", "cp", "dp", "pp", "ep", "etp")},
        sp=plan.get("sp", False), cp_kind="ring", zero="ddp", m=plan.get("m", 1), stage="first",
    )  # fmt: skip


def plan_state(base: ModelConfig, c: dict) -> tuple[ModelConfig, ParallelConfig, int, int, dict]:
    """The model, the plan, b, s and the keyword arguments of `shapes.summary` for control values `c` on top of the
    preset model `base` (which supplies what no control sets: MLP kind, router scoring, MoE spacing). Raises
    ValueError for a model or a plan that cannot be built."""
    moe = None
    if c["experts"]:
        old = base.moe or MoEConfig()
        moe = MoEConfig(
            n_experts=c["experts"], top_k=min(c["top_k"], c["experts"]), d_ff=c["expert_ffn"], score=old.score,
            every=old.every,
        )  # fmt: skip
    cfg = base.with_(
        d_model=c["h"], n_layers=c["layers"], n_heads=c["heads"], n_kv_heads=c["kv_heads"], d_ff=c["h_ffn"],
        vocab_size=c["vocab"], dtype=c["dtype"], moe=moe,
    )  # fmt: skip
    par = ParallelConfig(**{a: c[a] for a in ("tp", "cp", "dp", "pp", "ep", "etp")})
    options = RunOptions(
        sequence_parallel=c["sp"], cp_kind=c["cp_kind"], n_microbatches=c["m"], zero_stage=zero_stage(c["zero"])
    )
    kw = dict(options=options, pp_rank=0 if c["stage"] == "first" else par.pp - 1)
    return cfg, par, c["b"], c["s"], kw


def _summary(base: ModelConfig, c: dict) -> shapes.Summary:
    try:
        cfg, par, b, s, kw = plan_state(base, c)
    except ValueError as err:  # a config or a plan that cannot even be built
        return shapes.Summary([], [], {}, [], [str(err)])
    return shapes.summary(cfg, par, b, s, **kw)


def _title(base: ModelConfig, c: dict) -> str:
    try:
        cfg, par, b, s, kw = plan_state(base, c)
    except ValueError:
        return ""
    return _describe(cfg, par, b, s, **kw)


def render_state(base: ModelConfig, c: dict) -> tuple[str, list[str]]:
    """(heading HTML, the four tables' HTML) for control values `c`: what the explorer shows."""
    title = _title(base, c)
    return (f"<p><b>{html.escape(title)}</b></p>" if title else ""), render_tabs(_summary(base, c))


def render_details(heading: str, tabs: list[str]) -> str:
    """One precomputed state as a single HTML block: the heading, then each table in a <details> element (the
    first one open), which a browser opens and closes without a kernel or any script."""
    parts = [heading]
    for i, (name, tab) in enumerate(zip(tab_titles(), tabs)):
        parts.append(f"<details{' open' if i == 0 else ''}><summary>{name}</summary>{tab}</details>")
    return "".join(parts)


class Explorer:
    """Controls for the model and the plan, and an HTML widget with the tables, recomputed on every change."""

    def __init__(self, preset: str = DEFAULT):
        import ipywidgets as widgets

        cfg, plan = PRESETS[preset]
        slider = dict(continuous_update=False, style={"description_width": "initial"})
        self.preset = widgets.Dropdown(
            options=[(preset_label(p), p) for p in PRESETS], value=preset, description=tr("model")
        )
        self.h = widgets.IntSlider(min=16, max=16384, step=16, description="h", **slider)
        self.layers = widgets.IntSlider(min=1, max=128, description=tr("layers L"), **slider)
        self.heads = widgets.IntSlider(min=1, max=128, description=tr("heads"), **slider)
        self.kv_heads = widgets.IntSlider(min=1, max=128, description=tr("kv heads"), **slider)
        self.h_ffn = widgets.IntSlider(min=16, max=65536, step=16, description="h_ffn", **slider)
        self.vocab = widgets.IntSlider(min=16, max=262144, step=16, description="V", **slider)
        self.experts = widgets.IntSlider(min=0, max=256, description=tr("experts E (0: dense)"), **slider)
        self.top_k = widgets.IntSlider(min=1, max=16, description="top-k", **slider)
        self.expert_ffn = widgets.IntSlider(min=16, max=65536, step=16, description=tr("expert h_ffn"), **slider)
        self.b = widgets.IntSlider(min=1, max=1024, description=tr("b (across DP)"), **slider)
        self.s = widgets.SelectionSlider(options=[2**i for i in range(4, 18)], description="s", **slider)
        self.dtype = widgets.Dropdown(options=DTYPES, description="dtype")
        self.axes = {
            a: widgets.SelectionSlider(options=POWERS, value=1, description=a.upper(), **slider)
            for a in ("tp", "cp", "dp", "pp", "ep", "etp")
        }
        self.sp = widgets.Checkbox(description=tr("sequence parallel (with TP)"))
        self.cp_kind = widgets.ToggleButtons(options=["ring", "ulysses"], description="CP")
        self.zero = widgets.Dropdown(options=ZERO, description=tr("DP state"))
        self.m = widgets.IntSlider(min=1, max=64, description=tr("micro-batches"), **slider)
        self.stage = widgets.ToggleButtons(
            options=[(tr("first"), "first"), (tr("last"), "last")], description=tr("pipeline stage")
        )
        self.heading = widgets.HTML()
        self.panes = [widgets.HTML() for _ in TAB_TITLES]
        self.tabs = _tabs(self.panes)
        self._loading = False
        self._base = cfg
        self.load(preset)
        model = [self.h, self.layers, self.heads, self.kv_heads, self.h_ffn, self.vocab, self.experts, self.top_k]
        model.append(self.expert_ffn)
        plan = [self.b, self.s, self.dtype, *self.axes.values(), self.sp, self.cp_kind, self.zero, self.m, self.stage]
        for c in model + plan:
            c.observe(lambda _change: self.update(), names="value")
        self.preset.observe(lambda change: self.load(change["new"]), names="value")
        columns = widgets.HBox([widgets.VBox(model), widgets.VBox(plan)])
        self.widget = widgets.VBox([self.preset, columns, self.heading, self.tabs])
        self.widget.add_class("pb-needs-kernel")  # the site disables these controls until a kernel runs

    def controls(self) -> dict:
        """The value of every control, by `Explorer.set`'s names."""
        return {name: (self.axes[name] if name in self.axes else getattr(self, name)).value for name in CONTROLS}

    def load(self, preset: str) -> None:
        """Set every control from a preset (`preset_controls`), then recompute once."""
        self._base = PRESETS[preset][0]
        self._loading = True
        try:
            for name, value in preset_controls(preset).items():
                (self.axes[name] if name in self.axes else getattr(self, name)).value = value
        finally:
            self._loading = False
        self.update()

    def state(self) -> tuple[ModelConfig, ParallelConfig, int, int, dict]:
        """The model, the plan, b, s and the keyword arguments of `shapes.summary`, from the controls."""
        return plan_state(self._base, self.controls())

    def summary(self) -> shapes.Summary:
        return _summary(self._base, self.controls())

    def title(self) -> str:
        return _title(self._base, self.controls())

    def set(self, **controls) -> Explorer:
        """Set controls by name (tp, cp, dp, pp, ep, etp, sp, b, s, m, cp_kind, zero, stage, dtype, h, layers,
        heads, kv_heads, h_ffn, vocab, experts, top_k, expert_ffn), then recompute once. Returns self."""
        self._loading = True
        try:
            for name, value in controls.items():
                (self.axes[name] if name in self.axes else getattr(self, name)).value = value
        finally:
            self._loading = False
        self.update()
        return self

    def update(self) -> None:
        if not self._loading:
            self.heading.value, tabs = render_state(self._base, self.controls())
            for pane, text in zip(self.panes, tabs):
                pane.value = text

    def close(self) -> None:
        """Close every widget of this explorer (controls, layouts, styles), so that none is saved into a page."""
        _close_all(self.widget)

    def html(self) -> str:
        """What the widget shows: the heading and the four tabs' HTML, one after another."""
        return self.heading.value + "".join(p.value for p in self.panes)

    def text(self) -> str:
        return render_text(self.summary(), self.title())


def explorer(preset: str = DEFAULT) -> Explorer:
    return Explorer(preset)


def _close_all(w) -> None:
    import ipywidgets as widgets

    for child in getattr(w, "children", ()):
        _close_all(child)
    for name in ("layout", "style"):
        part = getattr(w, name, None)
        if isinstance(part, widgets.Widget):
            part.close()
    w.close()


def _tabs(children: list):
    import ipywidgets as widgets

    tab = widgets.Tab(children=children)
    for i, name in enumerate(tab_titles()):
        tab.set_title(i, name)
    return tab


# The presets' labels (keys of PRESETS) as the dropdowns show them; a label without words stays as it is.
_PRESET_LABELS = frozenset(
    {
        N_("GPT-style 70B (MHA, GELU, 4h)"),
        N_("Mixtral-8x7B-class MoE"),
        N_("DeepSeek-V3-class MoE"),
        N_("this chapter's probe model"),
    }
)


def preset_label(preset: str) -> str:
    return shown(_PRESET_LABELS, preset)


def live_state_html(state: dict) -> str:
    """What the static explorer shows for a state of its form (`state`: "preset" and every name of CONTROLS): the
    live explorer's heading and tables (`render_state`), each table in a <details> element (`render_details`); a
    plan that does not fit: its reasons, once. pylib.viz.live runs this in the page."""
    heading, tabs = render_state(PRESETS[state["preset"]][0], {name: state[name] for name in CONTROLS})
    if len(set(tabs)) == 1:  # the reasons a plan does not fit, which every tab repeats
        return heading + tabs[0]
    return render_details(heading, tabs)


def live_fields() -> list[tuple[str, list]]:
    """The static explorer's form: the preset, then the model's sizes and the plan, each control with the live
    explorer's label and range."""
    from pylib.viz.live import Field, select

    def number(name, label, low, high, step=1):
        return Field(name, label, "number", low=low, high=high, step=step)

    preset = select("preset", tr("model"), list(PRESETS), [preset_label(p) for p in PRESETS])
    model = [
        number("h", "h", 16, 16384, 16),
        number("layers", tr("layers L"), 1, 128),
        number("heads", tr("heads"), 1, 128),
        number("kv_heads", tr("kv heads"), 1, 128),
        number("h_ffn", "h_ffn", 16, 65536, 16),
        number("vocab", "V", 16, 262144, 16),
        number("experts", tr("experts E (0: dense)"), 0, 256),
        number("top_k", "top-k", 1, 16),
        number("expert_ffn", tr("expert h_ffn"), 16, 65536, 16),
    ]
    plan = [
        number("b", tr("b (across DP)"), 1, 1024),
        select("s", "s", [2**i for i in range(4, 18)]),
        select("dtype", "dtype", DTYPES),
        *(select(a, a.upper(), POWERS) for a in ("tp", "cp", "dp", "pp", "ep", "etp")),
        Field("sp", tr("sequence parallel (with TP)"), "check"),
        select("cp_kind", "CP", ["ring", "ulysses"]),
        select("zero", tr("DP state"), ZERO),
        number("m", tr("micro-batches"), 1, 64),
        select("stage", tr("pipeline stage"), ["first", "last"], [tr("first"), tr("last")]),
    ]
    return [("", [preset]), (tr("model sizes"), model), (tr("plan"), plan)]


def static_explorer(preset: str = DEFAULT):
    """The explorer that works on a static page: every control of the live one as a plain HTML form, its first
    state computed here and every other computed in the page by pylib itself (`pylib.viz.live`: this module's
    `live_state_html`, run by Pyodide). No control of it needs a kernel."""
    from pylib.viz.live import LivePage

    state = {"preset": preset, **preset_controls(preset)}
    presets = {p: preset_controls(p) for p in PRESETS}
    return LivePage("explorer", live_fields(), presets, state, live_state_html(state))
