"""The composed model's traffic, per rank and per mesh axis: the sum of each mode's own formulas.

Nothing new is derived here: every row comes from the mode's formula module, evaluated at the sizes that mode sees
inside the composition --

    TP / SP   `pylib.analysis.tp`  at b = B/(dp*m), s = S/cp (the TP region holds the CP rank's whole sequence);
              attention in every held layer, the MLP only in dense layers (a MoE layer leaves TP before routing),
              embedding on the first stage, LM head and cross-entropy on the last; after backward the "sp_grads"
              and "kv_grads" all-reduces of the gradient elements this rank holds (all of them under DDP, its
              ZeRO shard otherwise).
    CP        `pylib.analysis.cp`  ring or Ulysses per held layer, with the TP rank's n_head/tp (K/V) heads.
    EP / ETP  `pylib.analysis.ep`  per MoE forward: the count exchange, dispatch and combine all-to-alls (and the
              ETP gather / reduce-scatter), backward the same again; the rows come from the run's routing
              (data-dependent: the formula takes the dispatch counts, as `alltoall_bytes` does).
    PP        `pylib.analysis.pp`  activations and gradients across stage boundaries at [b, s/(cp*tp), h].
    DP        `pylib.analysis.dp`  per flat buffer of the run's layouts: DDP and ZeRO-1 reduce once per step
              (no_sync before a chunk's last microbatch), ZeRO-2 reduce-scatters in every backward (m per step),
              ZeRO-3 gathers in every forward and backward and reduce-scatters in every backward.
    loss      two one-number all-reduces reporting the global loss (dp-cp on the last stage, then pp).

`step_traffic(...)` returns one `Traffic` row per kind of op; `per_axis(rows)` sums them into the tracer's
`by_axis` form ({axis: {"bytes_sent": ..., "ops": {op: count}}}), which the tests compare with real runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from pylib.analysis import cp as cp_formulas
from pylib.analysis import dp as dp_formulas
from pylib.analysis import ep as ep_formulas
from pylib.analysis import pp as pp_formulas
from pylib.analysis import tp as tp_formulas
from pylib.plan.heads import kv_heads_per_rank
from pylib.plan.options import zero_stage as _zero
from pylib.plan.split import chunk_layers


@dataclass(frozen=True)
class Traffic:
    """`count` ops of one kind on one rank in one step, and the bytes they send together."""

    axis: str
    phase: str
    op: str
    where: str
    count: int
    bytes_sent: int


def _ring(op: str, payload: int, n: int) -> int:
    return tp_formulas.ring_bytes_sent(op, payload, n)


def tp_grad_names(cfg, layers: list[int], holds_last: bool, tp: int, sequence_parallel: bool) -> tuple[set, set]:
    """(names whose gradient is summed over TP, names of replicated K/V weights) among the held parameters."""
    sp, kv = set(), set()
    if tp > 1 and sequence_parallel:
        for i in layers:
            sp |= {f"layers.{i}.{ln}.{w}" for ln in ("ln1", "ln2") for w in ("weight", "bias")}
            if cfg.is_moe_layer(i):
                sp.add(f"layers.{i}.mlp.router.gate.weight")
        if holds_last:
            sp |= {"ln_f.weight", "ln_f.bias"}
    if tp > cfg.kv_heads:
        kv = {f"layers.{i}.attn.{n}.weight" for i in layers for n in ("k_proj", "v_proj")}
    return sp, kv


def _row_sums(counts) -> list[int]:
    """Rows per EP rank of a [ep, E_local] count table: nested sequences, or anything with `.tolist()` (a run's
    tensors), summed per row and truncated to whole rows."""
    table = counts.tolist() if hasattr(counts, "tolist") else counts
    return [int(sum(row)) for row in table]


def _held_elements(layout, names: set, index: int, sharded: bool) -> list[int]:
    """Element counts of `names` inside this member's part of a flat buffer (the whole buffer when not sharded)."""
    lo, hi = layout.shard_range(index) if sharded and layout.parts > 1 else (0, layout.padded_numel)
    out = []
    for e in layout.entries:
        if e.name in names:
            a, z = max(lo, e.offset), min(hi, e.offset + e.numel)
            if a < z:
                out.append(z - a)
    return out


