"""What a pipeline rank reports at its seams: the timeline, the activations held, and a padding aid.

The executor (`pylib.pp.executor.run_pipeline`) calls its recorder at these points:

    recorder.start(rank, group, device)   once, before the first action: the ranks agree on a time origin
                                          (only when a timeline is recorded)
    with recorder.action(a):              around every action: its interval becomes an `Event` of the timeline
    with recorder.forward(key, exclude):  around a forward's compute: the bytes autograd saved for it
    recorder.input_grad_done(key, nbytes) a split backward's B: the activations stay (W needs them), plus the
                                          nbytes of output gradients kept for W
    recorder.backward_done(key)           the forward's activations (and what B kept) are freed: after a fused
                                          backward, or after W

Times come from `pylib.runtime.clock.device_now` (on CUDA it first waits for the compute stream, so an action is
timed where it ran, not where it was launched), in seconds since the common origin. A receive's interval includes
the time spent waiting for the sender; a posted send's interval is just the posting (a blocking send's includes its
wait).

record_timeline=False records no Event and skips the time origin's all-reduce: the step then makes no collective of
the recorder's own, as torch.distributed.pipelining makes none (what a timing against it compares; the traced
traffic then lacks the 4-byte "pp-sync" all-reduce that `pylib.analysis.compose` counts for a recorded step).
The origin's all-reduce is not checked by `pylib.runtime.agreement`: the ranks reach it straight after the step's
`agree_pipeline`, which has just compared their schedules, and it is the same one-element float all-reduce on
every rank by construction, so a check of it could only cost a second round trip, never find anything.

measure_memory=False skips the saved-tensor probe (its bytes read 0; autograd applies only the innermost
saved-tensor hooks, so a caller with its own probe turns this one off). compute_delay=(t_f, t_b) pads each forward
of one chunk to at least t_f seconds and each backward to t_b (sleeping after the real compute); (t_f, t_b, t_w)
pads a split schedule's B to t_b and its W to t_w: a measurement aid
that makes every compute cost a known, noise-free amount, so the measured bubble can be compared with the formula
on a busy 2-core machine; it changes nothing else.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch

from ..model.memory import saved_activations
from ..runtime import clock
from ..runtime import collectives as C
from ..runtime.agreement import agreement_check
from .timeline import Event


@dataclass
class PipelineRecorder:
    """One rank's observations of one step (filled again by every run it is passed to)."""

    measure_memory: bool = True
    record_timeline: bool = True
    compute_delay: tuple[float, ...] | None = None
    timeline: list[Event] = field(default_factory=list)
    activation_bytes: dict[tuple[int, int], int] = field(default_factory=dict)
    peak_in_flight: int = 0
    peak_activation_bytes: int = 0

    def start(self, rank: int, group, device) -> None:
        """A common time origin: every rank leaves this one-element all-reduce at about the same moment (made only
        when the timeline is recorded; unchecked: see the module docstring)."""
        self.rank, self._live, self._live_bytes, self._kept = rank, 0, 0, {}
        self.timeline, self.activation_bytes = [], {}
        self.peak_in_flight = self.peak_activation_bytes = 0
        if self.record_timeline:
            with agreement_check(False):
                C.all_reduce_(torch.zeros(1, device=device), group, phase="pp-sync")
        self._t0 = clock.device_now()

    @contextmanager
    def action(self, a):
        if not self.record_timeline and not self.compute_delay:
            yield
            return
        start = clock.device_now()
        yield
        if self.compute_delay and a.op in ("F", "B", "W")[: len(self.compute_delay)]:
            self._pad(start, self.compute_delay["FBW".index(a.op)])
        if self.record_timeline:
            self.timeline.append(Event.of(self.rank, a, start - self._t0, clock.device_now() - self._t0))

    @contextmanager
    def forward(self, key: tuple[int, int], exclude):
        """Around the forward of (microbatch, chunk) `key`; `exclude`: its parameters (not activations)."""
        with saved_activations(exclude=exclude) if self.measure_memory else nullcontext() as saved:
            yield
        self.activation_bytes[key] = saved.bytes if self.measure_memory else 0
        self._live_bytes += self.activation_bytes[key]
        self._live += 1
        self.peak_activation_bytes = max(self.peak_activation_bytes, self._live_bytes)
        self.peak_in_flight = max(self.peak_in_flight, self._live)

    def input_grad_done(self, key: tuple[int, int], nbytes: int) -> None:
        """B of a split backward: the output gradients kept for W (`nbytes`) join the forward's activations."""
        self._kept[key] = nbytes
        self._live_bytes += nbytes
        self.peak_activation_bytes = max(self.peak_activation_bytes, self._live_bytes)

    def backward_done(self, key: tuple[int, int]) -> None:
        self._live_bytes -= self.activation_bytes[key] + self._kept.pop(key, 0)
        self._live -= 1

    def _pad(self, start: float, seconds: float) -> None:
        left = start + seconds - clock.device_now()
        if left > 0:
            time.sleep(left)
