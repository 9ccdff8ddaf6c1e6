"""Before a collective communicates, the ranks of its group check that they agree on what they are about to do.

A collective whose ranks disagree fails badly: gloo sums a float32 tensor on one rank with an int32 tensor on
another and returns garbage, or aborts the whole process ("Received data size doesn't match expected size") on
mismatched sizes; NCCL hangs. So every collective in `pylib.runtime.collectives` first all-gathers a small
descriptor of its call -- which op, its dtype and shape, its dim / reduce op, the row counts of an uneven op --
and every rank raises the same ValueError naming each rank's value when they differ:

    all_reduce_ over world (ranks [0, 1]): the ranks disagree on the dtype: rank 0 float32, rank 1 int32

    agreement_check(False)            # switch it off in this rank (returns the previous setting)
    with agreement_check(False): ...  # or for a block

Called in the caller before `launch`, the setting reaches gloo's ranks too (they are forked from the caller).
Default (`None`): on under gloo (the CPU ranks of the tests, the labs and the book), off under NCCL, where the
extra collective would cost real latency on every call. The check is one all-gather of `descriptor_length(n)`
int64 values per collective; `bench/reliability.py` measures what it costs. It is not traced (it moves no model
data). Point-to-point ops are not checked (a send has no collective partner to compare with).
"""

from __future__ import annotations

import contextlib
import zlib

import torch
import torch.distributed as dist

from . import compat

_MAX_TENSORS, _MAX_DIMS, _MAX_PARAMS = 3, 8, 3
_REDUCE_OPS = ("sum", "avg", "max", "min")
_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
)


class _Setting:
    enabled: bool | None = None  # None: on under gloo, off under NCCL


_setting = _Setting()


class agreement_check(contextlib.ContextDecorator):
    """Switch the cross-rank check on (True), off (False) or back to the default (None: on under gloo only).

    Takes effect at once in this process; as a context manager the previous setting returns when the block ends."""

    def __init__(self, enabled: bool | None = True):
        if enabled not in (True, False, None):
            raise TypeError(f"agreement_check takes True, False or None (the default), not {enabled!r}")
        self.previous = _setting.enabled
        _setting.enabled = enabled

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _setting.enabled = self.previous
        return False


def is_checking() -> bool:
    """Whether collectives check agreement now (the setting, or the default for this rank's backend)."""
    if _setting.enabled is not None:
        return _setting.enabled
    return dist.is_initialized() and dist.get_backend() == "gloo"


def descriptor_length(n: int) -> int:
    """int64 values in one descriptor for a group of n ranks: op, params, per tensor (dtype, ndim, dims), and the
    row counts of uneven ops (sizes, input splits, output splits)."""
    return 1 + _MAX_PARAMS + _MAX_TENSORS * (2 + _MAX_DIMS) + 3 * n


_KNOWN_OPS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all_tensor",
    "all_to_all_rows",
    "all_gather_rows",
    "reduce_scatter_rows",
    "ring_attention",
)
_OP_NAMES: dict[int, str] = {}


def _op_code(op: str) -> int:
    code = zlib.crc32(op.encode()) & 0x7FFFFFFF
    _OP_NAMES.setdefault(code, op)
    return code


for _name in _KNOWN_OPS:
    _op_code(_name)


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else 99


def _dtype_name(code: int) -> str:
    return str(_DTYPES[code]).replace("torch.", "") if 0 <= code < len(_DTYPES) else "another dtype"


def _encode(op, n, tensors, params, sizes, in_splits, out_splits) -> list[int]:
    desc = [_op_code(op)] + list(params) + [-1] * (_MAX_PARAMS - len(params))
    for i in range(_MAX_TENSORS):
        if i < len(tensors):
            t = tensors[i]
            dims = list(t.shape)[:_MAX_DIMS]
            desc += [_dtype_code(t.dtype), t.dim(), *dims, *([-1] * (_MAX_DIMS - len(dims)))]
        else:
            desc += [-1] * (2 + _MAX_DIMS)
    for rows in (sizes, in_splits, out_splits):
        desc += list(rows) if rows is not None else [-1] * n
    return desc


