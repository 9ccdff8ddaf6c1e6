"""From bytes to seconds: the alpha-beta model the planner prices communication with, and each strategy's
crossover rule for a real model on real hardware.

A message of n bytes over a link costs

    alpha + n / beta

seconds: alpha the time before the first byte moves, beta the link's bandwidth per GPU and direction. The numbers
are the planner's own (`planner.Cluster`, `efficiency.CostModel`), so a chapter's seconds are the planner's:

    link     beta (per GPU, per direction)     source
    NVLink   450 GB/s  (Cluster.intra_node_bandwidth)   NVIDIA H100 SXM datasheet: NVLink 4, 900 GB/s both
                                                        directions together, 18 links of 50 GB/s
    IB       50 GB/s   (Cluster.inter_node_bandwidth)   NVIDIA DGX H100: one ConnectX-7 InfiniBand NDR NIC of
                                                        400 Gb/s per GPU
    alpha    20 us     (CostModel.latency)              NCCL's small-message latency inside a node, 10-30 us
                                                        (not fitted; the planner charges it per op of tp, cp,
                                                        ep and pp, and none on DP's large bucketed reductions)

and a GEMM of F floating-point operations takes F / (eta * peak): peak = Cluster.peak_flops (989 TFLOP/s, the
H100 SXM datasheet's dense BF16), eta = CostModel.eta (0.60, the planner's fit on published Megatron runs). Bytes come
from the strategies' own traffic formulas (`dp.traffic_per_step`, `tp.layer_traffic`, `pp.p2p_message_bytes`,
`cp.ring_kv_message_bytes`, `ep.expected_alltoall_bytes`), the GEMMs from the planner's list
(`efficiency.layer_gemms`), so no count is restated here. Each strategy's crossover, as the chapters state it:

    DP   dp_hiding_tokens    tokens per GPU whose backward hides the gradient all-reduce
         hsdp_hiding_tokens  tokens per GPU and micro-batch whose backward hides HSDP's (or ZeRO-3's) traffic
    TP   tp_crossover        the t from which a layer's all-reduces outlast its GEMMs
    SP   sp_crossover_tokens the tokens per micro-batch from which the elementwise seconds SP cuts by t pay for
                             its extra messages (`sp_layer_seconds`: the same bytes, so TP's crossover stands)
    PP   pp_microbatches_for the m that brings the bubble (p-1)/(v m) under a target
    CP   cp_hiding_tokens    the s/cp from which a ring step's K/V pass hides behind its attention;
         cp_forward_exposed_seconds   the ring's exposed forward against all-gather CP's
    EP   ep_crossover_ffn    the expert width below which the all-to-alls outlast the experts' GEMMs"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pylib.plan.heads import kv_heads_per_rank

from . import cp as cp_analysis
from . import dp as dp_analysis
from . import ep as ep_analysis
from . import pp as pp_analysis
from . import tp as tp_analysis
from .efficiency import gemm_seconds, layer_gemms
from .planner import Cluster
from .tp import dtype_bytes


@dataclass(frozen=True)
class Link:
    """One link of the alpha-beta model: `alpha` seconds per message, `beta` bytes/s per GPU and direction."""

    name: str
    alpha: float
    beta: float
    source: str

    def seconds(self, bytes_sent: float, messages: int = 1) -> float:
        """alpha per message plus bytes / beta."""
        return messages * self.alpha + bytes_sent / self.beta


def links(cluster: Cluster | None = None) -> dict[str, Link]:
    """The planner's two links (its defaults unless `cluster` is given): "nvlink" inside a node, "ib" between
    nodes, both with the cost model's latency as alpha."""
    c = cluster or Cluster(world_size=1)
    return {
        "nvlink": Link(
            "NVLink 4",
            c.model.latency,
            c.intra_node_bandwidth,
            "H100 SXM datasheet: 900 GB/s both directions, 450 GB/s each way",
        ),
        "ib": Link(
            "InfiniBand NDR",
            c.model.latency,
            c.inter_node_bandwidth,
            "DGX H100: one 400 Gb/s ConnectX-7 NIC per GPU = 50 GB/s each way",
        ),
    }


def compute_seconds(flops: float, cluster: Cluster | None = None) -> float:
    """flops / (eta * peak): a large GEMM's time on the planner's GPU."""
    c = cluster or Cluster(world_size=1)
    return flops / (c.model.eta * c.peak_flops)


def dense_layer_params(cfg) -> int:
    """Weight elements of one dense layer's GEMMs (QKV, output, MLP), from the planner's GEMM list."""
    return sum(n * k for _, n, k in layer_gemms(cfg, 1, 1, False))


