"""Every collective and point-to-point op in pylib, traced and (where it carries activations) autograd-aware.

Each autograd op is one small `torch.autograd.Function` whose backward is the *conjugate* collective -- the
Megatron `mappings.py` idea. Read the table once and tensor, sequence, context and expert parallelism become
plain linear algebra with one named crossing at each end:

    function                forward                 backward               used by
    ----------------------  ----------------------  ---------------------  -------------------------------------
    copy_to_group           identity                all-reduce (sum)       TP: entering a column-parallel region (f)
    reduce_from_group       all-reduce (sum)        identity               TP: leaving a row-parallel region (g)
    split_to_group          keep my chunk of dim    all-gather dim         scatter a replicated tensor
    gather_from_group       all-gather dim          keep my chunk of dim   gather for a replicated consumer
    all_gather              all-gather dim          reduce-scatter dim     SP: entering the TP region; ZeRO-3
    reduce_scatter          reduce-scatter dim      all-gather dim         SP: leaving the TP region
    all_to_all              scatter a, gather b     scatter b, gather a    Ulysses
    all_to_all_uneven       rows by split sizes     the reverse splits     EP dispatch / combine
    all_to_all_uneven_async the same, waited later  the same, async too    EP under another micro-batch's compute
    all_gather_uneven       all-gather rows, sizes  reduce-scatter rows    ETP: expert rows into the ETP group
    reduce_scatter_uneven   reduce-scatter rows     all-gather rows        ETP: partial expert outputs back out

Why these pairs: if forward is y = A x for a linear communication map A, backward is dx = A^T dy. Copying one
tensor to n ranks (identity on each) has as transpose the sum of the n gradients; splitting has as transpose
concatenation; all-gather's transpose is reduce-scatter, since each rank's gathered output feeds a different
computation whose gradients must be summed before each rank keeps its own chunk.

`split_to_group` vs `reduce_scatter` (and `gather_from_group` vs `all_gather`) differ in what the *other* ranks
do with the tensor: use gather_from_group when every rank continues with the same replicated computation (its
gradient is then already identical everywhere), all_gather when each rank's computation after the gather differs.

Raw (non-autograd) ops for gradients and point-to-point: `all_reduce_`, `all_gather_tensor`,
`reduce_scatter_tensor`, `all_gather_rows`, `reduce_scatter_rows`, `send`, `recv`, `isend`, `irecv`,
`batch_isend_irecv`; asynchronous `all_reduce_async` and `reduce_scatter_async` return a `CollectiveWork` to wait
on (DDP's gradient buckets overlap with backward), `all_to_all_rows_async` an `AllToAllWork` that also stamps its
wait. `all_to_all_uneven_async` is the autograd-aware one: issued now, waited for later (`PendingRows.wait()`), its
conjugate issued in backward where the forward waited and waited for where the forward issued (EP's dispatch and
combine under another micro-batch's compute, `pylib.ep.overlap`).

`group` is an `AxisGroup` from `Mesh` or None for the whole world. A group of one rank is the identity and
records nothing. pylib never calls torch.distributed collectives anywhere else, so the tracer sees everything.

Agreement: before it communicates, every collective checks that the ranks of its group make the same call (op,
dtype, shape, dim or reduce op, row counts) and raises the same ValueError on each rank, naming every rank's value,
when they do not: on by default under gloo, switched with `agreement_check(False)` (see `pylib.runtime.agreement`).
Once a group's calls repeat in a learned order, a call that order predicts costs no communication; the split sizes
`exchange_splits` derives from an all-to-all of counts (`ExchangedSplits`) agree by construction and are not checked
again, nor are the row counts `gather_sizes` sums from an all-gather of counts (`GatheredSizes`); raw lists are.

Devices: every tensor an op sends or receives must be on `pylib.runtime.current_device()` -- the rank's GPU under
NCCL, the CPU under gloo -- and each op checks it before communicating, naming the op and both devices. Buffers
the ops allocate take the device of the tensor they were given.
"""

from __future__ import annotations

import functools
import inspect
import math
import threading
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from . import clock, compat, tracer
from .agreement import agree, reduce_code
from .launch import current_device
from .mesh import AxisGroup

# --------------------------------------------------------------------------------------------------- groups


def resolve_group(group) -> AxisGroup:
    """None -> the whole world; an AxisGroup passes through; a raw torch ProcessGroup is wrapped."""
    if isinstance(group, AxisGroup):
        return group
    if not dist.is_initialized():
        raise RuntimeError("collectives need a launched rank (torch.distributed is not initialised)")
    if group is None:
        world = dist.get_world_size()
        return AxisGroup("world", tuple(range(world)), dist.get_rank(), dist.group.WORLD if world > 1 else None)
    ranks = tuple(dist.get_process_group_ranks(group))
    return AxisGroup("group", ranks, ranks.index(dist.get_rank()), group)


def group_size(group=None) -> int:
    return resolve_group(group).size


# --------------------------------------------------------------------------------------------------- tracing


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _record(op, g: AxisGroup, payload, sent, recv, tensors, t0, peer=None, phase=None, tag=None, **extra):
    if not tracer.is_tracing():
        return None
    ev = tracer.CommEvent(
        op=op,
        axis=g.name,
        group=g.ranks,
        rank=g.global_rank,
        payload_bytes=int(payload),
        bytes_sent=int(sent),
        bytes_recv=int(recv),
        shapes=tuple(tuple(t.shape) for t in tensors),
        dtype=str(tensors[0].dtype).replace("torch.", "") if tensors else "",
        phase=phase or tracer.current_phase(),
        tag=tag if tag is not None else tracer.current_tag(),
        peer=peer,
        t_start=t0,
        t_end=tracer.now(),
        extra=extra,
    )
    tracer.record(ev)
    return ev


def _ranged(what: str):
    """Under a profile (`pylib.runtime.profile`), run the op inside a profiler range named as the tracer names it
    (`tracer.span_name`: "all_reduce@tp | layers.0.mlp | forward"); with no profile open, call it as it is (the
    cost: one attribute read). The range covers the op's agreement check and its communication; an async op's
    ("all_reduce_async", "isend") covers the launch, and its wait gets a range of its own ("wait all_reduce")."""

    def wrap(fn):
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def ranged(*args, **kwargs):
            span = tracer.active_span()
            if span is None:
                return fn(*args, **kwargs)
            given = sig.bind(*args, **kwargs).arguments
            g = resolve_group(given.get("group"))
            if g.size == 1:
                return fn(*args, **kwargs)
            with span(_span_name(what, g, given.get("phase"), given.get("tag"))):
                return fn(*args, **kwargs)

        return ranged

    return wrap


