"""PyTorch's own tensor parallelism of a reference block, for cross-checking `pylib.tp` (tests and bench).

`torch.distributed.tensor.parallel` on a 1-D CPU (gloo) or GPU mesh: the same cuts as `TPBlock`, made by
DTensor's styles instead of our layers. DTensor issues its own collectives, so the tracer does not see this
block's traffic; it is a reference to compare outputs, gradients and step time with, not part of pylib's runtime.
"""

from __future__ import annotations

import copy


def dtensor_block(block, t: int, sequence_parallel: bool):
    """A deep copy of a reference `Block`, parallelised by PyTorch's TP styles on a 1-D CPU mesh of t ranks.

    TP: Q, K, V, W_up (and W_gate) colwise, W_O and W_down rowwise. SP adds SequenceParallel on the LayerNorms
    (input and output [b, s/t, h]: sharded along the sequence, dim 1), an all-gather into attention and the MLP, and
    a reduce-scatter out of W_O and W_down."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (t,))
    out = Shard(1) if sequence_parallel else Replicate()
    plan = {f"attn.{p}": ColwiseParallel() for p in ("q_proj", "k_proj", "v_proj")}
    plan["attn.o_proj"] = RowwiseParallel(output_layouts=out)
    for p in ("gate_proj", "up_proj"):
        if hasattr(block.mlp, p):
            plan[f"mlp.{p}"] = ColwiseParallel()
    plan["mlp.down_proj"] = RowwiseParallel(output_layouts=out)
    if sequence_parallel:
        plan["ln1"] = SequenceParallel()
        plan["ln2"] = SequenceParallel()
        plan["attn"] = PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None))
        plan["mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return parallelize_module(copy.deepcopy(block), mesh, plan)
