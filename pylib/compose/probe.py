"""The FFN probe: bytes of the FFN intermediate activation per layer, measured on the real tensors.

The FFN hidden activation is the input of every `down_proj`: [b, s, h_ffn] on one device, [b/dp, s/cp, h_ffn/tp]
on a rank of the composed model (the TP region holds the CP rank's whole sequence), [rows, h_ffn/etp] inside an
expert. A forward hook on each `down_proj` records it as it is computed.
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def ffn_probe(modules):
    """Count, per layer, the bytes of every tensor entering a `down_proj` (the FFN hidden activation) while the
    block runs. `modules`: (prefix, module) pairs whose submodules are searched; yields {layer id: bytes}."""
    found: dict[int, int] = {}
    handles = []
    for prefix, module in modules:
        for name, sub in module.named_modules():
            if not name.endswith("down_proj"):
                continue
            full = f"{prefix}{name}"
            parts = full.split(".")
            layer = int(parts[parts.index("layers") + 1])

            def hook(mod, args, out, layer=layer):
                x = args[0]
                found[layer] = found.get(layer, 0) + x.numel() * x.element_size()

            handles.append(sub.register_forward_hook(hook))
    try:
        yield found
    finally:
        for h in handles:
            h.remove()
