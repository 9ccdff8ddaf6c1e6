"""How long one rank computes: GEMMs on a roofline with an achievable fraction of peak, the memory-bound
elementwise work around them, and the forward run again under activation recomputation. Pure functions of sizes.

    model = CostModel()                                    # the free constants (fitted in `calibration`)
    t = microbatch_seconds(cfg, plan, seq, pp_rank, peak_flops=989e12, hbm_bandwidth=3.35e12, model=model)
    t.forward, t.backward, t.core                          # seconds of one microbatch on that rank

The terms, per layer and microbatch on one rank (T = b s / cp tokens, t = tp, e bytes per element):

    GEMM (M, N, K)  seconds = max(2 M N K / (eta peak), e (M K + K N + M N) / hbm)           (a roofline)
                    the layer's GEMMs: QKV [T, h] x [h, (a + 2 kv) d / t], W_O [T, a d / t] x [a d / t, h], the MLP
                    [T, h] x [h, m_in h_ffn / t], [T, h_ffn / t] x [h_ffn / t, h] (m_in = 2 for SwiGLU, 1 for GELU);
                    an MoE layer's experts the same with T k ep / E tokens per local expert and h_ffn / etp
    core            the attention core, 4 T s_kv (a / t) d FLOPs (half of it causal) at eta peak: it is a GEMM too
    elementwise     e T h (c_rep / t_s + (c_elem - c_rep) / t) bytes at hbm (LayerNorms, residual adds, dropout,
                    the activation, rotary: each reads and writes [T, h]). c_rep of it runs outside the TP region
                    (the two LayerNorms and the two bias-dropout-adds), cut by t_s = t under SP and repeated on every
                    TP rank (t_s = 1) without; the rest, inside it, cut by t. c_elem is fitted and absorbs what the
                    roofline misses; c_rep is counted (`CostModel`), so SP's saving is the counted bytes alone
    backward        twice the forward's GEMMs and core; the elementwise work once more
    recompute       `recompute.extra_forward_flops` of the layer at eta peak, in backward; Megatron's modules
                    (`Plan.recompute_modules`) their `recompute.module_extra_flops` at eta peak and their
                    `recompute.module_extra_hbm_bytes` (the norms, the experts' activation) at hbm
    LM head         [T, h] x [h, V / t] on the last stage, the embedding lookup on the first (elementwise)
    FP8             with `Fp8Compute`, the linears' GEMMs at eta_fp8 times the FP8 peak with 1-byte operands, plus
                    the casts of their inputs (forward) and output gradients (backward) at hbm; the core, the
                    router and the LM head stay 16-bit
    W               of the backward, the weight-gradient GEMMs (`MicrobatchTime.wgrad`): a zero-bubble W

Small shards pay twice: a GEMM whose M = T is small falls under the roofline's memory slope, and the elementwise
bytes per FLOP grow as 1/h, so a narrow model runs further below peak than a wide one (the weak-scaling tables of
Megatron-LM show 41% for h = 2048 and 47-49% from h = 4096 up). What this does not model: wave quantisation,
kernel-launch gaps, the optimizer step, fused kernels that skip the elementwise passes.
"""

from __future__ import annotations

from dataclasses import dataclass

from pylib.plan.fields import number
from pylib.plan.heads import kv_heads_per_rank
from pylib.plan.recompute import recompute_modules
from pylib.plan.schedules import rank_stage

from .activations import expected_expert_rows, split_layers
from .recompute import extra_forward_flops, module_extra_flops, module_extra_hbm_bytes, shared_ff
from .tp import dtype_bytes

ETA_FP8 = 0.65  # `calibration.fit_fp8`'s answer on `calibration.FP8_FIT_ROWS` (tests/test_analysis_calibration_fp8.py)


