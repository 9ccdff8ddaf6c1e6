"""Training loops: the composed model inside launched ranks, and the single-device reference it must equal.

    results = launch(train, 16, cfg, ParallelConfig(tp=2, cp=2, dp=2, pp=2), steps=5, batch=8, seq=16)
    ref = train_reference(cfg, steps=5, batch=8, seq=16)
    results[r]["losses"] == ref["losses"]; results[r]["params"] are pieces of ref["params"]
    compare_with_reference(results, ref)     # the largest loss and parameter differences, and what no rank held

Both take the same global batches (`pylib.model.batches`: the synthetic uniform tokens of `random_tokens`, or a
generated "pattern" language whose next token is predictable, so a few steps visibly lower the loss) and the same
optimizer (Adam by default). A parameter that gets no gradient in a step (an expert no token chose) takes an Adam
step with a zero gradient in both, as ZeRO's flat shards do.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace

import torch

from pylib.compose import ParallelTransformer, ffn_probe, holder_labels
from pylib.model import MoE, batches, build_model
from pylib.plan.options import RunOptions
from pylib.runtime import Mesh, ParallelConfig, clock, current_device
from pylib.runtime.tracer import trace


def _traffic(tr) -> dict:
    """Per axis: bytes sent, payload bytes, op counts by op name, and op counts by phase and op, from a trace."""
    out: dict[str, dict] = {}
    for e in tr.events:
        row = out.setdefault(e.axis, dict(bytes_sent=0, bytes_recv=0, payload_bytes=0, ops={}, phases={}))
        row["bytes_sent"] += e.bytes_sent
        row["bytes_recv"] += e.bytes_recv
        row["payload_bytes"] += e.payload_bytes
        row["ops"][e.op] = row["ops"].get(e.op, 0) + 1
        by_phase = row["phases"].setdefault(e.phase, {})
        by_phase[e.op] = by_phase.get(e.op, 0) + 1
    return out


LR = 1e-2  # Adam's learning rate in `train` and `train_reference`


def train(
    model_cfg,
    par: ParallelConfig,
    options: RunOptions = RunOptions(),
    *,
    steps: int = 5,
    batch: int = 8,
    seq: int = 16,
    data: str = "random",
    data_seed: int = 0,
    record: tuple[str, ...] = (),
    activation_probe: str = "stage",
    **model_kw,
) -> dict:
    """Inside a launched rank: `steps` optimizer steps of the composed model, run with `options` (a
    `pylib.plan.RunOptions`), on the global batches.

    model_kw go to `ParallelTransformer.from_full` (bucket_bytes, optimizer, precision, the optimizer's keywords;
    lr defaults to `LR`). Returns this rank's record: losses (global, per step), local_losses (its replica's,
    last-stage ranks), params (`parameter_pieces()` after the last step), memory (held bytes after step 0),
    activation bytes (step 0), traffic per axis per step (from the tracer), step times, the reduction table, the
    routing of step 0 (MoE), per step each held MoE layer's routed counts on this rank (expert_counts) and its
    expert bias after the step (expert_bias), and the layouts of the data-parallel buffers. record: what else to
    keep, "events" (every traced op of every step) and "ffn" (the FFN hidden bytes per held layer in step 0,
    `ffn_probe`)."""
    bad = set(record) - {"events", "ffn"}
    if bad:
        raise ValueError(f"record={record!r}: {sorted(bad)} not among ('events', 'ffn')")
    keep_events, probe_ffn = "events" in record, "ffn" in record
    mesh = Mesh(par)
    full = build_model(model_cfg).to(current_device())  # the rank's GPU under NCCL, else the CPU
    model_kw = {"lr": LR} | model_kw
    model = ParallelTransformer.from_full(full, mesh, options, batch=batch, seq=seq, **model_kw)
    out = dict(
        rank=mesh.global_rank,
        coords={k: mesh[k].rank for k in ("tp", "cp", "dp", "pp", "ep", "etp", "edp", "dp-cp")},
        losses=[],
        local_losses=[],
        traffic=[],
        times=[],
        events=[],
        expert_counts=[],
        expert_bias=[],
    )
    for step in range(steps):
        ids, targets = batches(model_cfg, batch, seq, step, data=data, seed=data_seed)
        probe = ffn_probe([("", s) for s in model.stages]) if probe_ffn and step == 0 else nullcontext({})
        with trace() as tr, probe as ffn:
            t0 = clock.device_now()
            res = model.step(ids, targets, measure_memory=step == 0, activation_probe=activation_probe)
            out["times"].append(clock.device_now() - t0)
        if step == 0 and probe_ffn:
            out["ffn_hidden_bytes"] = dict(ffn)
        _record_step(out, res, tr, keep_events)
        out["expert_counts"].append({k: v.tolist() for k, v in res.expert_counts.items()})
        out["expert_bias"].append(
            {i: moe.router.expert_bias.detach().clone() for s in model.stages for i, moe in s.moe_layers().items()}
        )
        if step == 0:
            _record_first_step(out, model, res)
    return _record_model(out, model)


def _record_step(out: dict, res, tr, keep_events: bool) -> None:
    """Every step: the global and the replica's loss, the traffic per axis, and (keep_events) every traced op."""
    out["losses"].append(res.loss)
    out["local_losses"].append(res.local_loss)
    out["traffic"].append(_traffic(tr))
    if keep_events:
        out["events"].append([e.as_dict() for e in tr.events])


