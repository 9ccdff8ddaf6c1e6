"""The data-parallelism chapter's tables, as MyST text: each function takes what a cell of book/part3/dp.md ran and
measured (and asserted) and returns the labelled table the page shows. Formatting only: no function here runs a
rank or checks a claim; the chapter's visible cells do both.

    Markdown(operators(d, errors, all_reduces))           # tbl-dp-operators: article B's rule, one row per operator
    Markdown(zero_traffic(results, d, steps))             # tbl-zero-traffic: collectives and bytes per stage
    share(measured, zero_stage, "optim", d)                    # "whole", "1/d" or the ratio to DDP's
"""

from __future__ import annotations

from pylib.analysis.dp import held_bytes, paper_bytes
from pylib.plan.options import ZeroStage
from pylib.plan.options import zero_stage as as_zero_stage
from pylib.tables import markdown_table

from ..i18n import tr

_STATE = ("params", "grads", "optim")


def operators(d: int, err: dict, all_reduces: list[dict]) -> str:
    """tbl-dp-operators. err: y, loss, own (a rank's own gradient vs the full batch's), avg, ddp -- max errors;
    all_reduces: the traced all-reduce events of one rank."""
    n = len(all_reduces)
    payload = sum(e["payload_bytes"] for e in all_reduces)
    rows = [
        [
            tr("forward: every activation, e.g. `up_proj`'s output `[b/d, s, h_ffn]`"),
            tr("features $h$, whole"),
            tr("rank r's rows are the full batch's (max error {err:.0e})", err=err["y"]),
            tr("none"),
        ],
        [
            tr("loss: the mean over the rank's own tokens"),
            tr("tokens $b \\cdot s$, split"),
            tr("the mean of the {d} losses is the full-batch loss (max error {err:.0e})", d=d, err=err["loss"]),
            tr("none (a scalar)"),
        ],
        [
            tr("weight gradient $dW = X^\\top dY$, every parameter"),
            tr("tokens $b \\cdot s$, split"),
            tr(
                "a rank's own gradient is off by up to {own:.3f}; the average of the {d} is exact (max error "
                "{avg:.0e}), and so is what DDP leaves on every rank ({ddp:.0e})",
                own=err["own"],
                d=d,
                avg=err["avg"],
                ddp=err["ddp"],
            ),
            (
                tr("all-reduce in backward: {n} buckets, {payload:,} B = Ψ in all", n=n, payload=payload)
                if n > 1
                else tr("all-reduce in backward: {n} bucket, {payload:,} B = Ψ in all", n=n, payload=payload)
            ),
        ],
    ]
    return markdown_table(
        [
            tr("operator"),
            tr("contracts over"),
            tr("a rank vs one device on the whole batch"),
            tr("communication (traced)"),
        ],
        rows,
        caption=tr(
            "Article B's rule for data parallelism, run on {d} ranks: only the "
            "operator that contracts over the split batch axis needs a collective.",
            d=d,
        ),
        name="tbl-dp-operators",
    )


def all_reduce_two_ways(psi: int, runs: dict) -> str:
    """tbl-dp-allreduce. runs: d -> (max |AR - (RS+AG)|, {op: bytes sent}, formula bytes)."""
    rows = [
        [
            d,
            f"{psi:,}",
            *(f"{sent[op]:,}" for op in ("all_reduce", "reduce_scatter", "all_gather")),
            f"{formula:,}",
            f"{sent['all_reduce'] / psi:.3f}",
            f"{err:.0e}",
        ]
        for d, (err, sent, formula) in runs.items()
    ]
    return markdown_table(
        [
            "d",
            "Ψ (B)",
            tr("AR sent"),
            tr("RS sent"),
            tr("AG sent"),
            "2(d−1)/d · Ψ",
            tr("sent / Ψ"),
            tr("max |AR − (RS+AG)|"),
        ],
        rows,
        caption=tr(
            "Bytes each rank sends, traced: an all-reduce (AR) costs exactly a "
            "reduce-scatter (RS) plus an all-gather (AG)."
        ),
        name="tbl-dp-allreduce",
    )


