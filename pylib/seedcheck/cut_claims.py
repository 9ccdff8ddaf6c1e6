"""Article B's cut tables (tbl-mat-weight-cut, tbl-mat-act-cut) as data: per tensor and mode, its words and the claim
they make in checkable form, with the English the book prints for the words.
"""

from __future__ import annotations

from pylib import i18n

# Article B's words in its cut tables, in English (the tables print these; the Chinese stays in the data).
SEED_WORDS = {
    "切 V 或 h (vocab parallel / TP)": "cut V or h (vocab parallel / TP)",
    "切 V 或 h": "cut V or h",
    "不切": "not cut",
    "完整副本": "full replica",
    "完整副本 (轻量)": "full replica (light)",
    "在 stage 0": "on stage 0",
    "在 stage L-1": "on stage L-1",
    "列切，按 head 维": "column split, by head",
    "行切": "row split",
    "列切": "column split",
    "按层归属 stage": "to the stage of its layer",
    "不切 (dense FFN)": "not cut (dense FFN)",
    "(可选) 切 h_ffn，称 moe_tp": "(optional) cut h_ffn: moe_tp",
    "切 E，不同 expert 在不同卡": "cut E: experts on different ranks",
    "切 h → [b, s, h/N_TP]": "cut h → [b, s, h/N_TP]",
    "切 s → [b, s/N_TP, h] (TP 不需完整 s 的区段)": "cut s → [b, s/N_TP, h] (where TP needs no whole s)",
    "切 s → [b, s/N_CP, h]": "cut s → [b, s/N_CP, h]",
    "切 b → [b/N_DP, s, h]": "cut b → [b/N_DP, s, h]",
    "不切，在某个 stage 上": "not cut, on one stage",
    "切 n_head → 每卡 n_h/N_TP 个 head": "cut n_head → n_head/N_TP heads per rank",
    "(与 input hidden 同 s)": "(the same s as the input hidden)",
    "切 s → 每卡 s/N_CP 个 token": "cut s → s/N_CP tokens per rank",
    "切 b": "cut b",
    "切 n_kv_head": "cut n_kv_head",
    "(同上)": "(as above)",
    "切 s, attention 时需跨卡看全部 KV": "cut s; attention needs every rank's K/V",
    "切 n_head": "cut n_head",
    "不出现完整 (TP 内独立算)": "never whole (computed within TP)",
    "不显式持有 (Ring 增量算)": "not held explicitly (the ring computes it step by step)",
    "切 h_ffn → 每卡 h_ffn/N_TP": "cut h_ffn → h_ffn/N_TP per rank",
    "切 s (TP 协同)": "cut s (with TP)",
    "切 s": "cut s",
    "(MoE) 不同 token 在不同 expert 卡": "(MoE) different tokens on different experts' ranks",
    "(可选) vocab parallel 切 V": "(optional) vocab parallel: cut V",
}


def seed_words(seed: str) -> str:
    """Article B's words as a table shows them: article B wrote Chinese, so the Chinese edition shows its own words and
    the English edition their English (SEED_WORDS)."""
    return seed if i18n.language() == "zh" else SEED_WORDS[seed]


# Article B's tbl-mat-weight-cut, cell by cell: (its words, the claim they make in checkable form). Claims:
# a shape in article B's symbols and orientation with N the column's degree ("|" between alternatives); "full":
# every rank holds it whole; "as TP": what TP alone holds (SP adds no cut); "stage 0" / "stage L-1": held whole
# by that pipeline stage only; "by layer": whole on the stage that holds its layer, absent elsewhere;
# "experts/N": a rank holds E/N of the experts, each whole.
SEED_WEIGHT_CUT = {
    "token embedding": {
        "TP": ("切 V 或 h (vocab parallel / TP)", "[V/N, h] | [V, h/N]"),
        "SP": ("不切", "as TP"),
        "CP": ("不切", "full"),
        "DP": ("完整副本", "full"),
        "PP": ("在 stage 0", "stage 0"),
        "EP": ("不切", "full"),
    },
    "LM head": {
        "TP": ("切 V 或 h", "[h, V/N] | [h/N, V]"),
        "SP": ("不切", "as TP"),
        "CP": ("不切", "full"),
        "DP": ("完整副本", "full"),
        "PP": ("在 stage L-1", "stage L-1"),
        "EP": ("不切", "full"),
    },
    "W_Q": {
        "TP": ("列切，按 head 维", "[h, h/N]"),
        "SP": ("不切", "as TP"),
        "CP": ("不切", "full"),
        "DP": ("完整副本", "full"),
        "PP": ("按层归属 stage", "by layer"),
        "EP": ("不切", "full"),
    },
    "W_K, W_V": {
        "TP": ("列切，按 head 维", "[h, h_kv/N]"),
        "SP": ("不切", "as TP"),
        "CP": ("不切", "full"),
        "DP": ("完整副本", "full"),
        "PP": ("按层归属 stage", "by layer"),
        "EP": ("不切", "full"),
    },
    "W_O": {
        "TP": ("行切", "[h/N, h]"),
        "SP": ("不切", "as TP"),
        "CP": ("不切", "full"),
        "DP": ("完整副本", "full"),
        "PP": ("按层归属 stage", "by layer"),
        "EP": ("不切", "full"),
    },
    "W_up": {
        "TP": ("列切", "[h, h_ffn/N]"),
        "SP": ("不切", "as TP"),
        "CP": ("不切", "full"),
        "DP": ("完整副本", "full"),
        "PP": ("按层归属 stage", "by layer"),
        "EP": ("不切 (dense FFN)", "full"),
    },
    "W_down": {
        "TP": ("行切", "[h_ffn/N, h]"),
        "SP": ("不切", "as TP"),
        "CP": ("不切", "full"),
        "DP": ("完整副本", "full"),
        "PP": ("按层归属 stage", "by layer"),
        "EP": ("不切 (dense FFN)", "full"),
    },
    "MoE expert W_1, W_2": {
        "TP": ("(可选) 切 h_ffn，称 moe_tp", "[h, h_ffn_e/N] & [h_ffn_e/N, h]"),
        "SP": ("不切", "as TP"),
        "CP": ("不切", "full"),
        "DP": ("完整副本", "full"),
        "PP": ("按层归属 stage", "by layer"),
        "EP": ("切 E，不同 expert 在不同卡", "experts/N"),
    },
    "LayerNorm γ": {
        "TP": ("完整副本 (轻量)", "full"),
        "SP": ("不切", "full"),
        "CP": ("不切", "full"),
        "DP": ("完整副本", "full"),
        "PP": ("按层归属 stage", "by layer"),
        "EP": ("不切", "full"),
    },
}