@dataclass(frozen=True)
class CostModel:
    """The cost model's free constants. eta: the fraction of peak a large GEMM achieves; c_elem: bytes of
    elementwise traffic per element of [T, h] per layer forward, in units of e; c_rep: the part of c_elem outside
    the TP region, which every TP rank repeats without SP (not fitted: counted for Megatron's layer, two LayerNorms
    that read and write [T, h], 2 each, and two fused bias-dropout-adds that read the output and the residual and
    write the sum and a 1-byte mask, 3.5 each: 11; checked against the layer times Korthikanti et al. 2022 measured
    with and without SP, `calibration.KORTHIKANTI_SP`); tp_overlap: the fraction of TP/SP
    communication hidden behind GEMMs when the run overlaps it (`Cluster.tp_comm_overlap`); latency: seconds each
    message of a model axis waits before its bytes move (not fitted: NCCL's small-message latency inside a node is
    of the order of 10-30 us); contention: compute seconds lost per second of communication hidden behind it (not
    fitted: NCCL's collectives run on some 10-20% of the SMs); eta_fp8: the fraction of the FP8 peak an FP8 GEMM
    achieves (`Fp8Compute`), fitted alone on published FP8 runs with the other constants held
    (`calibration.fit_fp8` on `calibration.FP8_FIT_ROWS`); the other defaults are the fit of `calibration.fit` on
    its fit rows (`calibration.FIT_ROWS`, the grid `calibration.GRID`)."""

    eta: float = 0.60
    c_elem: float = 140.0
    c_rep: float = 11.0
    tp_overlap: float = 0.8
    latency: float = 20e-6
    contention: float = 0.2
    eta_fp8: float = ETA_FP8

    def __post_init__(self):
        number("CostModel", "eta", self.eta, above=0, high=1)
        number("CostModel", "eta_fp8", self.eta_fp8, above=0, high=1)
        number("CostModel", "c_elem", self.c_elem, low=0)
        number("CostModel", "c_rep", self.c_rep, low=0, high=self.c_elem)
        number("CostModel", "tp_overlap", self.tp_overlap, low=0, high=1)
        number("CostModel", "latency", self.latency, low=0)
        number("CostModel", "contention", self.contention, low=0)


@dataclass(frozen=True)
class Fp8Compute:
    """FP8 GEMMs on the roofline: `recipe` (an `Fp8Recipe`) runs the linear layers' three GEMMs (forward, dgrad,
    wgrad) at `peak_flops`, the GPU's dense FP8 peak, times `CostModel.eta_fp8`, reading 1-byte operands. The
    attention core, the router and the LM head stay in the model's dtype, as Transformer Engine runs them, and so
    do the first and the last layer with the recipe's `first_last_layers_bf16` (Megatron's
    --first-last-layers-bf16). Each FP8 GEMM
    first quantizes the operand it did not have in FP8 (`quantize_bytes`)."""

    recipe: object
    peak_flops: float

    def runs(self, cfg, layer: int) -> bool:
        """Whether layer `layer`'s linears run in FP8."""
        return not (self.recipe.first_last_layers_bf16 and layer in (0, cfg.n_layers - 1))

    def quantize_bytes(self, elements: float, e: int) -> float:
        """HBM bytes to quantize one activation or gradient of `elements` in the model's dtype (e bytes each) for
        one FP8 GEMM and its transposed use: read it once (twice where the scale comes from the tensor itself, every
        recipe but "delayed", whose scale comes from the amax history and whose amax is taken in the same pass) and
        write two FP8 copies, row-wise and column-wise (`analysis.fp8`: the GEMM reads K-major operands). The
        weights' casts, once per step, and the per-block scales are left out (a few bytes per 32 to 16,384)."""
        reads = 1 if self.recipe.recipe == "delayed" else 2
        return elements * (reads * e + 2)


@dataclass(frozen=True)
class MicrobatchTime:
    """Seconds one rank spends on one microbatch: forward, backward (recomputation included) and, of those, the
    attention core's (what a ring CP exchange can hide behind) and the input-gradient GEMMs of the column-parallel
    linears (QKV, the dense MLP's first, the LM head: what Megatron's SP re-gather of their input runs under) and
    `wgrad`, the weight-gradient GEMMs: each as long as its forward GEMM (dW = X^T dY has the forward's FLOPs and
    operands), the W a zero-bubble schedule defers (`pp.simulated_split_bubble`); B is `backward - wgrad` (the
    input-gradient GEMMs, the attention core's backward, the elementwise work and any recomputation)."""

    forward: float
    backward: float
    core: float
    column_dgrad: float = 0.0
    wgrad: float = 0.0  # of `backward`: the weight-gradient GEMMs (a zero-bubble schedule's W; the rest is its B)

    @property
    def total(self) -> float:
        return self.forward + self.backward


def gemm_seconds(m: float, n: float, k: float, e: int, peak: float, hbm: float, eta: float) -> float:
    """One GEMM [m, k] x [k, n] on the roofline: max(2 m n k / (eta peak), e (m k + k n + m n) / hbm)."""
    if min(m, n, k) <= 0:
        return 0.0
    return max(2 * m * n * k / (eta * peak), e * (m * k + k * n + m * n) / hbm)


