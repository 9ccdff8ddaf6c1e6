"""Article A's selection guide (section 8) with the number behind each remedy, at real model sizes.

    g = selection_guide()        # SelectionGuide: .n (every number, by name), .rows (the table), .table()

Sizes: a 70B-class dense model (Llama-2-70B's shapes, `pylib.plan.presets.llama2_70b`), bf16, one sequence per
microbatch; for the EP row a DeepSeek-V3-like MoE layer (256 experts of h_ffn = 2048 on h = 7168, top-8, 58 MoE
layers). Every number comes from `pylib.analysis`, whose formulas the tests check byte for byte against real runs.
Bytes are per GPU unless a name says otherwise; `GB` and `MB` are decimal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pylib.analysis import cp as cpa
from pylib.analysis import dp as dpa
from pylib.analysis import ep as epa
from pylib.analysis import pp as ppa
from pylib.analysis import tp as tpa
from pylib.i18n import tr
from pylib.model import build_model
from pylib.plan.presets import llama2_70b

GB, MB = 1e9, 1e6
GPU_BYTES = 80 * GB  # one GPU's memory, the bar every "does not fit" is measured against


@dataclass
class SelectionGuide:
    n: dict = field(default_factory=dict)  # name -> number
    rows: list = field(default_factory=list)  # [symptom, remedy, the number behind it, computed with]

    def table(self) -> str:
        """The labelled MyST table `tbl-selection-guide` (`pylib.seedcheck.seed_a_tables.selection_guide_table`)."""
        from pylib.seedcheck.seed_a_tables import selection_guide_table

        return selection_guide_table(self.rows)


def _activations(dense, s: int, t: int, sp: bool, cp: int = 1) -> tuple[int, int]:
    """(bytes one GPU saves for backward per layer except the s x s scores, the scores alone); CP: s/cp tokens."""
    rows = tpa.compare_with_korthikanti(dense, 1, s // cp, t, sequence_parallel=sp, regather=sp)
    scores = sum(r.ours_bytes for r in rows if r.item in ("softmax output", "causal mask"))
    return sum(r.ours_bytes for r in rows) - scores, scores


def selection_guide() -> SelectionGuide:
    """Every number of the guide (see the module docstring), by name, and the table's rows."""
    dense = llama2_70b()
    L = dense.n_layers
    with torch.device("meta"):  # the reference model's own parameters, shapes only
        one = build_model(dense.with_(n_layers=1))
    layer_params = sum(p.numel() for p in one.layers[0].parameters())
    n_params = sum(p.numel() for p in one.parameters()) + (L - 1) * layer_params
    g = SelectionGuide()
    n = g.n
    n.update(layers=L, n_params=n_params)
    why_sp, why_cp = _dense_rows(n, dense)
    why_ep, why_pp, why_dp = _moe_pp_dp_rows(n, dense)
    g.rows = _rows(why_sp, why_cp, why_ep, why_pp, why_dp)
    return g


