"""Article B's cut tables judged cell by cell against what the ranks measured (`probe_modes` records on N ranks): each
cell "agrees", is "imprecise" (true, but not what Megatron and pylib do, or not quite what happens) or is "wrong".

    cells = weight_cut_cells(runs, cfg, moe_cfg)              # [Cell] for every (tensor, mode) of the weight table
    cells = activation_cut_cells(runs, cfg, moe_cfg, b, s)    # the activation table
    cut_table_rows(cells)                                     # one printed row per tensor, a mark per cell
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from pylib.i18n import tr
from pylib.tables import fmt_shape

from .axis_cuts import MODES, experts_held
from .cut_claims import ACT_SYMBOLS, SEED_ACT_CUT, SEED_WEIGHT_CUT, WEIGHT_PARAMS, WEIGHT_SYMBOLS, seed_words
from .symbols import describe, evaluate, seed_b_shape, symbol_sizes
from .tensor_names import shown_name


@dataclass
class Cell:
    """One cell of a cut table: article B's words, what they claim (`claim`, see `judge`), what was measured, the
    verdict ("agrees", "imprecise" or "wrong") and the measured value written out (in the reader's language).
    `kind` says what was measured, in words no edition translates: "shape" (the local shape on every rank),
    "stage" (held whole by one pipeline stage, absent on the others), "experts" (E/N whole experts per rank),
    "routed" (rows per expert) or "blocks" (one block of scores per ring step)."""

    row: str
    mode: str
    seed: str
    claim: str
    verdict: str
    measured: str
    kind: str


MARK = {"agrees": "✓", "imprecise": "≈", "wrong": "✗"}


def _symbol_of(param: str) -> str:
    if ".experts." in param:
        return "[h_ffn_e, h]" if "down_proj" in param else "[h, h_ffn_e]"
    for key, sym in WEIGHT_SYMBOLS.items():
        if key in param:
            return sym
    raise KeyError(param)


def _is_linear(param: str) -> bool:
    return "proj" in param or "lm_head" in param or "gate.weight" in param


def _local(rec: dict, param: str):
    """This rank's shape of a reference parameter in article B's orientation (None when it does not hold it)."""
    params = rec["params"]
    name = param
    if ".experts." in param and param not in params:
        name = param.replace(".experts.", ".experts.experts.")
    return seed_b_shape(params.get(name), _is_linear(param))


def _stage_of(runs, mode, param) -> list[int]:
    return [r for r, run in enumerate(runs) if _local(run[mode], param) is not None]


def _experts_verdict(runs, params, full, moe_cfg) -> tuple[bool, str]:
    """Claim "experts/N": each EP rank holds E/N of the experts, each whole, and together all of them."""
    N = len(runs)
    held = [len(experts_held({n: 0 for n in run["EP"]["params"] if n.startswith("layers.1.")})) for run in runs]
    whole = all(_local(run["EP"], p) == full[p] for run in runs for p in params)
    ids = [tuple(run["EP"]["expert_ids"]) for run in runs]
    ok = whole and held == [moe_cfg.moe.n_experts // N] * N and len(set(sum(ids, ()))) == moe_cfg.moe.n_experts
    spans = ", ".join(tr("rank {r}: {first}–{last}", r=r, first=i[0], last=i[-1]) for r, i in enumerate(ids))
    return ok, tr("E/N = {n} experts per rank, each whole ({spans})", n=held[0], spans=spans)


def _stage_verdict(runs, claim, params, full, n_layers) -> tuple[bool, str]:
    """Claims "stage 0", "stage L-1", "by layer": held whole by one pipeline stage, absent on the others."""
    N = len(runs)
    holders = {p: _stage_of(runs, "PP", p) for p in params}
    whole = all(_local(runs[r]["PP"], p) == full[p] for p, rs in holders.items() for r in rs)
    (stages,) = {tuple(v) for v in holders.values()}
    if claim == "by layer":
        layer = int(params[0].split(".")[1])
        stage_layers = {r: runs[r]["PP"]["layers"] for r in range(N)}
        held = stage_layers[stages[0]]
        ok = whole and list(stages) == [r for r in range(N) if layer in stage_layers[r]]
        text = tr("whole, on stage {stage} only (layers {first}–{last})", stage=stages[0], first=held[0], last=held[-1])
        return ok, text
    target = 0 if claim == "stage 0" else n_layers - 1
    if claim == "stage 0":
        text = tr("whole, on stage {stage} only", stage=stages[0])
    else:
        text = tr("whole, on stage {stage} only = N_PP − 1", stage=stages[0])
    return whole and list(stages) == [target], text


def _shape_verdict(runs, claim, params, full, sizes, rec_mode, tp_mode) -> tuple[bool, str]:
    """Claims "full", "as TP" or a shape ("|" between alternatives, "&" one per parameter) on every rank."""
    N = len(runs)
    locs = {p: [_local(run[rec_mode], p) for run in runs] for p in params}
    for p in params:
        if len(set(locs[p])) != 1:
            raise AssertionError(f"{rec_mode} {p}: ranks hold different shapes {locs[p]}")
    mine = [locs[p][0] for p in params]
    if claim == "full":
        ok = all(locs[p][0] == full[p] for p in params)
    elif claim == "as TP":
        ok = all(locs[p][0] == _local(runs[0][tp_mode], p) for p in params)
    elif "&" in claim:
        ok = mine == [evaluate(a.strip(), sizes) for a in claim.split("&")]
    else:
        wanted = [evaluate(a.strip(), sizes) for a in claim.split("|")]
        ok = all(m in wanted for m in mine)
    measured = [f"{describe(locs[p][0], _symbol_of(p), sizes, N)} = {fmt_shape(locs[p][0])}" for p in params]
    return ok, tr("; ").join(dict.fromkeys(measured))


def judge_weight(runs, row: str, mode: str, cfg, moe_cfg) -> Cell:
    """Measure one cell of tbl-mat-weight-cut on every rank and judge article B's claim."""
    seed, claim = SEED_WEIGHT_CUT[row][mode]
    moe_row = row.startswith("MoE")
    sizes = symbol_sizes(moe_cfg if moe_row else cfg, N=len(runs))
    ref_params = runs[0]["reference"]["moe_params" if moe_row else "params"]
    params = [p.format(e=0) for p in WEIGHT_PARAMS[row]] if moe_row else WEIGHT_PARAMS[row]
    full = {p: seed_b_shape(ref_params[p], _is_linear(p)) for p in params}
    if claim == "experts/N":
        ok, text = _experts_verdict(runs, params, full, moe_cfg)
        return Cell(row, mode, seed, claim, "agrees" if ok else "wrong", text, "experts")
    if claim.startswith("stage") or claim == "by layer":
        ok, text = _stage_verdict(runs, claim, params, full, sizes["L"])
        return Cell(row, mode, seed, claim, "agrees" if ok else "wrong", text, "stage")
    # Experts under TP are ETP's (pylib's TP model shards dense layers only); SP adds no cut to any weight, so
    # its expert cell is read from the same ETP run, whose MoE sees each rank's own tokens as it would under SP.
    rec_mode = "ETP" if (moe_row and mode in ("TP", "SP")) else mode
    ok, text = _shape_verdict(runs, claim, params, full, sizes, rec_mode, "ETP" if moe_row else "TP")
    if rec_mode == "ETP":
        text += " (ETP)"
    verdict = "agrees" if ok else "wrong"
    if ok and "|" in claim:
        verdict = "imprecise"  # only one of the alternatives is what Megatron and pylib do
    return Cell(row, mode, seed, claim, verdict, text, "shape")


def weight_cut_cells(runs, cfg, moe_cfg) -> list[Cell]:
    return [judge_weight(runs, row, mode, cfg, moe_cfg) for row in SEED_WEIGHT_CUT for mode in MODES]


def judge_activation(runs, row: str, mode: str, cfg, moe_cfg, b: int, s: int) -> Cell:
    """Measure one cell of tbl-mat-act-cut on every rank and judge article B's claim."""
    seed, claim = SEED_ACT_CUT[row][mode]
    N = len(runs)
    sizes = symbol_sizes(cfg, b=b, s=s, N=N)
    key = "K" if row == "K, V" else row
    symbol = ACT_SYMBOLS[row]
    full = evaluate(symbol, sizes)
    if claim == "routed":
        rows = [r for run in runs for r in run["EP"]["expert_rows"]]
        k, E = moe_cfg.moe.top_k, moe_cfg.moe.n_experts
        ok = sum(rows) == N * b * s * k
        text = tr(
            "expert e holds [T_e, h_ffn_e]; T_e per local expert: {rows} (data-dependent); the {E} experts "
            "together get N·b·s·K = {total} rows",
            rows=rows,
            E=E,
            total=N * b * s * k,
        )
        return Cell(row, mode, seed, claim, "agrees" if ok else "wrong", text, "routed")
    if claim in ("stage full", "stage L-1"):
        holders = [r for r, run in enumerate(runs) if key in run["PP"]["acts"]]
        shapes_ = {runs[r]["PP"]["acts"][key] for r in holders}
        ok = shapes_ == {full}
        if claim == "stage L-1":
            ok = ok and holders == [cfg.n_layers - 1]
            text = tr("whole {shape}, on stage {stage} = N_PP − 1 only", shape=fmt_shape(full), stage=holders[0])
        else:
            text = tr("whole {shape}, on the stage of its layer", shape=fmt_shape(full))
        return Cell(row, mode, seed, claim, "agrees" if ok else "wrong", text, "stage")
    locs = [run[mode]["acts"].get(key) for run in runs]
    if claim == "blocks":
        blocks = [tuple(x) for run in runs for x in run["CP"]["scores"]]
        never_row = all(bl[3] < s for bl in blocks)
        per_rank = tr("; ").join(
            tr("rank {r}: {shapes}", r=r, shapes=", ".join(fmt_shape(x) for x in run["CP"]["scores"]))
            for r, run in enumerate(runs)
        )
        text = tr("a block per ring step, never [b, n_head, s/N, s]: {per_rank}", per_rank=per_rank)
        return Cell(row, mode, seed, claim, "imprecise" if never_row else "wrong", text, "blocks")
    if len(set(locs)) != 1:
        raise AssertionError(f"{mode} {row}: ranks hold different shapes {locs}")
    loc = locs[0]
    if claim == "full":
        ok = loc == full
    elif claim == "as TP":
        ok = loc == runs[0]["TP"]["acts"][key]
    else:
        ok = loc == evaluate(claim, sizes)
    text = f"{describe(loc, symbol, sizes, N)} = {fmt_shape(loc)}"
    return Cell(row, mode, seed, claim, "agrees" if ok else "wrong", text, "shape")


def activation_cut_cells(runs, cfg, moe_cfg, b: int, s: int) -> list[Cell]:
    return [judge_activation(runs, row, mode, cfg, moe_cfg, b, s) for row in SEED_ACT_CUT for mode in MODES]


def cut_table_rows(cells: list[Cell], with_seed: bool = True) -> list[list[str]]:
    """One table row per tensor: its name, then per mode the measured value with its verdict mark (and article B's
    words: its own Chinese in the Chinese edition, their English in the English one)."""
    by_row: dict[str, dict[str, Cell]] = defaultdict(dict)
    for c in cells:
        by_row[c.row][c.mode] = c
    out = []
    for row, cols in by_row.items():
        line = [shown_name(row)]
        for mode in MODES:
            c = cols[mode]
            said = "<br>*" + tr("article B: {words}", words=seed_words(c.seed)) + "*" if with_seed else ""
            line.append(f"{MARK[c.verdict]} {c.measured}{said}")
        out.append(line)
    return out
