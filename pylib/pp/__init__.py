"""Pipeline parallelism: the model cut into stages, schedules as data, a pure simulator, and the executor.

stage_layers(n_layers, pp, v)            # which layers chunk c of rank r holds (Megatron's layout)
sched = build("1f1b", p, m)              # or gpipe(p, m), one_f_one_b(p, m), interleaved_1f1b(p, m, v)
sched = build("zb-h1", p, m)             # zero bubble: zb_h1(p, m), zb_h2(p, m): the backward split in B and W
sched = zb_v(p, m)                       # ZB-V: v=2 chunks in the V (stage r and 2p-1-r on rank r), sched.ranks
sched = dualpipe_v(p, m)                 # DualPipeV: the V with overlapped F&B slots (an F marked "&", then its B)
sched = dualpipe(p, m)                   # DualPipe: two model copies fed from both ends (even p; placement "dual")
sched[r]                                 # rank r's plain list of Actions: F / B / W / send / recv
simulate(sched)                          # run the lists against each other: deadlocks, timeline
bubble(timeline), peak_in_flight(timeline)

Where W lives: a schedule with a W for (mb, chunk) in rank r's list makes that B the input gradient only; the
executor's B calls `backward_input` (pylib.pp.backward), which keeps the forward's graph and the output gradient
at each frontier node (a linear's matmul, a norm's multiply), and its W calls `WeightGrad.run()`, which restarts
autograd there for the parameters alone. Between the two, the recorder counts the forward's activations and the
kept gradients as held; the simulator costs a B T_B, a W T_W and an unsplit backward T_B + T_W.

# inside launched ranks:
pipe = PipelineParallel(build_model(cfg), group=mesh.pp, v=1)
run = pipe.step(ids, targets, schedule="1f1b", n_microbatches=8)     # run.loss, run.timeline
run_pipeline(sched, chunks, Boundary(shape), group=..., inputs=..., targets=...)   # any stage modules
recorder=PipelineRecorder(measure_memory=False, compute_delay=(t_f, t_b))       # what observes a run
recorder=PipelineRecorder(measure_memory=False, record_timeline=False)          # nothing but the step (a timing)
"""

from pylib.plan.schedules import (
    ALL_SCHEDULES,
    SCHEDULES,
    ZERO_BUBBLE,
    Action,
    Schedule,
    ScheduleError,
    build,
    check_interleaved,
    compute_order,
    deferred_weights,
    dualpipe,
    dualpipe_v,
    gpipe,
    interleaved_1f1b,
    interleaved_table,
    one_f_one_b,
    place_communication,
    rank_stage,
    stage_ranks,
    warmup_forwards,
    zb_h1,
    zb_h2,
    zb_v,
)

from .backward import WeightGrad, backward_input
from .executor import Boundary, PipelineRun, microbatches, pipeline_device, run_pipeline
from .pipeline import PipelineParallel, sum_copy_gradients
from .recorder import PipelineRecorder
from .simulate import DeadlockError, simulate
from .split import (
    PipelineChunk,
    check_split,
    layers_of_stage,
    lm_loss,
    rank_chunks,
    shard_specs,
    split_model,
    stage_layers,
    virtual_stage,
)
from .timeline import Bubble, Event, bubble, idle_intervals, peak_in_flight, replay

__all__ = [
    "ALL_SCHEDULES",
    "Boundary",
    "SCHEDULES",
    "WeightGrad",
    "ZERO_BUBBLE",
    "Action",
    "Bubble",
    "DeadlockError",
    "Event",
    "PipelineChunk",
    "PipelineParallel",
    "PipelineRecorder",
    "PipelineRun",
    "Schedule",
    "ScheduleError",
    "bubble",
    "backward_input",
    "build",
    "check_interleaved",
    "check_split",
    "compute_order",
    "deferred_weights",
    "dualpipe",
    "dualpipe_v",
    "gpipe",
    "idle_intervals",
    "interleaved_1f1b",
    "interleaved_table",
    "layers_of_stage",
    "lm_loss",
    "microbatches",
    "one_f_one_b",
    "peak_in_flight",
    "pipeline_device",
    "place_communication",
    "rank_stage",
    "stage_ranks",
    "rank_chunks",
    "replay",
    "run_pipeline",
    "shard_specs",
    "simulate",
    "split_model",
    "stage_layers",
    "sum_copy_gradients",
    "virtual_stage",
    "warmup_forwards",
    "zb_h1",
    "zb_h2",
    "zb_v",
]
