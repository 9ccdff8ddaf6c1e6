"""Deterministic synthetic batches for tests, chapters and labs (nothing is downloaded).

Generated on the CPU, so a seed gives the same numbers on every machine; a rank moves them to its device."""

from __future__ import annotations

import torch

from .config import ModelConfig


def random_tokens(cfg: ModelConfig, batch: int, seq: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [b, s] and next-token targets [b, s], uniform over the vocabulary, fixed by `seed`."""
    g = torch.Generator().manual_seed(seed)
    stream = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=g, device="cpu")
    return stream[:, :-1].contiguous(), stream[:, 1:].contiguous()


def random_hidden(batch: int, seq: int, d_model: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """A fixed activation x [b, s, h] ~ N(0, 1) for layer-level checks."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, d_model, generator=g, dtype=torch.float64, device="cpu").to(dtype)
