"""Article B's weight and activation lists read off the reference model built on the meta device: every tensor has its
real shape and dtype and no storage, so a 70B-parameter model costs nothing.

    model = meta_model(llama2_70b(), n_layers=1)
    weight_rows(model, cfg)            # [WeightRow]: article B's shape, the module's shape (its orientation), count
    meta_activations(cfg, b, s)        # article B's activations from forward hooks, shapes and dtype only
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pylib.model import ModelConfig, torch_dtype
from pylib.model.transformer import Transformer

from .activation_probe import ActivationProbe
from .symbols import evaluate, seed_b_shape, symbol_sizes


def meta_model(cfg: ModelConfig, n_layers: int | None = None):
    """The reference Transformer built on the meta device: every parameter has its real shape and dtype and no
    storage, so a 70B-parameter model costs nothing. `n_layers` builds fewer layers (each layer is the same)."""
    cfg = cfg if n_layers is None else cfg.with_(n_layers=n_layers)
    with torch.device("meta"):
        return Transformer(cfg).to(torch_dtype(cfg.dtype))


# Article B's weight list (tbl-mat-weights): name -> (seed's shape, where, the parameter of one layer it is).
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
    "router": ("[h, E]", "every MoE layer (not in article B's list)", "layers.{i}.mlp.router.gate.weight", True),
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
    shape: tuple | None  # article B's orientation
    expected: tuple | None  # the seed's symbolic shape evaluated for this config
    per_model: int  # how many such tensors the whole model has

    @property
    def agrees(self) -> bool:
        return self.shape == self.expected


def weight_rows(model, cfg: ModelConfig | None = None) -> list[WeightRow]:
    """Article B's weight list from a (meta) model's real parameters: the first layer (or first MoE layer) stands
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
    and dtypes of article B's activations for ids [b, s], with no number computed and no memory used."""
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
