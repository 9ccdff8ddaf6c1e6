"""Forward hooks that record article B's activations by name, on a single-device model, a parallel mode's module or
a meta-device copy (shapes only, no storage).

    probe = ActivationProbe().watch_layer(model.layers[0]).watch_head(model.lm_head)
    model(ids); probe.remove()
    probe.shapes["Q"], probe.scores, probe.expert_rows

The activations are recorded where article B names them, in the watched layer:

    input hidden       the block's input                          (forward pre-hook on the layer)
    LN output          the first LayerNorm's output               (forward hook on ln1; not in article B's list)
    Q, K, V            the attention core's arguments             (the core wrapped for the call)
    attention scores   every score block the core materialises   (a TorchFunctionMode inside the core: the
                                                                   outputs of its 1st, 3rd, ... matmul)
    attention output   the input of W_O                           (pre-hook on o_proj)
    FFN intermediate   the input of W_down                        (pre-hook on down_proj)
    block output       the layer's output                         (forward hook on the layer)
    logits             the LM head's output                       (forward hook on lm_head)
    MoE                router logits (hook on router.gate), rows reaching each local expert (pre-hook on it)
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode


class MatmulRecorder(TorchFunctionMode):
    """Records the shape of every torch.matmul output computed while active."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.matmul or func is torch.Tensor.matmul or func is torch.Tensor.__matmul__:
            self.shapes.append(tuple(out.shape))
        return out


class ActivationProbe:
    """Forward hooks on one layer (and optionally the LM head) recording article B's activations by name.

    `shapes[name]` is the first shape seen (the first forward); `scores` every score block of that forward."""

    def __init__(self):
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.scores: list[tuple[int, ...]] = []
        self.expert_rows: list[int] = []
        self._handles = []
        self._cores: list[tuple[object, object, bool]] = []

    def _keep(self, name, t):
        if name not in self.shapes and isinstance(t, torch.Tensor):
            self.shapes[name] = tuple(t.shape)

    def _pre(self, name):
        def hook(_m, args):
            self._keep(name, args[0])

        return hook

    def _post(self, name):
        def hook(_m, _args, out):
            self._keep(name, out)

        return hook

    def watch_layer(self, layer) -> ActivationProbe:
        """Hook a Block / TPBlock (or any module with .attn and .mlp)."""
        self._handles.append(layer.register_forward_pre_hook(self._pre("input hidden")))
        self._handles.append(layer.register_forward_hook(self._post("block output")))
        if hasattr(layer, "ln1"):
            self._handles.append(layer.ln1.register_forward_hook(self._post("LN output")))
        attn = layer.attn
        self._handles.append(attn.o_proj.register_forward_pre_hook(self._pre("attention output")))
        self._wrap_core(attn)
        mlp = layer.mlp
        if hasattr(mlp, "down_proj"):
            self._handles.append(mlp.down_proj.register_forward_pre_hook(self._pre("FFN intermediate")))
        if hasattr(mlp, "router"):
            self._handles.append(mlp.router.gate.register_forward_hook(self._post("router logits")))
            experts = mlp.experts.experts if hasattr(mlp.experts, "experts") else mlp.experts
            for i, expert in enumerate(experts):
                self._handles.append(expert.register_forward_pre_hook(self._expert_hook(i)))
                if i == 0:
                    self._handles.append(expert.down_proj.register_forward_pre_hook(self._pre("expert intermediate")))
        return self

    def _expert_hook(self, i):
        def hook(_m, args):
            if len(self.expert_rows) == i:
                self.expert_rows.append(int(args[0].shape[0]))
            if i == 0:
                self._keep("expert input", args[0])

        return hook

    def watch_head(self, lm_head) -> ActivationProbe:
        self._handles.append(lm_head.register_forward_hook(self._post("logits")))
        return self

    def _wrap_core(self, attn):
        original = attn.core
        own = "core" in vars(attn)
        probe = self

        def core(q, k, v, *args, **kwargs):
            first = "Q" not in probe.shapes
            probe._keep("Q", q)
            probe._keep("K", k)
            probe._keep("V", v)
            if not first:
                return original(q, k, v, *args, **kwargs)
            with MatmulRecorder() as rec:
                out = original(q, k, v, *args, **kwargs)
            if len(rec.shapes) % 2:
                raise RuntimeError(f"expected score and output matmuls in pairs, recorded {rec.shapes}")
            probe.scores = rec.shapes[0::2]  # scores, then probabilities @ V, block after block
            probe.shapes["attention scores"] = probe.scores[0]
            return out

        attn.core = core
        self._cores.append((attn, original, own))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        for attn, original, own in self._cores:
            if own:
                attn.core = original
            else:
                del attn.core
        self._handles, self._cores = [], []
