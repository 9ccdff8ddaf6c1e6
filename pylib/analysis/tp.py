"""Tensor and sequence parallelism as formulas: traffic per collective and activation memory per layer.

Pure functions of sizes (no processes). The tests check every function against real runs of `pylib.tp`: the
traffic against the tracer, the memory against `pylib.model.saved_activations`, exactly, byte for byte.

Symbols (article B / Korthikanti et al.): b micro-batch, s sequence, h hidden, a = n_head, t = TP size, e bytes per
element of the activation dtype, h_ffn = d_ff, d_head = h / a.

Traffic per layer (the textbook claim, `layer_collectives`):
    TP        forward: 2 all-reduces of S = b*s*h*e (leaving attention, leaving the MLP); backward: 2 more
              (entering each, the conjugate of the identity copy).
    TP + SP   forward: 2 all-gathers (entering) + 2 reduce-scatters (leaving), each of S; backward: the same.
              A ring all-reduce moves 2(t-1)/t*S per rank, an all-gather or reduce-scatter (t-1)/t*S: so
              AR = AG + RS and SP moves exactly what TP moves.
    SP with regather (Megatron's choice): one more all-gather of S per entry in backward, to rebuild the input
    that was kept only as a sequence slice.

Activation memory per layer (`compare_with_korthikanti`): Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", section 4) count, for GPT with 2-byte activations and dropout,

    no parallelism   s*b*h*(34 + 5*a*s/h)
    TP               s*b*h*(10 + 24/t + 5*a*s/(h*t))
    TP + SP          s*b*h/t*(34 + 5*a*s/h)

Our layer has no dropout, keeps e-byte activations and a few tensors the paper neglects; `compare_with_korthikanti`
lists the paper's terms and ours side by side, one row per saved tensor, with the reason for every difference.
"""

from __future__ import annotations

from dataclasses import dataclass

from pylib.i18n import Said, later
from pylib.plan.options import DTYPE_BYTES  # the one dtype -> bytes table
from pylib.plan.vocab import padded_vocab_size

# --------------------------------------------------------------------------------------------------- traffic


def ring_bytes_sent(op: str, payload: int, n: int) -> int:
    """Bytes one rank sends for a collective of payload S on n ranks (ring / bandwidth-optimal algorithm):
    all-reduce 2(n-1)/n*S, all-gather and reduce-scatter (n-1)/n*S (S = the gathered output / scattered input)."""
    if n == 1:
        return 0
    if op == "all_reduce":
        return 2 * (n - 1) * payload // n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) * payload // n
    raise ValueError(f"unknown collective {op!r}")


@dataclass(frozen=True)
class Collective:
    """One collective on one rank: phase ("forward", "backward", "sp_grads", ...), op, where (the tag under the
    layer: "attn", "mlp", ...), payload S in bytes and what this rank sends."""

    phase: str
    op: str
    where: str
    payload_bytes: int
    bytes_sent: int


def _c(phase, op, where, payload, t) -> Collective:
    return Collective(phase, op, where, payload, ring_bytes_sent(op, payload, t))


def layer_collectives(
    b: int, s: int, h: int, t: int, e: int, *, sequence_parallel: bool = False, regather: bool = False
) -> list[Collective]:
    """Every collective one TP rank issues for one Transformer layer, forward then backward, in issue order.

    Each payload is S = b*s*h*e: the whole activation of the layer's width (an all-gather's output, a
    reduce-scatter's input, the all-reduced tensor)."""
    if t == 1:
        return []
    S = b * s * h * e
    if not sequence_parallel:
        return [
            _c("forward", "all_reduce", "attn", S, t),
            _c("forward", "all_reduce", "mlp", S, t),
            _c("backward", "all_reduce", "mlp", S, t),
            _c("backward", "all_reduce", "attn", S, t),
        ]
    fwd = [_c("forward", op, w, S, t) for w in ("attn", "mlp") for op in ("all_gather", "reduce_scatter")]
    bwd = []
    for w in ("mlp", "attn"):
        bwd.append(_c("backward", "all_gather", w, S, t))  # conjugate of leaving (reduce-scatter)
        if regather:
            bwd.append(_c("backward", "all_gather", f"{w}.regather", S, t))  # rebuild the saved input
        bwd.append(_c("backward", "reduce_scatter", w, S, t))  # conjugate of entering (all-gather)
    return fwd + bwd


def layer_traffic(b, s, h, t, e, *, sequence_parallel=False, regather=False) -> dict[str, int]:
    """Totals of `layer_collectives` per phase: payload and bytes sent by one rank."""
    out = {"forward_payload": 0, "backward_payload": 0, "forward_sent": 0, "backward_sent": 0}
    for c in layer_collectives(b, s, h, t, e, sequence_parallel=sequence_parallel, regather=regather):
        out[f"{c.phase}_payload"] += c.payload_bytes
        out[f"{c.phase}_sent"] += c.bytes_sent
    return out


