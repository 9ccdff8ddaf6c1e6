"""Named model configurations: real models' shapes for the size tables and planners, and the tiny models the
tests, labs, benches and chapters run. Plain data: importing this module loads no torch.

    llama2_70b() gpt_style_70b() deepseek_v3_like() llama2_7b() mixtral_8x7b()   # real shapes (meta device only)
    deepseek_v3()                                                               # its published layout's model
    llama3_405b() megatron_gpt(h, n_heads, n_layers)                            # the calibration's published runs
    probe_config() probe_moe_config()                                           # article B's probe model, on ranks
    seed_a_moe_config(n_experts, top_k)                                         # article A with an MoE MLP
    PRESETS["llama2_70b"]()                                                     # the real-model presets by name
    tiny() tiny_gqa() tiny_moe() tiny_odd() tiny_layer()                        # what tests and chapters run

Each is a function returning a fresh `ModelConfig` (frozen, so `cfg.with_(n_layers=2)` derives a variant).
Symbols follow article B: h = d_model, h_ffn = d_ff, n_head, n_kv_head, V = vocab_size, L = n_layers, E = n_experts.
"""

from __future__ import annotations

from .config import SEED_A, ModelConfig, MoEConfig

# ------------------------------------------------------------------------------------------------ real models


def llama2_70b() -> ModelConfig:
    """Llama-2-70B's shapes: h = 8192, 80 layers, 64 query heads sharing 8 K/V heads (GQA), SwiGLU with
    h_ffn = 28672, V = 32000, RoPE. (Llama normalises with RMSNorm, gamma only; the reference model's LayerNorm
    adds a beta per norm: 161 x 8192 parameters more.)"""
    return ModelConfig(
        vocab_size=32000,
        d_model=8192,
        n_layers=80,
        n_heads=64,
        n_kv_heads=8,
        d_ff=28672,
        mlp="swiglu",
        position="rope",
        dtype="bfloat16",
    )


def gpt_style_70b() -> ModelConfig:
    """The same width, depth and vocabulary with GPT-style choices: every head its own K/V (MHA) and a two-matrix
    GELU MLP with h_ffn = 4h, article B's baseline ("双矩阵 FFN 典型 ~4h")."""
    return llama2_70b().with_(n_kv_heads=None, d_ff=4 * 8192, mlp="gelu")


def deepseek_v3_like() -> ModelConfig:
    """A DeepSeek-V3-class MoE in the reference model's terms: h = 7168, 61 layers, 128 heads, V = 129280,
    256 routed experts with h_ffn = 2048, top-8, sigmoid router. Not modelled: its multi-head latent attention
    (written here as MHA: 128 heads of h/128 = 56), the shared expert and the 3 dense first layers."""
    return ModelConfig(
        vocab_size=129280,
        d_model=7168,
        n_layers=61,
        n_heads=128,
        d_ff=18432,
        mlp="swiglu",
        position="rope",
        dtype="bfloat16",
        moe=MoEConfig(n_experts=256, top_k=8, d_ff=2048, score="sigmoid"),
    )


def deepseek_v3() -> ModelConfig:
    """DeepSeek-V3 (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", sections 2 and 4.2) as the planner prices it:
    h = 7168, V = 129280, SwiGLU, 256 routed experts of h_ffn = 2048, top-8, sigmoid scores, one shared expert,
    node-limited routing (8 groups, at most 4 per token), in bf16. Three stated approximations, each a shape the
    reference model cannot express:

    - 62 layers: the 61 of the model and the one transformer block of its multi-token prediction module (depth 1);
      the MTP module's projection [2h -> h] and its second pass through the shared LM head are left out.
    - every layer a MoE layer: the model's first 3 are dense with h_ffn = 18432 = 9 x 2048, the FLOPs per token of
      8 routed experts and the shared one; their weights are counted as MoE layers' (more per layer, on pipeline
      rank 0 only).
    - multi-head latent attention written as multi-head attention of 128 heads of h/128 = 56: the projections'
      FLOPs within 10% of MLA's (4 h^2 = 205.5M multiply-adds per token against MLA's 187.1M), the attention core's
      below them (d_head 56 for q.k and p.v, where MLA's are 192 and 128), the K/V it keeps likewise smaller
      (`pylib.analysis.calibration.mla_flops_per_token` computes both from MLA's published ranks)."""
    return ModelConfig(
        vocab_size=129280,
        d_model=7168,
        n_layers=62,
        n_heads=128,
        d_ff=18432,
        mlp="swiglu",
        position="rope",
        dtype="bfloat16",
        moe=MoEConfig(
            n_experts=256, top_k=8, d_ff=2048, score="sigmoid", n_shared_experts=1, n_groups=8, topk_groups=4
        ),
    )


