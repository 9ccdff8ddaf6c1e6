"""Gradient buckets reduced as they become ready during backward: the engine under DDP and ZeRO-1/2.

Backward produces gradients from the last layer to the first. Waiting for all of them and then reducing would leave
the network idle during backward and the processor idle during the reduction. Instead the parameters are cut into
buckets in *reverse* registration order (the order their gradients appear), each bucket one flat buffer; a hook
on every parameter (`register_post_accumulate_grad_hook`, run right after autograd has accumulated that
parameter's gradient) folds the gradient into its bucket, and when a bucket's last gradient arrives the bucket's
collective is launched *asynchronously* while backward continues. Each bucket is traced with phase "backward"
and tag "<prefix>.<bucket key>".

    mode              collective on a bucket           what stays               used by
    ----------------  -------------------------------  -----------------------  ---------
    "all_reduce"      all-reduce, average              the whole bucket (each   DDP
                                                       p.grad is a view of it)
    "reduce_scatter"  reduce-scatter, average          the whole bucket, own    ZeRO-1
                      (keep_full_grad=True)            slice now the average
    "reduce_scatter"  reduce-scatter, average          only this rank's slice;  ZeRO-2
                      (keep_full_grad=False)           the bucket is freed

Rules that keep every rank issuing the same collectives in the same order (a mismatch deadlocks or mixes data):
buckets of one group are launched strictly in index order (a ready bucket waits for the ones before it), and when
backward ends every bucket not yet launched (a parameter that got no gradient) is launched, in order. The end of
backward is seen by a callback queued on the autograd engine.

A parameter that got no gradient on this rank (a branch its samples did not take) contributes zeros; if another
rank used it, the average is not zero and becomes its gradient here too, so every replica takes the same step. If
no rank used it the average is exactly zero and its gradient stays None, as on one device. (A parameter used
somewhere whose gradients cancel to exactly 0.0 would stay None as well; PyTorch's DDP tells the two cases apart
with an extra all-reduce of "used" flags when `find_unused_parameters=True`.)
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from pylib.i18n import tr

from ..runtime import clock
from ..runtime import collectives as C
from ..runtime.mesh import AxisGroup
from .groups import dtype_name, group_key
from .layout import FlatLayout, plan_buckets
from .overlap import BucketTiming, OverlapReport

DEFAULT_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's default bucket_cap_mb=25


class Bucket:
    """One bucket at run time: its layout (planned in the parameters' dtype), group, parameters, gradient buffer
    (in `dtype`: the parameters' own, or a mixed-precision recipe's reduce dtype) and the collective in flight."""

    def __init__(
        self,
        layout: FlatLayout,
        group: AxisGroup,
        params: list[nn.Parameter],
        dtype: torch.dtype,
        divide_by: int | float | None = None,
    ):
        self.layout, self.group, self.params, self.dtype = layout, group, params, dtype
        self.divide_by = group.size if divide_by is None else divide_by  # the sum over the group is divided by it
        self.grad: torch.Tensor | None = None  # [padded_numel]
        self.shard_grad: torch.Tensor | None = None  # [shard_numel] (ZeRO-2)
        self.ready: set[int] = set()
        self.work: C.CollectiveWork | None = None
        self.timing: BucketTiming | None = None

    def grad_view(self, entry_index: int) -> torch.Tensor:
        e = self.layout.entries[entry_index]
        return self.grad[e.offset : e.offset + e.numel].view(e.shape)

    @property
    def shard_range(self) -> tuple[int, int]:
        return self.layout.shard_range(self.group.rank) if self.layout.parts > 1 else (0, self.layout.padded_numel)

    @property
    def held_grad(self) -> torch.Tensor:
        """The gradient elements [shard_range] this rank keeps for its optimizer: ZeRO-2's kept slice, else that
        range of the full buffer (ZeRO-1: this rank's slice; DDP: the whole bucket)."""
        if self.shard_grad is not None:
            return self.shard_grad
        lo, hi = self.shard_range
        return self.grad[lo:hi]


class GradientBuckets:
    """Hooks on `param_sets` (from `groups.split_by_group`) that reduce gradients bucket by bucket.

    mode: "all_reduce" or "reduce_scatter"; keep_full_grad: whether the full gradient buffer persists (always True
    for "all_reduce"). Buckets hold at most `bucket_bytes` of parameters; for "reduce_scatter" each is padded to a
    multiple of its group size so every rank's slice has the same size. max_in_flight: launching one more bucket
    first waits for the oldest when this many are on the wire -- without full buffers (ZeRO-2) that bounds the
    gradient memory to the slices, max_in_flight buckets on the wire and the one (or two, where a layer's gradients
    arrive out of registration order) still filling, at the price of some overlap. divide_by: what every bucket's
    sum is divided by (None: its group's size, an average; see `groups` for why expert parameters differ).
    grad_dtype: the dtype of the gradient buffers and of the reduction (None: each parameter's own); a 16-bit
    gradient is added into an fp32 buffer (`pylib.dp.mixed`: Megatron's `grad_reduce_in_fp32`).
    """

    def __init__(
        self,
        param_sets,
        *,
        bucket_bytes: int,
        mode: str,
        keep_full_grad: bool = True,
        tag_prefix: str,
        max_in_flight: int | None = None,
        divide_by: int | float | None = None,
        grad_dtype: torch.dtype | None = None,
    ):
        self.grad_dtype = grad_dtype
        if mode not in ("all_reduce", "reduce_scatter"):
            raise ValueError(f"mode={mode!r} must be 'all_reduce' or 'reduce_scatter'")
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"max_in_flight={max_in_flight} must be >= 1 (or None for no limit)")
        self.max_in_flight = max_in_flight
        self.mode, self.keep_full_grad, self.tag_prefix = mode, keep_full_grad or mode == "all_reduce", tag_prefix
        self.buckets: list[Bucket] = []
        self._by_group: dict[tuple, list[Bucket]] = {}
        self._where: dict[int, tuple[Bucket, int]] = {}
        self._views: dict[int, torch.Tensor] = {}  # id(p) -> its view of a kept bucket, where p.grad lives
        for g, dtype, named in param_sets:
            self._add_buckets(g, dtype, named, bucket_bytes, len(param_sets) > 1, divide_by)
        self._allocate_gradients()
        self._next = dict.fromkeys(self._by_group, 0)
        self._in_flight: list[Bucket] = []
        self._in_backward = False
        self._sync = True
        self._one_pass = False  # inside `one_backward()`: the pass ends with the block, not with an autograd call
        self.backward_start: float | None = None
        self.backward_end: float | None = None
        self.peak_grad_bytes = 0
        self._note_grad_memory()
        self._handles = []
        for b in self.buckets:
            for p in b.params:
                # before autograd accumulates into a bucket view: the previous backward's buckets must be off the wire
                self._handles.append(p.register_hook(self._before_accumulate))
                self._handles.append(p.register_post_accumulate_grad_hook(self._on_grad))

    def _add_buckets(self, g, dtype, named, bucket_bytes: int, several: bool, divide_by) -> None:
        """Cut one group's parameters, last layer first (the order gradients appear in), into buckets."""
        named = list(reversed(named))
        layouts = plan_buckets(
            [(n, tuple(p.shape)) for n, p in named],
            element_size=torch.empty((), dtype=dtype).element_size(),
            bucket_bytes=bucket_bytes,
            parts=g.size if self.mode == "reduce_scatter" else 1,
            axis=g.name,
            group=g.ranks,
            dtype=dtype_name(dtype),
            first_index=len(self.buckets),
            key_prefix=f"{g.name}.bucket" if several else "bucket",
        )
        start = 0
        for lay in layouts:
            params = [p for _, p in named[start : start + len(lay.entries)]]
            start += len(lay.entries)
            b = Bucket(lay, g, params, dtype if self.grad_dtype is None else self.grad_dtype, divide_by)
            for i, p in enumerate(params):
                self._where[id(p)] = (b, i)
            self.buckets.append(b)
            self._by_group.setdefault((*group_key(g), b.dtype), []).append(b)

    def _allocate_gradients(self) -> None:
        """Each bucket's full gradient buffer, or (ZeRO-2: no full buffer kept) only this rank's slice."""
        for b in self.buckets:
            device = b.params[0].device
            if self.keep_full_grad:
                b.grad = torch.zeros(b.layout.padded_numel, dtype=b.dtype, device=device)  # kept for good
                for i, p in enumerate(b.params):
                    if self.mode == "all_reduce" and p.dtype == b.dtype:
                        self._views[id(p)] = b.grad_view(i)  # p.grad's home: made once, not per backward
            else:
                lo, hi = b.shard_range
                b.shard_grad = torch.zeros(hi - lo, dtype=b.dtype, device=device)

    # -------------------------------------------------------------------------------------------- public

    @property
    def layouts(self) -> list[FlatLayout]:
        return [b.layout for b in self.buckets]

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally in the buckets (gradient accumulation over micro-batches); the first
        backward after the block reduces everything accumulated."""
        if not self.keep_full_grad:
            raise ValueError(tr("no_sync needs a full gradient buffer to accumulate into; ZeRO-2 keeps only its shard"))
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    @contextlib.contextmanager
    def one_backward(self):
        """The autograd calls inside count as one backward pass. A split weight gradient (`pylib.pp.backward`, the
        W of a zero-bubble pipeline schedule) restarts autograd once per layer; without this block each call would
        end a pass, so the buckets would be reduced after the first layer's gradients with the others still to
        come. Inside, a bucket still launches as soon as all its parameters are in (each parameter is reached
        once per W), and the rest launch when the block ends, as at the end of one fused backward."""
        self._one_pass = True
        try:
            yield
        finally:
            self._one_pass = False
            if self._in_backward:
                self._end_backward()

    def finish(self) -> None:
        """Wait for every launched bucket and finish it (average, keep the slice, free the buffer)."""
        for b in list(self._in_flight):
            self._retire(b)
        self._in_flight = []

    def zero_grad(self) -> None:
        """Start a new accumulation window: zero the gradient buffers (and ZeRO-2's shards)."""
        self.finish()
        for b in self.buckets:
            if b.grad is not None:
                b.grad.zero_()
            if b.shard_grad is not None:
                b.shard_grad.zero_()

    def grad_bytes_held(self) -> int:
        from .memory import storage_bytes

        return storage_bytes([b.grad for b in self.buckets] + [b.shard_grad for b in self.buckets])

    def overlap(self) -> OverlapReport:
        """Launch and completion of each bucket of the last synchronised backward vs that backward's end."""
        if self.backward_end is None:
            raise RuntimeError("no backward has run through these buckets yet")
        rows = [b.timing for b in self.buckets if b.timing is not None]
        return OverlapReport(self.backward_end, sorted(rows, key=lambda r: r.t_launch), self.backward_start)

    def _note_grad_memory(self) -> None:
        self.peak_grad_bytes = max(self.peak_grad_bytes, self.grad_bytes_held())

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    # -------------------------------------------------------------------------------------------- hooks

    def _before_accumulate(self, grad: torch.Tensor) -> None:
        """A parameter's gradient is computed, not yet accumulated. The first one of a backward pass waits for every
        bucket still on the wire: a bucket being all-reduced in place must not be accumulated into (gradient
        accumulation that reduces every micro-batch without a `finish()` in between would otherwise race)."""
        if not self._in_backward:
            self._begin_backward()

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self._in_backward:
            self._begin_backward()
        b, i = self._where[id(p)]
        view = self._views.get(id(p))
        if view is not None:
            # gradient as a bucket view: afterwards autograd accumulates straight into the bucket
            grad = p.grad
            if grad is not view and grad.data_ptr() != view.data_ptr():
                view.copy_(grad)
                p.grad = view
        else:
            if b.grad is None:
                b.grad = torch.zeros(b.layout.padded_numel, dtype=b.dtype, device=p.device)
                self._note_grad_memory()
            b.grad_view(i).add_(p.grad)  # (cast to the bucket's dtype: mixed precision's reduce dtype)
            p.grad = None  # the bucket holds it now; the optimizer reads the reduced buffer
        b.ready.add(id(p))
        if self._sync and len(b.ready) == len(b.params):
            self._launch_in_order((*group_key(b.group), b.dtype))
        self._retire_completed()

    def _begin_backward(self) -> None:
        self.finish()  # a new backward must not accumulate into buffers still on the wire
        self._in_backward = True
        self.backward_start, self.backward_end = clock.device_now(), None
        for b in self.buckets:
            b.ready.clear()
            if self._sync:
                b.timing = None
        self._next = dict.fromkeys(self._by_group, 0)
        torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)

    def _end_backward(self) -> None:
        if self._one_pass:  # the end of one autograd call inside `one_backward()`: the pass goes on
            return
        self._in_backward = False
        self.backward_end = clock.device_now()  # on CUDA: when backward's kernels finished, not were queued
        if self._sync:
            for key in self._by_group:
                self._launch_in_order(key, force=True)  # buckets with a parameter that got no gradient
        self._retire_completed()

    # -------------------------------------------------------------------------------------------- buckets

    def _launch_in_order(self, key, force: bool = False) -> None:
        order = self._by_group[key]
        while self._next[key] < len(order):
            b = order[self._next[key]]
            if not force and len(b.ready) < len(b.params):
                break
            self._launch(b)
            self._next[key] += 1

    def _launch(self, b: Bucket) -> None:
        if b.grad is None:  # ZeRO-2, and none of this bucket's parameters got a gradient
            b.grad = torch.zeros(b.layout.padded_numel, dtype=b.dtype, device=b.params[0].device)
            self._note_grad_memory()
        if self.max_in_flight is not None and len(self._in_flight) >= self.max_in_flight:
            self._retire(self._in_flight.pop(0))  # wait for the oldest: bounds the buckets alive at once
        tag = f"{self.tag_prefix}.{b.layout.key}"
        if self.mode == "all_reduce":
            op = "avg" if b.divide_by == b.group.size else "sum"  # "sum": divided by divide_by once it is done
            b.work = C.all_reduce_async(b.grad, b.group, op=op, phase="backward", tag=tag)
        else:
            b.work = C.reduce_scatter_async(b.grad, 0, b.group, phase="backward", tag=tag)
        self._in_flight.append(b)

    def _retire_completed(self) -> None:
        for b in list(self._in_flight):
            if b.work.is_completed():
                self._retire(b)
                self._in_flight.remove(b)

    def _retire(self, b: Bucket) -> None:
        work, b.work = b.work, None
        out = work.wait()
        b.timing = BucketTiming(
            f"{self.tag_prefix}.{b.layout.key}",
            "all_reduce" if self.mode == "all_reduce" else "reduce_scatter",
            b.layout.padded_numel * torch.empty((), dtype=b.dtype).element_size(),
            work.t_launch,
            work.t_done,
        )
        if self.mode == "all_reduce":
            if b.divide_by != b.group.size:  # summed in place (or a group of one): divide here
                b.grad.div_(b.divide_by)
            for i, p in enumerate(b.params):
                if p.grad is None and p.dtype == b.dtype:  # no gradient here, but other ranks used it: the average
                    view = b.grad_view(i)
                    if bool(view.any()):
                        p.grad = view
            return  # every p.grad views the bucket
        lo, hi = b.shard_range
        if b.divide_by != 1:
            out = out.div_(b.divide_by)
        if self.keep_full_grad:
            if b.group.size > 1:
                b.grad[lo:hi].copy_(out)  # ZeRO-1: this rank's slice of the bucket now holds the average
        else:
            b.shard_grad.add_(out)  # ZeRO-2: keep the slice, drop the full bucket
            b.grad = None
