"""Article A's tables of sections 3 to 6, transcribed, and the Part I tables printed beside them from real runs.

    SEED_A_DIMS                                  # section 3: mode -> (splits, bottleneck, primitive, names)
    dims_rows(traced) / dims_table(traced)       # that table with the tracer's primitives, forward and backward
    ring_round_rows(rounds) / ring_round_table(rounds)   # section 5's round table from `pylib.cp.ring_rounds`
    routing_rows(table) / routing_table_md(table)        # section 6's routing table from the real router

`traced` is what a launched run returned: one dict per rank, mode -> the tracer's events as dicts
(`CommEvent.as_dict()`: op, phase, tag, peer, payload_bytes, ...). Marks are ✓ / ✗.
"""

from __future__ import annotations

from pylib import i18n
from pylib.seedcheck.primitives import primitive_names
from pylib.tables import markdown_table

# Article A, section 3, as printed (in English): what each mode splits, the bottleneck it relieves, its core primitive,
# and the set of article A's primitive names (`primitive_names`) that primitive stands for.
SEED_A_DIMS = {
    "DP": ("the data, along batch", "throughput", "gradient All-Reduce", {"All-Reduce"}),
    "TP": (
        "the weight matrices (row / column)",
        "one layer's weights do not fit one GPU",
        "All-Reduce",
        {"All-Reduce"},
    ),
    "SP": (
        "activations outside the TP region, along seq",
        "redundant activation memory",
        "All-Gather + Reduce-Scatter",
        {"All-Gather", "Reduce-Scatter"},
    ),
    "PP": ("the layers, in stages", "too many layers: cut across machines", "P2P between stages", {"P2P"}),
    "CP": ("the whole sequence, attention included", "long context, O(N²)", "K/V ring P2P", {"P2P"}),
    "EP": ("the set of MoE experts", "many experts", "dispatch / combine All-to-All", {"All-to-All"}),
}


def _seed_a_dims_shown(mode: str) -> tuple[str, str, str]:
    """SEED_A_DIMS[mode]'s three texts in the reader's language (zh: article A's own Chinese)."""
    return {
        "DP": (i18n.tr("the data, along batch"), i18n.tr("throughput"), i18n.tr("gradient All-Reduce")),
        "TP": (
            i18n.tr("the weight matrices (row / column)"),
            i18n.tr("one layer's weights do not fit one GPU"),
            "All-Reduce",
        ),
        "SP": (
            i18n.tr("activations outside the TP region, along seq"),
            i18n.tr("redundant activation memory"),
            "All-Gather + Reduce-Scatter",
        ),
        "PP": (
            i18n.tr("the layers, in stages"),
            i18n.tr("too many layers: cut across machines"),
            i18n.tr("P2P between stages"),
        ),
        "CP": (
            i18n.tr("the whole sequence, attention included"),
            i18n.tr("long context, O(N²)"),
            i18n.tr("K/V ring P2P"),
        ),
        "EP": (i18n.tr("the set of MoE experts"), i18n.tr("many experts"), i18n.tr("dispatch / combine All-to-All")),
    }[mode]


def _names(events, phase: str) -> str:
    return " + ".join(primitive_names(e["op"] for e in events if e["phase"] == phase)) or i18n.tr("none")


def dims_rows(traced: list[dict]) -> list[list[str]]:
    """One row per mode: [mode, splits, bottleneck, article A's primitive, traced forward, traced backward, ✓/✗].

    The traced columns take every rank's forward and backward events (the pipeline executor's clock sync runs in a
    phase of its own and is left out); ✓ when the set of primitive names equals article A's."""
    rows = []
    for mode, (splits, bottleneck, primitive, names) in SEED_A_DIMS.items():
        events = [e for rank in traced for e in rank[mode] if e["phase"] in ("forward", "backward")]
        found = set(primitive_names(e["op"] for e in events))
        mark = "✓" if found == names else "✗"
        splits, bottleneck, primitive = _seed_a_dims_shown(mode)
        rows.append([mode, splits, bottleneck, primitive, _names(events, "forward"), _names(events, "backward"), mark])
    return rows


