"""The FP8 figures and tables: the formats' values, each recipe's scaling on one tensor, and the loss-parity run.

    format_facts()                      bits, range and spacing of E4M3, E5M2, E8M0 (and bf16), from torch.finfo
    plot_formats()                      every positive value of E4M3 and E5M2 on one log axis
    plot_scaling(x, recipes)            per recipe, each element's quantization error (and the tiles that share a scale)
    plot_loss_parity(losses, tolerance) the loss of each run per step, and its gap to bf16 against the tolerance

Each draws what it is handed; the numbers come from `pylib.model.fp8` and `pylib.experiments.fp8_runs`.
"""

from __future__ import annotations

import numpy as np
import torch

from ..i18n import tr
from ..model.fp8 import e8m0_decode, quantize_operand
from ..plan.options import Fp8Recipe
from . import style

FORMATS = {  # name: (torch dtype, or None for E8M0's byte; exponent bits, mantissa bits)
    "E4M3": (torch.float8_e4m3fn, 4, 3),
    "E5M2": (torch.float8_e5m2, 5, 2),
    "E8M0": (None, 8, 0),
    "bf16": (torch.bfloat16, 8, 7),
}
COLOURS = {"E4M3": style.BLUE, "E5M2": style.ORANGE, "E8M0": style.GREEN, "bf16": style.GREY}
RUN_COLOURS = {
    "fp32": style.GREY,
    "bf16": style.INK,
    "delayed": style.BLUE,
    "tensorwise": style.ORANGE,
    "blockwise": style.GREEN,
    "mxfp8": style.PURPLE,
}


def positive_values(name: str) -> np.ndarray:
    """Every finite positive value of an 8-bit format, in order (all 256 bit patterns read as the format; E8M0's
    bytes decoded as pylib.model.fp8 stores them)."""
    codes = torch.arange(256, dtype=torch.uint8)
    if name == "E8M0":
        v = e8m0_decode(codes[:255]).numpy()  # 255 is NaN
    else:
        v = codes.view(FORMATS[name][0]).float().numpy()
    v = v[np.isfinite(v) & (v > 0)]
    return np.unique(v)


def format_facts() -> list[dict]:
    """One row per format: sign/exponent/mantissa bits, largest value, smallest normal, smallest subnormal (None
    when the format has none) and the relative spacing of its values at 1 (torch.finfo's eps)."""
    rows = []
    for name, (dtype, e, m) in FORMATS.items():
        if dtype is None:  # E8M0: every byte but NaN, a power of two
            v = positive_values(name)
            top, normal, smallest, eps = float(v[-1]), float(v[0]), float(v[0]), 1.0
        else:
            info = torch.finfo(dtype)
            top, normal, eps = float(info.max), float(info.smallest_normal), float(info.eps)
            smallest = float(positive_values(name)[0]) if name != "bf16" else normal * 2.0**-m
        rows.append(
            dict(
                format=name,
                sign=0 if name == "E8M0" else 1,
                exponent=e,
                mantissa=m,
                max=top,
                smallest_normal=normal,
                smallest_subnormal=None if smallest == normal else smallest,
                eps=eps,
            )
        )
    return rows


@style.styled
def plot_formats(ax=None):
    """E4M3 and E5M2 on one log axis: a tick for every positive value, the subnormal ones lighter, the largest
    labelled. The density of ticks is the mantissa (8 or 4 values per power of two), their extent the exponent."""
    fig, ax = style.figure_axes(ax, figsize=(6.72, 2.6), grid="x")
    names = ("E4M3", "E5M2")
    for row, name in enumerate(names):
        v = positive_values(name)
        normal = v >= torch.finfo(FORMATS[name][0]).smallest_normal
        y = len(names) - 1 - row
        for mask, alpha in ((normal, 1.0), (~normal, 0.35)):
            ax.vlines(v[mask], y - 0.32, y + 0.32, color=COLOURS[name], lw=0.8, alpha=alpha)
        ax.text(v[-1] * 1.6, y, f"{v[-1]:g}", va="center", fontsize=8, color=COLOURS[name])
    ax.set_xscale("log", base=2)
    ax.set_yticks(range(len(names)), names[::-1])
    ax.set_ylim(-0.6, len(names) - 0.4)
    ax.set_xlim(2.0**-18, 2.0**19)
    ax.set_xlabel(tr("value (log scale); lighter ticks: subnormal values"))
    ax.set_title(tr("every positive value of E4M3 and E5M2"), fontsize=10)
    return fig


@style.styled
def plot_scaling(x: torch.Tensor, recipes: tuple[str, ...] = ("tensorwise", "blockwise", "mxfp8")):
    """One panel per recipe: each element of the activation x [rows, channels] quantized as the recipe quantizes
    an input, coloured by log10 of its relative error; thin lines mark the tiles that share one scale."""
    fig, axes = style.subplots(len(recipes), 1, figsize=(6.72, 1.5 * len(recipes) + 0.8), grid=False, squeeze=False)
    x = x.float()
    err = {}
    for name in recipes:
        q = quantize_operand(x, Fp8Recipe(name), "input").dequantize()
        err[name] = ((q - x).abs() / x.abs().clamp_min(1e-30)).clamp(1e-4, 1.0).log10().numpy()
    for ax, name in zip(axes[:, 0], recipes):
        image = ax.imshow(err[name], aspect="auto", cmap="magma_r", vmin=-4, vmax=0, interpolation="nearest")
        block = Fp8Recipe(name).block
        if block:
            for c in range(block, x.shape[1], block):
                ax.axvline(c - 0.5, color=style.TEXT, lw=0.6)
        ax.set_yticks([])
        ax.set_ylabel(name, fontsize=8)
        ax.tick_params(labelsize=7)
    axes[-1, 0].set_xlabel(tr("channel (the first few carry the outliers)"))
    axes[0, 0].set_title(tr("relative error of each element after FP8 quantization (log10)"), fontsize=10)
    bar = fig.colorbar(image, ax=axes[:, 0].tolist(), fraction=0.03, pad=0.02)
    bar.ax.tick_params(labelsize=7)
    return fig


@style.styled
def plot_loss_parity(losses: dict, tolerance: float):
    """Left: the loss of each run per step. Right: each run's |loss - bf16 loss| / bf16 loss per step, with the
    tolerance as a dashed line."""
    fig, (left, right) = style.subplots(1, 2, figsize=(6.72, 3.0))
    base = np.array(losses["bf16"])
    steps = np.arange(1, len(base) + 1)
    for name, curve in losses.items():
        colour = RUN_COLOURS.get(name, style.GREY)
        left.plot(steps, curve, color=colour, lw=1.2, label=name)
        if name != "bf16":
            gap = np.abs(np.array(curve) - base) / base
            right.plot(steps, np.maximum(gap, 1e-7), color=colour, lw=1.2, label=name)
    right.axhline(tolerance, color=style.RED, ls="--", lw=1)
    right.set_yscale("log")
    left.set_xlabel(tr("step"))
    right.set_xlabel(tr("step"))
    left.set_ylabel(tr("loss"))
    right.set_ylabel(tr("gap to bf16 (relative)"))
    left.legend(fontsize=7, frameon=False)
    right.text(steps[0], tolerance * 1.15, tr("tolerance"), color=style.RED, fontsize=8, va="bottom")
    return fig


__all__ = ["FORMATS", "format_facts", "plot_formats", "plot_loss_parity", "plot_scaling", "positive_values"]
