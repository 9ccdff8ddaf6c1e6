"""Cross-check against PyTorch's own tensor parallelism: the reference block parallelised with
`torch.distributed.tensor.parallel` (ColwiseParallel / RowwiseParallel / SequenceParallel on a CPU DeviceMesh, gloo)
gives the same output, input gradient and parameter gradients as our TPBlock, shard for shard.

DTensor talks to torch.distributed itself; that is PyTorch's implementation, used here only as a witness."""

import pytest
import torch
import torch.distributed as dist
import torch.distributed.tensor.parallel  # noqa: F401  (~4 s to import: once here, the forked ranks inherit it)

from pylib.model import ModelConfig, build_model, random_hidden, torch_dtype
from pylib.runtime import launch
from pylib.tp import TPBlock, finalize_grads
from pylib.tp.dtensor import dtensor_block

TOL = 1e-12


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _pending_sum(g) -> bool:
    """True when a DTensor gradient is a Partial placement: a sum over the mesh not yet carried out."""
    return hasattr(g, "placements") and any(p.is_partial() for p in g.placements)


def _cross_check(cases):
    t, r = dist.get_world_size(), dist.get_rank()
    out = {}
    for name, cfg, sp in cases:
        ref = build_model(cfg).layers[0]
        ours, theirs = TPBlock.from_full(ref, sequence_parallel=sp), dtensor_block(ref, t, sp)
        x = random_hidden(2, 8, cfg.d_model, dtype=torch_dtype(cfg.dtype))
        w = random_hidden(2, 8, cfg.d_model, seed=1, dtype=torch_dtype(cfg.dtype))
        if sp:
            x, w = x.chunk(t, 1)[r], w.chunk(t, 1)[r]
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        y1, y2 = ours(x1), _local(theirs(x2))
        (y1 * w).sum().backward()
        (y2 * w).sum().backward()
        finalize_grads(ours)
        # PyTorch leaves the SP LayerNorm gradients as Partial (the sum over TP our finalize_grads does is pending
        # until the gradient is redistributed); full_tensor() carries the sum out
        partial = sorted(n for n, p in theirs.named_parameters() if _pending_sum(p.grad))
        theirs_grads = {
            n: p.grad.full_tensor() if _pending_sum(p.grad) else _local(p.grad) for n, p in theirs.named_parameters()
        }
        errs = {"output": (y1 - y2).abs().max().item(), "input_grad": (x1.grad - x2.grad).abs().max().item()}
        for n, p in ours.named_parameters():
            errs[n] = (p.grad - theirs_grads[n]).abs().max().item()
        out[name] = errs, partial
    return out


def _cases(t):
    heads, kv = (4, 2) if t == 2 else (8, 4)
    gqa = ModelConfig(d_model=32, n_heads=heads, n_kv_heads=kv, d_ff=64, mlp="swiglu", position="rope", dtype="float64")
    mha = ModelConfig(d_model=16, n_heads=4, d_ff=32, dtype="float64")
    return [(f"{n}-sp{sp}", c, sp) for n, c in (("mha-gelu", mha), ("gqa-swiglu-rope", gqa)) for sp in (False, True)]


@pytest.mark.parametrize("t", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_tp_block_matches_pytorch_dtensor_tensor_parallel_outputs_and_grads(t):
    for rank, res in enumerate(launch(_cross_check, t, _cases(t), timeout=120)):
        for name, (errs, partial) in res.items():
            bad = {k: v for k, v in errs.items() if not v < TOL}
            assert not bad, f"t={t} rank {rank} {name}: {bad}"
            sp = name.endswith("spTrue")
            assert partial == (sorted(f"{ln}.{p}" for ln in ("ln1", "ln2") for p in ("bias", "weight")) if sp else [])
