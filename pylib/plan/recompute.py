"""Activation recomputation as data: which layers of a stage are recomputed in backward, and how.

    recompute="none"        every layer keeps what autograd saves (the no-recompute tables)
    recompute="selective"   every layer keeps all but its attention core (Q K^T, the mask, softmax, P V): the core's
                            inputs q, k, v are kept and the core runs again in backward (Korthikanti et al. 2022,
                            section 5: the 5as/h term is the core's)
    recompute="full"        a group of layers keeps only its input [b, s, h] (s/t under SP) and runs again in
                            backward, collectives included (Megatron-Core's recompute_granularity="full")

For "full", Megatron's `recompute_method` and `recompute_num_layers` (k) choose the groups of a stage's n layers:

    uniform   groups of k consecutive layers, each checkpointed whole: ceil(n / k) inputs kept (the last group
              may be shorter)
    block     the first k layers checkpointed one by one, the other n - k layers keep everything (k >= n: all)

    recompute_groups(4, "full", "uniform", 2)  -> ((0, 1), True), ((2, 3), True)
    recompute_groups(4, "full", "block", 1)    -> ((0,), True), ((1, 2, 3), False)
"""

from __future__ import annotations

RECOMPUTE = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")


def recompute_problems(recompute, method="uniform", num_layers=1) -> list[str]:
    """Every bad recompute choice, as sentences naming the value and the vocabulary."""
    out = []
    if recompute not in RECOMPUTE:
        out.append(f"recompute={recompute!r} must be one of {RECOMPUTE}")
    if method not in RECOMPUTE_METHODS:
        out.append(f"recompute_method={method!r} must be one of {RECOMPUTE_METHODS}")
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1:
        out.append(f"recompute_num_layers={num_layers!r} must be a positive integer (layers per recomputed group)")
    return out


def check_recompute(recompute, method="uniform", num_layers=1) -> None:
    """Raise ValueError listing `recompute_problems`."""
    found = recompute_problems(recompute, method, num_layers)
    if found:
        raise ValueError("; ".join(found))


def recompute_groups(n_layers: int, recompute: str, method: str = "uniform", num_layers: int = 1):
    """A stage's n layers (by position 0..n-1) cut into (positions, recomputed whole) groups, in order.
    Only "full" recomputes whole groups; "none" and "selective" give one group that keeps its activations."""
    check_recompute(recompute, method, num_layers)
    positions = tuple(range(n_layers))
    if recompute != "full" or n_layers == 0:
        return ((positions, False),) if n_layers else ()
    if method == "uniform":
        return tuple((positions[i : i + num_layers], True) for i in range(0, n_layers, num_layers))
    head = tuple(((i,), True) for i in positions[:num_layers])
    rest = positions[num_layers:]
    return head + (((rest, False),) if rest else ())


__all__ = ["RECOMPUTE", "RECOMPUTE_METHODS", "check_recompute", "recompute_groups", "recompute_problems"]
