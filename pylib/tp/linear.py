"""Column- and row-parallel linear layers, built from a reference `nn.Linear` (each rank keeps its slice).

torch stores a linear's weight as [out, in] and computes y = x W^T; article B writes W as [in, out] and y = x W.
So article B's *column* split (split the output features) is a split of torch's dim 0, and its *row* split (split
the input features) is a split of torch's dim 1. Shapes below are torch's.

    ColumnParallelLinear   W [out/t, in]   x [b, s, in] (whole)   -> y [b, s, out/t]  my output columns, no comm
    RowParallelLinear      W [out, in/t]   x [b, s, in/t] (mine)  -> partial [b, s, out], summed over TP (g)

Column then row (Q/K/V then W_O; W_up then W_down) needs no communication in between: the column split's
output slice is exactly the row split's input slice. The pair costs one crossing in, one out.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from pylib.runtime import ShardSpec, require_divisible
from pylib.runtime import collectives as C
from pylib.runtime.tracer import current_tag

from .grads import mark_sequence_parallel
from .regions import column_parallel_linears, leave_tp_region


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.detach().clone().contiguous())


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W split along the output features: rank r holds rows [r*out/t, (r+1)*out/t) of W.

    x: [b, s, in] replicated over TP, or [b, s/t, in] (my sequence slice) with sequence_parallel.
    Returns [b, s, out/t] (my output features), or [b, s, out] on every rank with gather_output.
    regather (SP only): keep the sequence slice for backward and all-gather it again there (Megatron's choice).
    """

    def __init__(
        self,
        weight,
        bias,
        group,
        *,
        gather_output=False,
        sequence_parallel=False,
        regather=False,
        full_shape=None,
        kind="column",
        replicas=1,
    ):
        super().__init__()
        self.group = C.resolve_group(group)
        self.weight = _param(weight)
        self.bias = _param(bias) if bias is not None else None
        self.gather_output, self.sequence_parallel, self.regather = gather_output, sequence_parallel, regather
        self.full_shape = tuple(full_shape or (weight.shape[0] * self.group.size, weight.shape[1]))
        self.kind, self.replicas = kind, replicas
        if replicas > 1:
            self.weight.kv_replicas = replicas
            if self.bias is not None:
                self.bias.kv_replicas = replicas

    @classmethod
    def from_full(
        cls,
        linear: nn.Linear,
        *,
        group=None,
        gather_output=False,
        sequence_parallel=False,
        regather=False,
        what="out_features",
    ):
        """Keep this rank's rows of `linear.weight` [out, in] (and of its bias)."""
        g = C.resolve_group(group)
        out = linear.weight.shape[0]
        require_divisible(out, g.size, "tp", what)
        rows = slice(g.rank * out // g.size, (g.rank + 1) * out // g.size)
        bias = linear.bias[rows] if linear.bias is not None else None
        return cls(
            linear.weight[rows],
            bias,
            g,
            gather_output=gather_output,
            sequence_parallel=sequence_parallel,
            regather=regather,
            full_shape=tuple(linear.weight.shape),
        )

    def local(self, x_full: torch.Tensor) -> torch.Tensor:
        """The rank's matmul alone, on the input already inside the TP region: [b, s, in] -> [b, s, out/t]."""
        return F.linear(x_full, self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tag = current_tag()
        y = column_parallel_linears(
            x,
            [self.weight],
            [self.bias],
            self.group,
            sequence_parallel=self.sequence_parallel,
            regather=self.regather,
            tag=tag,
        )[0]
        if self.gather_output:
            y = C.gather_from_group(y, -1, self.group, tag=tag)
        return y

    def shard_specs(self, prefix: str = "") -> list[ShardSpec]:
        note = "torch [out, in]: split dim 0 = article B's column split of W [in, out]"
        if self.replicas > 1:
            note = f"K/V head held whole by {self.replicas} TP ranks; gradient summed over them"
        specs = [ShardSpec(prefix + "weight", "tp", 0, self.kind, self.full_shape, tuple(self.weight.shape), note)]
        if self.bias is not None:
            specs.append(
                ShardSpec(prefix + "bias", "tp", 0, self.kind, (self.full_shape[0],), tuple(self.bias.shape), note)
            )
        return specs

    def extra_repr(self) -> str:
        return (
            f"local={tuple(self.weight.shape)}, full={self.full_shape}, tp={self.group.size}, "
            f"sequence_parallel={self.sequence_parallel}"
        )


class RowParallelLinear(nn.Module):
    """y = sum_r x_r W_r^T + b with W split along the input features: rank r holds columns
    [r*in/t, (r+1)*in/t) of W [out, in]; the bias is replicated and added once, after the sum.

    x: [b, s, in/t] (my input features; input_is_parallel) or [b, s, in] (then each rank takes its slice).
    Returns the sum over TP: [b, s, out] on every rank, or my sequence slice [b, s/t, out] with sequence_parallel.
    """

    def __init__(self, weight, bias, group, *, input_is_parallel=True, sequence_parallel=False, full_shape=None):
        super().__init__()
        self.group = C.resolve_group(group)
        self.weight = _param(weight)
        self.bias = _param(bias) if bias is not None else None
        if self.bias is not None and sequence_parallel:
            mark_sequence_parallel(self.bias)
        self.input_is_parallel, self.sequence_parallel = input_is_parallel, sequence_parallel
        self.full_shape = tuple(full_shape or (weight.shape[0], weight.shape[1] * self.group.size))

    @classmethod
    def from_full(
        cls, linear: nn.Linear, *, group=None, input_is_parallel=True, sequence_parallel=False, what="in_features"
    ):
        """Keep this rank's columns of `linear.weight` [out, in]; the bias stays whole."""
        g = C.resolve_group(group)
        n_in = linear.weight.shape[1]
        require_divisible(n_in, g.size, "tp", what)
        cols = slice(g.rank * n_in // g.size, (g.rank + 1) * n_in // g.size)
        return cls(
            linear.weight[:, cols],
            linear.bias,
            g,
            input_is_parallel=input_is_parallel,
            sequence_parallel=sequence_parallel,
            full_shape=tuple(linear.weight.shape),
        )

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's partial sum x_r W_r^T [b, s, out], before the reduction (no bias)."""
        if not self.input_is_parallel:
            x = C.split_to_group(x, -1, self.group)
        return F.linear(x, self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = leave_tp_region(self.partial(x), self.group, self.sequence_parallel, tag=current_tag())
        return y if self.bias is None else y + self.bias

    def shard_specs(self, prefix: str = "") -> list[ShardSpec]:
        note = "torch [out, in]: split dim 1 = article B's row split of W [in, out]; partial sums reduced over TP"
        specs = [ShardSpec(prefix + "weight", "tp", 1, "row", self.full_shape, tuple(self.weight.shape), note)]
        if self.bias is not None:
            bnote = "added after the reduction" + (
                "; SP: gradient all-reduced over TP" if self.sequence_parallel else ""
            )
            specs.append(
                ShardSpec(
                    prefix + "bias", "tp", None, "replicated", tuple(self.bias.shape), tuple(self.bias.shape), bnote
                )
            )
        return specs

    def extra_repr(self) -> str:
        return (
            f"local={tuple(self.weight.shape)}, full={self.full_shape}, tp={self.group.size}, "
            f"sequence_parallel={self.sequence_parallel}"
        )
