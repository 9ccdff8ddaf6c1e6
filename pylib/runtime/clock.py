"""The clocks every recorder reads (`pylib.cp.recorder`, `pylib.pp.recorder`): work on the device, not launches.

On CUDA a kernel call returns as soon as the kernel is queued, so a host clock read around it measures the launch
(microseconds), not the work. `device_clock(device)` gives a `now()` that first waits for the device to finish
what was queued (torch.cuda.synchronize) and then reads the host clock; on the CPU it is the host clock itself,
with no cost. `time_per_call` times a function that way; `CudaInterval` brackets work with CUDA events, which
measure it on the device without stopping the host until the result is asked for.

    now = device_clock(q.device)
    t0 = now(); out = attention(q, k, v); seconds = now() - t0
    seconds = time_per_call(lambda: attention(q, k, v), q.device, repeats=5)
"""

from __future__ import annotations

import time

import torch


def now() -> float:
    """Host seconds on a monotonic clock (only differences mean anything): on CPU ranks the compute clock."""
    return time.perf_counter()


def device_now() -> float:
    """Host seconds after this rank's compute stream has finished what was queued on it, when this process uses
    CUDA (a measurement point: compute before it is counted where it ran, not where it was launched); on CPU ranks
    exactly `now()`, at no cost. Only the current stream is waited for, so a collective running on NCCL's own
    stream keeps running: a timeline of overlap stays a timeline of overlap."""
    if torch.cuda.is_initialized():
        torch.cuda.current_stream().synchronize()
    return time.perf_counter()


def device_clock(device=None):
    """A `now()` in seconds that waits for `device`'s queued work first when it is a CUDA device; on the CPU (or
    device=None) `time.perf_counter` itself."""
    device = torch.device("cpu") if device is None else torch.device(device)
    if device.type != "cuda":
        return time.perf_counter

    def now() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return now


def time_per_call(fn, device=None, *, repeats: int = 3, warmup: int = 1) -> float:
    """Seconds per call of fn(), after `warmup` calls, with the device's work included (see `device_clock`)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"time_per_call needs repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    now = device_clock(device)
    for _ in range(warmup):
        fn()
    t0 = now()
    for _ in range(repeats):
        fn()
    return (now() - t0) / repeats


class CudaInterval:
    """Device time between start() and stop() on the current CUDA stream: `seconds` waits for the stop event only.

    On a CPU device it falls back to the host clock, so code written with it runs on both."""

    def __init__(self, device=None):
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._t0 = self._t1 = None

    def start(self) -> CudaInterval:
        if self._cuda:
            self._t0 = torch.cuda.Event(enable_timing=True)
            self._t0.record()
        else:
            self._t0 = time.perf_counter()
        return self

    def stop(self) -> CudaInterval:
        if self._t0 is None:
            raise RuntimeError("CudaInterval.stop() before start()")
        if self._cuda:
            self._t1 = torch.cuda.Event(enable_timing=True)
            self._t1.record()
        else:
            self._t1 = time.perf_counter()
        return self

    @property
    def seconds(self) -> float:
        if self._t1 is None:
            raise RuntimeError("CudaInterval.seconds before stop()")
        if self._cuda:
            self._t1.synchronize()
            return self._t0.elapsed_time(self._t1) / 1e3  # elapsed_time is in milliseconds
        return self._t1 - self._t0
