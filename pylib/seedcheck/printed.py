"""Is a number a source prints the value rounded, or a slip? Every printed number set against the computed value.

compare_printed(values, printed, decimals=3)   # [PrintedCheck]: "exact", "slip" (rounded twice) or "mismatch"
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

import torch


def round_half_up(value: float, decimals: int) -> float:
    """Round as people do by hand: halves away from zero (Python's round() sends halves to the even digit)."""
    q = Decimal(1).scaleb(-decimals)
    return float(Decimal(repr(float(value))).quantize(q, rounding=ROUND_HALF_UP))


@dataclass(frozen=True)
class PrintedCheck:
    """One number printed in a source, against the value it stands for."""

    index: tuple[int, ...]
    printed: float
    value: float
    status: str  # "exact": printed is the value rounded; "slip": printed is the value rounded twice


def compare_printed(values, printed, decimals: int = 3) -> list[PrintedCheck]:
    """Classify every printed number against the computed value in the same position.

    values: a tensor (or nested lists); printed: nested lists of the same shape, as the source prints them.
    A "slip" is the familiar double rounding: 0.90747 printed to four places is 0.9075, and rounding that
    half-up to three gives 0.908, where the value itself rounds to 0.907."""
    v = torch.as_tensor(values, dtype=torch.float64)
    p = torch.as_tensor(printed, dtype=torch.float64)
    if v.shape != p.shape:
        raise ValueError(f"computed values have shape {tuple(v.shape)}, the printed numbers {tuple(p.shape)}")
    checks = []
    for idx in torch.cartesian_prod(*[torch.arange(n) for n in v.shape]).reshape(-1, v.dim()).tolist():
        value, shown = v[tuple(idx)].item(), round(p[tuple(idx)].item(), decimals)
        once = round_half_up(value, decimals)
        twice = round_half_up(round_half_up(value, decimals + 1), decimals)
        status = "exact" if once == shown else "slip" if twice == shown else "mismatch"
        checks.append(PrintedCheck(tuple(idx), shown, value, status))
    return checks
