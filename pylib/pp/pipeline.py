"""The reference model run as a pipeline: this rank's chunks of it, and one call for a training step.

Inside a launched rank:

    pipe = PipelineParallel(build_model(cfg), group=mesh.pp, v=2)      # keeps only this rank's chunks
    pipe = PipelineParallel(model, group=mesh.pp, v=2, placement="v")   # the V (zb-v): stage r and 2p-1-r
    pipe = PipelineParallel(model, group=mesh.pp, v=2, placement="dual")  # DualPipe: stage r and p-1-r, two copies
    run = pipe.step(ids, targets, schedule="interleaved", n_microbatches=4)
    opt = torch.optim.SGD(pipe.parameters(), lr=0.1); opt.step()
    dict(pipe.named_parameters())          # reference names: "layers.3.mlp.up_proj.weight", ...

ids, targets: the whole batch [b, s] (only the ranks holding the first and the last stage read them).
"""

from __future__ import annotations

import functools

import torch

from pylib.plan.schedules import build

from ..model import Transformer, torch_dtype
from ..runtime import collectives as C
from .executor import Boundary, PipelineRun, microbatches, run_pipeline
from .split import rank_chunks, shard_specs


@functools.lru_cache(maxsize=64)
def _cached_schedule(name: str, p: int, n_microbatches: int, v: int, group_size: int | None):
    return build(name, p, n_microbatches, v, group_size=group_size)  # pure: the same arguments give the same lists


class PipelineParallel:
    """This rank's v chunks of the reference model on the pp group `group` (p = group size)."""

    def __init__(self, model: Transformer, group=None, *, v: int = 1, placement: str = "loop"):
        g = C.resolve_group(group)
        self.group, self.p, self.rank, self.v, self.placement = g, g.size, g.rank, v, placement
        self.cfg = model.cfg
        self.chunks = rank_chunks(model, g.rank, g.size, v, placement=placement)
        self._specs = shard_specs(model, g.rank, g.size, v, placement=placement)

    def parameters(self):
        return [p for chunk in self.chunks for p in chunk.parameters()]

    def named_parameters(self):
        """(reference name, parameter) for every parameter this rank holds."""
        return [(n, p) for chunk in self.chunks for n, p in chunk.named_parameters()]

    def zero_grad(self) -> None:
        for chunk in self.chunks:
            chunk.zero_grad(set_to_none=True)

    def shard_specs(self):
        return list(self._specs)

    def step(
        self,
        ids: torch.Tensor,
        targets: torch.Tensor,
        *,
        schedule: str = "1f1b",
        n_microbatches: int,
        group_size: int | None = None,
        **run_kw,
    ) -> PipelineRun:
        """Forward and backward of the whole batch [b, s] as m microbatches under `schedule`; gradients
        accumulate in .grad. Extra keywords go to `run_pipeline` (scale_loss, blocking_sends, recorder)."""
        m = n_microbatches
        sched = _cached_schedule(schedule, self.p, m, self.v, group_size)
        if sched.placement != self.placement:
            raise ValueError(
                f"schedule {schedule!r} places its stages {sched.placement!r} but this rank's chunks were cut for "
                f"{self.placement!r}: build PipelineParallel(model, v={sched.v}, placement={sched.placement!r})"
            )
        b, s = ids.shape
        run = run_pipeline(
            sched,
            self.chunks,
            group=self.group,
            inputs=microbatches(ids, m),
            targets=microbatches(targets, m),
            boundary=Boundary((b // m, s, self.cfg.d_model), torch_dtype(self.cfg.dtype)),
            **run_kw,
        )
        if self.placement == "dual":
            sum_copy_gradients(self.chunks, self.group)
        return run


def sum_copy_gradients(chunks, group) -> None:
    """DualPipe's last step: rank r's chunk 0 and rank p-1-r's chunk 1 are the two copies of model stage r, each
    with the gradient of its half of the microbatches; both get the sum. Each rank sends its two chunks' gradients
    to its mirror and adds the mirror's chunk 1 to its chunk 0 and chunk 0 to chunk 1 (one exchange of the whole
    rank's gradients per step, phase "grad_sync"; a + b = b + a in floating point, so the copies stay equal bit
    for bit). DeepSeek's DualPipe leaves this sum to the caller."""
    g = C.resolve_group(group)
    mirror = g.size - 1 - g.rank
    grads = [[q.grad if q.grad is not None else torch.zeros_like(q) for q in chunk.parameters()] for chunk in chunks]
    mine = torch.cat([t.reshape(-1) for c in grads for t in c])
    theirs = torch.empty_like(mine)
    work = C.isend(mine, mirror, g, phase="grad_sync", tag="pp.copies")
    C.recv(theirs, mirror, g, phase="grad_sync", tag="pp.copies")
    work.wait()
    n0 = sum(t.numel() for t in grads[0])
    # the mirror sent [its chunk 0 | its chunk 1]: its chunk 1 is our chunk 0's copy, its chunk 0 our chunk 1's
    other = {0: theirs[mine.numel() - n0 :], 1: theirs[: mine.numel() - n0]}
    for c, chunk in enumerate(chunks):
        offset = 0
        for q, t in zip(chunk.parameters(), grads[c]):
            q.grad = t + other[c][offset : offset + t.numel()].view_as(t)
            offset += t.numel()
