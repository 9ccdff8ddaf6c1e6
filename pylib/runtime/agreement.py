"""Before a collective communicates, the ranks of its group check that they agree on what they are about to do.

A collective whose ranks disagree fails badly: gloo sums a float32 tensor on one rank with an int32 tensor on
another and returns garbage, or aborts the whole process ("Received data size doesn't match expected size") on
mismatched sizes; NCCL hangs. So every collective in `pylib.runtime.collectives` first checks a descriptor of its
call -- which op, its dtype and shape, its dim / reduce op, the row counts of an uneven op -- and every rank raises
the same ValueError naming each rank's value when they differ:

    all_reduce_ over world (ranks [0, 1]): the ranks disagree on the dtype: rank 0 float32, rank 1 int32

    agreement_check(False)            # switch it off in this rank (returns the previous setting)
    with agreement_check(False): ...  # or for a block

Called in the caller before `launch`, the setting reaches gloo's ranks too (they are forked from the caller).
Default (`None`): on under gloo (the CPU ranks of the tests, the labs and the book), off under NCCL, where the
extra collective would cost real latency on every call. It is not traced (it moves no model data).

Most calls cost nothing: a training loop makes the same collectives in the same order step after step, so each
group's ranks learn that order once and then only check where it may change (`_Predictor`):

0. **Predicted calls.** Every rank keeps, per process group, the group's verified history: the keys of its
   checked calls in order (a key is the exact local call: op, params with dims counted from the front, each
   tensor's dtype and shape -- after dim 0 for uneven row ops --, a Python tuple, compared, never hashed). All
   earlier calls agreed on every rank (induction), so every rank holds the same history, and everything below is
   a function of it: every rank predicts the same next call, or none.
   - Which call is predicted. After a checked call c at position x of the history, the hypothesis is a lap of
     d = x - e calls, e < x an earlier occurrence of c's key: the next call is the one d back. Of the earlier
     occurrences, e is the one whose preceding calls match the calls before x for the longest stretch (the longest
     context; ties to the earliest, the longest lap), found by one pass of the Z-algorithm over the history read
     backwards: O(history), run only on a checked call (0.1 ms at 600 calls, 13 ms at a full 65,536, on this
     project's 2-core machine). Once d calls in a row have followed it (the last 2d calls are two copies of one
     lap) the lap is locked: the history stops growing and the lap repeats. When a lock breaks within `_HOLD`
     (1,024) calls, every call it predicted is put back on the history, so the history stays the order the ranks
     made (a layer's lap locks inside a run of identical layers and breaks where they end); a longer lock (a step
     repeated for many steps, then a change) puts back one lap and the remainder, the rest repeating what the
     history holds. A repeating step is learned in its first two or three steps and from then on costs no
     communication at all -- no branch points, whatever the number of layers.
     Why this rule, measured by replaying the orders that real gloo ranks made (checked calls per step, store rendezvous
     among them in brackets; `tests/test_agreement_predicted.py` replays the main ones). The EP overlap step
     (`pylib.ep.overlap`, 2 MoE layers, two micro-batches interleaved, ep=2) makes 20 calls on the EP group, a the
     splits exchange and b the rows' async all-to-all: a b a b b b a b a b b b b b b b b b b b. The rule before, the lap
     from the key's first occurrence, never locked on it (14 (14) every step); this one: 9 (6), 2 (2), then none.
     4-layer TP+SP: 12 (7) in all before, 10 (5) now; 96 identical TP+SP layers after a two-call prologue: 54 (49)
     before, 7 (2) now; a composed tp=2 dp=2 step's TP group 12 (6) before, 9 (3) now. Two lost a little: the plain
     1-layer TP step, 7 (3) before, 9 (5) now, and the composed MoE step's (tp=2, ep=2, dp=2) busiest group, 15 (7)
     before, 16 (8) now. Over 6,000 random steps (layered or not, with prologues, 8 steps each) the rule before had not
     locked by the sixth step in 1,124 (among them a run of one key after a one-off call: every call of the run met at
     the store, forever), this one in none, with half the checked calls in all (85,663 against 179,256). Both parts are
     needed: the longest context alone had not locked on the 4-layer TP+SP step by its fifth (2 or 3 rendezvous every
     step), since a layer's lap, once locked, dropped whole layers from the history, which then no longer measured a
     step.
     The order-1 table first tried here (one successor per key) checked 20 of the 39 calls of every 4-layer
     TP+SP step and 8 of 9 of a plain 1-layer TP step: the same all-reduce key ends the embedding, the attention
     and the MLP, so its successor differs between occurrences.
   - The call is the predicted one: **no communication**. Every rank whose call is right predicts the same; a
     rank whose call is not never touches the process group (below), so the others wait inside the predicted call
     for it and no data moves between ranks that disagree.
   - Nothing is predicted (the first calls, after a change): every rank knows it, and all run steps 1 (and 2)
     below, named before data moves as ever, and extend the history.
   - The call is not the predicted one: this rank alone may be the odd one, so it must not touch the group's
     process group. It writes a key under the default store (the rendezvous the ranks met through; no partner
     needs to be there) and polls for every rank of the group to write the same round's key, for up to
     `prediction_timeout` seconds. If all do (they all changed together: a new sequence length, eval after
     training, a wrong hypothesis while learning), every rank is in this branch at the same round, so all run
     steps 1-2 on the group as usual (named errors as ever) and extend the history. If not, the others made the
     predicted call and sit in it: this rank raises a ValueError naming its call, the verified one and the one
     before, marks the group broken (any later call on it raises the same at once), and the launcher ends the
     others. A rendezvous costs a few ms here (2-13 ms at 3 ranks, about one checked call), and happens only
     while learning or when all ranks change together.
   The timeout must cover the time the slowest rank may take between two calls of the group when all change
   together (compute, a checkpoint written between steps); it bounds only how long an odd rank waits before
   naming itself, never the cost of a good run. Default 30 s: under `launch`'s default 60 s limit for the whole
   run and the process group, so the named error comes before gloo's own timeout; `prediction_timeout(seconds)`
   changes it (the tests use 0.2 s). The history holds at most `_MAX_TAPE` (65,536) calls; a run that changes again
   and again grows it, and when it is full it keeps its later half (`_make_room`: the same cut on every rank, so the
   histories stay equal) and goes on learning. 100 training steps then 10 of evaluation, over and over (the 2-layer
   TP+SP orders), locks on the whole cycle from the 16th (the rule before checked 85 calls every cycle and filled
   the history in the 28th); at 1,000 training steps a cycle it checks 3 calls a cycle, and the history, full in
   the 37th cycle, is cut and the 3 a cycle go on (60 cycles replayed). Before the cut a full history checked
   every call from then on: 23,130 a cycle (the rule before: from the 4th cycle).
   Row counts are not part of the key (they change every step in an MoE layer). An uneven all-to-all whose splits
   came out of `collectives.exchange_splits` (an all-to-all of the counts, so rank i expects from j exactly what
   j counted for i) agrees by construction and adds nothing; so do the `sizes` of an uneven all-gather /
   reduce-scatter that came out of `collectives.gather_sizes` (a `GatheredSizes`: sums of an all-gather of counts,
   the same bytes on every member; ETP's row counts, gathered with the counts they derive from). Raw splits add
   step 1's split residual (below) every call, raw `sizes` step 1's hash (`_Predictor.row_checks` counts them).
   `_setting.predict = False` runs steps 1-2 before every collective, the design before (the bench's "every").

Steps 1 and 2, the second only when the first finds a disagreement (`agree`):

1. **Do all ranks agree?** One all-reduce (max) of two int64, whatever the op, group or tensor: [h, -h], h a
   63-bit hash of the call (op, params, each tensor's dtype and shape, `sizes`); max(h) == -max(-h) exactly when
   every rank's h is the same, and every rank reads the same maxima, so every rank takes the same branch: no rank
   goes on to send data while another stops. A rank whose own dim argument is out of range sends a row that can
   only disagree. An uneven all-to-all, once the hashes agree, adds a second small all-reduce (sum of two int64):
   sum_ij (out_splits_i[j] - in_splits_j[i]) * w_ij modulo two primes near 2^31 (w pseudo-random, fixed), zero
   when every rank expects from each peer the rows that peer sends. Why two int64 and an all-reduce, measured at
   4 gloo ranks on this project's 2-core machine (under load; the slowest rank, median of 5 rounds of 50 calls):
   an all-reduce of two int64 3.0 ms, of seven 10.3 ms, an all-gather of two 6.2 ms, of a whole descriptor
   (46) 6.0 ms. `bench/peers.py` prints what the check costs.
2. **Name the disagreement.** Only when step 1 says the ranks differ, every rank all-gathers the whole
   descriptor (`descriptor_length(n)` int64) and raises the error naming each rank's value, as below. A hash
   collision (two different calls with the same 63-bit hash, or split residuals that vanish modulo both primes by
   chance) is the one way a disagreement passes step 1.

Every rank's call is checked before any data moves, whatever its number of dimensions: a shape is sent as its
first 8 dims, its dim count and a checksum of the whole shape, and when two ranks differ beyond what 8 dims show,
a second small all-gather brings every rank's full shape for the message. A dim argument (`dims_of_first`) is
checked against each rank's own tensor -- out of range on any rank, every rank raises naming that rank -- so no
rank sends its data and then fails in `torch.cat`.

Point-to-point ops have no collective partner to compare with, so the pipeline agrees once per step, before its
first send (`agree_pipeline`): schedule, microbatch count, the dtype and the shape of every stage boundary, each
compared between the two ranks that send and receive across it. A stage built with another activation shape is
named there, not by gloo's "Received data size doesn't match". Once a step is verified, a step the same on this
rank is predicted like a collective's call (no communication), and a rank whose step changed alone names itself at
the store.

The batch (`agree_on_batch`): ranks that must see the same data compare a checksum of it, one all-gather of a
few int64 per step (see its docstring for why a checksum rather than a broadcast from one rank).

These two per-step checks run unless switched off with `agreement_check(False)`, under NCCL too
(`checks_each_step`): the batch's costs one small collective per step; the pipeline's one in its first step and
after every change.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import time
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
    # True: skip step 1 and exchange the whole descriptors before every collective, the design before issue 30
    # (kept so that `bench/peers.py` measures what step 1 saves; a test runs both)
    full_exchange: bool = False
    # False: steps 1-2 before every collective, no predicted calls (the design before; `bench/peers.py`'s "every")
    predict: bool = True
    timeout: float = 30.0  # seconds an odd rank waits at the store for the others (`prediction_timeout`)


_setting = _Setting()


class prediction_timeout(contextlib.ContextDecorator):
    """How long (seconds > 0) a rank whose call differs from its group's verified order waits at the store for the
    other ranks to change too before it names itself (module docstring, step 0); as a context manager the previous
    value returns when the block ends. Default 30 s."""

    def __init__(self, seconds: float):
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
            raise ValueError(f"prediction_timeout takes a number of seconds > 0, not {seconds!r}")
        self.previous = _setting.timeout
        _setting.timeout = float(seconds)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _setting.timeout = self.previous
        return False


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


def checks_each_step() -> bool:
    """Whether the once-per-step checks (`agree_on_batch`, `agree_pipeline`) run: always, unless switched off with
    `agreement_check(False)` -- under NCCL too, where the per-collective check is off by default -- and outside
    launched ranks (no process group: nobody to compare with)."""
    return _setting.enabled is not False and dist.is_initialized()


def descriptor_length(n: int) -> int:
    """int64 values in one descriptor for a group of n ranks: op, params, per tensor (dtype, ndim, a checksum of
    the whole shape, its first 8 dims), and the row counts of uneven ops (sizes, input splits, output splits)."""
    return 1 + _MAX_PARAMS + _MAX_TENSORS * (3 + _MAX_DIMS) + 3 * n


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


def _shape_code(shape) -> int:
    """A checksum of the whole shape: two shapes that agree on their first 8 dims still differ here."""
    return zlib.crc32(repr(tuple(shape)).encode()) & 0x7FFFFFFF


def _encode(op, n, tensors, params, sizes, in_splits, out_splits, rows_only=False) -> list[int]:
    desc = [_op_code(op)] + list(params) + [-1] * (_MAX_PARAMS - len(params))
    for i in range(_MAX_TENSORS):
        if i < len(tensors):
            t = tensors[i]
            dims = list(t.shape)[:_MAX_DIMS]
            code = _shape_code(t.shape[1:] if rows_only else t.shape)
            desc += [_dtype_code(t.dtype), t.dim(), code, *dims, *([-1] * (_MAX_DIMS - len(dims)))]
        else:
            desc += [-1] * (3 + _MAX_DIMS)
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
            dtype, ndim, code, dims = row[at], row[at + 1], row[at + 2], row[at + 3 : at + 3 + _MAX_DIMS]
            if dtype != -1:
                # (dtype, (ndim, checksum, first dims): what is compared, the first dims: what is shown)
                self.tensors.append((dtype, (ndim, code, *dims[: min(ndim, _MAX_DIMS)])))
            at += 3 + _MAX_DIMS
        self.sizes, self.in_splits, self.out_splits = (row[at + k * n : at + (k + 1) * n] for k in range(3))


def _disagree(who: str, ranks, what: str, values: list[str]) -> ValueError:
    per_rank = ", ".join(f"rank {r} {v}" for r, v in zip(ranks, values))
    return ValueError(f"{who} over {ranks}: the ranks disagree on {what}: {per_rank}")


def _check_dims(who: str, ranks, ndims: list[int], dims: list[list[int]], names) -> None:
    """Each rank's dim arguments in range for its own tensor (ndims[i] dims): else one error naming the rank."""
    for k, name in enumerate(names):
        for r, ndim, values in zip(ranks, ndims, dims):
            d = values[k]
            if ndim == 0 or not -ndim <= d < ndim:
                have = f"a tensor of {ndim} dims" if ndim else "a 0-dim tensor (a scalar has no dim to act along)"
                raise ValueError(f"{who} over {list(ranks)}: {name}={d} on rank {r} is out of range for {have}")