def llama2_7b() -> ModelConfig:
    """Llama-2-7B's shapes: h = 4096, 32 layers, 32 heads (MHA), SwiGLU with h_ffn = 11008, V = 32000."""
    return ModelConfig(
        vocab_size=32000,
        d_model=4096,
        n_layers=32,
        n_heads=32,
        d_ff=11008,
        mlp="swiglu",
        position="rope",
        dtype="bfloat16",
    )


def mixtral_8x7b() -> ModelConfig:
    """Mixtral-8x7B's shapes: Llama-2-7B-like attention with 8 K/V heads, 8 experts of h_ffn = 14336, top-2."""
    return llama2_7b().with_(n_kv_heads=8, d_ff=14336, moe=MoEConfig(n_experts=8, top_k=2))


def llama3_405b() -> ModelConfig:
    """Llama 3 405B's shapes (Grattafiori et al. 2024, Table 3): h = 16384, 126 layers, 128 query heads sharing 8
    K/V heads, SwiGLU with h_ffn = 53248, V = 128256, RoPE. Meta removes one layer from the first and the last
    pipeline stage (section 3.3.2): the analysis' `balance_ends` split, 126 = 128 - 2."""
    return ModelConfig(
        vocab_size=128256,
        d_model=16384,
        n_layers=126,
        n_heads=128,
        n_kv_heads=8,
        d_ff=53248,
        mlp="swiglu",
        position="rope",
        dtype="bfloat16",
    )


def megatron_gpt(h: int, n_heads: int, n_layers: int) -> ModelConfig:
    """The GPT models of Megatron-LM's performance table (its README, images/model_table.png): V = 131072 (the
    README's); MHA and a GELU MLP of 4h, Megatron's GPT defaults (the README does not say)."""
    return ModelConfig(vocab_size=131072, d_model=h, n_layers=n_layers, n_heads=n_heads, d_ff=4 * h, dtype="bfloat16")


PRESETS = {
    "llama2_70b": llama2_70b,
    "gpt_style_70b": gpt_style_70b,
    "deepseek_v3_like": deepseek_v3_like,
    "llama2_7b": llama2_7b,
    "mixtral_8x7b": mixtral_8x7b,
    "llama3_405b": llama3_405b,
}

# ------------------------------------------------------------------------------------------------ seed models


def probe_config() -> ModelConfig:
    """The small model article B's probes run on ranks: every size distinct, GQA, SwiGLU, RoPE, causal."""
    return ModelConfig(
        vocab_size=64, d_model=48, n_layers=4, n_heads=8, n_kv_heads=4, d_ff=128, mlp="swiglu", position="rope"
    )


def probe_moe_config() -> ModelConfig:
    """The probe model with every second layer an MoE of 8 experts (h_ffn = 32 each), top-2."""
    return probe_config().with_(moe=MoEConfig(n_experts=8, top_k=2, d_ff=32, every=2))


def seed_a_moe_config(n_experts: int = 8, top_k: int = 2) -> ModelConfig:
    """Article A's model with its MLP replaced by `n_experts` experts (each h_ffn = 8), top-k routing, float64."""
    return SEED_A.with_(moe=MoEConfig(n_experts=n_experts, top_k=top_k), dtype="float64")


# ------------------------------------------------------------------------------------------------ tiny models
# Small enough for a few gloo ranks on a laptop CPU; float64 so a parallel run matches the reference to ~1e-12.


def tiny() -> ModelConfig:
    """The dense test model: V = 32, h = 16, 4 layers, 4 heads (MHA), GELU MLP with h_ffn = 32, no positions."""
    return ModelConfig(vocab_size=32, d_model=16, n_layers=4, n_heads=4, d_ff=32, dtype="float64")


def tiny_gqa() -> ModelConfig:
    """`tiny` with Llama's choices: 2 K/V heads for 4 query heads (GQA), SwiGLU, RoPE."""
    return tiny().with_(n_kv_heads=2, mlp="swiglu", position="rope")


def tiny_moe() -> ModelConfig:
    """`tiny` at 2 layers with RoPE, the second layer an MoE of 4 experts, top-2."""
    return tiny().with_(n_layers=2, position="rope", moe=MoEConfig(n_experts=4, top_k=2, every=2))


def tiny_odd() -> ModelConfig:
    """Sizes that are all different and none a power of two (V = 37, h = 9, 3 heads, h_ffn = 22, 2 layers), so a
    flat-buffer layout or a shard boundary that is off cannot hide behind a round number."""
    return ModelConfig(vocab_size=37, d_model=9, n_heads=3, d_ff=22, n_layers=2, dtype="float64")


def tiny_layer() -> ModelConfig:
    """One small layer (V = 16, h = 8, 2 heads, h_ffn = 16): for layer-level checks and figures."""
    return ModelConfig(vocab_size=16, d_model=8, n_layers=1, n_heads=2, d_ff=16, dtype="float64")
