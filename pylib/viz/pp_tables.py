"""The pipeline chapter's tables, as MyST text: each function takes what a cell of book/part3/pp.md ran and measured
(and asserted) and returns the labelled table the page shows. Formatting only: the chapter's visible cells run the
ranks and check the claims.

    Markdown(stages(cfg_layers, held))       # tbl-pp-stages: which rank holds which layers
    Markdown(p2p(rows, ...))                 # tbl-pp-p2p: the point-to-point ops of one 1F1B step
"""

from __future__ import annotations

from pylib.tables import markdown_table

from ..i18n import tr


def _label(name: str, v: int) -> str:
    return name + (f", v = {v}" if v > 1 else "")


def stages(n_layers: int, held: dict) -> str:
    """tbl-pp-stages. held[(p, v)][r]: rank r's chunks as (chunk index, virtual stage, layer ids, is_first,
    is_last)."""
    rows = []
    for (p, v), per_rank in held.items():
        for r, chunks in enumerate(per_rank):
            parts = []
            for c, stage, layers, first, last in chunks:
                extra = (tr(" + embedding") if first else "") + (tr(" + ln_f, LM head, loss") if last else "")
                parts.append(
                    tr("chunk {c} = virtual stage {stage}: layers {layers}", c=c, stage=stage, layers=layers) + extra
                )
            rows.append([f"p = {p}, v = {v}", tr("rank {r}", r=r), tr("; ").join(parts)])
    return markdown_table(
        [tr("split"), tr("rank"), tr("what it holds")],
        rows,
        caption=tr(
            "The reference model's {n_layers} layers dealt out by `stage_layers` / `rank_chunks`: a plain "
            "pipeline, and an interleaved one with v = 2 chunks per rank (chunk c of rank r is virtual stage c·p + r).",
            n_layers=n_layers,
        ),
        name="tbl-pp-stages",
    )


def weights(rows: list[list], p: int) -> str:
    """tbl-pp-weights. rows: [weight (article B), what article B says, where it is held, its shapes]."""
    return markdown_table(
        [
            tr("weight (article B)"),
            tr("article B says (PP column)"),
            tr("held by (from `shard_specs`, p = {p})", p=p),
            tr("shape on that rank"),
        ],
        rows,
        caption=tr(
            "Article B's PP column, rebuilt from `shard_specs`: every weight is held whole ([out, in], as nn.Linear "
            "stores it) by exactly one rank."
        ),
        name="tbl-pp-weights",
    )


def p2p(
    counts: list[dict], sent: list[int], formula: list[int], p: int, n_microbatches: int, shape, message: int
) -> str:
    """tbl-pp-p2p. counts[r][(op, phase)]: rank r's traced sends / recvs; sent, formula: its bytes."""
    rows = [
        [
            tr("rank {r}", r=r),
            c["send", "forward"],
            c["recv", "forward"],
            c["send", "backward"],
            c["recv", "backward"],
            s,
            f,
        ]
        for r, (c, s, f) in enumerate(zip(counts, sent, formula))
    ]
    return markdown_table(
        [
            tr("rank"),
            tr("sends (fwd: activation)"),
            tr("recvs (fwd)"),
            tr("sends (bwd: gradient)"),
            tr("recvs (bwd)"),
            tr("bytes sent, traced"),
            tr("formula"),
        ],
        rows,
        caption=tr(
            "The point-to-point ops of one 1F1B step, p = {p}, m = {m} microbatches of [b, s, h] = "
            "{shape} float64 ({message} B each), traced on real ranks, against `p2p_bytes_per_rank`. All ranks "
            "together: {total} B = 2·(p−1)·m·b·s·h·8.",
            p=p,
            m=n_microbatches,
            shape=list(shape),
            message=message,
            total=sum(sent),
        ),
        name="tbl-pp-p2p",
    )


