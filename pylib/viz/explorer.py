"""An ipywidgets explorer of seed B's matrix view: pick a model (presets, or sliders for every size) and the TP /
CP / DP / PP / EP sizes, see the per-rank shape of every weight and activation, the memory and the traffic.

    ex = Explorer()               # Llama-2-70B on TP 8 x PP 4 x DP 4 by default
    ex.widget                     # display it: controls and the tables (an HTML widget)
    print(ex.text())              # the same tables as plain text (for a page read without JavaScript)

Every number comes from `pylib.analysis.shapes` (tests/test_analysis_shapes.py checks it against the real sharded
modules and the tracer). The tables are plain HTML with no TeX, so a static page shows the state saved when the
notebook ran; the controls need a live kernel.
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from pylib.analysis import shapes
from pylib.model import ModelConfig, MoEConfig
from pylib.model.presets import deepseek_v3_like, gpt_style_70b, llama2_70b, mixtral_8x7b, probe_moe_config
from pylib.plan import ZERO_STAGE_NAMES, ParallelConfig

from .tables import fmt_bytes, fmt_shape, html_table, text_table

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
DTYPES = ["bfloat16", "float16", "float32", "float64"]
ZERO = list(ZERO_STAGE_NAMES)  # the one ZeRO vocabulary (pylib.plan.options)


def _seed_shape(t: shapes.TensorShape, local: bool = True) -> str:
    return fmt_shape(t.seed_b if local else t.seed_b_full)


def _split(t: shapes.TensorShape) -> str:
    """Which axis cuts which dimension, by name: "tp: out/8" for a linear weight's output features (torch dim 0),
    "dp: b/4, tp: s/8" for an activation, "ep: E/8" for the experts."""
    syms = [x.strip() for x in t.symbol.strip("[]").split(",")]
    names = ["out", "in"] if t.linear else syms
    parts = []
    for axis, dim, n in t.splits:
        name = "E" if dim == -1 else names[dim] if dim < len(names) else f"dim {dim}"
        parts.append(f"{axis}: {name}/{n}")
    return ", ".join(parts) or "—"


def tables(summary: shapes.Summary) -> dict[str, tuple[list[str], list[list[str]]]]:
    """The explorer's four tables as (header, rows) of strings."""
    w_rows = [
        [w.name, w.symbol, _seed_shape(w, False), _seed_shape(w), _split(w), str(w.count), fmt_bytes(w.held_bytes)]
        for w in summary.weights
    ]
    a_rows = [
        [
            a.name + (" (expected)" if a.expected else ""),
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
        ["parameters", fmt_bytes(m["params"])],
        ["gradients", fmt_bytes(m["grads"])],
        ["optimizer state (Adam: 2 moments)", fmt_bytes(m["optim"])],
        ["activations saved for backward, at the 1F1B schedule's peak", fmt_bytes(m["activations"])],
        *([["ZeRO-3: gathered parameters (running + prefetched)", fmt_bytes(m["gathered"])]] if m["gathered"] else []),
        ["total", fmt_bytes(m["total"])],
    ]
    t_rows = [[t.mode, t.op, t.when, str(t.count), fmt_bytes(t.message), fmt_bytes(t.sent)] for t in summary.traffic]
    return {
        "weights (seed B's [in, out]; per rank)": (
            ["weight", "seed B", "full", "this rank", "split by", "count here", "bytes here"],
            w_rows,
        ),
        "activations of one layer, one micro-batch (per rank)": (
            ["activation", "seed B", "full", "this rank", "split by", "bytes", "note"],
            a_rows,
        ),
        "memory of this rank": (["what", "bytes"], mem_rows),
        "traffic of this rank, one step": (["mode", "op", "when", "ops", "message", "sent"], t_rows),
    }


def _describe(cfg: ModelConfig, par: ParallelConfig, b: int, s: int, **kw) -> str:
    moe = f", MoE E={cfg.moe.n_experts} top-{cfg.moe.top_k}" if cfg.moe else ""
    return (
        f"h={cfg.d_model}, L={cfg.n_layers}, n_head={cfg.n_heads}, n_kv_head={cfg.kv_heads}, "
        f"h_ffn={cfg.d_ff}, V={cfg.vocab_size}{moe}, {cfg.dtype}; b={b}, s={s}; {par.describe()}"
        f"{' + SP' if kw.get('sequence_parallel') else ''}; pipeline rank {kw.get('pp_rank', 0)}"
    )


def render_html(summary: shapes.Summary, title: str = "") -> str:
    if summary.problems:
        items = "".join(f"<li>{html.escape(p)}</li>" for p in summary.problems)
        return f"<div><b>This plan does not fit the model:</b><ul>{items}</ul></div>"
    parts = [f"<p><b>{html.escape(title)}</b></p>"] if title else []
    for name, (head, rows) in tables(summary).items():
        parts.append(f"<p><b>{html.escape(name)}</b></p>{html_table(head, rows)}")
    return "".join(parts)


def render_text(summary: shapes.Summary, title: str = "") -> str:
    if summary.problems:
        return "This plan does not fit the model:\n  " + "\n  ".join(summary.problems)
    out = [title] if title else []
    for name, (head, rows) in tables(summary).items():
        out.append(f"\n{name}")
        out += text_table(head, rows)
    return "\n".join(out)


class Explorer:
    """Controls for the model and the plan, and an HTML widget with the tables, recomputed on every change."""

    def __init__(self, preset: str = DEFAULT):
        cfg, plan = PRESETS[preset]
        slider = dict(continuous_update=False, style={"description_width": "initial"})
        self.preset = widgets.Dropdown(options=list(PRESETS), value=preset, description="model")
        self.h = widgets.IntSlider(min=16, max=16384, step=16, description="h", **slider)
        self.layers = widgets.IntSlider(min=1, max=128, description="layers L", **slider)
        self.heads = widgets.IntSlider(min=1, max=128, description="heads", **slider)
        self.kv_heads = widgets.IntSlider(min=1, max=128, description="kv heads", **slider)
        self.h_ffn = widgets.IntSlider(min=16, max=65536, step=16, description="h_ffn", **slider)
        self.vocab = widgets.IntSlider(min=16, max=262144, step=16, description="V", **slider)
        self.experts = widgets.IntSlider(min=0, max=256, description="experts E (0: dense)", **slider)
        self.top_k = widgets.IntSlider(min=1, max=16, description="top-k", **slider)
        self.expert_ffn = widgets.IntSlider(min=16, max=65536, step=16, description="expert h_ffn", **slider)
        self.b = widgets.IntSlider(min=1, max=1024, description="b (across DP)", **slider)
        self.s = widgets.SelectionSlider(options=[2**i for i in range(4, 18)], description="s", **slider)
        self.dtype = widgets.Dropdown(options=DTYPES, description="dtype")
        self.axes = {
            a: widgets.SelectionSlider(options=POWERS, value=1, description=a.upper(), **slider)
            for a in ("tp", "cp", "dp", "pp", "ep", "etp")
        }
        self.sp = widgets.Checkbox(description="sequence parallel (with TP)")
        self.cp_kind = widgets.ToggleButtons(options=["ring", "ulysses"], description="CP")
        self.zero = widgets.Dropdown(options=ZERO, description="DP state")
        self.m = widgets.IntSlider(min=1, max=64, description="micro-batches", **slider)
        self.stage = widgets.ToggleButtons(options=["first", "last"], description="pipeline stage")
        self.out = widgets.HTML()
        self._loading = False
        self.load(preset)
        model = [self.h, self.layers, self.heads, self.kv_heads, self.h_ffn, self.vocab, self.experts, self.top_k]
        model.append(self.expert_ffn)
        plan = [self.b, self.s, self.dtype, *self.axes.values(), self.sp, self.cp_kind, self.zero, self.m, self.stage]
        for c in model + plan:
            c.observe(lambda _change: self.update(), names="value")
        self.preset.observe(lambda change: self.load(change["new"]), names="value")
        columns = widgets.HBox([widgets.VBox(model), widgets.VBox(plan)])
        self.widget = widgets.VBox([self.preset, columns, self.out])

    def load(self, preset: str) -> None:
        """Set every control from a preset, then recompute once."""
        cfg, plan = PRESETS[preset]
        self._loading = True
        try:
            self.h.value, self.layers.value, self.heads.value = cfg.d_model, cfg.n_layers, cfg.n_heads
            self.kv_heads.value, self.h_ffn.value, self.vocab.value = cfg.kv_heads, cfg.d_ff, cfg.vocab_size
            self.experts.value = cfg.moe.n_experts if cfg.moe else 0
            self.top_k.value = cfg.moe.top_k if cfg.moe else 1
            self.expert_ffn.value = (cfg.moe.d_ff or cfg.d_ff) if cfg.moe else cfg.d_ff
            self.b.value, self.s.value, self.dtype.value = plan["b"], plan["s"], cfg.dtype
            for a, w in self.axes.items():
                w.value = plan.get(a, 1)
            self.sp.value, self.m.value = plan.get("sp", False), plan.get("m", 1)
            self.cp_kind.value, self.zero.value, self.stage.value = "ring", "ddp", "first"
            self._base = cfg
        finally:
            self._loading = False
        self.update()

    def state(self) -> tuple[ModelConfig, ParallelConfig, int, int, dict]:
        """The model, the plan, b, s and the keyword arguments of `shapes.summary`, from the controls."""
        moe = None
        if self.experts.value:
            base = self._base.moe or MoEConfig()
            moe = MoEConfig(
                n_experts=self.experts.value,
                top_k=min(self.top_k.value, self.experts.value),
                d_ff=self.expert_ffn.value,
                score=base.score,
                every=base.every,
            )
        cfg = self._base.with_(
            d_model=self.h.value,
            n_layers=self.layers.value,
            n_heads=self.heads.value,
            n_kv_heads=self.kv_heads.value,
            d_ff=self.h_ffn.value,
            vocab_size=self.vocab.value,
            dtype=self.dtype.value,
            moe=moe,
        )
        par = ParallelConfig(**{a: w.value for a, w in self.axes.items()})
        kw = dict(
            sequence_parallel=self.sp.value,
            cp_kind=self.cp_kind.value,
            microbatches=self.m.value,
            zero=self.zero.value,
            pp_rank=0 if self.stage.value == "first" else par.pp - 1,
        )
        return cfg, par, self.b.value, self.s.value, kw

    def summary(self) -> shapes.Summary:
        try:
            cfg, par, b, s, kw = self.state()
        except ValueError as err:  # a config or a plan that cannot even be built
            return shapes.Summary([], [], {}, [], [str(err)])
        return shapes.summary(cfg, par, b, s, **kw)

    def title(self) -> str:
        try:
            cfg, par, b, s, kw = self.state()
        except ValueError:
            return ""
        return _describe(cfg, par, b, s, **kw)

    def update(self) -> None:
        if not self._loading:
            self.out.value = render_html(self.summary(), self.title())

    def text(self) -> str:
        return render_text(self.summary(), self.title())


def explorer(preset: str = DEFAULT) -> Explorer:
    return Explorer(preset)
