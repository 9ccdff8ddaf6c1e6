"""A config's dtype name as a torch dtype: the one place a dtype name ("float32", "bfloat16", ...) becomes torch's.

`pylib.plan.config.ModelConfig.dtype` and `pylib.plan.options.MixedPrecision` hold names, so the torch-free layers
can read them; the modules that build tensors ask `torch_dtype(cfg.dtype)`.
"""

from __future__ import annotations

import torch

from pylib.plan.options import DTYPE_BYTES


def torch_dtype(name: str) -> torch.dtype:
    """torch.float32 for "float32", torch.bfloat16 for "bfloat16", ...: a key of `DTYPE_BYTES`."""
    if name not in DTYPE_BYTES:
        raise ValueError(f"dtype={name!r} is not a float dtype name: one of {tuple(DTYPE_BYTES)}")
    return getattr(torch, name)
