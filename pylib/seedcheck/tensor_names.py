"""The names of seed B's tensors as a table row shows them, in the reader's language. The English name stays the
key of the data (SEED_WEIGHTS, SEED_ACTIVATIONS, the cut tables; chapters compare it with ==); only the shown text
changes.

    shown_name("token embedding")     # English: "token embedding"; Chinese: "token 嵌入"
    shown_name("W_Q")                 # a name without words is shown as it is
    shown_where("every layer's attention")   # SEED_WEIGHTS' and SEED_ACTIVATIONS' "where" column, likewise
"""

from __future__ import annotations

from pylib.i18n import shown, tr

_NAMES = {
    "token embedding": lambda: tr("token embedding"),
    "router": lambda: tr("router"),
    "expert W_gate": lambda: tr("expert W_gate"),
    "expert W_up": lambda: tr("expert W_up"),
    "expert W_down": lambda: tr("expert W_down"),
    "MoE expert W_1, W_2": lambda: tr("MoE expert W_1, W_2"),
    "input hidden": lambda: tr("input hidden"),
    "attention scores": lambda: tr("attention scores"),
    "attention output": lambda: tr("attention output"),
    "FFN intermediate": lambda: tr("FFN intermediate"),
    "block output": lambda: tr("block output"),
    "LN output": lambda: tr("LN output"),
}


def shown_name(name: str) -> str:
    """A tensor's key -> its name in the reader's language (symbols such as W_Q, Q, K, V, logits, LM head,
    LayerNorm γ are the same in both)."""
    return shown(_NAMES, name)


# meta_tables.SEED_WEIGHTS' "where" and SEED_ACTIVATIONS' "produced" texts (English keys of the data)
_WHERE = {
    "input layer (one per model)": lambda: tr("input layer (one per model)"),
    "output layer (one per model, often shared with the embedding)": lambda: tr(
        "output layer (one per model, often shared with the embedding)"
    ),
    "every layer's attention": lambda: tr("every layer's attention"),
    "every layer's attention output projection": lambda: tr("every layer's attention output projection"),
    "every layer's FFN (SwiGLU only)": lambda: tr("every layer's FFN (SwiGLU only)"),
    "every layer's FFN up projection": lambda: tr("every layer's FFN up projection"),
    "every layer's FFN down projection": lambda: tr("every layer's FFN down projection"),
    "every MoE layer (not in seed B's list)": lambda: tr("every MoE layer (not in seed B's list)"),
    "every MoE layer, E times": lambda: tr("every MoE layer, E times"),
    "twice per layer (before attention, before the FFN)": lambda: tr(
        "twice per layer (before attention, before the FFN)"
    ),
    "with γ (LayerNorm only; RMSNorm has none)": lambda: tr("with γ (LayerNorm only; RMSNorm has none)"),
    "the block's input": lambda: tr("the block's input"),
    "after the QKV projection": lambda: tr("after the QKV projection"),
    "after Q K^T": lambda: tr("after Q K^T"),
    "after softmax · V (the input of W_O)": lambda: tr("after softmax · V (the input of W_O)"),
    "after W_up (the input of W_down)": lambda: tr("after W_up (the input of W_down)"),
    "after W_down and the residual": lambda: tr("after W_down and the residual"),
    "after the LM head": lambda: tr("after the LM head"),
}


def shown_where(text: str) -> str:
    """Where seed B's tensor appears (SEED_WEIGHTS / SEED_ACTIVATIONS) in the reader's language."""
    return _WHERE[text]()
