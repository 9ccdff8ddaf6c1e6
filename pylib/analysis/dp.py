"""Data parallelism on paper: bytes each rank sends per step, and model-state bytes each rank holds.

Symbols: d = data-parallel group size; Phi = number of parameter elements; e = bytes per element; Psi = Phi * e,
the parameter bytes. ZeRO splits flat buffers into d equal slices, so it works on Phi_pad >= Phi (each buffer
padded to a multiple of d; `pylib.dp.layout` says exactly how much) and moves Psi_pad = Phi_pad * e.

Traffic per rank per step (ring algorithms, the tracer's convention; ZeRO paper section 7):

    DDP      all-reduce of the gradients                   2(d-1)/d * Psi
    ZeRO-1   reduce-scatter of the gradients                (d-1)/d * Psi_pad
             + all-gather of the updated parameters         (d-1)/d * Psi_pad      = 2(d-1)/d * Psi_pad
    ZeRO-2   the same as ZeRO-1                                                    = 2(d-1)/d * Psi_pad
    ZeRO-3   all-gather before each forward                 (d-1)/d * Psi_pad
             + all-gather again before its backward         (d-1)/d * Psi_pad
             + reduce-scatter of its gradient               (d-1)/d * Psi_pad      = 3(d-1)/d * Psi_pad
             per micro-batch: with m of them, 3m(d-1)/d * Psi_pad per step (`pylib.dp.FullyShardedDataParallel`
             gathers again in every micro-batch's forward and backward and reduce-scatters every micro-batch's
             gradient; it keeps no gather across micro-batches). ZeRO-1 reduce-scatters once per step (after
             `no_sync` accumulation), ZeRO-2 once per micro-batch: `traffic_by_op(..., n_microbatches=m)`.

HSDP (hybrid sharded data parallel; FSDP2's `fully_shard` on a 2-D mesh): d = r x s ranks, ZeRO-3 inside each shard
group of s ranks (one node), plain all-reduce of each shard's gradient across the r replicas (between nodes). With
Psi_pad padded to a multiple of s, per rank and micro-batch, by link class (`hsdp_traffic_by_link`):

    shard group (intra-node)       all-gather forward + all-gather backward + reduce-scatter   3(s-1)/s * Psi_pad
    replica group (inter-node)     all-reduce of the reduce-scattered shard                    2(r-1)/r * Psi_pad/s

Memory per rank. The ZeRO paper counts mixed-precision Adam: fp16 parameters (2 bytes) and gradients (2 bytes),
and K = 12 bytes of optimizer state per parameter (fp32 master copy, momentum, variance):

    paper     DDP (2 + 2 + K) Psi   ZeRO-1 2Psi + 2Psi + K Psi/d   ZeRO-2 2Psi + (2 + K) Psi/d   ZeRO-3 (2+2+K) Psi/d
                                                                                          (Psi = parameter count)
What pylib runs: one dtype throughout (float32, or float64 in the tests), no master copy, Adam's two moments:

    ours      DDP  e Phi + e Phi + 2e Phi          ZeRO-1 e Phi_pad + e Phi_pad + 2e Phi_pad/d
              ZeRO-2 e Phi_pad + (e + 2e) Phi_pad/d          ZeRO-3 (e + e + 2e) Phi_pad/d
                                                   (+ while a unit runs, its full parameters: see zero3_peak)

And under a mixed-precision recipe (`pylib.dp.wrap(..., precision=MixedPrecision(...))`: c = 2 bytes of bf16
parameters, g = 2 or 4 bytes of gradient in the reduce dtype, K = 12 bytes of fp32 master and moments), what
`mixed_held_bytes` gives and the wrappers hold, byte for byte; with g = 2 it is the paper's row on Phi_pad:

    mixed     DDP  c Phi + g Phi + K Phi           ZeRO-1 c Phi_pad + g Phi_pad + K Phi_pad/d
              ZeRO-2 c Phi_pad + (g + K) Phi_pad/d           ZeRO-3 (c + g + K) Phi_pad/d

Every function takes the stage as `zero_stage`, a `pylib.plan.ZeroStage`; its int (0..3) or its name ("ddp",
"zero1", "zero2", "zero3") is converted on the way in by `pylib.plan.options.zero_stage`, which names the allowed
values when given anything else.
"""

from __future__ import annotations

from fractions import Fraction

from pylib.plan.mesh import HSDP_REPLICATE as REPLICATE
from pylib.plan.mesh import HSDP_SHARD as SHARD
from pylib.plan.options import ZERO_STAGE_NAMES, RunOptions, ZeroStage
from pylib.plan.options import zero_stage as as_zero_stage

STAGES = ZERO_STAGE_NAMES  # ("ddp", "zero1", "zero2", "zero3"): pylib.plan.options.ZeroStage by name
DDP, ZERO1, ZERO2, ZERO3 = ZeroStage
DEFAULT_MICROBATCHES = RunOptions.n_microbatches  # one micro-batch per step unless told (the composed run's default)
PAPER_K = 12  # bytes of optimizer state per parameter in mixed-precision Adam (fp32 copy, momentum, variance)


