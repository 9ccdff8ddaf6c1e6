"""What each rank holds and moves: the per-rank memory and traffic table of a composed run, and the FFN probe.

    results = launch(train, 16, cfg, pc, ...)   # train: pylib.experiments.compose_training
    print(format_report(results))            # rank | tp cp dp pp ep | layers | params grads optim | act | traffic

`ffn_probe(modules)` measures the FFN intermediate activation (the input of every `down_proj`: [b, s, h_ffn] on one
device, [b/dp, s/cp, h_ffn/tp] on a rank of the composed model, [rows, h_ffn/etp] inside an expert) -- article B's
superposition claim is that the per-rank bytes are 1/(tp*cp*dp) of the single-device ones.
"""

from __future__ import annotations

from pylib.analysis.compose import Traffic, per_axis, step_traffic
from pylib.i18n import columns, tr
from pylib.model import batches, build_model
from pylib.plan.options import RunOptions

from .probe import ffn_probe


def reference_ffn_bytes(cfg, *, batch: int, seq: int, data: str = "random", step: int = 0) -> dict[int, int]:
    """The FFN hidden bytes per layer of the single-device model on the whole global batch."""
    model = build_model(cfg)
    ids, targets = batches(cfg, batch, seq, step, data=data)
    with ffn_probe([("", model)]) as found:
        model.loss(ids, targets)
    return dict(found)


# The options of `train` / `ParallelTransformer.from_full` that change what a step sends.
TRAFFIC_OPTIONS = ("sequence_parallel", "cp_kind", "n_microbatches", "v", "zero_stage")


def formula_traffic(
    cfg, par, record: dict, options: RunOptions = RunOptions(), *, batch: int, seq: int
) -> list[Traffic]:
    """What the per-mode formulas (`pylib.analysis.compose.step_traffic`) say one rank of a `train` run sends in a
    step: evaluated at the rank's coordinates, on its own flat buffers and, for MoE layers, on the routing its step
    produced. `options`: the run's `RunOptions` (the fields outside TRAFFIC_OPTIONS are taken at their defaults)."""
    return step_traffic(
        cfg,
        par,
        RunOptions(**{k: getattr(options, k) for k in TRAFFIC_OPTIONS}),
        batch=batch,
        seq=seq,
        coords=record["coords"],
        layouts=record["layouts"],
        moe_routing=record["moe_routing"],
    )


def traced_traffic(record: dict, step: int = 0) -> dict[str, dict]:
    """{axis: {"bytes_sent", "ops"}} the tracer recorded for one rank of a `train` run in `step`: the shape of
    `per_axis(formula_traffic(...))`, so the two compare with ==."""
    return {a: dict(bytes_sent=t["bytes_sent"], ops=t["ops"]) for a, t in record["traffic"][step].items()}


def traffic_matches_formulas(cfg, par, record: dict, options: RunOptions = RunOptions(), *, batch: int, seq: int):
    """Whether the rank's traced step-0 traffic equals the formulas on every axis, bytes and op counts."""
    return traced_traffic(record) == per_axis(formula_traffic(cfg, par, record, options, batch=batch, seq=seq))


def _mib(n: float) -> str:
    return f"{n / 1024:.1f}K" if n < 1024 * 1024 else f"{n / 2**20:.2f}M"


def report_rows(results: list[dict]) -> list[dict]:
    """One row per rank: coordinates, layers held, model-state bytes, peak saved-activation bytes, traffic per
    axis (bytes sent and op count) in step 0, and the mean step time."""
    rows = []
    for r in results:
        traffic = r["traffic"][0]
        rows.append(
            dict(
                rank=r["rank"],
                **{k: r["coords"][k] for k in ("tp", "cp", "dp", "pp", "ep", "etp", "edp")},
                layers=[i for chunk in r["stage_layers"] for i in chunk],
                params=r["memory"]["params"],
                grads=r["memory"]["grads"],
                optim=r["memory"]["optim"],
                activations=r["peak_activation_bytes"],
                traffic={a: (t["bytes_sent"], sum(t["ops"].values())) for a, t in traffic.items()},
                step_s=sum(r["times"][1:]) / max(1, len(r["times"]) - 1) if len(r["times"]) > 1 else r["times"][0],
            )
        )
    return rows


def format_report(results: list[dict], axes: tuple[str, ...] | None = None) -> str:
    """The per-rank table as aligned text (bytes in KiB / MiB; traffic as bytes sent / ops per axis)."""
    rows = report_rows(results)
    if axes is None:
        seen = []
        for r in rows:
            for a in r["traffic"]:
                if a not in seen:
                    seen.append(a)
        order = ["tp", "cp", "ep", "etp", "pp", "dp-cp", "edp", "tp-cp"]
        axes = tuple(sorted(seen, key=lambda a: order.index(a) if a in order else len(order)))
    head = [
        tr("rank"),
        "tp",
        "cp",
        "dp",
        "pp",
        "ep",
        tr("layers"),
        tr("params"),
        tr("grads"),
        tr("optim"),
        tr("act"),
        *axes,
        tr("step ms"),
    ]
    lines = []
    table = [head]
    for r in rows:
        cells = [
            str(r["rank"]),
            *(str(r[k]) for k in ("tp", "cp", "dp", "pp", "ep")),
            ",".join(map(str, r["layers"])),
            _mib(r["params"]),
            _mib(r["grads"]),
            _mib(r["optim"]),
            _mib(r["activations"]),
        ]
        for a in axes:
            sent, ops = r["traffic"].get(a, (0, 0))
            cells.append(f"{_mib(sent)}/{ops}" if ops else "-")
        cells.append(f"{1000 * r['step_s']:.0f}")
        table.append(cells)
    widths = [max(columns.width(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        lines.append("  ".join(columns.rjust(c, w) for c, w in zip(row, widths)))
    return "\n".join(lines)


def format_reduction_table(rows: list[dict]) -> str:
    """The reduction table with layer numbers folded ("layers.*.ln1.weight"), one line per distinct rule."""
    seen = {}
    for r in rows:
        parts = r["name"].split(".")
        if parts[0] == "layers":
            parts[1] = "*"
        if "experts" in parts:
            i = parts.index("experts")
            if i + 2 < len(parts) and parts[i + 1] == "experts":
                parts[i + 2] = "*"
        key = ".".join(parts)
        seen.setdefault(key, r)
    head = [tr("parameter"), tr("kind"), tr("then sum over"), tr("DP average over"), tr("scale")]
    table = [head] + [
        [k, r["kind"], r["pre"] or "-", f"{r['dp_group']} ({r['dp_size']})", r["scale"]] for k, r in seen.items()
    ]
    widths = [max(columns.width(row[i]) for row in table) for i in range(len(head))]
    return "\n".join("  ".join(columns.ljust(c, w) for c, w in zip(row, widths)).rstrip() for row in table)