# The probe model's parameters standing for each row (first layer, or first MoE layer for the experts).
WEIGHT_PARAMS = {
    "token embedding": ["embed.weight"],
    "LM head": ["lm_head.weight"],
    "W_Q": ["layers.0.attn.q_proj.weight"],
    "W_K, W_V": ["layers.0.attn.k_proj.weight", "layers.0.attn.v_proj.weight"],
    "W_O": ["layers.0.attn.o_proj.weight"],
    "W_up": ["layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight"],
    "W_down": ["layers.0.mlp.down_proj.weight"],
    "MoE expert W_1, W_2": ["layers.1.mlp.experts.{e}.up_proj.weight", "layers.1.mlp.experts.{e}.down_proj.weight"],
    "LayerNorm γ": ["layers.0.ln1.weight"],
}


WEIGHT_SYMBOLS = {
    "embed.weight": "[V, h]",
    "lm_head.weight": "[h, V]",
    "q_proj": "[h, h]",
    "k_proj": "[h, h_kv]",
    "v_proj": "[h, h_kv]",
    "o_proj": "[h, h]",
    "gate_proj": "[h, h_ffn]",
    "up_proj": "[h, h_ffn]",
    "down_proj": "[h_ffn, h]",
    "ln1": "[h]",
}


# Article B's tbl-mat-act-cut: (its words, the claim). Claims as above, plus "stage full": whole on the stage that
# holds the layer; "blocks": the rank never holds [.., s/N, s] (only blocks); "routed": tokens go to experts.
SEED_ACT_CUT = {
    "input hidden": {
        "TP": ("切 h → [b, s, h/N_TP]", "[b, s, h/N]"),
        "SP": ("切 s → [b, s/N_TP, h] (TP 不需完整 s 的区段)", "[b, s/N, h]"),
        "CP": ("切 s → [b, s/N_CP, h]", "[b, s/N, h]"),
        "DP": ("切 b → [b/N_DP, s, h]", "[b/N, s, h]"),
        "PP": ("不切，在某个 stage 上", "stage full"),
        "EP": ("不切", "full"),
    },
    "Q": {
        "TP": ("切 n_head → 每卡 n_h/N_TP 个 head", "[b, n_head/N, s, d_head]"),
        "SP": ("(与 input hidden 同 s)", "[b, n_head/N, s/N, d_head]"),
        "CP": ("切 s → 每卡 s/N_CP 个 token", "[b, n_head, s/N, d_head]"),
        "DP": ("切 b", "[b/N, n_head, s, d_head]"),
        "PP": ("不切", "stage full"),
        "EP": ("不切", "full"),
    },
    "K, V": {
        "TP": ("切 n_kv_head", "[b, n_kv_head/N, s, d_head]"),
        "SP": ("(同上)", "[b, n_kv_head/N, s/N, d_head]"),
        "CP": ("切 s, attention 时需跨卡看全部 KV", "[b, n_kv_head, s/N, d_head]"),
        "DP": ("切 b", "[b/N, n_kv_head, s, d_head]"),
        "PP": ("不切", "stage full"),
        "EP": ("不切", "full"),
    },
    "attention scores": {
        "TP": ("切 n_head", "[b, n_head/N, s, s]"),
        "SP": ("不出现完整 (TP 内独立算)", "as TP"),
        "CP": ("不显式持有 (Ring 增量算)", "blocks"),
        "DP": ("切 b", "[b/N, n_head, s, s]"),
        "PP": ("不切", "stage full"),
        "EP": ("不切", "full"),
    },
    "FFN intermediate": {
        "TP": ("切 h_ffn → 每卡 h_ffn/N_TP", "[b, s, h_ffn/N]"),
        "SP": ("切 s (TP 协同)", "[b, s/N, h_ffn/N]"),
        "CP": ("切 s", "[b, s/N, h_ffn]"),
        "DP": ("切 b", "[b/N, s, h_ffn]"),
        "PP": ("不切", "stage full"),
        "EP": ("(MoE) 不同 token 在不同 expert 卡", "routed"),
    },
    "logits": {
        "TP": ("(可选) vocab parallel 切 V", "[b, s, V/N]"),
        "SP": ("不切", "as TP"),
        "CP": ("切 s", "[b, s/N, V]"),
        "DP": ("切 b", "[b/N, s, V]"),
        "PP": ("在 stage L-1", "stage L-1"),
        "EP": ("不切", "full"),
    },
}


ACT_SYMBOLS = {
    "input hidden": "[b, s, h]",
    "Q": "[b, n_head, s, d_head]",
    "K, V": "[b, n_kv_head, s, d_head]",
    "attention scores": "[b, n_head, s, s]",
    "FFN intermediate": "[b, s, h_ffn]",
    "logits": "[b, s, V]",
}
