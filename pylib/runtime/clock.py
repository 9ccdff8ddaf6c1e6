"""The clock every recorder reads (`pylib.cp.recorder`, `pylib.pp.recorder`): host seconds.

One function, so that timing on a GPU (CUDA events, or a synchronize before each reading) is a change here and
nowhere else. Today it is `time.perf_counter()`: on CPU ranks the host clock is the compute clock.
"""

from __future__ import annotations

import time


def now() -> float:
    """Seconds on a monotonic clock (only differences mean anything)."""
    return time.perf_counter()
