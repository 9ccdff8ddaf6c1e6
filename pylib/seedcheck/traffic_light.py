"""Article A section 1: the token-locality table and the traffic-light colours with the parallelism that takes care of
each stage, derived from real runs rather than typed.

    traffic_light(token_local, weight_matrices)      # "green" / "yellow" / "red"
    derived_remedy(stage, held, seq_len)             # ["TP column", "TP row", "all_reduce", ...] for one stage
    SEED_A_REMEDY                                    # article A's right-hand column, as printed, and what it names
    verdict(said, got)                               # "agrees" / "agrees; article A is less specific" (or raises)
    locality_table(checks, labels) / traffic_light_table(...)   # the labelled MyST tables

`stage` is a `pylib.seedcheck.layer_flow.Stage` (its number and the calls the forward pass made); `held` is rank 0's
account of how TP, TP + SP, CP and EP hold article A's layer (the chapter's launched function returns it):
held["TP"]["specs"] (ShardSpecs), held["TP"]["ops"] [(tag, op)], held["TP + SP"]["tokens"] {LayerNorm: tokens},
held["CP"]["specs"], held["CP"]["kind"], held["CP"]["replaced"] (the attention methods CP replaces),
held["EP"]["specs"].
"""

from __future__ import annotations

from pylib.i18n import N_, shown, tr
from pylib.tables import markdown_table


def traffic_light(token_local: bool, weight_matrices: list[str]) -> str:
    """Red: not token-local. Yellow: token-local and holding a 2-D weight. Green: the rest."""
    if not token_local:
        return "red"
    return "yellow" if weight_matrices else "green"


def derived_remedy(stage, held: dict, seq_len: int) -> list[str]:
    """Which parallelism takes care of a stage, from the parallel modules' own accounts: whatever splits its weight
    matrices (TP by column or by row, then the collective the TP layer issued; EP for the MLP), whatever replaces
    its computation (CP's attention), and otherwise whatever hands it fewer tokens (SP, CP)."""
    tp_kind = {sp.name.removesuffix(".weight"): sp.kind for sp in held["TP"]["specs"] if sp.name.endswith(".weight")}
    leaving = dict(held["TP"]["ops"])  # "attn" / "mlp" -> the collective issued leaving that half
    found = []
    for call in stage.calls:
        kind = tp_kind.get(call.name)
        if kind == "column":
            found.append("TP column")
        if kind == "row":
            found += ["TP row", leaving[call.name.split(".")[0]]]
        if call.name == "attn.core" and "core" in held["CP"]["replaced"]:
            found.append(f"CP {held['CP']['kind']}")
    if stage.number == 6 and any(sp.axis == "ep" and sp.kind == "expert" for sp in held["EP"]["specs"]):
        found.append("EP experts")
    if not found:  # no weight matrix split, no computation replaced: only the activations are left to cut
        if held["TP + SP"]["tokens"][stage.calls[0].name] == seq_len // 2:
            found.append("SP cut")
        cuts_seq = any(sp.name == "x" and sp.dim == 1 for sp in held["CP"]["specs"])  # [b, s/cp, h]
        whole = all(sp.kind == "replicated" for sp in held["CP"]["specs"] if sp.name.endswith("weight"))
        if cuts_seq and whole:
            found.append("CP cut")
    return list(dict.fromkeys(found))


SEED_A_REMEDY = {  # article A's colour blocks, right-hand column, as printed, and what each names
    1: ("SP/CP 直接切 (SP / CP: cut directly)", ["SP cut", "CP cut"]),
    2: ("TP 按权重列切 (TP: split the weights by column)", ["TP column"]),
    3: ("CP Ring Attention", ["CP ring"]),
    4: ("TP 行切+AllReduce (TP: row split, + all-reduce)", ["TP row", "all_reduce"]),
    5: ("直接切 (cut directly)", ["cut"]),
    6: ("TP 切 / EP 切专家 (TP split / EP: split the experts)", ["TP", "EP experts"]),
}

