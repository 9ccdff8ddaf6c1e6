"""Per-rank shapes of every activation of the reference model under a TP x CP x EP x DP x PP plan, their bytes, and
the traffic of one training step: article B's matrix view as pure functions of sizes (the weights' shapes are
`pylib.analysis.weights`', which the planner builds on too).

    acts = activation_shapes(cfg, par, b, s, RunOptions(sequence_parallel=True))     # list[TensorShape]
    memory(cfg, par, b, s, options)  traffic(cfg, par, b, s, options)  summary(...)  # bytes held, moved per step

Shapes are this module's and `weights`'; memory and traffic are not computed here but asked of the one memory model
and the one traffic model (`pylib.analysis.planner.rank_memory`, `planner.rank_traffic_rows` =
`compose.step_traffic`), and validity of the one validity model (`pylib.plan.problems`), so the explorer and the
planner cannot disagree.

No processes: the tests (tests/test_analysis_shapes.py) compare every prediction with the local shapes of the real
sharded modules (`pylib.tp`, `pylib.cp`, `pylib.ep`, `pylib.pp`, `pylib.dp`) inside launched ranks and with the
traced traffic; the book's explorer (`pylib.viz.explorer`) shows them for any model.

Conventions (article B's symbols; `par` a `pylib.plan.ParallelConfig`):
  b       the micro-batch of one step *across the data-parallel ranks* (article B: DP cuts b -> b/N_DP), so a rank
          holds b_r = b / dp sequences; m micro-batches per step per rank (pipelining);
  s       the sequence length; a CP rank holds s_c = s / cp tokens; with sequence parallelism the activations
          outside the TP region hold s_c / tp tokens, those inside the region s_c;
  weights torch's storage layout [out, in] (`TensorShape.seed_b` gives article B's [in, out]);
  heads   TP splits query heads n_head / tp; K/V heads n_kv_head / tp when tp divides them, else (n_kv_head
          divides tp) one K/V head replicated on tp / n_kv_head ranks (`pylib.plan.heads`);
  CP      "ring": each step materialises a score block [b_r, n_head/tp, s_c, s_c] (zig-zag causal: half blocks
          after the first step), never [.., s_c, s]; "ulysses": the all-to-all trades sequence for heads, the
          core holds [b_r, n_head/(tp cp), s, s]; "allgather": each query chunk against the gathered keys before
          it, [b_r, n_head/tp, c, i c] and [.., c, c];
  EP      rank holds E / ep experts, each an etp-th of h_ffn; expert inputs are data-dependent: the shapes given
          are the expectation under uniform routing with no dropping;
  PP      rank r holds layers [r L/pp, (r+1) L/pp) (v = 1), the embedding on stage 0, ln_f and the LM head on
          stage pp - 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pylib.i18n import N_, shown, tr
from pylib.plan.heads import kv_heads_per_rank
from pylib.plan.options import SEQUENCE_PARALLEL, RunOptions
from pylib.plan.problems import problems as plan_problems
from pylib.plan.sequence import layout_chunks

from . import planner
from .tp import dtype_bytes
from .weights import TensorShape, check_sizes, parameter_counts, stage_layer_ids, weight_shapes

# ------------------------------------------------------------------------------------------------ the plan


def _div(size: int, parts: int, axis: str, what: str) -> int:
    if parts < 1 or size % parts:
        raise ValueError(f"{axis}={parts} does not divide {what}={size}")
    return size // parts


def check_plan(
    cfg,
    par,
    b: int | None = None,
    s: int | None = None,
    options: RunOptions = RunOptions(),
) -> list[str]:
    """Every constraint the plan violates, as sentences (empty: the plan runs): `pylib.plan.problems`, the one
    validity model compose and the planner ask, with b x options.n_microbatches the global batch."""
    batch = None if b is None else b * options.n_microbatches
    return plan_problems(cfg, par, par.world_size, batch=batch, seq=s, options=options)


# ------------------------------------------------------------------------------------------------ activations


@dataclass(frozen=True)
class LocalSizes:
    """The sizes one rank works with."""

    b: int  # sequences this rank holds: b / dp
    s_c: int  # tokens of each sequence on this CP rank: s / cp
    s_out: int  # tokens outside the TP region: s_c / tp with sequence parallelism, else s_c
    heads: int  # query heads per TP rank
    kv_heads: int  # K/V heads per TP rank
    kv_replicas: int


def local_sizes(cfg, par, b: int, s: int, *, sequence_parallel: bool = SEQUENCE_PARALLEL) -> LocalSizes:
    b_r, s_c = _div(b, par.dp, "dp", "b"), _div(s, par.cp, "cp", "s")
    s_out = _div(s_c, par.tp, "tp", "s/cp (sequence parallel)") if sequence_parallel else s_c
    kv, rep = kv_heads_per_rank(cfg.n_heads, cfg.kv_heads, par.tp)
    return LocalSizes(b_r, s_c, s_out, cfg.n_heads // par.tp, kv, rep)


def score_blocks(cfg, par, b: int, s: int, options: RunOptions = RunOptions(), *, cp_rank: int = 0) -> list[tuple]:
    """The attention-score tensors CP rank `cp_rank` materialises in one forward of one layer, in order: without
    CP one [b_r, n_head/tp, s, s]; Ulysses one [b_r, n_head/(tp cp), s, s]; ring one block per ring step it does
    not skip (`pylib.cp.ring_block_plan`): step 0 its own [.., s_c, s_c] block; later steps the K/V block of rank
    (cp_rank - step) mod cp -- causal contiguous: whole from an earlier rank, skipped from a later one; causal
    zig-zag: from an earlier rank all queries against the first half of the keys [.., s_c, s_c/2], from a later
    rank the second half of the queries against all keys [.., s_c/2, s_c]; all-gather CP, causal: each chunk i of c
    tokens it holds against the i c keys before it [.., c, i c] and its own [.., c, c] (not causal: one
    [.., s_c, s]). options: its cp_kind and cp_layout."""
    cp_kind, layout = options.cp_kind, options.cp_layout
    loc = local_sizes(cfg, par, b, s, sequence_parallel=False)
    if par.cp == 1:
        return [(loc.b, loc.heads, s, s)]
    if cp_kind == "ulysses":
        return [(loc.b, loc.heads // par.cp, s, s)]
    if cp_kind == "allgather":  # each query chunk against the gathered keys before it (`allgather_block_plan`)
        if not cfg.causal:
            return [(loc.b, loc.heads, loc.s_c, s)]
        chunks = layout_chunks(cp_rank, par.cp, layout)
        c = loc.s_c // len(chunks)
        return [(loc.b, loc.heads, c, k) for i in chunks for k in ((i * c,) if i else ()) + (c,)]
    n, out = loc.s_c, [(loc.b, loc.heads, loc.s_c, loc.s_c)]
    for step in range(1, par.cp):
        owner = (cp_rank - step) % par.cp
        if not cfg.causal:
            out.append((loc.b, loc.heads, n, n))
        elif layout == "contiguous":
            if owner < cp_rank:
                out.append((loc.b, loc.heads, n, n))
        elif owner < cp_rank:
            out.append((loc.b, loc.heads, n, n // 2))
        else:
            out.append((loc.b, loc.heads, n // 2, n))
    return out


def _splits(*pairs) -> tuple:
    """(axis, dim, parts) for the axes that cut (parts > 1)."""
    return tuple((a, d, n) for a, d, n in pairs if n > 1)


@dataclass
class _ActivationRows:
    """The activations of one rank being listed: its local sizes and how many layers of each kind it holds."""

    cfg: object
    par: object
    b: int
    s: int
    loc: LocalSizes
    sp: bool  # sequence parallelism with tp > 1
    pp_rank: int
    out: list = field(default_factory=list)

    def __post_init__(self):
        cfg = self.cfg
        layers = stage_layer_ids(cfg.n_layers, self.par.pp, self.pp_rank)
        self.n_here = len(layers)
        self.n_dense = sum(not cfg.is_moe_layer(i) for i in layers)
        self.n_moe = self.n_here - self.n_dense
        self.e = dtype_bytes(cfg.dtype)

    def bsd(self, tp_dim: int | None = 2) -> tuple:
        """The splits of a [b, s, ...] tensor inside the TP region: dp cuts b, cp cuts s, tp the last dim."""
        return _splits(("dp", 0, self.par.dp), ("cp", 1, self.par.cp), ("tp", tp_dim, self.par.tp))

    def row(self, name, symbol, full, local, splits, count, full_count, note="", expected=False):
        local = local if count else None
        e = self.e
        self.out.append(TensorShape(name, "", symbol, full, local, splits, count, full_count, e, False, expected, note))


def _hidden_split(a: _ActivationRows) -> tuple:
    """[b, s, h] outside the TP region: dp cuts b, cp cuts s, and SP cuts s again over tp."""
    return _splits(("dp", 0, a.par.dp), ("cp", 1, a.par.cp), ("tp", 1, a.par.tp if a.sp else 1))


def _attention_activations(a: _ActivationRows, options: RunOptions, cp_rank: int) -> None:
    """The layer's input, Q, K, V, the score blocks and the attention output."""
    cfg, par, loc, b, s = a.cfg, a.par, a.loc, a.b, a.s
    t, h, dh, n, L = par.tp, cfg.d_model, cfg.d_head, a.n_here, cfg.n_layers
    if a.sp:
        note = tr("outside the TP region: s/(cp tp) tokens under SP")
    else:
        note = tr("outside the TP region: whole h on every TP rank")
    a.row("input hidden", "[b, s, h]", (b, s, h), (loc.b, loc.s_out, h), _hidden_split(a), n, L, note)
    qsplit = _splits(("dp", 0, par.dp), ("tp", 1, t), ("cp", 2, par.cp))
    note = tr("inside the TP region: the whole s_c even under SP")
    a.row("Q", "[b, n_head, s, d_head]", (b, cfg.n_heads, s, dh), (loc.b, loc.heads, loc.s_c, dh), qsplit, n, L, note)
    kv_tp = t if loc.kv_replicas == 1 else cfg.kv_heads
    kvsplit = _splits(("dp", 0, par.dp), ("tp", 1, kv_tp), ("cp", 2, par.cp))
    kv_note = "" if loc.kv_replicas == 1 else tr("one K/V head held by {n} TP ranks", n=loc.kv_replicas)
    for w in ("K", "V"):
        full, local = (b, cfg.kv_heads, s, dh), (loc.b, loc.kv_heads, loc.s_c, dh)
        a.row(w, "[b, n_kv_head, s, d_head]", full, local, kvsplit, n, L, kv_note)
    blocks = score_blocks(cfg, par, b, s, options, cp_rank=cp_rank)
    bt = (("dp", 0, par.dp), ("tp", 1, t))
    if par.cp == 1:
        ssplit, note = _splits(*bt), tr("whole s x s per head")
    elif options.cp_kind == "ulysses":
        ssplit = _splits(*bt, ("cp", 1, par.cp))
        note = tr("Ulysses: heads cut by tp x cp, the whole s x s per head")
    elif options.cp_kind == "allgather":
        ssplit = _splits(*bt, ("cp", 2, par.cp))
        note = tr(
            "all-gather CP: {n} blocks per forward, my queries against the gathered keys (score_blocks)", n=len(blocks)
        )
    else:
        ssplit = _splits(*bt, ("cp", 2, par.cp), ("cp", 3, par.cp))
        note = tr("ring: {n} blocks per forward, one at a time; never [.., s/cp, s] (score_blocks)", n=len(blocks))
    a.row("attention scores", "[b, n_head, s, s]", (b, cfg.n_heads, s, s), blocks[0], ssplit, n, L, note)
    note = tr("the input of W_O: h/tp columns")
    a.row("attention output", "[b, s, h]", (b, s, h), (loc.b, loc.s_c, loc.heads * dh), a.bsd(), n, L, note)