def _dense_rows(n: dict, dense) -> tuple[str, str]:
    """Rows 1 (SP) and 2 (CP) of the guide, and the bounded-traffic numbers of TP and the CP ring; fills `n`."""
    L, h, e = dense.n_layers, dense.d_model, 2

    # 1. TP at 8 and activations still tight: SP.
    s = 4096
    n["sp_act_tp"] = L * _activations(dense, s, 8, False)[0]
    n["sp_act_sp"] = L * _activations(dense, s, 8, True)[0]
    n["sp_green_tp"] = tpa.green_zone_bytes(dense, 1, s, 8)
    n["sp_green_sp"] = tpa.green_zone_bytes(dense, 1, s, 8, sequence_parallel=True)
    n["sp_fwd_tp"] = tpa.layer_traffic(1, s, h, 8, e)["forward_sent"]
    n["sp_fwd_sp"] = tpa.layer_traffic(1, s, h, 8, e, sequence_parallel=True)["forward_sent"]
    why_sp = tr(
        "s = 4K, TP = 8: {act_tp:.1f} GB of activations per GPU over {L} layers; with SP {act_sp:.1f} GB. "
        "LayerNorm's share drops to 1/8 ({green_tp:.0f} → {green_sp:.1f} MB per layer); traffic stays {fwd:.0f} MB "
        "per layer.",
        act_tp=n["sp_act_tp"] / GB,
        L=L,
        act_sp=n["sp_act_sp"] / GB,
        green_tp=n["sp_green_tp"] / MB,
        green_sp=n["sp_green_sp"] / MB,
        fwd=n["sp_fwd_tp"] / MB,
    )

    # 2. The context is too long for one GPU's attention: CP.
    s = 128 * 1024
    rest, n["cp_scores"] = _activations(dense, s, 8, True)
    n["cp_rest"] = L * rest
    n["cp_rest_cp8"] = L * _activations(dense, s, 8, True, cp=8)[0]
    work = {lay: cpa.causal_work_per_rank(s, 8, lay) for lay in ("contiguous", "zigzag")}
    n["cp_balance_contiguous"] = cpa.balance_ratio(work["contiguous"])
    n["cp_balance_zigzag"] = cpa.balance_ratio(work["zigzag"])
    n["cp_ring"] = cpa.ring_traffic(1, s, dense.kv_heads, dense.d_head, 8, e)["forward_bytes_sent"]
    n["cp_flops"] = cpa.attention_flops(work["zigzag"][0] * dense.n_heads, dense.d_head)
    why_cp = tr(
        "s = 128K, TP = 8 + SP: the attention scores alone {scores:.0f} GB per layer per GPU; the rest {rest:.0f} GB "
        "over {L} layers. CP = 8: {rest_cp8:.0f} GB, 1/8 of the attention work each (zig-zag: equal; contiguous: "
        "{apart:.0f}× apart); the ring moves {ring:.0f} MB of K/V per GPU per layer against {tflop:.0f} TFLOP.",
        scores=n["cp_scores"] / GB,
        rest=n["cp_rest"] / GB,
        L=L,
        rest_cp8=n["cp_rest_cp8"] / GB,
        apart=n["cp_balance_contiguous"],
        ring=n["cp_ring"] / MB,
        tflop=n["cp_flops"] / 1e12,
    )
    # Bounded per-GPU bytes are not DP's alone: TP's all-reduces and the CP ring are bounded the same way.
    for t in (8, 64):
        n[f"tp_layer_{t}"] = sum(tpa.layer_traffic(1, 4096, h, t, e)[f"{ph}_sent"] for ph in ("forward", "backward"))
    n["tp_bound"] = 4 * 2 * 4096 * h * e  # 4 all-reduces of [b, s, h] per layer, each < 2 S per rank
    for c in (8, 64):
        n[f"cp_ring_{c}"] = cpa.ring_traffic(1, s, dense.kv_heads, dense.d_head, c, e)["forward_bytes_sent"]
    n["cp_bound"] = 2 * s * dense.kv_heads * dense.d_head * e  # the sequence's whole K and V
    return why_sp, why_cp


