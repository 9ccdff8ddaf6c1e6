"""A stage's backward as two steps: B, the input gradient (what the previous stage waits for), then W, the
weight gradient (what only the optimizer step waits for). Zero-bubble schedules run W later, in the bubble.

    w = backward_input(y, dy, x, params)    # B: returns x's gradient; w holds what W needs
    ...                                      # other forwards and backwards of this rank
    w.run()                                  # W: accumulates into every parameter's .grad

How. Autograd records the stage's forward as a graph of nodes, each with edges to the nodes of its inputs. Some
nodes lie on a path from the output to the stage input x (the *input path*); a node on it whose other edges lead
to parameters is a *frontier* node -- the matmul of a linear layer (edges to its input, on the path, and to its
weight), the multiply of an RMSNorm (to its input and its gain). B computes x's gradient with
`torch.autograd.grad(y, x)`, which runs only the nodes on the input path and asks each frontier node for its
input-side gradient only; a hook on each frontier node keeps the gradient arriving at it (its output's gradient,
the "grad_output" of the layer). W starts `torch.autograd.backward` at each frontier node with that kept gradient
and asks for the parameters only, so each node computes just its weight side. Every node runs its backward
formula once per output edge it is asked for, never twice: nothing is recomputed, and each gradient is the same
float64 bits as the fused `torch.autograd.backward(y, dy)` (the same formula on the same tensors; the parameters'
.grad is accumulated by the same AccumulateGrad nodes, so hooks on them still fire).

Memory. B keeps the graph (`retain_graph=True`): the tensors the frontier nodes saved (each linear's input, each
norm's normalized input) stay alive until W, together with the kept output gradients (`stash_bytes`). A stage
whose input needs no gradient (the first stage: token ids) has no input path: B does nothing and W runs the whole
backward.

The same split elsewhere (read, not copied): Megatron-LM's `--delay-wgrad-compute` (d98e8a6,
megatron/core/transformer/..., TransformerEngine's `delay_wgrad_compute`) stashes (input, grad_output) per linear
layer in a custom autograd function and computes dW = grad_outputᵀ·input later -- per-layer code, and the
norms' and embeddings' gradients stay in B. torch 2.13's `torch.distributed.pipelining._backward`
(`stage_backward_input` / `stage_backward_weight`) walks the autograd graph as here, for any module. We take the
graph walk (any stage module works, the executor stays generic, and every parameter's gradient moves to W), and
call W through `torch.autograd.backward(..., inputs=params)` so the gradients accumulate where a fused backward
puts them.

Tensor parallelism: TP's and SP's collectives are autograd functions on the input path (their backward is the
conjugate collective), so B runs every one of them and W is local matmuls only (tests/test_pp_backward_split_tp.py).

Limits. A parameter used at two places of one stage (reached from two frontier nodes) is refused: W from one
frontier would run back along the input path to the other and count that use twice. A custom autograd function
that returns its input and weight gradients from one backward (SP with `regather=True`:
`pylib.tp.regions._GatherThenLinears`) is a frontier node whose backward cannot run one side only: B runs it whole
and W runs it again, its all-gather and reduce-scatter included -- still the same gradients, but not free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, Node


def _node(t: torch.Tensor) -> Node | None:
    """The autograd node gradients of `t` flow into: its grad_fn, or (a leaf) its AccumulateGrad."""
    if t.grad_fn is not None:
        return t.grad_fn
    if not t.requires_grad:
        return None
    return t.view_as(t).grad_fn.next_functions[0][0]


def _walk(root: Node, x_node: Node | None, param_nodes: set[Node]) -> tuple[set[Node], set[Node]]:
    """One pass over the graph under `root`: the nodes from which x's node is reachable (the input path), and
    those from which some parameter's node is (both sets include the targets themselves)."""
    to_x: dict[Node, bool] = {}
    to_p: dict[Node, bool] = {}
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if not expanded:
            if node in to_x:
                continue
            to_x[node] = to_p[node] = False  # visiting; a DAG never meets it again before it is done
            stack.append((node, True))
            stack.extend((fn, False) for fn, _ in node.next_functions if fn is not None and fn not in to_x)
            continue
        children = [fn for fn, _ in node.next_functions if fn is not None]
        to_x[node] = node is x_node or any(to_x[c] for c in children)
        to_p[node] = node in param_nodes or any(to_p[c] for c in children)
    return {n for n, r in to_x.items() if r}, {n for n, r in to_p.items() if r}