def _normalised(params, ndim: int, n_dims: int) -> list[int]:
    """The first n_dims params are dims of tensor 0, counted from the front (-1 -> ndim - 1), so ranks passing -1
    and ndim - 1 agree."""
    return [p % ndim if k < n_dims and ndim else p for k, p in enumerate(params)]


def _full_shapes(g, t: torch.Tensor, ndims: list[int]) -> list[tuple]:
    """Every rank's whole shape of `t` (a second all-gather, made only when the ranks already know they differ)."""
    most = max(max(ndims), 1)
    mine = torch.full((most + 1,), -1, dtype=torch.int64, device=t.device)
    mine[0] = t.dim()
    if t.dim():
        mine[1 : 1 + t.dim()] = torch.tensor(list(t.shape), dtype=torch.int64)
    out = torch.empty(g.size * (most + 1), dtype=torch.int64, device=t.device)
    compat.all_gather_into(out, mine, group=g.pg)
    return [tuple(row[1 : 1 + row[0]]) for row in out.view(g.size, -1).cpu().tolist()]


def agree(
    who: str,
    g,
    tensors,
    *,
    kind: str | None = None,
    params: dict[str, int] | None = None,
    dims_of_first: int = 0,
    rows_only: bool = False,
    sizes=None,
    in_splits=None,
    out_splits=None,
) -> None:
    """Raise ValueError on every rank of AxisGroup `g` unless they all make the same call.

    Compared: the op (`kind`, default `who`: the name the message uses); `params` (small ints by name, e.g. dim,
    reduce op), the first `dims_of_first` of which are dims of tensors[0], checked in range on
    every rank (also when the cross-rank check is off) and compared counted from the front; each tensor's dtype
    and shape, any number of dims (only the dims after the first with `rows_only`, for uneven row ops); `sizes`
    equal on every rank; and for an uneven all-to-all, rank i's out_splits[j] == rank j's in_splits[i].
    A call the group's verified order predicts costs no communication (module docstring, step 0)."""
    if g.size == 1:
        return
    param_names, values = list(params or {}), list((params or {}).values())
    if not is_checking():
        if dims_of_first:
            _check_dims(who, [g.global_rank], [tensors[0].dim()], [values], param_names[:dims_of_first])
        return
    call = _Args(
        who, g, kind or who, tensors, param_names, values, dims_of_first, rows_only, sizes, in_splits, out_splits
    )
    if _setting.full_exchange:
        _name_disagreement(call)
        return
    if not _setting.predict:
        _check(call)
        return
    state = _predictor(g)
    if state.broken is not None:
        raise ValueError(state.broken)
    key = call_key(call.op, tensors, param_names, values, dims_of_first, rows_only)
    expected = state.expected()
    if expected is not None:
        if key == expected:  # every rank whose call is right predicts the same: nothing to ask
            if sizes is not None or in_splits is not None:
                state.row_checks += 1
                _rows_agree(call)
            state.hit(key)
            return
        _rendezvous(call, state, key, expected)  # returns only when every rank of the group changed too
    _check(call)
    state.checked_call(key)