def _mlp_activations(a: _ActivationRows) -> None:
    """The dense MLP's intermediate; for MoE layers the router logits and the expected expert rows."""
    cfg, par, loc, b, s = a.cfg, a.par, a.loc, a.b, a.s
    t, h, L = par.tp, cfg.d_model, cfg.n_layers
    if a.n_dense or cfg.moe is None:
        note = tr("inside the TP region: the whole s_c even under SP")
        full, local = (b, s, cfg.d_ff), (loc.b, loc.s_c, cfg.d_ff // t)
        all_dense = sum(not cfg.is_moe_layer(i) for i in range(L))
        a.row("FFN intermediate", "[b, s, h_ffn]", full, local, a.bsd(), a.n_dense, all_dense, note)
    if cfg.moe is None:
        return
    E, k, ffe = cfg.moe.n_experts, cfg.moe.top_k, cfg.moe.d_ff or cfg.d_ff
    T = loc.b * loc.s_out
    all_moe = sum(cfg.is_moe_layer(i) for i in range(L))
    rsplit = _splits(("dp", 0, par.dp), ("cp", 0, par.cp), ("tp", 0, t if a.sp else 1))
    note = tr("each rank routes its own tokens")
    a.row("router logits", "[b s, E]", (b * s, E), (T, E), rsplit, a.n_moe, all_moe, note)
    rows_e = round(T * k * par.ep * par.etp / E)  # expected rows per local expert (uniform routing)
    n_e, all_e = a.n_moe * (E // par.ep), all_moe * E
    note = tr("rows routed to one local expert: expected T k ep etp / E (uniform routing)")
    a.row("expert input", "[T_e, h]", (b * s * k // E, h), (rows_e, h), (), n_e, all_e, note, expected=True)
    full, local, esplit = (b * s * k // E, ffe), (rows_e, ffe // par.etp), _splits(("etp", 1, par.etp))
    note = tr("expected, as the expert input")
    a.row("expert intermediate", "[T_e, h_ffn]", full, local, esplit, n_e, all_e, note, expected=True)


def _output_activations(a: _ActivationRows) -> None:
    """The block output (after the reduce) and, on the last stage, the vocab-parallel logits."""
    cfg, par, loc, b, s = a.cfg, a.par, a.loc, a.b, a.s
    h, V, last = cfg.d_model, cfg.vocab_size, a.pp_rank == par.pp - 1
    note = tr("after the reduce (all-reduce, or reduce-scatter under SP)")
    a.row("block output", "[b, s, h]", (b, s, h), (loc.b, loc.s_out, h), _hidden_split(a), a.n_here, cfg.n_layers, note)
    note = tr("vocab-parallel: V/tp columns; on the last stage only")
    a.row("logits", "[b, s, V]", (b, s, V), (loc.b, loc.s_c, V // par.tp), a.bsd(), int(last), 1, note)


def activation_shapes(
    cfg,
    par,
    b: int,
    s: int,
    options: RunOptions = RunOptions(),
    *,
    pp_rank: int = 0,
    cp_rank: int = 0,
) -> list[TensorShape]:
    """Article B's activations of one layer (and the logits) as one rank holds them in one forward of one
    micro-batch. full = the single-device shape for the whole micro-batch [b, s, ...]; count = layers of this
    kind on the stage (logits: 1 on the last stage). Dense and MoE rows appear when the model has such layers."""
    check_sizes(cfg, par, b, s, options)
    sequence_parallel = options.sequence_parallel
    loc = local_sizes(cfg, par, b, s, sequence_parallel=sequence_parallel)
    a = _ActivationRows(cfg, par, b, s, loc, sequence_parallel and par.tp > 1, pp_rank)
    _attention_activations(a, options, cp_rank)
    _mlp_activations(a)
    _output_activations(a)
    return a.out


# ------------------------------------------------------------------------------------------------ traffic


@dataclass(frozen=True)
class ModeTraffic:
    """One kind of communication of one rank in one training step, as the explorer lists it: the rows of the one
    traffic model (`pylib.analysis.compose.step_traffic`) added up by mode, op and what issues them.

    mode: "TP", "SP", "CP", "EP", "ETP", "PP", "DP", or "scalars" (the loss, the pipeline's start-up sync and the
    router's auxiliary statistics: a few bytes each); op: the collective ("send" for point-to-point: the matching
    receives send nothing); when: what issues it and in which phases; count: ops per step; message: payload S of
    one op in bytes (the textbook size); sent: bytes this rank sends per step, all ops."""

    mode: str
    op: str
    when: str
    count: int
    message: int
    sent: float


_DP_AXES = {"dp-cp": "dense parameters' buffers over dp x cp", "edp": "expert parameters' buffers over edp"}
# What `when` shows, in the reader's language: the words among the places and phases (module tags such as attn or
# dispatch stay as they are).
_SHOWN = frozenset(
    {
        N_("dense parameters' buffers over dp x cp"),
        N_("expert parameters' buffers over edp"),
        N_("stage boundary"),
        N_("forward"),
        N_("backward"),
        N_("forward+backward"),
        N_("optimizer"),
    }
)
_SCALAR_PHASES = ("loss", "pp-sync")


def _mode(row, sequence_parallel: bool) -> str:
    if row.phase in _SCALAR_PHASES or row.axis == "tp-cp":
        return "scalars"
    if row.axis == "tp":
        return "SP" if sequence_parallel else "TP"
    return {"cp": "CP", "ep": "EP", "etp": "ETP", "pp": "PP", "dp-cp": "DP", "edp": "DP"}[row.axis]


def _shown(word: str) -> str:
    return shown(_SHOWN, word)


def _when(where: str, phases: list[str]) -> str:
    if phases == [where]:
        return where
    return tr("{where} ({phases})", where=_shown(where), phases=", ".join(_shown(p) for p in phases))


def mode_traffic(rows, *, sequence_parallel: bool) -> list[ModeTraffic]:
    """`step_traffic` rows added up by (mode, op, what issues them), in their first appearance's order; receives
    (0 bytes sent) left out."""
    groups: dict[tuple, dict] = {}
    for r in rows:
        if r.op == "recv":
            continue
        mode = _mode(r, sequence_parallel)
        where = _DP_AXES.get(r.axis, r.where) if mode == "DP" else r.where
        g = groups.setdefault((mode, r.op, where), dict(phases=[], count=0, sent=0, message=r.payload))
        if r.phase not in g["phases"]:
            g["phases"].append(r.phase)
        g["count"] += r.count
        g["sent"] += r.bytes_sent
    return [
        ModeTraffic(mode, op, _when(where, g["phases"]), g["count"], g["message"], g["sent"])
        for (mode, op, where), g in groups.items()
    ]


def traffic(
    cfg,
    par,
    b: int,
    s: int,
    options: RunOptions = RunOptions(),
    *,
    pp_rank: int = 0,
) -> list[ModeTraffic]:
    """The communication of one training step (forward + backward of options.n_microbatches micro-batches of b sequences
    across DP, then the gradient reduction) of pipeline rank `pp_rank`, from the one traffic model: the planner's
    `rank_traffic_rows` (`compose.step_traffic` on this rank's flat buffers, MoE layers at their expected, uniform
    routing), by mode (`mode_traffic`):

      TP/SP  tp.layer_collectives per layer (payload b_r s_c h e), + embedding, LM head, cross-entropy; after
             backward SP's LayerNorm (and router) gradients and replicated K/V gradients, on the held elements
      CP     cp.ring_traffic (K/V blocks, then dK/dV) or cp.ulysses_traffic per layer
      EP     the count exchange and ep.expected dispatch + combine, forward and backward, per MoE layer; ETP its
             gathers and reduce-scatters
      PP     pp.p2p_bytes_per_rank: one activation forward and one gradient back per boundary and micro-batch
      DP     per flat buffer over dp x cp (dense weights; Megatron's "dp-cp") and over edp (experts), by ZeRO stage."""
    check_sizes(cfg, par, b, s, options)
    sp = options.sequence_parallel and par.tp > 1
    plan = planner.Plan(par, replace(options, sequence_parallel=sp))
    rows = planner.rank_traffic_rows(cfg, plan, b * options.n_microbatches, s, pp_rank)
    return mode_traffic(rows, sequence_parallel=sp)


def traffic_by_mode(rows: list[ModeTraffic]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in rows:
        out[r.mode] = out.get(r.mode, 0) + r.sent
    return out


# ------------------------------------------------------------------------------------------------ memory


def memory(
    cfg,
    par,
    b: int,
    s: int,
    options: RunOptions = RunOptions(),
    *,
    pp_rank: int = 0,
    optimizer_states: int = 2,
    attention: str = "math",
) -> dict:
    """Bytes one rank holds, from the one memory model, `pylib.analysis.planner.rank_memory` (what the planner
    ranks with, tested byte for byte against composed runs): parameters, gradients and optimizer state of the
    rank's flat buffers (one dtype throughout, `optimizer_states` tensors of state; dense state over dp x cp,
    expert state over edp, sharded and padded under ZeRO), the activations backward keeps at the peak of the 1F1B
    schedule over options.n_microbatches micro-batches of b sequences (attention "math": pylib's unfused core keeps the
    probabilities; "flash" keeps none), ZeRO-3's gathered parameters, and the total.
    params_elements: this rank's parameter elements (`parameter_counts`)."""
    plan = planner.Plan(par, options)
    work = planner.Workload(
        b * options.n_microbatches, s, precision="uniform", attention=attention, optimizer_states=optimizer_states
    )
    held = planner.rank_memory(cfg, plan, work, pp_rank)
    return dict(held, params_elements=parameter_counts(cfg, par, pp_rank=pp_rank)["total"])


@dataclass
class Summary:
    """Everything the explorer shows for one plan."""

    weights: list[TensorShape]
    activations: list[TensorShape]
    memory: dict
    traffic: list[ModeTraffic]
    problems: list[str] = field(default_factory=list)


def summary(
    cfg,
    par,
    b: int,
    s: int,
    options: RunOptions = RunOptions(),
    *,
    pp_rank: int = 0,
    attention: str = "math",
) -> Summary:
    """weights, activations, memory and traffic of one rank; for an impossible plan, the problems only (the one
    validity model, `check_plan`). Memory and traffic are the planner's (`memory`, `traffic`), so the explorer and
    `planner.predict` answer alike for the same plan (tests/test_analysis_shapes.py)."""
    problems = check_plan(cfg, par, b, s, options)
    if problems:
        return Summary([], [], {}, [], problems)
    return Summary(
        weight_shapes(cfg, par, pp_rank=pp_rank),
        activation_shapes(cfg, par, b, s, options, pp_rank=pp_rank),
        memory(cfg, par, b, s, options, pp_rank=pp_rank, attention=attention),
        traffic(cfg, par, b, s, options, pp_rank=pp_rank),
    )
