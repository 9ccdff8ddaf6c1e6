"""Cross-check against PyTorch's own pipeline runtime (torch.distributed.pipelining) on the same stage modules.

PyTorch's ScheduleGPipe / Schedule1F1B call the loss function on each microbatch and back-propagate it unscaled;
with `scale_grads=True` (its default) they divide every gradient by the number of microbatches m after the last
backward. We divide each microbatch's loss by m before its backward instead (as Megatron does). Both give the
full-batch mean gradient; PyTorch with `scale_grads=False` gives m times it. Its losses come back per microbatch,
unscaled: their mean is the full-batch loss.

PyTorch's interleaved schedules are deliberately not run here: on gloo, ScheduleInterleaved1F1B was seen to hang
about once in six runs.

The V-shaped schedules (ScheduleZBVZeroBubble, ScheduleDualPipeV, torch 2.13) and ScheduleInterleavedZeroBubble
with one stage per rank (our ZB-H1): the same stage modules in the V placement (`rank_chunks(..., placement="v")`;
ZB-H1: the loop) give the same loss and the same gradient bits as ours, and torch's
action order (its `pipeline_order`: F, I = our split B, B = our unsplit B, W, and the overlapped F&B pairs) is ours.
"""

import pytest
import torch
import torch.distributed as dist

from pylib.model import build_model, random_tokens
from pylib.plan.presets import tiny, tiny_gqa
from pylib.plan.schedules import build
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


V_CFG = tiny_gqa().with_(n_layers=8)
# ours -> torch's: ScheduleInterleavedZeroBubble (torch's "ZB1P") with one stage per rank is our ZB-H1: 1F1B's
# warm-up (its _get_warmup_ops with multiply_factor=1: p-1-r forwards), each backward split, and rank r's W of
# microbatch k right after its B of microbatch k+r (_get_1f1b_rank_ops' num_1f1b_microbatches = rank), the rest at
# the end. With several stages per rank it interleaves them; we build no interleaved ZB-H1 to compare it with.
TORCH_V = {"zb-v": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV", "zb-h1": "ScheduleInterleavedZeroBubble"}


def _as_torch_order(sched, rank):
    """Our compute order of `rank` in torch's action notation: stage, then F / I (a B whose W runs later) / B (the
    whole backward) / W, then the microbatch; an overlapped F&B slot as its two joined by "&"."""
    acts, split = sched.compute(rank), sched.deferred(rank)
    names = [f"{a.stage}{'I' if a.op == 'B' and (a.mb, a.chunk) in split else a.op}{a.mb}" for a in acts]
    out, i = [], 0
    while i < len(acts):
        out.append(names[i] + "&" + names[i + 1] if acts[i].overlapped else names[i])
        i += 2 if acts[i].overlapped else 1
    return out


def _compare_v(m):
    from torch.distributed import pipelining

    rank, p = dist.get_rank(), dist.get_world_size()
    model = build_model(V_CFG)
    ids, targets = random_tokens(V_CFG, B, S, seed=3)
    out = {}
    for name, cls in TORCH_V.items():
        v, placement = (1, "loop") if name == "zb-h1" else (2, "v")
        pipe = PipelineParallel(model, v=v, placement=placement)
        run = pipe.step(ids, targets, schedule=name, n_microbatches=m)
        chunks = rank_chunks(model, rank, p, v, placement=placement)
        stages = [pipelining.PipelineStage(c, c.stage, v * p, torch.device("cpu")) for c in chunks]
        schedule = getattr(pipelining, cls)(stages, m, loss_fn=lm_loss)
        losses = []
        last = rank == (0 if placement == "v" else p - 1)  # the rank holding the loss
        if rank == 0:
            schedule.step(ids, target=targets, losses=losses) if last else schedule.step(ids)
        else:
            schedule.step(target=targets, losses=losses) if last else schedule.step()
        order = [
            "&".join(str(x) for x in a.sub_actions) if a.sub_actions else str(a)
            for a in schedule.pipeline_order[rank]
            if a is not None
        ]
        out[name] = dict(
            ours=(run.loss, {k: q.grad for k, q in pipe.named_parameters()}),
            torch=(
                sum(x.item() for x in losses) / m if losses else None,
                {k: q.grad for c in chunks for k, q in c.named_parameters()},
            ),
            orders=(_as_torch_order(build(name, p, m, v), rank), order),
        )
    return out


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("p, m", [(4, 8)])
def test_our_zb_h1_zb_v_and_dualpipev_match_pytorchs_schedules_in_order_loss_and_gradient_bits(p, m):
    results = launch(_compare_v, p, m, timeout=90)
    for name in TORCH_V:
        last = 0 if name != "zb-h1" else p - 1  # the loss: on rank 0 in the V, on rank p-1 in the loop
        assert results[last][name]["ours"][0] == results[last][name]["torch"][0] is not None, name
        for r in range(p):
            ours, theirs = results[r][name]["orders"]
            assert ours == theirs, (name, r)
            mine, torch_grads = results[r][name]["ours"][1], results[r][name]["torch"][1]
            assert set(mine) == set(torch_grads)
            assert all(torch.equal(mine[k], torch_grads[k]) for k in mine), (name, r)
