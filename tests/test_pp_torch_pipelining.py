"""Cross-check against PyTorch's own pipeline runtime (torch.distributed.pipelining) on the same stage modules.

PyTorch's ScheduleGPipe / Schedule1F1B call the loss function on each microbatch and back-propagate it unscaled;
with `scale_grads=True` (its default) they divide every gradient by the number of microbatches m after the last
backward. We divide each microbatch's loss by m before its backward instead (as Megatron does). Both give the
full-batch mean gradient; PyTorch with `scale_grads=False` gives m times it. Its losses come back per microbatch,
unscaled: their mean is the full-batch loss.

PyTorch's interleaved schedules are deliberately not run here: on gloo, ScheduleInterleaved1F1B was seen to hang
about once in six runs.
"""

import pytest
import torch
import torch.distributed as dist

from pylib.model import build_model, random_tokens
from pylib.plan.presets import tiny
from pylib.pp.pipeline import PipelineParallel
from pylib.pp.split import lm_loss, rank_chunks
from pylib.runtime import launch
from tests.conftest import assert_float64_close

CFG = tiny()
B, S, M = 8, 8, 4
TORCH_SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


def _torch_step(model, kind, scale_grads):
    # Imported here, not at the top: importing torch.distributed.pipelining costs ~1.5 s, paid at every collection
    # of the suite although every test of this file is slow.
    from torch.distributed import pipelining

    rank, p = dist.get_rank(), dist.get_world_size()
    chunk = rank_chunks(model, rank, p)[0]
    stage = pipelining.PipelineStage(chunk, rank, p, torch.device("cpu"))
    schedule = getattr(pipelining, TORCH_SCHEDULES[kind])(stage, M, loss_fn=lm_loss, scale_grads=scale_grads)
    ids, targets = random_tokens(CFG, B, S, seed=3)
    losses = []
    if rank == 0:
        schedule.step(ids)
    elif rank == p - 1:
        schedule.step(target=targets, losses=losses)
    else:
        schedule.step()
    loss = sum(x.item() for x in losses) / len(losses) if losses else None
    return loss, {k: q.grad for k, q in chunk.named_parameters()}


def _compare():
    model = build_model(CFG)
    ids, targets = random_tokens(CFG, B, S, seed=3)
    out = {}
    for kind in TORCH_SCHEDULES:
        pipe = PipelineParallel(model)
        run = pipe.step(ids, targets, schedule=kind, n_microbatches=M)
        out[kind] = dict(
            ours=(run.loss, {k: q.grad for k, q in pipe.named_parameters()}),
            torch=_torch_step(model, kind, scale_grads=True),
            torch_unscaled=_torch_step(model, kind, scale_grads=False),
        )
    return out


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("p", [2, 4])
def test_our_gpipe_and_1f1b_match_pytorch_pipelining_loss_and_gradients(p):
    ref = build_model(CFG)
    ids, targets = random_tokens(CFG, B, S, seed=3)
    loss = ref.loss(ids, targets)
    loss.backward()
    results = launch(_compare, p, timeout=90)
    for kind in TORCH_SCHEDULES:
        for who in ("ours", "torch", "torch_unscaled"):
            assert results[-1][kind][who][0] == pytest.approx(loss.item(), abs=1e-12), (kind, who)
        grads = {who: {} for who in ("ours", "torch", "torch_unscaled")}
        for r in results:
            for who in grads:
                grads[who].update(r[kind][who][1])
        for k, q in ref.named_parameters():
            assert_float64_close(grads["ours"][k], grads["torch"][k], f"{kind} {k}")
            assert_float64_close(grads["ours"][k], q.grad, f"{kind} {k}")
            # without scale_grads PyTorch sums m microbatch-mean gradients: m times the full-batch gradient
            torch.testing.assert_close(grads["torch_unscaled"][k], M * q.grad, rtol=0, atol=1e-11, msg=f"{kind} {k}")