def embedding_collectives(b, s, h, t, e, *, sequence_parallel=False) -> list[Collective]:
    """Vocab-parallel embedding: sum of the ranks' partial lookups. TP: all-reduce of b*s*h*e forward, nothing
    backward. SP: reduce-scatter forward, all-gather of the output gradient backward."""
    if t == 1:
        return []
    S = b * s * h * e
    if sequence_parallel:
        return [_c("forward", "reduce_scatter", "embed", S, t), _c("backward", "all_gather", "embed", S, t)]
    return [_c("forward", "all_reduce", "embed", S, t)]


def lm_head_collectives(b, s, h, t, e, *, sequence_parallel=False, regather=False) -> list[Collective]:
    """Column-parallel LM head [V/t, h]: entering the TP region (TP: all-reduce of the input gradient in
    backward; SP: all-gather forward, reduce-scatter backward, plus the regather)."""
    if t == 1:
        return []
    S = b * s * h * e
    if not sequence_parallel:
        return [_c("backward", "all_reduce", "lm_head", S, t)]
    out = [_c("forward", "all_gather", "lm_head", S, t)]
    if regather:
        out.append(_c("backward", "all_gather", "lm_head.regather", S, t))
    return out + [_c("backward", "reduce_scatter", "lm_head", S, t)]


def cross_entropy_collectives(b, s, t, e) -> list[Collective]:
    """Vocab-parallel cross-entropy: three all-reduces of b*s numbers (max, target logit, sum of exp), forward
    only, 6 (t-1)/t b*s*e bytes sent; V (padded or not) does not enter. Versus gathering the logits
    (`logits_gather`): (t-1)/t b*s*V_p*e, V_p/6 times more. The backward is local."""
    if t == 1:
        return []
    S = b * s * e
    return [_c("forward", "all_reduce", f"cross_entropy.{w}", S, t) for w in ("max", "target_logit", "sum_exp")]


def logits_gather(b, s, vocab_size, t, e, make_vocab_size_divisible_by=None) -> Collective:
    """The all-gather of the logits that the vocab-parallel loss avoids: each rank's [b, s, V_p/t] to every rank,
    V_p = `pylib.plan.vocab.padded_vocab_size(V, t, make_vocab_size_divisible_by)` (V itself when None)."""
    Vp = padded_vocab_size(vocab_size, t, make_vocab_size_divisible_by)
    return _c("forward", "all_gather", "logits", b * s * Vp * e, t)


def grad_collectives(cfg, t: int, *, sequence_parallel=False) -> list[Collective]:
    """After backward: the SP LayerNorm gradients (2 LayerNorms * (gamma, beta) per layer + the final one, in
    one all-reduce) and the replicated K/V projection gradients (GQA with t > n_kv_head, one all-reduce of a
    zero-padded [n_kv_head, d_head, h] buffer per K and per V, every layer)."""
    if t == 1:
        return []
    e = dtype_bytes(cfg.dtype)
    h, L = cfg.d_model, cfg.n_layers
    out = []
    if sequence_parallel:
        out.append(_c("sp_grads", "all_reduce", "sequence_parallel_grads", (2 * 2 * L + 2) * h * e, t))
    if cfg.kv_heads < t:
        out.append(_c("kv_grads", "all_reduce", "replicated_kv_grads", L * 2 * cfg.kv_heads * cfg.d_head * h * e, t))
    return out


def model_collectives(cfg, b, s, t, *, sequence_parallel=False, regather=False) -> list[Collective]:
    """Every collective of one training step of `TPTransformer` (loss, backward, finalize_grads) on one rank.
    Layer ops are tagged "layers.{i}.attn" / "layers.{i}.mlp"; the order across modules is not implied."""
    e, h = dtype_bytes(cfg.dtype), cfg.d_model
    kw = dict(sequence_parallel=sequence_parallel)
    out = embedding_collectives(b, s, h, t, e, **kw)
    for i in range(cfg.n_layers):
        for c in layer_collectives(b, s, h, t, e, regather=regather, **kw):
            out.append(Collective(c.phase, c.op, f"layers.{i}.{c.where}", c.payload_bytes, c.bytes_sent))
    out += lm_head_collectives(b, s, h, t, e, regather=regather, **kw)
    out += cross_entropy_collectives(b, s, t, e)
    return out + grad_collectives(cfg, t, **kw)