def _span_name(what: str, g: AxisGroup, phase, tag) -> str:
    tag = tag if tag is not None else tracer.current_tag()
    return tracer.span_name(f"{what}@{g.name}", tag, phase or tracer.current_phase())


def _wait_span(name):
    """The profiler range a wait runs in: the name given at launch (None when no profile was open then)."""
    span = tracer.active_span()
    return nullcontext() if span is None or name is None else span(name)


def _on_rank_device(op: str, *tensors: torch.Tensor) -> None:
    """Every tensor a collective touches must be on this rank's device (its GPU under NCCL, else the CPU).

    NCCL's own error for a CPU tensor ("No backend type associated with device type cpu") does not say which
    tensor; this says which op, which device and where it should be. Checked only when the op communicates."""
    want = current_device()
    for t in tensors:
        if t.device != want:
            raise ValueError(
                f"{op}: a tensor {tuple(t.shape)} is on {t.device}, but this rank computes on {want} "
                f"({dist.get_backend()}): create it with device=pylib.runtime.current_device() or move it with .to()"
            )


_CPU = torch.device("cpu")
_P2P_DEVICE: list = [None, None]  # [the default process group, the device type current_device() gave under it]


def _on_p2p_device(op: str, *tensors: torch.Tensor) -> None:
    """`_on_rank_device` for the point-to-point ops, which a pipeline step calls tens of times: the same check and
    message, with `current_device()`'s backend lookup made once per default process group (a new group, after
    destroy and init, looks again; a CUDA rank's GPU index is read on every call, since set_device may move it)."""
    world = dist.GroupMember.WORLD
    if _P2P_DEVICE[0] is not world:
        _P2P_DEVICE[:] = [world, current_device().type]
    want = torch.device("cuda", torch.cuda.current_device()) if _P2P_DEVICE[1] == "cuda" else _CPU
    if any(t.device != want for t in tensors):
        _on_rank_device(op, *tensors)  # the full check: it raises, naming the op and both devices


def _check_divisible(size: int, n: int, what: str):
    if size % n:
        raise ValueError(f"{what}: size {size} is not divisible by the group size {n}")


def _member_chunks(t: torch.Tensor, dim: int, n: int) -> torch.Tensor:
    """[n, *chunk shape], contiguous: chunk j of `dim` (the block for group member j) is row j.

    Along dim 0 of a contiguous tensor the chunks already are those rows (a view, no copy); otherwise they are
    stacked into a new buffer."""
    if dim == 0 and t.is_contiguous():
        return t.view(n, t.shape[0] // n, *t.shape[1:])
    return torch.stack(t.chunk(n, dim=dim)).contiguous()


# --------------------------------------------------------------------------------------------------- raw ops


_REDUCE = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def _check_reduce_op(who: str, op, t: torch.Tensor) -> None:
    """op is one of sum, avg (sum, then divided by n), max, min; an average needs a floating or complex tensor."""
    if op not in _REDUCE:
        raise ValueError(f"{who}: op={op!r} must be one of {list(_REDUCE)}")
    if op == "avg" and not (t.is_floating_point() or t.is_complex()):
        raise ValueError(
            f"{who}: op='avg' of a {str(t.dtype).replace('torch.', '')} tensor: the average of integers is not an "
            "integer; all-reduce with op='sum' and divide in floating point"
        )


@_ranged("all_reduce")
def all_reduce_(t: torch.Tensor, group=None, *, op: str = "sum", phase=None, tag=None) -> torch.Tensor:
    """In-place all-reduce (sum, avg, max or min) of `t` over `group`. Payload S = bytes of t; moves 2(n-1)/n*S."""
    g = resolve_group(group)
    _check_reduce_op("all_reduce_", op, t)
    if g.size == 1:
        return t
    if not t.is_contiguous():
        raise ValueError(f"all_reduce_ works in place and needs a contiguous tensor (shape {tuple(t.shape)})")
    _on_rank_device("all_reduce_", t)
    agree("all_reduce_", g, [t], kind="all_reduce", params={"reduce op": reduce_code(op)})
    t0 = tracer.now()
    dist.all_reduce(t, op=_REDUCE[op], group=g.pg)
    if op == "avg":
        t.div_(g.size)
    s = _nbytes(t)
    moved = 2 * (g.size - 1) * s // g.size
    _record("all_reduce", g, s, moved, moved, [t], t0, phase=phase, tag=tag, reduce_op=op)
    return t


@_ranged("all_gather")
def all_gather_tensor(t: torch.Tensor, dim: int = 0, group=None, *, phase=None, tag=None) -> torch.Tensor:
    """Concatenate every rank's `t` along `dim`, in group order. Payload S = output bytes; moves (n-1)/n*S."""
    g = resolve_group(group)
    if g.size == 1:
        return t
    _on_rank_device("all_gather_tensor", t)
    agree("all_gather_tensor", g, [t], kind="all_gather", params={"dim": dim}, dims_of_first=1)
    t0 = tracer.now()
    t_c = t.contiguous()
    flat = torch.empty(g.size * t_c.numel(), dtype=t.dtype, device=t.device)
    compat.all_gather_into(flat, t_c.view(-1), group=g.pg)
    out = torch.cat(flat.view(g.size, *t_c.shape).unbind(0), dim=dim)
    s = _nbytes(out)
    moved = (g.size - 1) * _nbytes(t_c)
    _record("all_gather", g, s, moved, moved, [t], t0, phase=phase, tag=tag, dim=dim)
    return out


@_ranged("reduce_scatter")
def reduce_scatter_tensor(t: torch.Tensor, dim: int = 0, group=None, *, phase=None, tag=None) -> torch.Tensor:
    """Sum `t` over the group and keep this rank's chunk of `dim`. Payload S = input bytes; moves (n-1)/n*S."""
    g = resolve_group(group)
    if g.size == 1:
        return t
    _on_rank_device("reduce_scatter_tensor", t)
    agree("reduce_scatter_tensor", g, [t], kind="reduce_scatter", params={"dim": dim}, dims_of_first=1)
    _check_divisible(t.shape[dim], g.size, f"reduce-scatter along dim {dim} of shape {tuple(t.shape)}")
    t0 = tracer.now()
    stacked = _member_chunks(t, dim, g.size)  # [n, ...]: chunk j goes to member j
    out = torch.empty(stacked.shape[1:], dtype=t.dtype, device=t.device)
    compat.reduce_scatter_into(out.view(-1), stacked.view(-1), group=g.pg)
    s = _nbytes(t)
    moved = (g.size - 1) * s // g.size
    _record("reduce_scatter", g, s, moved, moved, [t], t0, phase=phase, tag=tag, dim=dim)
    return out


@_ranged("all_to_all")
def all_to_all_tensor(t, scatter_dim: int, gather_dim: int, group=None, *, phase=None, tag=None) -> torch.Tensor:
    """Split `t` into n chunks along scatter_dim, send chunk j to rank j, concatenate what arrives along
    gather_dim (in group order). Moves (n-1)/n of the input out and (n-1)/n of the output in."""
    g = resolve_group(group)
    if g.size == 1:
        return t
    _on_rank_device("all_to_all_tensor", t)
    dims = {"scatter_dim": scatter_dim, "gather_dim": gather_dim}
    agree("all_to_all_tensor", g, [t], params=dims, dims_of_first=2)
    _check_divisible(t.shape[scatter_dim], g.size, f"all-to-all scatter dim {scatter_dim} of shape {tuple(t.shape)}")
    t0 = tracer.now()
    send = _member_chunks(t, scatter_dim, g.size)  # [n, ...]: chunk j goes to member j
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv.view(-1), send.view(-1), group=g.pg)
    out = torch.cat(recv.unbind(0), dim=gather_dim)
    s = _nbytes(t)
    moved = (g.size - 1) * s // g.size
    _record(
        "all_to_all", g, s, moved, moved, [t], t0, phase=phase, tag=tag, scatter_dim=scatter_dim, gather_dim=gather_dim
    )
    return out