def dims_table(traced: list[dict]) -> str:
    """Article A's table of dimensions as a labelled MyST table (`tbl-megatron-dims`), from `dims_rows`."""
    header = [
        "",
        i18n.tr("splits"),
        i18n.tr("relieves"),
        i18n.tr("article A's primitive"),
        i18n.tr("traced: forward"),
        i18n.tr("traced: backward"),
        i18n.tr("same?"),
    ]
    caption = i18n.tr(
        "Article A's table of Megatron's dimensions. The traced columns are the tracer's record of each mode run on "
        "two real ranks with article A's sizes, forward and backward."
    )
    return markdown_table(header, dims_rows(traced), caption=caption, name="tbl-megatron-dims")


def ring_round_rows(rounds: list[dict]) -> list[list[str]]:
    """Article A's round table from `pylib.cp.ring_rounds` rows (round, holds [per rank], recv_from [per rank])."""
    n = len(rounds[0]["holds"])
    rows = []
    for row in rounds:
        if row["recv_from"] is not None:
            rows.append(
                [i18n.tr("pass ↓")]
                + [i18n.tr("K{b}V{b} from GPU {src}", b=b, src=src) for b, src in zip(row["holds"], row["recv_from"])]
            )
        rows.append([i18n.tr("round {n}", n=row["round"])] + [f"K{b}V{b}" for b in row["holds"]])
    seen = [sorted({row["holds"][i] for row in rounds}) for i in range(n)]
    rows.append(
        [i18n.tr("end")]
        + [
            i18n.tr("Q{i} saw {k} of {n} ✓", i=i, k=len(s), n=n) if len(s) == n else f"Q{i} ✗"
            for i, s in enumerate(seen)
        ]
    )
    return rows


def ring_round_table(rounds: list[dict]) -> str:
    """The round table as a labelled MyST table (`tbl-ring-rounds`)."""
    n = len(rounds[0]["holds"])
    caption = i18n.tr(
        "Article A's ring-attention round table for {n} GPUs, read back from the trace of a real ring on {n} ranks: "
        "the K/V block each GPU computes with in each round, and the transfer before it.",
        n=n,
    )
    header = [""] + [f"GPU {i} (Q{i})" for i in range(n)]
    return markdown_table(header, ring_round_rows(rounds), caption=caption, name="tbl-ring-rounds")


def routing_rows(table: list[dict], per_rank: int = 2) -> list[list[str]]:
    """Article A's routing table, one row per token: [token, start GPU, experts (from 1), weights, expert GPUs]."""
    return [
        [
            row["token"],
            f"GPU {t // per_rank}",
            ", ".join(str(e + 1) for e in row["experts"]),
            ", ".join(f"{w:.2f}" for w in row["weights"]),
            ", ".join(f"GPU {g}" for g in row["ranks"]),
        ]
        for t, row in enumerate(table)
    ]


def routing_table_md(table: list[dict]) -> str:
    """The routing table as a labelled MyST table (`tbl-ep-routing`)."""
    caption = i18n.tr(
        "Article A's routing table from the real top-2 router of article A's model with 8 experts (counted from 1, as "
        "article A does; GPU g holds experts 2g+1 and 2g+2)."
    )
    header = [i18n.tr("token"), i18n.tr("on"), i18n.tr("experts"), i18n.tr("weights"), i18n.tr("experts on")]
    return markdown_table(header, routing_rows(table), caption=caption, name="tbl-ep-routing")


def traffic_cell(results: list[dict], step: str) -> str:
    """Rank 0's traced communication within one tagged step, as a short table cell ("none" when silent).

    results: one dict per rank with "events" (`CommEvent.as_dict()`); step: the tag the step ran under."""
    mine = [e for res in results for e in res["events"] if e["tag"].split(".")[0] == step and e["rank"] == 0]
    if not mine:
        return i18n.tr("none")

    def one(e):
        shape = list(e["shapes"][0])
        if e["op"] == "send":
            return i18n.tr("send {shape} to rank {peer}: {bytes} B", shape=shape, peer=e["peer"], bytes=e["bytes_sent"])
        if e["op"] == "recv":
            return i18n.tr(
                "recv {shape} from rank {peer}: {bytes} B", shape=shape, peer=e["peer"], bytes=e["bytes_recv"]
            )
        return i18n.tr("{op} of {shape}: receives {bytes} B", op=e["op"], shape=shape, bytes=e["bytes_recv"])

    return "; ".join(one(e) for e in mine)


def _shape(t) -> str:
    return str(list(t.shape))


