"""Every torch from 2.6 to 2.13 on the GPU path: the one place that asks which torch this is.

The CPU path pins torch==2.13.0 (requirements.txt); a GPU hub ships whatever CUDA torch its image has. pylib is
written against torch 2.6's public API (`tests/test_torch_range.py` checks every `torch.*` name pylib and bench
use against the committed list of 2.6's names, tests/data/torch26_api.txt). Where a newer torch renamed
something, this module calls the new name when the installed torch has it and the 2.6 one otherwise; nothing
else in pylib branches on torch's version or on `hasattr` of a torch API.

    name in pylib                  torch >= 2.13                    torch 2.6 .. 2.12
    -----------------------------  -------------------------------  ----------------------------------------
    all_gather_into(out, x)        dist.all_gather_single           dist.all_gather_into_tensor
    reduce_scatter_into(out, x)    dist.reduce_scatter_single       dist.reduce_scatter_tensor

(2.13 deprecates the right-hand names with a FutureWarning, so the new ones are used where they exist.)

The fused attention ops `pylib.cp.kernels` calls (`aten::_scaled_dot_product_flash_attention`,
`_scaled_dot_product_efficient_attention` and their backwards) take the same positional arguments in 2.6 and
2.13; only the names of two unused outputs changed (philox_seed/philox_offset -> rng_state/unused), which a
positional call does not see. `tests/data/torch26_sdpa_schemas.txt` holds 2.6's schemas and a test compares
them with the installed torch's.

`POST_26_APIS` lists every newer name used here, so a test can delete them from torch and run the 2.6 path.
"""

from __future__ import annotations

import re

import torch
import torch.distributed as dist

SUPPORTED = ((2, 6), (2, 13))  # the oldest and newest (major, minor) the GPU path is written for

POST_26_APIS = (
    ("torch.distributed", "all_gather_single"),
    ("torch.distributed", "reduce_scatter_single"),
)


def torch_version(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of the installed torch, or of `version` ("2.11.0+cu128" -> (2, 11))."""
    text = torch.__version__ if version is None else version
    m = re.match(r"(\d+)\.(\d+)", str(text))
    if not m:
        raise ValueError(f"cannot read a torch version from {text!r}")
    return int(m.group(1)), int(m.group(2))


def unsupported_reason(version: str | None = None) -> str | None:
    """None when torch (or `version`) is in the supported range, else a sentence saying why not."""
    v = torch_version(version)
    lo, hi = SUPPORTED
    if v < lo:
        return f"torch {v[0]}.{v[1]} is older than {lo[0]}.{lo[1]}, the oldest the GPU path supports"
    if v > hi:
        return f"torch {v[0]}.{v[1]} is newer than {hi[0]}.{hi[1]}, the newest the GPU path was checked against"
    return None


def all_gather_into(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False):
    """Every rank's `input` concatenated along dim 0 into `output` (n times input's numel), in group order."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(output, input, group=group, async_op=async_op)


def reduce_scatter_into(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False):
    """Sum `input` (n blocks along dim 0) over the group; this rank's block lands in `output`."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(output, input, group=group, async_op=async_op)
