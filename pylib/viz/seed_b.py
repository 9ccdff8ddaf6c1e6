"""Part II of the book (seed B, the matrix view): model configurations, tables built from real modules, seed B's
own tables as data, the cell-by-cell comparison with what the ranks measured, and the figures.

    model = meta_model(llama2_70b())                      # real module shapes, no storage (torch.device("meta"))
    weight_rows(model)                                    # seed B's weight list from the model's parameters
    meta_activations(cfg, b, s)                           # seed B's activations from forward hooks on a meta model
    axis_cuts(runs)                                       # which dims each mode cut, from the probed ranks
    weight_cut_cells(runs) / activation_cut_cells(runs)   # seed B's cut tables, measured, judged cell by cell
    primitives(runs)                                      # which collective each mode issued, from the tracer
    fig_dim_orth(cuts), fig_col_row(example), fig_superposition(runs, ...)

`runs` is `launch(pylib.viz.seed_b_ranks.probe_modes, N, ...)`: one record per rank and mode. Shapes of weights
are torch's [out, in]; seed B writes a linear weight as [in, out], and every table here prints seed B's
orientation (`seed_b_shape`).
"""

from __future__ import annotations

import html
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np
import torch
from matplotlib.patches import Rectangle

from pylib.model import ModelConfig, MoEConfig

from . import style

# ------------------------------------------------------------------------------------------------ configurations


def llama2_70b() -> ModelConfig:
    """Llama-2-70B's shapes: h = 8192, 80 layers, 64 query heads sharing 8 K/V heads (GQA), SwiGLU with
    h_ffn = 28672, V = 32000, RoPE. (Llama normalises with RMSNorm, gamma only; the reference model's LayerNorm
    adds a beta per norm: 161 x 8192 parameters more.)"""
    return ModelConfig(
        vocab_size=32000,
        d_model=8192,
        n_layers=80,
        n_heads=64,
        n_kv_heads=8,
        d_ff=28672,
        mlp="swiglu",
        position="rope",
        dtype="bfloat16",
    )


def gpt_style_70b() -> ModelConfig:
    """The same width, depth and vocabulary with GPT-style choices: every head its own K/V (MHA) and a two-matrix
    GELU MLP with h_ffn = 4h, seed B's baseline ("双矩阵 FFN 典型 ~4h")."""
    return llama2_70b().with_(n_kv_heads=None, d_ff=4 * 8192, mlp="gelu")


def deepseek_v3_like() -> ModelConfig:
    """A DeepSeek-V3-class MoE in the reference model's terms: h = 7168, 61 layers, 128 heads, V = 129280,
    256 routed experts with h_ffn = 2048, top-8, sigmoid router. Not modelled: its multi-head latent attention
    (written here as MHA: 128 heads of h/128 = 56), the shared expert and the 3 dense first layers."""
    return ModelConfig(
        vocab_size=129280,
        d_model=7168,
        n_layers=61,
        n_heads=128,
        d_ff=18432,
        mlp="swiglu",
        position="rope",
        dtype="bfloat16",
        moe=MoEConfig(n_experts=256, top_k=8, d_ff=2048, score="sigmoid"),
    )


def llama2_7b() -> ModelConfig:
    """Llama-2-7B's shapes: h = 4096, 32 layers, 32 heads (MHA), SwiGLU with h_ffn = 11008, V = 32000."""
    return ModelConfig(
        vocab_size=32000,
        d_model=4096,
        n_layers=32,
        n_heads=32,
        d_ff=11008,
        mlp="swiglu",
        position="rope",
        dtype="bfloat16",
    )


def mixtral_8x7b() -> ModelConfig:
    """Mixtral-8x7B's shapes: Llama-2-7B-like attention with 8 K/V heads, 8 experts of h_ffn = 14336, top-2."""
    return llama2_7b().with_(n_kv_heads=8, d_ff=14336, moe=MoEConfig(n_experts=8, top_k=2))


def probe_config() -> ModelConfig:
    """The small model the ranks run: every size distinct, GQA, SwiGLU, RoPE, causal."""
    return ModelConfig(
        vocab_size=64, d_model=48, n_layers=4, n_heads=8, n_kv_heads=4, d_ff=128, mlp="swiglu", position="rope"
    )


def probe_moe_config() -> ModelConfig:
    """The probe model with every second layer an MoE of 8 experts (h_ffn = 32 each), top-2."""
    return probe_config().with_(moe=MoEConfig(n_experts=8, top_k=2, d_ff=32, every=2))


def meta_model(cfg: ModelConfig, n_layers: int | None = None):
    """The reference Transformer built on the meta device: every parameter has its real shape and dtype and no
    storage, so a 70B-parameter model costs nothing. `n_layers` builds fewer layers (each layer is the same)."""
    from pylib.model.transformer import Transformer

    cfg = cfg if n_layers is None else cfg.with_(n_layers=n_layers)
    with torch.device("meta"):
        return Transformer(cfg).to(cfg.torch_dtype)


# ------------------------------------------------------------------------------------------------ symbols


def symbol_sizes(cfg: ModelConfig, b: int | None = None, s: int | None = None, N: int | None = None) -> dict:
    """Seed B's symbols evaluated for a config (and a batch, a sequence length, a parallel degree N)."""
    out = dict(
        h=cfg.d_model,
        h_ffn=cfg.d_ff,
        n_head=cfg.n_heads,
        n_kv_head=cfg.kv_heads,
        d_head=cfg.d_head,
        h_kv=cfg.d_kv,
        V=cfg.vocab_size,
        L=cfg.n_layers,
    )
    if cfg.moe is not None:
        out.update(E=cfg.moe.n_experts, K=cfg.moe.top_k, h_ffn_e=cfg.moe.d_ff or cfg.d_ff)
    for k, v in (("b", b), ("s", s), ("N", N)):
        if v is not None:
            out[k] = v
    return out


