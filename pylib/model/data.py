"""Deterministic synthetic batches for tests, chapters and labs (nothing is downloaded).

    random_tokens(cfg, b, s, seed)            # uniform tokens: ids, targets [b, s]
    pattern_tokens(cfg, b, s, seed)           # a toy language whose next token is predictable
    batches(cfg, b, s, step, data="random")   # the global batch of training step `step`, either kind
    random_hidden(b, s, h, seed)              # an activation x [b, s, h] ~ N(0, 1)
    check_tokens(ids, cfg.vocab_size, "ids")   # every mode, before its embedding and its loss

Generated on the CPU, so a seed gives the same numbers on every machine; a rank moves them to its device."""

from __future__ import annotations

import torch
import torch.distributed as dist

from pylib.plan.config import ModelConfig


class TokenError(ValueError):
    """Token ids or targets that no vocabulary row holds (or that are not integers)."""


def check_tokens(t: torch.Tensor, vocab_size: int, what: str = "token ids") -> torch.Tensor:
    """Raise TokenError unless `t` holds integers in [0, vocab_size); returns `t`.

    Called by every mode before its embedding and its loss, on every rank: the vocab-parallel embedding and loss
    would otherwise read an id no rank owns as a row of zeros (a normal-looking loss), and the reference's
    `nn.Embedding` would raise a bare IndexError from inside torch. One min/max pass over b*s ints (and, on a
    GPU, one synchronisation); the error names the rank, the value, where it sits and the vocabulary size."""
    if t.dtype in (torch.bool, torch.float16, torch.bfloat16, torch.float32, torch.float64) or t.is_complex():
        raise TokenError(f"{what} must be an integer tensor (int64 or int32), got {str(t.dtype).replace('torch.', '')}")
    if t.numel() == 0 or t.is_meta:  # a meta tensor (shapes only, as the memory probes use) holds no values
        return t
    low, high = torch.stack(torch.aminmax(t)).tolist()  # one synchronisation on a GPU
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        where = tuple(int(i) for i in (t == bad).nonzero()[0])
        rank = f"rank {dist.get_rank()}: " if dist.is_available() and dist.is_initialized() else ""
        raise TokenError(
            f"{rank}{what} hold {bad} at {where}, outside the vocabulary [0, {vocab_size}) (vocab_size={vocab_size})"
        )
    return t


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