def equal(results: dict, p: int, n_microbatches: int, ref_loss: float) -> str:
    """tbl-pp-equal. results[(name, v)]: (loss on the last rank, |loss - reference|, gradients compared, max
    gradient error)."""
    rows = [
        [_label(name, v), f"{loss:.12f}", f"{loss_err:.1e}", n, f"{grad_err:.1e}"]
        for (name, v), (loss, loss_err, n, grad_err) in results.items()
    ]
    return markdown_table(
        [
            tr("schedule"),
            tr("loss (rank {r})", r=p - 1),
            tr("|loss − reference|"),
            tr("gradients compared"),
            tr("max |grad − reference|"),
        ],
        rows,
        caption=tr(
            "One training step of each schedule on {p} gloo ranks, m = {m}, against the single-device model "
            "(reference loss {ref_loss:.12f}). Every parameter's gradient is compared, each held by exactly one rank.",
            p=p,
            m=n_microbatches,
            ref_loss=ref_loss,
        ),
        name="tbl-pp-equal",
    )


def bubble_sweep(rows: list[dict], p: int) -> str:
    """tbl-pp-bubble. rows: schedule, m, formula, measured: schedule, measured: replay, share."""
    body = [
        [
            r["schedule"],
            r["m"],
            f"{r['formula']:.4f}",
            f"{r['measured: schedule']:.4f}",
            f"{r['measured: replay']:.4f}",
            f"{r['share']:.1%}",
        ]
        for r in rows
    ]
    return markdown_table(
        [
            tr("schedule"),
            "m",
            tr("formula (p−1)/(v·m)"),
            tr("schedule (simulated)"),
            tr("replay of the real run"),
            tr("share of the step (formula)"),
        ],
        body,
        caption=tr(
            "The bubble, idle time relative to compute time, mean over the {p} ranks: the formula, the "
            "simulated schedule and the replayed real run agree exactly.",
            p=p,
        ),
        name="tbl-pp-bubble",
    )


def in_flight(rows: list[dict], p: int, n_microbatches: int) -> str:
    """tbl-pp-inflight. rows: schedule, v, rank, measured, formula, per_mb (bytes per chunk), peak_bytes, bytes
    (the formula's cell)."""
    body = [
        [
            _label(r["schedule"], r["v"]),
            tr("rank {r}", r=r["rank"]),
            r["measured"],
            r["formula"],
            f"{r['formula'] / r['v']:g}",
            " / ".join(str(x) for x in r["per_mb"]),
            r["peak_bytes"],
            r["bytes"],
        ]
        for r in rows
    ]
    return markdown_table(
        [
            tr("schedule"),
            tr("rank"),
            tr("in flight, measured"),
            tr("formula"),
            tr("in stages' worth"),
            tr("bytes saved per microbatch (per chunk)"),
            tr("peak activation bytes, measured"),
            tr("formula: in flight × bytes"),
        ],
        body,
        caption=tr(
            "Peak microbatches in flight and peak activation memory per rank, p = {p}, m = {m}, measured on the "
            "real runs (bytes autograd saved for backward) against `peak_in_flight` and `activation_memory`.",
            p=p,
            m=n_microbatches,
        ),
        name="tbl-pp-inflight",
    )


def unscaled(rows: list[list]) -> str:
    """tbl-pp-unscaled. rows: [m, gradient norm ratio unscaled, scaled, logged loss]."""
    body = [[m, f"{a:.6f}", f"{b:.6f}", f"{loss:.6f}"] for m, a, b, loss in rows]
    return markdown_table(
        [
            "m",
            tr("‖grad‖ / ‖reference‖, loss not scaled"),
            tr("the same, loss / m (the fix)"),
            tr("logged loss (both)"),
        ],
        body,
        caption=tr(
            "1F1B on 4 ranks with and without dividing each microbatch's loss by m before its backward: "
            "unscaled, every gradient is exactly m times the reference; the logged loss cannot tell."
        ),
        name="tbl-pp-unscaled",
    )


def blocking(rows: list[list]) -> str:
    """tbl-pp-blocking. rows: [p, schedule, (t_f, t_b), formula, posted sends, blocking sends]."""
    body = [[p, name, f"{c[0]} : {c[1]}", f"{f:.4f}", f"{e:.4f}", f"{b:.4f}"] for p, name, c, f, e, b in rows]
    return markdown_table(
        [
            "p",
            tr("schedule"),
            "t_f : t_b",
            tr("formula"),
            tr("posted sends (simulated)"),
            tr("blocking sends (simulated)"),
        ],
        body,
        caption=tr(
            "Bubble with posted and with blocking sends, m = 8, from the simulator. Only the interleaved "
            "schedule, with a backward dearer than a forward, pays for blocking sends, and how much depends on p and "
            "the costs."
        ),
        name="tbl-pp-blocking",
    )