def _ops(events, phase: str | None = None) -> str:
    mine = [e for e in events if e["rank"] == 0 and (phase is None or e["phase"] == phase)]
    return " + ".join(
        i18n.tr("{op} of {bytes} B ({tag})", op=e["op"], bytes=e["payload_bytes"], tag=e["tag"]) for e in mine
    ) or i18n.tr("none")


def _ep_holds(res: dict) -> str:  # article A counts experts from 1; pylib from 0
    experts = ", ".join(str(e + 1) for e in res["experts_held"])
    routed = "; ".join(
        i18n.tr(
            "{token} → experts {experts}", token=row["token"], experts=", ".join(str(e + 1) for e in row["experts"])
        )
        for row in res["table"]
    )
    return i18n.tr(
        "tokens {tokens} ({routed}); experts {experts}, each W_up [4, 8], W_down [8, 4]",
        tokens=", ".join(res["tokens"]),
        routed=routed,
        experts=experts,
    )


def three_axes_table(dp: list[dict], cp: list[dict], tp: list[dict], ep: list[dict]) -> str:
    """`tbl-three-axes`: what rank 0 and rank 1 held under each cut, and rank 0's traced communication.

    dp / cp / tp: the two ranks' results of the chapter's DP, sequence and TP cuts (tensors x, q, w_q, w_up,
    w_down and their events); ep: the four ranks' `seed_a_ep_worker` results (ranks 0 and 1 shown)."""

    def tp_holds(r):
        return (
            f"W_q[:, {2 * r}:{2 * r + 2}] {_shape(tp[r]['w_q'])} → Q {_shape(tp[r]['q'])}; "
            f"W_up {_shape(tp[r]['w_up'])}, W_down {_shape(tp[r]['w_down'])}"
        )

    rows = [
        ["DP", "batch", i18n.tr("sentence 1: x {shape}", shape=_shape(dp[0]["x"])),
         i18n.tr("sentence 2: x {shape}", shape=_shape(dp[1]["x"])),
         i18n.tr("✓ output; gradients after the all-reduce"),
         i18n.tr("forward: none; backward: {ops}", ops=_ops(dp[0]["events"]))],
        ["SP / CP", "seq", f"The cat, A dog: x {_shape(cp[0]['x'])}", f"sat here, ran fast: x {_shape(cp[1]['x'])}",
         i18n.tr("✓ ① ②; ③ needs the other half's K/V"), f"① ②: {_ops(cp[0]['events'])}"],
        ["TP", i18n.tr("d (the weights)"), tp_holds(0), tp_holds(1),
         i18n.tr("✓ Q side by side; MLP after the all-reduce"),
         i18n.tr("Q: none; MLP: {ops}", ops=_ops(tp[0]["events"]))],
        ["EP (MoE)", i18n.tr("experts (⑥ only)"), _ep_holds(ep[0]), _ep_holds(ep[1]),
         i18n.tr("✓ every token's MoE output"),
         _ops(ep[0]["events"])],
    ]  # fmt: skip
    caption = i18n.tr(
        "The three axes of [batch, seq, d] and the parallelism that cuts each, run on two real ranks with the "
        "model's weights (weights written [in, out], as in x W); EP on four ranks with article A's model turned into "
        "a mixture of 8 experts (ranks 2 and 3 hold experts 5-6 and 7-8)."
    )
    header = [
        "",
        i18n.tr("cuts"),
        i18n.tr("rank 0 holds"),
        i18n.tr("rank 1 holds"),
        i18n.tr("equals one device?"),
        i18n.tr("traced, rank 0"),
    ]
    return markdown_table(header, rows, caption=caption, name="tbl-three-axes")


def selection_guide_table(rows: list[list[str]]) -> str:
    """`tbl-selection-guide`: rows of `pylib.experiments.selection_guide` (symptom, remedy, number, computed with)."""
    caption = i18n.tr(
        "Article A's selection guide, each remedy with a number computed from pylib's formulas at real model sizes (a "
        "70B-class dense model; a DeepSeek-V3-like MoE for the EP row)."
    )
    header = [i18n.tr("symptom"), i18n.tr("remedy"), i18n.tr("the number behind it"), i18n.tr("computed with")]
    return markdown_table(header, rows, caption=caption, name="tbl-selection-guide")