# --------------------------------------------------------------------------------------------------- memory


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name ("bfloat16" -> 2): e of the formulas."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"dtype={dtype!r} is not one of {sorted(DTYPE_BYTES)}") from None


@dataclass(frozen=True)
class MemoryRow:
    """One saved tensor (or group of them) of one layer, per rank: the paper's bytes, ours, how they relate and why.

    relation: "same" (the same tensor; ours = paper * e / 2, the paper counting 2-byte elements),
    "paper only" (the paper keeps it, we do not: dropout), "ours only" (we keep it, the paper neglects it or
    has no such tensor), "different" (the same role, a different size: see `why`). `item` and `relation` are
    keys (code compares them; `pylib.viz.tp_tables` shows them in the reader's language); `why` says the reason in
    the reader's language (pylib.i18n), translated when it is read: the planner computes these rows thousands of
    times per search and reads only their bytes (and a search that never translates is one result for both
    editions of the book, `pylib.i18n.editions`)."""

    item: str
    paper_bytes: float
    ours_bytes: int
    relation: str
    reason: Said  # `why`, said when it is read

    @property
    def why(self) -> str:
        return str(self.reason)


@dataclass(frozen=True)
class _LayerSizes:
    """The sizes `compare_with_korthikanti`'s rows need (see its docstring)."""

    cfg: object
    b: int
    s: int
    t: int
    e: int
    so: int  # tokens per rank outside the TP region
    s_in: int  # tokens of the QKV / MLP input kept for backward
    p_out: float  # the paper's SP divides everything outside the region by t
    gathered: bool  # SP without regather: the inputs are kept gathered

    @property
    def sbh(self) -> int:
        return self.s * self.b * self.cfg.d_model


def _norm_and_input_rows(z: _LayerSizes) -> list[MemoryRow]:
    """LayerNorms' inputs and statistics, and the inputs of the column-parallel linears (QKV, MLP)."""
    e, b, so, h = z.e, z.b, z.so, z.cfg.d_model
    if z.gathered:
        rel, why = (
            "different",
            later(
                "SP without regather keeps the gathered [b, s, h]; Megatron keeps the s/t slice and "
                "all-gathers it again in backward (regather=True)"
            ),
        )
    else:
        rel, why = "same", later("the input of the column-parallel linears")
    stats_why = later("2 numbers per token per LayerNorm; the paper neglects them (O(sb), not O(sbh))")
    return [
        MemoryRow(
            "LayerNorm inputs (LN1, LN2)",
            4 * z.sbh * z.p_out,
            2 * e * b * so * h,
            "same",
            later("outside the TP region: s/t tokens under SP"),
        ),
        MemoryRow("LayerNorm mean and 1/std", 0, 2 * 2 * e * b * so, "ours only", stats_why),
        MemoryRow("QKV input (LN1 output)", 2 * z.sbh * z.p_out, e * b * z.s_in * h, rel, why),
        MemoryRow("MLP input (LN2 output)", 2 * z.sbh * z.p_out, e * b * z.s_in * h, rel, why),
    ]


def _attention_rows(z: _LayerSizes) -> list[MemoryRow]:
    """The attention core's saved tensors, and the paper's dropout terms we do not have."""
    cfg, e, b, s, t, sbh = z.cfg, z.e, z.b, z.s, z.t, z.sbh
    a, dh = cfg.n_heads, cfg.d_head
    a_l = a // t
    gqa = later("under GQA our core expands K to n_head/t heads before the matmul, so K costs as in MHA")
    softmax = later("[b, n_head/t, s, s]: the 5as/h term is this, the dropout mask and the dropout output")
    mask = later("our core keeps an [s, s] bool mask (1 byte each); the paper's fused kernel builds it on the fly")
    rope = later("GPT-3 has learned positions; RoPE keeps cos and sin [s, d_head] for Q and again for K")
    no_dropout = later("no dropout: the softmax output itself feeds the matmul with V")
    none = later("no dropout in our model")
    return [
        MemoryRow("Q and K", 4 * sbh / t, 2 * e * b * s * a_l * dh, "same", gqa),
        MemoryRow("V", 2 * sbh / t, e * b * s * a_l * dh, "same", later("expanded to n_head/t heads under GQA, as K")),
        MemoryRow("softmax output", 2 * a * s * s * b / t, e * b * a_l * s * s, "same", softmax),
        MemoryRow("softmax dropout mask", a * s * s * b / t, 0, "paper only", none),
        MemoryRow("attention probabilities after dropout", 2 * a * s * s * b / t, 0, "paper only", no_dropout),
        MemoryRow("causal mask", 0, s * s if cfg.causal else 0, "ours only", mask),
        MemoryRow("RoPE cos and sin", 0, 4 * e * s * dh if cfg.position == "rope" else 0, "ours only", rope),
        MemoryRow(
            "W_O input (attention output)",
            2 * sbh / t,
            e * b * s * a_l * dh,
            "same",
            later("a copy: heads transposed back to [b, s, h/t]"),
        ),
        MemoryRow("attention residual dropout mask", sbh * z.p_out, 0, "paper only", none),
    ]