# article A's words as a table shows them: the English edition keeps the English gloss beside article A's Chinese, the
# Chinese edition shows article A's Chinese alone
_SEED_A_SHOWN = {
    1: N_("SP/CP 直接切 (SP / CP: cut directly)"),
    2: N_("TP 按权重列切 (TP: split the weights by column)"),
    3: N_("CP Ring Attention"),
    4: N_("TP 行切+AllReduce (TP: row split, + all-reduce)"),
    5: N_("直接切 (cut directly)"),
    6: N_("TP 切 / EP 切专家 (TP split / EP: split the experts)"),
}

# the derived remedies' names (the keys `derived_remedy` returns) as a table shows them
WORDS = {
    "SP cut": N_("SP: cut along seq"),
    "CP cut": N_("CP: cut along seq"),
    "TP column": N_("TP: column split"),
    "TP row": N_("TP: row split"),
    "all_reduce": N_("all-reduce (traced)"),
    "CP ring": N_("CP: ring attention"),
    "EP experts": N_("EP: split the experts"),
}

# the colours `traffic_light` returns (keys) as a table shows them
COLOURS = frozenset({N_("green"), N_("yellow"), N_("red")})


def _covers(general: str, specific: str) -> bool:  # article A's "cut" names no one; its "TP" no direction
    return (
        general == specific
        or (general == "cut" and specific.endswith(" cut"))
        or (general == "TP" and (specific.startswith("TP ") or specific == "all_reduce"))
    )


# verdict() returns the English key (chapters compare it with ==); a table shows it in the reader's language
_VERDICT_TEXT = frozenset({N_("agrees"), N_("agrees; article A is less specific")})


def verdict(said: list[str], got: list[str]) -> str:
    """ "agrees" when article A names exactly the derived remedies; "agrees; article A is less specific" when each
    of article A's names covers derived ones and each derived one is covered; a ValueError otherwise."""
    if sorted(said) == sorted(got):
        return "agrees"
    if all(any(_covers(a, b) for a in said) for b in got) and all(any(_covers(a, b) for b in got) for a in said):
        return "agrees; article A is less specific"
    raise ValueError(f"article A names {said}, the modules say {got}")


def locality_table(checks: dict, labels: dict) -> str:
    """`tbl-token-locality`: checks is stage number -> (modules run, SplitCheck); labels stage number -> label."""
    rows = [
        [labels[n], mods, " · ".join(str(list(s)) for s in c.local_in_shapes[0]), c.mark, f"{c.max_abs_err:.1e}"]
        + [c.comm_events]
        for n, (mods, c) in checks.items()
    ]
    caption = tr(
        "Each stage run on the whole sequence, and on two halves on two real ranks (rank 0: *The cat*, *A dog*; "
        "rank 1: *sat here*, *ran fast*)."
    )
    header = [
        tr("stage"),
        tr("modules"),
        tr("rank 0 holds"),
        tr("halves = whole?"),
        tr("max abs. diff."),
        tr("ops sent"),
    ]
    return markdown_table(header, rows, caption=caption, name="tbl-token-locality")


def traffic_light_table(labels: dict, colours: dict, matrices: dict, derived: dict) -> str:
    """`tbl-traffic-light`: per stage its computed colour, weight matrices, derived remedy, article A's, the verdict."""
    rows = [
        [
            labels[n],
            shown(COLOURS, colours[n]),
            ", ".join(f"`{m}`" for m in matrices[n]) or tr("none"),
            " + ".join(tr(WORDS[r]) for r in derived[n]),
            tr(_SEED_A_SHOWN[n]),
            shown(_VERDICT_TEXT, verdict(SEED_A_REMEDY[n][1], derived[n])),
        ]
        for n in colours
    ]
    caption = tr(
        "Article A's traffic lights, computed: red where the split test fails, yellow where it passes and the stage "
        "holds a weight matrix, green otherwise; the remedy derived from how TP, SP, CP and EP hold the layer on "
        "two real ranks, beside article A's column."
    )
    header = [
        tr("stage"),
        tr("colour"),
        tr("weight matrices"),
        tr("remedy, from the specs"),
        tr("article A's remedy"),
        tr("the two"),
    ]
    return markdown_table(header, rows, caption=caption, name="tbl-traffic-light")
