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

    recompute_groups(4, "full", "uniform", 2)  -> ((0, 1), True), ((2, 3), True)
    recompute_groups(4, "full", "block", 1)    -> ((0,), True), ((1, 2, 3), False)

For "selective", Megatron-Core (v0.13 on) names the parts of every layer it recomputes: `recompute_modules`
(--recompute-modules; the default, and pylib's "selective", is the attention core alone). Megatron checkpoints
"core_attn" and "mlp" as ordinary regions (their inputs kept, the whole region run again in backward); "layernorm"
and "moe_act" discard their output and rebuild it in backward from the input the layer keeps anyway. Selective
recomputation applies to every layer (Megatron refuses recompute_num_layers with it). Of Megatron's list these are
modelled (`pylib.analysis.recompute`): core_attn, layernorm, mlp (dense layers), moe_act (the experts' activation;
Megatron asks for --moe-grouped-gemm with it);
"moe" (the whole MoE layer: its EP dispatch would run again), "shared_experts" (pylib's MoE has none) and
"mla_up_proj" (no MLA here) are refused by name. The modules are the analysis only: pylib.compose recomputes the
attention core (recompute="selective") and nothing finer.
"""

from __future__ import annotations

RECOMPUTE = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "moe_act")  # modelled, in Megatron's spelling
UNMODELLED_MODULES = {
    "moe": "the whole MoE layer recomputed runs its EP all-to-alls again, which the traffic model does not count",
    "shared_experts": "pylib's MoE layer has no shared experts",
    "mla_up_proj": "pylib has no multi-latent attention",
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


def recompute_problems(recompute, method="uniform", num_layers=1) -> list[str]:
    """Every bad recompute choice, as sentences naming the value and the vocabulary."""
    out = []
    if recompute not in RECOMPUTE:
        out.append(f"recompute={recompute!r} must be one of {RECOMPUTE}")
    if method not in RECOMPUTE_METHODS:
        out.append(f"recompute_method={method!r} must be one of {RECOMPUTE_METHODS}")
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1:
        out.append(f"recompute_num_layers={num_layers!r} must be a positive integer (layers per recomputed group)")
    return out


def check_recompute(recompute, method="uniform", num_layers=1) -> None:
    """Raise ValueError listing `recompute_problems`."""
    found = recompute_problems(recompute, method, num_layers)
    if found:
        raise ValueError("; ".join(found))


def recompute_groups(n_layers: int, recompute: str, method: str = "uniform", num_layers: int = 1):
    """A stage's n layers (by position 0..n-1) cut into (positions, recomputed whole) groups, in order.
    Only "full" recomputes whole groups; "none" and "selective" give one group that keeps its activations."""
    check_recompute(recompute, method, num_layers)
    positions = tuple(range(n_layers))
    if recompute != "full" or n_layers == 0:
        return ((positions, False),) if n_layers else ()
    if method == "uniform":
        return tuple((positions[i : i + num_layers], True) for i in range(0, n_layers, num_layers))
    head = tuple(((i,), True) for i in positions[:num_layers])
    rest = positions[num_layers:]
    return head + (((rest, False),) if rest else ())


__all__ = [
    "DEFAULT_MODULES",
    "RECOMPUTE",
    "RECOMPUTE_METHODS",
    "RECOMPUTE_MODULES",
    "check_recompute",
    "modules_problems",
    "recompute_groups",
    "recompute_modules",
    "recompute_problems",
]