def _mlp_rows(z: _LayerSizes) -> list[MemoryRow]:
    """The MLP's hidden activations, and the paper's residual dropout mask."""
    cfg, sbh = z.cfg, z.sbh
    h, ff = cfg.d_model, cfg.d_ff
    swiglu, ratio = cfg.mlp == "swiglu", ff / h
    rel = "same" if not swiglu and ff == 4 * h else "different"
    if swiglu:
        why = later(
            "SwiGLU keeps gate x, silu(gate x), up x and their product, each [b, s, h_ffn/t]; the paper: GELU, "
            "h_ffn = 4h (here h_ffn = {ratio:g}h)",
            ratio=ratio,
        )
    else:
        why = later(
            "GELU keeps its input and output, each [b, s, h_ffn/t]; the paper: GELU, h_ffn = 4h (here h_ffn = "
            "{ratio:g}h)",
            ratio=ratio,
        )
    ours = (4 if swiglu else 2) * z.e * z.b * z.s * (ff // z.t)
    return [
        MemoryRow("MLP hidden", 16 * sbh / z.t, ours, rel, why),
        MemoryRow("MLP residual dropout mask", sbh * z.p_out, 0, "paper only", later("no dropout in our model")),
    ]


def compare_with_korthikanti(
    cfg, b: int, s: int, t: int = 1, *, sequence_parallel: bool = False, regather: bool = False
) -> list[MemoryRow]:
    """Activation bytes one TP rank keeps for backward in one layer: Korthikanti et al.'s terms (2-byte
    activations, 1-byte dropout masks, a = n_head, GELU with h_ffn = 4h) beside what our `TPBlock` saves.

    Ours is exact for float32/float64 (`saved_activations` measures it; the tests assert equality); e is the
    element size of cfg.dtype. Outside the TP region a rank holds s/t tokens under SP, else s. With SP and
    regather=False the QKV and MLP inputs are kept gathered ([b, s, h] on every rank); with regather=True only the
    slice is kept and gathered again in backward, as Megatron does and as the paper's TP+SP formula assumes.
    Sizes follow from autograd's rules: a matmul keeps both inputs, LayerNorm keeps its input, mean and 1/std,
    GELU and SiLU keep their input, a product keeps both factors, masked_fill keeps the mask, softmax its output."""
    sp = sequence_parallel and t > 1
    so = s // t if sp else s
    s_in = so if (sp and regather) else s
    p_out = 1 / t if sequence_parallel else 1.0
    z = _LayerSizes(cfg, b, s, t, dtype_bytes(cfg.dtype), so, s_in, p_out, sp and not regather)
    norms = _norm_and_input_rows(z)
    # in the layer's order: LayerNorm 1, the QKV input, attention, LayerNorm 2's input, the MLP
    return norms[:3] + _attention_rows(z) + norms[3:] + _mlp_rows(z)


def saved_activation_bytes(
    cfg, b: int, s: int, t: int = 1, *, sequence_parallel: bool = False, regather: bool = False
) -> int:
    """Exact bytes autograd keeps for backward in one `TPBlock` forward, per rank (weights excluded)."""
    return sum(
        r.ours_bytes
        for r in compare_with_korthikanti(cfg, b, s, t, sequence_parallel=sequence_parallel, regather=regather)
    )


def korthikanti_bytes(s: int, b: int, h: int, a: int, t: int = 1, *, sequence_parallel: bool = False) -> float:
    """Korthikanti et al. 2022, activation bytes per layer per rank (2-byte activations, with dropout):
    sbh(34 + 5as/h) without parallelism, sbh(10 + 24/t + 5as/(ht)) with TP, sbh/t(34 + 5as/h) with TP + SP."""
    sbh = s * b * h
    if sequence_parallel:
        return sbh / t * (34 + 5 * a * s / h)
    return sbh * (10 + 24 / t + 5 * a * s / (h * t))


def green_zone_bytes(cfg, b: int, s: int, t: int = 1, *, sequence_parallel: bool = False) -> int:
    """What a layer saves *outside* the TP region (LayerNorm inputs and statistics): the part SP cuts to 1/t
    (article A section 4)."""
    rows = compare_with_korthikanti(cfg, b, s, t, sequence_parallel=sequence_parallel)
    return sum(r.ours_bytes for r in rows if r.item.startswith("LayerNorm"))
