"""Device-correct clocks: on CUDA they wait for the queued work (or use CUDA events); on the CPU they are the host
clock. CUDA is faked here (CI has no GPU): the fakes record what the clock asks of torch.cuda."""

import time

import pytest
import torch

from pylib.runtime import clock
from pylib.runtime.clock import CudaInterval, device_clock, time_per_call


def test_the_cpu_clock_is_the_host_clock_and_waits_for_nothing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("a CPU clock must not synchronize"))
    assert device_clock("cpu") is time.perf_counter
    assert device_clock(None) is time.perf_counter
    interval = CudaInterval("cpu").start()
    time.sleep(0.01)
    assert interval.stop().seconds >= 0.01


def test_a_cuda_clock_synchronizes_its_device_before_every_reading(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    now = device_clock("cuda:1")
    t0 = now()
    assert now() >= t0 and synced == [torch.device("cuda", 1)] * 2


def test_time_per_call_counts_warmup_apart_and_includes_the_device_work(monkeypatch):
    log = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("sync"))
    seconds = time_per_call(lambda: log.append("call"), "cuda:0", repeats=3, warmup=2)
    assert log == ["call", "call", "sync", "call", "call", "call", "sync"] and seconds >= 0
    with pytest.raises(ValueError, match="repeats >= 1 and warmup >= 0, got repeats=0"):
        time_per_call(lambda: None, repeats=0)


def test_a_cuda_interval_reads_the_events_elapsed_time_in_seconds(monkeypatch):
    class FakeEvent:
        made = []

        def __init__(self, enable_timing=False):
            assert enable_timing
            self.recorded = self.synced = False
            FakeEvent.made.append(self)

        def record(self):
            self.recorded = True

        def synchronize(self):
            self.synced = True

        def elapsed_time(self, end):
            assert self.recorded and end.recorded and end.synced
            return 250.0  # milliseconds

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    interval = CudaInterval("cuda:0").start().stop()
    assert interval.seconds == 0.25 and len(FakeEvent.made) == 2
    with pytest.raises(RuntimeError, match="before stop"):
        _ = CudaInterval("cuda:0").start().seconds
    with pytest.raises(RuntimeError, match="stop\\(\\) before start"):
        CudaInterval("cpu").stop()


def test_the_recorders_clock_waits_for_the_compute_stream_only_once_cuda_is_in_use(monkeypatch):
    waited = []

    class Stream:
        def synchronize(self):
            waited.append("current stream")

    monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stream())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: waited.append("whole device"))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    clock.device_now()
    assert waited == [], "a CPU rank waits for nothing"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    t0 = clock.device_now()
    assert waited == ["current stream"], "only the compute stream: NCCL's stream keeps running (overlap stays)"
    assert clock.device_now() >= t0


def test_ring_and_pipeline_recorders_and_dp_buckets_read_the_device_clock():
    import inspect

    from pylib.cp import recorder as ring_recorder
    from pylib.dp import buckets
    from pylib.pp import recorder as pipeline_recorder

    for module in (ring_recorder, pipeline_recorder, buckets):
        source = inspect.getsource(module)
        assert "clock.device_now()" in source and "tracer.now()" not in source, module.__name__
