"""Pipeline schedules as data: for each rank, the plain list of actions it performs in one training step.

    sched = one_f_one_b(p=4, n_microbatches=8)
    sched[0]            # rank 0's actions: [F mb0 c0, send act mb0 -> 1, F mb1 c0, send act mb1 -> 1, ...]
    simulate(sched)     # pylib.pp.simulate: run the lists against each other, no processes

An action is a forward (F) or backward (B) of microbatch `mb` on chunk `chunk` of this rank, or a send / recv of an
activation ("act", forward direction) or of its gradient ("grad", backward direction) to or from a neighbour.
The executor (`pylib.pp.executor.run_pipeline`) runs exactly these lists, so the figure the book draws from a
schedule *is* what the ranks do.

Compute order per rank (p ranks, m microbatches, v chunks per rank, rank r):
  GPipe        all m forwards, then all m backwards.                          in flight: m
  1F1B         p-r-1 warm-up forwards, then alternate one forward / one       in flight: min(p - r, m)
               backward, then the remaining backwards (PipeDream-Flush).
  interleaved  Megatron's order over the m·v (microbatch, chunk) pairs: microbatches in groups of N (default
               N = p), each group through chunk 0, then chunk 1, ...; 2(p-r-1) + (v-1)·N warm-up forwards, then 1F1B.
               in flight: min(2(p-r-1) + (v-1)·N + 1, m·v) chunk activations (each 1/v of a stage's).
  Megatron's constraint for interleaving: p <= N <= m and (m % N == 0 or m % N >= p); with the default N = p that
  is m % p == 0 (what older Megatron asserted as "number of microbatches must be divisible by pipeline size").

Zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024) split each backward in two
actions: B, the input gradient the previous stage waits for, and W, the weight gradient only the optimizer step
waits for (`pylib.pp.backward`). A B with a W of the same (microbatch, chunk) later in its rank's list computes the
input gradient only; a B without one is the whole backward, as in the schedules above. In flight now means: forward
done, W not yet (W still needs the forward's saved tensors).
  ZB-H1        1F1B's order with every B split and rank r's W of microbatch k moved after its B of microbatch k+r
               (the rest at the end): the later ranks fill their tail with W.  in flight: p on every rank (1F1B's
               peak, on every rank instead of on rank 0 only). Needs m >= p.
  ZB-H2        built by list scheduling at T_F = T_B = T_W (the paper's assumption for its hand-made schedules):
               whenever a rank is free it runs a B whose gradient is there, else a forward while fewer than 2p-1
               microbatches are in flight, else its oldest pending W. Rank 0 fills its warm-up with 2p-1 forwards;
               the trapezoid of 1F1B becomes a parallelogram.  in flight: up to 2p-1. Needs m >= 2p-1.
  ZB-V         two chunks per rank in the V placement (`rank_stage`: chunk 0 = stage r, chunk 1 = stage 2p-1-r,
               so stage 0 and the loss's stage 2p-1 are both on rank 0, and stages p-1, p both on rank p-1, handed
               over in memory): warm-up forwards down the V and back up, then (F, B, W) of each chunk in turn, a
               cool-down whose W's fill the rising side's waits (`_zb_v`). in flight: 2p chunk activations of
               L/2p layers, 1F1B's p stages' worth. Needs m >= p; no bubble at T_F = T_B = T_W once m >= 2p-1
               (2p-1-m units of T_F before that: tests/test_pp_zbv.py).
  DualPipeV    DeepSeek's DualPipe cut in half (`_dualpipe_v`), on the same V: its steady state is slots of an
               overlapped F&B -- the forward of one chunk with the whole backward of the other, written as a
               forward marked overlapped (what="&") followed by its B; `simulate` and `logical_times` cost the slot
               cost_fb, the executor runs the two back to back. A B is split only where its W fills a wait.
               in flight: 2p+1 chunk activations (DeepSeek's PP+1, PP = 2p stages). Needs m >= 2p. Bubble
               (p-1)(T_FB + T_B - 2 T_W) = DeepSeek's (PP/2-1)(F&B + B - 3W), B there the full backward, exactly
               when T_F = T_B and T_FB = T_F + T_B + T_W (tests/test_pp_dualpipe.py).
  DualPipe     DeepSeek's original (`_dualpipe`), even p: two copies of the model, one per direction. The
               "dual" placement is the V's stage -> rank map with its two arms cut apart: stages 0..p-1 (the first
               copy) on ranks 0..p-1 run microbatches 0..m/2-1 from rank 0, stages p..2p-1 (the second copy) on
               ranks p-1..0 run m/2..m-1 from rank p-1 (`microbatch_spans`: where each microbatch starts and
               ends). Rank r and its mirror p-1-r run DualPipeV's order of rank min(r, p-1-r) on p/2 ranks.
               in flight: p+1 stage activations (PP+1), parameters 2x; the two copies' gradients are summed over
               the rank pair after the step (`pylib.pp.pipeline.sum_copy_gradients`). Needs m even, m >= 2p.
               Bubble (p/2-1)(T_FB + T_B - 2 T_W), DeepSeek's (PP/2-1)(F&B + B - 3W) with PP = p.
  V-Half,      Qi, Wan, Amar, Lin, "Pipeline Parallelism with Controllable Memory" (NeurIPS 2024), on the same V:
  V-Min        one microbatch's building block (`controlled_block`) repeated every 6 units, each rank's F's and
               B's in the block's order and its W's, oldest first, in the units the block leaves free
               (`_controlled`). in flight: 2·((p+2)//2) and 2·((p+4)//3) chunk activations, the paper's (p+2)//2
               and (p+4)//3 stages: about a half and a third of 1F1B's p. Any m >= 1. Bubble at T_F = T_B = T_W
               a fixed number of units whatever m, near the paper's p/(2m) and 2p/(3m) bubble rates
               (tests/test_pp_vhalf.py).
Their bubbles, with T_F, T_B, T_W the costs of F, B and W (1F1B's backward costs T_B + T_W), measured on the
busiest rank from its own first compute to its own last (`pylib.pp.timeline.Bubble.own_idle`): 1F1B
(p-1)(T_F+T_B+T_W); ZB-H1 (p-1)(T_F+T_B-T_W) when T_W <= T_F and T_W <= T_B; ZB-H2 zero when T_F = T_B = T_W
(tests/test_pp_schedules.py holds each against the simulator for p up to 8).

Where the communication goes, and why it cannot deadlock. gloo's blocking send waits for the matching receive
(a rendezvous; NCCL point-to-point behaves alike), so an order of sends and receives can deadlock even when the
computation could proceed: in 1F1B, rank 0 sends an activation to rank 1 while rank 1 sends a gradient to rank 0,
and both wait forever (`place_communication(..., policy="naive")` builds exactly that, for the book to show).
We place communication in three steps:
  1. Run the compute orders against their data dependencies with fixed costs (a forward costs `cost_f`, a
     backward `cost_b`; default 1 and 2) to get each compute's logical start and end.
  2. Give each message an exchange time: the first moment, from its producer's end to its consumer's start, when
     neither rank is in the middle of a compute (so that, under these costs, a blocking send waits for nobody).
  3. Each rank does its messages in one *global* order: by exchange time, then by link -- links (0,1), (2,3), ...
     before (1,2), (3,4), ...: the even/odd rule, so that disjoint neighbour pairs talk at the same time -- then
     activations before gradients.
Because every rank walks its own messages in the order of one global list, the earliest unfinished message
always has both its ends waiting for it, so it completes: no deadlock, for any p, m, v and any real timing. And
every receive comes before the compute that uses it, since the exchange time is at most the consumer's start.
The argument never asks where a stage lives, only that each message has two ends on two ranks: it holds for the V
placement too, where the messages follow the schedule's stage -> rank map (`stage_ranks`) and a boundary inside
one rank (the V's turn) is no message at all -- its consumer follows its producer in that rank's own compute
order, which step 1 already checked. tests/test_pp_zbv.py runs ZB-V for p up to 8 and m from p to 2p+3 under both
send semantics and costs other than the placement's.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, field

from pylib.i18n import tr

from .split import virtual_stage

SCHEDULES = ("gpipe", "1f1b", "interleaved")  # the fused-backward ones (what the planner modelled first)
ZERO_BUBBLE = ("zb-h1", "zb-h2", "zb-v", "dualpipev")  # B and W split (RunOptions and compose run ALL_SCHEDULES)
DUAL = ("dualpipe",)  # two copies of the model, fed from both ends (the "dual" placement; not composed)
CONTROLLED = ("v-half", "v-min")  # B and W split, the V placement, less memory than ZB-V (Qi et al., NeurIPS 2024)
ALL_SCHEDULES = SCHEDULES + ZERO_BUBBLE + DUAL + CONTROLLED
V_SHAPED = ("zb-v", "dualpipev") + CONTROLLED  # two chunks per rank in the V placement (`PLACEMENTS`)
OVERLAP = "&"  # Action.what of a forward that shares its slot with the next B (DualPipe's F&B)
PLACEMENTS = ("loop", "v", "dual")
V_MIN_MICROBATCHES = {"zb-v": lambda p: p, "dualpipev": lambda p: 2 * p, "v-half": lambda p: 1, "v-min": lambda p: 1}
V_MIN_MICROBATCHES_TEXT = {"zb-v": "p", "dualpipev": "2p", "v-half": "1", "v-min": "1"}
V_MIN_MICROBATCHES_WHY = {
    "zb-v": "rank 0's warm-up runs 2p-1 forwards of its first chunk",
    "dualpipev": "its main phase runs m - 2p + r + 1 rounds of F&B pairs on rank r, at least one on rank 0",
    "v-half": "its building block is one microbatch",
    "v-min": "its building block is one microbatch",
}


def placement_of(name: str) -> str:
    """Where schedule `name` puts its stages: "v" for the V-shaped ones, "dual" for DualPipe, else "loop"."""
    return "v" if name in V_SHAPED else "dual" if name in DUAL else "loop"


def rank_stage(rank: int, chunk: int, p: int, placement: str = "loop") -> int:
    """The stage chunk `chunk` of rank `rank` holds. "loop" (Megatron's layout, every schedule but the V):
    chunk·p + rank, the activation goes round the ring of ranks v times. "v" (two chunks per rank): chunk 0 holds
    stage rank, chunk 1 stage 2p-1-rank, so the forward goes down the ranks and back up, and the first and the
    last stage are both on rank 0. In both, stage k is chunk k // p of its rank."""
    if placement == "loop":
        return virtual_stage(rank, chunk, p)
    if placement in ("v", "dual"):  # "dual": the V's map, its two arms two copies of the model (`_dualpipe`)
        if chunk not in (0, 1):
            raise ScheduleError(f"the {placement} placement has two chunks per rank, 0 and 1, not chunk {chunk}")
        return rank if chunk == 0 else 2 * p - 1 - rank
    raise ScheduleError(f"unknown placement {placement!r}; known: {', '.join(PLACEMENTS)}")


@functools.lru_cache(maxsize=256)
def stage_ranks(p: int, v: int, placement: str = "loop") -> tuple[int, ...]:
    """ranks[k]: the rank holding stage k, for the p·v stages (the map the executor and the messages follow)."""
    out = [0] * (p * v)
    for r in range(p):
        for c in range(v):
            out[rank_stage(r, c, p, placement)] = r
    return tuple(out)


class ScheduleError(ValueError):
    """A schedule that cannot run: bad sizes, or a compute order whose dependencies can never be met."""


@dataclass(frozen=True, slots=True)
class Action:
    """One step of one rank.

    op: "F" (forward), "B" (backward: the input gradient, and the weight gradient too unless a "W" of the same
    (mb, chunk) follows in the rank's list), "W" (the weight gradient), "send" or "recv".
    mb: microbatch index, 0..m-1.
    chunk: this rank's chunk index, 0..v-1; stage: the virtual stage of that chunk (chunk·p + rank).
    what: for send / recv, "act" (an activation, forward direction) or "grad" (an activation's gradient).
    peer: for send / recv, the pp-group index of the other rank.
    For a send, (mb, stage) name the chunk that produced the tensor; for a recv, the chunk that will consume it.
    """

    op: str
    mb: int
    chunk: int
    stage: int
    what: str = ""
    peer: int | None = None

    @property
    def is_compute(self) -> bool:
        return self.op in ("F", "B", "W")

    @property
    def overlapped(self) -> bool:
        """A forward that runs as one slot with the compute right after it, a B (DualPipe's F&B: marked by
        what="&"; on a GPU the two overlap, on a CPU they run back to back)."""
        return self.op == "F" and self.what == OVERLAP

    @property
    def is_comm(self) -> bool:
        return self.op in ("send", "recv")

    def message(self) -> tuple[str, int, int, int]:
        """(what, mb, from_stage, to_stage) of a send or recv: the same tuple on both ends of one message."""
        step = 1 if self.what == "act" else -1
        if self.op == "send":
            return (self.what, self.mb, self.stage, self.stage + step)
        if self.op == "recv":
            return (self.what, self.mb, self.stage - step, self.stage)
        raise ValueError(f"{self} is not a communication action")

    def __str__(self) -> str:
        if self.is_compute:
            return f"{self.op}{self.mb}" + (f".c{self.chunk}" if self.chunk else "") + self.what
        arrow = "->" if self.op == "send" else "<-"
        return f"{self.op} {self.what} {self.mb}" + (f".c{self.chunk}" if self.chunk else "") + f" {arrow} {self.peer}"


@dataclass
class Schedule:
    """A whole pipeline schedule: `actions[r]` is rank r's list. Index it like that list of lists: `sched[r]`.

    name: one of ALL_SCHEDULES; p ranks, m microbatches, v chunks per rank, N microbatches per group (interleaved
    only); placement: where the stages live (`rank_stage`: "loop", or "v" for the V-shaped schedules).
    `times[r]` holds, for each compute action of rank r, its logical (start, end) from the placement step (a
    forward costs cost_f, a B cost_b, a W cost_w, a B with no W cost_b + cost_w).
    """

    name: str
    p: int
    m: int
    v: int
    actions: list[list[Action]]
    group_size: int | None = None
    cost_f: float = 1.0
    cost_b: float = 2.0
    times: list[dict[Action, tuple[float, float]]] = field(default_factory=list, repr=False)
    cost_w: float = 0.0
    placement: str = "loop"

    def __getitem__(self, rank: int) -> list[Action]:
        return self.actions[rank]

    def __len__(self) -> int:
        return self.p

    def __iter__(self):
        return iter(self.actions)

    @property
    def n_stages(self) -> int:
        return self.p * self.v

    @functools.cached_property
    def spans(self) -> dict[int, tuple[int, int]]:
        """mb -> (first, last) stage it runs through: (0, p·v-1) for every microbatch but DualPipe's, whose first
        half runs through stages 0..p-1 and second half through p..2p-1 (the other copy of the model)."""
        return microbatch_spans(self.actions)

    def model_stage(self, k: int) -> int:
        """Which stage of the model stage k holds: k itself, or k - p on DualPipe's second copy."""
        return k - self.p if self.placement == "dual" and k >= self.p else k

    @property
    def ranks(self) -> tuple[int, ...]:
        """ranks[k]: the rank holding stage k (`stage_ranks`)."""
        return stage_ranks(self.p, self.v, self.placement)

    def rank_of(self, k: int) -> int:
        """The rank holding stage k."""
        return self.ranks[k]

    def deferred(self, rank: int) -> set[tuple[int, int]]:
        """The (mb, chunk) whose weight gradient rank `rank` runs as a separate W (its B is the input side only)."""
        return deferred_weights(self.actions[rank])

    def compute(self, rank: int) -> list[Action]:
        """Rank `rank`'s forwards and backwards only, in order."""
        return [a for a in self.actions[rank] if a.is_compute]

    def table(self) -> str:
        """A text picture: one row per rank, its compute actions in order (F3 = forward of microbatch 3)."""
        return "\n".join(
            tr("rank {r}: {actions}", r=r, actions=" ".join(str(a) for a in self.compute(r))) for r in range(self.p)
        )


def microbatch_spans(orders) -> dict[int, tuple[int, int]]:
    """mb -> (first, last) stage that microbatch's forwards run through, read off the per-rank lists: a forward
    takes its input from the previous stage only after its span's first, a backward its output gradient from the
    next only before its span's last."""
    lo: dict[int, int] = {}
    hi: dict[int, int] = {}
    for order in orders:
        for a in order:
            if a.op == "F":
                lo[a.mb] = min(lo.get(a.mb, a.stage), a.stage)
                hi[a.mb] = max(hi.get(a.mb, a.stage), a.stage)
    return {mb: (lo[mb], hi[mb]) for mb in lo}


def deferred_weights(actions) -> set[tuple[int, int]]:
    """The (mb, chunk) keys of the W actions in one rank's list: their B computes the input gradient only."""
    return {(a.mb, a.chunk) for a in actions if a.op == "W"}


def compute_cost(a: Action, deferred: set, cost_f: float, cost_b: float, cost_w: float) -> float:
    """What action `a` costs: a forward cost_f, a W cost_w, a B cost_b, or cost_b + cost_w if its W is not
    deferred (the fused backward)."""
    if a.op == "F":
        return cost_f
    if a.op == "W":
        return cost_w
    return cost_b if (a.mb, a.chunk) in deferred else cost_b + cost_w


def slot_cost(
    f: Action, b: Action, deferred: set, cost_f: float, cost_b: float, cost_w: float, cost_fb: float | None
) -> float:
    """What an overlapped pair (forward `f`, then B `b`, one slot) costs: cost_fb if given, else the two back to
    back (what a CPU gives)."""
    if cost_fb is not None:
        return cost_fb
    return cost_f + compute_cost(b, deferred, cost_f, cost_b, cost_w)


def overlap_partner(order: list[Action], i: int, rank: int | None = None) -> Action:
    """The B that shares the slot of the overlapped forward order[i]: the next compute in the list."""
    nxt = next((a for a in order[i + 1 :] if a.is_compute), None)
    if nxt is None or nxt.op != "B":
        where = "" if rank is None else f"rank {rank}: "
        raise ScheduleError(f"{where}{order[i]} is marked overlapped but the next compute is {nxt}, not a B")
    return nxt


# --------------------------------------------------------------------------------------------- compute orders


def _check_sizes(p: int, n_microbatches: int, v: int) -> None:
    for name, value in (("p", p), ("m", n_microbatches), ("v", v)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ScheduleError(f"{name}={value!r} must be a positive integer")


def check_interleaved(p: int, n_microbatches: int, v: int, group_size: int | None = None) -> int:
    """Megatron's conditions for the interleaved schedule; returns N (microbatches per group, default p).

    Raises ScheduleError naming the broken condition: v >= 2, p <= N <= m, and m % N == 0 or m % N >= p (with the
    default N = p: m must be a multiple of p)."""
    _check_sizes(p, n_microbatches, v)
    n = p if group_size is None else group_size
    if v < 2:
        raise ScheduleError(tr("interleaved 1F1B needs v >= 2 chunks per rank, got v={v} (v=1 is plain 1F1B)", v=v))
    if p < 2:
        raise ScheduleError(
            tr(
                "interleaved 1F1B needs p >= 2 pipeline ranks, got p={p} (chunks pass activations round the ring of "
                "ranks)",
                p=p,
            )
        )
    if not p <= n <= n_microbatches:
        if group_size is None:
            raise ScheduleError(
                tr(
                    "interleaved 1F1B needs at least p microbatches: m={m} < p={p} "
                    "(Megatron runs microbatches in groups of N=p through each chunk)",
                    m=n_microbatches,
                    p=p,
                )
            )
        why = (
            tr(
                "fewer microbatches per group than ranks: Megatron's warm-up is not built for it, most such "
                "orders deadlock"
            )
            if n < p
            else tr("a group cannot hold more microbatches than the step has")
        )
        raise ScheduleError(
            tr(
                "interleaved 1F1B needs p <= N <= m for the group size N: p={p}, N={n}, m={m} ({why})",
                p=p,
                n=n,
                m=n_microbatches,
                why=why,
            )
        )
    rest = n_microbatches % n
    if 0 < rest < p:
        if group_size is None:
            raise ScheduleError(
                tr(
                    "interleaved 1F1B needs m divisible by p: m={m}, p={p}, m % p = {rest} "
                    "(Megatron: microbatches go through each chunk in groups of p)",
                    m=n_microbatches,
                    p=p,
                    rest=rest,
                )
            )
        raise ScheduleError(
            tr(
                "interleaved 1F1B needs m % N == 0 or m % N >= p: m={m}, N={n}, m % N = {rest} < p={p} "
                "(a short last group would stall the pipeline; Megatron rejects it)",
                m=n_microbatches,
                n=n,
                rest=rest,
                p=p,
            )
        )
    return n


def interleaved_table(n_microbatches: int, v: int, group_size: int) -> list[tuple[int, int]]:
    """Megatron's forward order of (microbatch, chunk) pairs: each group of N microbatches through chunk 0, then
    chunk 1, ... (the last group holds what is left). The k-th backward runs chunk v-1-c of the k-th pair."""
    out = []
    for lo in range(0, n_microbatches, group_size):
        hi = n_microbatches if lo + group_size >= n_microbatches else lo + group_size
        out += [(mb, c) for c in range(v) for mb in range(lo, hi)]
    return out


def _loose_group_size(p: int, v: int, group_size: int | None) -> int:
    """N for an interleaved order built without Megatron's microbatch conditions (only v >= 2 and N >= 1)."""
    if v < 2:
        raise ScheduleError(f"interleaved 1F1B needs v >= 2 chunks per rank, got v={v} (v=1 is plain 1F1B)")
    n = p if group_size is None else group_size
    if not isinstance(n, int) or n < 1:
        raise ScheduleError(f"the group size N={n!r} must be a positive integer")
    return n


def warmup_forwards(
    name: str, p: int, n_microbatches: int, rank: int, v: int = 1, group_size: int | None = None
) -> int:
    """Forwards a rank runs before its first backward (capped at its total number of forwards)."""
    if name == "gpipe":
        return n_microbatches
    if name == "1f1b":
        return min(p - rank - 1, n_microbatches)
    if name == "interleaved":
        n = p if group_size is None else group_size
        return min(2 * (p - rank - 1) + (v - 1) * n, n_microbatches * v)
    if name in ZERO_BUBBLE + CONTROLLED:
        order = compute_order(name, p, n_microbatches, rank)
        return next(i for i, a in enumerate(order) if a.op == "B")
    raise ScheduleError(f"unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")


def compute_order(
    name: str, p: int, n_microbatches: int, rank: int, v: int = 1, group_size: int | None = None, *, strict: bool = True
) -> list[Action]:
    """Rank `rank`'s forwards and backwards, in the order the schedule runs them (no communication yet).

    strict=False skips Megatron's microbatch conditions for the interleaved schedule (`check_interleaved`) other
    than v >= 2 and 1 <= N, so that the book can measure what a short last group of microbatches costs."""

    def f(mb, c):
        return Action("F", mb, c, virtual_stage(rank, c, p))

    def b(mb, c):
        return Action("B", mb, c, virtual_stage(rank, c, p))

    if name == "zb-v":
        return _zb_v(p, n_microbatches, rank)
    if name == "dualpipev":
        return _dualpipe_v(p, n_microbatches, rank)
    if name == "dualpipe":
        return _dualpipe(p, n_microbatches, rank)
    if name in CONTROLLED:
        return _controlled(name, p, n_microbatches, rank)

    if name == "gpipe":
        return [f(i, 0) for i in range(n_microbatches)] + [b(i, 0) for i in range(n_microbatches)]
    if name == "zb-h1":
        return _zb_h1(p, n_microbatches, rank)
    if name == "zb-h2":
        return _zb_h2(p, n_microbatches)[rank]
    if name == "1f1b":
        fwd = [(i, 0) for i in range(n_microbatches)]
        bwd = fwd
    elif name == "interleaved":
        n = check_interleaved(p, n_microbatches, v, group_size) if strict else _loose_group_size(p, v, group_size)
        fwd = interleaved_table(n_microbatches, v, n)
        bwd = [(mb, v - 1 - c) for mb, c in fwd]
    else:
        raise ScheduleError(f"unknown schedule {name!r}; known: {', '.join(ALL_SCHEDULES)}")
    total = len(fwd)
    warm = warmup_forwards(name, p, n_microbatches, rank, v, group_size)
    order = [f(*fwd[i]) for i in range(warm)]
    for k in range(total - warm):
        order += [f(*fwd[warm + k]), b(*bwd[k])]
    order += [b(*bwd[k]) for k in range(total - warm, total)]
    return order


def _zb_h1(p: int, n_microbatches: int, rank: int) -> list[Action]:
    """ZB-H1 on rank r: 1F1B's forwards and B's, and the W of microbatch k right after the B of microbatch k + r
    (the last r W's at the end). Rank r then holds at most (p - r) + r = p microbatches in flight."""
    m = n_microbatches
    out = []
    for a in compute_order("1f1b", p, m, rank):
        out.append(a)
        if a.op == "B" and a.mb - rank >= 0:
            out.append(Action("W", a.mb - rank, 0, rank))
    out += [Action("W", k, 0, rank) for k in range(max(m - rank, 0), m)]
    return out


def _zb_v(p: int, n_microbatches: int, rank: int) -> list[Action]:
    """ZB-V on rank r (chunk 0 = stage r, chunk 1 = stage 2p-1-r; the paper's Section 6). Each chunk's actions
    come in microbatch order; `nxt(op, c)` emits the next one of chunk c if its turn has come (a forward while
    microbatches remain, a B after its forward, a W after its B), else nothing. The phases:
      warm-up    2(p-r)-1 forwards of chunk 0, then r pairs (F chunk 1, F chunk 0), then p-r triples
                 (F, B, W of chunk 1): rank r's first backward is due when the microbatch that started the V
                 comes back up, and chunk 1's stage is closer to the loss the lower r is.
      steady     (F0, B0, W0, F1, B1, W1) until the forwards run out: one microbatch in, one out, per chunk.
      cool-down  r pairs (B0, B1) with their W's postponed, p-r pairs (B0, W0), then the postponed W's of
                 chunk 1 and of chunk 0: the W's fill the time the B's of the rising side wait.
    In flight (forward done, W not yet): 2p chunk activations on every rank, each half a stage of 1F1B's, so
    1F1B's peak (p stage activations); at T_F = T_B = T_W no rank idles between its first and its last compute."""
    m = n_microbatches
    stages = (rank_stage(rank, 0, p, "v"), rank_stage(rank, 1, p, "v"))
    done = {(op, c): 0 for op in "FBW" for c in (0, 1)}
    out: list[Action] = []

    def nxt(op: str, c: int) -> None:
        k = done[(op, c)]
        before = {"F": m, "B": done[("F", c)], "W": done[("B", c)]}[op]
        if k < before:
            out.append(Action(op, k, c, stages[c]))
            done[(op, c)] = k + 1

    for _ in range(2 * (p - rank) - 1):
        nxt("F", 0)
    for _ in range(rank):
        nxt("F", 1), nxt("F", 0)
    for _ in range(p - rank):
        nxt("F", 1), nxt("B", 1), nxt("W", 1)
    while done[("F", 0)] < m or done[("F", 1)] < m:
        for op, c in (("F", 0), ("B", 0), ("W", 0), ("F", 1), ("B", 1), ("W", 1)):
            nxt(op, c)
    for _ in range(rank):
        nxt("B", 0), nxt("B", 1)
    for _ in range(p - rank):
        nxt("B", 0), nxt("W", 0)
    while done[("W", 1)] < m or done[("W", 0)] < m:
        nxt("W", 1) if done[("W", 1)] < done[("B", 1)] else nxt("W", 0)
    return out


def _dualpipe_v(p: int, n_microbatches: int, rank: int) -> list[Action]:
    """DualPipeV on rank r (DeepSeek's DualPipe cut in half into a V, Sea AI Lab's "cut-in-half"; the same V
    placement as ZB-V). Its unit is the F&B slot: the forward of one chunk overlapped with the whole backward
    (B and W) of the other chunk, marked by an overlapped F (`Action.overlapped`) followed by its B. A B is split
    (its W later, oldest first) only where a W is there to fill a wait. The phases, for rank r:
      1  2(p-r-1) forwards of chunk 0                           the microbatches that start the V
      2  r+1 pairs (F0, F1)                                    the first ones turn at rank p-1 and come back
      3  p-r-1 triples (B1 split, the oldest W, F1)            the backward reaches rank r: zero-bubble fill
      4  m-2p+r+1 rounds of the slots (F0 & B1), (F1 & B0)     the steady state, two F&B slots a round (rank
                                                               p-1's first (F0, B1) not overlapped: its B1 waits
                                                               on that F0, through chunk 1's forward)
      5  p-r-1 rounds of B1, then the slot (F1 & B0)           the forwards run out on chunk 0
      6  r+1 pairs (B1, B0), split from the middle one on      the tail: from here the W's can wait
      7  p-r-1 rounds of (the oldest W, B0 split)
      8  the r+1 W's left
    In flight: 2p+1 chunk activations on rank 0, DualPipe's PP+1 with PP = 2p stages."""
    m = n_microbatches
    stages = (rank_stage(rank, 0, p, "v"), rank_stage(rank, 1, p, "v"))
    count = {(op, c): 0 for op in "FB" for c in (0, 1)}
    waiting: list[tuple[int, int]] = []  # (mb, chunk) of the split B's whose W has not run, oldest first
    out: list[Action] = []

    def fwd(c: int, overlap: bool = False) -> None:
        out.append(Action("F", count[("F", c)], c, stages[c], OVERLAP if overlap else ""))
        count[("F", c)] += 1

    def bwd(c: int, split: bool = False) -> None:
        mb = count[("B", c)]
        out.append(Action("B", mb, c, stages[c]))
        count[("B", c)] += 1
        if split:
            waiting.append((mb, c))

    def weight() -> None:
        if waiting:
            mb, c = waiting.pop(0)
            out.append(Action("W", mb, c, stages[c]))

    for _ in range(2 * (p - rank - 1)):
        fwd(0)
    for _ in range(rank + 1):
        fwd(0), fwd(1)
    for _ in range(p - rank - 1):
        bwd(1, split=True), weight(), fwd(1)
    for i in range(m - 2 * p + rank + 1):
        if i == 0 and rank == p - 1:
            fwd(0), bwd(1)
        else:
            fwd(0, overlap=True), bwd(1)
        fwd(1, overlap=True), bwd(0)
    for _ in range(p - rank - 1):
        bwd(1), fwd(1, overlap=True), bwd(0)
    split = False
    for i in range(rank + 1):
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        bwd(1, split)
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        bwd(0, split)
    for _ in range(p - rank - 1):
        weight(), bwd(0, split=True)
    for _ in range(rank + 1):
        weight()
    if waiting or any(count[k] != m for k in count):
        raise ScheduleError(f"dualpipev on rank {rank} of p={p}, m={m} left actions out: {count}, W's {waiting}")
    return out


def _dualpipe(p: int, n_microbatches: int, rank: int) -> list[Action]:
    """DualPipe (DeepSeek-V3, Section 3.2.1) on rank r of an even p: two copies of the model, one per direction.
    Microbatches 0..m/2-1 enter at rank 0 and run the first copy, stages 0..p-1 on ranks 0..p-1; m/2..m-1 enter
    at rank p-1 and run the second copy, stages p..2p-1 (model stages 0..p-1) on ranks p-1..0. So rank r holds
    model stage r (chunk 0) and model stage p-1-r (chunk 1): the V's map (`rank_stage`), its two arms cut apart
    into two pipelines ("dual" placement).

    The order: rank r and its mirror p-1-r run the same one, each its own direction first. It is DualPipeV's
    (`_dualpipe_v`) for rank h = min(r, p-1-r) of p/2 ranks with m/2 microbatches: DualPipeV's chunk 0 is the
    first-half rank's own direction, its chunk 1 the other one. Unfolded, each direction is one DualPipeV run with
    its turn stretched over the mirror ranks: the same dependencies, so the same deadlock freedom and the same
    bubble, (p/2-1)(F&B+B-3W) on p ranks -- DeepSeek's formula with PP = p."""
    m, half = n_microbatches, p // 2
    mirror = rank >= half  # the second half: its own direction (local chunk 0) is the second copy
    h = min(rank, p - 1 - rank)
    stages = (rank_stage(rank, 0, p, "dual"), rank_stage(rank, 1, p, "dual"))
    out = []
    for a in _dualpipe_v(half, m // 2, h):
        chunk = a.chunk ^ mirror
        out.append(Action(a.op, a.mb + (m // 2 if chunk else 0), chunk, stages[chunk], a.what))
    return out


def controlled_block(name: str, p: int, rank: int) -> tuple[int, int, int, int]:
    """When rank `rank` starts microbatch 0's F of chunk 0, F of chunk 1, B of chunk 1 and B of chunk 0 in the
    V-shape building block of V-Half or V-Min (Qi, Wan, Amar, Lin, "Pipeline Parallelism with Controllable
    Memory", NeurIPS 2024, arXiv 2405.15362: the building blocks and the full schedules of its Figure 4), in units
    of one chunk's F = B = W; microbatch k starts 6k later (a rank's work per microbatch: 2 F, 2 B, 2 W).

    The block is one microbatch's path through the V, each pass placed a fixed number of units after the pass it
    waits for on the neighbour rank. The paper's observation: repeated every 6 units, a block whose chunk-c
    activation lives l_c units on a rank (from its F to its W) makes that rank hold about (l_0 + l_1) / 6 chunk
    activations. The two blocks, r the rank:
      V-Half  F0 at 2r (the forward goes down 2 units a rank), F1 at 3p-2-r, B1 at 3p-1+2r+g, B0 at 6p-2-r+g:
              l_0 + l_1 about 6p, so p chunk activations, p/2 stages: half of 1F1B's p. Measured: (p+2)//2 stages
              on the busiest rank, the paper's figure.
      V-Min   every pass 1 unit a rank: F0 at r, F1 at 2p-1-r, B1 at 2p+r+g, B0 at 4p-1-r+g: l_0 + l_1 about 4p,
              p/3 stages. Measured: (p+4)//3 stages, the paper's figure.
    g, the gap, moves both B's later so that no two passes of the repeated block fall on the same unit modulo 6:
    without it F1 and B0 collide when p is even (V-Half, g = 3) and when p is a multiple of 3 (V-Min, g = 2).
    The same numbers are `stable_pattern_v_half` / `stable_pattern_v_min` in sail-sg/zero-bubble-pipeline-
    parallelism, megatron/core/pipeline_parallel/zerobubble/scheduler/zbv_greedy.py (at 064369d)."""
    if name == "v-half":
        g = 3 if p % 2 == 0 else 0
        return (2 * rank, 3 * p - 2 - rank, 3 * p - 1 + 2 * rank + g, 6 * p - 2 - rank + g)
    if name == "v-min":
        g = 2 if p % 3 == 0 else 0
        return (rank, 2 * p - 1 - rank, 2 * p + rank + g, 4 * p - 1 - rank + g)
    raise ScheduleError(f"no building block for {name!r}; known: {', '.join(CONTROLLED)}")


def _controlled(name: str, p: int, n_microbatches: int, rank: int) -> list[Action]:
    """V-Half or V-Min on rank r (the V placement of ZB-V): the building block (`controlled_block`) repeated
    every 6 units for the m microbatches gives each F and B a unit of time; the rank runs them in that order and
    puts a W, oldest B first, into every unit the block leaves free (2 of every 6 in the steady state), the W's
    left at the end. No reordering: the paper's "squeeze" of the warm-up and cool-down is what the simulator and
    the executor do anyway (each action as soon as its inputs are there), so the order alone is the schedule."""
    m = n_microbatches
    stages = (rank_stage(rank, 0, p, "v"), rank_stage(rank, 1, p, "v"))
    slot: dict[int, Action] = {}
    for k in range(m):
        for t, (op, c) in zip(controlled_block(name, p, rank), (("F", 0), ("F", 1), ("B", 1), ("B", 0))):
            slot[t + 6 * k] = Action(op, k, c, stages[c])
    out: list[Action] = []
    waiting: list[Action] = []  # the W's of the B's done, oldest first
    for t in range(max(slot) + 1):
        a = slot.get(t)
        if a is not None:
            out.append(a)
            if a.op == "B":
                waiting.append(Action("W", a.mb, a.chunk, a.stage))
        elif waiting:
            out.append(waiting.pop(0))
    return out + waiting


def _zb_h2(p: int, n_microbatches: int) -> list[list[Action]]:
    """ZB-H2 for every rank: each rank, whenever it is free (unit costs, communication free), runs the B whose
    output gradient has arrived, else the next forward if fewer than 2p-1 microbatches are in flight, else its
    oldest pending W; it waits when none of them can run."""
    m, limit = n_microbatches, 2 * p - 1
    f_end: dict[tuple[int, int], float] = {}  # (mb, rank) -> end of its forward
    b_end: dict[tuple[int, int], float] = {}
    nf, nb, nw = [0] * p, [0] * p, [0] * p
    free = [0.0] * p
    orders: list[list[Action]] = [[] for _ in range(p)]
    t = 0.0
    while any(nw[r] < m for r in range(p)):
        for r in range(p):
            if free[r] > t:
                continue
            if nb[r] < nf[r] and (f_end if r == p - 1 else b_end).get((nb[r], min(r + 1, p - 1)), t + 1) <= t:
                a = Action("B", nb[r], 0, r)
                b_end[(nb[r], r)] = t + 1
                nb[r] += 1
            elif nf[r] < m and nf[r] - nw[r] < limit and (r == 0 or f_end.get((nf[r], r - 1), t + 1) <= t):
                a = Action("F", nf[r], 0, r)
                f_end[(nf[r], r)] = t + 1
                nf[r] += 1
            elif nw[r] < nb[r]:
                a = Action("W", nw[r], 0, r)
                nw[r] += 1
            else:
                continue
            orders[r].append(a)
            free[r] = t + 1
        t += 1
        if t > 4 * m * p + 4 * p:  # every rank runs 3m unit actions; a longer run is a bug in the rules above
            raise ScheduleError(f"zb-h2 list scheduling did not finish for p={p}, m={m}")
    return orders


# --------------------------------------------------------------------------------------------- placement


def _dependencies(a: Action, spans: dict) -> tuple[tuple[str, int, int], ...]:
    """(op, mb, stage) of the compute actions `a` waits for (spans: `microbatch_spans`)."""
    first, last = spans[a.mb]
    if a.op == "W":
        return (("B", a.mb, a.stage),)
    if a.op == "F":
        return (("F", a.mb, a.stage - 1),) if a.stage > first else ()
    if a.stage < last:
        return (("F", a.mb, a.stage), ("B", a.mb, a.stage + 1))
    return (("F", a.mb, a.stage),)


def _slot(order: list[Action], i: int, rank: int, spans: dict, costs: tuple) -> tuple[tuple, tuple, float]:
    """The slot that starts at order[i], as `logical_times` runs it: (the (op, mb, stage) of its actions, those of
    the computes it waits for, its cost). A slot is one action, or an overlapped F with its B (`slot_cost`).
    costs: (cost_f, cost_b, cost_w, cost_fb, the rank's deferred W's)."""
    cost_f, cost_b, cost_w, cost_fb, deferred = costs
    a = order[i]
    if a.op == "F" and a.what == OVERLAP:
        b = overlap_partner(order, i, rank)
        keys = ((a.op, a.mb, a.stage), (b.op, b.mb, b.stage))
        cost = slot_cost(a, b, deferred, cost_f, cost_b, cost_w, cost_fb)
        return keys, _dependencies(a, spans) + _dependencies(b, spans), cost
    return ((a.op, a.mb, a.stage),), _dependencies(a, spans), compute_cost(a, deferred, cost_f, cost_b, cost_w)


def logical_times(
    orders: list[list[Action]],
    n_stages: int,
    cost_f: float = 1.0,
    cost_b: float = 2.0,
    cost_w: float = 0.0,
    cost_fb: float | None = None,
):
    """Start and end of every compute action when each rank runs its order as soon as the data is there
    (communication free; costs as `compute_cost`; an overlapped F&B pair is one slot of `slot_cost`, both its
    actions given the slot's start and end). Returns {(op, mb, stage): (start, end)}; raises ScheduleError
    if some action's data never arrives (the compute orders themselves deadlock).

    The ranks run in sweeps, each in turn as far as it can: a slot (`_slot`) starts at the latest of its rank's
    clock and its inputs' ends, or the rank waits there, the slot kept for a later sweep. (Nothing is worked out
    ahead for every action: objects that live through the run make the garbage collector sweep a large heap.)"""
    spans = microbatch_spans(orders)
    if any(hi >= n_stages for _, hi in spans.values()):
        raise ScheduleError(f"a forward names a stage beyond the {n_stages} stages: {spans}")
    costs = [(cost_f, cost_b, cost_w, cost_fb, deferred_weights(order)) for order in orders]
    done: dict[tuple[str, int, int], tuple[float, float]] = {}
    end: dict[tuple[str, int, int], float] = {}  # done's ends alone
    pos, clock = [0] * len(orders), [0.0] * len(orders)
    waiting: list = [None] * len(orders)  # the slot each rank waits at
    progress = True
    while progress:
        progress = False
        for r, order in enumerate(orders):
            i, t, slot = pos[r], clock[r], waiting[r]
            while i < len(order):
                keys, deps, cost = slot or _slot(order, i, r, spans, costs[r])
                start = t
                for d in deps:
                    e = end.get(d)
                    if e is None:
                        break
                    if e > start:  # the first of equal ends, as max() keeps
                        start = e
                else:
                    t = start + cost
                    for key in keys:  # an overlapped pair: both start together and end together
                        end[key] = t
                        done[key] = (start, t)
                    i += len(keys)
                    slot = None
                    continue
                slot = (keys, deps, cost)  # an input not there yet
                break
            progress = progress or i > pos[r]
            pos[r], clock[r], waiting[r] = i, t, slot
    stuck = {r: str(order[pos[r]]) for r, order in enumerate(orders) if pos[r] < len(order)}
    if stuck:
        raise ScheduleError(f"the compute orders deadlock: ranks wait forever at {stuck}")
    return done


def _link(from_stage: int, to_stage: int, ranks: tuple[int, ...]) -> int:
    """The link a message crosses, numbered by the rank on its forward-direction sending side: stage boundary
    (k, k+1) is link ranks[k] (in the loop placement k % p, joining rank k % p to rank (k+1) % p)."""
    return ranks[min(from_stage, to_stage)]


def _messages_out(a: Action, ranks: tuple[int, ...], spans: dict) -> list[Action]:
    """The send a compute issues: a forward's activation to the next stage, a backward's gradient to the previous
    -- none where that stage is on the same rank (the V's turn, stages p-1 and p on rank p-1: handed over in
    memory), none past the microbatch's span (`microbatch_spans`)."""
    me, (first, last) = ranks[a.stage], spans[a.mb]
    if a.op == "F" and a.stage < last and ranks[a.stage + 1] != me:
        return [Action("send", a.mb, a.chunk, a.stage, "act", ranks[a.stage + 1])]
    if a.op == "B" and a.stage > first and ranks[a.stage - 1] != me:
        return [Action("send", a.mb, a.chunk, a.stage, "grad", ranks[a.stage - 1])]
    return []


def _messages_in(a: Action, ranks: tuple[int, ...], spans: dict) -> list[Action]:
    """The receive a compute needs first: its input activation, or its output's gradient (none from its own
    rank, none past the microbatch's span)."""
    me, (first, last) = ranks[a.stage], spans[a.mb]
    if a.op == "F" and a.stage > first and ranks[a.stage - 1] != me:
        return [Action("recv", a.mb, a.chunk, a.stage, "act", ranks[a.stage - 1])]
    if a.op == "B" and a.stage < last and ranks[a.stage + 1] != me:
        return [Action("recv", a.mb, a.chunk, a.stage, "grad", ranks[a.stage + 1])]
    return []


class _ExchangeTimes:
    """When each message can be exchanged: the first moment tau, between its producer's end and its consumer's
    start, when neither end is in the middle of a compute (so a blocking send waits for nobody)."""

    def __init__(self, orders: list[list[Action]], times: dict, ranks: tuple[int, ...], spans: dict):
        self.spans = [[times[(a.op, a.mb, a.stage)] for a in order] for order in orders]
        self.starts = [[start for start, _ in rank_spans] for rank_spans in self.spans]
        self.consumer_start = {}  # message -> (receiving rank, start of the compute that needs it)
        for r, order in enumerate(orders):
            for a in order:
                for rv in _messages_in(a, ranks, spans):
                    self.consumer_start[rv.message()] = (r, times[(a.op, a.mb, a.stage)][0])

    def free(self, r: int, t: float) -> bool:
        i = bisect.bisect_left(self.starts[r], t) - 1  # the last compute starting before t
        return i < 0 or self.spans[r][i][1] <= t

    def __call__(self, sender: int, produced: float, msg) -> float:
        receiver, needed = self.consumer_start[msg]
        points = {produced, needed}
        for r in (sender, receiver):
            lo, hi = bisect.bisect_left(self.starts[r], produced), bisect.bisect_right(self.starts[r], needed)
            spans = self.spans[r][max(lo - 1, 0) : hi]
            points.update(x for span in spans for x in span if produced <= x <= needed)
        return next((t for t in sorted(points) if self.free(sender, t) and self.free(receiver, t)), produced)


def _message_key(tau: float, msg, ranks: tuple[int, ...]) -> tuple:
    """The global order of the step's messages: by exchange time, then even links before odd ones, activations
    before gradients, then microbatch and sender."""
    what, mb, src, dst = msg
    link = _link(src, dst, ranks)
    return (tau, 0, link % 2, link, 0 if what == "act" else 1, mb, src)


def place_communication(
    orders: list[list[Action]],
    p: int,
    v: int,
    cost_f: float = 1.0,
    cost_b: float = 2.0,
    policy: str = "ordered",
    cost_w: float = 0.0,
    placement: str = "loop",
    cost_fb: float | None = None,
):
    """Insert the sends and receives into each rank's compute order (stages on ranks as `placement` puts them:
    `rank_stage`).

    policy "ordered": the deadlock-free placement described in the module docstring.
    policy "naive": every receive right before the compute that needs it and every send right after the compute
    that produced it -- the obvious placement, which deadlocks under blocking sends (kept for the book to show).
    Returns (actions per rank, logical times per rank)."""
    n_stages, ranks, spans = p * v, stage_ranks(p, v, placement), microbatch_spans(orders)
    times = logical_times(orders, n_stages, cost_f, cost_b, cost_w, cost_fb)
    per_rank_times = [{a: times[(a.op, a.mb, a.stage)] for a in order} for order in orders]
    if policy == "naive":
        placed = [
            [x for a in order for x in (*_messages_in(a, ranks, spans), a, *_messages_out(a, ranks, spans))]
            for order in orders
        ]
        return placed, per_rank_times
    if policy != "ordered":
        raise ValueError(f"policy must be 'ordered' or 'naive', not {policy!r}")
    exchange = _ExchangeTimes(orders, times, ranks, spans)
    events: list[list[tuple]] = [[] for _ in range(p)]
    for r, order in enumerate(orders):
        for a in order:
            start, end = times[(a.op, a.mb, a.stage)]
            # a compute sorts after the messages exchanged at its start (both halves of an overlapped pair start
            # together: the pair's receives come before its forward, its sends after its B; the sort is stable)
            events[r].append(((start, 1), a))
            for snd in _messages_out(a, ranks, spans):
                msg = snd.message()
                key = _message_key(exchange(r, end, msg), msg, ranks)
                receiver = exchange.consumer_start[msg][0]
                events[r].append((key, snd))
                events[receiver].append((key, Action("recv", msg[1], msg[3] // p, msg[3], msg[0], r)))
    actions = [[a for _, a in sorted(ev, key=lambda e: e[0])] for ev in events]
    return actions, per_rank_times


# --------------------------------------------------------------------------------------------- the schedules


def check_schedule(
    name: str, p: int, n_microbatches: int, v: int = 1, *, group_size: int | None = None, strict: bool = True
) -> int | None:
    """Everything `build` checks before it builds, without building (a schedule of p*m*v actions and its timing
    take seconds for thousands of microbatches; this is instant). Raises the ScheduleError `build` would raise;
    returns the interleaved group size N (None for the other schedules)."""
    _check_sizes(p, n_microbatches, v)
    if name not in ALL_SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}; known: {', '.join(ALL_SCHEDULES)}")
    if name == "interleaved":
        if strict:
            return check_interleaved(p, n_microbatches, v, group_size)
        return _loose_group_size(p, v, group_size)
    if name in V_SHAPED:
        _check_v(name, p, n_microbatches, v, group_size)
        return None
    if name in DUAL:
        _check_dual(name, p, n_microbatches, v, group_size)
        return None
    if v != 1:
        raise ScheduleError(f"{name} runs one chunk per rank (v=1), got v={v}; use 'interleaved' for v > 1")
    if group_size is not None:
        raise ScheduleError(f"group_size applies to the interleaved schedule only, not {name}")
    if name == "zb-h1" and n_microbatches < p:
        raise ScheduleError(
            f"zb-h1 needs at least as many microbatches as ranks: m={n_microbatches} < p={p} (rank r defers its "
            "W's by r microbatches; with m < p there is no steady state for them to fill)"
        )
    if name == "zb-h2" and n_microbatches < 2 * p - 1:
        raise ScheduleError(
            f"zb-h2 needs m >= 2p-1 microbatches: m={n_microbatches}, p={p}, 2p-1={2 * p - 1} (rank 0 fills its "
            "warm-up with 2p-1 forwards before its first B)"
        )
    return None


def _check_v(name: str, p: int, n_microbatches: int, v: int, group_size: int | None) -> None:
    """The V-shaped schedules' sizes: two chunks per rank, and (`V_MIN_MICROBATCHES`) enough microbatches."""
    if v != 2:
        raise ScheduleError(
            f"{name} runs two chunks per rank in a V (stage r and stage 2p-1-r on rank r): v must be 2, got v={v}"
        )
    if group_size is not None:
        raise ScheduleError(f"group_size applies to the interleaved schedule only, not {name}")
    least = V_MIN_MICROBATCHES[name](p)
    if n_microbatches < least:
        raise ScheduleError(
            f"{name} needs m >= {V_MIN_MICROBATCHES_TEXT[name]} microbatches: m={n_microbatches}, p={p}, "
            f"{V_MIN_MICROBATCHES_TEXT[name]}={least} ({V_MIN_MICROBATCHES_WHY[name]})"
        )


def _check_dual(name: str, p: int, n_microbatches: int, v: int, group_size: int | None) -> None:
    """DualPipe's sizes (DeepSeek's `DualPipe.step` asserts the same): two chunks per rank (one per direction), an
    even p (rank r pairs with rank p-1-r), m even (half from each end) and m >= 2p (each half runs DualPipeV's
    order on p/2 rank pairs, which needs m/2 >= 2(p/2))."""
    if v != 2:
        raise ScheduleError(
            f"{name} runs two chunks per rank, one per direction (stage r of one copy, p-1-r of the other): v must "
            f"be 2, got v={v}"
        )
    if group_size is not None:
        raise ScheduleError(f"group_size applies to the interleaved schedule only, not {name}")
    if p % 2:
        raise ScheduleError(
            f"{name} needs an even number of pipeline ranks: p={p} (rank r and rank p-1-r are a pair, each the "
            "mirror of the other; use dualpipev, its V cut in half, for any p)"
        )
    if n_microbatches % 2 or n_microbatches < 2 * p:
        raise ScheduleError(
            f"{name} needs an even m >= 2p microbatches: m={n_microbatches}, p={p}, 2p={2 * p} (half enter at each "
            "end; each half runs DualPipeV's order over p/2 rank pairs, which needs m/2 >= p)"
        )


def build(
    name: str,
    p: int,
    n_microbatches: int,
    v: int = 1,
    *,
    group_size: int | None = None,
    cost_f: float = 1.0,
    cost_b: float | None = None,
    cost_w: float | None = None,
    policy: str = "ordered",
    strict: bool = True,
) -> Schedule:
    """The schedule `name` (one of ALL_SCHEDULES) for p ranks, m microbatches, v chunks per rank.

    cost_f, cost_b, cost_w: the costs the communication is placed with (a B costs cost_b, a W cost_w, a B with no
    W cost_b + cost_w; DualPipeV's overlapped F&B slot its two halves back to back: the order is deadlock-free under
    any real timing, as the module docstring argues, and `simulate` takes the slot's real cost). Defaults: a
    backward costs two forwards, all of it in B for the fused schedules (cost_b=2, cost_w=0), half in B and half in
    W for the zero-bubble ones (cost_b=cost_w=1).

    strict=False builds an interleaved schedule that Megatron would reject (m not a multiple of N, a short last
    group): it still runs and is still correct, but its bubble exceeds (p-1)/(v·m) -- which is why Megatron
    rejects it."""
    group_size = check_schedule(name, p, n_microbatches, v, group_size=group_size, strict=strict)
    split = name in ZERO_BUBBLE + DUAL + CONTROLLED
    cost_b = (1.0 if split else 2.0) if cost_b is None else cost_b
    cost_w = (1.0 if split else 0.0) if cost_w is None else cost_w
    orders = [compute_order(name, p, n_microbatches, r, v, group_size, strict=strict) for r in range(p)]
    placement = placement_of(name)
    actions, times = place_communication(orders, p, v, cost_f, cost_b, policy, cost_w, placement)
    return Schedule(name, p, n_microbatches, v, actions, group_size, cost_f, cost_b, times, cost_w, placement)


def zb_v(p: int, n_microbatches: int, **kw) -> Schedule:
    """ZB-V: two chunks per rank in the V placement, no bubble when T_F = T_B = T_W, 1F1B's peak memory."""
    return build("zb-v", p, n_microbatches, 2, **kw)


def dualpipe(p: int, n_microbatches: int, **kw) -> Schedule:
    """DualPipe: two copies of the model fed from both ends (even p, even m >= 2p), DualPipeV's order per pair."""
    return build("dualpipe", p, n_microbatches, 2, **kw)


def dualpipe_v(p: int, n_microbatches: int, **kw) -> Schedule:
    """DualPipeV: the V placement, overlapped F&B slots in the steady state (`simulate`'s cost_fb: what one costs)."""
    return build("dualpipev", p, n_microbatches, 2, **kw)


def gpipe(p: int, n_microbatches: int, **kw) -> Schedule:
    """GPipe: every rank runs all m forwards, then all m backwards."""
    return build("gpipe", p, n_microbatches, 1, **kw)


def one_f_one_b(p: int, n_microbatches: int, **kw) -> Schedule:
    """1F1B (PipeDream-Flush): p-r-1 warm-up forwards, then one forward / one backward, then the cool-down."""
    return build("1f1b", p, n_microbatches, 1, **kw)


def interleaved_1f1b(p: int, n_microbatches: int, v: int, group_size: int | None = None, **kw) -> Schedule:
    """Megatron's interleaved 1F1B with v model chunks per rank (virtual pipeline size v)."""
    return build("interleaved", p, n_microbatches, v, group_size=group_size, **kw)


def zb_h1(p: int, n_microbatches: int, **kw) -> Schedule:
    """ZB-H1: 1F1B with B and W split and rank r's W's deferred by r microbatches (1F1B's peak memory)."""
    return build("zb-h1", p, n_microbatches, 1, **kw)


def zb_h2(p: int, n_microbatches: int, **kw) -> Schedule:
    """ZB-H2: up to 2p-1 microbatches in flight, no bubble when T_F = T_B = T_W."""
    return build("zb-h2", p, n_microbatches, 1, **kw)
