"""Tensor and sequence parallelism on real ranks, for the figures of `pylib.viz.tp`.

    ex = column_row_example(t=2)        # ColumnParallelLinear / RowParallelLinear on t ranks, every shard's numbers
    traces = layer_traces(t=2)          # one TPBlock forward + backward traced, TP and TP + SP

Matrices are kept in seed B's layout, W [in, out] (torch stores [out, in]).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pylib.model import ModelConfig, build_model, random_hidden, torch_dtype
from pylib.runtime import current_device, launch, trace
from pylib.tp import ColumnParallelLinear, RowParallelLinear, TPBlock, scatter_to_sequence_parallel_region

# ------------------------------------------------------------------------------------------ column vs row split


@dataclass
class ColumnRowExample:
    """One column-parallel and one row-parallel matmul on t ranks, every number from the real shards.

    Seed B layout: x [n, d_in]; column split W [d_in, d_out] -> W_r [d_in, d_out/t], y_r = x W_r [n, d_out/t];
    row split V [d_out, d_in] -> V_r [d_out/t, d_in], partial_r = y_r V_r [n, d_in] (full size), z = sum_r."""

    x: np.ndarray
    col_weights: list[np.ndarray]  # W_r
    col_outputs: list[np.ndarray]  # y_r
    row_weights: list[np.ndarray]  # V_r
    partials: list[np.ndarray]  # y_r V_r, before the all-reduce
    reduced: np.ndarray  # what the all-reduce returns on every rank
    reference_y: np.ndarray  # x W on one device
    reference_z: np.ndarray  # x W V on one device


def _column_row_rank(x, up, down):
    device = current_device()  # the rank's GPU under NCCL
    x, up, down = x.to(device), up.to(device), down.to(device)
    col = ColumnParallelLinear.from_full(up)
    row = RowParallelLinear.from_full(down)
    with torch.no_grad():
        y = col(x)
        partial = row.partial(y)
        reduced = row(y)
    return col.weight.T.clone(), y, row.weight.T.clone(), partial, reduced


def column_row_example(t: int = 2, n: int = 4, d_in: int = 4, d_out: int = 8, seed: int = 0) -> ColumnRowExample:
    """Run the split on t launched ranks (seed A's sizes by default: 4 tokens, d = 4, d_ff = 8)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g, device="cpu").round(decimals=1)
    up = torch.nn.Linear(d_in, d_out, bias=False)
    down = torch.nn.Linear(d_out, d_in, bias=False)
    with torch.no_grad():
        up.weight.copy_(torch.randn(d_out, d_in, generator=g, device="cpu").round(decimals=1))
        down.weight.copy_(torch.randn(d_in, d_out, generator=g, device="cpu").round(decimals=1))
    ranks = launch(_column_row_rank, t, x, up, down)
    with torch.no_grad():
        ref_y, ref_z = up(x), down(up(x))
    return ColumnRowExample(
        x=x.numpy(),
        col_weights=[r[0].numpy() for r in ranks],
        col_outputs=[r[1].numpy() for r in ranks],
        row_weights=[r[2].numpy() for r in ranks],
        partials=[r[3].numpy() for r in ranks],
        reduced=ranks[0][4].numpy(),
        reference_y=ref_y.numpy(),
        reference_z=ref_z.numpy(),
    )


# ------------------------------------------------------------------------------------------ SP around the region


def _layer_trace_rank(cfg, b, s, modes):
    device = current_device()  # the rank's GPU under NCCL
    out = {}
    for name, sp, regather in modes:
        block = TPBlock.from_full(build_model(cfg).to(device).layers[0], sequence_parallel=sp, regather=regather)
        x = random_hidden(b, s, cfg.d_model, dtype=torch_dtype(cfg.dtype)).to(device)
        x = (scatter_to_sequence_parallel_region(x) if sp else x).detach().requires_grad_()
        with trace() as tr:
            block(x).square().sum().backward()
        out[name] = [e.as_dict() for e in tr.events]
    return out


def layer_traces(t: int = 2, b: int = 1, s: int = 8, cfg=None, regather: bool = False) -> dict:
    """Trace one TPBlock forward + backward on t ranks, TP only and TP + SP; rank 0's events per mode, with sizes."""
    cfg = cfg or ModelConfig(d_model=16, n_heads=4, d_ff=64, n_layers=1)
    modes = [("TP", False, False), ("TP + SP", True, regather)]
    events = launch(_layer_trace_rank, t, cfg, b, s, modes)[0]
    return {"t": t, "b": b, "s": s, "h": cfg.d_model, "dtype": cfg.dtype, "events": events}


# ------------------------------------------------------------------------------------------ the TP block


def _tp_block_rank(cfg, b, s):
    from pylib.tp import TPMLP, enter_tp_region, leave_tp_region

    device = current_device()
    mlp = build_model(cfg).to(device).layers[0].mlp
    block = TPMLP.from_full(mlp)
    x = random_hidden(b, s, cfg.d_model, dtype=torch_dtype(cfg.dtype)).to(device)

    def ops(events):
        return {phase: [e.op for e in events if e.phase == phase] for phase in ("forward", "backward")}

    crossings = {}
    for name, cross in (("f", enter_tp_region), ("g", leave_tp_region)):
        xi = x.clone().requires_grad_()
        with trace() as tr:
            cross(xi).square().sum().backward()
        crossings[name] = ops(tr.events)
    xi = x.clone().requires_grad_()
    with trace() as tr:
        hidden = block.hidden(xi)  # f, then the column-parallel linear and GELU: [b, s, h_ffn/t]
        y = block.down_proj(hidden)  # the row-parallel linear, then g
        y.square().sum().backward()
    with torch.no_grad():
        partial = torch.nn.functional.linear(hidden, block.down_proj.weight)  # before g: a full-size partial sum
        error = (y - mlp(x)).abs().max().item()
    shapes = dict(x=x.shape, hidden=hidden.shape, partial=partial.shape, y=y.shape)
    return dict(
        crossings=crossings,
        block_ops=ops(tr.events),
        specs=[(sp.name, sp.kind, tuple(sp.full_shape), tuple(sp.local_shape)) for sp in block.shard_specs()],
        shapes={k: tuple(v) for k, v in shapes.items()},
        error=error,
    )


def tp_block_example(cfg, t: int = 2, b: int = 1, s: int = 8) -> dict:
    """The TP block of Megatron-LM, f -> column-parallel linear -> GELU -> row-parallel linear -> g, run on t ranks
    from the first layer's MLP of `build_model(cfg)` (a GELU MLP), forward and backward.

    Returns dict(t, b, s, h, h_ffn, ranks=[per rank: crossings={"f"|"g": {"forward"|"backward": [collective op
    names]}} (each crossing traced alone), block_ops (the same, for the whole block), specs=[(name, kind, full shape,
    this rank's shape)] (`TPMLP.shard_specs`, torch's [out, in]), shapes (x [b, s, h], hidden [b, s, h_ffn/t], the
    partial sum before g and y after it, [b, s, h]), error (max |y - the full MLP's output|)])."""
    if cfg.mlp != "gelu":
        raise ValueError(f"tp_block_example draws the GELU MLP (f, column, GELU, row, g); got mlp={cfg.mlp!r}")
    ranks = launch(_tp_block_rank, t, cfg, b, s)
    return dict(t=t, b=b, s=s, h=cfg.d_model, h_ffn=cfg.d_ff, ranks=ranks)
