"""The B/W split on a tensor-parallel stage (2 gloo ranks): the collectives of TP and SP are conjugate pairs on
the input path (`pylib.runtime.collectives`), so B runs all of them and W is local matmuls only -- the same bits as
the fused backward. The one exception, measured: SP with `regather=True` computes input and weight gradients in
one custom autograd function (`pylib.tp.regions._GatherThenLinears`), which W must run again, all-gather and all."""

import pytest
import torch
import torch.nn.functional as F

from pylib.model import MLP
from pylib.pp.backward import backward_input
from pylib.runtime import launch, trace
from pylib.tp.mlp import TPMLP

pytestmark = pytest.mark.timeout(120)
H, FF, B, S = 8, 16, 2, 4


def _mlp():
    torch.manual_seed(0)
    return MLP(H, FF, "swiglu").to(torch.float64)


def _split_vs_fused(sequence_parallel, regather):
    import torch.distributed as dist

    rank, t = dist.get_rank(), dist.get_world_size()
    out = {}
    for split in (False, True):
        layer = TPMLP.from_full(_mlp(), sequence_parallel=sequence_parallel, regather=regather)
        x_full = torch.randn(B, S, H, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        x = (x_full.chunk(t, dim=1)[rank] if sequence_parallel else x_full).clone().requires_grad_()
        y = F.silu(layer(x))  # a nonlinearity above the layer, as the next one would be
        dy = torch.ones_like(y)
        with trace() as tr_b:
            if split:
                dx, w = backward_input(y, dy, x, list(layer.parameters()))
            else:
                torch.autograd.backward(y, dy)
                dx = x.grad
        with trace() as tr_w:
            if split:
                w.run()
        out[split] = dict(
            dx=dx,
            grads={n: p.grad for n, p in layer.named_parameters()},
            b_ops=[e.op for e in tr_b.events if e.phase == "backward"],
            w_ops=[e.op for e in tr_w.events if e.phase == "backward"],
        )
    return out


@pytest.mark.slow
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_split_on_a_tensor_parallel_mlp_is_bit_equal_and_w_issues_no_collective(sp):
    for r in launch(_split_vs_fused, 2, sp, False, timeout=60):
        fused, split = r[False], r[True]
        assert torch.equal(fused["dx"], split["dx"])
        assert all(torch.equal(g, split["grads"][n]) for n, g in fused["grads"].items())
        assert split["b_ops"] == fused["b_ops"] and fused["b_ops"]  # every backward collective, in B
        assert split["w_ops"] == []


@pytest.mark.slow
def test_sp_regather_fuses_input_and_weight_gradients_so_w_repeats_its_collectives():
    for r in launch(_split_vs_fused, 2, True, True, timeout=60):
        fused, split = r[False], r[True]
        assert all(torch.equal(g, split["grads"][n]) for n, g in fused["grads"].items())  # still right
        assert split["w_ops"]  # but W runs the custom function's backward again: all-gather and reduce-scatter