def _moe_pp_dp_rows(n: dict, dense) -> tuple[str, str, str]:
    """Rows 3 (EP), 4 (PP) and 5 (DP) of the guide; fills `n`."""
    L, h, e, n_params = dense.n_layers, dense.d_model, 2, n["n_params"]

    # 3. An MoE whose experts must be spread over GPUs: EP.
    E, ffe, he, k, moe_layers = 256, 2048, 7168, 8, 58
    n["ep_all"] = epa.expert_params_per_rank(he, ffe, E, 1, mlp="swiglu") * moe_layers * e
    n["ep_64"] = epa.expert_params_per_rank(he, ffe, E, 64, mlp="swiglu") * moe_layers * e
    n["ep_a2a"] = epa.expected_alltoall_bytes(4096, k, he, 64, e)
    why_ep = tr(
        "256 experts × 58 layers: {all:,.0f} GB of expert weights in bf16; EP = 64: {ep64:.1f} GB per GPU, for "
        "{a2a:.2f} GB per GPU per layer each way in the all-to-all (4K tokens, top-8).",
        all=n["ep_all"] / GB,
        ep64=n["ep_64"] / GB,
        a2a=n["ep_a2a"] / GB,
    )

    # 4. Many layers, cut across machines: PP.
    n["pp_state_tp8"] = sum(dpa.paper_bytes(n_params // 8, 1, "ddp").values())  # mixed-precision Adam
    n["pp_state_pp4"] = sum(dpa.paper_bytes(n_params // 32, 1, "ddp").values())
    n["pp_boundary"] = ppa.p2p_message_bytes(1, 4096, h, e)  # one microbatch across one stage boundary
    n["tp_layer"] = sum(tpa.layer_traffic(1, 4096, h, 8, e)[f"{ph}_sent"] for ph in ("forward", "backward"))
    n["tp_stage"] = n["tp_layer"] * L // 4  # TP's traffic for one stage's 20 layers, per microbatch
    n["pp_bubble"] = ppa.bubble_share(4, 32)
    why_pp = tr(
        "{billions:.0f}B parameters, mixed-precision Adam: {tp8:.0f} GB of model state per GPU at TP = 8; PP = 4: "
        "{pp4:.0f} GB. A stage boundary carries {boundary:.0f} MB per microbatch each way, TP {tp_layer:.0f} MB per "
        "layer; the price is the bubble, {bubble:.0%} of a step with 32 microbatches.",
        billions=n_params / 1e9,
        tp8=n["pp_state_tp8"] / GB,
        pp4=n["pp_state_pp4"] / GB,
        boundary=n["pp_boundary"] / MB,
        tp_layer=n["tp_layer"] / MB,
        bubble=n["pp_bubble"],
    )

    # 5. Everything fits and throughput must still grow: stack them, add DP.
    shard = 2 * n_params // 32  # bf16 gradients of one TP = 8 x PP = 4 shard
    n["dp_shard"] = shard
    for d in (8, 64, 1024):
        n[f"dp_{d}"] = dpa.traffic_per_step(shard, d, "ddp")
    n["dp_zero1"] = sum(dpa.paper_bytes(n_params // 32, 64, "zero1").values())
    why_dp = tr(
        "the gradient all-reduce costs each GPU 2(d−1)/d of its shard's gradients per step: {dp8:.2f} GB at d = 8, "
        "{dp1024:.2f} GB at d = 1024, and it overlaps with backward; ZeRO-1 over d = 64 cuts model state from "
        "{pp4:.0f} to {zero1:.1f} GB.",
        dp8=n["dp_8"] / GB,
        dp1024=n["dp_1024"] / GB,
        pp4=n["pp_state_pp4"] / GB,
        zero1=n["dp_zero1"] / GB,
    )
    return why_ep, why_pp, why_dp


def _rows(why_sp: str, why_cp: str, why_ep: str, why_pp: str, why_dp: str) -> list[list[str]]:
    return [
        [
            tr("TP is at its maximum (8 GPUs, one NVLink domain) and activation memory is still tight"),
            "TP + SP",
            why_sp,
            "`tp.compare_with_korthikanti`, `tp.green_zone_bytes`, `tp.layer_traffic`",
        ],
        [
            tr("the context is too long for one GPU to hold attention (32K or 128K training, long prefill)"),
            tr("add CP (ring attention)"),
            why_cp,
            "`cp.causal_work_per_rank`, `cp.ring_traffic`, `cp.attention_flops`",
        ],
        [
            tr("the model is an MoE and its experts must be spread over GPUs"),
            tr("add EP (all-to-all)"),
            why_ep,
            "`ep.expert_params_per_rank`, `ep.expected_alltoall_bytes`",
        ],
        [
            tr("many layers, to be cut across machines"),
            tr("add PP"),
            why_pp,
            "`dp.paper_bytes`, `pp.p2p_message_bytes`",
        ],
        [
            tr("none of it is enough and throughput must go up"),
            tr("stack the above, add DP (article A: DeepSeek-V3 with CP, EP and TP)"),
            why_dp,
            "`dp.traffic_per_step`, `dp.paper_bytes`",
        ],
    ]
