"""Which dimension each mode cuts, measured: the share of each tensor dimension one rank holds under each mode
alone (from `pylib.experiments.mode_probes.probe_modes` records), against article B's tbl-mat-axis and against the
modes' own shard specs.

    cuts = axis_cuts(runs[0], cfg, moe_cfg, b, s)    # {mode: {dim: share one rank holds}}
    cut_dims(cuts["TP"])                             # {"n_head", "h_ffn", "V"}
    spec_dims(runs[0]["TP"]["specs"])                # the dims the mode's ShardSpecs say it splits
"""

from __future__ import annotations

import math
from collections import Counter

from pylib.i18n import N_, shown
from pylib.model import ModelConfig

MODES = ("TP", "SP", "CP", "DP", "PP", "EP")


DIMS = ("b", "s", "h", "n_head", "h_ffn", "V", "L", "E")


def layers_held(params: dict) -> set[int]:
    """The layers a rank holds weights of, from its parameter names ("layers.3.attn..." -> 3)."""
    return {int(n.split(".")[1]) for n in params if n.startswith("layers.")}


def experts_held(params: dict) -> set[tuple[int, int]]:
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
        shares["L"] = len(layers_held(rec["params"])) / cfg.n_layers
        n_moe = sum(moe_cfg.is_moe_layer(i) for i in layers_held(rec["params"]))
        held = experts_held(rec["params"])
        shares["E"] = len(held) / (moe_cfg.moe.n_experts * n_moe) if held else 1.0
        out[mode] = shares
    return out


# Article B's tbl-mat-axis: mode -> (the dimension it names, the object it names), and what each names in our dims.
SEED_AXIS = {
    "TP": ("h (or n_head)", "weight matrices"),
    "SP": ("s", "activations (with TP)"),
    "CP": ("s", "activations"),
    "DP": ("b", "data samples"),
    "PP": ("L", "layers"),
    "EP": ("E", "MoE experts"),
}


# SEED_AXIS's words as a table shows them: article B's own Chinese in the Chinese edition.
_SEED_AXIS_SHOWN = frozenset(
    {
        N_("h (or n_head)"),
        N_("weight matrices"),
        N_("activations (with TP)"),
        N_("activations"),
        N_("data samples"),
        N_("layers"),
        N_("MoE experts"),
    }
)


def seed_axis_shown(mode: str) -> tuple[str, str]:
    """SEED_AXIS[mode] (dimension, object) in the reader's language."""
    return tuple(shown(_SEED_AXIS_SHOWN, w) for w in SEED_AXIS[mode])


# The seed's "h (or n_head)" read as the dimensions it can mean in a measurement: the width inside attention
# (n_head d_head, which article B writes as h) and, by the same token, the FFN's and the vocabulary's inner widths.
SEED_AXIS_DIMS = {"TP": {"n_head", "h_ffn", "V"}, "SP": {"s"}, "CP": {"s"}, "DP": {"b"}, "PP": {"L"}, "EP": {"E"}}


def spec_dims(specs: list[dict]) -> set[str]:
    """The dimensions a mode's own `shard_specs()` say it splits, named with article B's symbols: a TP column/row split
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
    return dict(weights=partial, layers=len(layers_held(params)) < len(layers_held(reference)))