_TERM = re.compile(r"^[A-Za-z_][A-Za-z_0-9]*(\s*[*/]\s*[A-Za-z_0-9]+)*$")


def evaluate(symbolic: str, sizes: dict) -> tuple[int, ...]:
    """'[b, n_head/N, s, d_head]' -> a tuple of ints, every term evaluated with `sizes` (must divide evenly)."""
    inner = symbolic.strip()
    if not (inner.startswith("[") and inner.endswith("]")):
        raise ValueError(f"not a shape: {symbolic!r}")
    out = []
    for term in inner[1:-1].split(","):
        term = term.strip()
        if not _TERM.match(term):
            raise ValueError(f"cannot evaluate {term!r} in {symbolic!r}")
        value = eval(term, {"__builtins__": {}}, dict(sizes))  # noqa: S307 - names and * / only (checked above)
        if value != int(value):
            raise ValueError(f"{term} = {value} is not a whole number ({sizes})")
        out.append(int(value))
    return tuple(out)


def describe(local, full_symbolic: str, sizes: dict, N: int) -> str:
    """A measured local shape written against the full shape's symbols: each dim as `sym`, `sym/N` or a number,
    e.g. (48, 12) against '[h, h_kv]' -> '[h, h_kv/N]'."""
    if local is None:
        return "—"
    syms = [t.strip() for t in full_symbolic.strip()[1:-1].split(",")]
    full = evaluate(full_symbolic, sizes)
    terms = []
    for sym, f, v in zip(syms, full, local):
        if v == f:
            terms.append(sym)
        elif v * N == f:
            terms.append(f"{sym}/N")
        else:
            terms.append(str(v))
    return "[" + ", ".join(terms) + "]"


def seed_b_shape(torch_shape, linear: bool):
    """torch's [out, in] -> seed B's [in, out] for a linear weight; anything else unchanged."""
    return None if torch_shape is None else (tuple(reversed(torch_shape)) if linear else tuple(torch_shape))


def fmt_shape(shape) -> str:
    return "—" if shape is None else "[" + ", ".join(str(v) for v in shape) + "]"


def fmt_bytes(n: float) -> str:
    """Decimal units, as seed B writes them (MB, GB)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def text_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a plain-text table: the header, then one per row, each column padded to its widest cell."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in [header, *rows]]


def html_table(header: list[str], rows: list[list[str]]) -> str:
    """An HTML table of strings (escaped), left-aligned headers, without TeX (the explorers' widgets show it)."""
    th = "".join(f"<th style='text-align:left;padding:2px 8px'>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td style='padding:2px 8px'>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


# ------------------------------------------------------------------------------------------------ B2: weights

# Seed B's weight list (tbl-mat-weights): name -> (seed's shape, where, the parameter of one layer it is).
SEED_WEIGHTS = {
    "token embedding": ("[V, h]", "input layer (one per model)", "embed.weight", False),
    "LM head": ("[h, V]", "output layer (one per model, often shared with the embedding)", "lm_head.weight", True),
    "W_Q": ("[h, h]", "every layer's attention", "layers.{i}.attn.q_proj.weight", True),
    "W_K": ("[h, h_kv]", "every layer's attention", "layers.{i}.attn.k_proj.weight", True),
    "W_V": ("[h, h_kv]", "every layer's attention", "layers.{i}.attn.v_proj.weight", True),
    "W_O": ("[h, h]", "every layer's attention output projection", "layers.{i}.attn.o_proj.weight", True),
    "W_gate": ("[h, h_ffn]", "every layer's FFN (SwiGLU only)", "layers.{i}.mlp.gate_proj.weight", True),
    "W_up": ("[h, h_ffn]", "every layer's FFN up projection", "layers.{i}.mlp.up_proj.weight", True),
    "W_down": ("[h_ffn, h]", "every layer's FFN down projection", "layers.{i}.mlp.down_proj.weight", True),
    "router": ("[h, E]", "every MoE layer (not in seed B's list)", "layers.{i}.mlp.router.gate.weight", True),
    "expert W_gate": ("[h, h_ffn_e]", "every MoE layer, E times", "layers.{i}.mlp.experts.0.gate_proj.weight", True),
    "expert W_up": ("[h, h_ffn_e]", "every MoE layer, E times", "layers.{i}.mlp.experts.0.up_proj.weight", True),
    "expert W_down": ("[h_ffn_e, h]", "every MoE layer, E times", "layers.{i}.mlp.experts.0.down_proj.weight", True),
    "LayerNorm γ": ("[h]", "twice per layer (before attention, before the FFN)", "layers.{i}.ln1.weight", False),
    "LayerNorm β": ("[h]", "with γ (LayerNorm only; RMSNorm has none)", "layers.{i}.ln1.bias", False),
}


@dataclass(frozen=True)
class WeightRow:
    name: str
    seed_shape: str
    where: str
    param: str
    torch_shape: tuple | None  # as stored, [out, in]
    shape: tuple | None  # seed B's orientation
    expected: tuple | None  # the seed's symbolic shape evaluated for this config
    per_model: int  # how many such tensors the whole model has

    @property
    def agrees(self) -> bool:
        return self.shape == self.expected


def weight_rows(model, cfg: ModelConfig | None = None) -> list[WeightRow]:
    """Seed B's weight list from a (meta) model's real parameters: the first layer (or first MoE layer) stands
    for every layer; per_model counts the tensors of that kind in the whole model `cfg` (default: the model's own
    config; pass the full config when the model was built with fewer of its identical layers)."""
    cfg = cfg or model.cfg
    params = dict(model.named_parameters())
    sizes = symbol_sizes(cfg)
    moe_layer = next((i for i in range(cfg.n_layers) if cfg.is_moe_layer(i)), None)
    dense_layer = next((i for i in range(cfg.n_layers) if not cfg.is_moe_layer(i)), None)
    n_moe = sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers))
    rows = []
    for name, (symbol, where, pattern, linear) in SEED_WEIGHTS.items():
        moe_row = "router" in pattern or "experts" in pattern
        dense_mlp = pattern.startswith("layers.{i}.mlp") and not moe_row
        layer = moe_layer if moe_row else dense_layer if dense_mlp else 0
        key = pattern.format(i=layer) if layer is not None else None
        t = tuple(params[key].shape) if key in params else None
        if t is None:
            continue
        if moe_row:
            per = n_moe * (cfg.moe.n_experts if "experts" in pattern else 1)
        elif dense_mlp:
            per = cfg.n_layers - n_moe
        elif "{i}" in pattern:
            per = cfg.n_layers * (2 if "ln1" in pattern else 1)
        else:
            per = 1
        rows.append(WeightRow(name, symbol, where, key, t, seed_b_shape(t, linear), evaluate(symbol, sizes), per))
    return rows