@dataclass(frozen=True)
class ExchangedSplits:
    """The split sizes of an uneven all-to-all that agree by construction: `output[j]` is what member j counted
    for this rank and sent it in the all-to-all of counts (`exchange_splits`), `input[j]` what this rank counted
    for j, so every rank expects from each peer the rows that peer sends. `all_to_all_rows` skips the split check
    for them (the check would find them equal); `swapped()` is the reverse exchange (the combine, the backward).
    Only `exchange_splits` makes them: one built by hand would be trusted the same way, unchecked."""

    output: tuple[int, ...]
    input: tuple[int, ...]
    pg: object = field(compare=False, repr=False)

    def swapped(self) -> ExchangedSplits:
        return ExchangedSplits(self.input, self.output, self.pg)


@dataclass(frozen=True)
class GatheredSizes:
    """The row counts of an uneven all-gather / reduce-scatter that agree by construction: `sizes[j]` is the sum of
    member j's block of an all-gather of counts over the group (`gather_sizes`), so every member computed the same
    list from the same gathered bytes. `all_gather_rows` and `reduce_scatter_rows` skip the row-count check for
    them (it would find them equal); each member still checks its own rows against its entry before sending.
    Only `gather_sizes` makes them: one built by hand would be trusted the same way, unchecked."""

    sizes: tuple[int, ...]
    pg: object = field(compare=False, repr=False)


def _splits_of(output_splits, input_splits, g: AxisGroup) -> tuple[list[int], list[int], bool]:
    """(output, input, exchanged): raw lists as given, or an `ExchangedSplits` of this group's process group."""
    if not isinstance(output_splits, ExchangedSplits):
        if input_splits is None:
            raise ValueError("all-to-all: give output_splits and input_splits, or one ExchangedSplits")
        return [int(v) for v in output_splits], [int(v) for v in input_splits], False
    if input_splits is not None:
        raise ValueError("all-to-all: an ExchangedSplits holds both directions; give no input_splits with it")
    if output_splits.pg is not g.pg:
        raise ValueError(f"all-to-all over {g.name}: these ExchangedSplits were exchanged over another group")
    return list(output_splits.output), list(output_splits.input), True


def _checked_splits(who: str, t, output_splits, input_splits, g: AxisGroup) -> tuple[list[int], list[int]]:
    """An uneven all-to-all's split lists (raw, or an `ExchangedSplits`), checked against the group and `t`, then
    agreed across the ranks (`agree`: exchanged splits agree by construction, raw ones are compared)."""
    output_splits, input_splits, exchanged = _splits_of(output_splits, input_splits, g)
    if len(input_splits) != g.size or len(output_splits) != g.size:
        raise ValueError(
            f"all-to-all needs {g.size} split sizes, got {len(input_splits)} in / {len(output_splits)} out"
        )
    if sum(input_splits) != t.shape[0]:
        raise ValueError(f"input split sizes {input_splits} sum to {sum(input_splits)}, tensor has {t.shape[0]} rows")
    if g.size == 1:
        return output_splits, input_splits
    _on_rank_device(who, t)
    if exchanged:
        agree(who, g, [t], rows_only=True, params={"exchanged splits": 1})
    else:
        raw = {"exchanged splits": 0}  # in the key: a rank with raw splits and one with exchanged ones differ
        agree(who, g, [t], rows_only=True, params=raw, in_splits=input_splits, out_splits=output_splits)
    return output_splits, input_splits


def _start_all_to_all(t, output_splits, input_splits, g: AxisGroup, phase, tag, async_op: bool):
    """Issue the exchange and record it (bytes to and from other ranks, exactly): (out, work, event, t_c, t0)."""
    t0 = tracer.now()
    t_c = t.contiguous()
    out = torch.empty((sum(output_splits), *t.shape[1:]), dtype=t.dtype, device=t.device)
    work = dist.all_to_all_single(
        out, t_c, output_split_sizes=output_splits, input_split_sizes=input_splits, group=g.pg, async_op=async_op
    )
    row = math.prod(t_c.shape[1:]) * t_c.element_size()
    sent = row * (sum(input_splits) - input_splits[g.rank])
    recv = row * (sum(output_splits) - output_splits[g.rank])
    extra = {"is_async": True} if async_op else {}
    splits = {"input_splits": input_splits, "output_splits": output_splits}
    ev = _record("all_to_all", g, _nbytes(t_c), sent, recv, [t], t0, phase=phase, tag=tag, **splits, **extra)
    return out, work, ev, t_c, t0


