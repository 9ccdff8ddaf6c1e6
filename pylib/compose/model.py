"""The composed model: the reference Transformer on a TP x SP x CP x EP x DP x PP mesh, trained step by step.

    mesh = Mesh(ParallelConfig(tp=2, cp=2, dp=2, pp=2))
    options = RunOptions(schedule="1f1b", n_microbatches=2, zero_stage=ZeroStage.ZERO1)
    model = ParallelTransformer.from_full(build_model(cfg), mesh, options)
    result = model.step(ids, targets)           # the GLOBAL batch [B, S], the same on every rank
    result.loss                                  # the reference's mean cross-entropy over the whole batch

Who holds what (each rank keeps only its shards):
    PP   this rank's v chunks (virtual stages c*pp + pp_rank), `pylib.pp`'s layer split
    TP   heads, h_ffn and vocabulary rows of its TP index; SP: LayerNorm and residual on s/(cp*tp) tokens
    CP   its zig-zag part of the sequence; attention over CP by ring or Ulysses at the true positions
    EP   E/ep experts of every MoE layer (h_ffn/etp of each), on the folded expert groups; the shared experts (if
         any) as TP holds the dense MLP, the same slice on every EP rank
    DP   rows [d*B/dp, (d+1)*B/dp) of the batch; the optimizer (ZeRO-1/2: its state, ZeRO-3: also the parameters
         and gradients) sharded over dp-cp (dense) or edp (experts) by `pylib.dp`

One step: the rank's batch part is cut into m microbatches; `pylib.pp.run_pipeline` runs the schedule's
forwards and backwards (each microbatch's loss / m, so the accumulated gradients are those of the mean); the
data-parallel wrapper of each chunk reduces once, after that chunk's last backward; `finalize_gradients` completes
what DP cannot (TP sums, expert scaling, a tied embedding's sum over the first and last stage; `reductions.py`);
with cfg.moe.bias_update_rate > 0 each MoE layer's expert bias moves by the step's counts summed over tp-dp-cp
(`_update_expert_bias`); each wrapper's optimizer steps. The loss reported is
the dp-cp average of the last stage's loss (phase "loss": two tiny all-reduces, not part of training).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch

from pylib.cp.layout import shard_sequence
from pylib.dp.batch import micro_batch
from pylib.dp.buckets import DEFAULT_BUCKET_BYTES
from pylib.dp.memory import HeldBytes
from pylib.dp.wrap import wrap
from pylib.ep.gather_dispatcher import AllGatherState
from pylib.i18n import tr
from pylib.model import torch_dtype
from pylib.model.moe import tokens_per_expert
from pylib.plan.fields import instance
from pylib.plan.options import CP_LAYOUT, MixedPrecision, RunOptions, ZeroStage
from pylib.plan.schedules import build, deferred_weights, placement_of, rank_stage
from pylib.pp.executor import Boundary, microbatches, run_pipeline
from pylib.pp.recorder import PipelineRecorder
from pylib.pp.split import embedding_group
from pylib.runtime import collectives as C
from pylib.runtime.agreement import agree_on_batch
from pylib.runtime.recompute import is_recomputing
from pylib.runtime.sharding import ShardSpec
from pylib.runtime.tracer import phase, tag

from . import checks
from .checks import ComposeConfigError, check_compose, compose_problems
from .clip import GradClip, clip_held_gradients
from .probe import SavedProbe
from .reductions import (
    EMBD,
    finalize_gradients,
    held_gradient_pieces,
    held_parameter_pieces,
    kv_replica_counts,
    parameter_map,
    reduction_table,
)
from .stage import ParallelStage


@dataclass
class StepResult:
    """What one rank saw in one step.

    loss: the mean cross-entropy over the whole global batch (every rank). local_loss: this rank's dp-cp replica's
    loss (last-stage ranks; None elsewhere), losses: its per-microbatch losses. activation_bytes: bytes autograd
    saved per (microbatch, chunk) forward, parameters excluded (`probe.SavedProbe`; under ZeRO-3 also the gathered
    parameter buffers; see `step`'s activation_probe); peak_activation_bytes: the most held at once over the schedule.
    reduced: element counts of the TP gradient sums. moe_routing: per MoE forward, (layer, send_counts,
    recv_counts, etp_rows) of the all-to-all dispatch -- what the EP traffic formulas need; under the all-gather
    dispatcher (layer, None, None, [R]), R the rows this rank's experts took from the gathered tokens (its
    traffic does not depend on the routing, its saved activations do). clip: the global gradient norm and the
    coefficient applied (`clip.ClipResult`) when the step clipped."""

    loss: float
    local_loss: float | None
    losses: list[float]
    activation_bytes: dict
    peak_activation_bytes: int
    peak_in_flight: int
    reduced: dict
    moe_routing: list = field(default_factory=list)
    timeline: list = field(default_factory=list)
    clip: object = None  # the `clip.ClipResult` of a step run with clip=GradClip(...); None otherwise
    expert_counts: dict = field(default_factory=dict)  # MoE layer -> this rank's routed assignments per expert [E]


def local_batch(x: torch.Tensor, mesh, layout: str = CP_LAYOUT) -> torch.Tensor:
    """This rank's part of a global [B, S] tensor: rows [d*B/dp, (d+1)*B/dp) of its DP index, then its CP part of
    the sequence (`pylib.cp.shard_sequence`, zig-zag by default). The same on every TP rank (SP splits the sequence
    further inside the model, after the embedding)."""
    rows = micro_batch(x, mesh.dp.rank, mesh.dp.size)
    return shard_sequence(rows, 1, mesh.cp.rank, mesh.cp.size, layout).contiguous()


@dataclass
class _StageLayout:
    """What this rank's stages hold, read before the DP wrappers take their parameters over: the gradient
    reductions, the reference piece of every parameter, K/V replica counts, shard specs, each parameter's stage,
    and which parameters are experts' (reduced over edp, not dp-cp)."""

    table: list
    infos: list
    kv: dict
    specs: list
    stage_of: dict
    expert: set
    tied: set

    @classmethod
    def read(cls, stages, mesh) -> _StageLayout:
        table = [r for s in stages for r in reduction_table(s, mesh)]
        return cls(
            table=table,
            infos=[i for s in stages for i in parameter_map(s)],
            kv={n: k for s in stages for n, k in kv_replica_counts(s).items()},
            specs=[spec for s in stages for spec in s.shard_specs()],
            stage_of={n: s.stage for s in stages for n, _ in s.named_parameters()},
            expert={r.name for r in table if r.dp_group == "edp"},
            tied={r.name for r in table if r.pre == EMBD},
        )