@dataclasses.dataclass(slots=True)
class _Args:
    """One call's arguments as `agree` was given them."""

    who: str
    g: object
    op: str
    tensors: list
    param_names: list
    params: list
    dims_of_first: int
    rows_only: bool
    sizes: object
    in_splits: object
    out_splits: object

    @property
    def device(self) -> torch.device:
        return self.tensors[0].device if self.tensors else torch.device("cpu")


def _check(c: _Args) -> None:
    """Steps 1 and 2: return when every rank makes the same call, else raise on every rank naming what differs."""
    args = (c.g, c.op, c.tensors, c.params, c.dims_of_first, c.rows_only, c.sizes, c.in_splits, c.out_splits)
    if not _all_agree(*args, c.device):
        _name_disagreement(c)
        raise _unseen(c)


def _rows_agree(c: _Args) -> None:
    """A predicted call with raw row counts: its key left them out, so step 1 checks them alone (the split residual
    of an uneven all-to-all, the hash of an uneven all-gather's `sizes`); raise on every rank if they differ."""
    g = c.g
    if c.in_splits is not None:
        shares = split_residuals(g.size, g.rank, c.in_splits, c.out_splits)
        row = torch.tensor(shares, dtype=torch.int64, device=c.device)
        dist.all_reduce(row, op=dist.ReduceOp.SUM, group=g.pg)
        same = all(r % prime == 0 for r, prime in zip(row.cpu().tolist(), _PRIMES))
    else:
        same = _hashes_agree(g, _hash63(repr(tuple(int(v) for v in c.sizes))), c.device)
    if not same:
        _name_disagreement(c)
        raise _unseen(c)


