"""The gradient reductions a TP model needs after backward (before the optimizer step).

Two kinds of parameter are held whole by several TP ranks but see only part of the data on each:

1. Under sequence parallelism, LayerNorm weights and biases (and the bias of a row-parallel linear) are
   replicated, but each rank runs them on its own s/t tokens. Each rank's gradient is the sum over *its* tokens
   only; the true gradient is the sum over the TP group. Forget this all-reduce and the replicas drift apart:
   `allreduce_sequence_parallel_grads`. (Without SP every rank runs them on the whole sequence and the
   gradients are already equal.)
2. Under GQA with tp > n_kv_head, each K/V head is replicated on tp / n_kv_head ranks; each replica's gradient
   comes only from that rank's query heads. The true gradient is the sum over the replicas:
   `allreduce_replicated_kv_grads`.

Both are named phases in the tracer ("sp_grads", "kv_grads"), so a trace shows them apart from the layer's
forward and backward traffic. `finalize_grads` does both. Parameters say which they are by an attribute set at
construction (`p.sequence_parallel = True`, `p.kv_replicas = n`), as in Megatron.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from pylib.runtime import collectives as C

SP_PHASE = "sp_grads"
KV_PHASE = "kv_grads"


def mark_sequence_parallel(p: nn.Parameter) -> nn.Parameter:
    """Flag a replicated parameter that sees only a sequence slice under SP."""
    p.sequence_parallel = True
    return p


def sequence_parallel_params(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if getattr(p, "sequence_parallel", False)]


def _allreduce_flat(grads: list[torch.Tensor], group, phase: str, tag: str) -> int:
    """Sum a list of gradients over `group` with one all-reduce of their concatenation; returns payload bytes."""
    if not grads:
        return 0
    flat = torch.cat([g.reshape(-1) for g in grads])
    C.all_reduce_(flat, group, phase=phase, tag=tag)
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset : offset + n].view_as(g))
        offset += n
    return flat.numel() * flat.element_size()


def allreduce_sequence_parallel_grads(model: nn.Module, group=None) -> int:
    """Sum the gradients of the sequence-parallel replicated parameters (LayerNorm gamma and beta, row-parallel
    biases) over the TP group, in one all-reduce traced as phase "sp_grads". Returns the payload in bytes.

    Call after backward and before the optimizer step, on every TP rank."""
    grads = [p.grad for p in sequence_parallel_params(model) if p.grad is not None]
    return _allreduce_flat(grads, group, SP_PHASE, "sequence_parallel_grads")


def allreduce_replicated_kv_grads(model: nn.Module, group=None) -> int:
    """Sum the gradients of K/V projection slices replicated over several TP ranks (GQA with tp > n_kv_head).

    Rank r holds K/V head j = r // (t / n_kv_head). Each rank writes its gradient into slot j of a zero buffer of
    all n_kv_head heads; one all-reduce over the TP group then leaves in slot j the sum over exactly the ranks
    that share head j. (Sub-groups of the sharing ranks would move less: d_head*h per head instead of
    n_kv_head*d_head*h; the zero-padded buffer needs no extra process groups.) Traced as phase "kv_grads"."""
    params = [p for p in model.parameters() if getattr(p, "kv_replicas", 1) > 1 and p.grad is not None]
    if not params:
        return 0
    g = C.resolve_group(group)
    slots = []
    for p in params:
        n_slots = g.size // p.kv_replicas
        buf = torch.zeros((n_slots, *p.grad.shape), dtype=p.grad.dtype, device=p.grad.device)
        buf[g.rank // p.kv_replicas] = p.grad
        slots.append(buf)
    _allreduce_flat(slots, g, KV_PHASE, "replicated_kv_grads")
    for p, buf in zip(params, slots):
        p.grad.copy_(buf[g.rank // p.kv_replicas])
    return sum(b.numel() * b.element_size() for b in slots)


def finalize_grads(model: nn.Module, group=None) -> None:
    """Every TP gradient reduction a model needs before its optimizer step (a no-op for plain TP with MHA)."""
    allreduce_sequence_parallel_grads(model, group)
    allreduce_replicated_kv_grads(model, group)