# ------------------------------------------------------------------------------------------------ B3: activations

SEED_ACTIVATIONS = {
    "input hidden": ("[b, s, h]", "the block's input"),
    "Q": ("[b, n_head, s, d_head]", "after the QKV projection"),
    "K": ("[b, n_kv_head, s, d_head]", "after the QKV projection"),
    "V": ("[b, n_kv_head, s, d_head]", "after the QKV projection"),
    "attention scores": ("[b, n_head, s, s]", "after Q K^T"),
    "attention output": ("[b, s, h]", "after softmax · V (the input of W_O)"),
    "FFN intermediate": ("[b, s, h_ffn]", "after W_up (the input of W_down)"),
    "block output": ("[b, s, h]", "after W_down and the residual"),
    "logits": ("[b, s, V]", "after the LM head"),
}


def meta_activations(cfg: ModelConfig, b: int, s: int) -> dict:
    """Forward hooks on a one-layer meta-device copy of `cfg` (every layer is the same module code): the shapes
    and dtypes of seed B's activations for ids [b, s], with no number computed and no memory used."""
    from .seed_b_ranks import ActivationProbe

    model = meta_model(cfg, n_layers=1)
    probe = ActivationProbe().watch_layer(model.layers[0]).watch_head(model.lm_head)
    ids = torch.zeros(b, s, dtype=torch.long, device="meta")
    with torch.no_grad():
        logits = model(ids)
    probe.remove()
    return dict(
        shapes=probe.shapes,
        scores=probe.scores,
        dtype=str(logits.dtype).replace("torch.", ""),
        device=str(logits.device),
    )


# ------------------------------------------------------------------------------------------------ B4: axes

MODES = ("TP", "SP", "CP", "DP", "PP", "EP")
DIMS = ("b", "s", "h", "n_head", "h_ffn", "V", "L", "E")
DIM_TICKS = {"h": "h\n(residual)", "n_head": "n_head\n(heads)", "L": "L\n(layers)", "E": "E\n(experts)"}
DIM_LABELS = {
    "b": "b (batch)",
    "s": "s (sequence)",
    "h": "h (residual stream)",
    "n_head": "n_head (h = n_head d_head inside attention)",
    "h_ffn": "h_ffn",
    "V": "V (vocabulary)",
    "L": "L (layers)",
    "E": "E (experts)",
}


def _layers_held(params: dict) -> set[int]:
    return {int(n.split(".")[1]) for n in params if n.startswith("layers.")}


def _experts_held(params: dict) -> set[tuple[int, int]]:
    """(layer, expert index) pairs of the experts whose weights a rank holds (local index under EP)."""
    out = set()
    for n in params:
        parts = n.split(".")
        if len(parts) > 5 and parts[2:5] == ["mlp", "experts", "experts"]:
            out.add((int(parts[1]), int(parts[5])))
        elif len(parts) > 4 and parts[2:4] == ["mlp", "experts"] and parts[4].isdigit():
            out.add((int(parts[1]), int(parts[4])))
    return out


def axis_cuts(run: dict, cfg: ModelConfig, moe_cfg: ModelConfig, b: int, s: int) -> dict[str, dict[str, float]]:
    """For each mode, the share of each dimension one rank holds (1 = whole), from rank `run`'s measured local
    shapes: activations for b, s, h, n_head, h_ffn, V; parameters for the layers (L) and experts (E) it holds."""
    full_acts = {
        "input hidden": (b, s, cfg.d_model),
        "Q": (b, cfg.n_heads, s, cfg.d_head),
        "FFN intermediate": (b, s, cfg.d_ff),
        "logits": (b, s, cfg.vocab_size),
    }
    where = {
        "b": [("input hidden", 0), ("Q", 0)],
        "s": [("input hidden", 1), ("Q", 2)],
        "h": [("input hidden", 2)],
        "n_head": [("Q", 1)],
        "h_ffn": [("FFN intermediate", 2)],
        "V": [("logits", 2)],
    }
    out = {}
    for mode in MODES:
        rec = run[mode]
        shares = {}
        for dim, places in where.items():
            seen = [rec["acts"][name][d] / full_acts[name][d] for name, d in places if name in rec["acts"]]
            shares[dim] = min(seen) if seen else 1.0
        shares["L"] = len(_layers_held(rec["params"])) / cfg.n_layers
        n_moe = sum(moe_cfg.is_moe_layer(i) for i in _layers_held(rec["params"]))
        held = _experts_held(rec["params"])
        shares["E"] = len(held) / (moe_cfg.moe.n_experts * n_moe) if held else 1.0
        out[mode] = shares
    return out


# Seed B's tbl-mat-axis: mode -> (the dimension it names, the object it names), and what each names in our dims.
SEED_AXIS = {
    "TP": ("h (or n_head)", "weight matrices"),
    "SP": ("s", "activations (with TP)"),
    "CP": ("s", "activations"),
    "DP": ("b", "data samples"),
    "PP": ("L", "layers"),
    "EP": ("E", "MoE experts"),
}
# The seed's "h (or n_head)" read as the dimensions it can mean in a measurement: the width inside attention
# (n_head d_head, which seed B writes as h) and, by the same token, the FFN's and the vocabulary's inner widths.
SEED_AXIS_DIMS = {"TP": {"n_head", "h_ffn", "V"}, "SP": {"s"}, "CP": {"s"}, "DP": {"b"}, "PP": {"L"}, "EP": {"E"}}