def _check(zero_stage: ZeroStage, d: int) -> ZeroStage:
    """The stage as a `ZeroStage` (an int 0..3 or a name "ddp", "zero1", ... converted; anything else raises, naming
    both vocabularies); then d is checked."""
    stage = as_zero_stage(zero_stage)
    if d < 1:
        raise ValueError(f"d={d} must be >= 1")
    return stage


def _exact(x: Fraction):
    return int(x) if x.denominator == 1 else float(x)


def padded_numel(numel: int, d: int) -> int:
    """The smallest multiple of d that is >= numel (a flat buffer that splits into d equal slices)."""
    return -(-numel // d) * d


def traffic_by_op(
    psi_bytes: int, d: int, zero_stage: ZeroStage, n_microbatches: int = DEFAULT_MICROBATCHES
) -> dict[str, int | float]:
    """Bytes one rank sends per training step, by collective. `psi_bytes` is Psi for DDP and Psi_pad for ZeRO.

    n_microbatches: m, the micro-batches of one step, each its own forward and backward. DDP and ZeRO-1 accumulate
    without communicating (`no_sync`) and reduce once; ZeRO-2 reduce-scatters every micro-batch's gradient into its
    slice; ZeRO-3 gathers the parameters in every micro-batch's forward and backward and reduce-scatters every
    micro-batch's gradient (3m(d-1)/d Psi_pad); the parameters are all-gathered after the step once."""
    stage = _check(zero_stage, d)
    m = _microbatches(n_microbatches)
    one = Fraction(d - 1, d) * psi_bytes  # one all-gather or one reduce-scatter of every parameter
    if stage == DDP:
        return {"all_reduce": _exact(2 * one)}
    if stage in (ZERO1, ZERO2):
        return {"reduce_scatter": _exact(one * (m if stage == ZERO2 else 1)), "all_gather": _exact(one)}
    return {"all_gather": _exact(2 * m * one), "reduce_scatter": _exact(m * one)}


def traffic_per_step(
    psi_bytes: int, d: int, zero_stage: ZeroStage, n_microbatches: int = DEFAULT_MICROBATCHES
) -> int | float:
    """Total bytes one rank sends per step: 2(d-1)/d Psi (DDP, ZeRO-1), (m+1)(d-1)/d Psi (ZeRO-2) or
    3m(d-1)/d Psi (ZeRO-3) with m micro-batches (`traffic_by_op`)."""
    return _exact(sum(Fraction(v) for v in traffic_by_op(psi_bytes, d, zero_stage, n_microbatches).values()))


def _microbatches(n_microbatches) -> int:
    n = n_microbatches
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n_microbatches={n!r} must be an integer >= 1")
    return n


# -------------------------------------------------------------------------------------------------- HSDP


def hsdp_traffic_by_link(
    psi_bytes: int, r: int, s: int, n_microbatches: int = DEFAULT_MICROBATCHES
) -> dict[str, dict[str, int | float]]:
    """Bytes one HSDP rank sends per step, by group and collective: {"dp-shard": ZeRO-3 over s, "dp-replicate":
    the all-reduce of the reduce-scattered shard over r}. psi_bytes: Psi_pad, padded to a multiple of s; m
    micro-batches each gather twice, reduce-scatter and all-reduce (as torch 2.13's FSDP2 does by default; its
    `set_requires_all_reduce(False)` would all-reduce only the last)."""
    if r < 1:
        raise ValueError(f"r={r} replicas must be >= 1")
    if psi_bytes % s:
        raise ValueError(f"Psi_pad={psi_bytes} bytes must split into s={s} equal shards (pad it to a multiple of s)")
    m = _microbatches(n_microbatches)
    out = {SHARD: traffic_by_op(psi_bytes, s, ZERO3, m) if s > 1 else {}}
    shard = psi_bytes // s
    out[REPLICATE] = {"all_reduce": _exact(m * 2 * Fraction(r - 1, r) * shard)} if r > 1 else {}
    return out


def hsdp_link_totals(
    psi_bytes: int, r: int, s: int, n_microbatches: int = DEFAULT_MICROBATCHES
) -> dict[str, int | float]:
    """`hsdp_traffic_by_link` summed per group: 3m(s-1)/s Psi_pad on the shard group, 2m(r-1)/r Psi_pad/s on the
    replica group."""
    by_link = hsdp_traffic_by_link(psi_bytes, r, s, n_microbatches)
    return {k: _exact(sum(Fraction(v) for v in ops.values())) for k, ops in by_link.items()}


def held_bytes(
    n_params: int,
    element_size: int,
    d: int,
    zero_stage: ZeroStage,
    *,
    padded_params: int | None = None,
    optimizer_states: int = 2,
) -> dict[str, int | float]:
    """Parameter, gradient and optimizer-state bytes one rank holds in pylib's runs (one dtype, no master copy).

    n_params: Phi; padded_params: Phi_pad, the elements of ZeRO's padded flat buffers (default Phi);
    optimizer_states: tensors of state per parameter (Adam 2, SGD with momentum 1)."""
    stage = _check(zero_stage, d)
    e = element_size
    full = n_params * e if stage == DDP else (n_params if padded_params is None else padded_params) * e
    part = Fraction(full, d)
    params = full if stage != ZERO3 else part
    grads = full if stage in (DDP, ZERO1) else part
    optim = optimizer_states * (full if stage == DDP else part)
    return {"params": _exact(Fraction(params)), "grads": _exact(Fraction(grads)), "optim": _exact(Fraction(optim))}


def paper_bytes(n_params: int, d: int, zero_stage: ZeroStage, *, k: int = PAPER_K) -> dict[str, int | float]:
    """The ZeRO paper's per-rank bytes for mixed-precision Adam: 2 Psi parameters, 2 Psi gradients, K Psi state,
    the parts each stage shards divided by d (Psi = parameter count)."""
    stage = _check(zero_stage, d)
    psi = Fraction(n_params)
    params = 2 * psi if stage != ZERO3 else 2 * psi / d
    grads = 2 * psi if stage in (DDP, ZERO1) else 2 * psi / d
    optim = k * psi if stage == DDP else k * psi / d
    return {"params": _exact(params), "grads": _exact(grads), "optim": _exact(optim)}


def mixed_held_bytes(
    n_params: int, d: int, zero_stage: ZeroStage, recipe, *, padded_params: int | None = None, optimizer_states: int = 2
) -> dict[str, int | float]:
    """Parameter, gradient and optimizer-state bytes one rank holds under a mixed-precision recipe
    (`pylib.plan.options.MixedPrecision`), as `pylib.dp` runs it: c = compute bytes (2), g = reduce bytes (2 or 4),
    m = master bytes (4), K = m + optimizer_states * m (12 for Adam):

        DDP    c Phi + g Phi + K Phi        ZeRO-1 c Phi_pad + g Phi_pad + K Phi_pad/d
        ZeRO-2 c Phi_pad + (g + K) Phi_pad/d          ZeRO-3 (c + g + K) Phi_pad/d

    With g = c = 2 that is the ZeRO paper's 16 Psi, 4 Psi + 12 Psi/d, 2 Psi + 14 Psi/d, 16 Psi/d."""
    stage = _check(zero_stage, d)
    c, g, m = recipe.compute_bytes, recipe.grad_bytes, recipe.master_bytes
    k = m * (1 + optimizer_states)
    n = n_params if stage == DDP or padded_params is None else padded_params
    part = Fraction(n, d)
    params = n * c if stage != ZERO3 else c * part
    grads = n * g if stage in (DDP, ZERO1) else g * part
    optim = k * n if stage == DDP else k * part
    return {"params": _exact(Fraction(params)), "grads": _exact(Fraction(grads)), "optim": _exact(Fraction(optim))}


def mixed_traffic_by_op(n_params: int, d: int, zero_stage: ZeroStage, recipe) -> dict[str, int | float]:
    """Bytes one rank sends per step under a mixed-precision recipe, by collective: gradients move in the reduce
    dtype (all-reduce, reduce-scatter), parameters in the compute dtype (all-gather). n_params: Phi for DDP,
    Phi_pad for ZeRO."""
    out = {}
    for op, elems in traffic_by_op(n_params, d, zero_stage).items():
        out[op] = _exact(Fraction(elems) * (recipe.compute_bytes if op == "all_gather" else recipe.grad_bytes))
    return out


def zero3_peak_param_bytes(shard_bytes: int, unit_bytes: list[int], resident_units: int = 1) -> int:
    """ZeRO-3's most parameter bytes resident at once: this rank's shards plus the `resident_units` largest units
    gathered in full (1 when each unit is freed before the next gathers; backward can hand over with 2)."""
    return shard_bytes + sum(sorted(unit_bytes, reverse=True)[:resident_units])


def memory_rows(n_params: int, element_size: int, d: int, padded: dict[str, int] | None = None) -> list[dict]:
    """For each stage, ours (`held_bytes`) beside the paper's (`paper_bytes`): one row per stage, for the book.
    padded: Phi_pad per stage (from the real layouts), Phi where missing."""
    rows = []
    for stage in STAGES:
        ours = held_bytes(n_params, element_size, d, stage, padded_params=(padded or {}).get(stage))
        paper = paper_bytes(n_params, d, stage)
        rows.append(
            dict(
                stage=stage,
                **{f"ours_{k}": v for k, v in ours.items()},
                ours_total=sum(ours.values()),
                **{f"paper_{k}": v for k, v in paper.items()},
                paper_total=sum(paper.values()),
            )
        )
    return rows
