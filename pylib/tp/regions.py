"""Crossing into and out of the tensor-parallel region: the only places TP and SP communicate.

A TP layer is plain linear algebra between two crossings (Megatron-LM's f and g):

                        enter (f)                                leave (g)
    TP only             identity        / bwd all-reduce         all-reduce      / bwd identity
    TP + SP             all-gather seq  / bwd reduce-scatter     reduce-scatter  / bwd all-gather seq

Outside the region (LayerNorm, residual adds) every TP rank holds the whole activation [b, s, h] (TP only) or
its own sequence slice [b, s/t, h] (SP). Inside, every rank holds the whole sequence and its slice of heads or
of h_ffn. SP swaps each all-reduce for an all-gather plus a reduce-scatter of the same total traffic
(all-reduce = reduce-scatter + all-gather) and keeps the activations outside the region cut by t.

The sequence is dim 1 of [b, s, h] (the reference model's layout; Megatron keeps [s, b, h] and uses dim 0).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pylib.i18n import tr
from pylib.runtime import collectives as C
from pylib.runtime.tracer import current_tag

SEQ_DIM = 1


def check_sequence_divisible(s: int, t: int) -> None:
    """Sequence parallelism needs t | s: each TP rank keeps s/t tokens outside the TP region."""
    if t > 1 and s % t:
        raise ValueError(
            tr(
                "tp={t} does not divide sequence length s={s}: sequence parallelism splits the sequence over the "
                "{t} TP ranks",
                t=t,
                s=s,
            )
        )


def enter_tp_region(x: torch.Tensor, group=None, sequence_parallel: bool = False, *, tag=None) -> torch.Tensor:
    """x [b, s, h] (replicated) or [b, s/t, h] (SP: my sequence slice) -> [b, s, h] on every TP rank.

    TP: identity forward, all-reduce of the input gradient backward (every rank's heads contributed to it).
    SP: all-gather along the sequence forward, reduce-scatter backward."""
    if sequence_parallel:
        return C.all_gather(x, SEQ_DIM, group, tag=tag)
    return C.copy_to_group(x, group, tag=tag)


def leave_tp_region(partial: torch.Tensor, group=None, sequence_parallel: bool = False, *, tag=None) -> torch.Tensor:
    """partial [b, s, h] (this rank's partial sum from a row-parallel linear) -> the sum over the TP group:
    [b, s, h] on every rank (TP: all-reduce) or my sequence slice [b, s/t, h] (SP: reduce-scatter)."""
    if sequence_parallel:
        check_sequence_divisible(partial.shape[SEQ_DIM], C.group_size(group))
        return C.reduce_scatter(partial, SEQ_DIM, group, tag=tag)
    return C.reduce_from_group(partial, group, tag=tag)


def scatter_to_sequence_parallel_region(x: torch.Tensor, group=None, *, tag=None) -> torch.Tensor:
    """x [b, s, h], the same on every TP rank -> my slice [b, s/t, h] (no communication; backward all-gathers).

    How a test or a notebook hands a sequence-parallel layer its input. The slice has its own storage
    (`split_to_group` copies it), so it does not keep the whole [b, s, h] alive as long as it lives."""
    check_sequence_divisible(x.shape[SEQ_DIM], C.group_size(group))
    return C.split_to_group(x, SEQ_DIM, group, tag=tag)


def gather_from_sequence_parallel_region(x: torch.Tensor, group=None, *, tag=None) -> torch.Tensor:
    """My slice [b, s/t, h] -> [b, s, h] for a consumer that is the same on every rank (backward keeps my slice)."""
    return C.gather_from_group(x, SEQ_DIM, group, tag=tag)


class _GatherThenLinears(torch.autograd.Function):
    """SP entry that keeps only the sequence slice for backward (Korthikanti et al. 2022, section 4.2.2).

    Forward: gather x [b, s/t, h] -> x_full [b, s, h]; y_i = x_full W_i^T. Saved: x (the slice), not x_full.
    Backward: gather x again (the extra all-gather that buys activation memory / t), dW_i = dy_i^T x_full,
    dx_full = sum_i dy_i W_i, reduce-scatter dx_full back to the slices."""

    @staticmethod
    def forward(ctx, x, g, tag, *weights):
        ctx.g, ctx.tag = g, tag
        ctx.save_for_backward(x, *weights)
        x_full = C.all_gather_tensor(x, SEQ_DIM, g, tag=tag)
        return tuple(F.linear(x_full, w) for w in weights)

    @staticmethod
    def backward(ctx, *dys):
        x, *weights = ctx.saved_tensors
        x_full = C.all_gather_tensor(x, SEQ_DIM, ctx.g, phase="backward", tag=f"{ctx.tag}.regather".lstrip("."))
        flat_x = x_full.reshape(-1, x_full.shape[-1])
        dx_full = torch.zeros_like(x_full)
        dws = []
        for dy, w in zip(dys, weights):
            flat_dy = dy.reshape(-1, dy.shape[-1])
            dws.append(flat_dy.t() @ flat_x)
            dx_full = dx_full + (flat_dy @ w).view_as(x_full)
        dx = C.reduce_scatter_tensor(dx_full, SEQ_DIM, ctx.g, phase="backward", tag=ctx.tag)
        return (dx, None, None, *dws)


def column_parallel_linears(
    x: torch.Tensor,
    weights,
    biases=None,
    group=None,
    *,
    sequence_parallel: bool = False,
    regather: bool = False,
    tag=None,
) -> list[torch.Tensor]:
    """Enter the TP region once and apply several column-parallel weights to the same input.

    x [b, s, h] or [b, s/t, h] (SP); weights W_i [out_i/t, h] (torch layout [out, in]) -> y_i [b, s, out_i/t].
    One crossing for Q, K and V (or for SwiGLU's gate and up): one all-reduce in backward, not three. Megatron
    fuses the weights into one matrix for the same reason.
    regather (SP only): save the sequence slice instead of the gathered input and gather again in backward."""
    biases = [None] * len(weights) if biases is None else list(biases)
    tag = tag if tag is not None else current_tag()
    g = C.resolve_group(group)
    if sequence_parallel and regather and g.size > 1:
        outs = list(_GatherThenLinears.apply(x, g, tag, *weights))
        return [y if b is None else y + b for y, b in zip(outs, biases)]
    x_full = enter_tp_region(x, g, sequence_parallel, tag=tag)
    return [F.linear(x_full, w, b) for w, b in zip(weights, biases)]