class _Call:
    """One rank's decoded descriptor."""

    def __init__(self, row: list[int], n: int):
        self.op = row[0]
        self.params = row[1 : 1 + _MAX_PARAMS]
        at = 1 + _MAX_PARAMS
        self.tensors = []
        for _ in range(_MAX_TENSORS):
            dtype, ndim, dims = row[at], row[at + 1], row[at + 2 : at + 2 + _MAX_DIMS]
            if dtype != -1:
                self.tensors.append((dtype, tuple(dims[: min(ndim, _MAX_DIMS)])))
            at += 2 + _MAX_DIMS
        self.sizes, self.in_splits, self.out_splits = (row[at + k * n : at + (k + 1) * n] for k in range(3))


def _disagree(who: str, ranks, what: str, values: list[str]) -> ValueError:
    per_rank = ", ".join(f"rank {r} {v}" for r, v in zip(ranks, values))
    return ValueError(f"{who} over {ranks}: the ranks disagree on {what}: {per_rank}")


def agree(
    who: str,
    g,
    tensors,
    *,
    kind: str | None = None,
    params=(),
    param_names=(),
    rows_only: bool = False,
    sizes=None,
    in_splits=None,
    out_splits=None,
) -> None:
    """Raise ValueError on every rank of AxisGroup `g` unless they all make the same call.

    Compared: the op (`kind`, default `who`: the name the message uses); `params` (small ints, e.g. dim, reduce
    op; named by `param_names`); each tensor's dtype and shape (only the dims after the first with `rows_only`,
    for uneven row ops); `sizes` equal on every rank; and for an uneven all-to-all, rank i's out_splits[j] ==
    rank j's in_splits[i]."""
    if g.size == 1 or not is_checking():
        return
    n = g.size
    device = tensors[0].device if tensors else torch.device("cpu")
    desc = _encode(kind or who, n, tensors, params, sizes, in_splits, out_splits)
    mine = torch.tensor(desc, dtype=torch.int64, device=device)  # on the rank's device: NCCL moves no CPU tensor
    gathered = torch.empty(n * mine.numel(), dtype=torch.int64, device=device)
    compat.all_gather_into(gathered, mine, group=g.pg)
    calls = [_Call(row, n) for row in gathered.view(n, -1).cpu().tolist()]
    ranks = list(g.ranks)
    if len({c.op for c in calls}) > 1:
        names = [_OP_NAMES.get(c.op, "another collective") for c in calls]
        raise _disagree(who, ranks, "which collective to call (or call them in a different order)", names)
    for k, name in enumerate(param_names):
        if len({c.params[k] for c in calls}) > 1:
            shown = [_param_text(name, c.params[k]) for c in calls]
            raise _disagree(who, ranks, name, shown)
    for i in range(len(tensors)):
        label = "" if len(tensors) == 1 else f" of tensor {i}"
        if len({c.tensors[i][0] for c in calls}) > 1:
            raise _disagree(who, ranks, "the dtype" + label, [_dtype_name(c.tensors[i][0]) for c in calls])
        shapes = [c.tensors[i][1][1:] if rows_only else c.tensors[i][1] for c in calls]
        if len(set(shapes)) > 1:
            what = ("the shape after dim 0" if rows_only else "the shape") + label
            raise _disagree(who, ranks, what, [str(tuple(c.tensors[i][1])) for c in calls])
    if sizes is not None and len({tuple(c.sizes) for c in calls}) > 1:
        raise _disagree(who, ranks, "the row counts `sizes`", [str(c.sizes) for c in calls])
    if in_splits is not None:
        for i, ci in enumerate(calls):
            for j, cj in enumerate(calls):
                if ci.out_splits[j] != cj.in_splits[i]:
                    raise ValueError(
                        f"{who} over {ranks}: rank {ranks[i]} expects {ci.out_splits[j]} rows from rank {ranks[j]} "
                        f"(its output_splits[{j}]), but rank {ranks[j]} sends it {cj.in_splits[i]} "
                        f"(its input_splits[{i}])"
                    )


def _param_text(name: str, value: int) -> str:
    if name == "reduce op":
        return repr(_REDUCE_OPS[value]) if 0 <= value < len(_REDUCE_OPS) else "?"
    return str(value)


def reduce_code(op: str) -> int:
    return _REDUCE_OPS.index(op)
