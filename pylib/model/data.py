"""Deterministic synthetic batches for tests, chapters and labs (nothing is downloaded).

    random_tokens(cfg, b, s, seed)            # uniform tokens: ids, targets [b, s]
    pattern_tokens(cfg, b, s, seed)           # a toy language whose next token is predictable
    batches(cfg, b, s, step, data="random")   # the global batch of training step `step`, either kind
    random_hidden(b, s, h, seed)              # an activation x [b, s, h] ~ N(0, 1)

Generated on the CPU, so a seed gives the same numbers on every machine; a rank moves them to its device."""

from __future__ import annotations

import torch

from pylib.plan.config import ModelConfig


def random_tokens(cfg: ModelConfig, batch: int, seq: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [b, s] and next-token targets [b, s], uniform over the vocabulary, fixed by `seed`."""
    g = torch.Generator().manual_seed(seed)
    stream = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=g, device="cpu")
    return stream[:, :-1].contiguous(), stream[:, 1:].contiguous()


def random_hidden(batch: int, seq: int, d_model: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """A fixed activation x [b, s, h] ~ N(0, 1) for layer-level checks."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, d_model, generator=g, dtype=torch.float64, device="cpu").to(dtype)


DATASETS = ("random", "pattern")


def pattern_tokens(cfg: ModelConfig, batch: int, seq: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A generated toy language: each row counts through the vocabulary with its own start and stride
    (token[i+1] = token[i] + stride mod V), so the next token follows from the last two. ids, targets [b, s]."""
    g = torch.Generator().manual_seed(seed)
    V = cfg.vocab_size
    start = torch.randint(0, V, (batch, 1), generator=g, device="cpu")  # on the CPU: the same tokens everywhere
    stride = torch.randint(1, 4, (batch, 1), generator=g, device="cpu")
    stream = (start + stride * torch.arange(seq + 1, device="cpu")[None, :]) % V
    return stream[:, :-1].contiguous(), stream[:, 1:].contiguous()


def batches(cfg: ModelConfig, batch: int, seq: int, step: int, *, data: str = "random", seed: int = 0):
    """The global batch [B, S] of training step `step` (ids, targets), the same on every rank and in the reference."""
    if data == "random":
        return random_tokens(cfg, batch, seq, seed=seed + step)
    if data == "pattern":
        return pattern_tokens(cfg, batch, seq, seed=seed + step)
    raise ValueError(f"data={data!r} must be one of {DATASETS}")
