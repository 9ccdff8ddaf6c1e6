"""Per-rank shapes of every weight of the reference model under a TP x CP x EP x DP x PP plan: article B's weight
matrices as pure functions of sizes, and the parameter counts that follow from them.

    ws = weight_shapes(cfg, par, pp_rank=0)       # list[TensorShape], torch [out, in]
    local_parameters(cfg, par, pp_rank=0)         # {parameter name: local shape}, as the reference model names them
    parameter_counts(cfg, par, pp_rank=0)         # {"dense", "expert", "total"} elements this rank holds

The planner sizes parameters, gradients and optimizer state from these shapes (`pylib.analysis.planner`); the
explorer's module (`pylib.analysis.shapes`) adds the activations, and asks the planner for memory and traffic. The
conventions (article B's symbols, which axis cuts which dimension) are `shapes`' docstring's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from pylib.i18n import Said, later
from pylib.plan.heads import kv_heads_per_rank
from pylib.plan.mesh import ParallelConfig
from pylib.plan.options import RunOptions
from pylib.plan.problems import size_problems
from pylib.plan.split import chunk_layers

from .tp import dtype_bytes


@dataclass(frozen=True)
class TensorShape:
    """One tensor (or a family of equal tensors) as one rank holds it.

    name: article B's name ("W_Q", "FFN intermediate"); param: the reference model's name pattern ("layers.{i}.attn.
    q_proj.weight"; "" for activations); symbol: article B's shape in symbols ("[h, h_kv]");
    full / local: the reference shape and this rank's (torch layout: weights [out, in]); local None when this
    rank holds none of it (a layer of another pipeline stage, the LM head off the last stage);
    splits: (axis, dim, parts) for every axis that cuts a dimension; count / full_count: how many such tensors
    this rank holds / the whole model has (layers on the stage, local experts); linear: an nn.Linear weight
    (article B writes it transposed); expected: a data-dependent shape, given as its expectation; `note` says how
    it is split, in the reader's language, when it is read (`said`: a `pylib.i18n.later` message, or plain text)."""

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
    said: Said | str = ""

    @property
    def note(self) -> str:
        return str(self.said)

    @property
    def seed_b(self) -> tuple[int, ...] | None:
        """The local shape in article B's orientation: a linear weight [in, out], everything else as stored."""
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


def stage_layer_ids(n_layers: int, pp: int, pp_rank: int) -> range:
    """Layers held by pipeline rank `pp_rank` (no interleaving): `pylib.plan.split.chunk_layers` with v = 1."""
    return chunk_layers(n_layers, pp, 1, pp_rank)[0]


def check_sizes(cfg, par, b=None, s=None, options: RunOptions = RunOptions()):
    """Raise when the shapes asked for do not exist: the size rules of `pylib.plan.problems` (what a mode alone
    needs; the explorer's `summary` asks every rule, `check_plan`) under `options`; b is one micro-batch."""
    one = replace(options, n_microbatches=1)
    problems = size_problems(cfg, par, batch=b, seq=s, options=one)
    if problems:
        raise ValueError("the plan does not fit the model: " + "; ".join(problems))


# ------------------------------------------------------------------------------------------------ weights


@dataclass
class _WeightRows:
    """The weights of one pipeline rank being listed: the sizes every seam of `weight_shapes` needs."""

    cfg: object
    par: object
    pp_rank: int
    out: list = field(default_factory=list)

    def __post_init__(self):
        cfg = self.cfg
        self.layers = stage_layer_ids(cfg.n_layers, self.par.pp, self.pp_rank)
        self.dense = [i for i in self.layers if not cfg.is_moe_layer(i)]
        self.moe = [i for i in self.layers if cfg.is_moe_layer(i)]
        self.all_dense = sum(not cfg.is_moe_layer(i) for i in range(cfg.n_layers))
        self.all_moe = cfg.n_layers - self.all_dense
        self.e = dtype_bytes(cfg.dtype)

    def tp_split(self, dim: int, parts: int | None = None) -> list:
        t = self.par.tp
        return [("tp", dim, t if parts is None else parts)] if t > 1 else []

    def row(self, name, param, symbol, full, local, splits, count, full_count, linear=True, note=""):
        local = local if count else None
        self.out.append(
            TensorShape(name, param, symbol, full, local, tuple(splits), count, full_count, self.e, linear, False, note)
        )


def _vocab_rows(w: _WeightRows) -> None:
    """Embedding (first stage) and LM head (last stage): vocab-parallel, V split over tp."""
    cfg, t = w.cfg, w.par.tp
    V, h = cfg.vocab_size, cfg.d_model
    first, last = w.pp_rank == 0, w.pp_rank == w.par.pp - 1
    note = later("vocab-parallel: rank holds token ids [r V/tp, (r+1) V/tp)")
    w.row("token embedding", "embed.weight", "[V, h]", (V, h), (V // t, h), w.tp_split(0), int(first), 1, False, note)
    if not cfg.tie_embeddings:
        note = later("column-parallel over the vocabulary")
        w.row("LM head", "lm_head.weight", "[h, V]", (V, h), (V // t, h), w.tp_split(0), int(last), 1, note=note)
    elif w.par.pp > 1:  # tied over stages: the last stage holds a copy of the embedding (no tensor of the model's)
        note = later("tied: a copy of the embedding, gradients summed with the first stage's")
        held = int(last and not first)
        w.row("LM head", "lm_head.weight", "[h, V]", (V, h), (V // t, h), w.tp_split(0), held, 0, note=note)


def _attention_rows(w: _WeightRows) -> None:
    """W_Q and W_O split by query head; W_K, W_V split by K/V head, or one K/V head replicated."""
    cfg, t = w.cfg, w.par.tp
    h, dh, n, L = cfg.d_model, cfg.d_head, len(w.layers), cfg.n_layers
    kv_local, kv_replicas = kv_heads_per_rank(cfg.n_heads, cfg.kv_heads, t)
    q_full, q_local = (cfg.n_heads * dh, h), (cfg.n_heads // t * dh, h)
    note = later("column split by query head")
    w.row("W_Q", "layers.{i}.attn.q_proj.weight", "[h, h]", q_full, q_local, w.tp_split(0), n, L, note=note)
    if kv_replicas == 1:
        kv_note = later("column split by K/V head")
    else:
        kv_note = later("one K/V head, replicated on {n} TP ranks", n=kv_replicas)
    kv_split = w.tp_split(0) if kv_replicas == 1 else w.tp_split(0, cfg.kv_heads)
    for name in ("K", "V"):
        param = f"layers.{{i}}.attn.{name.lower()}_proj.weight"
        full, local = (cfg.kv_heads * dh, h), (kv_local * dh, h)
        w.row(f"W_{name}", param, "[h, h_kv]", full, local, kv_split, n, L, note=kv_note)
    note = later("row split: partial sums all-reduced")
    o_full, o_local = q_full[::-1], q_local[::-1]
    w.row("W_O", "layers.{i}.attn.o_proj.weight", "[h, h]", o_full, o_local, w.tp_split(1), n, L, note=note)


def _dense_mlp_rows(w: _WeightRows) -> None:
    """The dense MLP's W_gate, W_up (column split over h_ffn) and W_down (row split)."""
    if not w.all_dense:
        return
    cfg, t = w.cfg, w.par.tp
    h, ff, n, n_all = cfg.d_model, cfg.d_ff, len(w.dense), w.all_dense
    if cfg.mlp == "swiglu":
        note = later("column split, the same slice as W_up")
        w.row(
            "W_gate",
            "layers.{i}.mlp.gate_proj.weight",
            "[h, h_ffn]",
            (ff, h),
            (ff // t, h),
            w.tp_split(0),
            n,
            n_all,
            note=note,
        )
    w.row(
        "W_up",
        "layers.{i}.mlp.up_proj.weight",
        "[h, h_ffn]",
        (ff, h),
        (ff // t, h),
        w.tp_split(0),
        n,
        n_all,
        note=later("column split"),
    )
    note = later("row split: partial sums all-reduced")
    w.row(
        "W_down",
        "layers.{i}.mlp.down_proj.weight",
        "[h_ffn, h]",
        (h, ff),
        (h, ff // t),
        w.tp_split(1),
        n,
        n_all,
        note=note,
    )


def _expert_rows(w: _WeightRows) -> None:
    """The router (replicated) and each rank's E/ep experts, each cut by etp like a TP MLP."""
    if not w.all_moe:
        return
    cfg, par, h = w.cfg, w.par, w.cfg.d_model
    E, ffe, etp = cfg.moe.n_experts, cfg.moe.d_ff or cfg.d_ff, par.etp
    n_local, n, n_all = E // par.ep, len(w.moe), w.all_moe
    note = later("replicated: every rank routes its own tokens")
    w.row("router", "layers.{i}.mlp.router.gate.weight", "[h, E]", (E, h), (E, h), [], n, n_all, note=note)
    esplit = [("ep", -1, par.ep)] if par.ep > 1 else []
    per_rank = later("E/ep = {n} experts per rank", n=n_local)
    for name in (["gate_proj"] if cfg.mlp == "swiglu" else []) + ["up_proj"]:
        splits = esplit + ([("etp", 0, etp)] if etp > 1 else [])
        note = later("{per_rank}, h_ffn/etp = {n}", per_rank=per_rank, n=ffe // etp) if etp > 1 else per_rank
        param = f"layers.{{i}}.mlp.experts.{{e}}.{name}.weight"
        label = f"expert W_{name.split('_')[0]}"
        w.row(label, param, "[h, h_ffn]", (ffe, h), (ffe // etp, h), splits, n * n_local, n_all * E, note=note)
    splits = esplit + ([("etp", 1, etp)] if etp > 1 else [])
    param = "layers.{i}.mlp.experts.{e}.down_proj.weight"
    w.row(
        "expert W_down", param, "[h_ffn, h]", (h, ffe), (h, ffe // etp), splits, n * n_local, n_all * E, note=per_rank
    )


def _norm_rows(w: _WeightRows) -> None:
    """LayerNorms: whole on every rank."""
    h, last = w.cfg.d_model, w.pp_rank == w.par.pp - 1
    note = later("whole on every rank (SP: gradient all-reduced over TP)")
    ln = "layers.{i}.ln{1,2}.{weight,bias}"
    w.row("LayerNorm γ, β", ln, "[h]", (h,), (h,), [], 4 * len(w.layers), 4 * w.cfg.n_layers, False, note)
    w.row("final LayerNorm γ, β", "ln_f.{weight,bias}", "[h]", (h,), (h,), [], 2 * int(last), 2, linear=False)


def weight_shapes(cfg, par, *, pp_rank: int = 0) -> list[TensorShape]:
    """Every distinct weight of the model, as pipeline rank `pp_rank` holds it (any TP/CP/EP/DP coordinates
    give the same shapes). torch layout [out, in]; `count` tensors of each kind on this rank.

    TP: embedding and LM head split V (dim 0), W_Q/W_K/W_V and W_up/W_gate split their output (dim 0, heads or
    h_ffn), W_O and W_down their input (dim 1); LayerNorms and the router whole. EP: E/ep experts, each split by
    etp like a TP MLP. CP, DP (without ZeRO-3) and sequence parallelism: nothing split. PP: layers of the stage."""
    check_sizes(cfg, par)
    w = _WeightRows(cfg, par, pp_rank)
    for seam in (_vocab_rows, _attention_rows, _dense_mlp_rows, _expert_rows, _norm_rows):
        seam(w)
    return w.out


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
