"""Article A's six stages of the Pre-LN layer, read off the modules a real forward calls.

    flow = layer_flow(model.layers[0], x)      # [FlowStage ① .. ⑥], each with the calls that make it
    record_block_calls(block, x)               # every leaf module the forward called, and the attention core

Shapes use the seeds' names: x [b, s, h]; q, k, v [b, n_head, s, d_head]. `ModuleCall.weight_shape` is torch's
[out, in] (article A writes x @ W, i.e. W as [in, out]). `pylib.viz.layer_flow.draw_layer_flow` draws the stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pylib import i18n

# Article A numbers the Pre-LN layer ① .. ⑥; each stage is made of these submodules of a Block (in call order).
STAGE_TITLES = {
    1: "LayerNorm",
    2: "QKV projection",
    3: "attention",
    4: "output projection W_o, + residual",
    5: "LayerNorm",
    6: "MLP, + residual",
}


STAGE_OF_MODULE = {
    "ln1": 1,
    "attn.q_proj": 2,
    "attn.k_proj": 2,
    "attn.v_proj": 2,
    "attn.core": 3,
    "attn.o_proj": 4,
    "ln2": 5,
    "mlp.gate_proj": 6,
    "mlp.up_proj": 6,
    "mlp.down_proj": 6,
}


def stage_title(number: int) -> str:
    """Stage `number`'s title in the reader's language (STAGE_TITLES keeps the English, which code compares)."""
    return {
        1: i18n.tr("LayerNorm"),
        2: i18n.tr("QKV projection"),
        3: i18n.tr("attention"),
        4: i18n.tr("output projection W_o, + residual"),
        5: i18n.tr("LayerNorm"),
        6: i18n.tr("MLP, + residual"),
    }[number]


CIRCLED = {1: "①", 2: "②", 3: "③", 4: "④", 5: "⑤", 6: "⑥"}


@dataclass(frozen=True)
class ModuleCall:
    """One call a block's forward made: a leaf module, or the attention core (a method, not a module)."""

    name: str  # qualified name inside the block, e.g. "attn.q_proj"; "attn.core" for the attention core
    kind: str  # the module's class name, or "attention core"
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    weight_shape: tuple[int, ...] | None  # torch layout [out, in]; None when the module has no weight


@dataclass
class FlowStage:
    """One of article A's six stages and the calls that make it."""

    number: int
    title: str
    calls: list[ModuleCall] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{CIRCLED[self.number]} {stage_title(self.number)}"

    @property
    def module_names(self) -> list[str]:
        return [c.name for c in self.calls]


def record_block_calls(block: torch.nn.Module, x: torch.Tensor) -> list[ModuleCall]:
    """Run `block(x)` once and return, in execution order, every leaf module it called and the attention core.

    Leaf modules are seen through forward hooks; the attention core, a method of the block's attention module,
    is wrapped for the duration of the call (the instance attribute shadows the method, and is removed after)."""
    calls: list[ModuleCall] = []
    handles = []

    def hook_for(name, module):
        w = getattr(module, "weight", None)
        weight_shape = tuple(w.shape) if isinstance(w, torch.Tensor) else None

        def hook(_mod, inputs, output):
            calls.append(
                ModuleCall(name, type(module).__name__, tuple(inputs[0].shape), tuple(output.shape), weight_shape)
            )

        return hook

    for name, module in block.named_modules():
        if name and not list(module.children()):
            handles.append(module.register_forward_hook(hook_for(name, module)))
    attn = getattr(block, "attn", None)
    original_core = getattr(attn, "core", None)
    if original_core is not None:

        def core(q, k, v, *args, **kwargs):
            out = original_core(q, k, v, *args, **kwargs)
            calls.append(ModuleCall("attn.core", "attention core", tuple(q.shape), tuple(out.shape), None))
            return out

        attn.core = core
    try:
        with torch.no_grad():
            block(x)
    finally:
        for h in handles:
            h.remove()
        if original_core is not None:
            del attn.core
    return calls


def layer_flow(block: torch.nn.Module, x: torch.Tensor) -> list[FlowStage]:
    """Article A's six stages ① .. ⑥, each with the calls a real forward of `block` made for it.

    Raises ValueError if the block calls a module article A's numbering does not know, or calls them out of order
    (a Post-LN block, say, would call ln1 after attention)."""
    stages = {n: FlowStage(n, STAGE_TITLES[n]) for n in STAGE_TITLES}
    last = 0
    for call in record_block_calls(block, x):
        if call.name not in STAGE_OF_MODULE:
            raise ValueError(f"{call.name} ({call.kind}) is not part of article A's six stages")
        n = STAGE_OF_MODULE[call.name]
        if n < last:
            raise ValueError(f"{call.name} (stage {n}) was called after stage {last}: not a Pre-LN layer")
        last = n
        stages[n].calls.append(call)
    missing = [n for n, s in stages.items() if not s.calls]
    if missing:
        raise ValueError(f"stages {missing} were never called by the block's forward")
    return [stages[n] for n in sorted(stages)]