@dataclass
class WeightGrad:
    """What W needs from B: the frontier nodes, the gradients kept at them, and the parameters each reaches.
    `run()` computes the weight gradients once; `stash_bytes` is what the kept gradients occupy."""

    frontier: list[tuple[Node, tuple, list[torch.Tensor]]] = field(default_factory=list)
    whole: tuple | None = None  # (output, grad_output, params): no input path, W is the whole backward
    done: bool = False

    @property
    def stash_bytes(self) -> int:
        kept = [g for _, grads, _ in self.frontier for g in grads if g is not None]
        if self.whole is not None and self.whole[1] is not None:
            kept.append(self.whole[1])
        return sum(g.numel() * g.element_size() for g in kept)

    def run(self) -> None:
        if self.done:
            raise RuntimeError("this W already ran: the graph it needed is gone")
        self.done = True
        if self.whole is not None:
            y, dy, params = self.whole
            torch.autograd.backward(y, grad_tensors=dy, inputs=params)
        for node, grads, params in self.frontier:
            edges = [(GradientEdge(node, i), g) for i, g in enumerate(grads) if g is not None]
            if edges and params:
                torch.autograd.backward([e for e, _ in edges], grad_tensors=[g for _, g in edges], inputs=params)
        self.frontier, self.whole = [], None  # the graph and the kept gradients are released here


def backward_input(
    y: torch.Tensor, dy: torch.Tensor | None, x: torch.Tensor | None, params: Sequence[torch.Tensor]
) -> tuple[torch.Tensor | None, WeightGrad]:
    """B of one stage: the gradient of its input `x` given its output `y` and the output's gradient `dy` (None
    when y is the scalar loss), and the `WeightGrad` whose `run()` is W. `params`: the stage's parameters."""
    params = [p for p in params if p.requires_grad]
    x_node = _node(x) if x is not None else None
    root = y.grad_fn
    if root is None:
        raise ValueError("the stage output has no autograd graph: was the forward run under no_grad?")
    if x_node is None:  # the first stage: no input gradient, W is the whole backward
        return None, WeightGrad(whole=(y, dy, params))
    by_node = {_node(p): p for p in params}
    on_path, to_params = _walk(root, x_node, set(by_node))
    if root not in on_path:  # the output does not depend on x: W is the whole backward
        return None, WeightGrad(whole=(y, dy, params))
    frontier: list[tuple[Node, list[torch.Tensor]]] = []
    owner: dict[Node, Node] = {}
    for node in on_path:
        side = [fn for fn, _ in node.next_functions if fn is not None and fn not in on_path and fn in to_params]
        if not side:
            continue
        mine = [by_node[a] for a in _reaching_all(side, set(by_node))]
        for p in mine:
            acc = _node(p)
            if acc in owner and owner[acc] is not node:
                raise ValueError(
                    f"a parameter of shape {tuple(p.shape)} is used at two places in this stage; the B/W split "
                    "needs each parameter used once (W from one use would run back through the other)"
                )
            owner[acc] = node
        frontier.append((node, mine))
    kept: dict[Node, tuple] = {}
    hooks = [node.register_prehook(_keep(kept, node)) for node, _ in frontier]
    try:
        (dx,) = torch.autograd.grad(y, x, grad_outputs=dy, retain_graph=True)
    finally:
        for h in hooks:
            h.remove()
    y.detach_()  # the nodes above the first frontier are no longer needed
    missed = [node.name() for node, _ in frontier if node not in kept]
    if missed:
        raise RuntimeError(f"B did not reach the frontier nodes {missed}: their weight gradients would be lost")
    return dx, WeightGrad(frontier=[(node, kept[node], mine) for node, mine in frontier])


def _keep(kept: dict, node: Node):
    def hook(grad_outputs):
        kept[node] = tuple(grad_outputs)

    return hook


def _reaching_all(starts: list[Node], targets: set[Node]) -> list[Node]:
    """The nodes of `targets` reachable from any of `starts`, in a stable order."""
    seen, out, stack = set(), [], list(reversed(starts))
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node in targets:
            out.append(node)
        stack.extend(fn for fn, _ in reversed(node.next_functions) if fn is not None)
    return out
