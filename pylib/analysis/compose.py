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
              (data-dependent: the formula takes the dispatch counts, as `alltoall_bytes` does; padded to
              capacity, C rows per expert and no count exchange). The all-gather dispatcher (cfg.moe.dispatcher)
              instead gathers the rows, ids and weights of the etp x ep grid and reduce-scatters the outputs, bytes
              set by the token count alone (`ep.dispatcher_bytes`). Shared experts: a dense MLP's TP rows in every
              MoE layer (`shared_collectives`).
    PP        `pylib.analysis.pp`  activations and gradients across stage boundaries at [b, s/(cp*tp), h].
    DP        `pylib.analysis.dp`  per flat buffer of the run's layouts: DDP and ZeRO-1 reduce once per step
              (no_sync before a chunk's last microbatch), ZeRO-2 reduce-scatters in every backward (m per step),
              ZeRO-3 gathers in every forward and backward and reduce-scatters in every backward.
    loss      two one-number all-reduces reporting the global loss (dp-cp on the last stage, then pp).
    recompute what backward runs again (phase "recompute", `pylib.analysis.recompute`): under "full" each
              recomputed group's TP/SP forward collectives but its last, and under both choices the CP core's
              forward passes of every recomputed layer (ring: all; Ulysses: q, k, v, and out only under "full");
              under ZeRO-3 "full" gathers each recomputed layer's unit once more.
              "full" for dense models only: a MoE layer recomputed whole would dispatch again, which is not
              modelled here (refused); "selective" reruns the attention core, the same in a MoE layer.

`step_traffic(...)` returns one `Traffic` row per kind of op; `per_axis(rows)` sums them into the tracer's
`by_axis` form ({axis: {"bytes_sent": ..., "ops": {op: count}}}), which the tests compare with real runs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from pylib.analysis import cp as cp_formulas
from pylib.analysis import dp as dp_formulas
from pylib.analysis import ep as ep_formulas
from pylib.analysis import pp as pp_formulas
from pylib.analysis import recompute as recompute_formulas
from pylib.analysis import tp as tp_formulas
from pylib.plan.heads import kv_heads_per_rank
from pylib.plan.options import RunOptions, ZeroStage
from pylib.plan.options import zero_stage as _zero
from pylib.plan.split import chunk_layers


@dataclass(frozen=True)
class Traffic:
    """`count` ops of one kind on one rank in one step, and the bytes they send together.

    axis: the group ("tp", "dp-cp", ...); phase: "forward", "backward", "optimizer", "loss", ...; where: what
    issues it (a TP region, "ring", a flat buffer's key); payload: the message of one op in bytes (the textbook
    size S, before the ring algorithm divides it)."""

    axis: str
    phase: str
    op: str
    where: str
    count: int
    bytes_sent: int
    payload: int = 0


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


@dataclass
class _Step:
    """One rank's step as the formulas see it, and the rows found so far."""

    cfg: object
    pc: object
    opt: RunOptions
    b: int  # sequences of one microbatch on this rank: B / (dp m)
    seq: int
    pp_rank: int
    layers: list[int]
    holds_first: bool
    holds_last: bool
    rows: list[Traffic] = field(default_factory=list)
    sp_regather: bool = False  # Megatron's SP: the column-parallel linears all-gather their saved shard again

    @property
    def m(self) -> int:
        return self.opt.n_microbatches

    @property
    def e(self) -> int:
        return tp_formulas.dtype_bytes(self.cfg.dtype)

    def scratch(self) -> _Step:
        """An empty step of the same rank and options, to collect one layer's rows (repeated per layer after)."""
        return _Step(self.cfg, self.pc, self.opt, self.b, self.seq, self.pp_rank, [], False, False)

    def add(self, axis, phase, op, where, count, sent, payload=0):
        if count:
            self.rows.append(Traffic(axis, phase, op, where, count, sent, payload))

    def add_collectives(self, axis, collectives, times=1):
        for c in collectives:
            self.add(axis, c.phase, c.op, c.where, times, times * c.bytes_sent, c.payload_bytes)


def _tp_rows(st: _Step) -> None:
    """TP / SP: per microbatch, the regions of every held layer, the embedding and the LM head with its loss."""
    cfg, tp, m, h, e = st.cfg, st.pc.tp, st.m, st.cfg.d_model, st.e
    s_cp = st.seq // st.pc.cp
    kw = dict(sequence_parallel=st.opt.sequence_parallel)
    if st.holds_first:
        st.add_collectives("tp", tp_formulas.embedding_collectives(st.b, s_cp, h, tp, e, **kw), m)
    regather = st.sp_regather and st.opt.sequence_parallel
    ops = tp_formulas.layer_collectives(st.b, s_cp, h, tp, e, regather=regather, **kw)
    # Every layer of a kind issues the same rows: build a dense layer's and a MoE layer's once. A MoE layer leaves
    # TP before routing: its attention's rows, and with shared experts the dense MLP's again (`shared_collectives`).
    of_kind = {}
    for moe, wanted in ((False, ("attn", "mlp")), (True, ("attn",))):
        kind = st.scratch()
        kind.add_collectives("tp", [c for c in ops if c.where.split(".")[0] in wanted], m)
        if moe:
            kind.add_collectives("tp", shared_collectives(cfg, st.b, s_cp, tp, st.opt.sequence_parallel), m)
        of_kind[moe] = kind.rows
    for i in st.layers:
        st.rows += of_kind[cfg.is_moe_layer(i)]
    if st.holds_last:
        st.add_collectives("tp", tp_formulas.lm_head_collectives(st.b, s_cp, h, tp, e, regather=regather, **kw), m)
        st.add_collectives("tp", tp_formulas.cross_entropy_collectives(st.b, s_cp, tp, e), m)


def shared_collectives(cfg, b: int, s_cp: int, tp: int, sequence_parallel: bool) -> list:
    """One MoE layer's shared-expert TP collectives per microbatch (none without shared experts, or at tp = 1):
    those of a dense MLP (`tp.layer_collectives`, "mlp": under SP the all-gather entering and the reduce-scatter
    leaving, backward their conjugates; without SP the two all-reduces), labelled "shared_experts". Megatron-Core's
    SharedExpertMLP is an MLP over the TP group (megatron/core/transformer/moe/shared_experts.py at d98e8a6), as
    `pylib.ep.shared` cuts it."""
    if tp == 1 or cfg.moe is None or not cfg.moe.n_shared_experts:
        return []
    e = tp_formulas.dtype_bytes(cfg.dtype)
    ops = tp_formulas.layer_collectives(b, s_cp, cfg.d_model, tp, e, sequence_parallel=sequence_parallel)
    return [replace(c, where="shared_experts") for c in ops if c.where == "mlp"]


def _cp_rows(st: _Step) -> None:
    """CP: per microbatch and held layer, the ring's K/V (and dK/dV) sends, all-gather CP's all-gather of K/V (and
    reduce-scatter of dK/dV) or Ulysses' all-to-alls."""
    cfg, cp, tp, m, e = st.cfg, st.pc.cp, st.pc.tp, st.m, st.e
    q_heads = cfg.n_heads // tp
    kv_heads = kv_heads_per_rank(cfg.n_heads, cfg.kv_heads, tp)[0]
    # Every held layer issues the same rows: build one layer's once and repeat those objects (as `_tp_rows` does).
    one = st.scratch()
    if st.opt.cp_kind == "ring":
        r = cp_formulas.ring_traffic(st.b, st.seq, kv_heads, cfg.d_head, cp, e)
        msg = r["kv_message_bytes"]
        one.add("cp", "forward", "send", "ring", m * r["forward_kv_transfers"], m * r["forward_bytes_sent"], msg)
        one.add("cp", "forward", "recv", "ring", m * r["forward_kv_transfers"], 0, msg)
        n_bwd = r["backward_kv_transfers"] + r["backward_dkv_transfers"]
        one.add("cp", "backward", "send", "ring", m * n_bwd, m * r["backward_bytes_sent"], msg)
        one.add("cp", "backward", "recv", "ring", m * n_bwd, 0, msg)
    elif st.opt.cp_kind == "allgather":
        a = cp_formulas.allgather_traffic(st.b, st.seq, kv_heads, cfg.d_head, cp, e)
        one.add("cp", "forward", "all_gather", "allgather", m, m * a["forward_bytes_sent"], a["gathered_bytes"])
        one.add(
            "cp", "backward", "reduce_scatter", "allgather", m, m * a["backward_bytes_sent"], a["reduce_scatter_bytes"]
        )
    else:
        u = cp_formulas.ulysses_traffic(st.b, st.seq, q_heads, kv_heads, cfg.d_head, cp, e)
        q = u["local_bytes"]["q"]
        for phase in ("forward", "backward"):
            count, sent = u[f"all_to_alls_{phase}"], u[f"{phase}_bytes_sent"]
            one.add("cp", phase, "all_to_all", "ulysses", m * count, m * sent, q)
    st.rows += one.rows * len(st.layers)


def _recompute_rows(st: _Step, layouts) -> None:
    """What backward runs again, per microbatch and chunk (see the module docstring)."""
    cfg, opt, tp, cp, m, e = st.cfg, st.opt, st.pc.tp, st.pc.cp, st.m, st.e
    rc = opt.recompute
    if rc.granularity == "none":
        return
    if cfg.moe is not None and rc.granularity == "full":
        raise ValueError(
            f"recompute={rc.granularity!r} with MoE layers: the traffic a MoE layer recomputed whole issues again is "
            "not modelled here (the saved bytes are: pylib.analysis.activations)"
        )
    s_cp = st.seq // cp
    q_heads, kv_heads = cfg.n_heads // tp, kv_heads_per_rank(cfg.n_heads, cfg.kv_heads, tp)[0]
    for chunk in chunk_layers(cfg.n_layers, st.pc.pp, opt.v, st.pp_rank):
        groups = rc.groups(len(chunk))
        rerun = [len(g) for g, whole in groups if whole]
        if opt.zero_stage == ZeroStage.ZERO3:  # a recomputed layer's unit is gathered once more
            again = {f"layers.{chunk[k]}" for g, whole in groups if whole for k in g}
            for lay in layouts:
                if lay.key in again and lay.parts > 1:
                    S, n = lay.padded_bytes, lay.parts
                    st.add(lay.axis, "recompute", "all_gather", lay.key, m, m * _ring("all_gather", S, n), S)
        if tp > 1:
            for n in rerun:
                ops = recompute_formulas.extra_collectives(
                    cfg, st.b, s_cp, tp, sequence_parallel=opt.sequence_parallel, recompute="full", layers=n
                )
                for c in ops:
                    st.add("tp", "recompute", c.op, c.where, m, m * c.bytes_sent, c.payload_bytes)
        layers = len(chunk) if rc.granularity == "selective" else sum(rerun)
        if cp > 1 and layers:
            if opt.cp_kind == "ring":
                r = cp_formulas.ring_traffic(st.b, st.seq, kv_heads, cfg.d_head, cp, e)
                n, msg = m * layers * r["forward_kv_transfers"], r["kv_message_bytes"]
                st.add("cp", "recompute", "send", "ring", n, m * layers * r["forward_bytes_sent"], msg)
                st.add("cp", "recompute", "recv", "ring", n, 0, msg)
            elif opt.cp_kind == "allgather":  # the core's K/V gathered again
                a = cp_formulas.allgather_traffic(st.b, st.seq, kv_heads, cfg.d_head, cp, e)
                n = m * layers
                st.add(
                    "cp", "recompute", "all_gather", "allgather", n, n * a["forward_bytes_sent"], a["gathered_bytes"]
                )
            else:
                u = cp_formulas.ulysses_traffic(st.b, st.seq, q_heads, kv_heads, cfg.d_head, cp, e)
                names = ("q", "k", "v") if rc.granularity == "selective" else ("q", "k", "v", "out")
                sent = sum(u["sent_bytes"][k] for k in names)
                st.add(
                    "cp",
                    "recompute",
                    "all_to_all",
                    "ulysses",
                    m * layers * len(names),
                    m * layers * sent,
                    u["local_bytes"]["q"],
                )


def _allgather_rows(st: _Step) -> None:
    """One MoE forward under the all-gather dispatcher (`pylib.ep.gather_dispatcher`), over the etp x ep grid (axis
    "ep" when etp = 1, else "etp-ep"), on the T tokens every rank routes: forward the gathers of the rows, the
    int64 expert ids and the router weights and the reduce-scatter of the outputs; backward the conjugates of the
    three differentiable ones (the ids have no gradient)."""
    cfg, pc, e = st.cfg, st.pc, st.e
    n = pc.etp * pc.ep
    if n == 1:
        return
    axis = "ep" if pc.etp == 1 else "etp-ep"
    tokens = st.b * (st.seq // pc.cp) // (pc.tp if st.opt.sequence_parallel else 1)
    k, row = cfg.moe.top_k, cfg.d_model * e
    rows, ids, weights = n * tokens * row, n * tokens * k * 8, n * tokens * k * e
    for phase, op, where, payload in (
        ("forward", "all_gather", "dispatch", rows),
        ("forward", "all_gather", "dispatch.ids", ids),
        ("forward", "all_gather", "combine.weights", weights),
        ("forward", "reduce_scatter", "combine", rows),
        ("backward", "reduce_scatter", "dispatch", rows),
        ("backward", "reduce_scatter", "combine.weights", weights),
        ("backward", "all_gather", "combine", rows),
    ):
        st.add(axis, phase, op, where, 1, _ring(op, payload, n), payload)


def _moe_rows(st: _Step, moe_routing, ep_index: int, etp_index: int) -> None:
    """EP / ETP: per MoE forward, from its routing (layer, send_counts [ep, E_local], recv_counts, etp_rows); under
    padding to capacity no count exchange (every split is C rows per expert, the logged counts); under the
    all-gather dispatcher `_allgather_rows`, whatever the routing."""
    cfg, ep, etp, tp, cp = st.cfg, st.pc.ep, st.pc.etp, st.pc.tp, st.pc.cp
    if not moe_routing:
        return
    h, e = cfg.d_model, st.e
    row = h * e
    gather, padded = cfg.moe.dispatcher == "allgather", cfg.moe.pad_to_capacity
    for _layer, send_counts, recv_counts, etp_rows in moe_routing:
        n_local = cfg.moe.n_experts // ep
        if gather:
            _allgather_rows(st)
        if ep > 1 and not gather:
            if not padded:
                st.add("ep", "forward", "all_to_all", "counts", 1, (ep - 1) * n_local * 8, ep * n_local * 8)
            sent_rows, recv_rows = _row_sums(send_counts), _row_sums(recv_counts)
            dispatch = row * (sum(sent_rows) - sent_rows[ep_index])
            combine = row * (sum(recv_rows) - recv_rows[ep_index])
            payload = row * sum(sent_rows)
            st.add("ep", "forward", "all_to_all", "dispatch+combine", 2, dispatch + combine, payload)
            st.add("ep", "backward", "all_to_all", "dispatch+combine", 2, dispatch + combine, payload)
        if etp > 1 and not gather:
            counts = etp * ep * n_local * 8
            if not padded:
                st.add("etp", "forward", "all_gather", "counts", 1, _ring("all_gather", counts, etp), counts)
            g = ep_formulas.etp_gather_bytes(etp_rows, etp_index, h, e)
            gathered = sum(etp_rows) * row
            st.add("etp", "forward", "all_gather", "dispatch", 1, g["all_gather_sent"], gathered)
            st.add("etp", "forward", "reduce_scatter", "combine", 1, g["reduce_scatter_sent"], gathered)
            st.add("etp", "backward", "reduce_scatter", "dispatch", 1, g["reduce_scatter_sent"], gathered)
            st.add("etp", "backward", "all_gather", "combine", 1, g["all_gather_sent"], gathered)
        if cfg.moe.aux_loss_coef or cfg.moe.z_loss_coef:
            aux = (cfg.moe.n_experts + 1) * 8
            st.add("tp-cp", "forward", "all_reduce", "aux", 1, _ring("all_reduce", aux, tp * cp), aux)


def _pp_rows(st: _Step) -> None:
    """PP: the schedule's start-up sync, and an activation forward / a gradient back per boundary and microbatch."""
    tp, pp, m = st.pc.tp, st.pc.pp, st.m
    s_cp = st.seq // st.pc.cp
    s_act = s_cp // tp if st.opt.sequence_parallel else s_cp
    msg = pp_formulas.p2p_message_bytes(st.b, s_act, st.cfg.d_model, st.e)
    sent = pp_formulas.p2p_bytes_per_rank(st.b, s_act, st.cfg.d_model, st.e, pp, m, st.pp_rank, st.opt.v)
    st.add("pp", "pp-sync", "all_reduce", "pp-sync", 1, _ring("all_reduce", 4, pp), 4)
    st.add("pp", "forward+backward", "send", "stage boundary", sent // msg, sent, msg)
    st.add("pp", "forward+backward", "recv", "stage boundary", sent // msg, 0, msg)


def _dp_rows(st: _Step, layouts) -> None:
    """DP: every flat buffer, by ZeRO stage (module docstring)."""
    zero, m = st.opt.zero_stage, st.m
    stage = _zero(zero).key
    for lay in layouts:
        n = lay.parts if zero else len(lay.group)
        if n == 1:
            continue
        S, axis, key = lay.padded_bytes, lay.axis, lay.key
        if stage == "ddp":
            st.add(axis, "backward", "all_reduce", key, 1, _ring("all_reduce", S, n), S)
            continue
        if stage == "zero3":
            st.add(axis, "forward", "all_gather", key, m, m * _ring("all_gather", S, n), S)
            st.add(axis, "backward", "all_gather", key, m, m * _ring("all_gather", S, n), S)
        times = 1 if stage == "zero1" else m
        st.add(axis, "backward", "reduce_scatter", key, times, times * _ring("reduce_scatter", S, n), S)
        if stage != "zero3":
            st.add(axis, "optimizer", "all_gather", key, 1, _ring("all_gather", S, n), S)


def _tp_grad_rows(st: _Step, layouts, dp_index: int) -> None:
    """TP gradient sums after the DP reduction, on the held elements: SP's replicated LayerNorms (and routers),
    the replicated K/V heads."""
    cfg, tp, e = st.cfg, st.pc.tp, st.e
    sp_names, kv_names = tp_grad_names(cfg, st.layers, st.holds_last, tp, st.opt.sequence_parallel)
    sharded = st.opt.zero_stage > 0
    sp_elems = sum(n for lay in layouts for n in _held_elements(lay, sp_names, dp_index, sharded))
    if sp_elems:
        payload = sp_elems * e
        st.add("tp", "sp_grads", "all_reduce", "sequence_parallel_grads", 1, _ring("all_reduce", payload, tp), payload)
    kv_pieces = [n for lay in layouts for n in _held_elements(lay, kv_names, dp_index, sharded)]
    if kv_pieces:
        payload = tp // (tp // cfg.kv_heads) * sum(kv_pieces) * e
        st.add("tp", "kv_grads", "all_reduce", "replicated_kv_grads", 1, _ring("all_reduce", payload, tp), payload)


def _loss_rows(st: _Step) -> None:
    """The reported loss: one number all-reduced over dp-cp on the last stage, then over pp."""
    dpcp, pp = st.pc.dp * st.pc.cp, st.pc.pp
    if st.holds_last and dpcp > 1:
        st.add("dp-cp", "loss", "all_reduce", "loss", 1, _ring("all_reduce", 8, dpcp), 8)
    if pp > 1:
        st.add("pp", "loss", "all_reduce", "loss", 1, _ring("all_reduce", 8, pp), 8)


def step_traffic(
    cfg,
    par,
    options: RunOptions = RunOptions(),
    *,
    batch: int,
    seq: int,
    coords: dict[str, int],
    layouts,
    moe_routing=(),
    sp_regather: bool = False,
) -> list[Traffic]:
    """Every op one rank issues in one training step of the composed model, as rows (see the module docstring).

    options: the run's `pylib.plan.RunOptions` (sequence parallelism, CP kind, m, v, ZeRO stage);
    coords: the rank's index on the axes "pp", "dp-cp" (which ZeRO slices it holds), "ep" and "etp" (a missing
    axis: index 0), e.g. a `train` record's "coords";
    layouts: the run's data-parallel flat buffers (`ParallelTransformer.layouts`: names, sizes, padding, group);
    moe_routing: (layer, send_counts [ep, E_local], recv_counts [ep, E_local], etp_rows) per MoE forward;
    sp_regather: model Megatron's SP instead of pylib's: each column-parallel linear (QKV, the MLP's first, the LM
    head) keeps its input as the sequence shard and all-gathers it again in backward, one more all-gather of
    b s h e per entry (rows whose `where` ends in ".regather"; `tp.layer_collectives(regather=True)`). pylib.tp
    keeps the gathered input instead (False, what its runs measure)."""
    opt, pc = options, par
    pp, v = pc.pp, opt.v
    pp_rank = coords.get("pp", 0)
    layers = [i for c in chunk_layers(cfg.n_layers, pp, v, pp_rank) for i in c]
    b = batch // (pc.dp * opt.n_microbatches)
    st = _Step(cfg, pc, opt, b, seq, pp_rank, layers, pp_rank == 0, pp_rank == (pp * v - 1) % pp)
    st.sp_regather = sp_regather
    if pc.tp > 1:
        _tp_rows(st)
    if pc.cp > 1:
        _cp_rows(st)
    _recompute_rows(st, layouts)
    _moe_rows(st, moe_routing, coords.get("ep", 0), coords.get("etp", 0))
    if pp > 1:
        _pp_rows(st)
    _dp_rows(st, layouts)
    if pc.tp > 1:
        _tp_grad_rows(st, layouts, coords.get("dp-cp", 0))
    _loss_rows(st)
    return st.rows


def per_axis(rows: list[Traffic]) -> dict[str, dict]:
    """{axis: {"bytes_sent": total, "ops": {op: count}}} -- the shape of the tracer summary in `pylib.compose`."""
    # The same row object repeats (one per layer): count it once, times its repeats, where that is exact (ints and
    # Fractions; a float would add up differently).
    if all(not isinstance(r.bytes_sent, float) for r in rows):
        return counted_per_axis(counted_rows(rows))
    return counted_per_axis((r, 1) for r in rows)


def counted_rows(rows) -> tuple[tuple[Traffic, int], ...]:
    """(row, times) for each distinct row object, in the order first seen: the layers of a kind repeat the same
    objects, so a step's thousands of rows are a few dozen of these."""
    times = Counter(map(id, rows))
    return tuple((r, times[id(r)]) for r in {id(r): r for r in rows}.values())


def counted_per_axis(counted) -> dict[str, dict]:
    """`per_axis` of (row, times) pairs."""
    out: dict[str, dict] = {}
    for r, n in counted:
        a = out.setdefault(r.axis, dict(bytes_sent=0, ops={}))
        a["bytes_sent"] += n * r.bytes_sent
        a["ops"][r.op] = a["ops"].get(r.op, 0) + n * r.count
    return out


def dp_held_bytes(layouts, zero_stage: ZeroStage, *, optimizer_states: int = 2) -> dict[str, int]:
    """Parameter, gradient and optimizer-state bytes one rank holds, from its flat buffers (`pylib.analysis.dp`'s
    held_bytes per buffer: DDP keeps whole buckets, ZeRO-1/2/3 shard as that module says). optimizer_states:
    state tensors per parameter (Adam 2, SGD with momentum 1, plain SGD 0). zero_stage: a `ZeroStage` (its int or
    name converted)."""
    stage = _zero(zero_stage)
    total = dict(params=0, grads=0, optim=0)
    for lay in layouts:
        d = lay.parts if stage else 1
        held = dp_formulas.held_bytes(
            lay.numel, lay.element_size, d, stage, padded_params=lay.padded_numel, optimizer_states=optimizer_states
        )
        for k in total:
            total[k] += held[k]
    return total
