"""Article B's claims measured inside launched ranks: each parallel mode built from the reference model, run for one
training step under the tracer, with `pylib.seedcheck.activation_probe.ActivationProbe` recording the local shape
of every weight and activation article B lists.

    launch(probe_modes, n, cfg, moe_cfg, b=8, s=16)      # -> per rank: {mode: record}
    launch(probe_compose, world, cfg, ParallelConfig(...), b, s, RunOptions(...))   # every mode on one mesh (compose)
    launch(sp_without_tp, n, cfg, b, s)                  # article B's FAQ: sequence parallelism with no TP

Weight shapes are torch's [out, in] (article B writes [in, out]). Every function returns plain data (tuples, dicts,
the tracer's events as dicts), so the results cross the process boundary and the book prints them;
`pylib.seedcheck` judges them against article B's tables.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from pylib.compose import ParallelTransformer, ffn_probe
from pylib.cp import CPTransformer, shard_sequence
from pylib.cp.layout import sequence_positions
from pylib.dp import DistributedDataParallel, micro_batch
from pylib.ep import ExpertParallelMoE
from pylib.model import build_model, random_hidden, random_tokens, saved_activations, torch_dtype
from pylib.plan.options import CP_KIND, CP_LAYOUT, RunOptions
from pylib.pp import PipelineParallel
from pylib.runtime import Mesh, ParallelConfig, current_device, trace
from pylib.runtime import collectives as C
from pylib.seedcheck.activation_probe import ActivationProbe
from pylib.tp import TPBlock, TPTransformer, scatter_to_sequence_parallel_region

# ------------------------------------------------------------------------------------------------ records


def _params(module) -> dict[str, tuple[int, ...]]:
    return {n: tuple(p.shape) for n, p in module.named_parameters()}


def _events(tr) -> list[dict]:
    out = []
    for e in tr.events:
        d = e.as_dict()
        d.pop("extra", None)
        out.append(d)
    return out


def _specs(specs) -> list[dict]:
    return [
        dict(
            name=s.name,
            axis=s.axis,
            dim=s.dim,
            kind=s.kind,
            full=tuple(s.full_shape),
            local=tuple(s.local_shape),
            note=s.note,
        )
        for s in specs
    ]


def _record(params, probe, tr, specs=(), **extra) -> dict:
    return dict(
        params=params,
        acts=dict(probe.shapes),
        scores=list(probe.scores),
        expert_rows=list(probe.expert_rows),
        events=_events(tr),
        specs=_specs(specs),
        **extra,
    )


# ------------------------------------------------------------------------------------------------ each mode alone


def _tp(model, ids, targets, group, sequence_parallel):
    tp = TPTransformer.from_full(model, group=group, sequence_parallel=sequence_parallel)
    probe = ActivationProbe().watch_layer(tp.layers[0]).watch_head(tp.lm_head)
    with trace() as tr:
        tp.loss(ids, targets).backward()
        tp.finalize_grads()
    probe.remove()
    return _record(_params(tp), probe, tr, tp.shard_specs())


def _cp(model, ids, targets, group, layout, kind=CP_KIND):
    g = C.resolve_group(group)
    cp = CPTransformer.from_full(model, group=g, layout=layout, kind=kind)
    probe = ActivationProbe().watch_layer(cp.layers[0]).watch_head(cp.lm_head)
    mine = [shard_sequence(t, 1, g.rank, g.size, layout) for t in (ids, targets)]
    with trace() as tr:
        cp.loss(*mine).backward()  # the weight gradients' sum over cp is DP's all-reduce over dp x cp in Megatron
    probe.remove()
    b, s = ids.shape
    return _record(_params(cp), probe, tr, cp.shard_specs(b, s), positions=cp.positions(s // g.size).tolist())


def _dp(model, ids, targets, group):
    g = C.resolve_group(group)
    ddp = DistributedDataParallel(model, group=g)
    probe = ActivationProbe().watch_layer(model.layers[0]).watch_head(model.lm_head)
    mine = [micro_batch(t, g.rank, g.size) for t in (ids, targets)]
    with trace() as tr:
        model.loss(*mine).backward()
        ddp.finish_gradient_sync()
    probe.remove()
    return _record(_params(model), probe, tr, ddp.shard_specs())


def _pp(model, ids, targets, group, n_microbatches):
    pipe = PipelineParallel(model, group=group)
    chunk = pipe.chunks[0]
    probe = ActivationProbe().watch_layer(next(iter(chunk.layers.values())))
    if chunk.lm_head is not None:
        probe.watch_head(chunk.lm_head)
    big = [t.repeat(n_microbatches, 1) for t in (ids, targets)]  # m micro-batches of b sequences each
    with trace() as tr:
        pipe.step(*big, schedule="1f1b", n_microbatches=n_microbatches)
    probe.remove()
    params = {n: tuple(p.shape) for n, p in pipe.named_parameters()}
    return _record(params, probe, tr, pipe.shard_specs(), layers=chunk.layer_ids, stage=chunk.stage)


def _ep(moe_model, ids, targets, group, etp_group=None):
    specs = []
    for layer in moe_model.layers:
        if hasattr(layer.mlp, "router"):
            layer.mlp = ExpertParallelMoE.from_full(layer.mlp, ep_group=group, etp_group=etp_group)
            specs = layer.mlp.shard_specs()
    first_moe = next(layer for layer in moe_model.layers if hasattr(layer.mlp, "router"))
    probe = ActivationProbe().watch_layer(first_moe).watch_head(moe_model.lm_head)
    with trace() as tr:
        moe_model.loss(ids, targets).backward()
    probe.remove()
    return _record(_params(moe_model), probe, tr, specs, expert_ids=list(first_moe.mlp.expert_ids))


def probe_modes(
    cfg,
    moe_cfg,
    b: int,
    s: int,
    *,
    layout: str = CP_LAYOUT,
    n_microbatches: int = 2,
    kv_replicated_cfg=None,
    ulysses: bool = False,
) -> dict:
    """Inside each of n launched ranks: every mode alone on the whole world group (N = n for each), one training
    step each, under the tracer, with the probe's hooks. `cfg` is a dense model (TP, SP: pylib's TP model shards
    dense layers), `moe_cfg` the same with MoE layers (CP, DP, PP, EP; and ETP = 2 with EP = n/2 on a
    tp2 x dp(n/2) mesh when n is even). Every rank starts from the same reference weights and batch (ids
    [b, s], or [m b, s] as m micro-batches for PP); EP ranks route different sequences (seeded by rank), as the
    data-parallel ranks EP is folded over would.
    ulysses: also CP with Ulysses (mode "CP ulysses"); kv_replicated_cfg: also TP on a model whose K/V heads
    are fewer than the ranks (mode "TP kv-replicated").

    Returns {mode: record} with record = params (this rank's parameter shapes), acts (article B's activations),
    scores (every score block), events (the trace), specs (the module's ShardSpecs), and mode extras."""

    rank, n = dist.get_rank(), dist.get_world_size()
    device = current_device()  # the rank's GPU under NCCL

    def build(c):
        return build_model(c).to(device)

    ids, targets = (t.to(device) for t in random_tokens(cfg, b, s, seed=0))
    out = {
        "reference": dict(params=_params(build(cfg)), moe_params=_params(build(moe_cfg))),
        "TP": _tp(build(cfg), ids, targets, None, False),
        "SP": _tp(build(cfg), ids, targets, None, True),
        "CP": _cp(build(moe_cfg), ids, targets, None, layout),
        "DP": _dp(build(moe_cfg), ids, targets, None),
        "PP": _pp(build(moe_cfg), ids, targets, None, n_microbatches),
    }
    ep_ids, ep_targets = (t.to(device) for t in random_tokens(moe_cfg, b, s, seed=100 + rank))
    out["EP"] = _ep(build(moe_cfg), ep_ids, ep_targets, None)
    if ulysses:
        out["CP ulysses"] = _cp(build(cfg), ids, targets, None, layout, kind="ulysses")
    if kv_replicated_cfg is not None:
        out["TP kv-replicated"] = _tp(build(kv_replicated_cfg), ids, targets, None, False)
    if n % 2 == 0:
        mesh = Mesh(ParallelConfig(tp=2, dp=n // 2, ep=n // 2, etp=2))
        out["ETP"] = _ep(build(moe_cfg), ep_ids, ep_targets, mesh.ep, mesh.etp)
        out["ETP"]["etp"] = mesh.etp.size
    out["rank"] = rank
    return out


# ------------------------------------------------------------------------------------------------ composed


def probe_compose(cfg, par, batch: int, seq: int, options: RunOptions = RunOptions(), *, variants=None) -> dict:
    """Inside each rank of `par`'s world: the composed model (`pylib.compose.ParallelTransformer`, every mode on
    one mesh) takes one training step on the global batch [batch, seq] under the tracer, with the probe's hooks on
    the first layer this rank holds (and on the LM head on the last stage) and `pylib.compose.ffn_probe` on every
    layer it holds, run with `options`. `variants` {name: RunOptions} runs several models one after the other (each on a
    mesh of its own); the default is one, named "model".

    Returns {variant: record}: params (local parameter shapes, the reference's names; experts numbered locally),
    acts and scores of that first layer, ffn (FFN intermediate bytes per held layer), events (the trace), loss (the
    global batch's mean loss), coords (index along each axis), layers (the layers it holds), and its
    positions (CP) and rows (DP) of the global batch."""
    ids, targets = random_tokens(cfg, batch, seq, seed=0)  # `step` moves them to the model's device
    out = {}
    for name, run_options in (variants or {"model": options}).items():
        mesh = Mesh(par)
        full = build_model(cfg).to(current_device())  # the rank's GPU under NCCL
        model = ParallelTransformer.from_full(full, mesh, run_options, batch=batch, seq=seq)
        first = model.stages[0]
        probe = ActivationProbe().watch_layer(next(iter(first.layers.values())))
        last = model.stages[-1]
        if last.lm_head is not None:
            probe.watch_head(last.lm_head)
        params = {n: tuple(p.shape) for s in model.stages for n, p in s.named_parameters()}
        with trace() as tr, ffn_probe([("", s) for s in model.stages]) as ffn:
            result = model.step(ids, targets, measure_memory=False)
        probe.remove()
        coords = {k: mesh[k].rank for k in ("tp", "cp", "dp", "pp", "ep", "etp", "edp")}
        dp = mesh.dp
        out[name] = dict(
            _record(params, probe, tr, model.shard_specs()),
            ffn=dict(ffn),
            loss=result.loss,
            coords=coords,
            layers=[i for s in model.stages for i in s.layer_ids],
            rows=list(range(dp.rank * batch // dp.size, (dp.rank + 1) * batch // dp.size)),
            positions=sequence_positions(seq, mesh.cp.rank, mesh.cp.size, run_options.cp_layout).tolist(),
            hidden_cols=list(
                range(mesh.tp.rank * cfg.d_ff // mesh.tp.size, (mesh.tp.rank + 1) * cfg.d_ff // mesh.tp.size)
            ),
        )
    out["rank"] = mesh.global_rank
    return out


# ------------------------------------------------------------------------------------------------ FAQ: SP alone


def sp_without_tp(cfg, b: int, s: int) -> dict:
    """What sequence parallelism's split would mean with no tensor parallelism, on the world group: each rank
    keeps s/n tokens outside the region (LayerNorm, residual), all-gathers them before attention and before the
    MLP, runs the *whole* unsplit layer there (no weight is split, so there is no partial sum and nothing to
    reduce-scatter: it just keeps its own rows), against the plain single-device layer and TP + SP on the same
    ranks. Returns, per variant, the traced bytes, the bytes autograd saves, and the FFN intermediate's shape."""

    n = dist.get_world_size()
    device = current_device()  # the rank's GPU under NCCL
    block = build_model(cfg).to(device).layers[0]
    x = random_hidden(b, s, cfg.d_model, seed=2, dtype=torch_dtype(cfg.dtype)).to(device)
    with torch.no_grad():
        reference = block(x)

    def sp_alone(x_mine):
        h = C.all_gather(block.ln1(x_mine), 1)  # the whole sequence, every rank: no heads to split
        a = C.split_to_group(block.attn(h), 1)  # nothing to sum: keep my rows
        x_mine = x_mine + a
        h2 = C.all_gather(block.ln2(x_mine), 1)
        return x_mine + C.split_to_group(block.mlp(h2), 1)

    out = {}
    variants = {
        "one device": (lambda x: block(x), lambda: x.clone()),
        "SP without TP": (sp_alone, lambda: C.split_to_group(x, 1).clone()),
        "TP + SP": (TPBlock.from_full(block, sequence_parallel=True), lambda: scatter_to_sequence_parallel_region(x)),
    }
    for name, (fn, make_input) in variants.items():
        mod = fn if isinstance(fn, torch.nn.Module) else None
        probe = ActivationProbe().watch_layer(mod if mod is not None else block)
        xi = make_input().requires_grad_()
        params = list(block.parameters()) + (list(mod.parameters()) if mod is not None else [])
        with trace() as tr, saved_activations(exclude=params) as saved:
            y = fn(xi)
        with trace() as tr_b:
            y.square().sum().backward()
        probe.remove()
        rows = C.split_to_group(reference, 1) if name != "one device" else reference
        out[name] = dict(
            sent_forward=tr.total("bytes_sent"),
            sent_backward=tr_b.total("bytes_sent"),
            ops=sorted({e.op for e in tr.events + tr_b.events}),
            saved_bytes=saved.bytes,
            acts=dict(probe.shapes),
            max_err=float((y.detach() - rows).abs().max()),
        )
    out["n"] = n
    return out
