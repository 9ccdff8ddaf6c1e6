"""Per-rank shapes of every weight and activation of the reference model under a TP x CP x EP x DP x PP plan,
their bytes, and the traffic of one training step: seed B's matrix view as pure functions of sizes.

    ws = weight_shapes(cfg, par, sequence_parallel=True, pp_rank=0)          # list[TensorShape], torch [out, in]
    acts = activation_shapes(cfg, par, b, s, sequence_parallel=True)         # list[TensorShape]
    memory(cfg, par, b, s, ...)  traffic(cfg, par, b, s, ...)  summary(...)  # bytes held, bytes moved per step

No processes: the tests (tests/test_analysis_shapes.py) compare every prediction with the local shapes of the real
sharded modules (`pylib.tp`, `pylib.cp`, `pylib.ep`, `pylib.pp`, `pylib.dp`) inside launched ranks and with the
traced traffic; the book's explorer (`pylib.viz.explorer`) shows them for any model.

Conventions (seed B's symbols; `par` a `pylib.runtime.ParallelConfig`):
  b       the micro-batch of one step *across the data-parallel ranks* (seed B: DP cuts b -> b/N_DP), so a rank
          holds b_r = b / dp sequences; m micro-batches per step per rank (pipelining);
  s       the sequence length; a CP rank holds s_c = s / cp tokens; with sequence parallelism the activations
          outside the TP region hold s_c / tp tokens, those inside the region s_c;
  weights torch's storage layout [out, in] (`TensorShape.seed_b` gives seed B's [in, out]);
  heads   TP splits query heads n_head / tp; K/V heads n_kv_head / tp when tp divides them, else (n_kv_head
          divides tp) one K/V head replicated on tp / n_kv_head ranks (`pylib.tp.head_layout`);
  CP      "ring": each step materialises a score block [b_r, n_head/tp, s_c, s_c] (zig-zag causal: half blocks
          after the first step), never [.., s_c, s]; "ulysses": the all-to-all trades sequence for heads, the
          core holds [b_r, n_head/(tp cp), s, s];
  EP      rank holds E / ep experts, each an etp-th of h_ffn; expert inputs are data-dependent: the shapes given
          are the expectation under uniform routing with no dropping;
  PP      rank r holds layers [r L/pp, (r+1) L/pp) (v = 1), the embedding on stage 0, ln_f and the LM head on
          stage pp - 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pylib.plan.heads import kv_heads_per_rank
from pylib.plan.mesh import ParallelConfig
from pylib.plan.options import SEQUENCE_PARALLEL, RunOptions
from pylib.plan.problems import problems as plan_problems
from pylib.plan.problems import size_problems
from pylib.plan.split import chunk_layers

from . import cp as cp_analysis
from . import dp as dp_analysis
from . import ep as ep_analysis
from . import pp as pp_analysis
from . import tp as tp_analysis
from .tp import dtype_bytes


@dataclass(frozen=True)
class TensorShape:
    """One tensor (or a family of equal tensors) as one rank holds it.

    name: seed B's name ("W_Q", "FFN intermediate"); param: the reference model's name pattern ("layers.{i}.attn.
    q_proj.weight"; "" for activations); symbol: seed B's shape in symbols ("[h, h_kv]");
    full / local: the reference shape and this rank's (torch layout: weights [out, in]); local None when this
    rank holds none of it (a layer of another pipeline stage, the LM head off the last stage);
    splits: (axis, dim, parts) for every axis that cuts a dimension; count / full_count: how many such tensors
    this rank holds / the whole model has (layers on the stage, local experts); linear: an nn.Linear weight
    (seed B writes it transposed); expected: a data-dependent shape, given as its expectation."""

    name: str
    param: str
    symbol: str
    full: tuple[int, ...]
    local: tuple[int, ...] | None
    splits: tuple[tuple[str, int, int], ...] = ()
    count: int = 1
    full_count: int = 1
    element_size: int = 4
    linear: bool = False
    expected: bool = False
    note: str = ""

    @property
    def seed_b(self) -> tuple[int, ...] | None:
        """The local shape in seed B's orientation: a linear weight [in, out], everything else as stored."""
        if self.local is None:
            return None
        return tuple(reversed(self.local)) if self.linear else self.local

    @property
    def seed_b_full(self) -> tuple[int, ...]:
        return tuple(reversed(self.full)) if self.linear else self.full

    @property
    def local_numel(self) -> int:
        return 0 if self.local is None else math.prod(self.local)

    @property
    def full_numel(self) -> int:
        return math.prod(self.full)

    @property
    def local_bytes(self) -> int:
        """Bytes of one such tensor on this rank (0 when it holds none)."""
        return self.local_numel * self.element_size

    @property
    def held_bytes(self) -> int:
        """Bytes of all of them on this rank (local bytes x count)."""
        return self.local_bytes * self.count

    @property
    def fraction(self) -> float:
        """Share of one full tensor that one rank holds."""
        return self.local_numel / self.full_numel

    def split_by(self, axis: str) -> int | None:
        """The dimension `axis` cuts, or None."""
        for a, d, _ in self.splits:
            if a == axis:
                return d
        return None


# ------------------------------------------------------------------------------------------------ the plan


def _div(size: int, parts: int, axis: str, what: str) -> int:
    if parts < 1 or size % parts:
        raise ValueError(f"{axis}={parts} does not divide {what}={size}")
    return size // parts


def stage_layer_ids(n_layers: int, pp: int, pp_rank: int) -> range:
    """Layers held by pipeline rank `pp_rank` (no interleaving): `pylib.plan.split.chunk_layers` with v = 1."""
    return chunk_layers(n_layers, pp, 1, pp_rank)[0]


def check_plan(
    cfg,
    par,
    b: int | None = None,
    s: int | None = None,
    *,
    sequence_parallel: bool = SEQUENCE_PARALLEL,
    cp_kind: str = "ring",
    microbatches: int = 1,
) -> list[str]:
    """Every constraint the plan violates, as sentences (empty: the plan runs): `pylib.plan.problems`, the one
    validity model compose and the planner ask, with b x microbatches the global batch."""
    opt = RunOptions(sequence_parallel=sequence_parallel, cp_kind=cp_kind, n_microbatches=microbatches)
    return plan_problems(cfg, par, par.world_size, batch=None if b is None else b * microbatches, seq=s, options=opt)


def _check(cfg, par, b=None, s=None, *, sequence_parallel: bool = SEQUENCE_PARALLEL, cp_kind: str = "ring"):
    """Raise when the shapes asked for do not exist: the size rules of `pylib.plan.problems` (what a mode alone
    needs; the explorer's `summary` asks every rule, `check_plan`)."""
    opt = RunOptions(sequence_parallel=sequence_parallel, cp_kind=cp_kind)
    problems = size_problems(cfg, par, batch=b, seq=s, options=opt)
    if problems:
        raise ValueError("the plan does not fit the model: " + "; ".join(problems))


# ------------------------------------------------------------------------------------------------ weights


def weight_shapes(cfg, par, *, pp_rank: int = 0) -> list[TensorShape]:
    """Every distinct weight of the model, as pipeline rank `pp_rank` holds it (any TP/CP/EP/DP coordinates
    give the same shapes). torch layout [out, in]; `count` tensors of each kind on this rank.

    TP: embedding and LM head split V (dim 0), W_Q/W_K/W_V and W_up/W_gate split their output (dim 0, heads or
    h_ffn), W_O and W_down their input (dim 1); LayerNorms and the router whole. EP: E/ep experts, each split by
    etp like a TP MLP. CP, DP (without ZeRO-3) and sequence parallelism: nothing split. PP: layers of the stage."""
    _check(cfg, par)
    e = dtype_bytes(cfg.dtype)
    t, h, dh = par.tp, cfg.d_model, cfg.d_head
    kv_local, kv_replicas = kv_heads_per_rank(cfg.n_heads, cfg.kv_heads, t)
    layers = stage_layer_ids(cfg.n_layers, par.pp, pp_rank)
    first, last = pp_rank == 0, pp_rank == par.pp - 1
    dense = [i for i in layers if not cfg.is_moe_layer(i)]
    moe = [i for i in layers if cfg.is_moe_layer(i)]
    all_dense = sum(not cfg.is_moe_layer(i) for i in range(cfg.n_layers))
    all_moe = cfg.n_layers - all_dense
    V, ff = cfg.vocab_size, cfg.d_ff
    out: list[TensorShape] = []

    def row(name, param, symbol, full, local, splits, count, full_count, linear=True, note=""):
        out.append(
            TensorShape(
                name,
                param,
                symbol,
                full,
                local if count else None,
                tuple(splits),
                count,
                full_count,
                e,
                linear,
                False,
                note,
            )
        )

    vsplit = [("tp", 0, t)] if t > 1 else []
    row(
        "token embedding",
        "embed.weight",
        "[V, h]",
        (V, h),
        (V // t, h),
        vsplit,
        int(first),
        1,
        linear=False,
        note="vocab-parallel: rank holds token ids [r V/tp, (r+1) V/tp)",
    )
    if not cfg.tie_embeddings:
        row(
            "LM head",
            "lm_head.weight",
            "[h, V]",
            (V, h),
            (V // t, h),
            vsplit,
            int(last),
            1,
            note="column-parallel over the vocabulary",
        )
    n_layers_here = len(layers)
    hsplit = [("tp", 0, t)] if t > 1 else []
    row(
        "W_Q",
        "layers.{i}.attn.q_proj.weight",
        "[h, h]",
        (cfg.n_heads * dh, h),
        (cfg.n_heads // t * dh, h),
        hsplit,
        n_layers_here,
        cfg.n_layers,
        note="column split by query head",
    )
    kv_note = "column split by K/V head" if kv_replicas == 1 else f"one K/V head, replicated on {kv_replicas} TP ranks"
    kv_split = [("tp", 0, t)] if t > 1 and kv_replicas == 1 else []
    if t > 1 and kv_replicas > 1:
        kv_split = [("tp", 0, cfg.kv_heads)]
    for w in ("K", "V"):
        row(
            f"W_{w}",
            f"layers.{{i}}.attn.{w.lower()}_proj.weight",
            "[h, h_kv]",
            (cfg.kv_heads * dh, h),
            (kv_local * dh, h),
            kv_split,
            n_layers_here,
            cfg.n_layers,
            note=kv_note,
        )
    row(
        "W_O",
        "layers.{i}.attn.o_proj.weight",
        "[h, h]",
        (h, cfg.n_heads * dh),
        (h, cfg.n_heads // t * dh),
        [("tp", 1, t)] if t > 1 else [],
        n_layers_here,
        cfg.n_layers,
        note="row split: partial sums all-reduced",
    )
    fsplit = [("tp", 0, t)] if t > 1 else []
    if all_dense:
        if cfg.mlp == "swiglu":
            row(
                "W_gate",
                "layers.{i}.mlp.gate_proj.weight",
                "[h, h_ffn]",
                (ff, h),
                (ff // t, h),
                fsplit,
                len(dense),
                all_dense,
                note="column split, the same slice as W_up",
            )
        row(
            "W_up",
            "layers.{i}.mlp.up_proj.weight",
            "[h, h_ffn]",
            (ff, h),
            (ff // t, h),
            fsplit,
            len(dense),
            all_dense,
            note="column split",
        )
        row(
            "W_down",
            "layers.{i}.mlp.down_proj.weight",
            "[h_ffn, h]",
            (h, ff),
            (h, ff // t),
            [("tp", 1, t)] if t > 1 else [],
            len(dense),
            all_dense,
            note="row split: partial sums all-reduced",
        )
    if all_moe:
        E, ffe, etp = cfg.moe.n_experts, cfg.moe.d_ff or cfg.d_ff, par.etp
        n_local = E // par.ep
        row(
            "router",
            "layers.{i}.mlp.router.gate.weight",
            "[h, E]",
            (E, h),
            (E, h),
            [],
            len(moe),
            all_moe,
            note="replicated: every rank routes its own tokens",
        )
        esplit = [("ep", -1, par.ep)] if par.ep > 1 else []
        names = (["gate_proj"] if cfg.mlp == "swiglu" else []) + ["up_proj"]
        for n in names:
            row(
                f"expert W_{n.split('_')[0]}",
                f"layers.{{i}}.mlp.experts.{{e}}.{n}.weight",
                "[h, h_ffn]",
                (ffe, h),
                (ffe // etp, h),
                esplit + ([("etp", 0, etp)] if etp > 1 else []),
                len(moe) * n_local,
                all_moe * E,
                note=f"E/ep = {n_local} experts per rank" + (f", h_ffn/etp = {ffe // etp}" if etp > 1 else ""),
            )
        row(
            "expert W_down",
            "layers.{i}.mlp.experts.{e}.down_proj.weight",
            "[h_ffn, h]",
            (h, ffe),
            (h, ffe // etp),
            esplit + ([("etp", 1, etp)] if etp > 1 else []),
            len(moe) * n_local,
            all_moe * E,
            note=f"E/ep = {n_local} experts per rank",
        )
    row(
        "LayerNorm γ, β",
        "layers.{i}.ln{1,2}.{weight,bias}",
        "[h]",
        (h,),
        (h,),
        [],
        4 * n_layers_here,
        4 * cfg.n_layers,
        linear=False,
        note="whole on every rank (SP: gradient all-reduced over TP)",
    )
    row("final LayerNorm γ, β", "ln_f.{weight,bias}", "[h]", (h,), (h,), [], 2 * int(last), 2, linear=False)
    return out


def local_parameters(cfg, par, *, pp_rank: int = 0) -> dict[str, tuple[int, ...]]:
    """{parameter name: local shape} of every parameter pipeline rank `pp_rank` holds, named as the reference
    model names them, layer by layer; an expert parameter carries its *local* index l (the rank's l-th expert,
    global expert ep_rank * E/ep + l): "layers.1.mlp.experts.0.up_proj.weight"."""
    layers = stage_layer_ids(cfg.n_layers, par.pp, pp_rank)
    n_local = cfg.moe.n_experts // par.ep if cfg.moe is not None else 0
    out: dict[str, tuple[int, ...]] = {}
    for w in weight_shapes(cfg, par, pp_rank=pp_rank):
        if w.local is None:
            continue
        if w.param.startswith("layers.{i}.ln{1,2}"):
            names = [f"layers.{i}.{ln}.{p}" for i in layers for ln in ("ln1", "ln2") for p in ("weight", "bias")]
        elif w.param.startswith("ln_f"):
            names = ["ln_f.weight", "ln_f.bias"]
        elif "{e}" in w.param:
            names = [w.param.format(i=i, e=e) for i in layers if cfg.is_moe_layer(i) for e in range(n_local)]
        elif w.param.startswith("layers.{i}.mlp") and "router" not in w.param:
            names = [w.param.format(i=i) for i in layers if not cfg.is_moe_layer(i)]
        elif "router" in w.param:
            names = [w.param.format(i=i) for i in layers if cfg.is_moe_layer(i)]
        elif "{i}" in w.param:
            names = [w.param.format(i=i) for i in layers]
        else:
            names = [w.param]
        if len(names) != w.count:
            raise AssertionError(f"{w.name}: {len(names)} names for count {w.count}")
        for n in names:
            out[n] = w.local
    return out


def parameter_counts(cfg, par, *, pp_rank: int = 0) -> dict[str, int]:
    """Parameter elements this rank holds, split into dense (reduced over dp x cp) and expert (reduced over edp)."""
    dense = expert = 0
    for w in weight_shapes(cfg, par, pp_rank=pp_rank):
        n = w.local_numel * w.count
        if w.name.startswith("expert"):
            expert += n
        else:
            dense += n
    return {"dense": dense, "expert": expert, "total": dense + expert}


def model_parameter_count(cfg) -> int:
    """Elements of the whole reference model (every weight once)."""
    return sum(w.full_numel * w.full_count for w in weight_shapes(cfg, ParallelConfig()))


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


def score_blocks(
    cfg, par, b: int, s: int, *, cp_kind: str = "ring", layout: str = "zigzag", cp_rank: int = 0
) -> list[tuple]:
    """The attention-score tensors CP rank `cp_rank` materialises in one forward of one layer, in order: without
    CP one [b_r, n_head/tp, s, s]; Ulysses one [b_r, n_head/(tp cp), s, s]; ring one block per ring step it does
    not skip (`pylib.cp.ring_block_plan`): step 0 its own [.., s_c, s_c] block; later steps the K/V block of rank
    (cp_rank - step) mod cp -- causal contiguous: whole from an earlier rank, skipped from a later one; causal
    zig-zag: from an earlier rank all queries against the first half of the keys [.., s_c, s_c/2], from a later
    rank the second half of the queries against all keys [.., s_c/2, s_c]."""
    loc = local_sizes(cfg, par, b, s, sequence_parallel=False)
    if par.cp == 1:
        return [(loc.b, loc.heads, s, s)]
    if cp_kind == "ulysses":
        return [(loc.b, loc.heads // par.cp, s, s)]
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


def activation_shapes(
    cfg,
    par,
    b: int,
    s: int,
    *,
    sequence_parallel: bool = SEQUENCE_PARALLEL,
    cp_kind: str = "ring",
    layout: str = "zigzag",
    pp_rank: int = 0,
    cp_rank: int = 0,
) -> list[TensorShape]:
    """Seed B's activations of one layer (and the logits) as one rank holds them in one forward of one
    micro-batch. full = the single-device shape for the whole micro-batch [b, s, ...]; count = layers of this
    kind on the stage (logits: 1 on the last stage). Dense and MoE rows appear when the model has such layers."""
    _check(cfg, par, b, s, sequence_parallel=sequence_parallel, cp_kind=cp_kind)
    e = dtype_bytes(cfg.dtype)
    loc = local_sizes(cfg, par, b, s, sequence_parallel=sequence_parallel)
    t, h, dh, V = par.tp, cfg.d_model, cfg.d_head, cfg.vocab_size
    layers = stage_layer_ids(cfg.n_layers, par.pp, pp_rank)
    n_here = len(layers)
    n_dense = sum(not cfg.is_moe_layer(i) for i in layers)
    n_moe = n_here - n_dense
    last = pp_rank == par.pp - 1
    sp = sequence_parallel and t > 1
    out: list[TensorShape] = []

    def splits(*pairs):
        return tuple((a, d, n) for a, d, n in pairs if n > 1)

    def row(name, symbol, full, local, sp_, count, full_count, note="", expected=False):
        out.append(
            TensorShape(
                name, "", symbol, full, local if count else None, sp_, count, full_count, e, False, expected, note
            )
        )

    L = cfg.n_layers
    hidden_split = splits(("dp", 0, par.dp), ("cp", 1, par.cp), ("tp", 1, t if sp else 1))
    row(
        "input hidden",
        "[b, s, h]",
        (b, s, h),
        (loc.b, loc.s_out, h),
        hidden_split,
        n_here,
        L,
        "outside the TP region" + (": s/(cp tp) tokens under SP" if sp else ": whole h on every TP rank"),
    )
    qsplit = splits(("dp", 0, par.dp), ("tp", 1, t), ("cp", 2, par.cp))
    row(
        "Q",
        "[b, n_head, s, d_head]",
        (b, cfg.n_heads, s, dh),
        (loc.b, loc.heads, loc.s_c, dh),
        qsplit,
        n_here,
        L,
        "inside the TP region: the whole s_c even under SP",
    )
    kv_tp = t if loc.kv_replicas == 1 else cfg.kv_heads
    kvsplit = splits(("dp", 0, par.dp), ("tp", 1, kv_tp), ("cp", 2, par.cp))
    kv_note = "" if loc.kv_replicas == 1 else f"one K/V head held by {loc.kv_replicas} TP ranks"
    for w in ("K", "V"):
        row(
            w,
            "[b, n_kv_head, s, d_head]",
            (b, cfg.kv_heads, s, dh),
            (loc.b, loc.kv_heads, loc.s_c, dh),
            kvsplit,
            n_here,
            L,
            kv_note,
        )
    blocks = score_blocks(cfg, par, b, s, cp_kind=cp_kind, layout=layout, cp_rank=cp_rank)
    if par.cp == 1:
        ssplit = splits(("dp", 0, par.dp), ("tp", 1, t))
        note = "whole s x s per head"
    elif cp_kind == "ulysses":
        ssplit = splits(("dp", 0, par.dp), ("tp", 1, t), ("cp", 1, par.cp))
        note = "Ulysses: heads cut by tp x cp, the whole s x s per head"
    else:
        ssplit = splits(("dp", 0, par.dp), ("tp", 1, t), ("cp", 2, par.cp), ("cp", 3, par.cp))
        note = f"ring: {len(blocks)} blocks per forward, one at a time; never [.., s/cp, s] (score_blocks)"
    row("attention scores", "[b, n_head, s, s]", (b, cfg.n_heads, s, s), blocks[0], ssplit, n_here, L, note)
    row(
        "attention output",
        "[b, s, h]",
        (b, s, h),
        (loc.b, loc.s_c, loc.heads * dh),
        splits(("dp", 0, par.dp), ("cp", 1, par.cp), ("tp", 2, t)),
        n_here,
        L,
        "the input of W_O: h/tp columns",
    )
    if n_dense or (cfg.moe is None):
        row(
            "FFN intermediate",
            "[b, s, h_ffn]",
            (b, s, cfg.d_ff),
            (loc.b, loc.s_c, cfg.d_ff // t),
            splits(("dp", 0, par.dp), ("cp", 1, par.cp), ("tp", 2, t)),
            n_dense,
            sum(not cfg.is_moe_layer(i) for i in range(L)),
            "inside the TP region: the whole s_c even under SP",
        )
    if cfg.moe is not None:
        E, k, ffe = cfg.moe.n_experts, cfg.moe.top_k, cfg.moe.d_ff or cfg.d_ff
        T = loc.b * loc.s_out
        all_moe = sum(cfg.is_moe_layer(i) for i in range(L))
        row(
            "router logits",
            "[b s, E]",
            (b * s, E),
            (T, E),
            splits(("dp", 0, par.dp), ("cp", 0, par.cp), ("tp", 0, t if sp else 1)),
            n_moe,
            all_moe,
            "each rank routes its own tokens",
        )
        rows_e = T * k * par.ep * par.etp / E  # expected rows per local expert (uniform routing)
        rows_e_int = round(rows_e)
        row(
            "expert input",
            "[T_e, h]",
            (b * s * k // E, h),
            (rows_e_int, h),
            (),
            n_moe * (E // par.ep),
            all_moe * E,
            "rows routed to one local expert: expected T k ep etp / E (uniform routing)",
            expected=True,
        )
        row(
            "expert intermediate",
            "[T_e, h_ffn]",
            (b * s * k // E, ffe),
            (rows_e_int, ffe // par.etp),
            splits(("etp", 1, par.etp)),
            n_moe * (E // par.ep),
            all_moe * E,
            "expected, as the expert input",
            expected=True,
        )
    row(
        "block output",
        "[b, s, h]",
        (b, s, h),
        (loc.b, loc.s_out, h),
        hidden_split,
        n_here,
        L,
        "after the reduce (all-reduce, or reduce-scatter under SP)",
    )
    row(
        "logits",
        "[b, s, V]",
        (b, s, V),
        (loc.b, loc.s_c, V // t),
        splits(("dp", 0, par.dp), ("cp", 1, par.cp), ("tp", 2, t)),
        int(last),
        1,
        "vocab-parallel: V/tp columns; on the last stage only",
    )
    return out


# ------------------------------------------------------------------------------------------------ traffic


@dataclass(frozen=True)
class Traffic:
    """One kind of communication of one rank in one training step.

    mode: "TP", "SP", "CP", "EP", "PP", "DP"; op: the collective; when: what triggers it; count: ops per step;
    message: payload S of one op in bytes (the textbook size); sent: bytes this rank sends per step, all ops."""

    mode: str
    op: str
    when: str
    count: int
    message: int
    sent: float


def traffic(
    cfg,
    par,
    b: int,
    s: int,
    *,
    sequence_parallel: bool = SEQUENCE_PARALLEL,
    cp_kind: str = "ring",
    microbatches: int = 1,
    zero: str = "ddp",
    pp_rank: int = 0,
    grad_dtype: str | None = None,
) -> list[Traffic]:
    """The communication of one training step (forward + backward of `microbatches` micro-batches, then the
    gradient reduction) of pipeline rank `pp_rank`, by mode, from the per-mode formulas of `pylib.analysis`:

      TP/SP  tp.layer_collectives per layer (payload b_r s_c h e), + embedding, LM head, cross-entropy
      CP     cp.ring_traffic (K/V blocks, then dK/dV) or cp.ulysses_traffic per layer
      EP     ep.expected_alltoall_bytes: dispatch + combine, forward and backward, per MoE layer
      PP     pp.p2p_bytes_per_rank: one activation forward and one gradient back per boundary and micro-batch
      DP     dp.traffic_per_step over dp x cp (dense weights; Megatron's "dp-cp") and over edp (experts)."""
    _check(cfg, par, b, s, sequence_parallel=sequence_parallel, cp_kind=cp_kind)
    e = dtype_bytes(cfg.dtype)
    ge = dtype_bytes(grad_dtype or cfg.dtype)
    loc = local_sizes(cfg, par, b, s, sequence_parallel=sequence_parallel)
    t, h, m = par.tp, cfg.d_model, microbatches
    layers = stage_layer_ids(cfg.n_layers, par.pp, pp_rank)
    n_here, n_moe = len(layers), sum(cfg.is_moe_layer(i) for i in layers)
    first, last = pp_rank == 0, pp_rank == par.pp - 1
    sp = sequence_parallel and t > 1
    out: list[Traffic] = []
    if t > 1:
        mode = "SP" if sp else "TP"
        # Every layer crosses into and out of the TP region around attention; a dense MLP is a second region, an
        # MoE layer's experts are not (they run on the rank's own tokens, the EP dispatcher moves them).
        per_layer = tp_analysis.layer_collectives(loc.b, loc.s_c, h, t, e, sequence_parallel=sp)
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            ops = [(c, n_here if c.where == "attn" else n_here - n_moe) for c in per_layer if c.op == op]
            ops = [(c, n) for c, n in ops if n]
            if ops:
                when = "entering / leaving attention" + (" and the MLP" if n_here > n_moe else "")
                out.append(
                    Traffic(
                        mode,
                        op,
                        when + ", forward and backward",
                        sum(n for _, n in ops) * m,
                        ops[0][0].payload_bytes,
                        sum(c.bytes_sent * n for c, n in ops) * m,
                    )
                )
        edge = []
        if first:
            edge += tp_analysis.embedding_collectives(loc.b, loc.s_c, h, t, e, sequence_parallel=sp)
        if last:
            edge += tp_analysis.lm_head_collectives(loc.b, loc.s_c, h, t, e, sequence_parallel=sp)
            edge += tp_analysis.cross_entropy_collectives(loc.b, loc.s_c, t, e)
        for c in edge:
            out.append(Traffic(mode, c.op, c.where, m, c.payload_bytes, c.bytes_sent * m))
        # after backward, once per step: SP's LayerNorm gradients, replicated K/V heads' gradients (tp.grad_collectives)
        if sp:  # LayerNorms (and MoE routers) see only the rank's s/(cp tp) tokens: their gradients are summed
            routers = n_moe * cfg.moe.n_experts if n_moe else 0
            payload = ((4 * n_here + 2 * int(last)) * h + routers * h) * ge
            out.append(
                Traffic(
                    mode,
                    "all_reduce",
                    "LayerNorm" + (" and router" if routers else "") + " gradients (sequence-parallel replicas)",
                    1,
                    payload,
                    tp_analysis.ring_bytes_sent("all_reduce", payload, t),
                )
            )
        if loc.kv_replicas > 1:
            payload = n_here * 2 * cfg.kv_heads * cfg.d_head * h * ge
            out.append(
                Traffic(
                    mode,
                    "all_reduce",
                    "gradients of K/V heads replicated over TP",
                    1,
                    payload,
                    tp_analysis.ring_bytes_sent("all_reduce", payload, t),
                )
            )
    if par.cp > 1:
        if cp_kind == "ring":
            r = cp_analysis.ring_traffic(loc.b, s, loc.kv_heads, cfg.d_head, par.cp, e)
            n_kv = r["forward_kv_transfers"] + r["backward_kv_transfers"]
            out.append(
                Traffic(
                    "CP",
                    "send/recv K, V",
                    "each ring step of attention, forward and backward",
                    n_kv * n_here * m,
                    r["kv_message_bytes"],
                    n_kv * r["kv_message_bytes"] * n_here * m,
                )
            )
            out.append(
                Traffic(
                    "CP",
                    "send/recv dK, dV",
                    "each ring step of attention's backward",
                    r["backward_dkv_transfers"] * n_here * m,
                    r["dkv_message_bytes"],
                    r["backward_dkv_transfers"] * r["dkv_message_bytes"] * n_here * m,
                )
            )
        else:
            u = cp_analysis.ulysses_traffic(loc.b, s, loc.heads, loc.kv_heads, cfg.d_head, par.cp, e)
            n = u["all_to_alls_forward"] + u["all_to_alls_backward"]
            out.append(
                Traffic(
                    "CP",
                    "all_to_all",
                    "q, k, v in and the output back, forward and backward",
                    n * n_here * m,
                    u["local_bytes"]["q"],
                    (u["forward_bytes_sent"] + u["backward_bytes_sent"]) * n_here * m,
                )
            )
    if cfg.moe is not None and par.ep > 1 and n_moe:
        T = loc.b * loc.s_out
        k = cfg.moe.top_k
        per = ep_analysis.expected_alltoall_bytes(T, k, h, par.ep, e)
        out.append(
            Traffic(
                "EP",
                "all_to_all",
                "dispatch and combine of each MoE layer, forward and backward",
                4 * n_moe * m,
                T * k * h * e,
                4 * per * n_moe * m,
            )
        )
    if par.pp > 1:
        msg = pp_analysis.p2p_message_bytes(loc.b, loc.s_out, h, e)
        sent = pp_analysis.p2p_bytes_per_rank(loc.b, loc.s_out, h, e, par.pp, m, pp_rank)
        out.append(
            Traffic(
                "PP",
                "send/recv",
                "activation forward / gradient back at each stage boundary",
                sent // msg if msg else 0,
                msg,
                sent,
            )
        )
    counts = parameter_counts(cfg, par, pp_rank=pp_rank)
    d_dense, d_expert = par.dp * par.cp, par.expert_dp()
    for what, n, d in (("dense", counts["dense"], d_dense), ("expert", counts["expert"], d_expert)):
        if n and d > 1:
            for op, sent in dp_analysis.traffic_by_op(n * ge, d, zero).items():
                out.append(
                    Traffic(
                        "DP",
                        op,
                        f"{what} gradients (and ZeRO parameters) once per step over "
                        f"{'dp x cp' if what == 'dense' else 'edp'} = {d}",
                        1,
                        n * ge,
                        sent,
                    )
                )
    return out


def traffic_by_mode(rows: list[Traffic]) -> dict[str, float]:
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
    *,
    sequence_parallel: bool = SEQUENCE_PARALLEL,
    cp_kind: str = "ring",
    microbatches: int = 1,
    zero: str = "ddp",
    pp_rank: int = 0,
    optimizer_states: int = 2,
) -> dict:
    """Bytes one rank holds: parameters, gradients and optimizer state (`dp.held_bytes`, one dtype throughout,
    Adam's two moments by default; dense state sharded over dp x cp, expert state over edp under ZeRO), and the
    activation tensors of `activation_shapes` for the layers of its stage and the micro-batches in flight
    (1F1B: min(pp - pp_rank, m), `pp.peak_in_flight`)."""
    e = dtype_bytes(cfg.dtype)
    counts = parameter_counts(cfg, par, pp_rank=pp_rank)
    held = {"params": 0, "grads": 0, "optim": 0}
    for n, d in ((counts["dense"], par.dp * par.cp), (counts["expert"], par.expert_dp())):
        if n:
            part = dp_analysis.held_bytes(n, e, d, zero, optimizer_states=optimizer_states)
            for key in held:
                held[key] += part[key]
    acts = activation_shapes(cfg, par, b, s, sequence_parallel=sequence_parallel, cp_kind=cp_kind, pp_rank=pp_rank)
    per_microbatch = sum(a.held_bytes for a in acts)
    in_flight = pp_analysis.peak_in_flight("1f1b", par.pp, microbatches, pp_rank) if par.pp > 1 else 1
    return dict(
        **held,
        activations_per_microbatch=per_microbatch,
        in_flight=in_flight,
        activations=per_microbatch * in_flight,
        total=sum(held.values()) + per_microbatch * in_flight,
        params_elements=counts["total"],
    )


@dataclass
class Summary:
    """Everything the explorer shows for one plan."""

    weights: list[TensorShape]
    activations: list[TensorShape]
    memory: dict
    traffic: list[Traffic]
    problems: list[str] = field(default_factory=list)


def summary(
    cfg,
    par,
    b: int,
    s: int,
    *,
    sequence_parallel: bool = SEQUENCE_PARALLEL,
    cp_kind: str = "ring",
    microbatches: int = 1,
    zero: str = "ddp",
    pp_rank: int = 0,
) -> Summary:
    """weights, activations, memory and traffic of one rank; for an impossible plan, the problems only."""
    problems = check_plan(cfg, par, b, s, sequence_parallel=sequence_parallel, cp_kind=cp_kind)
    if problems:
        return Summary([], [], {}, [], problems)
    kw = dict(sequence_parallel=sequence_parallel, cp_kind=cp_kind, pp_rank=pp_rank)
    return Summary(
        weight_shapes(cfg, par, pp_rank=pp_rank),
        activation_shapes(cfg, par, b, s, **kw),
        memory(cfg, par, b, s, microbatches=microbatches, zero=zero, **kw),
        traffic(cfg, par, b, s, microbatches=microbatches, zero=zero, **kw),
    )