@_ranged("all_to_all")
def all_to_all_rows(t, output_splits, input_splits=None, group=None, *, phase=None, tag=None) -> torch.Tensor:
    """Uneven all-to-all along dim 0: rows [sum(input_splits[:j]), ...+input_splits[j]) go to group member j;
    `output_splits[j]` rows arrive from member j. Bytes counted exactly (rows to/from other ranks).
    `output_splits` may be an `ExchangedSplits` (then no input_splits): both directions, agreed by construction."""
    g = resolve_group(group)
    output_splits, input_splits = _checked_splits("all_to_all_rows", t, output_splits, input_splits, g)
    if g.size == 1:
        return t
    return _start_all_to_all(t, output_splits, input_splits, g, phase, tag, async_op=False)[0]


def _row_sizes(sizes, g: AxisGroup, what: str) -> tuple[list[int], bool]:
    """(sizes as ints, gathered): a raw list as given, or a `GatheredSizes` of this group's process group."""
    gathered = isinstance(sizes, GatheredSizes)
    if gathered and sizes.pg is not g.pg:
        raise ValueError(f"{what} over {g.name}: these GatheredSizes were gathered over another group")
    sizes = [int(v) for v in (sizes.sizes if gathered else sizes)]
    if len(sizes) != g.size:
        raise ValueError(f"{what} needs {g.size} row counts (one per group member), got {len(sizes)}")
    return sizes, gathered


def _agree_rows(who: str, g: AxisGroup, t: torch.Tensor, sizes: list[int], gathered: bool) -> None:
    """The cross-rank check of an uneven all-gather / reduce-scatter: gathered sizes agree by construction (only the
    op, dtype and row shape are compared, a call the group's verified order predicts costs nothing), raw ones are
    compared on every call. Whether they were gathered is part of the call: a rank with raw sizes and one with
    gathered ones differ."""
    if gathered:
        agree(who, g, [t], rows_only=True, params={"gathered sizes": 1})
    else:
        agree(who, g, [t], rows_only=True, params={"gathered sizes": 0}, sizes=sizes)


