"""The tracer's collectives read the way the seeds name them: article A's primitive names, and article B's primitives
table (which op each mode issued, in which phase, where in the model, how many per layer).

    primitive_names(["recv", "send"])          # ['P2P']: article A's names, each once, in a fixed order
    primitives(events)                         # (op, phase) -> count, per layer, where, payload sizes
"""

from __future__ import annotations

import re
from collections import Counter

# The tracer's op names, and the names article A gives the primitives (a send and its receive are one P2P transfer).
PRIMITIVE_NAMES = {
    "all_reduce": "All-Reduce",
    "all_gather": "All-Gather",
    "reduce_scatter": "Reduce-Scatter",
    "all_to_all": "All-to-All",
    "send": "P2P",
    "recv": "P2P",
}


def primitive_names(ops) -> list[str]:
    """Article A's names for a collection of traced op names (`CommEvent.op`), each once, in a fixed order.

    >>> primitive_names(["recv", "send", "send"])
    ['P2P']
    >>> primitive_names(["reduce_scatter", "all_gather"])
    ['All-Gather', 'Reduce-Scatter']
    """
    ops = set(ops)
    unknown = sorted(ops - PRIMITIVE_NAMES.keys())
    if unknown:
        raise ValueError(f"no article A name for traced ops {unknown}; known: {sorted(PRIMITIVE_NAMES)}")
    return list(dict.fromkeys(PRIMITIVE_NAMES[op] for op in PRIMITIVE_NAMES if op in ops))


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
