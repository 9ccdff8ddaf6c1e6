"""Activation recomputation as data: which layers of a stage are recomputed in backward, and how.

    recompute="none"        every layer keeps what autograd saves (the no-recompute tables)
    recompute="selective"   every layer keeps all but its attention core (Q K^T, the mask, softmax, P V): the core's
                            inputs q, k, v are kept and the core runs again in backward (Korthikanti et al. 2022,
                            section 5: the 5as/h term is the core's)
    recompute="full"        a group of layers keeps only its input [b, s, h] (s/t under SP) and runs again in
                            backward, collectives included (Megatron-Core's recompute_granularity="full")

For "full", Megatron's `recompute_method` and `recompute_num_layers` (k) choose the groups of a stage's n layers:

    uniform   groups of k consecutive layers, each checkpointed whole: ceil(n / k) inputs kept (the last group
              may be shorter)
    block     the first k layers checkpointed one by one, the other n - k layers keep everything (k >= n: all)

    Recompute("full", "uniform", 2).groups(4)  -> ((0, 1), True), ((2, 3), True)
    Recompute("full", "block", 1).groups(4)    -> ((0,), True), ((1, 2, 3), False)

The choice is one frozen value, `Recompute(granularity, method, num_layers)` (Megatron's recompute_granularity,
recompute_method, recompute_num_layers), held by `pylib.plan.RunOptions.recompute`; a bare granularity string
("full") means that granularity with the other two at their defaults (`as_recompute`).

For "selective", Megatron-Core (v0.13 on) names the parts of every layer it recomputes: `recompute_modules`
(--recompute-modules; the default, and pylib's "selective", is the attention core alone). Megatron checkpoints
"core_attn" and "mlp" as ordinary regions (their inputs kept, the whole region run again in backward); "layernorm"
and "moe_act" discard their output and rebuild it in backward from the input the layer keeps anyway. Selective
recomputation applies to every layer (Megatron refuses recompute_num_layers with it). Of Megatron's list these are
modelled (`pylib.analysis.recompute`): core_attn, layernorm, mlp (dense layers), moe_act (the experts' activation;
Megatron asks for --moe-grouped-gemm with it), moe (the whole MoE layer checkpointed: router, dispatch, experts,
combine and shared experts run again, the EP all-to-alls included), shared_experts (the shared experts' MLP) and
mla_up_proj (MLA's up-projections and RoPE, their outputs q, k, v discarded; priced on the multi-head attention that
stands in for MLA here, `pylib.plan.presets.deepseek_v3`). Megatron-LM d98e8a6 lists them in
megatron/core/transformer/transformer_config.py (`recompute_modules`) and applies "moe" and "shared_experts" in
megatron/core/transformer/moe/moe_layer.py (`tensor_parallel.checkpoint` of the layer's forward), "mla_up_proj" in
megatron/core/transformer/multi_latent_attention.py (`CheckpointWithoutOutput` of `qkv_up_proj_and_rope_apply`).
Megatron's modules of other layer kinds (gdn_*, mhc) are refused by name. The modules are the analysis only:
pylib.compose recomputes the attention core (recompute="selective") and nothing finer.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import fields

RECOMPUTE = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")
# modelled, in Megatron's spelling
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "moe_act", "moe", "shared_experts", "mla_up_proj")
UNMODELLED_MODULES = {
    "gdn_norm_out": "pylib has no GatedDeltaNet layer",
    "gdp_in_proj": "pylib has no GatedDeltaProduct layer",
    "gdp_qkv": "pylib has no GatedDeltaProduct layer",
    "mhc": "pylib has no hyper-connections",
}
DEFAULT_MODULES = ("core_attn",)  # Megatron's default, and what recompute="selective" recomputes in pylib


def modules_problems(modules, recompute="selective") -> list[str]:
    """Every bad `recompute_modules` choice: a name outside Megatron's list or not modelled here, a repeated
    name, an empty set, or modules without recompute="selective" (Megatron reads them only then)."""
    if modules is None:
        return []
    out = []
    if recompute != "selective":
        out.append(f"recompute_modules={modules!r} needs recompute='selective' (got recompute={recompute!r})")
    if not isinstance(modules, tuple) or not modules:
        return out + [f"recompute_modules={modules!r} must be a non-empty tuple of {RECOMPUTE_MODULES}"]
    for name in modules:
        if name in UNMODELLED_MODULES:
            out.append(f"recompute_modules: {name!r} is not modelled ({UNMODELLED_MODULES[name]})")
        elif name not in RECOMPUTE_MODULES:
            out.append(f"recompute_modules: {name!r} must be one of {RECOMPUTE_MODULES}")
    if len(set(modules)) != len(modules):
        out.append(f"recompute_modules={modules!r} names a module twice")
    return out


def recompute_modules(recompute: str, modules=None) -> frozenset:
    """The modules each layer recomputes: none but under "selective", where None means `DEFAULT_MODULES`."""
    if recompute != "selective":
        return frozenset()
    return frozenset(DEFAULT_MODULES if modules is None else modules)


@dataclass(frozen=True)
class Recompute:
    """Which activations a stage recomputes in backward: granularity "none", "selective" (the attention core) or
    "full" (whole groups of layers, chosen by method "uniform" / "block" and num_layers k). Checked when built
    (`pylib.plan.fields`): a bad value raises naming the field, the value and the vocabulary."""

    granularity: str = "none"
    method: str = "uniform"
    num_layers: int = 1

    def __post_init__(self):
        # the planner builds these by the ten thousand: one cheap test, the named checks only when it fails
        k = self.num_layers
        if not (self.granularity in RECOMPUTE and self.method in RECOMPUTE_METHODS and type(k) is int and k >= 1):
            fields.choice("Recompute", "recompute", self.granularity, RECOMPUTE)
            fields.choice("Recompute", "recompute_method", self.method, RECOMPUTE_METHODS)
            object.__setattr__(self, "num_layers", fields.integer("Recompute", "recompute_num_layers", k))

    def groups(self, n_layers: int):
        """A stage's n layers (by position 0..n-1) cut into (positions, recomputed whole) groups, in order.
        Only "full" recomputes whole groups; "none" and "selective" give one group that keeps its activations."""
        positions = tuple(range(n_layers))
        k = self.num_layers
        if self.granularity != "full" or n_layers == 0:
            return ((positions, False),) if n_layers else ()
        if self.method == "uniform":
            return tuple((positions[i : i + k], True) for i in range(0, n_layers, k))
        head = tuple(((i,), True) for i in positions[:k])
        rest = positions[k:]
        return head + (((rest, False),) if rest else ())


def as_recompute(choice) -> Recompute:
    """A `Recompute` from itself, a granularity string ("full") or a (granularity, method, num_layers) tuple."""
    if isinstance(choice, Recompute):
        return choice
    if isinstance(choice, tuple):
        return Recompute(*choice)
    return Recompute(choice)


def check_recompute(choice) -> Recompute:
    """The choice as a `Recompute` (`as_recompute`): building it checks it, so a bad choice raises here, named."""
    return as_recompute(choice)


__all__ = [
    "DEFAULT_MODULES",
    "RECOMPUTE",
    "RECOMPUTE_METHODS",
    "RECOMPUTE_MODULES",
    "Recompute",
    "as_recompute",
    "check_recompute",
    "modules_problems",
    "recompute_modules",
]