def _padded_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """t with zero rows appended up to `rows` rows (collectives move equal-sized blocks)."""
    if t.shape[0] == rows:
        return t.contiguous()
    pad = torch.zeros((rows - t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
    return torch.cat([t, pad]).contiguous()


@_ranged("all_gather")
def all_gather_rows(t: torch.Tensor, sizes, group=None, *, phase=None, tag=None) -> torch.Tensor:
    """Uneven all-gather along dim 0: member j holds sizes[j] rows; every member gets all of them, in group order.
    `sizes` may be a `GatheredSizes` (from `gather_sizes`): agreed by construction, not checked again.

    Payload S = bytes of the gathered output. Bytes counted as the ring algorithm moves them with blocks of
    different sizes: member r receives every block but its own (S - S_r) and forwards every block but its
    successor's (S - S_{r+1}); with equal blocks both are (n-1)/n*S, as for all_gather_tensor."""
    g = resolve_group(group)
    sizes, gathered = _row_sizes(sizes, g, "all_gather_rows")
    if t.shape[0] != sizes[g.rank]:
        raise ValueError(f"all_gather_rows: this member holds {t.shape[0]} rows but sizes[{g.rank}] = {sizes[g.rank]}")
    if g.size == 1:
        return t
    _on_rank_device("all_gather_rows", t)
    _agree_rows("all_gather_rows", g, t, sizes, gathered)
    t0 = tracer.now()
    most = max(sizes)
    flat = torch.empty((g.size * most, *t.shape[1:]), dtype=t.dtype, device=t.device)
    compat.all_gather_into(flat.view(-1), _padded_rows(t, most).view(-1), group=g.pg)
    blocks = flat.view(g.size, most, *t.shape[1:])
    out = torch.cat([blocks[j, : sizes[j]] for j in range(g.size)])
    row = math.prod(t.shape[1:]) * t.element_size()
    total = row * sum(sizes)
    sent = total - row * sizes[(g.rank + 1) % g.size]
    recv = total - row * sizes[g.rank]
    _record("all_gather", g, total, sent, recv, [t], t0, phase=phase, tag=tag, sizes=sizes)
    return out


@_ranged("reduce_scatter")
def reduce_scatter_rows(t: torch.Tensor, sizes, group=None, *, phase=None, tag=None) -> torch.Tensor:
    """Uneven reduce-scatter along dim 0: `t` has sum(sizes) rows on every member; member j gets rows
    [sum(sizes[:j]), ... + sizes[j]) summed over the group. `sizes` may be a `GatheredSizes` (not checked again).

    Payload S = bytes of the input. Ring bytes: member r sends every partial block but its own (S - S_r) and
    receives every block but its predecessor's (S - S_{r-1}); with equal blocks both are (n-1)/n*S."""
    g = resolve_group(group)
    sizes, gathered = _row_sizes(sizes, g, "reduce_scatter_rows")
    if t.shape[0] != sum(sizes):
        raise ValueError(f"reduce_scatter_rows: input has {t.shape[0]} rows but sizes {sizes} sum to {sum(sizes)}")
    if g.size == 1:
        return t
    _on_rank_device("reduce_scatter_rows", t)
    _agree_rows("reduce_scatter_rows", g, t, sizes, gathered)
    t0 = tracer.now()
    most = max(sizes)
    stacked = torch.stack([_padded_rows(b, most) for b in t.split(sizes)]).contiguous()  # [n, most, ...]
    out = torch.empty((most, *t.shape[1:]), dtype=t.dtype, device=t.device)
    compat.reduce_scatter_into(out.view(-1), stacked.view(-1), group=g.pg)
    out = out[: sizes[g.rank]]
    row = math.prod(t.shape[1:]) * t.element_size()
    total = row * sum(sizes)
    sent = total - row * sizes[g.rank]
    recv = total - row * sizes[(g.rank - 1) % g.size]
    _record("reduce_scatter", g, total, sent, recv, [t], t0, phase=phase, tag=tag, sizes=sizes)
    return out


@_ranged("send")
def send(t: torch.Tensor, dst: int, group=None, *, phase=None, tag=None) -> None:
    """Blocking send of `t` to group member `dst` (an index into the group)."""
    g = resolve_group(group)
    _on_p2p_device("send", t)
    t0 = tracer.now()
    dist.send(t.contiguous(), dst=g.global_of(dst))
    _record("send", g, _nbytes(t), _nbytes(t), 0, [t], t0, peer=g.global_of(dst), phase=phase, tag=tag)


@_ranged("recv")
def recv(t: torch.Tensor, src: int, group=None, *, phase=None, tag=None) -> torch.Tensor:
    """Blocking receive into `t` from group member `src`; returns `t`."""
    g = resolve_group(group)
    _on_p2p_device("recv", t)
    t0 = tracer.now()
    dist.recv(t, src=g.global_of(src))
    _record("recv", g, _nbytes(t), 0, _nbytes(t), [t], t0, peer=g.global_of(src), phase=phase, tag=tag)
    return t


class P2PWork:
    """A posted isend/irecv. `wait()` blocks until done and completes its trace record (t_end = wait time)."""

    def __init__(self, work, event, tensor, span=None):
        self._work, self.event, self.tensor, self._span = work, event, tensor, span

    def wait(self) -> torch.Tensor:
        if self._work is not None:
            with _wait_span(self._span):
                self._work.wait()
            self._work = None
            if self.event is not None:
                self.event.t_end = tracer.now()
        return self.tensor


def _post(kind: str, t: torch.Tensor, peer: int, g: AxisGroup, phase, tag, work):
    ev = _record(
        kind,
        g,
        _nbytes(t),
        _nbytes(t) if kind == "send" else 0,
        _nbytes(t) if kind == "recv" else 0,
        [t],
        tracer.now(),
        peer=g.global_of(peer),
        phase=phase,
        tag=tag,
    )
    return P2PWork(work, ev, t, _span_name(f"wait {kind}", g, phase, tag) if tracer.active_span() else None)


@_ranged("isend")
def isend(t: torch.Tensor, dst: int, group=None, *, phase=None, tag=None) -> P2PWork:
    g = resolve_group(group)
    _on_p2p_device("isend", t)
    return _post("send", t, dst, g, phase, tag, dist.isend(t.contiguous(), dst=g.global_of(dst)))


@_ranged("irecv")
def irecv(t: torch.Tensor, src: int, group=None, *, phase=None, tag=None) -> P2PWork:
    g = resolve_group(group)
    _on_p2p_device("irecv", t)
    return _post("recv", t, src, g, phase, tag, dist.irecv(t, src=g.global_of(src)))


@_ranged("batch_isend_irecv")
def batch_isend_irecv(ops, group=None, *, phase=None, tag=None) -> list[P2PWork]:
    """Post several sends and receives together. `ops` is a list of ("send"|"recv", tensor, peer index).

    Posting both directions at once is what lets a ring (or a pipeline) exchange without deadlock: no rank
    blocks in a send while its neighbour blocks in its own send."""
    g = resolve_group(group)
    _on_p2p_device("batch_isend_irecv", *(t for _, t, _ in ops))
    p2p = []
    for kind, t, peer in ops:
        fn = dist.isend if kind == "send" else dist.irecv
        p2p.append(dist.P2POp(fn, t if kind == "recv" else t.contiguous(), g.global_of(peer), group=g.pg))
    works = dist.batch_isend_irecv(p2p) if p2p else []
    if len(works) != len(p2p):  # some backends return one work for the whole batch
        works = [works[0]] + [None] * (len(p2p) - 1) if works else [None] * len(p2p)
    return [_post(kind, t, peer, g, phase, tag, w) for (kind, t, peer), w in zip(ops, works)]


# --------------------------------------------------------------------------------------------------- async ops


class CollectiveWork:
    """A collective launched with `async_op=True`: the backend moves the data on its own thread while this rank
    keeps computing (the overlap that DDP's gradient buckets rely on).

    `wait()` blocks until the data has arrived, runs the local epilogue (e.g. the division of an average) and
    returns the result. `t_launch` is when it was issued, `t_done` when the backend reported completion (its
    future's callback; the wait itself when the backend offers none). The trace record gets the same two times,
    so a timeline drawn from the trace shows when the bytes really moved, not when somebody waited for them."""

    def __init__(self, work, event, result, epilogue=None, t_launch=None):
        self._work, self.event, self._result, self._epilogue = work, event, result, epilogue
        self.span = None  # the profiler range name of its wait (set at launch while a profile is open)
        self.t_launch = tracer.now() if t_launch is None else t_launch
        self.t_done = None if work is not None else self.t_launch
        self._lock = threading.Lock()
        # A CUDA work's future completes when the collective is *queued*, not when its bytes have moved; there the
        # completion time is taken at wait(), once the compute stream holds the result (an upper bound).
        self._on_device = isinstance(result, torch.Tensor) and result.is_cuda
        if work is not None and not self._on_device:
            try:
                work.get_future().add_done_callback(lambda _: self._mark_done())
            except (AttributeError, RuntimeError):  # a backend without futures: completion is seen at wait()
                pass

    def _mark_done(self) -> None:
        with self._lock:
            if self.t_done is None:
                self.t_done = clock.device_now() if self._on_device else tracer.now()
                if self.event is not None:
                    self.event.t_end = self.t_done

    def is_completed(self) -> bool:
        return self._work is None or self._work.is_completed()

    def wait(self) -> torch.Tensor:
        if self._work is not None:
            with _wait_span(self.span):
                self._work.wait()
            self._work = None
            self._mark_done()
            if self._epilogue is not None:
                self._result = self._epilogue()
                self._epilogue = None
        return self._result


@_ranged("all_reduce_async")
def all_reduce_async(t: torch.Tensor, group=None, *, op: str = "sum", phase=None, tag=None) -> CollectiveWork:
    """`all_reduce_` without blocking: returns a `CollectiveWork`; `wait()` returns `t` reduced in place.
    Do not touch `t` until then. Payload S = bytes of t; moves 2(n-1)/n*S (recorded at launch)."""
    g = resolve_group(group)
    if g.size == 1:
        return CollectiveWork(None, None, t)
    if not t.is_contiguous():
        raise ValueError(f"all_reduce_async works in place and needs a contiguous tensor (shape {tuple(t.shape)})")
    _check_reduce_op("all_reduce_async", op, t)
    _on_rank_device("all_reduce_async", t)
    agree("all_reduce_async", g, [t], kind="all_reduce", params={"reduce op": reduce_code(op)})
    t0 = tracer.now()
    work = dist.all_reduce(t, op=_REDUCE[op], group=g.pg, async_op=True)  # avg = sum, then divide after the wait
    s = _nbytes(t)
    moved = 2 * (g.size - 1) * s // g.size
    ev = _record("all_reduce", g, s, moved, moved, [t], t0, phase=phase, tag=tag, reduce_op=op, is_async=True)
    epilogue = (lambda: t.div_(g.size)) if op == "avg" else None
    return _named(CollectiveWork(work, ev, t, epilogue, t0), "all_reduce", g, phase, tag)


@_ranged("reduce_scatter_async")
def reduce_scatter_async(t: torch.Tensor, dim: int = 0, group=None, *, phase=None, tag=None) -> CollectiveWork:
    """`reduce_scatter_tensor` without blocking: `wait()` returns this rank's chunk of `dim` of the group's sum.
    Do not touch `t` until then. Payload S = input bytes; moves (n-1)/n*S (recorded at launch)."""
    g = resolve_group(group)
    if g.size == 1:
        return CollectiveWork(None, None, t)
    _on_rank_device("reduce_scatter_async", t)
    agree("reduce_scatter_async", g, [t], kind="reduce_scatter", params={"dim": dim}, dims_of_first=1)
    _check_divisible(t.shape[dim], g.size, f"reduce-scatter along dim {dim} of shape {tuple(t.shape)}")
    t0 = tracer.now()
    stacked = _member_chunks(t, dim, g.size)  # [n, ...]: chunk j goes to member j
    out = torch.empty(stacked.shape[1:], dtype=t.dtype, device=t.device)
    work = compat.reduce_scatter_into(out.view(-1), stacked.view(-1), group=g.pg, async_op=True)
    s = _nbytes(t)
    moved = (g.size - 1) * s // g.size
    ev = _record("reduce_scatter", g, s, moved, moved, [t], t0, phase=phase, tag=tag, dim=dim, is_async=True)
    return _named(CollectiveWork(work, ev, out, None, t0), "reduce_scatter", g, phase, tag)


def _named(work: CollectiveWork, op: str, g: AxisGroup, phase, tag) -> CollectiveWork:
    """Give an async collective's wait its profiler range name, when a profile is open."""
    if tracer.active_span() is not None:
        work.span = _span_name(f"wait {op}", g, phase, tag)
    return work


# --------------------------------------------------------------------------------------------------- async all-to-all


class AllToAllWork(CollectiveWork):
    """An uneven all-to-all in flight (`all_to_all_rows_async`). Besides `t_launch` (issued) and `t_done` (the
    backend's completion callback) it keeps `t_wait`, when `wait()` returned: the issue-to-wait interval is the
    time the exchange was allowed to run under other work. The trace record gets it as `extra["t_wait"]`."""

    t_wait = None
    keep = None  # the send buffer, held until the exchange is done

    def wait(self) -> torch.Tensor:
        out = super().wait()
        self.keep = None
        if self.t_wait is None:
            self.t_wait = tracer.now()
            if self.event is not None:
                self.event.extra["t_wait"] = self.t_wait
        return out


@_ranged("all_to_all_async")
def all_to_all_rows_async(t, output_splits, input_splits=None, group=None, *, phase=None, tag=None) -> AllToAllWork:
    """`all_to_all_rows` without blocking: returns an `AllToAllWork`; its `wait()` returns the received rows
    [sum(output_splits), ...]. Do not touch `t` until then. Bytes counted as `all_to_all_rows` counts them
    (recorded at launch, `is_async=True`); splits as it takes them (raw, or an `ExchangedSplits`)."""
    g = resolve_group(group)
    output_splits, input_splits = _checked_splits("all_to_all_rows_async", t, output_splits, input_splits, g)
    if g.size == 1:
        return AllToAllWork(None, None, t)
    out, work, ev, t_c, t0 = _start_all_to_all(t, output_splits, input_splits, g, phase, tag, async_op=True)
    work = AllToAllWork(work, ev, out, None, t0)
    work.keep = t_c
    return _named(work, "all_to_all", g, phase, tag)


class PendingRows:
    """An autograd-aware uneven all-to-all in flight (`all_to_all_uneven_async`). `wait()` returns the received
    rows, connected to the graph; call it exactly once. `forward_work` and, once backward reached it,
    `backward_work` are the two exchanges (`AllToAllWork`), for their times."""

    def __init__(self, x, output_splits, input_splits, g: AxisGroup, tag: str):
        if isinstance(output_splits, ExchangedSplits):  # agreed by construction, and so is the reverse exchange
            self.splits, self.reverse = (output_splits, None), (output_splits.swapped(), None)
        else:
            self.splits = (list(output_splits), list(input_splits))
            self.reverse = self.splits[::-1]
        self.g, self.tag = g, tag
        self.forward_work: AllToAllWork | None = None
        self.backward_work: AllToAllWork | None = None
        self._waited = False
        self._rows = x if g.size == 1 else None  # a group of one: the identity, nothing in flight
        self._token = None if g.size == 1 else _AllToAllRowsIssue.apply(x, self)

    def wait(self) -> torch.Tensor:
        if self._waited:
            raise RuntimeError("this all-to-all was already waited for")
        self._waited = True
        if self._token is None:
            return self._rows
        out, self._token = _AllToAllRowsWait.apply(self._token, self), None
        return out

    def cut(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Cut the autograd graph between the issue and the wait, for a backward run one piece at a time
        (`pylib.ep.overlap.Segments`). Returns (end, leaf): `end` closes the graph before the exchange, and the
        wait starts from `leaf`, a detached copy that requires grad. Once the backward of what follows the wait has
        run, it has issued the conjugate exchange (`backward_work`) and left `leaf.grad`;
        `torch.autograd.backward(end, leaf.grad)` then waits for that exchange and goes on before it. In a group
        of one (nothing in flight) the cut is on the rows themselves. Call it before `wait()`."""
        if self._waited:
            raise RuntimeError("cut an all-to-all before waiting for it")
        if self._token is None:
            end, self._rows = self._rows, self._rows.detach().requires_grad_(self._rows.requires_grad)
            return end, self._rows
        end, self._token = self._token, self._token.detach().requires_grad_(self._token.requires_grad)
        return end, self._token


class _AllToAllRowsIssue(torch.autograd.Function):
    """Forward: issue the exchange; return an empty token that links `_AllToAllRowsWait` to x in the graph.
    Backward: wait for the conjugate exchange that `_AllToAllRowsWait.backward` issued and return it as dx;
    between the two, autograd runs whatever other work is ready (another micro-batch's backward), while the
    gradient rows travel."""

    @staticmethod
    def forward(ctx, x, pending):
        ctx.pending = pending
        out_splits, in_splits = pending.splits
        pending.forward_work = all_to_all_rows_async(x, out_splits, in_splits, pending.g, tag=pending.tag)
        return x.new_empty(0)

    @staticmethod
    def backward(ctx, d_token):
        return ctx.pending.backward_work.wait(), None


class _AllToAllRowsWait(torch.autograd.Function):
    """Forward: wait for the exchange, return the rows. Backward: issue the conjugate exchange (the splits
    swapped) and return an empty token gradient; `_AllToAllRowsIssue.backward` waits for the exchange."""

    @staticmethod
    def forward(ctx, token, pending):
        ctx.pending = pending
        return pending.forward_work.wait()

    @staticmethod
    def backward(ctx, dy):
        p = ctx.pending
        p.backward_work = all_to_all_rows_async(dy.contiguous(), *p.reverse, p.g, phase="backward", tag=p.tag)
        return dy.new_empty(0), None


def all_to_all_uneven_async(x, output_splits, input_splits, group=None, *, tag=None) -> PendingRows:
    """`all_to_all_uneven` issued now and waited for later: returns a `PendingRows` whose `wait()` gives the rows.
    Backward is asynchronous too: the conjugate exchange (splits swapped) is issued where the forward waited and
    waited for where the forward issued, so other ready backward work runs while it travels. Every rank must issue
    and wait in the same order (as for every collective). `output_splits` may be an `ExchangedSplits` (no
    input_splits): no split check runs, forward or backward."""
    g = resolve_group(group)
    return PendingRows(x, output_splits, input_splits, g, _tag(tag))


# --------------------------------------------------------------------------------------------------- autograd ops


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g, tag):
        ctx.g, ctx.tag = g, tag
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        dx = dy.clone(memory_format=torch.contiguous_format)
        return all_reduce_(dx, ctx.g, phase="backward", tag=ctx.tag), None, None


class _ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g, tag):
        return all_reduce_(x.clone(memory_format=torch.contiguous_format), g, tag=tag)

    @staticmethod
    def backward(ctx, dy):
        return dy, None, None


class _SplitToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, g, tag):
        ctx.dim, ctx.g, ctx.tag = dim, g, tag
        _check_divisible(x.shape[dim], g.size, f"split along dim {dim} of shape {tuple(x.shape)}")
        # a copy, not a view: a contiguous chunk would keep the whole unsplit tensor alive for as long as it lives
        return x.chunk(g.size, dim=dim)[g.rank].clone(memory_format=torch.contiguous_format)

    @staticmethod
    def backward(ctx, dy):
        return all_gather_tensor(dy, ctx.dim, ctx.g, phase="backward", tag=ctx.tag), None, None, None


class _GatherFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, g, tag):
        ctx.dim, ctx.g = dim, g
        return all_gather_tensor(x, dim, g, tag=tag)

    @staticmethod
    def backward(ctx, dy):
        return dy.chunk(ctx.g.size, dim=ctx.dim)[ctx.g.rank].contiguous(), None, None, None


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, g, tag):
        ctx.dim, ctx.g, ctx.tag = dim, g, tag
        return all_gather_tensor(x, dim, g, tag=tag)

    @staticmethod
    def backward(ctx, dy):
        return reduce_scatter_tensor(dy, ctx.dim, ctx.g, phase="backward", tag=ctx.tag), None, None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, g, tag):
        ctx.dim, ctx.g, ctx.tag = dim, g, tag
        return reduce_scatter_tensor(x, dim, g, tag=tag)

    @staticmethod
    def backward(ctx, dy):
        return all_gather_tensor(dy, ctx.dim, ctx.g, phase="backward", tag=ctx.tag), None, None, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, g, tag):
        ctx.dims, ctx.g, ctx.tag = (scatter_dim, gather_dim), g, tag
        return all_to_all_tensor(x, scatter_dim, gather_dim, g, tag=tag)

    @staticmethod
    def backward(ctx, dy):
        scatter_dim, gather_dim = ctx.dims
        dx = all_to_all_tensor(dy, gather_dim, scatter_dim, ctx.g, phase="backward", tag=ctx.tag)
        return dx, None, None, None, None


class _AllToAllRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, output_splits, input_splits, g, tag):
        ctx.splits, ctx.g, ctx.tag = (output_splits, input_splits), g, tag
        return all_to_all_rows(x, output_splits, input_splits, g, tag=tag)

    @staticmethod
    def backward(ctx, dy):
        output_splits, input_splits = ctx.splits
        if isinstance(output_splits, ExchangedSplits):  # the reverse exchange, agreed as the forward was
            reverse = (output_splits.swapped(), None)
        else:
            reverse = (input_splits, output_splits)
        dx = all_to_all_rows(dy, *reverse, ctx.g, phase="backward", tag=ctx.tag)
        return dx, None, None, None, None


class _AllGatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, sizes, g, tag):
        ctx.sizes, ctx.g, ctx.tag = sizes, g, tag  # a list or a GatheredSizes, as given: the same call backward
        return all_gather_rows(x, sizes, g, tag=tag)

    @staticmethod
    def backward(ctx, dy):
        return reduce_scatter_rows(dy, ctx.sizes, ctx.g, phase="backward", tag=ctx.tag), None, None, None


class _ReduceScatterRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, sizes, g, tag):
        ctx.sizes, ctx.g, ctx.tag = sizes, g, tag
        return reduce_scatter_rows(x, sizes, g, tag=tag)

    @staticmethod
    def backward(ctx, dy):
        return all_gather_rows(dy.contiguous(), ctx.sizes, ctx.g, phase="backward", tag=ctx.tag), None, None, None


def _tag(tag):
    return tag if tag is not None else tracer.current_tag()


def copy_to_group(x, group=None, *, tag=None):
    """Forward: identity (x is replicated on every rank of the group). Backward: all-reduce the gradient."""
    g = resolve_group(group)
    return x if g.size == 1 else _CopyToGroup.apply(x, g, _tag(tag))


def reduce_from_group(x, group=None, *, tag=None):
    """Forward: all-reduce (sum the partial results). Backward: identity."""
    g = resolve_group(group)
    return x if g.size == 1 else _ReduceFromGroup.apply(x, g, _tag(tag))


def split_to_group(x, dim: int, group=None, *, tag=None):
    """Forward: keep this rank's chunk of `dim` (no communication). Backward: all-gather along `dim`."""
    g = resolve_group(group)
    return x if g.size == 1 else _SplitToGroup.apply(x, dim, g, _tag(tag))


def gather_from_group(x, dim: int, group=None, *, tag=None):
    """Forward: all-gather along `dim`. Backward: keep this rank's chunk (consumer replicated on every rank)."""
    g = resolve_group(group)
    return x if g.size == 1 else _GatherFromGroup.apply(x, dim, g, _tag(tag))


def all_gather(x, dim: int, group=None, *, tag=None):
    """Forward: all-gather along `dim`. Backward: reduce-scatter along `dim` (consumers differ per rank)."""
    g = resolve_group(group)
    return x if g.size == 1 else _AllGather.apply(x, dim, g, _tag(tag))


def reduce_scatter(x, dim: int, group=None, *, tag=None):
    """Forward: sum over the group, keep this rank's chunk of `dim`. Backward: all-gather along `dim`."""
    g = resolve_group(group)
    return x if g.size == 1 else _ReduceScatter.apply(x, dim, g, _tag(tag))


def all_to_all(x, scatter_dim: int, gather_dim: int, group=None, *, tag=None):
    """Forward: split `scatter_dim` across the group and concatenate arrivals along `gather_dim`.
    Backward: the same with the two dims swapped."""
    g = resolve_group(group)
    return x if g.size == 1 else _AllToAll.apply(x, scatter_dim, gather_dim, g, _tag(tag))


def all_to_all_uneven(x, output_splits, input_splits=None, group=None, *, tag=None):
    """Forward: rows of `x` go out in blocks of `input_splits`, `output_splits` rows arrive from each member.
    Backward: the same exchange with the split lists swapped. `output_splits` may be an `ExchangedSplits` (from
    `exchange_splits`, no input_splits): agreed by construction, so no split check runs, forward or backward."""
    g = resolve_group(group)
    if g.size == 1:
        return x
    if not isinstance(output_splits, ExchangedSplits):
        output_splits, input_splits = list(output_splits), list(input_splits)
    return _AllToAllRows.apply(x, output_splits, input_splits, g, _tag(tag))


def _sizes_arg(sizes):
    """A `GatheredSizes` as given (trusted, forward and backward), a raw list as ints."""
    return sizes if isinstance(sizes, GatheredSizes) else [int(v) for v in sizes]


def all_gather_uneven(x, sizes, group=None, *, tag=None):
    """Forward: all-gather rows, member j contributing sizes[j] rows. Backward: reduce-scatter the gradient rows
    back to their owners (each member's gathered rows feed a different computation). `sizes` may be a
    `GatheredSizes` (from `gather_sizes`): agreed by construction, so no row-count check runs, forward or backward."""
    g = resolve_group(group)
    if g.size == 1:
        return x
    return _AllGatherRows.apply(x, _sizes_arg(sizes), g, _tag(tag))


def reduce_scatter_uneven(x, sizes, group=None, *, tag=None):
    """Forward: sum over the group and keep my block of rows (member j: sizes[j] rows). Backward: all-gather.
    `sizes` may be a `GatheredSizes`, as for `all_gather_uneven`."""
    g = resolve_group(group)
    if g.size == 1:
        return x
    return _ReduceScatterRows.apply(x, _sizes_arg(sizes), g, _tag(tag))


def exchange_counts(counts: torch.Tensor, group=None, *, tag=None) -> torch.Tensor:
    """Every rank sends counts[j] to member j and receives member j's count for it ([n] int64 -> [n] int64;
    [n * k] -> [n * k]: block j of k goes to member j). One row to and from every member: splits that agree by
    construction, so the agreement checks only the op, the dtype and k."""
    g = resolve_group(group)
    if g.size == 1:
        return counts.clone()
    ones = (1,) * g.size
    rows = counts.reshape(g.size, -1).contiguous()
    return all_to_all_rows(rows, ExchangedSplits(ones, ones, g.pg), None, g, tag=tag).reshape(counts.shape)


def exchange_splits(counts: torch.Tensor, group=None, *, tag=None) -> tuple[torch.Tensor, ExchangedSplits]:
    """`exchange_counts` of counts [n * k] (block j: this rank's rows for member j, k per member), and the split
    sizes of the uneven all-to-all those rows then make, as an `ExchangedSplits`: input[j] = block j's sum,
    output[j] = the sum of what member j counted for this rank. Pass it to `all_to_all_uneven` (and `.swapped()`
    for the way back): no split check runs, since every rank expects from j what j counted for it."""
    g = resolve_group(group)
    received = exchange_counts(counts, g, tag=tag)
    sent = counts.reshape(g.size, -1).sum(1).tolist()
    return received, ExchangedSplits(tuple(received.reshape(g.size, -1).sum(1).tolist()), tuple(sent), g.pg)


def gather_sizes(counts: torch.Tensor, group=None, *, tag=None) -> tuple[torch.Tensor, GatheredSizes]:
    """All-gather every member's integer `counts` ([n, *counts.shape], member j's in row j) and the row counts of
    the uneven all-gather / reduce-scatter those counts describe, as a `GatheredSizes`: sizes[j] = the sum of member
    j's counts. Every member computes them from the same gathered bytes, so they agree by construction: pass them
    to `all_gather_uneven` / `reduce_scatter_uneven` and no row-count check runs (ETP: the expert rows each member
    received, `pylib.ep.dispatcher`). The all-gather itself is checked as any (op, dtype, shape)."""
    g = resolve_group(group)
    if g.size == 1:
        gathered = counts.unsqueeze(0)
    else:
        gathered = all_gather_tensor(counts.reshape(1, -1), 0, g, tag=tag).view(g.size, *counts.shape)
    return gathered, GatheredSizes(tuple(gathered.reshape(g.size, -1).sum(1).tolist()), g.pg)
