"""What a ring reports at its seams: the work and the time of each step, observed, not threaded through.

The ring (`pylib.cp.ring`) calls its recorder at three points of every step, forward and backward:

    with recorder.computing():   the block's attention (and merge, or gradient) -- its seconds are compute
    with recorder.waiting():     blocked on a transfer -- its seconds are the communication compute did not hide
    recorder.step_done(...)      the step is over: its plan (which rows against which) and the time just measured

`RingRecorder` records nothing (the default); `RingStats` keeps one `RingStep` per step. Times come from
`pylib.runtime.clock.device_now` (on CUDA it first waits for the compute stream, so a
step is timed where it ran, not where it was launched).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

from pylib.runtime import clock


class RingRecorder:
    """The recorder that records nothing: the ring's seams cost nothing when nobody is measuring."""

    def computing(self):
        return nullcontext()

    def waiting(self):
        return nullcontext()

    def step_done(self, phase: str, step: int, kv_owner: int, plan, per_entry: int) -> None:
        """Step `step` of `phase` ("forward" / "backward") is over; it held the K/V block of rank `kv_owner` and
        computed `plan` (a `BlockPlan`, None when fully masked); per_entry = b * n_head score rows per entry."""


@dataclass
class RingStep:
    """One rank's record of one ring step. Work counts are score entries times b * n_head."""

    phase: str
    step: int
    kv_owner: int
    q_rows: int
    kv_rows: int
    causal: bool
    unmasked: int
    computed: int
    compute_s: float
    wait_s: float


@dataclass
class RingStats(RingRecorder):
    """Pass `stats=RingStats()` to `ring_attention` to record per-step work and time (forward and backward)."""

    steps: list[RingStep] = field(default_factory=list)
    _compute_s: float = field(default=0.0, init=False, repr=False, compare=False)
    _wait_s: float = field(default=0.0, init=False, repr=False, compare=False)

    @contextmanager
    def computing(self):
        t0 = clock.device_now()
        yield
        self._compute_s += clock.device_now() - t0

    @contextmanager
    def waiting(self):
        t0 = clock.device_now()
        yield
        self._wait_s += clock.device_now() - t0

    def step_done(self, phase: str, step: int, kv_owner: int, plan, per_entry: int) -> None:
        self.steps.append(
            RingStep(
                phase=phase,
                step=step,
                kv_owner=kv_owner,
                q_rows=plan.n_q if plan else 0,
                kv_rows=plan.n_kv if plan else 0,
                causal=plan.causal if plan else False,
                unmasked=per_entry * plan.unmasked if plan else 0,
                computed=per_entry * plan.computed if plan else 0,
                compute_s=self._compute_s,
                wait_s=self._wait_s,
            )
        )
        self._compute_s = self._wait_s = 0.0

    def select(self, phase: str | None = "forward") -> list[RingStep]:
        return [s for s in self.steps if phase is None or s.phase == phase]

    def work(self, phase: str | None = "forward", what: str = "unmasked") -> int:
        """Total score entries this rank computed: what="unmasked" (useful) or "computed" (evaluated)."""
        return sum(getattr(s, what) for s in self.select(phase))

    def compute_s(self, phase: str | None = "forward") -> float:
        return sum(s.compute_s for s in self.select(phase))

    def wait_s(self, phase: str | None = "forward") -> float:
        """Seconds this rank sat blocked waiting for a transfer: the communication compute did not hide."""
        return sum(s.wait_s for s in self.select(phase))
