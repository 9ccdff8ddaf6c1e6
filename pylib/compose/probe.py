"""The FFN probe: bytes of the FFN intermediate activation per layer, measured on the real tensors.

The FFN hidden activation is the input of every `down_proj`: [b, s, h_ffn] on one device, [b/dp, s/cp, h_ffn/tp]
on a rank of the composed model (the TP region holds the CP rank's whole sequence), [rows, h_ffn/etp] inside an
expert. A forward hook on each `down_proj` records it as it is computed.
"""

from __future__ import annotations

import contextlib

from pylib.runtime.recompute import is_recomputing


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
                if is_recomputing():  # a recomputed forward (recompute="full") is not a second activation
                    return
                x = args[0]
                found[layer] = found.get(layer, 0) + x.numel() * x.element_size()

            handles.append(sub.register_forward_hook(hook))
    try:
        yield found
    finally:
        for h in handles:
            h.remove()


class SavedProbe:
    """Bytes autograd saves for backward in each forward of each chunk, parameters excluded -- also the full
    parameter buffers ZeRO-3 gathers for a unit's forward (autograd saves views of them, but FSDP frees their
    storage right after the forward and gathers again for backward, so they are not activations).

    `measure(chunk)` is entered around one forward of chunk `chunk` (microbatches run through a chunk in order, so
    the k-th call is microbatch k); `peak(actions)` replays a schedule's forwards and backwards to give the most
    bytes held at once, as `pylib.pp.run_pipeline` does for its own probe."""

    def __init__(self, excluded_ptrs):
        self._excluded = excluded_ptrs  # () -> set of storage data_ptrs that are parameters, at pack time
        self.bytes: dict[tuple[int, int], int] = {}
        self._calls: dict[int, int] = {}

    def reset(self) -> None:
        self.bytes, self._calls = {}, {}

    @contextlib.contextmanager
    def measure(self, chunk: int):
        import torch

        mb = self._calls.get(chunk, 0)
        self._calls[chunk] = mb + 1
        seen: dict[int, int] = {}

        def pack(t):
            s = t.untyped_storage()
            ptr = s.data_ptr()
            if s.nbytes() and ptr not in seen and ptr not in self._excluded():
                seen[ptr] = s.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
        self.bytes[(mb, chunk)] = sum(seen.values())

    def peak(self, actions) -> int:
        """The most forward bytes held at once over one rank's actions: a forward's bytes are freed by its
        backward, or by its W where the schedule splits that backward (B keeps the graph for W)."""
        deferred = {(a.mb, a.chunk) for a in actions if a.op == "W"}
        live = best = 0
        for a in actions:
            if a.op == "F":
                live += self.bytes.get((a.mb, a.chunk), 0)
                best = max(best, live)
            elif a.op == "W" or (a.op == "B" and (a.mb, a.chunk) not in deferred):
                live -= self.bytes.get((a.mb, a.chunk), 0)
        return best