# --- DP: the gradient reduction against the backward it hides behind -------------------------------------------


def dp_reduce_seconds(n_params: int, d: int, link: Link, grad_bytes: int = 2) -> float:
    """Seconds of DDP's ring all-reduce of every gradient: 2(d-1)/d * n_params * grad_bytes over beta (the planner
    counts DP's bytes only, no alpha: its reductions are few, large buckets)."""
    return link.seconds(dp_analysis.traffic_per_step(n_params * grad_bytes, d, "ddp"), messages=0)


def backward_seconds(n_params: int, tokens: float, cluster: Cluster | None = None) -> float:
    """The backward's GEMMs: 4 FLOPs per parameter per token (twice the forward's 2), at eta * peak."""
    return compute_seconds(4 * n_params * tokens, cluster)


def dp_hiding_tokens(d: int, link: Link, cluster: Cluster | None = None, grad_bytes: int = 2) -> float:
    """Tokens per GPU in the backward for the gradient all-reduce to hide behind it: reduce = backward gives
    T* = 2(d-1)/d * grad_bytes * eta * peak / (4 beta), independent of the model's size."""
    c = cluster or Cluster(world_size=1)
    return 2 * (d - 1) / d * grad_bytes * c.model.eta * c.peak_flops / (4 * link.beta)


def hsdp_hiding_tokens(
    r: int,
    s: int,
    shard_link: Link,
    replica_link: Link,
    cluster: Cluster | None = None,
    param_bytes: int = 2,
    grad_bytes: int = 2,
) -> float:
    """Tokens per GPU per micro-batch for HSDP's backward traffic to hide behind the backward: the parameters'
    all-gather and the gradients' reduce-scatter over the s ranks of the shard group, then the all-reduce of the
    1/s shard over the r replicas (`dp.hsdp_traffic_by_link`), against 4 FLOPs per parameter per token:

        T* = eta peak / 4 * [(param_bytes + grad_bytes)(s-1)/s / beta_shard + 2 grad_bytes (r-1)/(r s) / beta_replica]

    independent of the model's size. r = 1 with s = d over the inter-node link is ZeRO-3 across nodes (and the
    forward's all-gather, c(s-1)/s against 2 FLOPs, gives the same T* when param_bytes = grad_bytes)."""
    c = cluster or Cluster(world_size=1)
    shard = (param_bytes + grad_bytes) * (s - 1) / s / shard_link.beta
    replica = 2 * grad_bytes * (r - 1) / (r * s) / replica_link.beta
    return c.model.eta * c.peak_flops / 4 * (shard + replica)


# --- TP: a layer's collectives against its GEMMs ---------------------------------------------------------------


def tp_layer_seconds(cfg, b: int, s: int, t: int, link: Link, cluster: Cluster | None = None) -> dict[str, float]:
    """One dense layer, forward and backward, on one of t ranks: "comm", its four all-reduces (`tp.layer_traffic`,
    one alpha each), and "gemm", its GEMMs (`efficiency.layer_gemms` on the roofline, backward twice forward)."""
    c = cluster or Cluster(world_size=1)
    e = dtype_bytes(cfg.dtype)
    traffic = tp_analysis.layer_traffic(b, s, cfg.d_model, t, e)
    comm = link.seconds(traffic["forward_sent"] + traffic["backward_sent"], messages=4 if t > 1 else 0)
    fwd = sum(
        gemm_seconds(m, n, k, e, c.peak_flops, c.hbm_bandwidth, c.model.eta)
        for m, n, k in layer_gemms(cfg, b * s, t, False)
    )
    return {"comm": comm, "gemm": 3 * fwd}


def tp_crossover(cfg, link: Link, cluster: Cluster | None = None) -> float:
    """The t at which a layer's TP bytes take as long as its GEMMs (alpha and the roofline's memory bound left
    out): 4 * 2(t-1)/t * b s h e / beta = 3 * 2 b s P_L / (t eta peak) gives t* = 1 + 3 beta P_L / (4 h e eta peak),
    P_L the layer's GEMM weights (`dense_layer_params`); about 1 + 9 beta h / (e eta peak) when P_L = 12 h^2."""
    c = cluster or Cluster(world_size=1)
    e = dtype_bytes(cfg.dtype)
    return 1 + 3 * link.beta * dense_layer_params(cfg) / (4 * cfg.d_model * e * c.model.eta * c.peak_flops)


# --- SP: TP's bytes in other collectives, and the elementwise work it cuts ------------------------------------


