"""All of it at once: the reference Transformer on a TP x SP x CP x EP x DP x PP mesh, trained exactly like the
reference on one device.

    ParallelTransformer.from_full(model, mesh, RunOptions(...), batch=, seq=, lr=...)   # pylib.plan.RunOptions
        .step(ids, targets) -> StepResult      # the global batch [B, S]; .loss = the reference's mean loss
        .step(ids, targets, clip=GradClip(1.0))   # clipped to the global gradient norm; .clip = the ClipResult
        .reduction_table()                     # which group completes each parameter's gradient, as rows
        .memory(), .parameter_pieces(), .layouts, .shard_specs()
    compose_problems(cfg, ParallelConfig, world, batch=, seq=, options=) -> [every violated constraint]
        # training=False: what building and evaluating need; a MoE layer under TP without SP is built and refused
        # only by a training forward (.step(), or the MoE layer in training mode), as Megatron-Core's MoELayer
    holder_labels(seq, cp, tp, layout)          # which rank of a replica holds each position
(The training loops, `train` and `train_reference`, are `pylib.experiments.compose_training`.)

Files: checks.py (every constraint, all reported), stage.py (one pipeline stage built from TP, CP and EP modules),
reductions.py (the gradient-reduction table and the reductions after DP's), clip.py (the global gradient norm,
each parameter counted once, and clipping to it), model.py (the composed model and one
training step), placement.py (which rank holds each position), probe.py (the FFN activation probe), report.py
(per-rank memory and traffic tables),
checkpoint.py (save on one mesh, load on another: `save_checkpoint`, `load_checkpoint`, `restore`).
"""

from .checks import ComposeConfigError, check_compose, compose_problems
from .clip import ClipError, ClipResult, GradClip, NonFiniteGradientError, NormFamily, clip_grads, global_norm
from .model import ParallelTransformer, StepResult, local_batch
from .placement import holder_labels
from .probe import ffn_probe
from .reductions import (
    ParamInfo,
    Reduction,
    finalize_gradients,
    held_gradient_pieces,
    held_parameter_pieces,
    parameter_map,
    reduction_table,
)
from .report import (
    TRAFFIC_OPTIONS,
    format_reduction_table,
    format_report,
    formula_traffic,
    reference_ffn_bytes,
    report_rows,
    traced_traffic,
    traffic_matches_formulas,
)
from .stage import ParallelStage, build_layer

__all__ = [
    "ClipError",
    "ClipResult",
    "ComposeConfigError",
    "GradClip",
    "NonFiniteGradientError",
    "NormFamily",
    "clip_grads",
    "global_norm",
    "ParallelStage",
    "ParallelTransformer",
    "ParamInfo",
    "Reduction",
    "StepResult",
    "build_layer",
    "check_compose",
    "compose_problems",
    "ffn_probe",
    "finalize_gradients",
    "format_reduction_table",
    "format_report",
    "formula_traffic",
    "held_gradient_pieces",
    "held_parameter_pieces",
    "holder_labels",
    "local_batch",
    "parameter_map",
    "reference_ffn_bytes",
    "reduction_table",
    "report_rows",
    "traced_traffic",
    "traffic_matches_formulas",
    "TRAFFIC_OPTIONS",
]