def layer_gemms(
    cfg, tokens: float, tp: int, moe: bool, ep: int = 1, etp: int = 1, imbalance: float = 1.0
) -> list[tuple]:
    """(M, N, K) of every GEMM of one layer's forward on one rank (module docstring); `imbalance` (the planner's
    `Plan.routing_imbalance`) multiplies the rows each local expert receives: the busiest rank's GEMMs. A MoE
    layer's shared experts (`MoEConfig.n_shared_experts`) are one MLP of h_ffn f_s / t on all T tokens."""
    h, d = cfg.d_model, cfg.d_head
    heads, (kv, _) = cfg.n_heads // tp, kv_heads_per_rank(cfg.n_heads, cfg.kv_heads, tp)
    m_in = 2 if cfg.mlp == "swiglu" else 1
    out = [(tokens, (heads + 2 * kv) * d, h), (tokens, h, heads * d)]
    if moe:
        f = (cfg.moe.d_ff or cfg.d_ff) // etp
        local = cfg.moe.n_experts // ep
        rows = imbalance * tokens * cfg.moe.top_k * ep / cfg.moe.n_experts  # tokens one local expert receives
        out += [(rows, m_in * f, h), (rows, h, f)] * local
        out.append((tokens, cfg.moe.n_experts, h))  # the router
        f_s = shared_ff(cfg) // tp
        if f_s:
            out += [(tokens, m_in * f_s, h), (tokens, h, f_s)]
    else:
        f = cfg.d_ff // tp
        out += [(tokens, m_in * f, h), (tokens, h, f)]
    return out


