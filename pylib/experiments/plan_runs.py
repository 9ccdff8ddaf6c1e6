"""The planner's plans run for real: one training step of the composed model per plan, on every rank, recording
what each rank held and sent, for `pylib.viz.planner.compare` to set against the predictions.

    records = measure_plans(cfg, plans, batch=8, seq=16)   # {plan: [one record per rank]}
"""

from __future__ import annotations

from pylib.runtime import launch

from .compose_training import train


def _measure(cfg, plans, batch: int, seq: int) -> list[dict]:
    """Inside each launched rank: one training step of every plan (`compose_training.train`), what the rank held
    and moved. Traffic is summed per (axis, phase) from the tracer's events."""
    out = []
    for plan in plans:
        r = train(cfg, plan.par, plan.run_options, steps=1, batch=batch, seq=seq, record=("events",))
        traffic: dict[str, dict[str, int]] = {}
        for e in r["events"][0]:
            by_phase = traffic.setdefault(e["axis"], {})
            by_phase[e["phase"]] = by_phase.get(e["phase"], 0) + e["bytes_sent"]
        rows: dict[int, int] = {}
        for layer, _send, _recv, etp_rows in r["moe_routing"]:  # forwards in order: microbatch 0 comes first
            rows.setdefault(layer, sum(etp_rows))
        out.append(
            dict(
                rank=r["rank"],
                coords=r["coords"],
                memory={k: r["memory"][k] for k in ("params", "grads", "optim")},
                activation_bytes=dict(r["activation_bytes"]),
                peak_activation_bytes=r["peak_activation_bytes"],
                expert_rows=rows,
                moe_routing=list(r["moe_routing"]),
                traffic=traffic,
            )
        )
    return out


def measure_plans(cfg, plans, *, batch: int, seq: int, timeout: float = 240.0) -> dict:
    """{plan: [one record per rank]}: every plan run for one step by `pylib.compose`, one launch per world size."""
    by_world: dict[int, list] = {}
    for plan in plans:
        by_world.setdefault(plan.par.world_size, []).append(plan)
    out = {}
    for world, group in by_world.items():
        results = launch(_measure, world, cfg, group, batch, seq, backend="gloo", timeout=timeout)
        for i, plan in enumerate(group):
            out[plan] = [r[i] for r in results]
    return out