def spec_dims(specs: list[dict]) -> set[str]:
    """The dimensions a mode's own `shard_specs()` say it splits, named with seed B's symbols: a TP column/row split
    of an attention weight cuts the heads, of an MLP weight h_ffn, the vocabulary-parallel embedding and LM head V;
    a CP sequence spec cuts s; a PP stage spec the layers L; an EP expert spec the experts E; a TP LayerNorm noted as
    seeing s/t tokens under SP, s."""
    out = set()
    for sp in specs:
        kind, name = sp["kind"], sp["name"]
        if sp["axis"] == "tp" and kind in ("column", "row", "vocab", "kv-replicated"):
            out.add("V" if ("embed" in name or "lm_head" in name) else "n_head" if ".attn." in name else "h_ffn")
        elif kind.startswith("sequence"):
            out.add("s")
        elif kind == "stage":
            out.add("L")
        elif kind == "expert":
            out.add("E")
        elif sp["axis"] == "tp" and "sees s/t tokens" in sp["note"]:
            out.add("s")
    return out


def spec_summary(specs: list[dict]) -> str:
    """'tp column ×21, tp row ×8, ...': how many of a mode's ShardSpecs have each (axis, kind)."""
    counts = Counter((sp["axis"], sp["kind"]) for sp in specs)
    return ", ".join(f"{axis} {kind} ×{n}" for (axis, kind), n in counts.items())


def cut_dims(shares: dict[str, float]) -> set[str]:
    return {d for d, v in shares.items() if v < 1}


def objects_cut(run: dict, mode: str, reference: dict) -> dict[str, bool]:
    """What a mode cuts on one rank: a weight held in part, a layer's weights absent, experts absent, an
    activation held in part (measured against the reference's shapes)."""
    rec = run[mode]
    params = {n.replace(".experts.experts.", ".experts."): v for n, v in rec["params"].items()}
    partial = any(n in reference and math.prod(v) < math.prod(reference[n]) for n, v in params.items())
    return dict(weights=partial, layers=len(_layers_held(params)) < len(_layers_held(reference)))


