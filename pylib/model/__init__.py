"""The single-device reference Transformer: modules, deterministic init, synthetic data, memory probe, and
`torch_dtype` (a config's dtype name as torch's). The config and the named models are plain data in
`pylib.plan.config` and `pylib.plan.presets` (no torch); ModelConfig, MoEConfig and SEED_A are re-exported here
for the code that builds a model from one."""

from pylib.plan.config import SEED_A, ModelConfig, MoEConfig

from .attention import Attention, attention_core, causal_mask, expand_kv, rope
from .data import DATASETS, TokenError, batches, check_tokens, pattern_tokens, random_hidden, random_tokens
from .dtype import torch_dtype
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
    "TokenError",
    "Transformer",
    "attention_core",
    "auxiliary_loss",
    "batches",
    "build_model",
    "capacity_keep_mask",
    "causal_mask",
    "check_tokens",
    "expand_kv",
    "expert_capacity",
    "load_balancing_loss",
    "pattern_tokens",
    "random_hidden",
    "random_tokens",
    "rope",
    "saved_activations",
    "torch_dtype",
    "z_loss",
]
