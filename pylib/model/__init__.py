"""The single-device reference Transformer: config, presets, modules, deterministic init, synthetic data, memory
probe."""

from .attention import Attention, attention_core, causal_mask, expand_kv, rope
from .config import SEED_A, ModelConfig, MoEConfig
from .data import DATASETS, batches, pattern_tokens, random_hidden, random_tokens
from .memory import SavedTensors, saved_activations
from .mlp import MLP
from .moe import (
    AddAuxiliaryLoss,
    MoE,
    Router,
    Routing,
    auxiliary_loss,
    capacity_keep_mask,
    expert_capacity,
    load_balancing_loss,
    z_loss,
)
from .transformer import Block, Transformer, build_model

__all__ = [
    "MLP",
    "DATASETS",
    "SEED_A",
    "AddAuxiliaryLoss",
    "Attention",
    "Block",
    "ModelConfig",
    "MoE",
    "MoEConfig",
    "Router",
    "Routing",
    "SavedTensors",
    "Transformer",
    "attention_core",
    "auxiliary_loss",
    "batches",
    "build_model",
    "capacity_keep_mask",
    "causal_mask",
    "expand_kv",
    "expert_capacity",
    "load_balancing_loss",
    "pattern_tokens",
    "random_hidden",
    "random_tokens",
    "rope",
    "saved_activations",
    "z_loss",
]
