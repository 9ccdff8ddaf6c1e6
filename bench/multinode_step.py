"""One composed training step for a multi-node launch, checked on every rank against the single-device reference.

    torchrun --nnodes N --nproc-per-node G --rdzv-backend c10d --rdzv-endpoint HEAD:29500 --rdzv-id JOB \
        -m pylib.runtime.torchrun multinode_step:composed_step          # with bench/ on PYTHONPATH

The mesh follows the machines: tensor parallelism (with SP) inside a node, over its G processes, where the links
are fast; ZeRO-1 data parallelism across the N nodes. The model's sizes are scaled so G divides what TP splits.
Each rank prints `[rank r] result: {...}` with its largest loss and parameter error against the reference (both
below 1e-12 in float64) and which reference parameters it holds. tests/test_runtime_multinode.py runs it as two
agents on 127.0.0.1; bench/slurm/train_2node.sbatch runs it on a Slurm cluster.
"""

from __future__ import annotations

import os

import torch.distributed as dist

from pylib.experiments.compose_training import compare_with_reference, train, train_reference
from pylib.model import ModelConfig
from pylib.plan import RunOptions, ZeroStage
from pylib.runtime import ParallelConfig


def mesh_for(world: int, per_node: int) -> ParallelConfig:
    """TP over a node's processes, DP over the nodes."""
    if per_node < 1 or world % per_node:
        raise ValueError(f"world size {world} is not a whole number of nodes of {per_node} processes")
    return ParallelConfig(tp=per_node, dp=world // per_node)


def composed_step(steps: int = 2) -> dict:
    """Inside a torchrun worker: `steps` composed steps and this rank's errors against the reference."""
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
    pc = mesh_for(dist.get_world_size(), per_node)
    tp, dp = pc.tp, pc.dp
    cfg = ModelConfig(
        vocab_size=16 * tp,
        d_model=8 * tp,
        n_layers=2,
        n_heads=2 * tp,
        d_ff=16 * tp,
        mlp="swiglu",
        position="rope",
        dtype="float64",
    )
    batch, seq = 2 * dp, 4 * tp  # dp divides the batch; SP splits the sequence over tp
    options = RunOptions(zero_stage=ZeroStage.ZERO1, sequence_parallel=True)
    result = train(cfg, pc, options, steps=steps, batch=batch, seq=seq)
    ref = train_reference(cfg, steps=steps, batch=batch, seq=seq)
    err = compare_with_reference([result], ref)
    return dict(
        mesh=f"tp={tp} dp={dp}",
        node=os.environ.get("GROUP_RANK"),
        loss_err=err["loss_err"],
        param_err=err["param_err"],
        covered=sorted(set(ref["params"]) - set(err["missing"])),
        every=sorted(ref["params"]),
    )