def buckets(layouts_rows: list[dict], n_layers: int) -> str:
    """tbl-dp-buckets. layouts_rows: `pylib.dp.layout_table(layouts)`."""
    rows = [
        [t["key"], t["params"], f"`{t['first']}`", f"`{t['last']}`", f"{t['numel']:,}", f"{t['padded_bytes']:,}"]
        for t in layouts_rows
    ]
    return markdown_table(
        [tr("bucket"), tr("parameters"), tr("first"), tr("last"), tr("elements"), tr("bytes")],
        rows,
        caption=tr(
            "DDP's buckets for the {n_layers}-layer model with a 128 KiB cap: "
            "parameters in reverse order, the LM head first. A parameter is never "
            "split between buckets.",
            n_layers=n_layers,
        ),
        name="tbl-dp-buckets",
    )


def bucket_sizes(sweep: list[dict], caps, first_at: dict) -> str:
    """tbl-dp-bucket-size. sweep[r][cap]: layouts, ops, sent, overlap (an OverlapReport); first_at[cap]: when
    rank 0's first bucket left, as a share of backward."""
    rows = []
    for name in caps:
        per_rank = [run[name] for run in sweep]
        rows.append(
            [
                name,
                len(per_rank[0]["layouts"]),
                per_rank[0]["ops"],
                f"{per_rank[0]['sent']:,}",
                f"{first_at[name]:.0%}",
                " / ".join(f"{p['overlap'].hidden_fraction:.0%}" for p in per_rank),
                " / ".join(f"{1e3 * p['overlap'].exposed:.2f}" for p in per_rank),
            ]
        )
    return markdown_table(
        [
            tr("cap"),
            tr("buckets"),
            tr("all-reduces"),
            tr("bytes sent per rank"),
            tr("first launch (% of backward)"),
            tr("hidden"),
            tr("exposed ms"),
        ],
        rows,
        caption=tr(
            "The same step with three bucket caps on {len_sweep} ranks (gloo, CPU; "
            "times vary from run to run). Hidden and exposed: rank 0 / rank 1.",
            len_sweep=len(sweep),
        ),
        name="tbl-dp-bucket-size",
    )


def _ops(events: list[dict]) -> str:
    """'all-reduce ×3 (backward), ...' from one step's traced events."""
    count: dict = {}
    for e in events:
        count[e["op"], e["phase"]] = count.get((e["op"], e["phase"]), 0) + 1
    return ", ".join(f"{op.replace('_', '-')} ×{n} ({ph})" for (op, ph), n in count.items())


def zero_traffic(results: dict, d: int, steps: int) -> str:
    """tbl-zero-traffic. results[stage]: events (one step, rank 0), padding, sent, formula, loss_err, param_err."""
    rows = [
        [
            stage,
            _ops(r["events"]),
            f"{r['padding']}",
            f"{r['sent']:,}",
            f"{r['formula']:,}",
            f"{r['loss_err']:.0e}",
            f"{r['param_err']:.0e}",
        ]
        for stage, r in results.items()
    ]
    return markdown_table(
        [
            tr("stage"),
            tr("collectives per step (traced, rank 0)"),
            tr("padding (B)"),
            tr("sent per rank per step"),
            tr("formula"),
            tr("max loss error"),
            tr("max parameter error after {steps} steps", steps=steps),
        ],
        rows,
        caption=tr(
            "DDP and ZeRO-1/2/3 on {d} ranks, {steps} Adam steps (float64) against "
            "one device with the whole batch. Formulas: 2(d−1)/d·Ψ for DDP, ZeRO-1 "
            "and ZeRO-2, 3(d−1)/d·Ψ for ZeRO-3, with Ψ including ZeRO's padding.",
            d=d,
            steps=steps,
        ),
        name="tbl-zero-traffic",
    )


def share(measured: dict, zero_stage: ZeroStage, key: str, d: int) -> str:
    """What `zero_stage` (a `ZeroStage`, its int or its name) keeps of one kind of model state, relative to DDP:
    "whole", "1/d", or the ratio. measured: by stage name ("ddp", "zero1", ...)."""
    ratio = measured[as_zero_stage(zero_stage).key][key] / measured[ZeroStage.DDP.key][key]
    return "whole" if ratio > 0.99 else f"1/{d}" if ratio < 1.1 / d else f"{ratio:.2f}"