def _wrap(stage, mesh, held: _StageLayout, zero_stage: ZeroStage, bucket_bytes, optimizer, optim_kwargs, precision):
    """The stage in its data-parallel wrapper: dense parameters over dp-cp, expert parameters over edp.

    A tied embedding copy (first or last stage) gets, under ZeRO, a flat buffer of its own (the same dp-cp group,
    named "dp-cp:embd"), so the first and the last stage shard it alike and the embedding group's all-reduce adds
    matching elements: Megatron-Core's `_does_param_require_new_bucket` for `shared_embedding` parameters
    (megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py at d98e8a6)."""
    dense_group, expert_group = mesh["dp-cp"], mesh["edp"]
    tied_group = replace(dense_group, name=f"{dense_group.name}:{EMBD}")

    def group_for(name, p):
        if name in held.tied and zero_stage != ZeroStage.DDP:
            return tied_group
        return expert_group if name in held.expert else dense_group

    return wrap(
        stage,
        zero_stage.key,
        dense_group,
        bucket_bytes=bucket_bytes,
        group_for=group_for,
        optimizer=optimizer,
        precision=precision,
        **optim_kwargs,
    )


def _check_precision(precision, cfg) -> None:
    if precision is None:
        return
    instance("ParallelTransformer", "precision", precision, MixedPrecision)
    if cfg.dtype != precision.compute:
        raise ValueError(
            f"precision.compute={precision.compute!r} but the model is in {cfg.dtype!r}: build the full model in the "
            f"compute dtype (cfg.with_(dtype={precision.compute!r})); activations cross the stages in cfg.dtype"
        )
    if precision.loss_scaling != "none":
        raise ValueError(
            f"loss_scaling={precision.loss_scaling!r}: the composed model's pipeline runs backward on the unscaled "
            "loss; use bfloat16 without loss scaling here (fp16 with loss scaling: pylib.dp.wrap)"
        )


