"""The names of article B's tensors as a table row shows them, in the reader's language. The English name stays the
key of the data (SEED_WEIGHTS, SEED_ACTIVATIONS, the cut tables; chapters compare it with ==); only the shown text
changes.

    shown_name("token embedding")     # English: "token embedding"; Chinese: "token 嵌入"
    shown_name("W_Q")                 # a name without words is shown as it is
    shown_where("every layer's attention")   # SEED_WEIGHTS' and SEED_ACTIVATIONS' "where" column, likewise
"""

from __future__ import annotations

from pylib.i18n import N_, shown, tr

_NAMES = frozenset(
    {
        N_("token embedding"),
        N_("router"),
        N_("expert W_gate"),
        N_("expert W_up"),
        N_("expert W_down"),
        N_("MoE expert W_1, W_2"),
        N_("input hidden"),
        N_("attention scores"),
        N_("attention output"),
        N_("FFN intermediate"),
        N_("block output"),
        N_("LN output"),
    }
)


def shown_name(name: str) -> str:
    """A tensor's key -> its name in the reader's language (symbols such as W_Q, Q, K, V, logits, LM head,
    LayerNorm γ are the same in both)."""
    return shown(_NAMES, name)


# meta_tables.SEED_WEIGHTS' "where" and SEED_ACTIVATIONS' "produced" texts (English keys of the data)
_WHERE = frozenset(
    {
        N_("input layer (one per model)"),
        N_("output layer (one per model, often shared with the embedding)"),
        N_("every layer's attention"),
        N_("every layer's attention output projection"),
        N_("every layer's FFN (SwiGLU only)"),
        N_("every layer's FFN up projection"),
        N_("every layer's FFN down projection"),
        N_("every MoE layer (not in article B's list)"),
        N_("every MoE layer, E times"),
        N_("twice per layer (before attention, before the FFN)"),
        N_("with γ (LayerNorm only; RMSNorm has none)"),
        N_("the block's input"),
        N_("after the QKV projection"),
        N_("after Q K^T"),
        N_("after softmax · V (the input of W_O)"),
        N_("after W_up (the input of W_down)"),
        N_("after W_down and the residual"),
        N_("after the LM head"),
    }
)


def shown_where(text: str) -> str:
    """Where article B's tensor appears (SEED_WEIGHTS / SEED_ACTIVATIONS) in the reader's language."""
    if text not in _WHERE:
        raise KeyError(f"{text!r} is none of the data's 'where' and 'produced' texts")
    return tr(text)