def zero_memory(measured: dict, formula: dict, d: int) -> str:
    """tbl-zero-memory. measured[stage]: a HeldBytes dict (params, grads, optim, total, peak_params, peak_grads);
    formula[stage]: `held_bytes`."""
    rows = []
    for stage, m in measured.items():
        f = formula[stage]
        transient = m["peak_params"] - m["params"] + m["peak_grads"] - m["grads"]
        rows.append(
            [
                stage,
                " · ".join(share(measured, stage, k, d) for k in _STATE),
                *(f"{m[k]:,} / {f[k]:,}" for k in _STATE),
                f"{m['total']:,}",
                f"{transient:,}",
            ]
        )
    return markdown_table(
        [
            tr("stage"),
            tr("keeps (params · grads · optim)"),
            tr("parameters B (measured / formula)"),
            tr("gradients B"),
            tr("optimizer B"),
            tr("total B"),
            tr("transient peak B"),
        ],
        rows,
        caption=tr(
            "Model state held by one of {d} ranks after a step (float64, Adam's "
            "two moments), measured against `held_bytes`. Transient: ZeRO-2's full "
            "buckets while their reduce-scatter runs, ZeRO-3's gathered unit.",
            d=d,
        ),
        name="tbl-zero-memory",
    )


def zero_paper(sizes, ds, zero_stages) -> str:
    """tbl-zero-paper: per-rank model state in GiB for each model size and d, the paper's mixed-precision Adam
    (`paper_bytes`) next to `held_bytes` in float32 and float64."""
    rows = []
    for psi in sizes:
        for d in ds:
            cells = []
            for s in zero_stages:
                paper = sum(paper_bytes(int(psi), d, s).values()) / 2**30
                fp32 = sum(held_bytes(int(psi), 4, d, s).values()) / 2**30
                fp64 = sum(held_bytes(int(psi), 8, d, s).values()) / 2**30
                cells.append(f"{paper:,.0f} · {fp32:,.0f} · {fp64:,.0f}")
            rows.append([f"{psi / 1e9:.0f}B", d, *cells])
    return markdown_table(
        [tr("model"), "d", tr("DDP"), tr("ZeRO-1"), tr("ZeRO-2"), tr("ZeRO-3")],
        rows,
        caption=tr(
            "Model state per rank in GiB, each cell *paper (2Ψ + 2Ψ + 12Ψ, "
            "mixed-precision Adam) · ours in float32 · ours in float64*. "
            "Activations come on top."
        ),
        name="tbl-zero-paper",
    )


def zero_mixed(mixed: dict, d: int, n_params: int) -> str:
    """tbl-zero-mixed. mixed[(stage, reduce dtype)]: (measured, formula, bytes per parameter), each measured /
    formula a dict of params, grads, optim bytes."""
    rows = []
    for (stage, reduce), (got, want, per_param) in mixed.items():
        total = sum(got.values())
        rows.append(
            [
                stage,
                reduce,
                *(f"{got[k]:,}" for k in _STATE),
                f"{total:,}",
                f"{per_param:g} Ψ",
                f"{total / sum(want.values()):.2f}",
            ]
        )
    return markdown_table(
        [
            tr("stage"),
            tr("reduce dtype"),
            tr("bf16 parameters B"),
            tr("gradients B"),
            tr("fp32 master + Adam B"),
            tr("total B"),
            tr("formula"),
            tr("measured / formula"),
        ],
        rows,
        caption=tr(
            "Model state one of {d} ranks holds in bf16 mixed precision, measured "
            "(Ψ = {n_params} parameters, padded to a multiple of d under ZeRO): "
            "the ZeRO paper's 16Ψ → 4Ψ + 12Ψ/d → 2Ψ + 14Ψ/d → 16Ψ/d, and "
            "Megatron's 6 + 12/d bytes per parameter for ZeRO-1 with fp32 "
            "gradients.",
            d=d,
            n_params=n_params,
        ),
        name="tbl-zero-mixed",
    )


def zero3_events(units: dict, per_unit: dict, cols: list[str], d: int) -> str:
    """tbl-zero3-events. units: unit -> full (padded) bytes; per_unit[unit][col]: bytes rank 0 sent."""
    rows = [[f"`{u}`", f"{units[u]:,}", *(f"{per_unit[u].get(c, 0):,}" for c in cols)] for u in units]
    total = {c: sum(per_unit[u].get(c, 0) for u in units) for c in cols}
    rows.append([tr("all units"), f"{sum(units.values()):,}", *(f"{total[c]:,}" for c in cols)])
    return markdown_table(
        [tr("unit"), tr("full bytes (padded)"), *(tr("{column}, sent B", column=c) for c in cols)],
        rows,
        caption=tr(
            "ZeRO-3 on {d} ranks, one step, rank 0: every unit is gathered twice and reduce-scattered once.", d=d
        ),
        name="tbl-zero3-events",
    )