def step_traffic(
    cfg,
    pc,
    *,
    batch: int,
    seq: int,
    pp_rank: int,
    layouts,
    dp_index: int,
    edp_index: int,
    etp_index: int = 0,
    ep_index: int = 0,
    moe_routing=(),
    sequence_parallel: bool = True,
    cp_kind: str = "ring",
    n_microbatches: int = 1,
    v: int = 1,
    zero_stage: int = 0,
) -> list[Traffic]:
    """Every op one rank issues in one training step of the composed model, as rows (see the module docstring).

    layouts: the run's data-parallel flat buffers (`ParallelTransformer.layouts`: names, sizes, padding, group);
    dp_index / edp_index: the rank's index in its dp-cp / edp group (which ZeRO slices it holds);
    moe_routing: (layer, send_counts [ep, E_local], recv_counts [ep, E_local], etp_rows) per MoE forward."""
    tp, cp, pp, ep, etp = pc.tp, pc.cp, pc.pp, pc.ep, pc.etp
    m = n_microbatches
    e = tp_formulas.dtype_bytes(cfg.dtype)
    h = cfg.d_model
    b = batch // (pc.dp * m)
    s_cp = seq // cp
    chunks = chunk_layers(cfg.n_layers, pp, v, pp_rank)
    n_stages = pp * v
    holds_first = pp_rank == 0
    holds_last = pp_rank == (n_stages - 1) % pp
    layers = [i for c in chunks for i in c]
    rows: list[Traffic] = []

    def add(axis, phase, op, where, count, sent):
        if count:
            rows.append(Traffic(axis, phase, op, where, count, sent))

    def add_collectives(axis, collectives, times=1):
        for c in collectives:
            add(axis, c.phase, c.op, c.where, times, times * c.bytes_sent)

    # ---- TP / SP: per microbatch
    if tp > 1:
        kw = dict(sequence_parallel=sequence_parallel)
        if holds_first:
            add_collectives("tp", tp_formulas.embedding_collectives(b, s_cp, h, tp, e, **kw), m)
        for i in layers:
            wanted = ("attn",) if cfg.is_moe_layer(i) else ("attn", "mlp")
            ops = [c for c in tp_formulas.layer_collectives(b, s_cp, h, tp, e, **kw) if c.where in wanted]
            add_collectives("tp", ops, m)
        if holds_last:
            add_collectives("tp", tp_formulas.lm_head_collectives(b, s_cp, h, tp, e, **kw), m)
            add_collectives("tp", tp_formulas.cross_entropy_collectives(b, s_cp, tp, e), m)
    # ---- CP: per microbatch and layer
    if cp > 1:
        q_heads = cfg.n_heads // tp
        kv_heads = kv_heads_per_rank(cfg.n_heads, cfg.kv_heads, tp)[0]
        for _ in layers:
            if cp_kind == "ring":
                r = cp_formulas.ring_traffic(b, seq, kv_heads, cfg.d_head, cp, e)
                add("cp", "forward", "send", "ring", m * r["forward_kv_transfers"], m * r["forward_bytes_sent"])
                add("cp", "forward", "recv", "ring", m * r["forward_kv_transfers"], 0)
                n_bwd = r["backward_kv_transfers"] + r["backward_dkv_transfers"]
                add("cp", "backward", "send", "ring", m * n_bwd, m * r["backward_bytes_sent"])
                add("cp", "backward", "recv", "ring", m * n_bwd, 0)
            else:
                u = cp_formulas.ulysses_traffic(b, seq, q_heads, kv_heads, cfg.d_head, cp, e)
                add("cp", "forward", "all_to_all", "ulysses", m * u["all_to_alls_forward"], m * u["forward_bytes_sent"])
                add(
                    "cp",
                    "backward",
                    "all_to_all",
                    "ulysses",
                    m * u["all_to_alls_backward"],
                    m * u["backward_bytes_sent"],
                )
    # ---- EP / ETP: per MoE forward, from its routing
    for _layer, send_counts, recv_counts, etp_rows in moe_routing:
        row = h * e
        if ep > 1:
            n_local = cfg.moe.n_experts // ep
            add("ep", "forward", "all_to_all", "counts", 1, (ep - 1) * n_local * 8)
            sent_rows, recv_rows = _row_sums(send_counts), _row_sums(recv_counts)
            dispatch = row * (sum(sent_rows) - sent_rows[ep_index])
            combine = row * (sum(recv_rows) - recv_rows[ep_index])
            add("ep", "forward", "all_to_all", "dispatch+combine", 2, dispatch + combine)
            add("ep", "backward", "all_to_all", "dispatch+combine", 2, dispatch + combine)
        if etp > 1:
            n_local = cfg.moe.n_experts // ep
            add("etp", "forward", "all_gather", "counts", 1, _ring("all_gather", etp * ep * n_local * 8, etp))
            g = ep_formulas.etp_gather_bytes(etp_rows, etp_index, h, e)
            add("etp", "forward", "all_gather", "dispatch", 1, g["all_gather_sent"])
            add("etp", "forward", "reduce_scatter", "combine", 1, g["reduce_scatter_sent"])
            add("etp", "backward", "reduce_scatter", "dispatch", 1, g["reduce_scatter_sent"])
            add("etp", "backward", "all_gather", "combine", 1, g["all_gather_sent"])
        if cfg.moe.aux_loss_coef or cfg.moe.z_loss_coef:
            add("tp-cp", "forward", "all_reduce", "aux", 1, _ring("all_reduce", (cfg.moe.n_experts + 1) * 8, tp * cp))
    # ---- PP
    if pp > 1:
        s_act = s_cp // tp if sequence_parallel else s_cp
        msg = pp_formulas.p2p_message_bytes(b, s_act, h, e)
        sent = pp_formulas.p2p_bytes_per_rank(b, s_act, h, e, pp, m, pp_rank, v)
        add("pp", "pp-sync", "all_reduce", "pp-sync", 1, _ring("all_reduce", 4, pp))
        add("pp", "forward+backward", "send", "stage boundary", sent // msg, sent)
        add("pp", "forward+backward", "recv", "stage boundary", sent // msg, 0)
    # ---- DP: every flat buffer, by stage
    stage = _zero(zero_stage).key
    for lay in layouts:
        n = lay.parts if zero_stage else len(lay.group)
        if n == 1:
            continue
        S = lay.padded_bytes
        axis = lay.axis
        if stage == "ddp":
            add(axis, "backward", "all_reduce", lay.key, 1, _ring("all_reduce", S, n))
        elif stage == "zero1":
            add(axis, "backward", "reduce_scatter", lay.key, 1, _ring("reduce_scatter", S, n))
            add(axis, "optimizer", "all_gather", lay.key, 1, _ring("all_gather", S, n))
        elif stage == "zero2":
            add(axis, "backward", "reduce_scatter", lay.key, m, m * _ring("reduce_scatter", S, n))
            add(axis, "optimizer", "all_gather", lay.key, 1, _ring("all_gather", S, n))
        else:
            add(axis, "forward", "all_gather", lay.key, m, m * _ring("all_gather", S, n))
            add(axis, "backward", "all_gather", lay.key, m, m * _ring("all_gather", S, n))
            add(axis, "backward", "reduce_scatter", lay.key, m, m * _ring("reduce_scatter", S, n))
    # ---- TP gradient sums after the DP reduction, on the held elements
    if tp > 1:
        sp_names, kv_names = tp_grad_names(cfg, layers, holds_last, tp, sequence_parallel)
        sharded = zero_stage > 0
        sp_elems = sum(n for lay in layouts for n in _held_elements(lay, sp_names, dp_index, sharded))
        if sp_elems:
            add("tp", "sp_grads", "all_reduce", "sequence_parallel_grads", 1, _ring("all_reduce", sp_elems * e, tp))
        kv_pieces = [n for lay in layouts for n in _held_elements(lay, kv_names, dp_index, sharded)]
        if kv_pieces:
            slots = tp // (tp // cfg.kv_heads)
            add(
                "tp",
                "kv_grads",
                "all_reduce",
                "replicated_kv_grads",
                1,
                _ring("all_reduce", slots * sum(kv_pieces) * e, tp),
            )
    # ---- the reported loss
    dpcp = pc.dp * cp
    if holds_last and dpcp > 1:
        add("dp-cp", "loss", "all_reduce", "loss", 1, _ring("all_reduce", 8, dpcp))
    if pp > 1:
        add("pp", "loss", "all_reduce", "loss", 1, _ring("all_reduce", 8, pp))
    return rows


def per_axis(rows: list[Traffic]) -> dict[str, dict]:
    """{axis: {"bytes_sent": total, "ops": {op: count}}} -- the shape of the tracer summary in `pylib.compose`."""
    out: dict[str, dict] = {}
    for r in rows:
        a = out.setdefault(r.axis, dict(bytes_sent=0, ops={}))
        a["bytes_sent"] += r.bytes_sent
        a["ops"][r.op] = a["ops"].get(r.op, 0) + r.count
    return out


def dp_held_bytes(layouts, zero_stage: int, *, optimizer_states: int = 2) -> dict[str, int]:
    """Parameter, gradient and optimizer-state bytes one rank holds, from its flat buffers (`pylib.analysis.dp`'s
    held_bytes per buffer: DDP keeps whole buckets, ZeRO-1/2/3 shard as that module says). optimizer_states:
    state tensors per parameter (Adam 2, SGD with momentum 1, plain SGD 0)."""
    stage = _zero(zero_stage).key
    total = dict(params=0, grads=0, optim=0)
    for lay in layouts:
        d = lay.parts if zero_stage else 1
        held = dp_formulas.held_bytes(
            lay.numel, lay.element_size, d, stage, padded_params=lay.padded_numel, optimizer_states=optimizer_states
        )
        for k in total:
            total[k] += held[k]
    return total