def sp_layer_seconds(
    cfg, b: int, s: int, t: int, link: Link, cluster: Cluster | None = None, regather: bool = False
) -> dict[str, float]:
    """One dense layer, forward and backward, on one of t ranks, TP alone against TP + SP (`tp.layer_collectives`,
    one alpha per collective; the planner's elementwise term, `efficiency.microbatch_seconds`):

    "comm_tp", "comm_sp"   the collectives' seconds: TP's four all-reduces, SP's all-gathers and reduce-scatters
                           (the same bytes, twice the messages; `regather` adds the backward's two all-gathers)
    "elem_tp", "elem_sp"   the elementwise passes over [T, h] (LayerNorms, residual adds, dropout: c_rep of the
                           cost model's c_elem), forward and backward, which SP runs on T/t tokens
    "gemm"                 the layer's GEMMs, as `tp_layer_seconds` counts them (SP does not change them)"""
    c = cluster or Cluster(world_size=1)
    e = dtype_bytes(cfg.dtype)
    ops = {
        sp: tp_analysis.layer_collectives(b, s, cfg.d_model, t, e, sequence_parallel=sp, regather=regather and sp)
        for sp in (False, True)
    }
    comm = {sp: link.seconds(sum(x.bytes_sent for x in o), messages=len(o)) for sp, o in ops.items()}
    outside = 2 * e * b * s * cfg.d_model * c.model.c_rep / c.hbm_bandwidth  # forward and backward, one pass each
    return {
        "comm_tp": comm[False],
        "comm_sp": comm[True],
        "elem_tp": outside,
        "elem_sp": outside / t,
        "gemm": tp_layer_seconds(cfg, b, s, t, link, c)["gemm"],
    }


def sp_crossover_tokens(cfg, t: int, link: Link, cluster: Cluster | None = None) -> float:
    """The tokens per micro-batch (b s) from which SP is faster than TP alone (no regather): its four extra
    messages, 4 alpha, against the elementwise seconds it cuts, 2 c_rep e T h (1 - 1/t) / HBM bandwidth:
    T* = 2 alpha HBM / (c_rep e h (1 - 1/t)). The bytes on the wire are the same and do not enter."""
    c = cluster or Cluster(world_size=1)
    if t < 2:
        raise ValueError(f"t={t}: SP needs TP (t >= 2)")
    return 2 * link.alpha * c.hbm_bandwidth / (c.model.c_rep * dtype_bytes(cfg.dtype) * cfg.d_model * (1 - 1 / t))


# --- PP: the bubble against the number of microbatches ---------------------------------------------------------


def pp_stage_seconds(cfg, b: int, s: int, p: int, t: int = 1, cluster: Cluster | None = None) -> float:
    """One stage's GEMMs for one microbatch, forward and backward: L/p dense layers (`tp_layer_seconds`' "gemm")."""
    c = cluster or Cluster(world_size=1)
    per_layer = tp_layer_seconds(cfg, b, s, t, links(c)["nvlink"], c)["gemm"]
    return cfg.n_layers / p * per_layer


def pp_send_seconds(cfg, b: int, s: int, link: Link) -> float:
    """One boundary's send of one microbatch's activation, [b, s, h] (`pp.p2p_message_bytes`), one alpha."""
    return link.seconds(pp_analysis.p2p_message_bytes(b, s, cfg.d_model, dtype_bytes(cfg.dtype)))


def pp_microbatches_for(p: int, bubble: float, v: int = 1) -> int:
    """The fewest microbatches m with (p-1)/(v m) <= `bubble` (`pp.bubble_fraction`): m = ceil((p-1)/(v bubble))."""
    if not bubble > 0:
        raise ValueError(f"bubble={bubble!r} must be positive: a pipeline of p={p} stages always idles")
    m = max(1, math.ceil((p - 1) / (v * bubble)))
    while pp_analysis.bubble_fraction(p, m, v) > bubble:  # ceil of a float quotient can fall one short
        m += 1
    return m


# --- CP (ring): a step's K/V pass against the attention it hides behind -----------------------------------------


def _cp_heads(cfg, t: int) -> tuple[int, int]:
    """(query heads, K/V heads) on one of t TP ranks (`heads.kv_heads_per_rank`)."""
    return cfg.n_heads // t, kv_heads_per_rank(cfg.n_heads, cfg.kv_heads, t)[0]


def cp_ring_step_seconds(cfg, b: int, s: int, cp: int, link: Link, cluster: Cluster | None = None, t: int = 1) -> dict:
    """One forward ring step on one rank, its heads those of one of t TP ranks: "comm", passing on one K/V block
    (`cp.ring_kv_message_bytes`, one alpha), and "core", the attention of its x = s/cp queries against one block of
    x keys, 4 b n_head x^2 d_head FLOPs, half of it when causal (the zig-zag layout's steps past the first), at
    eta * peak, as the planner's core."""
    x, (heads, kv) = s // cp, _cp_heads(cfg, t)
    comm = link.seconds(cp_analysis.ring_kv_message_bytes(b, s, kv, cfg.d_head, cp, dtype_bytes(cfg.dtype)))
    causal = 0.5 if cfg.causal else 1.0
    return {"comm": comm, "core": compute_seconds(4 * b * heads * x * x * cfg.d_head * causal, cluster)}


