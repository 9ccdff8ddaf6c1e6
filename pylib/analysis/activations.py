"""What a rank of the composed model keeps for backward: saved-activation bytes per layer, per pipeline chunk and at
the peak of the schedule, as pure functions of sizes.

The layer is `pylib.tp.TPBlock` (what `pylib.compose` runs), so the dense rows are `tp.compare_with_korthikanti`'s,
which the TP tests measure byte for byte. Three things change them inside the composed model:

  attention core   CP replaces the core rows of that table (Q and K, V, the softmax output, the causal mask):
                   ring attention keeps q, out, k, v and the rows' LSE at s/cp tokens (`cp.ring_attention_saved_bytes`,
                   no score matrix); Ulysses keeps the same tensors head-split at the whole s, plus two [s] int64
                   index vectors that put the zig-zag rows in token order for the causal kernel; all-gather CP
                   keeps q, out and the LSE at s/cp and the gathered K and V at the whole s
                   (`cp.allgather_saved_bytes`). attention="flash"
                   asks the same of a fused kernel without CP (FlashAttention keeps exactly q, k, v, out and the LSE);
                   attention="math" keeps pylib's unfused core, which saves the [b, n_head/tp, s, s] probabilities.
  MoE layer        the MLP rows give way to the MoE layer's (`moe_saved_rows`): the router's input and scores, the
                   chosen experts, the permutation indices, the R rows this rank's experts receive, their hidden
                   activations, and the weighted combine. R depends on the routing: the expected value with uniform
                   routing and no dropping is T k etp (T = the rank's tokens); pass the measured R to be exact.
  recomputation    recompute="selective" replaces the attention core's rows by its inputs q, k, v (whatever the core:
                   `recompute.core_input_bytes`); with Megatron's `recompute_modules` (`pylib.plan.recompute`) that
                   is "core_attn", and "layernorm", "mlp", "moe_act" drop the rows `recompute.module_dropped_rows`
                   names; recompute="full" keeps, for each group of layers
                   `pylib.plan.recompute.Recompute.groups` names within a chunk, only the group's input
                   [b, s/cp, h] ([b, s/(cp tp), h] under SP), and the other layers' rows as they are
  Megatron's SP    sp_regather=True: the QKV and MLP inputs (and the LM head's) are kept as the s/(cp tp) shard and
                   all-gathered again in backward (`tp.compare_with_korthikanti(regather=True)`); pylib.tp keeps
                   them gathered (the default, which the tests measure)
  FP8 linears      with an `Fp8Recipe` (`planner.Workload.fp8`) a linear keeps no 16-bit input: `pylib.model.fp8`'s
                   `Fp8Linear` keeps X^T in E4M3 (1 byte an element) with its decode scales along the tokens
                   (`fp8_saved_input_bytes`), and nothing else (its FP8 weight copy is the memory's "fp8"). So the
                   rows that are a linear's input alone (QKV, W_O and MLP inputs, the down projection's input inside
                   "MLP hidden", the experts' input rows and hidden) turn FP8 (`fp8_rows`); a tensor another op also
                   saves (the router's input, SwiGLU's factors) stays 16-bit. pylib's reference layer runs q, k, v
                   and gate, up as separate linears, each keeping its own FP8 copy of the shared input
                   (fused=False, what the tests measure); Transformer Engine's fused linear_qkv and fc1 keep one
                   (fused=True: the GEMMs `efficiency.layer_gemms` lists, what the planner prices). The LM head and,
                   with first_last_layers_bf16, the first and last layers stay 16-bit.
  DeepSeek-V3's    `Workload.storage` (`STORAGE`; the technical report, arXiv 2412.19437, section 3.3.3), applied by
  storage          `storage_rows` after the FP8 rows: "swiglu_fp8" (with an FP8 recipe) keeps of every expert MLP,
                   routed and shared, only the SwiGLU's two inputs gate x, up x as FP8 copies of fc1's output, X^T
                   along the tokens with the recipe's scales (`swiglu_cached_bytes`), and rebuilds the SwiGLU output
                   in backward (`pylib.model.v3_storage.cached_swiglu_mlp`); "attn_out_e5m6" keeps W_O's input in
                   E5M6, 1.5 bytes an element and one int8 exponent per 1 x 128 tile (`e5m6_saved_bytes`,
                   `pylib.model.v3_storage.E5M6Linear`), in place of its 16-bit or FP8 copy (the report shares that
                   copy with the attention core's backward; the flash core's own saved output is still counted);
                   "fused_unpermute" keeps the expert outputs once, not beside their weighted copy
                   (`pylib.ep.permute.unpermute(fused=True)`). One more, ours, not the report's: "gate_in_expert"
                   applies each combine weight inside its expert, before the down projection, and reads the
                   weight's gradient off the down projection's input gradient, <dy W_down, h>
                   (`pylib.model.v3_storage.gated_expert`): the expert outputs and the combine weights at home
                   are not kept, the R weights at the experts are (it overrides "fused_unpermute"; the
                   all-to-all dispatcher's rows; the all-gather dispatcher does not run it).
  the stage ends   the first virtual stage keeps the token ids and the vocab-parallel embedding's mask; the last keeps
                   the final LayerNorm's input and statistics, the LM head's input, one [b, s/cp, V/tp] logits tensor
                   and the targets with their mask (`stage_end_rows`).

Sizes: b sequences of one microbatch on this rank (B / (dp m)), s the whole sequence, each rank s/cp of it; with
sequence parallelism the tokens outside the TP region are s/(cp tp). e = bytes per element of cfg.dtype; token ids
and indices are int64 (8 bytes), masks bool (1 byte).

`peak_saved_bytes` replays a rank's forward/backward order (`pylib.plan.schedules.compute_order`) over the bytes of each
chunk: the most held at once, which `pylib.compose` measures with its saved-tensor probe (tests/test_analysis_planner.py
compares every number here with those measurements).
"""

