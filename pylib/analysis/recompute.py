"""Activation recomputation as formulas: what a layer keeps for backward under each choice, what it runs again, and
what that second forward communicates. Pure functions of sizes; tests/test_recompute.py measures every one of them.

Per layer and rank (e = bytes per element of cfg.dtype, a_t = n_head/t query heads, kv_t K/V heads on the rank,
d = d_head, s_o = tokens outside the TP region: s/t under SP, else s):

    none        `tp.saved_activation_bytes`: what autograd saves, row by row (`tp.compare_with_korthikanti`)
    selective   none without the attention core's rows (Q and the expanded K, the expanded V, the
                [b, a_t, s, s] probabilities, the causal mask) plus the core's inputs kept by the checkpoint:
                q [b, a_t, s, d], k, v [b, kv_t, s, d] (not expanded under GQA): e b s (a_t + 2 kv_t) d
    full        the input of each recomputed group of layers: e b s_o h (`pylib.plan.recompute.Recompute.groups`
                decides how many inputs a stage keeps; layers outside the groups keep "none")

Korthikanti et al. 2022 (2-byte activations, with dropout) print sbh(34 + 5as/h) without recompute; selective removes
the 5as/h term and the dropout of the core: sbh(10 + 24/t) with TP, sbh 34/t with TP + SP; full keeps 2sbh (2sbh/t
with SP). `korthikanti_recompute_bytes` gives those; ours differ by the rows `tp.compare_with_korthikanti` explains.

Extra forward work (matmul FLOPs, 2 per multiply-add, as `torch.utils.flop_counter` counts). torch's non-reentrant
checkpoint stops the second forward as soon as it has rebuilt every tensor backward needs ("early stopping", on by
default): a matmul saves its inputs before it runs, so the region's last matmul is never run again. Hence

    selective   Q K^T only (P V's inputs, the probabilities and V, are all it needs): 2 b s^2 a_t d per layer
    full        a group of n layers runs its forward again up to its last matmul: n times the layer's forward
                (Q, K, V 2 b s h (a_t + 2 kv_t) d, the core 4 b s^2 a_t d, W_O 2 b s a_t d h, the MLP
                2 b s h (h_ffn/t) x 2 (GELU) or x 3 (SwiGLU)) less the last W_down, 2 b s (h_ffn/t) h

and for "full" the group's forward collectives once more except the one after that last matmul (the MLP's leave:
all-reduce, or reduce-scatter under SP), issued in backward under the tracer's phase "recompute".

Megatron's modules (`pylib.plan.recompute.recompute_modules`, recompute="selective", every layer): what each one stops
saving per layer and rank is a set of rows of `activations.layer_saved_rows` (`module_dropped_rows`), and what it
runs again (`module_extra_flops`, `module_extra_hbm_bytes`). T_o = b s/(cp t) tokens under SP, b s/cp without;
T = b s/cp inside the TP region; R the rows an EP rank's experts receive; f = h_ffn. Megatron's layer (the planner's
sp_regather, Transformer Engine) fuses the first norm into the QKV GEMM and a dense layer's second norm into the
MLP's first GEMM (TELayerNormColumnParallelLinear: the layer has no norm module of its own there).

    core_attn  the attention core's rows, q, k, v kept: "selective" above (Q K^T again, 2 b s^2 a_t d)
    layernorm  the output of each norm that is a module of its own, which the next GEMM saves, e T_o h each:
               LN1 -> QKV and a dense LN2 -> W_in only without SP (pylib's layer; under SP pylib's GEMM keeps the
               gathered copy, not the norm's output, and Megatron's layer fuses them), a MoE layer's LN2 -> the
               router always (Megatron keeps that norm apart); the norm runs again at memory speed, reading
               its input and writing its output, 2 e T_o h bytes each
    mlp        a dense layer's MLP hidden rows (3 f-wide tensors [T, f/t] in Megatron's layer, 4 SwiGLU / 2 GELU in
               pylib's), and in Megatron's layer also W_in's saved input [T_o, h] and LN2's statistics [T_o] x 2 (the
               fused norm is inside the checkpoint, whose input, LN2's input, stays); Megatron's checkpoint runs the
               whole MLP again: 2 T h (f/t) (m_in + 1) FLOPs (m_in = 2 SwiGLU, 1 GELU), Megatron's fused LN2 at
               2 e T_o h bytes, and the MLP's forward TP collectives once more (`module_extra_collectives`)
    moe_act    half of the experts' hidden rows: the activation's outputs (SwiGLU: silu(gate x) and the product of
               pylib's 4 tensors; GELU: the output of 2), its input, fc1's output [R, m_in f/etp], kept; the
               activation runs again at memory speed, reading fc1's output and writing fc2's input,
               e R f/etp (m_in + 1) bytes
    moe        the whole MoE layer checkpointed (Megatron's `tensor_parallel.checkpoint` of MoELayer's forward): it
               keeps its input, the router's [T_o, h], and nothing else of the layer (`activations.layer_saved_rows`
               drops the rest); it runs again the router 2 T_o E h, the experts 2 R h (f/etp) (m_in + 1), the shared
               experts, and sends again the forward's EP and ETP collectives (`planner.moe_recompute_rows`);
               moe_act inside it adds nothing
    shared_experts  the shared experts' MLP checkpointed: its hidden rows and its gathered input dropped, its GEMMs
               again, 2 T h (f_s/t) (m_in + 1) with f_s = n_shared h_ffn(expert), and under TP its forward
               collectives once more
    mla_up_proj  MLA's up-projections and RoPE discard their outputs q, k, v (Megatron's CheckpointWithoutOutput)
               and rebuild them in backward from the latents the layer keeps anyway. pylib has no MLA: on the
               multi-head attention that stands in for it (`pylib.plan.presets.deepseek_v3`) the core's saved q, k,
               v are dropped (`core_input_bytes`) and the QKV GEMM runs again, 2 T h (a_t + 2 kv_t) d -- the stand-in's
               projection, not MLA's up-projections (the preset's docstring states how far apart they are)
"""

