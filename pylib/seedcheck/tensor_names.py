"""The names of seed B's tensors as a table row shows them, in the reader's language. The English name stays the
key of the data (SEED_WEIGHTS, SEED_ACTIVATIONS, the cut tables; chapters compare it with ==); only the shown text
changes.

    shown_name("token embedding")     # English: "token embedding"; Chinese: "token 嵌入"
    shown_name("W_Q")                 # a name without words is shown as it is
"""

from __future__ import annotations

from pylib.i18n import tr

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
    text = _NAMES.get(name)
    return text() if text is not None else name
