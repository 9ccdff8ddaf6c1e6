"""FP8 recipes measured: the error of each GEMM against fp32, and a loss-parity run against bf16.

    gemm_errors()     per recipe, per outlier size, the relative error of fprop, dgrad and wgrad of one linear with
                      a real model's contraction lengths (Llama-2-7B's MLP up projection: h = 4096, h_ffn = 11008)
    loss_parity()     the FP8 test model trained `steps` steps in bf16 and under each recipe, same seed and data
    held_bytes()      inside a launched rank: what a rank holds after one step under each recipe and ZeRO stage

Both are deterministic (fixed seeds, one thread) and take a few seconds on this CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
import torch.distributed as dist

from pylib.dp import micro_batch, wrap
from pylib.dp.mixed import SingleDeviceMixed
from pylib.i18n import editions
from pylib.model import batches, build_model
from pylib.model.fp8 import fp8_layers, fp8_mm, quantize_operand, relative_error
from pylib.plan.config import ModelConfig
from pylib.plan.options import FP8_RECIPES, Fp8Recipe, MixedPrecision
from pylib.plan.presets import PRESETS

GEMMS = ("fprop", "dgrad", "wgrad")
OUTLIERS = (1.0, 100.0, 1e4, 1e5)  # how much larger the outlier channels of the activation are
N_OUTLIER_CHANNELS = 4


@contextlib.contextmanager
def one_thread():
    """One torch thread: the same sums in the same order on every machine, and torch._scaled_mm's CPU kernel without
    its per-call thread start (about 50 ms on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def fp8_test_model() -> ModelConfig:
    """The reference model at the smallest widths every recipe divides: h = 128 (one blockwise tile), h_ffn = 256,
    V = 128, one layer of 4 heads, GELU; trained on 4 x 32 = 128 tokens a step (one tile along wgrad's K)."""
    return ModelConfig(vocab_size=128, d_model=128, n_layers=1, n_heads=4, d_ff=256, dtype="float32")


def _operands(h: int, h_ffn: int, tokens: int, columns: int, outlier: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, h, generator=g)
    x[:, :N_OUTLIER_CHANNELS] *= outlier  # a few channels far larger, as LLM activations have (LLM.int8, 2022)
    # the weight's entries are independent draws: its first `columns` rows (for fprop) and columns (for dgrad) alone
    w_rows = torch.randn(columns, h, generator=g) * h**-0.5  # rows of unit norm on average
    w_cols = torch.randn(h_ffn, columns, generator=g) * h**-0.5
    dy = torch.randn(tokens, h_ffn, generator=g) * 1e-4  # gradients: small
    return x, w_rows, w_cols, dy


def _delayed_scale(recipe: Fp8Recipe, previous: torch.Tensor, role: str) -> torch.Tensor:
    """The scale delayed scaling would use: from the amax of the same operand one step earlier (a history of one)."""
    top = torch.finfo(torch.float8_e5m2 if role == "grad_output" and recipe.fmt == "hybrid" else torch.float8_e4m3fn)
    return previous.abs().amax().float() * 2.0**recipe.margin / top.max


def gemm_errors(
    preset: str = "llama2_7b",
    tokens: int = 256,
    columns: int = 256,
    outliers: tuple[float, ...] = OUTLIERS,
    recipes: tuple[str, ...] = FP8_RECIPES,
    seed: int = 0,
    widths: tuple[int, int] | None = None,
) -> list[dict]:
    """One row per (recipe, outlier): the relative error (Frobenius, against the fp32 product of the unquantized
    operands) of the three GEMMs of the preset's MLP up projection W [h_ffn, h], and of the ordinary channels alone.

    Each GEMM keeps its real contraction length (fprop h, dgrad h_ffn, wgrad `tokens`) and computes `columns` of its
    outputs: an output's error depends on its own dot product, so a slice of outputs has the full GEMM's statistics
    at a fraction of the cost. "ordinary": the fprop error of the activation's other channels' contribution
    (X[:, 4:] W[:, 4:]^T), where per-tensor scaling pays for the outliers. Delayed scaling takes its scale from the
    same operands one step earlier (another draw with the same outlier channels)."""
    cfg = PRESETS[preset]()
    h, h_ffn = (cfg.d_model, cfg.d_ff) if widths is None else widths  # widths: (h, h_ffn) of a smaller check
    rows = []
    with one_thread():
        for outlier in outliers:
            x, w_rows, w_cols, dy = _operands(h, h_ffn, tokens, columns, outlier, seed)
            before = _operands(h, h_ffn, tokens, columns, outlier, seed + 1)
            for name in recipes:
                recipe = Fp8Recipe(name)

                def q(t, role, prev=None, recipe=recipe):
                    scale = _delayed_scale(recipe, prev, role) if recipe.recipe == "delayed" else None
                    return quantize_operand(t, recipe, role, scale=scale)

                qx = q(x, "input", before[0])
                fprop = fp8_mm(qx, q(w_rows, "weight", before[1]), "emulated")
                dgrad = fp8_mm(q(dy, "grad_output", before[3]), q(w_cols.t(), "weight", before[2].t()), "emulated")
                wgrad = fp8_mm(
                    q(dy[:, :columns].t(), "grad_output", before[3][:, :columns].t()),
                    q(x[:, :columns].t(), "input", before[0][:, :columns].t()),
                    "emulated",
                )
                k = N_OUTLIER_CHANNELS
                ordinary = qx.dequantize()[:, k:] @ w_rows[:, k:].t()
                rows.append(
                    dict(
                        recipe=name,
                        outlier=outlier,
                        fprop=relative_error(fprop, x @ w_rows.t()),
                        dgrad=relative_error(dgrad, dy @ w_cols),
                        wgrad=relative_error(wgrad, dy[:, :columns].t() @ x[:, :columns]),
                        ordinary=relative_error(ordinary, x[:, k:] @ w_rows[:, k:].t()),
                        shapes=dict(h=h, h_ffn=h_ffn, tokens=tokens, columns=columns),
                    )
                )
    return rows


@editions.shared  # the book's two editions train once (pylib.i18n.editions)
def loss_parity(
    steps: int = 20,
    recipes: tuple[str, ...] = FP8_RECIPES,
    batch: int = 4,
    seq: int = 32,
    lr: float = 3e-3,
    path: str = "scaled_mm",
    seed: int = 0,
) -> dict:
    """`fp8_test_model` trained `steps` steps from the same weights on the same batches ("pattern" data, which a model
    can learn) in bf16 mixed precision (fp32 master weights, Adam, fp32 gradient reduction) and under each FP8
    recipe on top of it. Returns {"bf16": [loss per step], recipe: [...], ..., "fp32": [...]}: fp32 is the
    same model trained without mixed precision, the gap bf16 itself has (the floor an FP8 gap is read against)."""
    cfg = fp8_test_model()
    out = {}
    with one_thread():
        runs = [("fp32", None), ("bf16", MixedPrecision(grad_reduce="float32"))]
        runs += [(r, MixedPrecision(grad_reduce="float32", fp8=Fp8Recipe(r))) for r in recipes]
        for name, precision in runs:
            torch.manual_seed(seed)
            model = build_model(cfg)
            if precision is None:
                optimizer = torch.optim.Adam(model.parameters(), lr=lr)

                def step(ids, targets, model=model, optimizer=optimizer):
                    loss = model.loss(ids, targets)
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()
                    return float(loss.detach())
            else:
                trainer = SingleDeviceMixed(model, precision, parts=1, lr=lr)
                for layer in fp8_layers(model):
                    layer.path = path
                step = trainer.train_step
            out[name] = [step(*batches(cfg, batch, seq, s, data="pattern", seed=seed)) for s in range(steps)]
    return out


def held_bytes(runs: list[tuple[str | None, str]], batch: int = 4, seq: int = 32, lr: float = 3e-3) -> list[dict]:
    """Inside a launched rank: for each (recipe or None for bf16, ZeRO stage name), `fp8_test_model` wrapped by
    `pylib.dp.wrap` in bf16 mixed precision with fp32 gradients plus the recipe, one step on this rank's share of
    batch 0; returns what the rank then holds: `trainer.memory()`'s params, grads and optim bytes, "fp8" the FP8
    weight copies, scales and amax histories of its Fp8Linear layers, and what the formulas need (parameter count,
    padded count, the FP8 weights' shapes)."""
    cfg = fp8_test_model()
    rank, d = dist.get_rank(), dist.get_world_size()
    out = []
    with one_thread():
        for recipe, stage in runs:
            precision = MixedPrecision(grad_reduce="float32", fp8=None if recipe is None else Fp8Recipe(recipe))
            model = build_model(cfg)
            n_params = sum(p.numel() for p in model.parameters())
            trainer = wrap(model, stage, precision=precision, lr=lr)
            for m in fp8_layers(model):
                m.cache_weights = stage != "zero3"  # ZeRO-3 frees the FP8 copies with the gathered unit
            ids, targets = batches(cfg, batch * d, seq, 0, data="pattern")
            ids, targets = micro_batch(ids, rank, d), micro_batch(targets, rank, d)
            trainer.scale_loss(model.loss(ids, targets)).backward()
            trainer.finish_gradient_sync()
            trainer.step()
            held = {k: v for k, v in trainer.memory().as_dict().items() if k in ("params", "grads", "optim")}
            layers = fp8_layers(model)
            held["fp8"] = sum(t.numel() * t.element_size() for m in layers for t in m.fp8_state_tensors())
            out.append(
                dict(
                    recipe=recipe or "bf16",
                    stage=stage,
                    held=held,
                    n_params=n_params,
                    padded=sum(lay.padded_numel for lay in trainer.layouts),
                    shapes=[(m.out_features, m.in_features) for m in layers],
                    precision=precision,
                )
            )
            trainer.zero_grad()
    return out


def loss_gaps(losses: dict) -> dict[str, float]:
    """For each run but bf16: the largest |loss - bf16 loss| / bf16 loss over the steps."""
    base = losses["bf16"]
    return {k: max(abs(a - b) / b for a, b in zip(v, base)) for k, v in losses.items() if k != "bf16"}


def _modes_worker(tp_cases, z3_cases, inputs, h, h_ffn):
    return dict(tp=tp_fp8_mlp(tp_cases, h, h_ffn, inputs, dtype=torch.bfloat16), zero3=zero3_fp8_run(z3_cases))


@editions.shared  # the book's two editions launch once (pylib.i18n.editions)
def modes_run(world: int = 2, b: int = 2, s: int = 64, h: int = 128, h_ffn: int = 256) -> dict:
    """FP8 across the modes on `world` ranks, tensorwise: TP + SP on the bf16 MLP of `mlp_linears` with the input
    gathered in bf16 and in FP8 (`input_gather`), and ZeRO-3 on `fp8_layers_model` with the parameters gathered in
    bf16 and in FP8 (`param_gather`), and three layers with `first_last_layers_bf16`. Returns {"tp": per rank,
    "zero3": per rank} (`tp_fp8_mlp`, `zero3_fp8_run`), "reference" the one-device bf16 MLP, and the cases."""
    from pylib.runtime import launch

    t = Fp8Recipe("tensorwise")
    tp_cases = [(t, True), (dataclasses.replace(t, input_gather=True), True)]
    z3_cases = [(t, 1), (dataclasses.replace(t, param_gather=True), 1)]
    z3_cases.append((dataclasses.replace(t, param_gather=True, first_last_layers_bf16=True), 3))
    inputs = mlp_inputs(b, s, h, steps=2)
    ranks = launch(_modes_worker, world, tp_cases, z3_cases, inputs, h, h_ffn, backend="gloo")
    reference = fp8_mlp_reference(t, h, h_ffn, inputs, dtype=torch.bfloat16)
    shape = dict(world=world, b=b, s=s, h=h, h_ffn=h_ffn)
    return dict(
        tp=[r["tp"] for r in ranks],
        zero3=[r["zero3"] for r in ranks],
        reference=reference,
        shape=shape,
        tp_cases=tp_cases,
        z3_cases=z3_cases,
    )


__all__ = [
    "GEMMS",
    "modes_run",
    "fp8_layers_model",
    "fp8_mlp_reference",
    "fp8_single_device",
    "mlp_inputs",
    "mlp_linears",
    "tp_fp8_mlp",
    "zero3_fp8_run",
    "OUTLIERS",
    "fp8_test_model",
    "gemm_errors",
    "held_bytes",
    "loss_gaps",
    "loss_parity",
    "one_thread",
]


# --------------------------------------------------------------------------------------------- FP8 across the modes


def mlp_linears(h: int, h_ffn: int, seed: int = 0) -> tuple[torch.nn.Linear, torch.nn.Linear]:
    """The MLP's two linears in fp32, W_up [h_ffn, h] with a bias and W_down [h, h_ffn] without (the row-parallel
    bias is added once after the TP sum, the same in FP8 and bf16), from `seed`."""
    g = torch.Generator().manual_seed(seed)
    up, down = torch.nn.Linear(h, h_ffn), torch.nn.Linear(h_ffn, h, bias=False)
    with torch.no_grad():
        up.weight.copy_(torch.randn(h_ffn, h, generator=g) * h**-0.5)
        up.bias.copy_(torch.randn(h_ffn, generator=g) * 0.1)
        down.weight.copy_(torch.randn(h, h_ffn, generator=g) * h_ffn**-0.5)
    return up, down


def mlp_inputs(b: int, s: int, h: int, steps: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`steps` (x [b, s, h], dy [b, s, h]) pairs: the input and the output gradient of each step (the second step
    of "delayed" reads the amax history the first wrote)."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(b, s, h, generator=g), torch.randn(b, s, h, generator=g) * 1e-2) for _ in range(steps)]


def fp8_mlp_reference(recipe: Fp8Recipe, h: int, h_ffn: int, inputs, path: str = "scaled_mm", dtype=None) -> dict:
    """One device: y = down(gelu(up(x))) with both linears as `Fp8Linear`, run on each (x, dy) of `inputs`; the last
    step's y, dx and the weight (and up-bias) gradients. dtype: the activations' and parameters' (fp32 if None)."""
    from pylib.model.fp8 import Fp8Linear

    up_lin, down_lin = (m.to(dtype or torch.float32) for m in mlp_linears(h, h_ffn))
    inputs = [(x.to(up_lin.weight.dtype), dy.to(up_lin.weight.dtype)) for x, dy in inputs]
    up, down = Fp8Linear(up_lin, recipe, path), Fp8Linear(down_lin, recipe, path)
    with one_thread():
        for x, dy in inputs:
            for p in (up.weight, up.bias, down.weight):
                p.grad = None
            x = x.clone().requires_grad_(True)
            y = down(torch.nn.functional.gelu(up(x)))
            (y * dy).sum().backward()
    return dict(y=y.detach(), dx=x.grad, up_w=up.weight.grad, up_b=up.bias.grad, down_w=down.weight.grad)


def tp_fp8_mlp(cases: list[tuple[Fp8Recipe, bool]], h: int, h_ffn: int, inputs, path="scaled_mm", dtype=None) -> list:
    """Inside a launched rank, TP over every rank: for each (recipe, sequence_parallel) the MLP of `mlp_linears`
    cut column then row (`pylib.tp.fp8`), run on `inputs` as `fp8_mlp_reference` runs it (in `dtype`); per case
    this rank's last-step y, dx (its sequence slice under SP), weight gradients (its shard) and the traced
    communication of the last step: [(op, tag, dtype, bytes_sent)]."""
    import torch.nn.functional as F

    from pylib.runtime import collectives as C
    from pylib.runtime.tracer import trace
    from pylib.tp import ColumnParallelLinear, RowParallelLinear
    from pylib.tp.fp8 import to_fp8_tp
    from pylib.tp.regions import SEQ_DIM

    g = C.resolve_group(None)
    out = []
    with one_thread():
        for recipe, sp in cases:
            up_lin, down_lin = (m.to(dtype or torch.float32) for m in mlp_linears(h, h_ffn))
            col = to_fp8_tp(ColumnParallelLinear.from_full(up_lin, group=g, sequence_parallel=sp), recipe, path)
            row = to_fp8_tp(RowParallelLinear.from_full(down_lin, group=g, sequence_parallel=sp), recipe, path)
            for x, dy in inputs:
                x, dy = x.to(up_lin.weight.dtype), dy.to(up_lin.weight.dtype)
                for p in (col.weight, col.bias, row.weight):
                    p.grad = None
                if sp:
                    x, dy = (t.chunk(g.size, SEQ_DIM)[g.rank].contiguous() for t in (x, dy))
                x = x.clone().requires_grad_(True)
                with trace() as tr:
                    y = row(F.gelu(col(x)))
                    (y * dy).sum().backward()
            events = [(e.op, e.tag, e.dtype, e.bytes_sent) for e in tr.events]
            grads = dict(up_w=col.weight.grad, up_b=col.bias.grad, down_w=row.weight.grad)
            out.append(dict(recipe=recipe, sp=sp, y=y.detach(), dx=x.grad, events=events, **grads))
    return out


def fp8_layers_model(n_layers: int) -> ModelConfig:
    """`fp8_test_model` with `n_layers` layers (three show `first_last_layers_bf16` keeping the first and last)."""
    return dataclasses.replace(fp8_test_model(), n_layers=n_layers)


def zero3_fp8_run(cases: list[tuple[Fp8Recipe, int]], batch: int = 4, seq: int = 32, steps: int = 2, lr=3e-3):
    """Inside a launched rank: for each (recipe, n_layers), `fp8_layers_model(n_layers)` under ZeRO-3 over every rank
    in bf16 mixed precision (fp32 master weights and Adam, fp32 gradient reduction) with the recipe, `steps` steps
    on this rank's `batch` rows of each step's batch. Per case: this rank's loss of each step; the first step's
    reduced gradient shards by flat key with the flats' layouts; that step's traced communication
    [(op, tag, dtype, phase, bytes_sent)]."""
    from pylib.runtime.tracer import trace

    rank, d = dist.get_rank(), dist.get_world_size()
    out = []
    with one_thread():
        for recipe, n_layers in cases:
            cfg = fp8_layers_model(n_layers)
            torch.manual_seed(0)
            model = build_model(cfg)
            trainer = wrap(model, "zero3", precision=MixedPrecision(grad_reduce="float32", fp8=recipe), lr=lr)
            losses, grads, events = [], None, []
            for step in range(steps):
                ids, targets = batches(cfg, batch * d, seq, step, data="pattern")
                with trace() as tr:
                    loss = model.loss(micro_batch(ids, rank, d), micro_batch(targets, rank, d))
                    trainer.scale_loss(loss).backward()
                    trainer.finish_gradient_sync()
                losses.append(float(loss.detach()))
                if step == 0:
                    grads = {k: g.detach().clone() for k, g in trainer.gradient_shards().items()}
                    events = [(e.op, e.tag, e.dtype, e.phase, e.bytes_sent) for e in tr.events]
                trainer.step()
                trainer.zero_grad()
            layouts = {
                lay.key: [(e.name, e.offset, e.numel, tuple(e.shape)) for e in lay.entries] for lay in trainer.layouts
            }
            padded = {lay.key: lay.padded_numel for lay in trainer.layouts}
            out.append(dict(losses=losses, grads=grads, layouts=layouts, padded=padded, events=events))
    return out


def fp8_single_device(recipe: Fp8Recipe, n_layers: int, d: int, batch: int = 4, seq: int = 32, steps=2, lr=3e-3):
    """The same training on one device with the d ranks' rounding points (`SingleDeviceMixed`, d micro-batches of
    `batch` rows): the mean loss of each step, and the first step's fp32 gradient by parameter name."""
    cfg = fp8_layers_model(n_layers)
    torch.manual_seed(0)
    model = build_model(cfg)
    trainer = SingleDeviceMixed(model, MixedPrecision(grad_reduce="float32", fp8=recipe), parts=d, lr=lr)
    names = {id(p): n for n, p in model.named_parameters()}
    grads, losses = {}, []
    step_of = trainer.weights.step

    def keep_first(totals):
        if not grads:
            grads.update({names[id(p)]: t.clone() for p, t in zip(trainer.params, totals)})
        step_of(totals)

    trainer.weights.step = keep_first
    with one_thread():
        for step in range(steps):
            losses.append(trainer.train_step(*batches(cfg, batch * d, seq, step, data="pattern")))
    return losses, grads