@style.styled
def fig_dim_orth(cuts: dict[str, dict[str, float]], modes=MODES, dims=DIMS):
    """Seed B's fig-mat-dim-orth from measurements: one row per mode, one column per tensor dimension, a filled
    cell where the mode's ranks hold only part of that dimension (the share written in it)."""
    fig, ax = style.subplots(figsize=(1.05 * len(dims) + 1.6, 0.55 * len(modes) + 1.4), grid=False)
    ax.set_xlim(0, len(dims))
    ax.set_ylim(len(modes), 0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    colours = {m: style.rank_colour(i) for i, m in enumerate(modes)}
    for i, mode in enumerate(modes):
        for j, dim in enumerate(dims):
            share = cuts[mode].get(dim, 1.0)
            cut = share < 1
            ax.add_patch(
                Rectangle(
                    (j + 0.06, i + 0.08),
                    0.88,
                    0.84,
                    facecolor=colours[mode] if cut else style.CARD,
                    edgecolor=style.GRID,
                    lw=1.0,
                )
            )
            if cut:
                ax.text(
                    j + 0.5,
                    i + 0.5,
                    f"1/{round(1 / share)}",
                    ha="center",
                    va="center",
                    fontsize=9,
                    color=style.ink_on(colours[mode]),
                    fontweight="bold",
                )
    ax.set_xticks(np.arange(len(dims)) + 0.5, [DIM_TICKS.get(d, d) for d in dims])
    ax.set_yticks(np.arange(len(modes)) + 0.5, modes)
    ax.tick_params(length=0)
    ax.xaxis.tick_top()
    ax.set_title(
        "share of each dimension one rank holds, measured on 2 ranks per mode (SP: beyond TP's cuts)",
        fontsize=9,
        pad=34,
    )
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------------ B5: col / row


def fig_col_row(example):
    """Seed B's fig-mat-tp-col-row: `pylib.viz.tp.fig_column_vs_row`, the real shards of a column- and a
    row-parallel matmul (`pylib.viz.tp.column_row_example`)."""
    from .tp import fig_column_vs_row

    return fig_column_vs_row(example)


# ------------------------------------------------------------------------------------------------ B6 / B7: cut tables


@dataclass
class Cell:
    """One cell of a cut table: seed B's words, what they claim (`claim`, see `judge`), what was measured, the
    verdict ("agrees", "imprecise" or "wrong") and the measured value written out."""

    row: str
    mode: str
    seed: str
    claim: str
    verdict: str
    measured: str


MARK = {"agrees": "✓", "imprecise": "≈", "wrong": "✗"}

# Seed B's words in its cut tables, in English (the tables print these; the Chinese stays in the data).
SEED_WORDS = {
    "切 V 或 h (vocab parallel / TP)": "cut V or h (vocab parallel / TP)",
    "切 V 或 h": "cut V or h",
    "不切": "not cut",
    "完整副本": "full replica",
    "完整副本 (轻量)": "full replica (light)",
    "在 stage 0": "on stage 0",
    "在 stage L-1": "on stage L-1",
    "列切，按 head 维": "column split, by head",
    "行切": "row split",
    "列切": "column split",
    "按层归属 stage": "to the stage of its layer",
    "不切 (dense FFN)": "not cut (dense FFN)",
    "(可选) 切 h_ffn，称 moe_tp": "(optional) cut h_ffn: moe_tp",
    "切 E，不同 expert 在不同卡": "cut E: experts on different ranks",
    "切 h → [b, s, h/N_TP]": "cut h → [b, s, h/N_TP]",
    "切 s → [b, s/N_TP, h] (TP 不需完整 s 的区段)": "cut s → [b, s/N_TP, h] (where TP needs no whole s)",
    "切 s → [b, s/N_CP, h]": "cut s → [b, s/N_CP, h]",
    "切 b → [b/N_DP, s, h]": "cut b → [b/N_DP, s, h]",
    "不切，在某个 stage 上": "not cut, on one stage",
    "切 n_head → 每卡 n_h/N_TP 个 head": "cut n_head → n_head/N_TP heads per rank",
    "(与 input hidden 同 s)": "(the same s as the input hidden)",
    "切 s → 每卡 s/N_CP 个 token": "cut s → s/N_CP tokens per rank",
    "切 b": "cut b",
    "切 n_kv_head": "cut n_kv_head",
    "(同上)": "(as above)",
    "切 s, attention 时需跨卡看全部 KV": "cut s; attention needs every rank's K/V",
    "切 n_head": "cut n_head",
    "不出现完整 (TP 内独立算)": "never whole (computed within TP)",
    "不显式持有 (Ring 增量算)": "not held explicitly (the ring computes it step by step)",
    "切 h_ffn → 每卡 h_ffn/N_TP": "cut h_ffn → h_ffn/N_TP per rank",
    "切 s (TP 协同)": "cut s (with TP)",
    "切 s": "cut s",
    "(MoE) 不同 token 在不同 expert 卡": "(MoE) different tokens on different experts' ranks",
    "(可选) vocab parallel 切 V": "(optional) vocab parallel: cut V",
}

# Seed B's tbl-mat-weight-cut, cell by cell: (its words, the claim they make in checkable form). Claims:
# a shape in seed B's symbols and orientation with N the column's degree ("|" between alternatives); "full":
# every rank holds it whole; "as TP": what TP alone holds (SP adds no cut); "stage 0" / "stage L-1": held whole
# by that pipeline stage only; "by layer": whole on the stage that holds its layer, absent elsewhere;
# "experts/N": a rank holds E/N of the experts, each whole.
SEED_WEIGHT_CUT = {
    "token embedding": {
        "TP": ("切 V 或 h (vocab parallel / TP)", "[V/N, h] | [V, h/N]"),
        "SP": ("不切", "as TP"),
        "CP": ("不切", "full"),
        "DP": ("完整副本", "full"),
        "PP": ("在 stage 0", "stage 0"),
        "EP": ("不切", "full"),
    },
    "LM head": {
        "TP": ("切 V 或 h", "[h, V/N] | [h/N, V]"),
        "SP": ("不切", "as TP"),
        "CP": ("不切", "full"),
        "DP": ("完整副本", "full"),
        "PP": ("在 stage L-1", "stage L-1"),
        "EP": ("不切", "full"),
    },
    "W_Q": {
        "TP": ("列切，按 head 维", "[h, h/N]"),
        "SP": ("不切", "as TP"),
        "CP": ("不切", "full"),
        "DP": ("完整副本", "full"),
        "PP": ("按层归属 stage", "by layer"),
        "EP": ("不切", "full"),
    },
    "W_K, W_V": {
        "TP": ("列切，按 head 维", "[h, h_kv/N]"),
        "SP": ("不切", "as TP"),
        "CP": ("不切", "full"),
        "DP": ("完整副本", "full"),
        "PP": ("按层归属 stage", "by layer"),
        "EP": ("不切", "full"),
    },
    "W_O": {
        "TP": ("行切", "[h/N, h]"),
        "SP": ("不切", "as TP"),
        "CP": ("不切", "full"),
        "DP": ("完整副本", "full"),
        "PP": ("按层归属 stage", "by layer"),
        "EP": ("不切", "full"),
    },
    "W_up": {
        "TP": ("列切", "[h, h_ffn/N]"),
        "SP": ("不切", "as TP"),
        "CP": ("不切", "full"),
        "DP": ("完整副本", "full"),
        "PP": ("按层归属 stage", "by layer"),
        "EP": ("不切 (dense FFN)", "full"),
    },
    "W_down": {
        "TP": ("行切", "[h_ffn/N, h]"),
        "SP": ("不切", "as TP"),
        "CP": ("不切", "full"),
        "DP": ("完整副本", "full"),
        "PP": ("按层归属 stage", "by layer"),
        "EP": ("不切 (dense FFN)", "full"),
    },
    "MoE expert W_1, W_2": {
        "TP": ("(可选) 切 h_ffn，称 moe_tp", "[h, h_ffn_e/N] & [h_ffn_e/N, h]"),
        "SP": ("不切", "as TP"),
        "CP": ("不切", "full"),
        "DP": ("完整副本", "full"),
        "PP": ("按层归属 stage", "by layer"),
        "EP": ("切 E，不同 expert 在不同卡", "experts/N"),
    },
    "LayerNorm γ": {
        "TP": ("完整副本 (轻量)", "full"),
        "SP": ("不切", "full"),
        "CP": ("不切", "full"),
        "DP": ("完整副本", "full"),
        "PP": ("按层归属 stage", "by layer"),
        "EP": ("不切", "full"),
    },
}
# The probe model's parameters standing for each row (first layer, or first MoE layer for the experts).
WEIGHT_PARAMS = {
    "token embedding": ["embed.weight"],
    "LM head": ["lm_head.weight"],
    "W_Q": ["layers.0.attn.q_proj.weight"],
    "W_K, W_V": ["layers.0.attn.k_proj.weight", "layers.0.attn.v_proj.weight"],
    "W_O": ["layers.0.attn.o_proj.weight"],
    "W_up": ["layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight"],
    "W_down": ["layers.0.mlp.down_proj.weight"],
    "MoE expert W_1, W_2": ["layers.1.mlp.experts.{e}.up_proj.weight", "layers.1.mlp.experts.{e}.down_proj.weight"],
    "LayerNorm γ": ["layers.0.ln1.weight"],
}
WEIGHT_SYMBOLS = {
    "embed.weight": "[V, h]",
    "lm_head.weight": "[h, V]",
    "q_proj": "[h, h]",
    "k_proj": "[h, h_kv]",
    "v_proj": "[h, h_kv]",
    "o_proj": "[h, h]",
    "gate_proj": "[h, h_ffn]",
    "up_proj": "[h, h_ffn]",
    "down_proj": "[h_ffn, h]",
    "ln1": "[h]",
}


def _symbol_of(param: str) -> str:
    if ".experts." in param:
        return "[h_ffn_e, h]" if "down_proj" in param else "[h, h_ffn_e]"
    for key, sym in WEIGHT_SYMBOLS.items():
        if key in param:
            return sym
    raise KeyError(param)


def _is_linear(param: str) -> bool:
    return "proj" in param or "lm_head" in param or "gate.weight" in param


def _local(rec: dict, param: str):
    """This rank's shape of a reference parameter in seed B's orientation (None when it does not hold it)."""
    params = rec["params"]
    name = param
    if ".experts." in param and param not in params:
        name = param.replace(".experts.", ".experts.experts.")
    return seed_b_shape(params.get(name), _is_linear(param))


def _stage_of(runs, mode, param) -> list[int]:
    return [r for r, run in enumerate(runs) if _local(run[mode], param) is not None]


def judge_weight(runs, row: str, mode: str, cfg, moe_cfg) -> Cell:
    """Measure one cell of tbl-mat-weight-cut on every rank and judge seed B's claim."""
    seed, claim = SEED_WEIGHT_CUT[row][mode]
    N = len(runs)
    moe_row = row.startswith("MoE")
    model_cfg = moe_cfg if moe_row else cfg
    sizes = symbol_sizes(model_cfg, N=N)
    ref_params = runs[0]["reference"]["moe_params" if moe_row else "params"]
    params = WEIGHT_PARAMS[row]
    if moe_row:
        params = [p.format(e=0) for p in params]
    # Experts under TP are ETP's (pylib's TP model shards dense layers only); SP adds no cut to any weight, so
    # its expert cell is read from the same ETP run, whose MoE sees each rank's own tokens as it would under SP.
    rec_mode = "ETP" if (moe_row and mode in ("TP", "SP")) else mode
    full = {p: seed_b_shape(ref_params[p], _is_linear(p)) for p in params}
    measured, ok = [], True
    if claim == "experts/N":
        held = [len(_experts_held({n: 0 for n in run["EP"]["params"] if n.startswith("layers.1.")})) for run in runs]
        whole = all(_local(run["EP"], p) == full[p] for run in runs for p in params)
        ids = [tuple(run["EP"]["expert_ids"]) for run in runs]
        ok = whole and held == [moe_cfg.moe.n_experts // N] * N and len(set(sum(ids, ()))) == moe_cfg.moe.n_experts
        spans = ", ".join(f"rank {r}: {i[0]}–{i[-1]}" for r, i in enumerate(ids))
        text = f"E/N = {held[0]} experts per rank, each whole ({spans})"
        return Cell(row, mode, seed, claim, "agrees" if ok else "wrong", text)
    if claim.startswith("stage") or claim == "by layer":
        holders = {p: _stage_of(runs, "PP", p) for p in params}
        whole = all(_local(runs[r]["PP"], p) == full[p] for p, rs in holders.items() for r in rs)
        (stages,) = {tuple(v) for v in holders.values()}
        layer = params[0].split(".")[1] if params[0].startswith("layers.") else None
        stage_layers = {r: runs[r]["PP"]["layers"] for r in range(N)}
        if claim == "by layer":
            want = [r for r in range(N) if int(layer) in stage_layers[r]]
            ok = whole and list(stages) == want
            held = stage_layers[stages[0]]
            text = f"whole, on stage {stages[0]} only (layers {held[0]}–{held[-1]})"
        else:
            target = 0 if claim == "stage 0" else sizes["L"] - 1
            ok = whole and list(stages) == [target]
            text = f"whole, on stage {stages[0]} only" + ("" if claim == "stage 0" else " = N_PP − 1")
        return Cell(row, mode, seed, claim, "agrees" if ok else "wrong", text)
    locs = {p: [_local(run[rec_mode], p) for run in runs] for p in params}
    for p in params:
        if len(set(locs[p])) != 1:
            raise AssertionError(f"{mode} {p}: ranks hold different shapes {locs[p]}")
    if claim == "full":
        ok = all(locs[p][0] == full[p] for p in params)
    elif claim == "as TP":
        tp_mode = "ETP" if moe_row else "TP"
        ok = all(locs[p][0] == _local(runs[0][tp_mode], p) for p in params)
    else:
        alternatives = [a.strip() for a in claim.split("|")]
        if "&" in claim:
            wanted = [evaluate(a.strip(), sizes) for a in claim.split("&")]
            ok = [locs[p][0] for p in params] == wanted
        else:
            wanted = [evaluate(a, sizes) for a in alternatives]
            ok = all(locs[p][0] in wanted for p in params)
    for p in params:
        measured.append(f"{describe(locs[p][0], _symbol_of(p), sizes, N)} = {fmt_shape(locs[p][0])}")
    text = "; ".join(dict.fromkeys(measured))
    if rec_mode == "ETP":
        text += " (ETP)"
    verdict = "agrees" if ok else "wrong"
    if ok and "|" in claim:
        verdict = "imprecise"  # only one of the alternatives is what Megatron and pylib do
    return Cell(row, mode, seed, claim, verdict, text)


def weight_cut_cells(runs, cfg, moe_cfg) -> list[Cell]:
    return [judge_weight(runs, row, mode, cfg, moe_cfg) for row in SEED_WEIGHT_CUT for mode in MODES]


# Seed B's tbl-mat-act-cut: (its words, the claim). Claims as above, plus "stage full": whole on the stage that
# holds the layer; "blocks": the rank never holds [.., s/N, s] (only blocks); "routed": tokens go to experts.
SEED_ACT_CUT = {
    "input hidden": {
        "TP": ("切 h → [b, s, h/N_TP]", "[b, s, h/N]"),
        "SP": ("切 s → [b, s/N_TP, h] (TP 不需完整 s 的区段)", "[b, s/N, h]"),
        "CP": ("切 s → [b, s/N_CP, h]", "[b, s/N, h]"),
        "DP": ("切 b → [b/N_DP, s, h]", "[b/N, s, h]"),
        "PP": ("不切，在某个 stage 上", "stage full"),
        "EP": ("不切", "full"),
    },
    "Q": {
        "TP": ("切 n_head → 每卡 n_h/N_TP 个 head", "[b, n_head/N, s, d_head]"),
        "SP": ("(与 input hidden 同 s)", "[b, n_head/N, s/N, d_head]"),
        "CP": ("切 s → 每卡 s/N_CP 个 token", "[b, n_head, s/N, d_head]"),
        "DP": ("切 b", "[b/N, n_head, s, d_head]"),
        "PP": ("不切", "stage full"),
        "EP": ("不切", "full"),
    },
    "K, V": {
        "TP": ("切 n_kv_head", "[b, n_kv_head/N, s, d_head]"),
        "SP": ("(同上)", "[b, n_kv_head/N, s/N, d_head]"),
        "CP": ("切 s, attention 时需跨卡看全部 KV", "[b, n_kv_head, s/N, d_head]"),
        "DP": ("切 b", "[b/N, n_kv_head, s, d_head]"),
        "PP": ("不切", "stage full"),
        "EP": ("不切", "full"),
    },
    "attention scores": {
        "TP": ("切 n_head", "[b, n_head/N, s, s]"),
        "SP": ("不出现完整 (TP 内独立算)", "as TP"),
        "CP": ("不显式持有 (Ring 增量算)", "blocks"),
        "DP": ("切 b", "[b/N, n_head, s, s]"),
        "PP": ("不切", "stage full"),
        "EP": ("不切", "full"),
    },
    "FFN intermediate": {
        "TP": ("切 h_ffn → 每卡 h_ffn/N_TP", "[b, s, h_ffn/N]"),
        "SP": ("切 s (TP 协同)", "[b, s/N, h_ffn/N]"),
        "CP": ("切 s", "[b, s/N, h_ffn]"),
        "DP": ("切 b", "[b/N, s, h_ffn]"),
        "PP": ("不切", "stage full"),
        "EP": ("(MoE) 不同 token 在不同 expert 卡", "routed"),
    },
    "logits": {
        "TP": ("(可选) vocab parallel 切 V", "[b, s, V/N]"),
        "SP": ("不切", "as TP"),
        "CP": ("切 s", "[b, s/N, V]"),
        "DP": ("切 b", "[b/N, s, V]"),
        "PP": ("在 stage L-1", "stage L-1"),
        "EP": ("不切", "full"),
    },
}
ACT_SYMBOLS = {
    "input hidden": "[b, s, h]",
    "Q": "[b, n_head, s, d_head]",
    "K, V": "[b, n_kv_head, s, d_head]",
    "attention scores": "[b, n_head, s, s]",
    "FFN intermediate": "[b, s, h_ffn]",
    "logits": "[b, s, V]",
}


def judge_activation(runs, row: str, mode: str, cfg, moe_cfg, b: int, s: int) -> Cell:
    """Measure one cell of tbl-mat-act-cut on every rank and judge seed B's claim."""
    seed, claim = SEED_ACT_CUT[row][mode]
    N = len(runs)
    sizes = symbol_sizes(cfg, b=b, s=s, N=N)
    key = "K" if row == "K, V" else row
    symbol = ACT_SYMBOLS[row]
    full = evaluate(symbol, sizes)
    if claim == "routed":
        rows = [r for run in runs for r in run["EP"]["expert_rows"]]
        k, E = moe_cfg.moe.top_k, moe_cfg.moe.n_experts
        ok = sum(rows) == N * b * s * k
        text = (
            f"expert e holds [T_e, h_ffn_e]; T_e per local expert: {rows} (data-dependent); the {E} experts "
            f"together get N·b·s·K = {N * b * s * k} rows"
        )
        return Cell(row, mode, seed, claim, "agrees" if ok else "wrong", text)
    if claim in ("stage full", "stage L-1"):
        holders = [r for r, run in enumerate(runs) if key in run["PP"]["acts"]]
        shapes_ = {runs[r]["PP"]["acts"][key] for r in holders}
        ok = shapes_ == {full}
        if claim == "stage L-1":
            ok = ok and holders == [cfg.n_layers - 1]
            text = f"whole {fmt_shape(full)}, on stage {holders[0]} = N_PP − 1 only"
        else:
            text = f"whole {fmt_shape(full)}, on the stage of its layer"
        return Cell(row, mode, seed, claim, "agrees" if ok else "wrong", text)
    locs = [run[mode]["acts"].get(key) for run in runs]
    if claim == "blocks":
        blocks = [tuple(x) for run in runs for x in run["CP"]["scores"]]
        never_row = all(bl[3] < s for bl in blocks)
        per_rank = "; ".join(
            f"rank {r}: " + ", ".join(fmt_shape(x) for x in run["CP"]["scores"]) for r, run in enumerate(runs)
        )
        text = f"a block per ring step, never [b, n_head, s/N, s]: {per_rank}"
        return Cell(row, mode, seed, claim, "imprecise" if never_row else "wrong", text)
    if len(set(locs)) != 1:
        raise AssertionError(f"{mode} {row}: ranks hold different shapes {locs}")
    loc = locs[0]
    if claim == "full":
        ok = loc == full
    elif claim == "as TP":
        ok = loc == runs[0]["TP"]["acts"][key]
    else:
        ok = loc == evaluate(claim, sizes)
    text = f"{describe(loc, symbol, sizes, N)} = {fmt_shape(loc)}"
    return Cell(row, mode, seed, claim, "agrees" if ok else "wrong", text)


def activation_cut_cells(runs, cfg, moe_cfg, b: int, s: int) -> list[Cell]:
    return [judge_activation(runs, row, mode, cfg, moe_cfg, b, s) for row in SEED_ACT_CUT for mode in MODES]


def cut_table_rows(cells: list[Cell], with_seed: bool = True) -> list[list[str]]:
    """One table row per tensor: its name, then per mode the measured value with its verdict mark."""
    by_row: dict[str, dict[str, Cell]] = defaultdict(dict)
    for c in cells:
        by_row[c.row][c.mode] = c
    out = []
    for row, cols in by_row.items():
        line = [row]
        for mode in MODES:
            c = cols[mode]
            line.append(
                f"{MARK[c.verdict]} {c.measured}" + (f"<br>*seed B: {SEED_WORDS[c.seed]}*" if with_seed else "")
            )
        out.append(line)
    return out


# ------------------------------------------------------------------------------------------------ B8: primitives


def layer_of(tag: str) -> str | None:
    m = re.search(r"layers\.(\d+)", tag)
    return m.group(1) if m else None


def where_of(tag: str) -> str:
    """A tracer tag reduced to where in the model it happened: 'layers.2.mlp' -> 'mlp', 'embed', ..."""
    parts = [p for p in tag.split(".") if p and not p.isdigit() and p != "layers"]
    return parts[0] if parts else "(step)"


def primitives(events: list[dict]) -> dict[tuple[str, str], dict]:
    """(op, phase) -> {"count", "per_layer" (ops per layer when every layer issues the same), "where" (Counter of
    places), "payload" (set of payload sizes)} for one rank's events of one mode."""
    out: dict[tuple[str, str], dict] = {}
    for e in events:
        d = out.setdefault((e["op"], e["phase"]), dict(count=0, where=Counter(), payload=set(), layers=Counter()))
        d["count"] += 1
        d["where"][where_of(e["tag"])] += 1
        d["payload"].add(e["payload_bytes"])
        lay = layer_of(e["tag"])
        if lay is not None:
            d["layers"][lay] += 1
    for d in out.values():
        per = set(d["layers"].values())
        d["per_layer"] = per.pop() if len(per) == 1 else None
    return out


# ------------------------------------------------------------------------------------------------ B10: superposition


def superposition_pieces(runs: list[dict], b: int, s: int, d_ff: int) -> np.ndarray:
    """[b, s, h_ffn] array of owners: which rank's FFN intermediate holds each element, from each rank's measured
    rows (dp), positions (cp) and hidden columns (tp). -1 where nobody does."""
    owner = -np.ones((b, s, d_ff), dtype=int)
    for r, run in enumerate(runs):
        rows, pos, cols = run["rows"], run["positions"], run["hidden_cols"]
        block = owner[np.ix_(rows, pos, cols)]
        if (block != -1).any():
            raise AssertionError(f"rank {r} holds elements another rank holds")
        owner[np.ix_(rows, pos, cols)] = r
    return owner


@style.styled
def fig_superposition(runs: list[dict], b: int, s: int, d_ff: int, tp: int, cp: int, dp: int, rank: int = 0):
    """Seed B's fig-mat-superposition from the 16-rank run: the FFN intermediate [b, s, h_ffn] drawn as b
    stacked sequences (rows: tokens, columns: h_ffn), and the part rank `rank` holds after TP, then CP, then DP:
    each panel shades the elements that rank still holds, with the cut lines of the axes applied so far."""
    me = runs[rank]
    rows, pos, cols = set(me["rows"]), set(me["positions"]), set(me["hidden_cols"])
    stages = [
        ("one device", lambda i, t, j: True, 1),
        (f"TP = {tp}: cut h_ffn", lambda i, t, j: j in cols, tp),
        (f"+ CP = {cp}: cut s (zig-zag)", lambda i, t, j: j in cols and t in pos, tp * cp),
        (f"+ DP = {dp}: cut b", lambda i, t, j: j in cols and t in pos and i in rows, tp * cp * dp),
    ]
    fig, axes = style.subplots(1, 4, figsize=(11, 4.2), grid=False)
    colour = style.PALETTE[0]
    for ax, (title, holds, parts) in zip(axes, stages):
        ax.set_xlim(0, d_ff)
        ax.set_ylim(b * s, 0)
        ax.set_xticks([0, d_ff], ["0", f"h_ffn = {d_ff}"])
        ax.set_yticks([i * s + s / 2 for i in range(b)], [f"seq {i}" for i in range(b)], fontsize=8)
        ax.tick_params(axis="y", length=0)
        held = 0
        for i in range(b):
            for t in range(s):
                run_start = None
                for j in range(d_ff + 1):
                    inside = j < d_ff and holds(i, t, j)
                    if inside and run_start is None:
                        run_start = j
                    if not inside and run_start is not None:
                        ax.add_patch(
                            Rectangle((run_start, i * s + t), j - run_start, 1, facecolor=colour, edgecolor="none")
                        )
                        held += j - run_start
                        run_start = None
        for i in range(1, b):
            ax.axhline(i * s, color=style.MUTED, lw=1.2)
        if parts > 1:
            for j in range(1, tp):
                ax.axvline(j * d_ff / tp, color=style.MUTED, lw=0.6, ls="--")
        ax.set_title(f"{title}\nrank {rank} holds 1/{round(b * s * d_ff / held)}", fontsize=9)
    fig.suptitle(
        f"FFN intermediate [b, s, h_ffn] = [{b}, {s}, {d_ff}]: the part of it rank {rank} holds "
        f"(coordinates tp {me['coords']['tp']}, cp {me['coords']['cp']}, dp {me['coords']['dp']})",
        fontsize=10,
    )
    fig.tight_layout()
    return fig