def _record_first_step(out: dict, model, res) -> None:
    """Step 0: held bytes, activation bytes and their peak, the microbatches in flight, the reduced gradients and
    the MoE routing."""
    out["memory"] = model.memory().as_dict()
    out["activation_bytes"] = res.activation_bytes
    out["peak_activation_bytes"] = res.peak_activation_bytes
    out["peak_in_flight"] = res.peak_in_flight
    out["reduced"] = res.reduced
    out["moe_routing"] = res.moe_routing


def _record_model(out: dict, model) -> dict:
    """After the last step: the parameter pieces, the reduction table, shard specs, buffer layouts, the layers
    held and whether this rank holds the first (embedding) and the last (LM head) stage."""
    out["params"] = model.parameter_pieces()
    out["reduction_table"] = model.reduction_table()
    out["shard_specs"] = model.shard_specs()
    out["layouts"] = model.layouts
    out["stage_layers"] = [s.layer_ids for s in model.stages]
    out["holds_first"] = any(s.is_first for s in model.stages)
    out["holds_last"] = any(s.is_last for s in model.stages)
    return out


def train_reference(
    model_cfg,
    *,
    steps: int = 5,
    batch: int = 8,
    seq: int = 16,
    lr: float = LR,
    data: str = "random",
    data_seed: int = 0,
    optimizer=torch.optim.Adam,
    like: tuple[ParallelConfig, RunOptions] | None = None,
) -> dict:
    """The same steps on one device: the whole global batch, the reference model, `optimizer(lr=lr)`.
    Returns losses (per step), params (name -> tensor after the last step) and expert_bias (per step, MoE layer
    -> its bias after the step). With cfg.moe.bias_update_rate > 0 every MoE layer's expert bias is updated once
    per step from the counts of the whole global batch.

    like=(par, options), the composed run's `ParallelConfig` and `RunOptions`: for MoE models with
    auxiliary losses or a capacity factor, reproduce the composed run's grouping on one device -- the batch is run
    as dp*m groups (a data-parallel replica's microbatch each), each group's aux loss weighted 1/(dp*m), each
    token's capacity counted among the tokens of the rank that holds it (`MoE.drop_groups`). The mean
    cross-entropy, and without aux losses and dropping the gradients too, are those of the plain reference.

    Runs on one intra-op thread (restored afterwards): at these sizes more threads only contend with the ranks."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train_reference(model_cfg, steps, batch, seq, lr, data, data_seed, optimizer, like)
    finally:
        torch.set_num_threads(threads)


def _train_reference(model_cfg, steps, batch, seq, lr, data, data_seed, optimizer, like) -> dict:
    groups, labels = 1, None
    cfg = model_cfg
    if like is not None:
        par, options = like
        groups = par.dp * options.n_microbatches
        tp = par.tp if options.sequence_parallel else 1
        labels = holder_labels(seq, par.cp, tp, options.cp_layout)
        if cfg.moe is not None:
            moe = cfg.moe
            cfg = cfg.with_(
                moe=replace(moe, aux_loss_coef=moe.aux_loss_coef / groups, z_loss_coef=moe.z_loss_coef / groups)
            )
    model = build_model(cfg)
    moes = [m for m in model.modules() if isinstance(m, MoE)]
    opt = optimizer(model.parameters(), lr=lr)
    out = dict(losses=[], times=[], expert_bias=[])
    for step in range(steps):
        ids, targets = batches(model_cfg, batch, seq, step, data=data, seed=data_seed)
        t0 = clock.device_now()
        b = batch // groups
        total = 0.0
        for g in range(groups):
            rows = slice(g * b, (g + 1) * b)
            for moe in moes:
                moe.drop_groups = None if labels is None else labels.expand(b, seq)
            loss = model.loss(ids[rows], targets[rows])
            (loss / groups).backward()
            total += loss.item() / groups
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if cfg.moe is not None and cfg.moe.bias_update_rate:  # the whole step's counts, as the composed model
            for moe in moes:
                moe.update_expert_bias()
        opt.step()
        opt.zero_grad(set_to_none=False)
        out["times"].append(clock.device_now() - t0)
        out["losses"].append(total)
        out["expert_bias"].append({i: m.router.expert_bias.detach().clone() for i, m in _moe_by_layer(model)})
    out["params"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return out


def _moe_by_layer(model) -> list[tuple[int, MoE]]:
    return [(i, layer.mlp) for i, layer in enumerate(model.layers) if isinstance(layer.mlp, MoE)]


def compare_with_reference(results: list[dict], ref: dict) -> dict:
    """Largest differences of the ranks' losses and held parameter pieces from the reference run."""
    loss_err = max(abs(a - b) for r in results for a, b in zip(r["losses"], ref["losses"]))
    param_err, covered = 0.0, {}
    for r in results:
        for name, index, lo, hi, t in r["params"]:
            want = ref["params"][name][index].reshape(-1)[lo:hi]
            param_err = max(param_err, float((t - want).abs().max()) if t.numel() else 0.0)
            covered.setdefault(name, set()).add((str(index), lo, hi))
    missing = sorted(set(ref["params"]) - set(covered))
    return dict(loss_err=loss_err, param_err=param_err, missing=missing)