from __future__ import annotations

from pylib.plan.heads import kv_heads_per_rank
from pylib.plan.recompute import RECOMPUTE, Recompute, as_recompute, check_recompute, recompute_modules

from . import tp as tp_analysis
from .tp import dtype_bytes

CORE_ROWS = ("Q and K", "V", "softmax output", "causal mask")


def core_input_bytes(cfg, b: int, s: int, tp: int = 1, cp: int = 1) -> int:
    """What a recomputed attention core keeps: its inputs q [b, n_head/tp, s/cp, d], k, v [b, kv/tp, s/cp, d]
    (ring attention and Ulysses take the shard's q, k, v too: their all-to-alls and K/V passes run inside)."""
    heads, (kv, _) = cfg.n_heads // tp, kv_heads_per_rank(cfg.n_heads, cfg.kv_heads, tp)
    return dtype_bytes(cfg.dtype) * b * (s // cp) * (heads + 2 * kv) * cfg.d_head


def layer_input_bytes(cfg, b: int, s: int, tp: int = 1, *, sequence_parallel: bool = False, cp: int = 1) -> int:
    """The input of a layer on one rank, [b, s/cp, h] or [b, s/(cp tp), h] under SP: what "full" keeps per group."""
    s_o = s // cp // tp if sequence_parallel and tp > 1 else s // cp
    return dtype_bytes(cfg.dtype) * b * s_o * cfg.d_model


def layer_saved_bytes(
    cfg, b: int, s: int, t: int = 1, *, sequence_parallel: bool = False, regather: bool = False, recompute="none"
) -> int:
    """Exact bytes one `pylib.tp.TPBlock` keeps for backward on one rank under `recompute` (one recomputed
    layer for "full")."""
    check_recompute(recompute)
    if recompute == "full":
        return layer_input_bytes(cfg, b, s, t, sequence_parallel=sequence_parallel)
    rows = tp_analysis.compare_with_korthikanti(cfg, b, s, t, sequence_parallel=sequence_parallel, regather=regather)
    if recompute == "none":
        return sum(r.ours_bytes for r in rows)
    return sum(r.ours_bytes for r in rows if r.item not in CORE_ROWS) + core_input_bytes(cfg, b, s, t)


def groups_saved_bytes(layer_bytes: list[int], input_bytes: list[int], recompute: Recompute | str) -> int:
    """Bytes a stage's layers keep under `recompute` (a `Recompute` or its granularity): layer_bytes[i] (what layer
    i keeps without "full") for layers outside recomputed groups, input_bytes[i] (layer i's input) for the first
    layer of each recomputed group."""
    total = 0
    for group, whole in as_recompute(recompute).groups(len(layer_bytes)):
        total += input_bytes[group[0]] if whole else sum(layer_bytes[i] for i in group)
    return total


def model_layers_saved_bytes(
    cfg, b, s, t=1, *, sequence_parallel=False, regather=False, recompute: Recompute | str = Recompute()
) -> int:
    """What the n_layers layers of a `pylib.tp.TPTransformer` keep on one rank (the embedding and head excluded),
    under `recompute` (a `Recompute` or its granularity)."""
    recompute = as_recompute(recompute)
    kw = dict(sequence_parallel=sequence_parallel, regather=regather)
    kept = "selective" if recompute.granularity == "selective" else "none"
    per = layer_saved_bytes(cfg, b, s, t, recompute=kept, **kw)
    inp = layer_input_bytes(cfg, b, s, t, sequence_parallel=sequence_parallel)
    n = cfg.n_layers
    return groups_saved_bytes([per] * n, [inp] * n, recompute)


def korthikanti_recompute_bytes(s, b, h, a, t=1, *, sequence_parallel=False, recompute="none") -> float:
    """Korthikanti et al. 2022, bytes per layer per rank under each choice (2-byte activations, with dropout)."""
    check_recompute(recompute)
    sbh = s * b * h
    if recompute == "none":
        return tp_analysis.korthikanti_bytes(s, b, h, a, t, sequence_parallel=sequence_parallel)
    if recompute == "selective":
        return sbh * 34 / t if sequence_parallel else sbh * (10 + 24 / t)
    return 2 * sbh / t if sequence_parallel else 2 * sbh


def core_flops(cfg, b: int, s: int, t: int = 1) -> int:
    """Matmul FLOPs of one forward of our attention core on one rank: Q K^T and P V, s x s entries each."""
    return 4 * b * s * s * (cfg.n_heads // t) * cfg.d_head


def layer_forward_flops(cfg, b: int, s: int, t: int = 1) -> int:
    """Matmul FLOPs of one `TPBlock` forward on one rank (see the module docstring)."""
    heads, (kv, _) = cfg.n_heads // t, kv_heads_per_rank(cfg.n_heads, cfg.kv_heads, t)
    h, dh, ff = cfg.d_model, cfg.d_head, cfg.d_ff // t
    proj = 2 * b * s * h * (heads + 2 * kv) * dh + 2 * b * s * heads * dh * h
    mlp = 2 * b * s * h * ff * (3 if cfg.mlp == "swiglu" else 2)
    return proj + core_flops(cfg, b, s, t) + mlp


def extra_forward_flops(cfg, b: int, s: int, t: int = 1, recompute="none", layers: int = 1) -> int:
    """Matmul FLOPs run again in backward on one rank: per layer under "selective", per recomputed group of
    `layers` layers under "full" (see the module docstring: the last matmul is not rerun)."""
    check_recompute(recompute)
    if recompute == "none":
        return 0
    if recompute == "selective":
        return core_flops(cfg, b, s, t) // 2
    return layers * layer_forward_flops(cfg, b, s, t) - 2 * b * s * (cfg.d_ff // t) * cfg.d_model


def extra_collectives(cfg, b, s, t=1, *, sequence_parallel=False, recompute="none", layers: int = 1) -> list:
    """The collectives a recomputed group of `layers` layers issues again in backward (phase "recompute"): under
    "full" its forward ones but the last (the MLP's leave, after the last matmul); none under "selective"."""
    check_recompute(recompute)
    if recompute != "full":
        return []
    e = dtype_bytes(cfg.dtype)
    fwd = tp_analysis.layer_collectives(b, s, cfg.d_model, t, e, sequence_parallel=sequence_parallel)
    fwd = [c for c in fwd if c.phase == "forward"]
    return (fwd * layers)[:-1]


def cp_recompute_ops(kind: str, recompute: str, cp: int, layers: int = 1) -> dict[str, int]:
    """Point-to-point / all-to-all ops one CP rank issues again in backward (phase "recompute") for `layers`
    recomputed layers (selective: every layer; full: the layers in recomputed groups). Ring attention is one
    autograd function that saves at its end, so its cp - 1 K/V passes (a send and a recv each) all run again.
    Ulysses runs 4 all-to-alls per layer (q, k, v in; the output back); selective stops before P V, so the output's
    is not rerun (3), full reruns it for W_O's saved input (4)."""
    check_recompute(recompute)
    if recompute == "none" or cp == 1:
        return {}
    if kind == "ring":
        return {"send": (cp - 1) * layers, "recv": (cp - 1) * layers}
    return {"all_to_all": (3 if recompute == "selective" else 4) * layers}


def norm_is_own_module(moe_layer: bool, sequence_parallel: bool, norm: str) -> bool:
    """Whether norm "ln1" / "ln2" of a layer leaves its own output saved for the next GEMM (see the module docstring:
    a MoE layer's LN2 always; the others only without SP)."""
    return (moe_layer and norm == "ln2") or not sequence_parallel


def modules_with_effect(cfg, modules, sequence_parallel: bool) -> tuple[str, ...]:
    """The modules of `modules` that change anything in `cfg`'s layers (sequence_parallel: SP with TP > 1):
    core_attn always; layernorm where some norm is a module of its own (`norm_is_own_module`); mlp with a dense
    layer, moe_act with a MoE layer. In `modules`' order."""
    kinds = {cfg.is_moe_layer(i) for i in range(cfg.n_layers)}
    has = {
        "core_attn": True,
        "layernorm": any(norm_is_own_module(k, sequence_parallel, n) for k in kinds for n in ("ln1", "ln2")),
        "mlp": False in kinds,
        "moe_act": True in kinds,
        "moe": True in kinds,
        "shared_experts": True in kinds and bool(cfg.moe.n_shared_experts),
        "mla_up_proj": True,
    }
    return tuple(m for m in modules if has.get(m, True))


def module_dropped_rows(
    rows: dict, modules, *, moe_layer: bool, sequence_parallel: bool, sp_regather: bool, qkv_bytes: int = 0
) -> dict:
    """{row: bytes} of `rows` (one layer's `activations.layer_saved_rows` before Megatron's modules other than the
    attention core and "moe", which `layer_saved_rows` applies itself) that `modules` stop saving (the module
    docstring). qkv_bytes: the core's q, k, v on this rank (`core_input_bytes`), what "mla_up_proj" discards."""
    out = {}
    fused = sequence_parallel and sp_regather  # Megatron's layer: LN1 inside QKV, a dense LN2 inside W_in

    def drop(item, fraction=1):
        if item in rows:
            out[item] = rows[item] // fraction

    if "layernorm" in modules:
        if norm_is_own_module(moe_layer, sequence_parallel, "ln1"):
            drop("QKV input (LN1 output)")
        if norm_is_own_module(moe_layer, sequence_parallel, "ln2"):
            drop("router input [T, h]" if moe_layer else "MLP input (LN2 output)")
    if "mlp" in modules and not moe_layer:
        drop("MLP hidden")
        if fused:
            drop("MLP input (LN2 output)")
            drop("LayerNorm mean and 1/std", 2)  # LN2's of the two norms' statistics
    if "moe_act" in modules and moe_layer and "moe" not in modules:  # "moe" keeps none of them
        for item in rows:
            if item.startswith("expert hidden"):
                drop(item, 2)
    if "shared_experts" in modules and moe_layer and "moe" not in modules:
        for item in rows:
            if item.startswith("shared experts"):
                drop(item)
    if "mla_up_proj" in modules:  # the core's saved q, k, v (its inputs, when the core is recomputed)
        for item in rows:
            if item.startswith("attention core"):
                out[item] = min(rows[item], qkv_bytes)
    return out


def shared_ff(cfg) -> int:
    """f_s, the hidden width of a MoE layer's shared experts, one MLP: n_shared x the experts' h_ffn (0: none)."""
    return cfg.moe.n_shared_experts * (cfg.moe.d_ff or cfg.d_ff) if cfg.moe is not None else 0


def module_extra_flops(
    cfg,
    b: int,
    s: int,
    t: int = 1,
    modules=(),
    *,
    moe_layer: bool = False,
    expert_rows: int = 0,
    etp: int = 1,
    sequence_parallel: bool = False,
) -> int:
    """Matmul FLOPs one layer's modules run again in backward on one rank (s: this rank's s/cp tokens; the
    module docstring): core_attn Q K^T, mlp the dense MLP's GEMMs, mla_up_proj the QKV GEMM; in a MoE layer
    shared_experts the shared MLP's GEMMs, moe the router's, the experts' (on `expert_rows` rows, h_ffn/etp) and the
    shared MLP's (sequence_parallel: the router sees the s/t shard)."""
    m_in = 2 if cfg.mlp == "swiglu" else 1
    h = cfg.d_model
    out = core_flops(cfg, b, s, t) // 2 if "core_attn" in modules else 0
    if "mlp" in modules and not moe_layer:
        out += 2 * b * s * h * (cfg.d_ff // t) * (m_in + 1)
    if "mla_up_proj" in modules:
        heads, (kv, _) = cfg.n_heads // t, kv_heads_per_rank(cfg.n_heads, cfg.kv_heads, t)
        out += 2 * b * s * h * (heads + 2 * kv) * cfg.d_head
    if moe_layer and ("moe" in modules or "shared_experts" in modules):
        out += 2 * b * s * h * (shared_ff(cfg) // t) * (m_in + 1)
    if moe_layer and "moe" in modules:
        s_o = s // t if sequence_parallel and t > 1 else s
        out += 2 * b * s_o * cfg.moe.n_experts * h
        out += 2 * expert_rows * h * ((cfg.moe.d_ff or cfg.d_ff) // etp) * (m_in + 1)
    return out


def module_extra_hbm_bytes(
    cfg,
    b: int,
    s: int,
    t: int = 1,
    modules=(),
    *,
    moe_layer: bool = False,
    sequence_parallel: bool = False,
    sp_regather: bool = False,
    expert_rows: int = 0,
    etp: int = 1,
) -> int:
    """Bytes the memory-bound reruns of one layer's modules read and write on one rank (s: s/cp; the module
    docstring): each recomputed norm 2 e T_o h, Megatron's fused LN2 under "mlp", the experts' activation under
    "moe_act" e R f/etp (m_in + 1)."""
    e = dtype_bytes(cfg.dtype)
    sp = sequence_parallel and t > 1
    norm = 2 * e * b * (s // t if sp else s) * cfg.d_model
    out = 0
    if "layernorm" in modules:
        out += norm * sum(norm_is_own_module(moe_layer, sp, n) for n in ("ln1", "ln2"))
    if "mlp" in modules and not moe_layer and sp and sp_regather:
        out += norm
    if "moe_act" in modules and moe_layer and "moe" not in modules:  # under "moe" the experts rerun whole
        m_in = 2 if cfg.mlp == "swiglu" else 1
        out += e * expert_rows * ((cfg.moe.d_ff or cfg.d_ff) // etp) * (m_in + 1)
    return out


def module_extra_collectives(
    cfg, b: int, s: int, t: int = 1, modules=(), *, sequence_parallel=False, moe_layer: bool = False
) -> list:
    """The TP collectives one layer's modules issue again in backward: in a dense layer under "mlp" the MLP's forward
    ones (SP: the all-gather entering and the reduce-scatter leaving; TP alone: the all-reduce leaving); in a MoE
    layer with shared experts the same ones of the shared MLP under "shared_experts" or "moe" (Megatron's
    SharedExpertMLP is an MLP over the TP group)."""
    again = ("moe" in modules or "shared_experts" in modules) and shared_ff(cfg) if moe_layer else "mlp" in modules
    if not again:
        return []
    e = dtype_bytes(cfg.dtype)
    fwd = tp_analysis.layer_collectives(b, s, cfg.d_model, t, e, sequence_parallel=sequence_parallel)
    return [c for c in fwd if c.phase == "forward" and c.where == "mlp"]


__all__ = [
    "CORE_ROWS",
    "RECOMPUTE",
    "core_flops",
    "core_input_bytes",
    "cp_recompute_ops",
    "extra_collectives",
    "extra_forward_flops",
    "groups_saved_bytes",
    "korthikanti_recompute_bytes",
    "layer_forward_flops",
    "layer_input_bytes",
    "layer_saved_bytes",
    "model_layers_saved_bytes",
    "module_dropped_rows",
    "module_extra_collectives",
    "module_extra_flops",
    "module_extra_hbm_bytes",
    "modules_with_effect",
    "norm_is_own_module",
    "recompute_modules",
    "shared_ff",
]