def _router_index(cfg, moe: bool, ep: int) -> int | None:
    """Where `layer_gemms` lists an MoE layer's router: after attention's two GEMMs and two per local expert."""
    return 2 + 2 * (cfg.moe.n_experts // ep) if moe else None


def storage_hbm_bytes(cfg, plan, tokens: int, e: int) -> tuple[int, int]:
    """(forward, backward) HBM bytes "swiglu_fp8" (`planner.Workload.storage`) adds to one MoE layer on one rank,
    `tokens` = b s / cp: the forward writes FP8 copies of the SwiGLU's two inputs, reading each 16-bit input once
    more and writing 1 byte an element (2 n (e + 1), n = R f/etp for the routed experts plus T f_s/tp for the shared
    ones); the backward rebuilds the SwiGLU output, reading the two FP8 copies and writing the e-byte output
    (n (2 + e)). The SwiGLU's arithmetic (a sigmoid, three multiplies an element) runs at memory speed beside it,
    as `recompute.module_extra_hbm_bytes` prices "moe_act". With "moe_act" also chosen the rerun is priced twice:
    moe_act's 16-bit reading and this one (an upper bound)."""
    par = plan.par
    n_routed, t_o, sp = _routed_hidden(cfg, plan, tokens)
    n = n_routed + (t_o * par.tp if sp else t_o) * (shared_ff(cfg) // par.tp)
    return 2 * n * (e + 1), n * (2 + e)


def gate_hbm_bytes(cfg, plan, tokens: int, e: int) -> tuple[int, int]:
    """(forward, backward) HBM bytes "gate_in_expert" (`planner.Workload.storage`) adds to one MoE layer on one rank,
    `tokens` = b s / cp, n = R f/etp the routed experts' hidden elements: the forward scales the hidden activation by
    its row's weight before the down projection (reads and writes it: 2 n e); the backward reads the down
    projection's input gradient and the hidden activation for the row-wise dot, and scales that gradient (reads and
    writes it): 4 n e. The weighting at home it replaces (the [T k, h] expert outputs read, scaled and their
    gradient's dot) is not credited back: the planner never priced it (an upper bound on the added time). Nor are
    the weights' own exchanges (one value a row beside the row's h: 1/h of the dispatch's bytes)."""
    n = _routed_hidden(cfg, plan, tokens)[0]
    return 2 * n * e, 4 * n * e


def _routed_hidden(cfg, plan, tokens: int) -> tuple[int, int, bool]:
    """(the hidden elements R f/etp of this rank's routed experts in one MoE layer, R the expected rows times the
    plan's routing imbalance; the MoE's tokens outside the TP region; whether SP splits them), `tokens` = b s / cp."""
    par = plan.par
    sp = plan.options.sequence_parallel and par.tp > 1
    t_o = tokens // par.tp if sp else tokens
    rows = round(expected_expert_rows(t_o, cfg.moe.top_k, par.etp) * getattr(plan, "routing_imbalance", 1.0))
    return rows * ((cfg.moe.d_ff or cfg.d_ff) // par.etp), t_o, sp


def microbatch_seconds(
    cfg,
    plan,
    seq: int,
    pp_rank: int,
    *,
    batch: int,
    peak_flops: float,
    hbm_bandwidth: float,
    model: CostModel,
    fp8: Fp8Compute | None = None,
    storage: tuple[str, ...] = (),
) -> MicrobatchTime:
    """Seconds of one microbatch on pipeline rank `pp_rank` of `plan` (a `planner.Plan`), every chunk it holds;
    with `fp8` the linear layers' GEMMs in FP8 (`Fp8Compute`); storage: DeepSeek-V3's storage choices
    (`planner.Workload.storage`), "swiglu_fp8" priced by `storage_hbm_bytes`, "gate_in_expert" by `gate_hbm_bytes`."""
    par = plan.par
    e = dtype_bytes(cfg.dtype)
    b = plan.micro_batch(batch)
    tokens = b * seq / par.cp
    tp, eta = par.tp, model.eta
    t_s = tp if plan.options.sequence_parallel and tp > 1 else 1
    heads = cfg.n_heads // tp
    causal = 0.5 if cfg.causal else 1.0
    core_flops = 4 * tokens * seq * heads * cfg.d_head * causal
    core = core_flops / (eta * peak_flops)
    elem = e * tokens * cfg.d_model * (model.c_rep / t_s + (model.c_elem - model.c_rep) / tp) / hbm_bandwidth
    fwd = bwd = core_total = dgrad = wgrad = 0.0
    imbalance = getattr(plan, "routing_imbalance", 1.0)
    n_stages = par.pp * plan.options.v
    of_kind = {}  # every layer of a kind (dense, MoE) runs the same GEMMs: their seconds, computed once
    for stage, layers in rank_chunks(cfg, plan, pp_rank):
        for i in layers:
            moe = cfg.moe is not None and cfg.is_moe_layer(i)
            in_fp8 = fp8 is not None and fp8.runs(cfg, i)
            if (moe, in_fp8) not in of_kind:
                shapes = layer_gemms(cfg, tokens, tp, moe, par.ep, par.etp, imbalance)
                cast_f = cast_b = 0.0  # seconds quantizing the linears' inputs (forward) and output gradients
                if in_fp8:  # the linears in FP8; an MoE's router stays
                    router = _router_index(cfg, moe, par.ep)
                    linears = [x for j, x in enumerate(shapes) if j != router]
                    gs = [
                        gemm_seconds(m, n, k, 1, fp8.peak_flops, hbm_bandwidth, model.eta_fp8)
                        if j != router
                        else gemm_seconds(m, n, k, e, peak_flops, hbm_bandwidth, eta)
                        for j, (m, n, k) in enumerate(shapes)
                    ]
                    cast_f = sum(fp8.quantize_bytes(m * k, e) for m, _, k in linears) / hbm_bandwidth
                    cast_b = sum(fp8.quantize_bytes(m * n, e) for m, n, _ in linears) / hbm_bandwidth
                else:
                    gs = [gemm_seconds(m, n, k, e, peak_flops, hbm_bandwidth, eta) for m, n, k in shapes]
                of_kind[moe, in_fp8] = gs, sum(gs), cast_f, cast_b
            gs, g, cast_f, cast_b = of_kind[moe, in_fp8]
            if moe and in_fp8 and "swiglu_fp8" in storage:
                extra_f, extra_b = storage_hbm_bytes(cfg, plan, b * seq // par.cp, e)
                cast_f, cast_b = cast_f + extra_f / hbm_bandwidth, cast_b + extra_b / hbm_bandwidth
            if moe and "gate_in_expert" in storage:
                extra_f, extra_b = gate_hbm_bytes(cfg, plan, b * seq // par.cp, e)
                cast_f, cast_b = cast_f + extra_f / hbm_bandwidth, cast_b + extra_b / hbm_bandwidth
            dgrad += gs[0] + (0.0 if moe else gs[2])  # dX of QKV and of the MLP's first GEMM: as long as forward
            fwd += g + core + elem + cast_f
            bwd += 2 * (g + core) + elem + cast_b
            wgrad += g
            core_total += 3 * core
        if plan.options.recompute.granularity == "selective" and layers:
            flops, hbm = _module_work(cfg, b, seq, par, plan, layers)
            bwd += flops / (eta * peak_flops) + hbm / hbm_bandwidth
        elif plan.options.recompute.granularity != "none" and layers:
            extra = _recompute_flops(cfg, b, seq, par, plan, len(layers))
            bwd += extra / (eta * peak_flops)
        if stage == n_stages - 1:  # the LM head, forward and its two backward GEMMs
            head = gemm_seconds(tokens, cfg.vocab_size / tp, cfg.d_model, e, peak_flops, hbm_bandwidth, eta)
            fwd += head
            bwd += 2 * head
            dgrad += head
            wgrad += head
        if stage == 0:
            fwd += 2 * e * tokens * cfg.d_model / t_s / hbm_bandwidth  # the embedding's gather and write
    return MicrobatchTime(fwd, bwd, core_total, dgrad, wgrad)


def rank_chunks(cfg, plan, pp_rank: int) -> list[tuple[int, range]]:
    """(virtual stage, its layers) of each chunk pipeline rank `pp_rank` of `plan` holds (`stage_chunks`)."""
    par, o = plan.par, plan.options
    return stage_chunks(cfg.n_layers, par.pp, o.v, pp_rank, plan.balance_ends, getattr(plan, "placement", "loop"))


def stage_chunks(
    n_layers: int, p: int, v: int, pp_rank: int, balance_ends: bool = False, placement: str = "loop"
) -> list[tuple[int, range]]:
    """(virtual stage, its layers) of each chunk of pipeline rank `pp_rank`: chunk c is stage c p + r in the loop
    placement, and in the V of ZB-V and DualPipeV (placement "v") stage r and stage 2p - 1 - r
    (`schedules.rank_stage`), so rank 0 holds the embedding and the LM head, rank p - 1 neither. The layers of
    stage k are the same in both: the loop split's chunk k // p of rank k % p (`activations.split_layers`)."""
    if placement == "loop":
        return [(c * p + pp_rank, ls) for c, ls in enumerate(split_layers(n_layers, p, v, pp_rank, balance_ends))]
    stages = [rank_stage(pp_rank, c, p, placement) for c in range(v)]
    return [(k, split_layers(n_layers, p, v, k % p, balance_ends)[k // p]) for k in stages]


def _module_work(cfg, b: int, seq: int, par, plan, layers) -> tuple[int, int]:
    """(matmul FLOPs, memory-bound bytes) one chunk's selective recomputation runs again on one rank: every layer's
    modules (`Plan.recompute_modules`; the default, the attention core, is pylib's "selective")."""
    s = seq // par.cp
    modules = recompute_modules(plan.options.recompute.granularity, getattr(plan, "recompute_modules", None))
    sp = plan.options.sequence_parallel and par.tp > 1
    rows = expected_expert_rows(b * (s // par.tp if sp else s), cfg.moe.top_k, par.etp) if cfg.moe else 0
    rows = round(rows * getattr(plan, "routing_imbalance", 1.0))  # the busiest rank's (`Plan.routing_imbalance`)
    flops = hbm = 0
    for i in layers:
        moe = cfg.is_moe_layer(i)
        flops += module_extra_flops(
            cfg, b, s, par.tp, modules, moe_layer=moe, expert_rows=rows, etp=par.etp, sequence_parallel=sp
        )
        hbm += module_extra_hbm_bytes(
            cfg,
            b,
            s,
            par.tp,
            modules,
            moe_layer=moe,
            sequence_parallel=sp,
            sp_regather=getattr(plan, "sp_regather", False),
            expert_rows=rows,
            etp=par.etp,
        )
    return flops, hbm


def _recompute_flops(cfg, b: int, seq: int, par, plan, n_layers: int) -> float:
    """Matmul FLOPs one chunk's recomputation runs again on one rank (`recompute.extra_forward_flops`, per layer
    for selective, per group of `recompute_num_layers` for full); the sequence is this rank's s / cp."""
    s = seq // par.cp
    if plan.options.recompute.granularity == "selective":
        return n_layers * extra_forward_flops(cfg, b, s, par.tp, "selective")
    k = plan.options.recompute.num_layers
    groups, rest = divmod(n_layers, k)
    if plan.options.recompute.method == "block":
        return min(k, n_layers) * extra_forward_flops(cfg, b, s, par.tp, "full", 1)
    total = groups * extra_forward_flops(cfg, b, s, par.tp, "full", k)
    return total + (extra_forward_flops(cfg, b, s, par.tp, "full", rest) if rest else 0)


__all__ = [
    "CostModel",
    "ETA_FP8",
    "Fp8Compute",
    "MicrobatchTime",
    "gemm_seconds",
    "layer_gemms",
    "microbatch_seconds",
    "rank_chunks",
    "stage_chunks",
    "gate_hbm_bytes",
    "storage_hbm_bytes",
]