def cp_hiding_tokens(cfg, link: Link, cluster: Cluster | None = None, t: int = 1) -> float:
    """The x = s/cp from which a ring step's K/V bytes hide behind its causal core: 2 n_kv d e x / beta =
    2 n_head d x^2 / (eta peak) gives x* = n_kv e eta peak / (n_head beta), heads per TP rank. As in the planner
    (`planner.exposed_seconds`), the step's alpha is paid whether or not the bytes hide: it is not in x*."""
    c = cluster or Cluster(world_size=1)
    heads, kv = _cp_heads(cfg, t)
    return kv * dtype_bytes(cfg.dtype) * c.model.eta * c.peak_flops / (heads * link.beta)


def cp_forward_exposed_seconds(
    cfg, b: int, s: int, cp: int, link: Link, cluster: Cluster | None = None, t: int = 1
) -> dict[str, float]:
    """One layer's causal forward on one rank of a zig-zag CP group, heads those of one of t TP ranks, the CP
    communication left exposed: "ring", cp - 1 steps each paying alpha and the part of its K/V pass, M bytes, that
    its half-block core does not hide (`cp_ring_step_seconds`); "allgather", all-gather CP's gather of the same
    cp - 1 messages (`cp.allgather_traffic`), one collective, so one alpha as the planner charges it, exposed whole
    since attention needs every key first: alpha + (cp - 1) M / beta; "core", the rank's causal attention,
    4 b n_head d_head (s/cp) s/2 FLOPs at eta * peak. Where the ring hides its bytes the all-gather exposes
    (cp - 1) M / beta - (cp - 2) alpha more: it wins only on messages shorter than about alpha."""
    heads, kv = _cp_heads(cfg, t)
    step = cp_ring_step_seconds(cfg, b, s, cp, link, cluster, t)
    ring = (cp - 1) * (link.alpha + max(0.0, step["comm"] - link.alpha - step["core"]))
    sent = cp_analysis.allgather_traffic(b, s, kv, cfg.d_head, cp, dtype_bytes(cfg.dtype))["forward_bytes_sent"]
    core = compute_seconds(4 * b * heads * cfg.d_head * (s // cp) * s / 2, cluster)
    return {"ring": ring, "allgather": link.seconds(sent), "core": core}


# --- EP: the all-to-alls against the experts' GEMMs ------------------------------------------------------------


def ep_layer_seconds(cfg, tokens: int, ep: int, link: Link, cluster: Cluster | None = None) -> dict[str, float]:
    """One MoE layer on one of ep ranks holding `tokens` tokens, forward and backward, routing uniform: "comm", its
    four all-to-alls (dispatch and combine, forward and backward; `ep.expected_alltoall_bytes`, one alpha each),
    and "gemm", its experts' GEMMs (T k routed rows through (m_in + 1) h h_ffn weights, m_in = 2 for SwiGLU;
    backward twice forward), compute-bound."""
    moe, e = cfg.moe, dtype_bytes(cfg.dtype)
    sent = ep_analysis.expected_alltoall_bytes(tokens, moe.top_k, cfg.d_model, ep, e)
    comm = link.seconds(4 * sent, messages=4 if ep > 1 else 0)
    weights = (3 if cfg.mlp == "swiglu" else 2) * cfg.d_model * (moe.d_ff or cfg.d_ff)
    return {"comm": comm, "gemm": compute_seconds(3 * 2 * tokens * moe.top_k * weights, cluster)}


def ep_crossover_ffn(cfg, ep: int, link: Link, cluster: Cluster | None = None) -> float:
    """The expert width h_ffn below which a layer's all-to-all bytes outlast its experts' GEMMs (alpha left out):
    4 T k (ep-1)/ep h e / beta = 3 * 2 T k (m_in + 1) h h_ffn / (eta peak) gives
    h_ffn* = 2 (ep-1)/ep * e eta peak / (3 (m_in + 1) beta): independent of T, k and h."""
    c = cluster or Cluster(world_size=1)
    m_in = 2 if cfg.mlp == "swiglu" else 1
    return 2 * (ep - 1) / ep * dtype_bytes(cfg.dtype) * c.model.eta * c.peak_flops / (3 * (m_in + 1) * link.beta)