def dp_cp(runs: dict) -> str:
    """tbl-dp-cp. runs[group name]: (the (op, axis) pairs traced on rank 0, max error vs one device, how far the
    two cp ranks of one replica differ)."""
    rows = [
        [
            f'"{group}"',
            ", ".join(tr("{op} over {axis}", op=op.replace("_", "-"), axis=axis) for op, axis in ops),
            f"{err:.1e}",
            f"{split:.1e}",
        ]
        for group, (ops, err, split) in runs.items()
    ]
    return markdown_table(
        [
            tr("gradients averaged over"),
            tr("collectives (traced)"),
            tr("max error vs one device"),
            tr("cp ranks of a replica differ by"),
        ],
        rows,
        caption=tr(
            "DP × CP on 4 ranks (dp = 2, cp = 2): only averaging over the dp-cp "
            "group gives every rank the full-batch gradient."
        ),
        name="tbl-dp-cp",
    )


def dp_ep(runs: dict) -> str:
    """tbl-dp-ep. runs[(wrapper, divided by dp x cp?)]: (min and max ratio of an expert gradient to the reference,
    dense max error)."""
    rows = [
        [stage, "4 (dp × cp)" if divide else tr("2 (edp: an average)"), f"{lo:.6f} … {hi:.6f}", f"{dense:.0e}"]
        for (stage, divide), (lo, hi, dense) in runs.items()
    ]
    return markdown_table(
        [
            tr("wrapper"),
            tr("expert sum over edp divided by"),
            tr("expert gradient / reference (all experts, all ranks)"),
            tr("dense max error"),
        ],
        rows,
        caption=tr(
            "DP × EP on 4 ranks (dp = 4, ep = 2, edp = 2): expert gradients "
            "reduced over edp are right only when divided by the dense dp × cp "
            "size; averaged over edp they are ep = 2 times too large."
        ),
        name="tbl-dp-ep",
    )


def sum_vs_avg(by_op: dict, d: int) -> str:
    """tbl-dp-sum. by_op[op]: (gradient / full-batch gradient, SGD step / correct step, Adam's largest relative
    error of an element)."""
    rows = [[f"`{op}`", f"{ratio:.6f}", f"{sgd:.6f}", f"{adam:.1e}"] for op, (ratio, sgd, adam) in by_op.items()]
    return markdown_table(
        [
            tr("all-reduce op"),
            tr("gradient / full-batch gradient"),
            tr("SGD step / correct step"),
            tr("Adam step: largest relative error of an element"),
        ],
        rows,
        caption=tr(
            "The LM head's gradient on {d} ranks, reduced with an average and with a sum, and the step each makes.", d=d
        ),
        name="tbl-dp-sum",
    )


def unused(runs: list[dict]) -> str:
    """tbl-dp-unused. runs[r]: naive (the buckets "when ready" would launch, in order), traced (what pylib.dp
    launched)."""
    rows = [[f"rank {r}", " → ".join(run["naive"]), " → ".join(run["traced"])] for r, run in enumerate(runs)]
    return markdown_table(
        [tr("rank"), tr("launch when ready (would issue)"), tr("pylib.dp, traced (did issue)")],
        rows,
        caption=tr(
            'The order of bucket all-reduces on each rank. "When ready" would pair '
            "rank 0's bucket of head A with rank 1's of head B, and neither would "
            "ever launch the other's."
        ),
        name="tbl-dp-unused",
    )


def accumulate(variants: dict, k: int, d: int) -> str:
    """tbl-dp-accumulate. variants[label]: (bytes sent per rank, that / one all-reduce of Psi, gradient / full-batch
    gradient, max error)."""
    rows = [
        [label, f"{sent:,}", f"{times:g}", f"{ratio:.6f}", f"{err:.0e}"]
        for label, (sent, times, ratio, err) in variants.items()
    ]
    return markdown_table(
        [
            tr("variant"),
            tr("bytes sent per rank"),
            tr("× one all-reduce of Ψ"),
            tr("gradient / full-batch gradient"),
            tr("max error"),
        ],
        rows,
        caption=tr(
            "Gradient accumulation over k = {k} micro-batches per rank on {d} "
            "ranks, against one device on the whole batch.",
            k=k,
            d=d,
        ),
        name="tbl-dp-accumulate",
    )
