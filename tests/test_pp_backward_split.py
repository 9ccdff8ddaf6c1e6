"""The backward of a pipeline stage split into B (input gradient) and W (weight gradient): the same float64 bits
as the fused backward, every autograd node run once, and the refusals it makes."""

import pytest
import torch
import torch.nn as nn

from pylib.model import build_model, random_tokens
from pylib.plan.presets import tiny_gqa
from pylib.pp.backward import backward_input
from pylib.pp.split import split_model

CFG = tiny_gqa().with_(n_layers=4)
P = 4


def _graph(root):
    seen, stack = set(), [root]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(fn for fn, _ in node.next_functions)
    return seen


def _pipeline_backward(split: bool, watch: bool = False):
    """Forward the four stages of the tiny model one after another, then their backwards from the last: fused,
    or B for every stage first and every W after (the latest a schedule can put them)."""
    chunks = [c[0] for c in split_model(build_model(CFG), P)]
    ids, targets = random_tokens(CFG, 2, 4, seed=1)
    ins, outs, h = [], [], ids
    for k, chunk in enumerate(chunks):
        x = h if k == 0 else h.detach().requires_grad_()
        ins.append(x)
        h = chunk(x, targets) if k == P - 1 else chunk(x)
        outs.append(h)
    runs = {"B": [], "W": []}
    phase = ["B"]
    hooks = []
    if watch:  # which autograd nodes run in which phase
        for y in outs:
            for node in _graph(y.grad_fn):
                hooks.append(node.register_prehook(lambda g, n=node: runs[phase[0]].append(n)))
    dy, dxs, ws = None, [], []
    for k in reversed(range(P)):
        x = ins[k] if k > 0 else None
        if split:
            dx, w = backward_input(outs[k], dy, x, list(chunks[k].parameters()))
            ws.append(w)
        else:
            torch.autograd.backward(outs[k], dy)
            dx = None if x is None else x.grad
        dxs.append(dx)
        dy = dx
    phase[0] = "W"
    runs["frontier"] = {node for w in ws for node, _, _ in w.frontier}
    for w in ws:
        w.run()
    for h in hooks:
        h.remove()
    grads = {n: p.grad for c in chunks for n, p in c.named_parameters()}
    return dxs, grads, runs, ws


@pytest.fixture(scope="module")
def both():
    """The fused and the split backward of the same four stages, each autograd node's runs recorded."""
    return _pipeline_backward(split=False, watch=True), _pipeline_backward(split=True, watch=True)


@pytest.mark.slow
def test_split_backward_gives_the_fused_input_and_weight_gradients_bit_for_bit_in_float64(both):
    (dx_fused, g_fused, _, _), (dx_split, g_split, _, _) = both
    assert CFG.dtype == "float64"
    for a, b in zip(dx_fused, dx_split):
        assert (a is None and b is None) or torch.equal(a, b)
    assert set(g_fused) == set(g_split) == {n for n, _ in build_model(CFG).named_parameters()}
    for name, g in g_fused.items():
        assert g_split[name] is not None and torch.equal(g_split[name], g), name


@pytest.mark.slow
def test_b_and_w_share_only_the_frontier_nodes_so_nothing_is_computed_twice(both):
    (_, _, fused, _), (_, _, split, ws) = both
    b, w = split["B"], split["W"]
    assert len(set(b)) == len(b) and len(set(fused["B"])) == len(fused["B"])  # each node once per phase
    # a node runs in both phases only when it is a frontier node (its input side in B, its weight side in W)
    both = set(b) & set(w)
    assert both and len(both) < len(set(w))
    assert both == split["frontier"]
    # the same nodes as the fused backward, no more; only the AccumulateGrad of each received input x (stages
    # 1..P-1) does not run: B returns x's gradient instead of accumulating it into x.grad
    assert len(b) + len(w) - len(both) == len(fused["B"]) - (P - 1)
    assert all(x.frontier == [] for x in ws)  # W released what it kept


def _middle_stage(seed):
    """A middle stage (the second of P) of the reference model, run forward on a random float64 input: (the
    stage, its input, its output, a fixed output gradient)."""
    chunk = split_model(build_model(CFG), P)[1][0]
    x = torch.randn(2, 8, CFG.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    x.requires_grad_()
    y = chunk(x)
    dy = torch.linspace(-1, 1, y.numel(), dtype=torch.float64).reshape(y.shape)
    return chunk, x, y, dy


def test_one_middle_stage_split_gives_the_fused_bits_and_keeps_the_output_gradients_w_needs():
    grads = []
    for split in (False, True):
        chunk, x, y, dy = _middle_stage(seed=3)
        if split:
            dx, w = backward_input(y, dy, x, list(chunk.parameters()))
            assert all(p.grad is None for p in chunk.parameters())  # B computed no weight gradient
            assert w.stash_bytes > 0 and w.stash_bytes % (2 * 8) == 0  # kept [2, 8, ...] output gradients
            w.run()
        else:
            torch.autograd.backward(y, dy)
            dx = x.grad
        grads.append((dx, {n: p.grad for n, p in chunk.named_parameters()}))
    (dx_fused, fused), (dx_split, split_grads) = grads
    assert torch.equal(dx_fused, dx_split)
    assert all(torch.equal(split_grads[n], g) for n, g in fused.items())
    assert dx_split.shape == x.shape
    with pytest.raises(RuntimeError, match="already ran"):
        w.run()


def test_the_first_stage_has_no_input_gradient_and_runs_its_whole_backward_in_w():
    chunk = split_model(build_model(CFG), P)[0][0]
    ids, _ = random_tokens(CFG, 2, 8, seed=2)
    y = chunk(ids)
    dx, w = backward_input(y, torch.ones_like(y), None, list(chunk.parameters()))
    assert dx is None and all(p.grad is None for p in chunk.parameters())
    w.run()
    assert all(p.grad is not None for p in chunk.parameters())


def test_a_parameter_used_twice_in_a_stage_is_refused():
    lin = nn.Linear(3, 3, dtype=torch.float64)
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    y = lin(torch.tanh(lin(x)))
    with pytest.raises(ValueError, match="used at two places"):
        backward_input(y, torch.ones_like(y), x, list(lin.parameters()))


@pytest.mark.slow
def test_our_split_gives_the_bits_of_torch_pipelinings_stage_backward_input_and_weight():
    # torch 2.13, torch/distributed/pipelining/_backward.py: the same graph walk, W per parameter group
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    grads = []
    for ours in (True, False):
        chunk, x, y, dy = _middle_stage(seed=0)
        if ours:
            dx, w = backward_input(y, dy, x, list(chunk.parameters()))
            w.run()
        else:
            (dx,), groups = stage_backward_input([y], [dy], [x], iter(list(chunk.parameters())))
            stage_backward_weight(iter(list(chunk.parameters())), groups)
        grads.append((dx, {n: q.grad for n, q in chunk.named_parameters()}))
    (dx_ours, g_ours), (dx_torch, g_torch) = grads
    assert torch.equal(dx_ours, dx_torch)
    assert set(g_ours) == set(g_torch)
    for name, g in g_torch.items():
        assert torch.equal(g_ours[name], g), name