def _unseen(c: _Args) -> ValueError:
    """Step 1 saw a difference that the descriptors do not show: never let the data move."""
    return ValueError(
        f"{c.who} over {list(c.g.ranks)}: the ranks' calls differ (their hashes of op, dtype, shape and arguments "
        "differ), but the descriptors the ranks exchanged do not show where"
    )


def _name_disagreement(c: _Args) -> None:
    """Step 2: every rank all-gathers the whole descriptor and raises the error naming each rank's value (returns
    when the descriptors agree)."""
    who, g, tensors, n, device = c.who, c.g, c.tensors, c.g.size, c.device
    param_names, params, dims_of_first, rows_only = c.param_names, c.params, c.dims_of_first, c.rows_only
    sizes, in_splits, out_splits = c.sizes, c.in_splits, c.out_splits
    names = param_names[:dims_of_first]
    desc = _encode(c.op, n, tensors, params, sizes, in_splits, out_splits, rows_only)
    mine = torch.tensor(desc, dtype=torch.int64, device=device)  # on the rank's device: NCCL moves no CPU tensor
    gathered = torch.empty(n * mine.numel(), dtype=torch.int64, device=device)
    compat.all_gather_into(gathered, mine, group=g.pg)
    calls = [_Call(row, n) for row in gathered.view(n, -1).cpu().tolist()]
    ranks = list(g.ranks)
    if len({c.op for c in calls}) > 1:
        names_seen = [_OP_NAMES.get(c.op, "another collective") for c in calls]
        raise _disagree(who, ranks, "which collective to call (or call them in a different order)", names_seen)
    if dims_of_first and tensors:
        ndims = [c.tensors[0][1][0] for c in calls]
        _check_dims(who, ranks, ndims, [c.params for c in calls], names)
        for c, ndim in zip(calls, ndims):
            c.params = _normalised(c.params, ndim, dims_of_first)
    for k, name in enumerate(param_names):
        if len({c.params[k] for c in calls}) > 1:
            shown = [_param_text(name, c.params[k]) for c in calls]
            raise _disagree(who, ranks, name, shown)
    for i in range(len(tensors)):
        label = "" if len(tensors) == 1 else f" of tensor {i}"
        if len({c.tensors[i][0] for c in calls}) > 1:
            raise _disagree(who, ranks, "the dtype" + label, [_dtype_name(c.tensors[i][0]) for c in calls])
        # (ndim, checksum of the shape, its first 8 dims); with rows_only the checksum leaves out dim 0
        keys = [c.tensors[i][1][:2] + (c.tensors[i][1][3:] if rows_only else c.tensors[i][1][2:]) for c in calls]
        if len(set(keys)) > 1:
            what = ("the shape after dim 0" if rows_only else "the shape") + label
            ndims = [c.tensors[i][1][0] for c in calls]
            if max(ndims) <= _MAX_DIMS:
                shapes = [tuple(c.tensors[i][1][2:]) for c in calls]
            else:  # every rank sees the same keys, so every rank makes this second all-gather
                shapes = _full_shapes(g, tensors[i], ndims)
            raise _disagree(who, ranks, what, [str(s) for s in shapes])
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


# ------------------------------------------------------------------------------------ step 0: predicted calls

_START = ("the group's first call",)  # what precedes a group's first call (never a call's key)
_MAX_TAPE = 1 << 16  # verified calls remembered per group; a full history keeps its later half (`_make_room`)
_HOLD = 1024  # a lock broken within this many calls puts all of them back on the history