from __future__ import annotations

import functools
from dataclasses import replace
from operator import ge, mul

from pylib.plan.heads import kv_heads_per_rank
from pylib.plan.options import SEQUENCE_PARALLEL
from pylib.plan.recompute import check_recompute, modules_problems
from pylib.plan.recompute import recompute_modules as recompute_modules_of
from pylib.plan.schedules import check_schedule, interleaved_table, warmup_forwards
from pylib.plan.split import chunk_layers

from . import cp as cp_analysis
from . import recompute as recompute_analysis
from . import tp as tp_analysis
from .tp import dtype_bytes

FP32 = 4

ATTENTION_KERNELS = ("flash", "math")
CORE_ROWS = ("Q and K", "V", "softmax output", "causal mask")
MLP_ROWS = ("MLP input (LN2 output)", "MLP hidden")
INT64, BOOL = 8, 1
STORAGE = ("swiglu_fp8", "attn_out_e5m6", "fused_unpermute", "gate_in_expert")  # storage choices (`storage_rows`)
E5M6_TILE = 128  # one int8 power-of-two exponent per 1 x 128 tile (`pylib.model.v3_storage.quantize_e5m6`)


def attention_core_bytes(
    cfg,
    b: int,
    s: int,
    *,
    tp: int,
    cp: int,
    cp_kind: str,
    attention: str,
    layout: str,
) -> int:
    """Bytes the attention core of one layer keeps on one rank (see the module docstring): cp_kind and layout are a
    `RunOptions`' cp_kind and cp_layout."""
    if attention not in ATTENTION_KERNELS:
        raise ValueError(f"attention={attention!r} must be one of {ATTENTION_KERNELS}")
    e = dtype_bytes(cfg.dtype)
    heads, (kv, _) = cfg.n_heads // tp, kv_heads_per_rank(cfg.n_heads, cfg.kv_heads, tp)
    if cp > 1 and cp_kind == "ulysses":
        index = 2 * s * INT64 if cfg.causal and layout == "zigzag" else 0
        return cp_analysis.ring_attention_saved_bytes(b, s, heads // cp, kv // cp, cfg.d_head, 1, e) + index
    if cp > 1 and cp_kind == "allgather":  # the gathered K/V, the whole sequence's
        return cp_analysis.allgather_saved_bytes(b, s, heads, kv, cfg.d_head, cp, e)
    if cp > 1 or attention == "flash":
        return cp_analysis.ring_attention_saved_bytes(b, s, heads, kv, cfg.d_head, cp, e)
    rows = tp_analysis.compare_with_korthikanti(cfg, b, s, tp)
    return sum(r.ours_bytes for r in rows if r.item in CORE_ROWS)


def expected_expert_rows(tokens: int, top_k: int, etp: int = 1) -> int:
    """Rows an EP rank's experts receive in one forward, expected under uniform routing with no dropping: each of
    the T k assignments of the EP group's ranks lands on a given rank with probability 1/ep, and ep ranks send, so
    T k; ETP gathers the rows of its etp members: T k etp."""
    return tokens * top_k * etp


def moe_saved_rows(
    cfg,
    tokens: int,
    *,
    etp: int = 1,
    expert_rows: int | None = None,
    tp: int = 1,
    sequence_parallel: bool = False,
    sp_regather: bool = False,
    dispatcher: str = "alltoall",
) -> dict[str, int]:
    """Bytes one `pylib.ep.ExpertParallelMoE` forward keeps, by tensor, for `tokens` tokens on this rank (softmax
    router, no auxiliary loss, no dropping; exact then, an estimate for sigmoid routers and ETP).
    expert_rows: rows this rank's experts received (R); None: `expected_expert_rows`.
    dispatcher "allgather" (`pylib.ep.gather_dispatcher`): the un-permutation runs on this rank's R rows of the
    gathered tokens, not on its own T k assignments, so its indices, weights and weighted outputs are R rows.
    With shared experts (`MoEConfig.n_shared_experts`), the analysis' estimate of their MLP, cut over tp as
    `pylib.ep.shared` cuts it: its hidden rows as a dense MLP's (3 f-wide tensors in Megatron's fused layer,
    `sp_regather`), on the TP group's tokens (tokens x tp under SP), and under pylib's SP the gathered input."""
    e = dtype_bytes(cfg.dtype)
    moe = cfg.moe
    T, k, h, E = tokens, moe.top_k, cfg.d_model, moe.n_experts
    R = expected_expert_rows(T, k, etp) if expert_rows is None else expert_rows
    ffe = (moe.d_ff or cfg.d_ff) // etp
    hidden = 4 if cfg.mlp == "swiglu" else 2  # SwiGLU: gate x, silu(gate x), up x, product; GELU: input, output
    shared = {}
    f_s = recompute_analysis.shared_ff(cfg)
    if f_s:
        sp = sequence_parallel and tp > 1
        T_tp = T * tp if sp else T
        n_hidden = 3 if sp and sp_regather and cfg.mlp == "swiglu" else hidden
        shared[f"shared experts hidden x {n_hidden} [T, f_s/tp]"] = n_hidden * T_tp * (f_s // tp) * e
        if sp and not sp_regather:  # pylib's column-parallel linear keeps the gathered copy
            shared["shared experts input, gathered [T tp, h]"] = T_tp * h * e
    routed = {
        "router input [T, h]": T * h * e,
        "router scores [T, E]": T * E * e,
        "expert input rows [R, h]": R * h * e,
        f"expert hidden x {hidden} [R, h_ffn/etp]": hidden * R * ffe * e,
    }
    if dispatcher == "allgather":
        return (
            shared
            | routed
            | {
                "chosen experts [T, k]": T * k * INT64,
                "permutation, un-permutation [R] x 2": 2 * R * INT64,
                "combine weights [R, 1]": R * e,
                "expert outputs, weighted [R, h] x 2": 2 * R * h * e,
            }
        )
    return (
        shared
        | routed
        | {
            "chosen experts, permutation, un-permutation [T, k] x 3": 3 * T * k * INT64,
            "combine weights [T k, 1]": T * k * e,
            "expert outputs, weighted [T k, h] x 2": 2 * T * k * h * e,
        }
    )


def fp8_saved_input_bytes(tokens: int, features: int, recipe) -> int:
    """Bytes one `Fp8Linear` keeps for its weight gradient from an input [tokens, features] (`_Fp8LinearFunction`'s
    ctx.qxt): X^T [features, tokens] in E4M3, 1 byte an element, and its decode scales along the tokens, one fp32
    for a per-tensor recipe, one fp32 per 1 x block tile for "blockwise", one E8M0 byte per 1 x block tile for
    "mxfp8" (a partial last tile counted whole, as a kernel that pads would; pylib refuses it)."""
    n = tokens * features
    if recipe.per_tensor:
        return n + FP32
    tiles = features * -(-tokens // recipe.block)
    return n + tiles * (FP32 if recipe.recipe == "blockwise" else 1)


def e5m6_saved_bytes(tokens: int, features: int) -> int:
    """Bytes `pylib.model.v3_storage.E5M6Linear` keeps for its weight gradient from an input [tokens, features]:
    12 bits an element, two packed in three bytes (1.5 bytes each, a last odd element padded), and one int8
    exponent per 1 x 128 tile along the features (a partial last tile counted whole)."""
    n = tokens * features
    return 3 * -(-n // 2) + tokens * -(-features // E5M6_TILE)


def check_storage(storage) -> None:
    """Refuse a storage choice that is not one of `STORAGE`, naming it."""
    unknown = [x for x in storage if x not in STORAGE]
    if unknown:
        raise ValueError(f"storage {unknown} not among {STORAGE}")


def swiglu_cached_bytes(tokens: int, features: int, recipe) -> int:
    """Bytes `pylib.model.v3_storage.cached_swiglu_mlp` keeps of a SwiGLU's two inputs gate x and up x
    [tokens, features] each: two FP8 copies as `fp8_saved_input_bytes` counts them (its input x is the linear's
    row, counted apart)."""
    return 2 * fp8_saved_input_bytes(tokens, features, recipe)


def storage_rows(rows: dict[str, int], cfg, plan, tokens: tuple[int, int, int], recipe, storage) -> dict[str, int]:
    """One layer's `rows` (after recomputation and `fp8_rows`) with DeepSeek-V3's `storage` choices applied (module
    docstring): tokens (inside the TP region, a MoE layer's, its shared experts'), R the rows this rank's experts
    receive; recipe None (a 16-bit layer) leaves "swiglu_fp8" out. A row a recomputation already dropped stays
    dropped."""
    out = dict(rows)
    t_in, r_rows, t_shared = tokens
    tp, etp = plan.par.tp, plan.par.etp
    if "attn_out_e5m6" in storage:
        e5m6 = e5m6_saved_bytes(t_in, cfg.n_heads // tp * cfg.d_head)
        _replace_rows(out, "W_O input (attention output)", "W_O input (attention output) [E5M6]", e5m6)
    if cfg.moe is None or not any(r.startswith("expert ") for r in out):
        return out
    if "gate_in_expert" in storage and "expert outputs, weighted [T k, h] x 2" in out:
        del out["expert outputs, weighted [T k, h] x 2"], out["combine weights [T k, 1]"]
        out["combine weights at the experts [R]"] = r_rows * dtype_bytes(cfg.dtype)
    elif "fused_unpermute" in storage:
        item = "expert outputs, weighted [T k, h] x 2"
        if item in out:
            out["expert outputs [T k, h], fused un-permute"] = out.pop(item) // 2
    if "swiglu_fp8" in storage and recipe is not None and cfg.mlp == "swiglu":
        for prefix, n, f in (
            ("expert hidden", r_rows, (cfg.moe.d_ff or cfg.d_ff) // etp),
            ("shared experts hidden", t_shared, recompute_analysis.shared_ff(cfg) // tp),
        ):
            _replace_rows(out, prefix, f"{prefix}: SwiGLU inputs cached [FP8]", swiglu_cached_bytes(n, f, recipe))
    return out


def _replace_rows(rows: dict[str, int], prefix: str, item: str, n: int) -> None:
    """The rows whose names start with `prefix` replaced by one, `item` of n bytes (nothing where none is kept: a
    recomputation dropped it)."""
    old = [r for r in rows if r.startswith(prefix)]
    for r in old:
        del rows[r]
    if old:
        rows[item] = n


def fp8_rows(
    rows: dict[str, int],
    cfg,
    recipe,
    plan,
    b: int,
    s_cp: int,
    *,
    expert_rows: int | None = None,
    modules=frozenset(),
    fused: bool = True,
    flash_shares_output: bool = False,
) -> dict[str, int]:
    """One layer's `rows` (16-bit, after recomputation dropped what it drops) with each FP8 linear's input kept as
    `Fp8Linear` keeps it (module docstring): the rows read by the linears alone become their FP8 copies, one per
    linear reading them (fused: one for QKV and one for fc1). b sequences of s_cp tokens on this rank, under
    `plan` (its tp, etp, SP and sp_regather, as `layer_saved_rows`); expert_rows: R (None: the expectation).
    flash_shares_output: the W_O input row was dropped because the flash kernel's saved output is the same storage
    (a 16-bit one that stays, so the FP8 linear adds its own copy)."""
    e = dtype_bytes(cfg.dtype)
    h, swiglu = cfg.d_model, cfg.mlp == "swiglu"
    tp, etp = plan.par.tp, plan.par.etp
    sp = plan.options.sequence_parallel and tp > 1
    tokens, moe_tokens = b * s_cp, b * (s_cp // tp if sp else s_cp)  # inside the TP region; a MoE layer's
    tokens_in = b * s_cp // tp if sp and plan.sp_regather else tokens  # the QKV and MLP inputs as kept
    qkv_copies, fc1_copies = (1, 1) if fused else (3, 2 if swiglu else 1)
    out = dict(rows)

    def convert(item, n_rows, k, copies=1):
        if item in out:
            out[item] -= n_rows * k * e
            out[item + " [FP8]"] = copies * fp8_saved_input_bytes(n_rows, k, recipe)
            if not out[item]:
                del out[item]

    convert("QKV input (LN1 output)", tokens_in, h, qkv_copies)
    convert("MLP input (LN2 output)", tokens_in, h, fc1_copies)
    if flash_shares_output:
        out["W_O input (attention output) [FP8]"] = fp8_saved_input_bytes(
            tokens, cfg.n_heads // tp * cfg.d_head, recipe
        )
    else:
        convert("W_O input (attention output)", tokens, cfg.n_heads // tp * cfg.d_head)
    if "mlp" not in modules:  # its hidden row: the down projection's input is one of its tensors
        convert("MLP hidden", tokens, cfg.d_ff // tp)
    if cfg.moe is None:
        return out
    R = expected_expert_rows(moe_tokens, cfg.moe.top_k, etp) if expert_rows is None else expert_rows
    convert("expert input rows [R, h]", R, h, fc1_copies)
    if "moe_act" not in modules:  # moe_act recomputes the down projections' inputs
        for item in [r for r in out if r.startswith("expert hidden")]:
            convert(item, R, (cfg.moe.d_ff or cfg.d_ff) // etp)
    f_s, shared_tokens = recompute_analysis.shared_ff(cfg) // tp, moe_tokens * tp if sp else moe_tokens
    shared = [r for r in out if r.startswith("shared experts")]
    for item in shared:
        if item.startswith("shared experts hidden"):
            convert(item, shared_tokens, f_s)
        else:  # pylib's SP keeps the gathered input
            convert(item, shared_tokens, h, fc1_copies)
    if shared and not any(r.startswith("shared experts input") for r in shared):
        # their input is the router's, which the router keeps in 16 bits: fc1 adds its FP8 copy
        out["shared experts input [FP8]"] = fc1_copies * fp8_saved_input_bytes(shared_tokens, h, recipe)
    return out


def _moe_layer_rows(cfg, plan, tokens: int, expert_rows, modules, sp: bool) -> tuple[dict[str, int], int | None]:
    """(the MoE MLP's saved rows, the busiest rank's expert rows) for `layer_saved_rows`: `moe_saved_rows` with the
    plan's routing imbalance and dispatcher; the `moe` recompute module keeps the router's input alone."""
    par = plan.par
    imbalance = getattr(plan, "routing_imbalance", 1.0)  # the busiest rank's rows (`Plan.routing_imbalance`)
    if expert_rows is None and imbalance != 1.0:
        expert_rows = round(imbalance * expected_expert_rows(tokens, cfg.moe.top_k, par.etp))
    dispatcher = getattr(plan, "dispatcher", None) or cfg.moe.dispatcher  # the plan's, else the model's
    moe_rows = moe_saved_rows(
        cfg,
        tokens,
        etp=par.etp,
        expert_rows=expert_rows,
        tp=par.tp,
        sequence_parallel=sp,
        sp_regather=plan.sp_regather,
        dispatcher=dispatcher,
    )
    if "moe" in modules:  # the layer checkpointed whole: its input, the router's, is all it keeps
        moe_rows = {item: n for item, n in moe_rows.items() if item.startswith("router input")}
    return moe_rows, expert_rows


def layer_saved_rows(
    cfg,
    layer: int,
    b: int,
    s: int,
    plan,
    *,
    attention: str = "math",
    expert_rows: int | None = None,
    fp8=None,
    fp8_fused: bool = True,
    storage: tuple[str, ...] = (),
) -> dict[str, int]:
    """Bytes one layer keeps for backward on one rank, by tensor, under `plan` (a `pylib.analysis.planner.Plan`: its
    mesh's tp, cp, etp, its options' SP, CP kind and layout and recompute granularity, its sp_regather and
    recompute_modules): `tp.compare_with_korthikanti` at s/cp tokens, the attention core as
    `attention_core_bytes` (its inputs under recompute="selective"), and for a MoE layer the MLP rows replaced by
    `moe_saved_rows`. recompute="full": the layer's input alone (one layer recomputed whole).
    sp_regather: under SP, the column-parallel linears keep their input as the s/(cp tp) shard and all-gather it
    again in backward (Megatron's choice; `tp.compare_with_korthikanti(regather=True)`); False keeps it gathered,
    as pylib.tp does. sp_regather also counts Megatron's layer as Megatron-LM with Transformer Engine keeps it:
    the fused bias-SwiGLU saves fc1's output [b, s, 2 h_ffn/tp] and fc2's input [b, s, h_ffn/tp] (3 h_ffn-wide
    tensors, not pylib's 4: gate x, silu(gate x), up x and their product), and the flash kernel's saved output
    is the very tensor the row-parallel W_O saves as its input (one storage, counted once, without CP).
    recompute_modules (with recompute="selective"; None: Megatron's default, the core alone): the modules each
    layer recomputes, their rows removed (`recompute.module_dropped_rows`).
    fp8 (an `Fp8Recipe`): the FP8 linears' inputs as `Fp8Linear` keeps them (`fp8_rows`; fp8_fused: one copy for
    the fused QKV and fc1, False: pylib's separate q, k, v and gate, up linears, one each); the recipe's
    first_last_layers_bf16 leaves the first and last layer in 16 bits.
    storage: DeepSeek-V3's choices of `STORAGE` (`storage_rows`; "swiglu_fp8" only in a layer that runs FP8)."""
    check_storage(storage)
    par, o, sp_regather = plan.par, plan.options, plan.sp_regather
    tp, cp, etp, cp_kind = par.tp, par.cp, par.etp, o.cp_kind
    recompute = check_recompute(o.recompute).granularity
    bad = modules_problems(plan.recompute_modules, recompute)
    if bad:
        raise ValueError("; ".join(bad))
    modules = recompute_modules_of(recompute, plan.recompute_modules)
    sp = o.sequence_parallel and tp > 1
    if recompute == "full":
        return {
            "layer input (recomputed layer)": recompute_analysis.layer_input_bytes(
                cfg, b, s, tp, sequence_parallel=sp, cp=cp
            )
        }
    s_cp = s // cp
    rows = {
        r.item: r.ours_bytes
        for r in tp_analysis.compare_with_korthikanti(cfg, b, s_cp, tp, sequence_parallel=sp, regather=sp_regather)
        if r.ours_bytes and r.item not in CORE_ROWS
    }
    if sp and sp_regather:  # Megatron's layer (see the docstring): its fused kernels keep fewer tensors
        if cfg.mlp == "swiglu" and "MLP hidden" in rows:
            rows["MLP hidden"] = rows["MLP hidden"] * 3 // 4  # fc1's [s, 2 f/t] output and fc2's [s, f/t] input
        if cp == 1 and attention == "flash" and "core_attn" not in modules:
            rows.pop("W_O input (attention output)", None)  # the flash kernel's saved output, one storage
    core = "attention core" + (f" ({cp_kind})" if cp > 1 else f" ({attention})")
    if "core_attn" in modules:
        rows[core + ", recomputed: q, k, v"] = recompute_analysis.core_input_bytes(cfg, b, s, tp, cp)
    else:
        rows[core] = attention_core_bytes(
            cfg, b, s, tp=tp, cp=cp, cp_kind=cp_kind, attention=attention, layout=o.cp_layout
        )
    tokens = b * (s_cp // tp if sp else s_cp)  # a MoE layer's, outside the TP region
    if cfg.is_moe_layer(layer):
        for item in MLP_ROWS:
            rows.pop(item, None)
        moe_rows, expert_rows = _moe_layer_rows(cfg, plan, tokens, expert_rows, modules, sp)
        rows.update(moe_rows)
    dropped = recompute_analysis.module_dropped_rows(
        rows,
        modules,
        moe_layer=cfg.is_moe_layer(layer),
        sequence_parallel=sp,
        sp_regather=sp_regather,
        qkv_bytes=recompute_analysis.core_input_bytes(cfg, b, s, tp, cp),
    )
    for item, n in dropped.items():
        rows[item] -= n
        if not rows[item]:
            del rows[item]
    R = 0  # the rows this rank's experts receive
    if cfg.is_moe_layer(layer):
        R = expected_expert_rows(tokens, cfg.moe.top_k, etp) if expert_rows is None else expert_rows
    bf16 = fp8 is None or (fp8.first_last_layers_bf16 and layer in (0, cfg.n_layers - 1))
    if not bf16:
        shares = sp and sp_regather and cp == 1 and attention == "flash" and "core_attn" not in modules
        kw = dict(modules=modules, fused=fp8_fused, flash_shares_output=shares)
        rows = fp8_rows(rows, cfg, fp8, plan, b, s_cp, expert_rows=R, **kw)
    if not storage:
        return rows
    counts = (b * s_cp, R, tokens * tp if sp else tokens)
    return storage_rows(rows, cfg, plan, counts, None if bf16 else fp8, storage)


def stage_end_rows(
    cfg,
    b: int,
    s: int,
    *,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = SEQUENCE_PARALLEL,
    first: bool = False,
    last: bool = False,
    sp_regather: bool = False,
) -> dict[str, int]:
    """What the first stage keeps around the embedding and the last around the head, by tensor (sp_regather: the
    LM head, a column-parallel linear, keeps its input as the SP shard, as `layer_saved_rows`)."""
    e = dtype_bytes(cfg.dtype)
    s_cp = s // cp
    s_out = s_cp // tp if sequence_parallel and tp > 1 else s_cp
    h, V = cfg.d_model, cfg.vocab_size // tp
    rows = {}
    if first:
        rows["token ids and vocab mask [b, s/cp]"] = b * s_cp * (INT64 + BOOL)
    if last:
        rows["final LayerNorm input and statistics"] = b * s_out * h * e + 2 * b * s_out * e
        if sp_regather and sequence_parallel and tp > 1:
            rows["LM head input, SP shard [b, s/(cp tp), h]"] = b * s_out * h * e
        else:
            rows["LM head input [b, s/cp, h]"] = b * s_cp * h * e
        rows["logits [b, s/cp, V/tp]"] = b * s_cp * V * e
        rows["targets and vocab mask [b, s/cp]"] = b * s_cp * (INT64 + BOOL)
    return rows


def chunk_saved_bytes(
    cfg,
    b: int,
    s: int,
    plan,
    pp_rank: int = 0,
    *,
    attention: str = "math",
    expert_rows: dict[int, int] | None = None,
    fp8=None,
    storage: tuple[str, ...] = (),
) -> list[int]:
    """Bytes one microbatch's forward keeps in each chunk of pipeline rank `pp_rank` (a list of v numbers) under
    `plan` (a `pylib.analysis.planner.Plan`: its mesh, its options -- the recompute groups counted within each
    chunk, as pylib.compose runs them -- and its sp_regather, balance_ends (Llama 3's uneven split,
    `split_layers`) and recompute_modules, as `layer_saved_rows`). expert_rows: {layer: R} measured; missing layers
    take the expectation. fp8: an `Fp8Recipe`, the linears' inputs kept in FP8 (`layer_saved_rows`); storage:
    DeepSeek-V3's storage choices (`storage_rows`)."""
    par, o = plan.par, plan.options
    pp, v, tp, cp = par.pp, o.v, par.tp, par.cp
    rc = check_recompute(o.recompute)
    kept = "selective" if rc.granularity == "selective" else "none"  # what a layer outside a recomputed group keeps
    layer_plan = replace(
        plan,
        options=replace(o, recompute=replace(rc, granularity=kept)),
        recompute_modules=plan.recompute_modules if kept == "selective" else None,
    )
    out = []
    sp = o.sequence_parallel and tp > 1
    ends = dict(tp=tp, cp=cp, sequence_parallel=o.sequence_parallel, sp_regather=plan.sp_regather)
    same: dict[tuple, int] = {}  # dense and MoE layers at the expected routing (the 16-bit ends apart): one sum each
    ends_bf16 = fp8 is not None and fp8.first_last_layers_bf16

    def layer(i):
        rows_i = (expert_rows or {}).get(i)
        kind = (cfg.is_moe_layer(i), ends_bf16 and i in (0, cfg.n_layers - 1))
        if rows_i is None and kind in same:
            return same[kind]
        kw = dict(attention=attention, expert_rows=rows_i, fp8=fp8, storage=storage)
        rows = layer_saved_rows(cfg, i, b, s, layer_plan, **kw)
        if rows_i is None:
            same[kind] = sum(rows.values())
        return sum(rows.values())

    for c, layers in enumerate(split_layers(cfg.n_layers, pp, v, pp_rank, plan.balance_ends)):
        stage = c * pp + pp_rank
        total = sum(stage_end_rows(cfg, b, s, first=stage == 0, last=stage == pp * v - 1, **ends).values())
        for group, whole in rc.groups(len(layers)):
            if whole:
                total += recompute_analysis.layer_input_bytes(cfg, b, s, tp, sequence_parallel=sp, cp=cp)
            else:
                total += sum(layer(layers[k]) for k in group)
        out.append(total)
    return out


def split_layers(n_layers: int, pp: int, v: int, pp_rank: int, balance_ends: bool = False) -> list[range]:
    """The layers of each chunk of pipeline rank `pp_rank`: `pylib.plan.split.chunk_layers`, or with `balance_ends`
    Llama 3's split (Grattafiori et al. 2024, section 3.3.2): one layer fewer on the first and on the last virtual
    stage, the embedding and the LM head in their place -- L + 2 slots cut into p v equal virtual stages, slot 0
    the embedding, slot L + 1 the head (126 layers, p 16, v 8: the first chunk of rank 0 holds the embedding alone,
    the last chunk of rank 15 the head alone). The analysis only: pylib.pp cuts equal stages."""
    if not balance_ends:
        return chunk_layers(n_layers, pp, v, pp_rank)
    return [range(max(r.start - 1, 0), min(r.stop - 1, n_layers)) for r in chunk_layers(n_layers + 2, pp, v, pp_rank)]


@functools.lru_cache(maxsize=4096)
def live_counts(
    schedule: str, pp: int, n_microbatches: int, v: int, pp_rank: int, group_size: int | None = None
) -> tuple[tuple[int, ...], ...]:
    """The vectors (microbatches alive in chunk 0, ..., chunk v-1) right after each forward of rank `pp_rank`, in
    the order `pylib.plan.schedules.compute_order` runs them (its warm-up forwards, then one forward and one backward,
    then the cool-down backwards; the interleaved chunk order from `interleaved_table` in groups of N = `group_size`
    microbatches, default p), keeping only the vectors no other one dominates. Replayed on chunk indices alone:
    thousands of microbatches cost milliseconds."""

    group = check_schedule(schedule, pp, n_microbatches, v, group_size=group_size)
    if schedule == "interleaved":
        forwards = [c for _, c in interleaved_table(n_microbatches, v, group)]
    else:
        forwards = [0] * n_microbatches
    backwards = forwards if schedule != "interleaved" else [v - 1 - c for c in forwards]
    warm = warmup_forwards(schedule, pp, n_microbatches, pp_rank, v, group)
    alive = [0] * v
    seen = set()

    def forward(c):
        alive[c] += 1
        seen.add(tuple(alive))

    for c in forwards[:warm]:
        forward(c)
    for k in range(len(forwards) - warm):
        forward(forwards[warm + k])
        alive[backwards[k]] -= 1
    keep: list[tuple[int, ...]] = []
    for x in sorted(seen, key=sum, reverse=True):  # a dominating vector has the larger sum: it is already kept
        if not any(all(map(ge, y, x)) for y in keep):
            keep.append(x)
    return tuple(sorted(keep))


def peak_saved_bytes(
    chunk_bytes: list[int],
    schedule: str,
    pp: int,
    n_microbatches: int,
    v: int,
    pp_rank: int,
    group_size: int | None = None,
) -> int:
    """The most bytes rank `pp_rank` holds for backward at once over one step: max over its forwards of
    sum over chunks (microbatches alive in the chunk x the chunk's bytes). For 1F1B (v = 1) that is
    min(pp - pp_rank, m) microbatches (`pp.peak_in_flight`); interleaved, N = `group_size` microbatches per group
    (default p) set the warm-up, 2(p - r - 1) + (v - 1) N forwards."""
    vectors = live_counts(schedule, pp, n_microbatches, v, pp_rank, group_size)
    return max(sum(map(mul, vec, chunk_bytes)) for vec in vectors)