def last_weight_gradients(actions) -> dict[int, int]:
    """For each chunk of one rank's action list, the microbatch whose weight gradient is accumulated last: the
    backward that lets the data-parallel wrapper reduce (Megatron's no_sync for all the others). A fused B
    accumulates its weight gradient; a split B does not (only the input gradient), its W does. So under a
    zero-bubble schedule the reduction waits for the chunk's last W, wherever the schedule put it (ZB-H1 puts rank
    r's last W's after its last B; without this the wrapper would reduce after a B whose W has not run yet)."""
    deferred, last = deferred_weights(actions), {}
    for a in actions:
        if a.op == "W" or (a.op == "B" and (a.mb, a.chunk) not in deferred):
            last[a.chunk] = a.mb
    return last


class ParallelTransformer:
    """This rank's part of the reference model, the data-parallel wrappers around it and the pipeline schedule."""

    def __init__(self, cfg, mesh, stages, wrappers, table, infos, kv, options):
        self.cfg, self.mesh = cfg, mesh
        self.stages, self.wrappers = stages, wrappers
        self.table, self.infos, self.kv_replicas = table, infos, kv
        self.options = options  # the `RunOptions` it runs
        self.schedule_name = options.schedule
        self.m, self.v = options.n_microbatches, options.v
        self.zero_stage = options.zero_stage
        self.schedule = build(self.schedule_name, mesh.pp.size, self.m, self.v)
        self._problems: dict[tuple, list[str]] = {}
        self._moe_log: list = []
        self._step_counts: dict[int, torch.Tensor] = {}  # per MoE layer: this rank's routed assignments this step
        for stage in stages:
            for i, moe in stage.moe_layers().items():
                moe.register_forward_hook(self._log_routing(i))
        self.saved = SavedProbe(self._parameter_storages)
        for c, stage in enumerate(stages):
            stage.chunk = c
        self._last_backward = last_weight_gradients(self.schedule[mesh.pp.rank])

    # -------------------------------------------------------------------------------------------- construction

    @classmethod
    def from_full(
        cls,
        model,
        mesh,
        options: RunOptions = RunOptions(),
        *,
        batch: int | None = None,
        seq: int | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        optimizer=torch.optim.Adam,
        precision=None,
        **optim_kwargs,
    ) -> ParallelTransformer:
        """Shard the reference `model` (every rank passes the same full model) onto `mesh`, run with `options`
        (`pylib.plan.RunOptions`: SP, the CP kind and layout, the schedule, m, v, the ZeRO stage, recomputation).

        Raises `ComposeConfigError` listing every constraint the configuration breaks (batch / seq, if given, are
        checked too; otherwise at the first step). optimizer(**optim_kwargs) is built on the parameters each
        rank updates (the whole local parameters under DDP, its shards under ZeRO).
        precision: a `pylib.plan.options.MixedPrecision` recipe (`pylib.dp.mixed`): the data-parallel wrappers keep
        fp32 master weights and optimizer state and reduce gradients in its reduce dtype. The model must already be
        in the compute dtype (cfg.dtype, what activations cross stages in); no loss scaling (bf16)."""
        cfg = model.cfg
        _check_precision(precision, cfg)
        device = next(model.parameters()).device  # this rank's device (its GPU under NCCL): batches go there
        # built as Megatron-Core builds it: what only a training forward refuses is refused by step()
        check_compose(cfg, mesh.config, mesh.world_size, batch=batch, seq=seq, options=options, training=False)
        pp = mesh.pp
        n_stages, placement = pp.size * options.v, placement_of(options.schedule)
        stages = [
            ParallelStage.from_full(model, mesh, rank_stage(pp.rank, c, pp.size, placement), n_stages, options)
            for c in range(options.v)
        ]
        # read the layout before the DP wrappers take the parameters over (ZeRO-3 removes them from the modules)
        held = _StageLayout.read(stages, mesh)
        wrappers = [
            _wrap(s, mesh, held, options.zero_stage, bucket_bytes, optimizer, optim_kwargs, precision) for s in stages
        ]
        model = cls(cfg, mesh, stages, wrappers, held.table, held.infos, held.kv, options)
        # tied embeddings over stages: the first and last pipeline rank (collective: every rank builds the groups)
        model.embedding_group = embedding_group(mesh) if cfg.tie_embeddings else None
        model._stage_specs, model._stage_of = held.specs, held.stage_of
        model.device = device
        return model

    def _parameter_storages(self) -> set[int]:
        """data_ptrs of every parameter storage this rank holds now: the modules' parameters (views of ZeRO-1/2's
        flat buffers included) and, under ZeRO-3, the shards and the full buffers gathered at this moment."""
        ptrs = {p.untyped_storage().data_ptr() for s in self.stages for p in s.parameters()}
        for w in self.wrappers:
            if self.zero_stage == 3:
                ptrs |= {s.data_ptr() for s in w._live.values()}
                ptrs |= {p.untyped_storage().data_ptr() for p in w.shards}
            elif self.zero_stage in (1, 2):
                ptrs |= {f.untyped_storage().data_ptr() for f in w.flats}
        return ptrs

    def _log_routing(self, layer: int):
        def hook(module, args, output):
            if is_recomputing():  # the same routing again (recompute="full"): logged once
                return
            st = module.last_state
            if isinstance(st, AllGatherState):  # no counts exchanged: the rows its experts took from the gather
                self._moe_log.append((layer, None, None, [sum(st.rows_per_local_expert)]))
            else:
                self._moe_log.append((layer, st.send_counts.clone(), st.recv_counts.clone(), list(st.etp_rows)))
            counts = tokens_per_expert(module.last_routing.experts, module.cfg.n_experts)
            self._step_counts[layer] = self._step_counts.get(layer, 0) + counts

        return hook

    # -------------------------------------------------------------------------------------------- training

    def check_batch(self, batch: int, seq: int) -> None:
        key = (batch, seq)
        if key not in self._problems:
            self._problems[key] = compose_problems(
                self.cfg,
                self.mesh.config,
                self.mesh.world_size,
                batch=batch,
                seq=seq,
                options=self.options,
                training=False,
            )
        if self._problems[key]:
            raise ComposeConfigError(self._problems[key], tr("a global batch [{batch}, {seq}]", batch=batch, seq=seq))

    def _backward_context(self, mb: int, chunk: int):
        """What a backward (a fused B, or a W) of chunk `chunk` runs in: the chunk's last one reduces, the others
        only accumulate under DDP and ZeRO-1. A reducing one runs as one pass of the gradient buckets
        (`GradientBuckets.one_backward`): a W restarts autograd once per layer, and the buckets must not end the
        pass, and reduce what they hold, after the first of them."""
        wrapper = self.wrappers[chunk]
        if self.zero_stage == 3:
            return nullcontext()  # ZeRO-3 reduces in every backward (zero-bubble schedules are refused with it)
        if mb != self._last_backward[chunk] and self.zero_stage in (0, 1):
            return wrapper.no_sync()
        buckets = wrapper.ddp.buckets if self.zero_stage == 0 else wrapper.buckets
        return buckets.one_backward()  # ZeRO-2 keeps no full gradient to accumulate in: it reduces every time

    def zero_grad(self) -> None:
        for w in self.wrappers:
            if self.zero_stage == 0:
                w.ddp.zero_grad(set_to_none=False)  # zero the buckets: each p.grad stays a view into one
            else:
                w.zero_grad()

    def act_shape(self, b: int, seq: int):
        """Shape of the activation crossing a stage boundary: [b, s/(cp*tp), h] under SP, [b, s/cp, h] without."""
        s = seq // self.mesh.cp.size
        if self.options.sequence_parallel:
            s //= self.mesh.tp.size
        return (b, s, self.cfg.d_model)

    def step(
        self,
        ids: torch.Tensor,
        targets: torch.Tensor,
        *,
        measure_memory: bool = True,
        activation_probe: str = "stage",
        clip: GradClip | None = None,
    ) -> StepResult:
        """One training step on the global batch ids, targets [B, S] (the same on every rank; moved to the model's
        device).

        activation_probe: "stage" (`probe.SavedProbe` inside each stage forward; parameters and ZeRO-3's gathered
        buffers excluded) or "pipeline" (`pylib.pp.run_pipeline`'s own probe, which excludes the modules'
        parameters only -- right except under ZeRO-3). autograd applies only the innermost saved-tensor hooks, so
        one probe runs per step. clip: a `clip.GradClip`: after the gradients are complete, scale them to the global
        norm (`clip.clip_held_gradients`, every parameter counted once); a non-finite gradient on any rank skips
        the update on every rank (or raises, as the GradClip says)."""
        if clip is not None and not isinstance(clip, GradClip):
            raise TypeError(f"clip={clip!r} must be a GradClip or None")
        if activation_probe not in ("stage", "pipeline"):
            raise ValueError(f"activation_probe={activation_probe!r} must be 'stage' or 'pipeline'")
        stage_probe = measure_memory and activation_probe == "stage"
        B, S = ids.shape
        self.check_batch(B, S)
        # every rank, before any communication (a stage without MoE layers would otherwise wait for one that raised)
        checks.refuse_training(
            self.cfg,
            self.mesh.config,
            self.options,
            lambda: tr("a training step on {plan}", plan=self.mesh.config.describe()),
        )
        mesh = self.mesh
        layout = self.options.cp_layout
        ids, targets = ids.to(self.device), targets.to(self.device)
        # every rank must hold the same global batch (each cuts its own part): one small all-gather of checksums
        agree_on_batch("ParallelTransformer.step", mesh.world, {"ids": ids, "targets": targets})
        my_ids, my_targets = local_batch(ids, mesh, layout), local_batch(targets, mesh, layout)
        m = self.m
        self.zero_grad()
        self._moe_log, self._step_counts = [], {}
        self.saved.reset()
        for stage in self.stages:
            stage.saved_probe = self.saved if stage_probe else None
        run = run_pipeline(
            self.schedule,
            self.stages,
            group=mesh.pp,
            inputs=microbatches(my_ids, m),
            targets=microbatches(my_targets, m),
            # the device: under ZeRO-3 the stages hold no parameters to read it from
            boundary=Boundary(self.act_shape(B // (mesh.dp.size * m), S), torch_dtype(self.cfg.dtype), self.device),
            backward_context=self._backward_context,
            recorder=PipelineRecorder(measure_memory=measure_memory and not stage_probe),
        )
        for stage in self.stages:
            stage.saved_probe = None
        for w in self.wrappers:
            w.finish_gradient_sync()
        pieces = self.gradient_pieces()
        reduced = finalize_gradients(pieces, self.table, mesh, self.kv_replicas, self.embedding_group)
        self._update_expert_bias()
        clipped = None
        if clip is not None:
            sharded, experts = self.zero_stage != ZeroStage.DDP, self.cfg.moe is not None
            clipped = clip_held_gradients(
                pieces, self.table, mesh, self.kv_replicas, clip, sharded=sharded, experts=experts
            )
        if clipped is None or not clipped.skipped:
            for w in self.wrappers:
                w.step()
        loss = self._global_loss(run.loss)
        return StepResult(
            loss=loss,
            local_loss=run.loss,
            losses=list(run.losses),
            activation_bytes=dict(self.saved.bytes) if stage_probe else dict(run.activation_bytes),
            peak_activation_bytes=self.saved.peak(self.schedule[mesh.pp.rank])
            if stage_probe
            else run.peak_activation_bytes,
            peak_in_flight=run.peak_in_flight,
            reduced=reduced,
            moe_routing=list(self._moe_log),
            expert_counts={k: v.clone() for k, v in self._step_counts.items()},
            timeline=list(run.timeline),
            clip=clipped,
        )

    def _update_expert_bias(self) -> None:
        """Auxiliary-loss-free balancing, once per optimizer step (cfg.moe.bias_update_rate > 0): each MoE layer's
        `update_expert_bias` with the step's counts (every microbatch's forward, a recomputed forward not counted
        twice) summed over the ranks that share its router, tp-dp-cp -- every rank of the layer's pipeline stage,
        whatever EP folds inside it. Every such rank ends with the same bias, that of the reference updated from the
        whole global batch's counts. Megatron-Core does the same in `finalize_model_grads` (`_update_router_expert_
        bias`: the counts all-reduced over TP x CP x DP, megatron/core/distributed/finalize_model_grads.py at
        d98e8a6), before the optimizer step."""
        moe = self.cfg.moe
        if moe is None or moe.bias_update_rate == 0:
            return
        group = self.mesh["tp-dp-cp"]
        for stage in self.stages:
            for i, layer in stage.moe_layers().items():
                if not layer.training:  # as Megatron: a layer in eval mode keeps its bias
                    continue
                counts = self._step_counts.get(i)
                if counts is None:  # no forward of this layer in the step
                    layer.routed_counts.zero_()
                else:
                    layer.routed_counts.copy_(counts)
                layer.update_expert_bias(group=group)

    def _global_loss(self, local: float | None) -> float:
        """The dp-cp average of the last stage's loss, then handed to every pipeline stage (phase "loss")."""
        holds_last = local is not None
        t = torch.tensor([local if holds_last else 0.0], dtype=torch.float64, device=self.device)
        with phase("loss"), tag("loss"):
            if holds_last:
                C.all_reduce_(t, self.mesh["dp-cp"], op="sum")
                t /= self.mesh["dp-cp"].size
            C.all_reduce_(t, self.mesh.pp, op="sum")
        return float(t)

    # -------------------------------------------------------------------------------------------- what a rank holds

    def gradient_pieces(self) -> dict[str, list]:
        out = {}
        for w in self.wrappers:
            out.update(held_gradient_pieces(w))
        return out

    def parameter_pieces(self) -> list[tuple[str, tuple, int, int, torch.Tensor]]:
        """(reference name, index into the reference tensor, lo, hi, values): reference[index].reshape(-1)[lo:hi]
        is what this rank holds (for checks against the single-device model)."""
        held = {}
        for w in self.wrappers:
            held.update(held_parameter_pieces(w))
        out = []
        for info in self.infos:
            for lo, hi, t in held.get(info.name, []):
                out.append((info.ref_name, info.ref_index, lo, hi, t.detach().clone()))
        return out

    def memory(self) -> HeldBytes:
        """Parameter, gradient and optimizer-state bytes this rank holds (every chunk's wrapper, by storage)."""
        parts = [w.memory() for w in self.wrappers]
        return HeldBytes(
            *(sum(getattr(p, f) for p in parts) for f in ("params", "grads", "optim", "peak_params", "peak_grads"))
        )

    @property
    def layouts(self):
        """The flat buffers of every wrapper (bucket / shard layouts as data)."""
        return [lay for w in self.wrappers for lay in w.layouts]

    def reduction_table(self) -> list[dict]:
        return [r.as_dict() for r in self.table]

    def shard_specs(self) -> list[ShardSpec]:
        """How this rank holds each parameter: the TP / EP / ETP splits of its stage modules (read before the DP
        wrappers took over), then one "pp" row per parameter (its virtual stage) and one row for the data-parallel
        axis (replicated under DDP; optimizer state, gradients, parameters sharded as the ZeRO stage says)."""
        specs = list(self._stage_specs)
        by_name = {r.name: r for r in self.table}
        zero = self.zero_stage.key
        for info in self.infos:
            r = by_name[info.name]
            shape = info.local_shape
            specs.append(
                ShardSpec(
                    info.name,
                    "pp",
                    None,
                    "stage",
                    shape,
                    shape,
                    f"virtual stage {self._stage_of[info.name]} of {self.mesh.pp.size * self.v}",
                )
            )
            specs.append(
                ShardSpec(info.name, r.dp_group, None, "replicated" if zero == "ddp" else zero, shape, shape, r.why)
            )
        return specs

    def __repr__(self) -> str:
        stages = ", ".join(s.extra_repr() for s in self.stages)
        return (
            f"ParallelTransformer({self.mesh.config.describe()}, rank {self.mesh.global_rank}: {stages}; "
            f"{self.schedule_name} m={self.m} v={self.v}, {self.zero_stage.key})"
        )