class _Predictor:
    """One process group's verified history, the same on every rank of it (module docstring, step 0).

    `tape`: the verified calls' keys in order (the history, while no lap is locked); `first[key]` where a key first
    stands on it, and `codes` the tape as those first positions (small ints the context search compares); `pos`: the
    tape index of the call predicted next (None: none is, the next call is checked); `lap` the length d of the
    hypothesis or locked lap, `matched` how many calls have followed it so far, `locked` whether d of them have (the
    last 2d calls were two copies: from then on the lap repeats, and the tape stops growing), `since` the calls made
    since the lock. `rounds`: store rendezvous so far (their keys' numbers), `broken`: the error once a rank named
    itself odd; `predicted` / `checked`: calls the order predicted / that ran steps 1-2; `row_checks`: predicted calls
    whose raw row counts still communicated (`_rows_agree`)."""

    __slots__ = (
        "tape",
        "codes",
        "first",
        "pos",
        "lap",
        "matched",
        "locked",
        "since",
        "rounds",
        "broken",
        "predicted",
        "checked",
        "row_checks",
    )

    def __init__(self):
        self.tape, self.codes, self.first = [], [], {}
        self.pos, self.lap, self.matched, self.locked, self.since = None, 0, 0, False, 0
        self.rounds, self.broken, self.predicted, self.checked, self.row_checks = 0, None, 0, 0, 0

    @property
    def prev(self):
        """The last verified call's key (for the error message)."""
        if self.locked:
            return self.tape[(self.pos - 1) if self.pos > len(self.tape) - self.lap else len(self.tape) - 1]
        return self.tape[-1] if self.tape else _START

    def expected(self):
        """The key of the call the verified history predicts next, or None."""
        return None if self.pos is None else self.tape[self.pos]

    def hit(self, key) -> None:
        """Every rank's call was the predicted one."""
        self.predicted += 1
        if self.locked:
            self.since += 1
            self.pos = self.pos + 1 if self.pos + 1 < len(self.tape) else len(self.tape) - self.lap
            return
        self.pos -= self._make_room(1)  # a full tape keeps its later half, the hypothesis's lap at least
        if self.pos < 0 or len(self.tape) >= _MAX_TAPE:  # its lap outgrew the tape: nothing more is predicted
            self.pos = None
            return
        self._append(key)
        self.matched += 1
        self.pos += 1
        if self.matched >= self.lap:  # the last 2d calls are two copies of one lap: lock it
            self.locked, self.since, self.pos = True, 0, len(self.tape) - self.lap

    def checked_call(self, key) -> None:
        """After steps 1-2 passed (the call was unknown, or every rank changed together): extend the history and
        take as the next hypothesis the lap from this key's first occurrence to here."""
        self.checked += 1
        if self.locked:  # the calls made since the lock, less whole laps (they repeat what the tape holds)
            d = self.lap
            kept = self.since if self.since < max(2 * d, _HOLD) else d + self.since % d
            self._make_room(kept + 1)
            start = len(self.tape) - d
            for j in range(self.since - kept, self.since):
                self._append(self.tape[start + j % d])
        else:
            self._make_room(1)
        self.locked, self.matched, self.since, self.pos = False, 0, 0, None
        if len(self.tape) >= _MAX_TAPE:
            return
        at = len(self.tape)
        self._append(key)
        if self.first[key] < at:
            e = self._longest_context()
            self.lap, self.pos = at - e, e + 1

    def _longest_context(self) -> int:
        """Among the earlier occurrences of the last call's key, the one whose preceding calls match the tape's
        most recent ones for the longest stretch (ties: the earliest, the longest lap). One pass of the Z-algorithm
        over the tape read backwards (`codes`, a small int per key): z[i] is how many calls the history ending i
        calls back shares with the history ending now, so the search costs O(tape), and only on a checked call."""
        r = self.codes[::-1]
        n, z, left, right = len(r), [0] * len(r), 0, 0
        best, back = -1, 0
        for i in range(1, n):
            k = min(right - i, z[i - left]) if i < right else 0
            while i + k < n and r[k] == r[i + k]:
                k += 1
            z[i] = k
            if i + k > right:
                left, right = i, i + k
            if k and k >= best:  # k > 0: the same key; a later i is an earlier occurrence, so ties go to it
                best, back = k, i
        return n - 1 - back

    def _make_room(self, calls: int) -> int:
        """Before `calls` more calls go on a tape that would overflow: keep only its later half (at least the
        hypothesis's or locked lap and one call more), `first` and `codes` counted again from it; returns how many
        calls were cut from the front. A function of the history alone, so every rank cuts at the same call and
        keeps the same calls: a run that keeps changing forgets its oldest calls, not how to predict."""
        if len(self.tape) + calls <= _MAX_TAPE:
            return 0
        keep = max(self.lap + 1, min(_MAX_TAPE // 2, _MAX_TAPE - calls))
        cut = len(self.tape) - min(len(self.tape), keep)
        self.tape, self.first = self.tape[cut:], {}
        self.codes = [self.first.setdefault(k, i) for i, k in enumerate(self.tape)]
        return cut

    def _append(self, key) -> None:
        if len(self.tape) < _MAX_TAPE:
            self.codes.append(self.first.setdefault(key, len(self.tape)))
            self.tape.append(key)


_PREDICTORS: dict = {}  # process group -> _Predictor, for the default group `_PREDICTORS_OF`
_PREDICTORS_OF: list = [None]


def _state_of(g, states: dict, make):
    """This rank's state of g's process group in `states` (`_PREDICTORS` or `_PIPELINES`; groups of the same ranks
    made apart have their own), made by `make()` the first time; a new default group (destroy, init again) forgets
    every group's."""
    world = dist.GroupMember.WORLD
    if _PREDICTORS_OF[0] is not world:
        _PREDICTORS.clear()
        _PIPELINES.clear()
        _PREDICTORS_OF[0] = world
    state = states.get(g.pg)
    if state is None:
        state = states[g.pg] = make()
    return state


def _predictor(g) -> _Predictor:
    """This rank's `_Predictor` of g's process group."""
    return _state_of(g, _PREDICTORS, _Predictor)


def call_key(op: str, tensors, param_names, params, dims_of_first: int = 0, rows_only: bool = False) -> tuple:
    """What this rank's call must share with the others' to be the same call, as a tuple compared exactly: the op,
    its params by name (in-range dims counted from the front: -1 and ndim - 1 are one call; an out-of-range dim
    stays as given, so it equals no in-range one), each tensor's dtype and shape (after dim 0 with `rows_only`).
    Row counts (`sizes`, splits) are not in it: they may change on every call."""
    if dims_of_first and tensors:
        ndim, params = tensors[0].dim(), list(params)
        for k in range(dims_of_first):
            if ndim and -ndim <= params[k] < 0:
                params[k] += ndim
    shapes = tuple((t.dtype, t.shape[1:] if rows_only else t.shape) for t in tensors)
    return (op, tuple(zip(param_names, params)), shapes, rows_only)


def _describe(key) -> str:
    """A key as the error shows it: `all_gather(dim=0; float32 (4, 8))`, `(*, 8)` the rows of an uneven op."""
    if key is _START:
        return key[0]
    op, params, shapes, rows_only = key
    args = [name.replace(" ", "_") + "=" + _param_text(name, v) for name, v in params]
    for dtype, shape in shapes:
        dims = ", ".join(["*", *map(str, shape)]) if rows_only else ", ".join(map(str, shape))
        args.append(f"{str(dtype).replace('torch.', '')} ({dims}{',' if len(shape) == 1 and not rows_only else ''})")
    return f"{op}({', '.join(args)})"


def _group_name(g) -> str:
    return getattr(g.pg, "group_name", None) or ",".join(map(str, g.ranks))


def _rendezvous(c: _Args, state: _Predictor, key, verified) -> None:
    """This rank's call is not the one the group's verified order predicts. Without touching the group's process
    group (the others may be waiting inside the predicted call), meet the other ranks at the default store: return
    when every rank of the group arrives at this round within the timeout (they all changed together), else mark
    the group broken and raise naming this rank's call and the verified one."""
    calls = f"calls {_describe(key)} where the group's verified order calls {_describe(verified)}"
    calls += f" after {_describe(state.prev)}"
    _meet_or_raise(c.who, c.g, state, calls, "pylib.agreement")


def _meet_or_raise(who: str, g, state, calls: str, space: str) -> None:
    """`_rendezvous`'s meeting: `state` has `rounds` (this group's meetings so far, the same count on every rank)
    and `broken`; `calls` says what this rank does instead of the verified call; `space` keeps the store keys of
    one kind of check apart from another's."""
    from torch.distributed.distributed_c10d import _get_default_store

    store = _get_default_store()
    prefix = f"{space}/{_group_name(g)}/{state.rounds}/"
    state.rounds += 1
    store.set(prefix + str(g.rank), str(g.global_rank))
    keys = [prefix + str(j) for j in range(g.size)]
    deadline, pause = time.monotonic() + _setting.timeout, 0.0005
    while not store.check(keys):  # polled, not store.wait: a FileStore's wait notices its keys about once a second
        if time.monotonic() > deadline:
            state.broken = (
                f"{who} over {list(g.ranks)}: rank {g.global_rank} {calls}; the other ranks did not come to "
                f"re-check within {_setting.timeout:g} s, so they made that call and wait in it (a rank that may take "
                "longer to reach a new call: raise the limit with pylib.runtime.agreement.prediction_timeout(seconds))"
            )
            raise ValueError(state.broken)
        time.sleep(pause)
        pause = min(2 * pause, 0.02)


_DISAGREE = (1 << 63) - 1  # a rank whose own dim argument is out of range sends [_DISAGREE, _DISAGREE]
_PRIMES = (2_147_483_647, 2_147_483_629)  # the split residuals' moduli: two primes below 2^31


def call_hash(op, tensors, params, dims_of_first=0, rows_only=False, sizes=None) -> int | None:
    """A 63-bit hash of what the ranks must agree on: the op, its params (dims counted from the front), each
    tensor's dtype and shape (after dim 0 with `rows_only`) and `sizes`; None when a dim argument is out of range
    for this rank's tensor (`_hash63`)."""
    if dims_of_first and tensors:
        ndim = tensors[0].dim()
        if any(ndim == 0 or not -ndim <= d < ndim for d in params[:dims_of_first]):
            return None
        params = _normalised(params, ndim, dims_of_first)
    shapes = tuple((_dtype_code(t.dtype), t.dim(), tuple(t.shape[1:] if rows_only else t.shape)) for t in tensors)
    return _hash63(repr((_op_code(op), tuple(params), shapes, None if sizes is None else tuple(sizes))))


def _hash63(key: str) -> int:
    """A 63-bit hash of `key`, the same on every process (blake2b, not Python's salted hash)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1


def hash_row(h: int | None) -> list[int]:
    """This rank's two int64 for step 1's all-reduce (max): [h, -h], or [_DISAGREE, _DISAGREE] for None."""
    return [_DISAGREE, _DISAGREE] if h is None else [h, -h]


def _hashes_agree(g, h: int | None, device) -> bool:
    """Step 1's round trip: one all-reduce (max) of this rank's [h, -h] over `g`; True on every rank exactly when
    every rank's h is the same."""
    row = torch.tensor(hash_row(h), dtype=torch.int64, device=device)
    dist.all_reduce(row, op=dist.ReduceOp.MAX, group=g.pg)
    return all_equal(row.cpu().tolist())


def all_equal(maxima: list[int]) -> bool:
    """Step 1's verdict from the maxima of every rank's [h, -h]: max(h) == min(h), i.e. every h is the same (a
    rank's _DISAGREE row makes max(h) the largest int64 and min(h) at most minus it)."""
    return maxima[0] == -maxima[1]


@functools.lru_cache(maxsize=64)
def _split_weights(n: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """w[k][i][j] in [1, prime_k): fixed pseudo-random weights of the pair (i, j), the same on every rank."""
    out = []
    for k, prime in enumerate(_PRIMES):
        rows = []
        for i in range(n):
            row = []
            for j in range(n):
                digest = hashlib.blake2b(f"{k}:{i}:{j}".encode(), digest_size=8).digest()
                row.append(1 + int.from_bytes(digest, "little") % (prime - 1))
            rows.append(tuple(row))
        out.append(tuple(rows))
    return tuple(out)


def split_residuals(n: int, i: int, in_splits, out_splits) -> list[int]:
    """Rank i's share of sum_ij (out_splits_i[j] - in_splits_j[i]) * w_ij modulo each prime: the ranks' shares sum
    to 0 modulo both when every rank expects from each peer the rows that peer sends it."""
    out = []
    for prime, w in zip(_PRIMES, _split_weights(n)):
        expect = sum(int(out_splits[j]) * w[i][j] for j in range(n))  # rows rank j sends rank i, as i expects
        sent = sum(int(in_splits[j]) * w[j][i] for j in range(n))  # rows rank i sends rank j
        out.append((expect - sent) % prime)
    return out


def _all_agree(g, op, tensors, params, dims_of_first, rows_only, sizes, in_splits, out_splits, device) -> bool:
    """Step 1: True when every rank of `g` makes the same call (and, for an uneven all-to-all, every rank expects
    the rows its peers send). Every rank gets the same answer."""
    if not _hashes_agree(g, call_hash(op, tensors, params, dims_of_first, rows_only, sizes), device):
        return False
    if in_splits is None:  # the same call on every rank (equal hashes): none of them has splits to compare
        return True
    shares = torch.tensor(split_residuals(g.size, g.rank, in_splits, out_splits), dtype=torch.int64, device=device)
    dist.all_reduce(shares, op=dist.ReduceOp.SUM, group=g.pg)
    return all(r % prime == 0 for r, prime in zip(shares.cpu().tolist(), _PRIMES))


def _param_text(name: str, value: int) -> str:
    if name == "reduce op":
        return repr(_REDUCE_OPS[value]) if 0 <= value < len(_REDUCE_OPS) else "?"
    return str(value)


def reduce_code(op: str) -> int:
    return _REDUCE_OPS.index(op)


# ------------------------------------------------------------------------------------------ once per step


def _fingerprint(t: torch.Tensor) -> list[int]:
    """[dtype, ndim, shape checksum, sum, position-weighted sum] of an integer tensor, as int64 (sums wrap)."""
    flat = t.reshape(-1).to(torch.int64)
    weights = torch.arange(1, flat.numel() + 1, dtype=torch.int64, device=flat.device) * 2654435761
    pair = torch.stack([flat.sum(), (flat * weights).sum()])  # an empty tensor sums to 0
    return [_dtype_code(t.dtype), t.dim(), _shape_code(t.shape), *pair.tolist()]


def agree_on_batch(who: str, g, batch: dict[str, torch.Tensor]) -> None:
    """Raise ValueError on every rank of AxisGroup `g` unless each named integer tensor (token ids, targets) is the
    same on all of them, naming the ranks that differ from the group's first rank and what differs.

    Why a checksum and not a broadcast. Megatron's data path reads the batch on TP rank 0 and broadcasts it within
    the TP group, so the other ranks cannot disagree; but the broadcast moves b*s int64 per tensor per step from
    one rank and hides a caller's mistake (ranks handed different data train on rank 0's without a word). Here
    every rank is handed the batch by its caller, and the ranks compare [dtype, ndim, shape checksum, sum,
    position-weighted sum] of each tensor: one all-gather of 5 int64 per tensor per step, whatever the batch size,
    untraced (it moves no training data, so the traffic the book counts is unchanged). Measured on a small composed
    step in `bench/reliability.py`. A checksum can miss a difference that keeps both sums (with weights
    1, 2, 3, ... times an odd constant, two changes that cancel exactly); it is a guard against handing ranks
    different batches, not a proof that they are equal. On whenever `checks_each_step()`."""
    if g.size == 1 or not checks_each_step():
        return
    names = list(batch)
    tensors = [batch[k] for k in names]
    mine = torch.tensor([v for t in tensors for v in _fingerprint(t)], dtype=torch.int64, device=tensors[0].device)
    gathered = torch.empty(g.size * mine.numel(), dtype=torch.int64, device=mine.device)
    compat.all_gather_into(gathered, mine, group=g.pg)
    rows = gathered.view(g.size, len(names), -1).cpu().tolist()
    ranks = list(g.ranks)
    for k, name in enumerate(names):
        first = rows[0][k]
        odd = [r for r, row in zip(ranks, rows) if row[k] != first]
        if odd:
            what = "dtype or shape" if any(row[k][:3] != first[:3] for row in rows) else "values"
            raise ValueError(
                f"{who} over {g.name} (ranks {ranks}): the ranks were given different batches: the {what} of "
                f"`{name}` on ranks {odd} differ from rank {ranks[0]}'s (every rank of the group must be handed the "
                "same batch)"
            )


class _PipelineState:
    """One pp group's last verified pipeline step (the same on every rank of it): `key` what every rank saw then
    (None: nothing verified, or the ranks' views differed where neither end of a boundary cared, so the next step
    is checked again); `rounds`, `broken` as `_Predictor`'s; `predicted` / `checked` steps so far."""

    __slots__ = ("key", "rounds", "broken", "predicted", "checked")

    def __init__(self):
        self.key, self.rounds, self.broken, self.predicted, self.checked = None, 0, None, 0, 0


_PIPELINES: dict = {}  # process group -> _PipelineState, for the default group `_PREDICTORS_OF` (cleared with it)


def _pipeline_state(g) -> _PipelineState:
    return _state_of(g, _PIPELINES, _PipelineState)


def _pipeline_text(key) -> str:
    name, m, v, p, dtype, table = key
    shapes = ", ".join(str(s) for s in dict.fromkeys(table))
    return f"run_pipeline({name}, p={p}, m={m}, v={v}, {_dtype_name(dtype)} boundaries {shapes or '-'})"


def agree_pipeline(g, schedule, dtype: torch.dtype, shape_of) -> None:
    """Before a pipeline step's first send: the ranks of the pp group agree on the schedule (its name, p, m, v),
    the dtype of what crosses a boundary, and, for every boundary, the shape `shape_of(mb, stage)` of the
    activation entering `stage` (its gradient has the same shape), compared between the rank that sends across it
    and the rank that receives. A mismatch raises ValueError on every rank naming both ranks, the microbatch, the
    stage and both shapes. Untraced, on whenever `checks_each_step()`.

    Cost: nothing once verified. A step whose schedule, m, v, p, dtype and boundary shapes are, on this rank, the
    ones every rank verified at the group's last check is predicted, as a collective's call is (module docstring,
    step 0): no communication. A rank whose step differs meets the others at the store, without touching the
    group: if all come (they all changed together) all check as below, else it raises naming its step and the
    verified one, and the others, already in their first send or receive, are ended by the launcher. The check:
    first one all-reduce (max) of two int64, [h, -h] of a hash of everything this rank sees: equal on every
    rank, nothing can disagree, and the step goes on. Otherwise two small all-gathers compare what must agree;
    ranks whose views differ only where neither of them sends nor receives (a stage that knows only its own
    boundaries) pay those and are let through, and check again next step. `_setting.predict = False` checks
    every step (the bench's "every")."""
    if g.size == 1 or not checks_each_step():
        return
    name, m, v = schedule.name, schedule.m, schedule.v
    n_stages = g.size * v
    table = [tuple(shape_of(mb, k)) for k in range(1, n_stages) for mb in range(m)]
    key = (name, m, v, schedule.p, _dtype_code(dtype), tuple(table))
    state = _pipeline_state(g)
    if state.broken is not None:
        raise ValueError(state.broken)
    if _setting.predict and state.key is not None:
        if key == state.key:  # every rank whose step is right predicts the same: nothing to ask
            state.predicted += 1
            return
        calls = f"runs {_pipeline_text(key)} where the group verified {_pipeline_text(state.key)}"
        _meet_or_raise("run_pipeline", g, state, calls, "pylib.agreement.pipeline")
    state.checked += 1
    state.key = None  # until this check passes with every rank's view equal
    device = _small_device(g)
    if _hashes_agree(g, _hash63(repr(key)), device):
        state.key = key
        return
    most = max((len(s) for s in table), default=0)
    header = [zlib.crc32(name.encode()) & 0x7FFFFFFF, m, v, schedule.p, _dtype_code(dtype), most]
    got = _gather_rows(g, header, device)
    ranks = list(g.ranks)
    for k, what in ((0, "the schedule"), (1, "the number of microbatches m"), (2, "the chunks per rank v"), (3, "p")):
        if len({row[k] for row in got}) > 1:
            shown = [name if row[0] == got[g.rank][0] else "another" for row in got] if k == 0 else [r[k] for r in got]
            raise _disagree("run_pipeline", ranks, what, [str(s) for s in shown])
    if len({row[4] for row in got}) > 1:
        raise _disagree("run_pipeline", ranks, "the boundary dtype", [_dtype_name(row[4]) for row in got])
    width = max(row[5] for row in got)
    flat = [d for s in table for d in (len(s), *s, *([-1] * (width - len(s))))]
    shapes = _gather_rows(g, flat, device)
    per = width + 1
    for i, (k, mb) in enumerate((k, mb) for k in range(1, n_stages) for mb in range(m)):
        sender, receiver = schedule.rank_of(k - 1), schedule.rank_of(k)
        seen = [tuple(shapes[r][i * per + 1 : i * per + 1 + shapes[r][i * per]]) for r in (sender, receiver)]
        if seen[0] != seen[1]:
            raise ValueError(
                f"run_pipeline over {ranks}: the two ends of the boundary into stage {k} disagree on the shape of "
                f"microbatch {mb}'s activation: rank {ranks[sender]} sends {seen[0]}, rank {ranks[receiver]} "
                f"expects {seen[1]} (the Boundary each rank was given)"
            )


def _small_device(g) -> torch.device:
    """Where this rank's small agreement tensors go: its GPU under NCCL, else the CPU."""
    nccl = dist.get_backend(g.pg) == "nccl"
    return torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")


def _gather_rows(g, values: list[int], device) -> list[list[int]]:
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    out = torch.empty(g.size * mine.numel(), dtype=torch.int64, device=device)
    compat.all_gather_into(out, mine, group=g.pg)
    return out.view(g.size, -1).cpu().tolist()
