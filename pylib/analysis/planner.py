"""Choosing a plan: every way `pylib.compose` can run a model on a cluster, what each rank would hold and move, and
a ranking by a simple, stated cost model. Pure functions of sizes: a 671B-parameter model costs nothing here.

    plans = enumerate_plans(cfg, world_size=64, batch=512, seq=4096)          # every Plan pylib.plan.problems accepts
    p = predict(cfg, plan, Workload(batch=512, seq=4096), Cluster(64))         # memory / traffic per rank, times
    best = rank_plans(cfg, Workload(512, 4096), Cluster(64), top=10)           # the cost model's order

What is enumerated. A `Plan` is a `ParallelConfig` (tp, cp, ep, dp, pp, etp and Megatron's order string) and the
options of `pylib.compose.ParallelTransformer`: sequence parallelism, ring or Ulysses CP (all-gather CP, Llama 3's,
when `SearchSpace.cp_kinds` names "allgather"), the ZeRO stage (0 = DDP),
the microbatch count m and the chunks per pipeline rank v (schedule 1F1B, interleaved 1F1B when v > 1; GPipe is
left out: the same bubble as 1F1B with more microbatches in flight). A knob that changes nothing is not varied: SP
needs tp > 1, the CP kind cp > 1, ZeRO a data-parallel group. Validity is `pylib.plan.problems` (what
`pylib.compose.compose_problems` asks), asked about every candidate: the planner keeps exactly what the composed
model would run.

What is predicted, for pipeline ranks 0, 1 and pp - 1 (the others repeat rank 1, with fewer microbatches in flight):
  memory    parameters, gradients, optimizer state: `pylib.analysis.dp` over this rank's parameters (`weights.
            weight_shapes`), dense ones sharded over dp x cp, experts over edp, per ZeRO stage; precision "uniform"
            is pylib's one-dtype run (Adam's two moments in it: `dp.held_bytes`), "mixed" the ZeRO paper's
            16-bit weights and gradients with 12 bytes of fp32 state per parameter (`dp.paper_bytes`) -- what
            `pylib.dp` holds under `MixedPrecision(grad_reduce="bfloat16")`, byte for byte (tests/
            test_dp_mixed_precision.py); `Workload.grad_reduce="float32"` keeps and reduces the gradients in fp32
            (`dp.mixed_held_bytes` of `MixedPrecision(grad_reduce="float32")`, Megatron-LM's default for bf16);
            activations: the bytes each chunk keeps for backward per microbatch (`activations.chunk_saved_bytes`)
            at the peak of the schedule (`activations.peak_saved_bytes`); under ZeRO-3 also the two largest
            layers' gathered parameters (`dp.zero3_peak_param_bytes`, one running and one prefetched). With
            `Workload.fp8` the FP8 linears keep their inputs in FP8 with their scales (`activations.fp8_rows`);
            with `Workload.storage` DeepSeek-V3's own storage choices (`activations.storage_rows`).
            Plan.sp_regather predicts Megatron's SP instead of pylib's: the column-parallel linears' inputs are
            kept as sequence shards (`activations.chunk_saved_bytes(sp_regather=True)`).
  traffic   bytes each rank sends per step on each axis: `compose.step_traffic`, the sum of every mode's formulas,
            evaluated on this rank's flat buffers as `pylib.dp` would lay them out (one buffer per chunk and group;
            ZeRO-3 one per layer) and, for MoE layers, the expected routing (uniform, no dropping); with
            sp_regather one more all-gather per column-parallel linear in backward; DP's gradient reductions in
            the workload's gradient dtype (`gradient_dtype_rows`).
  compute   seconds per microbatch on each evaluated rank (`efficiency.microbatch_seconds`): every GEMM of its
            layers on a roofline with an achievable fraction eta of the peak, the elementwise work at the memory's
            bandwidth, backward twice the forward, recomputation's extra forward (`recompute.extra_forward_flops`;
            Megatron's selective modules, `Plan.recompute_modules`: `recompute.module_extra_flops` and the norms'
            and activations' bytes, with the "mlp" module's TP collectives sent again, `module_traffic_rows`).

The zero-bubble schedules (`SearchSpace.zero_bubble`, `Plan.zb_schedule`: ZB-H1, ZB-H2, ZB-V, DualPipeV) are
priced from the same orders `pylib.pp` runs: the backward split into B and W (W = the weight-gradient GEMMs,
`MicrobatchTime.wgrad`), the bubble simulated with those costs (`pp.simulated_split_bubble`), the activations and
the output gradients each deferred W keeps replayed on the order (`pp.split_live_counts`, `wgrad_kept_bytes`), the
V's stages and P2P messages (`Plan.placement`). FP8 (`Workload.fp8`): the linear layers' GEMMs at the FP8 peak
(`efficiency.Fp8Compute`), the FP8 weight copies in memory (`analysis.fp8`), the FP8 parameter all-gather.

The cost model (book/part4/planner.md states each term with its formula):
  step time  = m t_mu + (pp - 1) / v t_mu + the most exposed communication of the evaluated ranks, t_mu the
               slowest rank's forward + backward of one microbatch (1F1B and interleaved 1F1B; a zero-bubble
               schedule's simulated makespan beyond m t_mu in place of the second term)
  exposed    `exposed_seconds`: TP/SP in full, or (1 - tp_overlap) with `Cluster.tp_comm_overlap` (SP's
               regather only past the input-gradient GEMMs it runs under); ring CP less
               the attention core it hides behind; Ulysses, all-gather CP and EP in full; PP's fill and drain,
               (pp-1)/(v m) of its sends; DP by ZeRO stage (DDP / ZeRO-1 behind the last microbatch's backward,
               ZeRO-2's reduce-scatter and ZeRO-3's gathers behind every microbatch's); a latency per message of a
               model axis; `contention` seconds of compute per second of hidden communication
  bandwidth  an axis's is the intra-node link's when every group of that axis sits inside one node (the order
               string decides: `crosses_nodes`), the inter-node link's otherwise.
MoE layers (`Plan`'s MoE knobs): Megatron's selective modules for them ("moe", "moe_act", "shared_experts",
"layernorm", "mla_up_proj") priced from the same activation rows the rank runs measure; a routing-imbalance factor
f from a measured run (`Plan.routing_imbalance`) on the busiest EP rank's expert GEMMs, kept rows and all-to-all
bytes; shared experts (their weights, GEMMs, rows, TP collectives); the all-gather or the all-to-all dispatcher
(`Plan.dispatcher`); EP hidden under another microbatch's compute (`Plan.ep_overlap`, DualPipe's pairing). Checked
against published runs in `calibration` (`MOE_RUNS`, `moe_layout_check`: DeepSeek-V3's layout).
A plan must fit: peak memory <= usable GPU memory. Plans that fit are ranked by step time, ties by memory; plans
that do not, after them, by memory. The constants are fitted on published runs (`calibration`).

How exact. tests/test_analysis_planner.py runs plans of every mode with `pylib.compose` at small sizes and finds
each predicted number equal to the measured one, byte for byte: parameter, gradient and optimizer bytes, the bytes
each chunk saves for backward, the schedule's activation peak (dense models) and the bytes sent on every axis. The
expert axes (ep, etp) are exact on a run's own routing (`rank_traffic_rows(..., moe_routing=...)`) and an
expectation on the uniform routing the planner ranks with; an MoE's activation peak likewise assumes every
microbatch routes as expected.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field, replace
from fractions import Fraction

from pylib.i18n import editions, unspoken
from pylib.plan.config import DISPATCHERS
from pylib.plan.fields import choice, instance, names, number
from pylib.plan.fields import divisors as _divisors  # by factorisation: 2**40 ranks or a prime answer at once
from pylib.plan.heads import kv_heads_per_rank
from pylib.plan.layout import FlatEntry, FlatLayout
from pylib.plan.mesh import AXES, EXPERT_GROUPS, HSDP_REPLICATE, HSDP_SHARD, ParallelConfig, hsdp_groups, rank_groups
from pylib.plan.options import CP_KINDS, DTYPE_BYTES, ZERO_STAGES, Fp8Recipe, MixedPrecision, RunOptions, ZeroStage
from pylib.plan.options import zero_stage as as_zero_stage
from pylib.plan.problems import problems as plan_problems
from pylib.plan.recompute import DEFAULT_MODULES, Recompute, as_recompute, modules_problems, recompute_modules
from pylib.plan.schedules import V_SHAPED, ZERO_BUBBLE, ScheduleError, check_schedule, placement_of

from . import compose as compose_analysis
from . import cp as cp_analysis
from . import dp as dp_analysis
from . import ep as ep_analysis
from . import fp8 as fp8_analysis
from . import pp as pp_analysis
from . import recompute as recompute_analysis
from . import tp as tp_analysis
from .activations import STORAGE, chunk_saved_bytes, expected_expert_rows, peak_saved_bytes
from .efficiency import (
    CostModel,
    Fp8Compute,
    MicrobatchTime,
    _router_index,
    layer_gemms,
    microbatch_seconds,
    rank_chunks,
    stage_chunks,
)
from .inputs import PRECISIONS, check_cluster, check_search_space, check_sizes, check_workload
from .tp import dtype_bytes
from .weights import weight_shapes

MIXED_STATE_BYTES = dp_analysis.PAPER_K  # fp32 master copy, momentum and variance per parameter
GB = 1e9


# ------------------------------------------------------------------------------------------------ inputs


@dataclass(frozen=True)
class Cluster:
    """The machines: `world_size` GPUs, `gpus_per_node` per node; bytes of memory per GPU and the fraction a plan
    may use (the rest: CUDA context, communication buffers, allocator fragmentation); bandwidths in bytes/s per GPU
    and direction, inside a node and between nodes; `peak_flops` the GPU's dense 16-bit peak and `hbm_bandwidth`
    its memory's (the roofline of `efficiency`). Defaults: H100 SXM 80 GB, 8 per node, NVLink 4 (900 GB/s both
    directions), one 400 Gb/s NIC per GPU, 989 TFLOP/s, 3.35 TB/s. overlap_dp: data-parallel traffic overlaps
    compute (module docstring); tp_comm_overlap: the run overlaps TP/SP's collectives with the GEMMs
    (Megatron's --tp-comm-overlap, TransformerEngine's userbuffers); `model` the cost model's constants.
    fp8_peak_flops: the dense FP8 peak FP8 GEMMs run against (`Workload.fp8`): 1,978.9 TFLOP/s for the H100 SXM
    (NVIDIA H100 Tensor Core GPU datasheet: FP8 3,958 TFLOP/s "with sparsity", half of it dense; BF16 1,979 with
    sparsity, 989.4 dense)."""

    world_size: int
    gpus_per_node: int = 8
    gpu_memory: float = 80e9
    usable_fraction: float = 0.9
    intra_node_bandwidth: float = 450e9
    inter_node_bandwidth: float = 50e9
    peak_flops: float = 989e12
    hbm_bandwidth: float = 3.35e12
    overlap_dp: bool = True
    tp_comm_overlap: bool = False
    model: CostModel = CostModel()
    fp8_peak_flops: float = 1978.9e12

    def __post_init__(self):
        check_cluster(self)
        number("Cluster", "fp8_peak_flops", self.fp8_peak_flops, above=0)

    @property
    def usable_memory(self) -> float:
        return self.gpu_memory * self.usable_fraction

    @property
    def nodes(self) -> int:
        return -(-self.world_size // self.gpus_per_node)


@dataclass(frozen=True)
class Workload:
    """One training step: `batch` sequences of `seq` tokens (the global batch), the precision of the model state
    ("mixed": 16-bit parameters and gradients, 12 bytes of fp32 state per parameter; "uniform": everything in the
    model's dtype with `optimizer_states` tensors of state, as pylib runs) and the attention kernel outside CP
    ("flash" keeps no score matrix; "math" is pylib's unfused core). grad_reduce (with "mixed"): the dtype the
    gradients are accumulated, kept and reduced in -- "bfloat16" (the ZeRO paper's 2 bytes) or "float32" (4 bytes:
    Megatron-LM's default for bf16 training, `--main-grads-dtype fp32`, which sets
    `accumulate_allreduce_grads_in_fp32`; pylib's `MixedPrecision(grad_reduce="float32")`). The DP reductions
    then move 4-byte gradients; the parameter all-gathers stay 16-bit.
    fp8 (with "mixed"): an `Fp8Recipe` runs the linear layers' GEMMs in FP8 (`efficiency.Fp8Compute`: the FP8 peak
    `Cluster.fp8_peak_flops` at `CostModel.eta_fp8`, each operand quantized first), and each rank holds the FP8
    copies and scales of its linear weights (`fp8.fp8_weight_bytes`; under ZeRO-3 only delayed scaling's amax
    histories between units, `fp8.fp8_history_bytes`): the memory's "fp8"; the FP8 linears keep their saved
    inputs in FP8 with their scales (`activations.fp8_rows`, Transformer Engine's fused QKV and fc1). The recipe's
    first_last_layers_bf16: the first and the last layer stay in 16 bits (Megatron's --first-last-layers-bf16); its
    param_gather: the data-parallel all-gathers of the FP8 linears' parameters move 1 byte per element instead of 2
    (Megatron's --fp8-param-gather, torchtitan's float8 all-gather under FSDP2): ZeRO-3's gathers every
    microbatch, ZeRO-1/2's after the step.
    storage: DeepSeek-V3's own activation storage (technical report, arXiv 2412.19437, section 3.3.3), names of
    `activations.STORAGE`: "swiglu_fp8" (needs fp8) the experts' SwiGLU inputs cached in FP8 and its output
    recomputed in backward (priced at HBM speed, `efficiency.storage_hbm_bytes`), "attn_out_e5m6" W_O's input in
    E5M6, "fused_unpermute" the combine's weighting and sum fused, the expert outputs kept once
    (`activations.storage_rows`; each built in pylib: `pylib.model.v3_storage`, `pylib.ep.permute.unpermute`); and
    one the report does not describe, "gate_in_expert": the combine weights sent with the rows and applied inside
    the experts before the down projection, their gradient a row-wise dot of the down projection's input and input
    gradient, so no expert output is kept (`pylib.model.v3_storage.gated_expert`; its HBM traffic
    `efficiency.gate_hbm_bytes`)."""

    batch: int
    seq: int
    precision: str = "mixed"
    attention: str = "flash"
    optimizer_states: int = 2
    grad_reduce: str = "bfloat16"
    fp8: Fp8Recipe | None = None
    storage: tuple[str, ...] = ()

    def __post_init__(self):
        check_workload(self)
        if self.grad_reduce != "bfloat16" and self.precision != "mixed":
            raise ValueError(f"grad_reduce={self.grad_reduce!r} needs precision='mixed'")
        instance("Workload", "fp8", self.fp8, Fp8Recipe, none=True)
        if self.fp8 is not None and self.precision != "mixed":
            raise ValueError(
                f"Workload.fp8 runs the GEMMs of a mixed-precision model: needs precision='mixed', "
                f"got {self.precision!r}"
            )
        if self.storage:
            object.__setattr__(self, "storage", names("Workload", "storage", self.storage, STORAGE))
        if "swiglu_fp8" in self.storage and self.fp8 is None:
            raise ValueError("Workload.storage 'swiglu_fp8' caches the SwiGLU inputs in FP8: needs Workload.fp8")

    @property
    def fp8_mixed(self) -> MixedPrecision:
        """The `MixedPrecision` whose FP8 bytes `analysis.fp8` counts: bf16 compute, this FP8 recipe."""
        return MixedPrecision("bfloat16", grad_reduce=self.grad_reduce, fp8=self.fp8)

    @property
    def grad_bytes(self) -> int:
        """Bytes of one gradient element as kept and reduced: 2 or 4."""
        return DTYPE_BYTES[self.grad_reduce]


@dataclass(frozen=True)
class Plan:
    """One way to run: the mesh `par` and the composed model's `options` (a `RunOptions`; its schedule is set from
    v: 1F1B, interleaved 1F1B when v > 1, the schedules the planner models), plus the analysis-only knobs below,
    which `pylib.compose` does not run. sp_regather: predict Megatron's sequence
    parallelism rather than pylib's -- the column-parallel linears (QKV, the MLP's first, the LM head) save their
    input as the s/(cp tp) shard and all-gather it again in backward (Megatron-Core's
    `LinearWithGradAccumulationAndAsyncCommunication`, launched async under the input-gradient GEMM); pylib.tp
    saves the gathered input. Not a `RunOptions` field: pylib.compose has one SP, the planner predicts both.
    balance_ends: Llama 3's uneven split, one layer fewer on the first and the last virtual stage
    (`activations.split_layers`); the analysis only (pylib.pp cuts equal stages), so `problems` checks the L + 2
    slots, and the TP traffic of ranks 0 and p-1 is counted for their slots' layers (one layer too many each).
    group_size: N, the microbatches each group runs through one chunk before the next in the interleaved schedule
    (Megatron-Core's `microbatch_group_size_per_vp_stage`); None is Megatron's default N = p. It sets the warm-up,
    so the activations held (`activations.peak_saved_bytes`), and the bubble is measured on the schedule
    (`pp.simulated_bubble_fraction`); Megatron's rule p <= N <= m, m % N == 0 or >= p (`problems`). Not a
    `RunOptions` field: `pylib.compose` runs N = p (`pylib.pp` takes any N).
    recompute_modules: with recompute="selective", Megatron's --recompute-modules (`pylib.plan.recompute`; None is
    its default, the attention core, pylib's "selective"): what each layer stops saving
    (`activations.layer_saved_rows`), runs again (`efficiency.microbatch_seconds`) and, for "mlp", sends again (the
    MLP's TP collectives, `recompute.module_extra_collectives`). The analysis only: `run_options` asks pylib for
    its selective recomputation when "core_attn" is among them, for none otherwise.
    hsdp_shard: with ZeRO-3, HSDP's shard group size s (None: ZeRO-3 over all of dp-cp): the dense parameters
    sharded over s consecutive members of each dp-cp group, their reduced shards all-reduced over the dp-cp/s
    replicas ("dp-shard" and "dp-replicate" traffic, each priced by whether its groups leave a node,
    `hsdp_crosses_nodes`); expert parameters stay ZeRO-3 over edp. `pylib.dp` runs it
    (`FullyShardedDataParallel(..., replicate=)`); `pylib.compose` does not compose it.
    routing_imbalance: f = the most loaded expert's assignments over the mean (`pylib.ep.balance.load_imbalance`,
    measured on a training run; 1.0, uniform routing, the default). The planner prices the busiest EP rank: its
    experts' GEMMs on f times the expected rows (`efficiency.layer_gemms`), the rows they keep
    (`activations.layer_saved_rows`), and its dispatch and combine at f times the expected bytes
    (`expected_routing`: an all-to-all ends when its busiest rank has received, and sent back, its rows). The
    all-gather dispatcher's bytes do not depend on the routing; its expert GEMMs do.
    dispatcher: the MoE token dispatcher, "alltoall" or "allgather" (Megatron's MoEAllGatherTokenDispatcher:
    every rank gathers the EP group's tokens, `ep.dispatcher_bytes`); None: the model's
    (`MoEConfig.dispatcher`). pylib.compose runs both (`compose.step_traffic` prices the one in the config the
    planner hands it, `_dispatched`), and the shared experts (`MoEConfig.n_shared_experts`: their weights cut
    over tp and reduced over dp-cp as a dense MLP's, their GEMMs, rows and TP collectives,
    `shared_expert_rows`).
    ep_overlap: the EP all-to-alls run under another microbatch's compute (DualPipe's paired forward and backward,
    DeepSeek-V3 technical report section 3.2.1; Megatron's --overlap-moe-expert-parallel-comm): `exposed_seconds`
    leaves of them only what exceeds the step's compute, and charges the hidden part its contention. The analysis
    only: pylib.compose exposes them.
    zb_schedule: a zero-bubble schedule (`pylib.plan.schedules.ZERO_BUBBLE`: "zb-h1", "zb-h2" with v = 1; "zb-v",
    "dualpipev" with v = 2, in the V placement) priced in place of 1F1B / interleaved: the bubble simulated with
    this plan's B and W times (`bubble_fraction`), the activations and W's kept gradients replayed on its order
    (`rank_memory`), the V's stages and P2P messages (`placement`). `pylib.pp` runs these schedules
    (`run_pipeline`); `pylib.compose` does not compose them yet, so `options.schedule` stays what compose would
    run on the same mesh and `run_options` is not this plan's run."""

    par: ParallelConfig
    options: RunOptions = RunOptions()
    sp_regather: bool = False
    balance_ends: bool = False
    group_size: int | None = None
    recompute_modules: tuple[str, ...] | None = None
    hsdp_shard: int | None = None
    routing_imbalance: float = 1.0
    dispatcher: str | None = None
    ep_overlap: bool = False
    zb_schedule: str | None = None

    def __post_init__(self):
        number("Plan", "routing_imbalance", self.routing_imbalance, low=1)
        if self.dispatcher is not None:
            choice("Plan", "dispatcher", self.dispatcher, DISPATCHERS)
        schedule = "interleaved" if self.options.v > 1 else "1f1b"  # what compose runs beside a zb_schedule
        if self.options.schedule != schedule:
            object.__setattr__(self, "options", replace(self.options, schedule=schedule))
        if self.zb_schedule is not None and self.zb_schedule not in ZERO_BUBBLE:
            raise ValueError(f"Plan.zb_schedule={self.zb_schedule!r} must be None or one of {ZERO_BUBBLE}")

    @property
    def schedule(self) -> str:
        """The schedule the planner prices: `zb_schedule`, else `options.schedule`."""
        return self.zb_schedule or self.options.schedule

    @property
    def placement(self) -> str:
        """Where the stages live (`schedules.placement_of`): "v" for ZB-V and DualPipeV, "loop" otherwise."""
        return placement_of(self.schedule)

    def with_options(self, **changes) -> Plan:
        """The same plan with some `RunOptions` fields changed (`dataclasses.replace` of `options`)."""
        return replace(self, options=replace(self.options, **changes))

    @property
    def modules(self) -> frozenset:
        """The modules every layer recomputes (`pylib.plan.recompute.recompute_modules`): empty unless selective."""
        return recompute_modules(self.options.recompute.granularity, self.recompute_modules)

    @property
    def run_options(self) -> RunOptions:
        """What `pylib.compose` runs: `options`, with selective recomputation only when "core_attn" is among the
        modules (none otherwise)."""
        rc = self.options.recompute
        if rc.granularity == "selective" and "core_attn" not in self.modules:
            return replace(self.options, recompute=replace(rc, granularity="none"))
        return self.options

    def micro_batch(self, batch: int) -> int:
        """Sequences per microbatch on one rank: B / (dp m)."""
        return batch // (self.par.dp * self.options.n_microbatches)

    @property
    def dp_cp(self) -> int:
        return self.par.dp * self.par.cp

    @property
    def edp(self) -> int:
        return self.par.expert_dp()

    def describe(self) -> str:
        o = self.options
        parts = [self.par.describe()]
        if o.sequence_parallel:
            parts.append("SP")
        if self.sp_regather and o.sequence_parallel:
            parts.append("regather")
        if self.par.cp > 1:
            parts.append(o.cp_kind)
        if self.dispatcher == "allgather":
            parts.append("allgather-dispatch")
        if self.routing_imbalance != 1.0:
            parts.append(f"imbalance={self.routing_imbalance:.2f}")
        if self.ep_overlap:
            parts.append("EP-overlap")
        if o.zero_stage and self.hsdp_shard is not None:
            parts.append(f"HSDP {self.dp_cp // self.hsdp_shard}x{self.hsdp_shard}")
        elif o.zero_stage:
            parts.append(f"ZeRO-{int(o.zero_stage)}")
        parts.append(f"m={o.n_microbatches}")
        if o.v > 1:
            parts.append(f"v={o.v}")
        if self.group_size is not None:
            parts.append(f"N={self.group_size}")
        if self.zb_schedule is not None:
            parts.append(self.zb_schedule)
        rc = o.recompute
        if rc.granularity == "selective" and self.recompute_modules not in (None, DEFAULT_MODULES):
            parts.append("recompute=selective/" + "+".join(self.recompute_modules))
        elif rc.granularity == "selective":
            parts.append("recompute=selective")
        elif rc.granularity == "full":
            parts.append(f"recompute=full/{rc.method}/{rc.num_layers}")
        return " ".join(parts)


def canonical(plan: Plan, has_experts: bool = True) -> Plan:
    """The same run with the knobs that change nothing at their defaults: SP without TP, the CP kind without CP,
    the ZeRO stage without a data-parallel group of more than one rank, the group size N = p (Megatron's default)."""
    par, o = plan.par, plan.options
    dp_groups = plan.dp_cp > 1 or (has_experts and par.expert_dp() > 1)
    sp = o.sequence_parallel and par.tp > 1
    default = RunOptions()
    return replace(
        plan,
        options=replace(
            o,
            sequence_parallel=sp,
            cp_kind=o.cp_kind if par.cp > 1 else default.cp_kind,
            zero_stage=o.zero_stage if dp_groups else default.zero_stage,
        ),
        sp_regather=plan.sp_regather and sp,
        group_size=None if plan.group_size == par.pp else plan.group_size,
        recompute_modules=None if plan.recompute_modules == DEFAULT_MODULES else plan.recompute_modules,
    )


# ------------------------------------------------------------------------------------------------ enumeration


def problems(cfg, plan: Plan, world_size: int, batch: int, seq: int) -> list[str]:
    """Every constraint `plan` breaks (`pylib.plan.problems`, what `pylib.compose` checks before it runs); empty
    when the composed model runs it; with `plan.group_size` also Megatron's rule for N (`schedules.check_schedule`:
    interleaved only, p <= N <= m, m % N == 0 or m % N >= p)."""
    out = plan_problems(_slots(cfg, plan), plan.par, world_size, batch=batch, seq=seq, options=plan.run_options)
    out += modules_problems(plan.recompute_modules, plan.options.recompute.granularity)
    out += hsdp_problems(plan)
    out += moe_plan_problems(cfg, plan)
    if plan.zb_schedule is not None:
        return _zb_problems(plan, out)
    if plan.group_size is None:
        return out
    p, m, v = plan.par.pp, plan.options.n_microbatches, plan.options.v
    for n in (None, plan.group_size):  # the default N's complaint gives way to the chosen N's
        try:
            check_schedule(plan.options.schedule, p, m, v, group_size=n)
        except ScheduleError as e:
            out = [x for x in out if x != str(e)] if n is None else out + [str(e)]
    return out


def _dispatched(cfg, plan: Plan):
    """`cfg` with the dispatcher the plan prices (`dispatcher_of`), which `compose.step_traffic` reads from the model
    config; unchanged where the plan keeps the model's, or where `moe_plan_problems` refuses the pair."""
    moe, d = cfg.moe, dispatcher_of(cfg, plan)
    if moe is None or moe.dispatcher == d or (d == "allgather" and moe.pad_to_capacity):
        return cfg
    return replace(cfg, moe=replace(moe, dispatcher=d))


def dispatcher_of(cfg, plan: Plan) -> str:
    """The MoE dispatcher the plan prices: `plan.dispatcher`, or the model's."""
    return plan.dispatcher or (cfg.moe.dispatcher if cfg.moe is not None else "alltoall")


def moe_plan_problems(cfg, plan: Plan) -> list[str]:
    """What the planner cannot price for a MoE model: recompute="full" (a MoE layer recomputed whole dispatches
    again in an order the traffic model does not follow; Megatron's selective "moe" module is priced instead);
    the all-gather dispatcher with padding to capacity; either MoE knob on a dense model. (The shared experts'
    h_ffn over tp is `pylib.plan.problems`' rule. The all-gather dispatcher with etp > 1 gathers over the etp x ep
    grid, axis "etp-ep", priced as `compose.step_traffic` sends it.)"""
    out = []
    if cfg.moe is None:
        if plan.dispatcher is not None or plan.routing_imbalance != 1.0:
            out.append("dispatcher and routing_imbalance describe MoE layers; cfg.moe is None")
        return out
    if plan.options.recompute.granularity == "full":
        out.append(FULL_MOE)
    if dispatcher_of(cfg, plan) == "allgather" and cfg.moe.pad_to_capacity:
        out.append("pad_to_capacity pads the all-to-all's rows: the all-gather dispatcher has none")
    return out


FULL_MOE = (
    "recompute='full' with MoE layers is not priced (a layer recomputed whole would dispatch again); "
    "recompute='selective' with Megatron's modules (moe, moe_act, ...) is"
)


def _zb_problems(plan: Plan, out: list[str]) -> list[str]:
    """A zero-bubble plan's problems: compose's complaint about its stand-in schedule (1F1B / interleaved on the same
    v) gives way to the zero-bubble schedule's own rule (`schedules.check_schedule`, what `build` refuses on
    ranks: ZB-H1 m >= p, ZB-H2 m >= 2p - 1, the V two chunks per rank with m >= p (ZB-V) or 2p (DualPipeV)), and
    it needs a pipeline (p > 1) and no group size N."""
    p, m, v = plan.par.pp, plan.options.n_microbatches, plan.options.v
    try:
        check_schedule(plan.options.schedule, p, m, v)
    except ScheduleError as e:
        out = [x for x in out if x != str(e)]
    try:
        check_schedule(plan.zb_schedule, p, m, v, group_size=plan.group_size)
    except ScheduleError as e:
        out.append(str(e))
    if p == 1:
        out.append(f"{plan.zb_schedule} is a pipeline schedule: it needs pp > 1, got pp=1")
    return out


def hsdp_problems(plan: Plan) -> list[str]:
    """HSDP's rules: a shard group size s only with ZeRO-3, s dividing dp x cp, 1 < s < dp x cp (s = 1 shards
    nothing, s = dp x cp is plain ZeRO-3)."""
    s, d = plan.hsdp_shard, plan.dp_cp
    if s is None:
        return []
    out = []
    if plan.options.zero_stage != ZeroStage.ZERO3:
        out.append(f"hsdp_shard={s!r} shards the parameters: it needs zero_stage=3, got {int(plan.options.zero_stage)}")
    if not isinstance(s, int) or isinstance(s, bool) or not 1 < s < d or d % s:
        out.append(f"hsdp_shard={s!r} must divide dp x cp = {d} and lie strictly between 1 and {d}")
    return out


def _with_hsdp(plan: Plan, shards: tuple[int, ...] | None) -> list[Plan]:
    """The plan, and under ZeRO-3 one HSDP plan per shard group size of `shards` that divides dp x cp."""
    if shards is None or plan.options.zero_stage != ZeroStage.ZERO3:
        return [plan]
    return [plan] + [replace(plan, hsdp_shard=s) for s in shards if 1 < s < plan.dp_cp and plan.dp_cp % s == 0]


def group_sizes_for(p: int, n_microbatches: int, v: int, choice="default") -> tuple[int | None, ...]:
    """The group sizes N the search tries for an interleaved plan of p ranks, m microbatches and v chunks: "default"
    only Megatron's N = p (None); "megatron" every N Megatron accepts (p <= N <= m, m % N == 0 or m % N >= p: the
    bubble stays (p-1)/(v m), the warm-up and the activations grow with N, so a larger N wins no step time here,
    and the list is for asking what N costs); or the given values, those Megatron accepts. Plain 1F1B: (None,)."""
    if v == 1 or p == 1:
        return (None,)
    if choice == "default":
        return (None,)
    candidates = range(p, n_microbatches + 1) if choice == "megatron" else choice
    ok = []
    for n in candidates:
        try:
            check_schedule("interleaved", p, n_microbatches, v, group_size=n)
        except ScheduleError:
            continue
        ok.append(None if n == p else n)
    return tuple(dict.fromkeys(ok))


def _slots(cfg, plan: Plan):
    """The model the pipeline split sees: `cfg`, or with `plan.balance_ends` its L + 2 slots (a dense model, or a
    MoE model whose every layer is a MoE layer, so the slots' layer kinds are the layers')."""
    if not plan.balance_ends:
        return cfg
    if cfg.moe is not None and cfg.moe.every != 1:
        raise ValueError("balance_ends: Llama 3's split is modelled for dense models and all-MoE models only")
    return replace(cfg, n_layers=cfg.n_layers + 2)


@dataclass(frozen=True)
class SearchSpace:
    """The candidates `enumerate_plans` tries beyond the meshes. micro_batch_sizes: only m giving microbatches of
    these many sequences; virtual_stages: only these v (v = 1 always); expert_tp: only these etp. zero_stages,
    cp_kinds, sequence_parallel (SP on/off): the ZeRO stages, CP kinds and SP choices tried. recompute: the
    activation recomputation choices ("none", "selective", "full": full with one layer per group, a `Recompute`
    or (granularity, method, num_layers) triple such as ("full", "block", 2), or ("selective", modules) pairs of
    Megatron's modules such as ("selective", ("mlp",)): `_recompute_choice`). order: the rank order, fixed
    (Megatron's default). meshes: only these (tp, cp, ep, dp, pp, etp), e.g. a published layout, with every other
    knob still varied. tp_sizes / cp_sizes: only these TP / CP sizes. sp_regather: every SP plan predicted as
    Megatron runs SP (`Plan.sp_regather`). balance_ends: with PP, Llama 3's uneven split (`Plan.balance_ends`)
    wherever L + 2 slots cut into equal stages, the equal split elsewhere. group_sizes: the interleaved group
    sizes N tried (`group_sizes_for`: "default" N = p, "megatron" every N Megatron accepts, or a tuple of
    values). hsdp_shards: beside each ZeRO-3 plan, HSDP with these shard group sizes (`Plan.hsdp_shard`); None
    (the default): no HSDP plan. routing_imbalance: every MoE plan's `Plan.routing_imbalance` (1.0: uniform).
    dispatchers: the MoE dispatchers tried (`Plan.dispatcher`; None: the model's own). zero_bubble: the zero-bubble
    schedules tried beside 1F1B and interleaved on every pipeline (`Plan.zb_schedule`; "zb-v" and "dualpipev" where
    2p stages cut the layers; each only where `schedules.check_schedule` accepts its p and m); () (the default):
    none. Elsewhere None: no restriction."""

    order: str = "tp-cp-ep-dp-pp"
    micro_batch_sizes: tuple[int, ...] | None = None
    virtual_stages: tuple[int, ...] | None = None
    zero_stages: tuple[int, ...] = ZERO_STAGES
    cp_kinds: tuple[str, ...] = CP_KINDS
    sequence_parallel: tuple[bool, ...] = (True, False)
    expert_tp: tuple[int, ...] | None = None
    recompute: tuple = ("none",)
    meshes: tuple[ParallelConfig, ...] | None = None
    tp_sizes: tuple[int, ...] | None = None
    cp_sizes: tuple[int, ...] | None = None
    sp_regather: bool = False
    balance_ends: bool = False
    group_sizes: str | tuple[int, ...] = "default"
    hsdp_shards: tuple[int, ...] | None = None
    routing_imbalance: float = 1.0
    dispatchers: tuple[str, ...] | None = None
    zero_bubble: tuple[str, ...] = ()

    def __post_init__(self):
        check_search_space(self)
        number("SearchSpace", "routing_imbalance", self.routing_imbalance, low=1)
        for d in self.dispatchers or ():
            choice("SearchSpace", "dispatchers", d, DISPATCHERS)
        if self.zero_bubble != ():  # () tries none; otherwise a tuple of known names, none twice
            names("SearchSpace", "zero_bubble", self.zero_bubble, ZERO_BUBBLE)


def enumerate_plans(cfg, world_size: int, batch: int, seq: int, space: SearchSpace = SearchSpace()) -> list[Plan]:
    """Every plan `pylib.plan.problems` accepts for `cfg` on `world_size` ranks and a global batch [batch, seq], each
    once (`canonical`), among the candidates of `space`. Candidates: tp cp dp pp = world_size; for an MoE model
    every ep, etp with ep etp pp dividing it (folded onto the dense mesh); m dividing B/dp; v dividing L/pp (v = 1
    without PP); the knobs of `space` (a `SearchSpace`)."""
    sp_ = space
    micro_batch_sizes, virtual_stages, expert_tp = sp_.micro_batch_sizes, sp_.virtual_stages, sp_.expert_tp
    tp_sizes, cp_sizes, meshes, order = sp_.tp_sizes, sp_.cp_sizes, sp_.meshes, sp_.order
    balance_ends, sp_regather, group_sizes = sp_.balance_ends, sp_.sp_regather, sp_.group_sizes
    check_sizes(world_size=world_size, batch=batch, seq=seq)
    moe = cfg.moe is not None
    out, seen = [], set()
    for tp in [t for t in _divisors(world_size) if tp_sizes is None or t in tp_sizes]:
        for cp in [c for c in _divisors(world_size // tp) if cp_sizes is None or c in cp_sizes]:
            for pp in _divisors(world_size // (tp * cp)):
                dp = world_size // (tp * cp * pp)
                if batch % dp:
                    continue
                folds = [(1, 1)]
                if moe:
                    folds = [
                        (ep, etp)
                        for ep in _divisors(world_size // pp)
                        for etp in _divisors(world_size // (pp * ep))
                        if expert_tp is None or etp in expert_tp
                    ]
                ends = balance_ends and pp > 1 and (cfg.n_layers + 2) % pp == 0
                slots = cfg.n_layers + 2 if ends else cfg.n_layers
                vs = [1] if pp == 1 or slots % pp else [v for v in _divisors(slots // pp)]
                if virtual_stages is not None:
                    vs = [v for v in vs if v in virtual_stages or v == 1]
                ms = _divisors(batch // dp)
                if micro_batch_sizes is not None:
                    ms = [m for m in ms if batch // (dp * m) in micro_batch_sizes]
                runs = [(v, None) for v in vs]  # (v, zero-bubble schedule): 1F1B / interleaved, then the ZB ones
                for zb in sp_.zero_bubble if pp > 1 else ():
                    if zb not in V_SHAPED or slots % (2 * pp) == 0:
                        runs.append((2 if zb in V_SHAPED else 1, zb))
                for ep, etp in folds:
                    par = ParallelConfig(tp=tp, cp=cp, ep=ep, dp=dp, pp=pp, etp=etp, order=order)
                    if meshes is not None and par not in meshes:
                        continue
                    has_dp = dp * cp > 1 or (moe and par.expert_dp(world_size) > 1)
                    default = RunOptions()
                    for sp in sp_.sequence_parallel if tp > 1 else (False,):
                        for kind in sp_.cp_kinds if cp > 1 else (default.cp_kind,):
                            for zero in sp_.zero_stages if has_dp else (default.zero_stage,):
                                for v, zb in runs:
                                    for m, rc in ((m, rc) for m in ms for rc in sp_.recompute):
                                        rc, mods = _recompute_choice(cfg, rc, sp and tp > 1)
                                        o = RunOptions(sp, kind, n_microbatches=m, v=v, zero_stage=zero, recompute=rc)
                                        plan = Plan(par, o, sp_regather and sp, ends, recompute_modules=mods)
                                        plan = _moe_knobs(plan, moe, sp_)
                                        plan = replace(plan, zb_schedule=zb) if zb else plan
                                        sizes = group_sizes_for(pp, m, v, group_sizes) if zb is None else ()
                                        for n in dict.fromkeys((None,) + sizes):
                                            with_n = plan if n is None else replace(plan, group_size=n)
                                            for hs in _with_hsdp(with_n, sp_.hsdp_shards):
                                                for one in _with_dispatchers(hs, moe, sp_.dispatchers):
                                                    if one in seen or _breaks(cfg, one, world_size, batch, seq):
                                                        continue
                                                    seen.add(one)
                                                    out.append(one)
    return out


def _breaks(cfg, plan: Plan, world_size: int, batch: int, seq: int) -> bool:
    """Whether `plan` breaks a constraint (`problems`), the reasons made unspoken: the search shows none of them, so
    its result does not depend on the language."""
    with unspoken():
        return bool(problems(cfg, plan, world_size, batch, seq))


def _moe_knobs(plan: Plan, moe: bool, space: SearchSpace) -> Plan:
    """The plan with the search's routing imbalance, for a MoE model (a dense model's plans keep 1.0)."""
    if not moe or space.routing_imbalance == 1.0:
        return plan
    return replace(plan, routing_imbalance=space.routing_imbalance)


def _with_dispatchers(plan: Plan, moe: bool, dispatchers) -> list[Plan]:
    """The plan once per dispatcher of the search (`SearchSpace.dispatchers`), a MoE model's with EP only (a
    dispatcher over one rank moves nothing: ep = 1 keeps the model's)."""
    if not moe or dispatchers is None or plan.par.ep == 1:
        return [plan]
    return [replace(plan, dispatcher=d) for d in dispatchers]


def _recompute_choice(cfg, rc, sequence_parallel: bool) -> tuple[Recompute, tuple | None]:
    """One entry of `SearchSpace.recompute` as (`Recompute`, modules): a name, a `Recompute` or its triple, or
    ("selective", modules) -- the modules that change nothing for `cfg` dropped
    (`recompute.modules_with_effect`): none left is recompute="none", the core alone plain "selective" (modules
    None), so a set that only repeats another gives the same plan, enumerated once."""
    if isinstance(rc, tuple) and len(rc) == 2 and rc[0] == "selective":
        mods = recompute_analysis.modules_with_effect(cfg, tuple(rc[1]), sequence_parallel)
        if not mods:
            return Recompute("none"), None
        return Recompute("selective"), None if mods == DEFAULT_MODULES else mods
    return as_recompute(rc), None


# ------------------------------------------------------------------------------------------------ parameters


@dataclass(frozen=True)
class _Sizes:
    """Local parameter elements of one rank, by tensor (TP / EP / ETP splits applied; `weights.weight_shapes`)."""

    embed: int
    lm_head: int
    q: int  # W_Q, and W_O, of one layer
    kv: int  # W_K, and W_V
    dense_mlp: int  # W_gate + W_up + W_down of a dense layer
    router: int
    experts: int  # the E/ep local experts of one MoE layer, every matrix
    h: int
    shared: int = 0  # the shared experts' MLP of one MoE layer, its h_ffn cut over tp (dense: reduced over dp-cp)


@functools.lru_cache(maxsize=1024)
def _sizes(cfg, tp: int, ep: int, etp: int) -> _Sizes:
    flat = ParallelConfig(tp=tp, ep=ep, etp=etp, dp=ep * etp)  # every layer on one stage; only tp, ep, etp cut
    ws = {w.name: w for w in weight_shapes(cfg, flat)}

    def one(name):  # elements of one such tensor on this rank
        w = ws.get(name)
        return 0 if w is None else w.local_numel

    n_local = cfg.moe.n_experts // ep if cfg.moe is not None else 0
    return _Sizes(
        embed=one("token embedding"),
        lm_head=one("LM head"),
        q=one("W_Q"),
        kv=one("W_K"),
        dense_mlp=one("W_gate") + one("W_up") + one("W_down"),
        router=one("router"),
        experts=(one("expert W_gate") + one("expert W_up") + one("expert W_down")) * n_local,
        h=cfg.d_model,
        shared=(3 if cfg.mlp == "swiglu" else 2) * cfg.d_model * (recompute_analysis.shared_ff(cfg) // tp),
    )


def _layer_entries(cfg, sz: _Sizes, i: int) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(dense, expert) parameters of layer i in the order the composed layer registers them, named as it names the
    ones whose gradients TP sums after DP (LayerNorms, the router, replicated K/V); the dense MLP and the experts
    as one block each."""
    h, p = sz.h, f"layers.{i}."
    dense = [(p + "ln1.weight", h), (p + "ln1.bias", h)]
    dense += [(p + f"attn.{w}_proj.weight", sz.q if w in "qo" else sz.kv) for w in "qkvo"]
    dense += [(p + "ln2.weight", h), (p + "ln2.bias", h)]
    if cfg.is_moe_layer(i):
        shared = [(p + "mlp.shared", sz.shared)] if sz.shared else []
        return dense + [(p + "mlp.router.gate.weight", sz.router)] + shared, [(p + "mlp.experts", sz.experts)]
    return dense + [(p + "mlp", sz.dense_mlp)], []


class _Layout(FlatLayout):
    """A FlatLayout whose element count is computed once (the planner asks for it thousands of times)."""

    @functools.cached_property
    def numel(self) -> int:
        return sum(e.numel for e in self.entries)


def _entries(pairs) -> tuple[FlatEntry, ...]:
    out, offset = [], 0
    for name, n in pairs:
        if n:
            out.append(FlatEntry(name, (n,), offset))
            offset += n
    return tuple(out)


def flat_layouts(cfg, plan: Plan, pp_rank: int, world_size: int | None = None) -> list[FlatLayout]:
    """This rank's data-parallel flat buffers as `pylib.dp` lays them out, from sizes alone: per chunk one buffer of
    dense parameters over dp-cp and one of expert parameters over edp (ZeRO-3: one per unit -- the embedding, each
    layer, the final LayerNorm, the LM head), padded to a multiple of the group size under ZeRO. A real run cuts
    DDP's and ZeRO-1/2's buffers into 25 MiB buckets: the same bytes, up to that padding."""
    return list(_flat_layouts(cfg, _LayoutKey.of(plan, pp_rank, world_size)))


@dataclass(frozen=True)
class _LayoutKey:
    """What a rank's flat buffers depend on (the cache key of `_flat_layouts` and `_state`): the mesh's tp, ep, etp,
    pp, the plan's v and ZeRO stage, the rank's pipeline index, the dense and expert data-parallel sizes and
    Llama 3's uneven split, and where the stages live (`Plan.placement`)."""

    tp: int
    ep: int
    etp: int
    pp: int
    v: int
    pp_rank: int
    zero_stage: int
    d_dense: int
    d_expert: int
    balance_ends: bool
    placement: str = "loop"

    @classmethod
    def of(cls, plan: Plan, pp_rank: int, world_size: int | None = None) -> _LayoutKey:
        par, o = plan.par, plan.options
        world = par.world_size if world_size is None else world_size
        d_expert = par.expert_dp(world)
        d_dense = plan.dp_cp if plan.hsdp_shard is None else plan.hsdp_shard  # HSDP: shards over s only
        key = (par.tp, par.ep, par.etp, par.pp, o.v, pp_rank, o.zero_stage, d_dense, d_expert, plan.balance_ends)
        return cls(*key, plan.placement)


@functools.lru_cache(maxsize=16384)
def _flat_layouts(cfg, key: _LayoutKey) -> tuple[FlatLayout, ...]:
    tp, ep, etp, pp, v, pp_rank = key.tp, key.ep, key.etp, key.pp, key.v, key.pp_rank
    zero, d_dense, d_expert, ends = key.zero_stage, key.d_dense, key.d_expert, key.balance_ends
    sz = _sizes(cfg, tp, ep, etp)
    e = dtype_bytes(cfg.dtype)
    n_stages = pp * v
    out: list[FlatLayout] = []

    def add(key, axis, d, pairs):
        entries = _entries(pairs)
        if entries:
            parts = d if zero else 1
            out.append(_Layout(key, axis, tuple(range(d)), cfg.dtype, e, entries, parts))

    for c, (stage, layers) in enumerate(stage_chunks(cfg.n_layers, pp, v, pp_rank, ends, key.placement)):
        units: list[tuple[str, list, list]] = []  # (unit, dense, expert) in registration order
        if stage == 0:
            units.append(("embed", [("embed.weight", sz.embed)], []))
        for i in layers:
            dense, expert = _layer_entries(cfg, sz, i)
            units.append((f"layers.{i}", dense, expert))
        if stage == n_stages - 1:
            units.append(("ln_f", [("ln_f.weight", sz.h), ("ln_f.bias", sz.h)], []))
            units.append(("lm_head", [("lm_head.weight", sz.lm_head)], []))
        if zero == 3:  # FSDP-style units, each parameter list in registration order
            for name, dense, expert in units:
                add(f"{name}.dp-cp" if expert else name, "dp-cp", d_dense, dense)
                add(f"{name}.edp", "edp", d_expert, expert)
        else:  # buckets fill in reverse registration order: gradients appear from the last layer back
            dense = [x for _, d, _ in units for x in d][::-1]
            add(f"chunk{c}.dense", "dp-cp", d_dense, dense)
            add(f"chunk{c}.expert", "edp", d_expert, [x for _, _, e in units for x in e][::-1])
    return tuple(out)


def model_state_bytes(
    layouts: list[FlatLayout], zero_stage: ZeroStage, precision: str, optimizer_states: int = 2, grad_bytes: int = 2
) -> dict:
    """Parameter, gradient and optimizer-state bytes one rank holds: `compose.dp_held_bytes` (uniform precision,
    what pylib runs) or `dp.paper_bytes` per buffer (mixed precision, the ZeRO paper's 16-bit weights and 12 bytes
    of fp32 state); grad_bytes=4: fp32 gradients, `dp.mixed_held_bytes` of `MixedPrecision(grad_reduce="float32")`
    per buffer (what `pylib.dp` holds under that recipe). zero_stage: a `ZeroStage` (its int or name converted)."""
    stage = as_zero_stage(zero_stage)
    if precision == "uniform":
        return compose_analysis.dp_held_bytes(layouts, stage, optimizer_states=optimizer_states)
    if precision != "mixed":
        raise ValueError(f"precision={precision!r} must be one of {PRECISIONS}")
    total = dict(params=0, grads=0, optim=0)
    for lay in layouts:
        if lay.element_size != 2:
            raise ValueError(f"precision='mixed' counts 16-bit parameters; the model's dtype is {lay.dtype}")
        d = lay.parts if stage else 1
        n = lay.padded_numel if stage else lay.numel
        if grad_bytes == 2:
            held = dp_analysis.paper_bytes(n, d, stage, k=MIXED_STATE_BYTES)
        else:
            recipe = MixedPrecision("bfloat16", grad_reduce={4: "float32"}[grad_bytes])
            held = dp_analysis.mixed_held_bytes(n, d, stage, recipe, padded_params=n, optimizer_states=2)
        for k, v in held.items():
            total[k] += v
    return total


def zero3_gathered_bytes(layouts: list[FlatLayout], zero_stage: ZeroStage, resident_units: int = 2) -> int:
    """ZeRO-3's gathered parameters on top of the shards: the `resident_units` largest units in full (the running
    one and the prefetched next, `dp.zero3_peak_param_bytes`), in the parameters' dtype; 0 below ZeRO-3."""
    if as_zero_stage(zero_stage) != ZeroStage.ZERO3:
        return 0
    units: dict[str, int] = {}
    for lay in layouts:
        unit = lay.key.rsplit(".", 1)[0] if lay.key.endswith((".edp", ".dp-cp")) else lay.key
        units[unit] = units.get(unit, 0) + lay.numel * lay.element_size
    return dp_analysis.zero3_peak_param_bytes(0, list(units.values()), resident_units)


# ------------------------------------------------------------------------------------------------ compute, placement


def step_flops(cfg, batch: int, seq: int) -> float:
    """Training FLOPs of one step on the whole batch: forward = 2 FLOPs per multiply-add of every matmul a token
    passes through (Q, K, V, O; the dense MLP or the router and its top-k experts; the LM head) plus attention's
    q.k and p.v over the score entries it computes (`cp.attention_flops`: s(s+1)/2 per head when causal);
    backward twice the forward, so 3x in all. Without activation recomputation. The causal half is Megatron-LM's
    count since 8873b55 (March 2025; `num_floating_point_operations` at d98e8a6 counts s^2 / 2); the published runs
    are compared in the full s^2 count of their time (`calibration.megatron_flops`)."""
    h, dh, L = cfg.d_model, cfg.d_head, cfg.n_layers
    attn = h * (2 * cfg.n_heads * dh + 2 * cfg.kv_heads * dh)
    mats = 3 if cfg.mlp == "swiglu" else 2
    dense_mlp = mats * h * cfg.d_ff
    moe_mlp = 0
    if cfg.moe is not None:
        moe_mlp = cfg.moe.n_experts * h + cfg.moe.top_k * mats * h * (cfg.moe.d_ff or cfg.d_ff)
        moe_mlp += mats * h * recompute_analysis.shared_ff(cfg)  # the shared experts
    per_token = sum(attn + (moe_mlp if cfg.is_moe_layer(i) else dense_mlp) for i in range(L)) + h * cfg.vocab_size
    entries = seq * (seq + 1) // 2 if cfg.causal else seq * seq
    forward = 2 * per_token * batch * seq + L * batch * cp_analysis.attention_flops(entries * cfg.n_heads, dh)
    return 3.0 * forward


# the groups `compose.step_traffic` sends on in a plan the planner prices; "etp-ep" is the all-gather dispatcher's
# grid when etp > 1 (the tp-ep ranks of the folded expert mesh: its link chosen by `crosses_nodes` as every other's)
TRAFFIC_AXES = ("tp", "cp", "pp", "dp-cp", "tp-cp", "ep", "etp", "etp-ep", "edp")


@functools.lru_cache(maxsize=65536)
def crosses_nodes(par: ParallelConfig, world_size: int, group: str, gpus_per_node: int) -> bool:
    """Whether some group named `group` ("tp", "dp-cp", "ep", "edp", ...) holds ranks of two nodes, ranks numbered
    by the order string as `pylib.runtime.rank_groups` numbers them (node = rank // gpus_per_node). A group's ranks
    lie between its smallest and its largest, so it stays in one node iff those two do."""
    expert = group in EXPERT_GROUPS
    if expert:
        sizes = dict(tp=par.etp, cp=1, ep=par.ep, dp=par.expert_dp(world_size), pp=par.pp)
        axes = EXPERT_GROUPS[group].split("-")
    else:
        sizes = dict(tp=par.tp, cp=par.cp, ep=1, dp=par.dp, pp=par.pp)
        axes = group.split("-")
    names = par.order.split("-") + [a for a in AXES if a not in par.order.split("-")]
    strides, s = {}, 1
    for n in names:
        strides[n] = s
        s *= sizes[n]
    span = sum((sizes[a] - 1) * strides[a] for a in axes)
    if span == 0:
        return False
    others = [n for n in names if n not in axes and sizes[n] > 1]
    bases = [0]
    for n in others:
        bases = [b + k * strides[n] for b in bases for k in range(sizes[n])]
    return any(b // gpus_per_node != (b + span) // gpus_per_node for b in bases)


@functools.lru_cache(maxsize=4096)
def hsdp_crosses_nodes(par: ParallelConfig, world_size: int, shard: int, gpus_per_node: int) -> dict[str, bool]:
    """Whether some HSDP shard group ("dp-shard") and some replica group ("dp-replicate") hold ranks of two nodes,
    each dp-cp group cut by `pylib.plan.mesh.hsdp_groups` (node = rank // gpus_per_node)."""
    out = {HSDP_SHARD: False, HSDP_REPLICATE: False}
    for ranks in rank_groups(par, world_size)["dp-cp"]:
        for name, cut in zip((HSDP_SHARD, HSDP_REPLICATE), hsdp_groups(ranks, shard)):
            out[name] |= any(len({r // gpus_per_node for r in g}) > 1 for g in cut)
    return out


# ------------------------------------------------------------------------------------------------ prediction


@dataclass
class RankPrediction:
    """One pipeline rank: bytes held (params, grads, optim, activations, gathered, total), bytes sent per axis in
    one step ({axis: {"bytes_sent", "ops"}}, the tracer's by-axis form) and the seconds they take."""

    pp_rank: int
    memory: dict
    traffic: dict
    comm_time: float
    times: MicrobatchTime | None = None
    exposed: dict = field(default_factory=dict)  # axis (or "dp") -> seconds left on the critical path


@dataclass
class Prediction:
    plan: Plan
    ranks: list[RankPrediction]
    peak_memory: float
    fits: bool
    compute_time: float
    bubble_time: float
    comm_time: float
    intra_node: dict = field(default_factory=dict)  # axis -> True when its groups stay inside a node
    model_flops: float = 0.0  # `step_flops` of the step (2 per multiply-add, backward twice, causal half)
    world_size: int = 1

    @property
    def tflops_per_gpu(self) -> float:
        """Model FLOP/s per GPU in TFLOP/s: step_flops / (N t_step) / 1e12."""
        return self.model_flops / (self.world_size * self.step_time) / 1e12

    @property
    def step_time(self) -> float:
        return self.compute_time + self.bubble_time + self.comm_time

    @property
    def bubble_fraction(self) -> float:
        return bubble_fraction(self.plan, self.slowest_times())

    def slowest_times(self) -> MicrobatchTime | None:
        """The microbatch times of the slowest evaluated rank (the one the step's compute is priced on)."""
        timed = [r.times for r in self.ranks if r.times is not None]
        return max(timed, key=lambda t: t.total) if timed else None

    def traffic_by_axis(self) -> dict[str, float]:
        """Bytes sent per step on each axis by the busiest evaluated rank."""
        out: dict[str, float] = {}
        for r in self.ranks:
            for axis, t in r.traffic.items():
                out[axis] = max(out.get(axis, 0), t["bytes_sent"])
        return out

    def worst_rank(self) -> RankPrediction:
        return max(self.ranks, key=lambda r: r.memory["total"])


def bubble_fraction(plan: Plan, times: MicrobatchTime | None = None) -> float:
    """Idle time relative to compute: (pp - 1) / (v m) (`pp.bubble_fraction`), or, for a group size N other than
    Megatron's default, measured on the schedule (`pp.simulated_bubble_fraction`). A zero-bubble plan's depends on
    its costs: `times` (the slowest rank's microbatch) split into F = forward, W = the weight-gradient GEMMs
    (`MicrobatchTime.wgrad`) and B = the rest of the backward, and the schedule simulated with them
    (`pp.simulated_split_bubble`: the step's makespan beyond m (F + B + W))."""
    par = plan.par
    if plan.zb_schedule is not None:
        if times is None:
            raise ValueError(f"{plan.describe()}: a zero-bubble plan's bubble needs its microbatch times")
        t_b = times.backward - times.wgrad
        idle = pp_analysis.simulated_split_bubble(
            plan.zb_schedule, par.pp, plan.options.n_microbatches, times.forward, t_b, times.wgrad
        )
        return idle / (plan.options.n_microbatches * times.total)
    if plan.group_size is None:
        return pp_analysis.bubble_fraction(par.pp, plan.options.n_microbatches, plan.options.v)
    return pp_analysis.simulated_bubble_fraction(
        plan.options.schedule, par.pp, plan.options.n_microbatches, plan.options.v, plan.group_size
    )


def evaluated_ranks(pp: int) -> list[int]:
    """Pipeline ranks that differ: the first (embedding, most microbatches in flight), the second (a middle rank:
    sends both ways), the last (LM head)."""
    return sorted({0, min(1, pp - 1), pp - 1})


def expected_routing(cfg, plan: Plan, batch: int, seq: int, pp_rank: int) -> list[tuple]:
    """The MoE forwards of this rank in one step, (layer, send_counts, recv_counts, etp_rows) as `compose.
    step_traffic` reads them from a run, filled with their expectation under uniform routing: T k / E rows from each
    of this rank's T tokens' k choices to each expert, T k rows received per EP rank; with
    `plan.routing_imbalance` = f the busiest rank's, f times those both ways."""
    if cfg.moe is None:
        return []
    par = plan.par
    b = plan.micro_batch(batch)
    s_out = seq // par.cp // (par.tp if plan.options.sequence_parallel and par.tp > 1 else 1)
    T, k, E = b * s_out, cfg.moe.top_k, cfg.moe.n_experts
    f = plan.routing_imbalance  # the busiest rank's rows, f times the mean (`Plan`)
    scale = Fraction(f) if f != 1.0 else 1
    counts = [[Fraction(T * k, E) * scale] * (E // par.ep) for _ in range(par.ep)]  # [ep, E_local], exact
    rows = [expected_expert_rows(T, k) * scale] * par.etp
    layers = [i for _, c in rank_chunks(cfg, plan, pp_rank) for i in c]
    layers = [i for i in layers if cfg.is_moe_layer(i)]
    return [(i, counts, counts, rows) for _ in range(plan.options.n_microbatches) for i in layers]


def rank_traffic_rows(
    cfg,
    plan: Plan,
    batch: int,
    seq: int,
    pp_rank: int,
    layouts=None,
    *,
    coords: dict[str, int] | None = None,
    moe_routing: list | None = None,
) -> list:
    """Every op one rank issues in one step, as `compose.step_traffic` rows (axis, phase, op, where, count,
    bytes_sent), on this rank's `flat_layouts`. coords: the rank's index on "dp-cp" (which ZeRO shard it holds:
    it decides how many LayerNorm elements its TP all-reduce carries; the planner takes the first), "ep" and
    "etp" (a missing axis: 0; "pp" is pp_rank). moe_routing: the routing of a real run (`compose.train`'s
    "moe_routing"); None takes the `expected_routing` (uniform, no dropping), which is what the planner predicts
    with."""
    layouts = flat_layouts(cfg, plan, pp_rank) if layouts is None else layouts
    coords = dict(coords or {}) | {"pp": pp_rank}
    rows = _traffic_rows(_dispatched(cfg, plan), plan, batch, seq, coords, layouts, moe_routing)
    rows += moe_recompute_rows(plan, rows)
    rows = _v_rows(plan, rows, pp_rank)
    return _hsdp_rows(plan, rows) + module_traffic_rows(cfg, plan, batch, seq, pp_rank)


def shared_expert_rows(cfg, plan: Plan, batch: int, seq: int, pp_rank: int) -> list:
    """The shared experts' TP collectives among this rank's step rows (`MoEConfig.n_shared_experts`, tp > 1):
    `compose.shared_collectives` in every held MoE layer, per microbatch (where "shared_experts")."""
    rows = rank_traffic_rows(cfg, plan, batch, seq, pp_rank)
    return [r for r in rows if r.where == "shared_experts"]


def moe_recompute_rows(plan: Plan, rows: list) -> list:
    """What Megatron's "moe" module sends again in backward (phase "recompute"): its checkpoint reruns the MoE
    layer's forward, so every forward row of the expert axes (the counts, the dispatch and combine all-to-alls, the
    ETP gathers and reduce-scatters) once more, at the same routing (megatron/core/transformer/moe/moe_layer.py at
    d98e8a6: `tensor_parallel.checkpoint(custom_forward, ...)` around router, dispatch, experts and combine)."""
    if "moe" not in plan.modules:
        return []
    return [
        replace(r, phase="recompute", where=f"{r.where}.recompute")
        for r in rows
        if r.axis in ("ep", "etp", "etp-ep") and r.phase == "forward"
    ]


def _v_rows(plan: Plan, rows: list, pp_rank: int) -> list:
    """In the V placement (`Plan.placement`) the stage-boundary sends of this rank as the V has them
    (`pp.p2p_bytes_per_rank(..., placement="v")`: rank p - 1 hands its turn over in memory, every other rank sends
    across both of its chunks' boundaries); `compose.step_traffic` counts the loop placement's."""
    if plan.placement == "loop":
        return rows
    p, m, v = plan.par.pp, plan.options.n_microbatches, plan.options.v
    out = []
    for r in rows:
        if r.axis == "pp" and r.where == "stage boundary":
            msgs = pp_analysis.p2p_bytes_per_rank(1, 1, 1, 1, p, m, pp_rank, v, plan.placement)  # 1-byte messages
            r = replace(r, count=msgs, bytes_sent=msgs * r.payload if r.op == "send" else 0)
        out.append(r)
    return out


def _hsdp_rows(plan: Plan, rows: list) -> list:
    """Under HSDP (`Plan.hsdp_shard` = s) the dense ZeRO-3 rows, already over s (the layouts are cut in s), move
    to the shard group, and each reduce-scatter is followed by the all-reduce of its shard, S/s, over the r =
    dp x cp / s replicas (`dp.hsdp_traffic_by_link`); the loss stays on dp-cp."""
    s = plan.hsdp_shard
    if s is None:
        return rows
    r = plan.dp_cp // s
    out = []
    for row in rows:
        if row.axis != "dp-cp" or row.op not in ("all_gather", "reduce_scatter"):
            out.append(row)
            continue
        out.append(replace(row, axis=HSDP_SHARD))
        if row.op == "reduce_scatter":
            shard = row.payload // s
            sent = row.count * tp_analysis.ring_bytes_sent("all_reduce", shard, r)
            out.append(replace(row, axis=HSDP_REPLICATE, op="all_reduce", bytes_sent=sent, payload=shard))
    return out


def module_traffic_rows(cfg, plan: Plan, batch: int, seq: int, pp_rank: int) -> list:
    """The TP collectives Megatron's recomputed modules issue again in backward (phase "recompute"), one row per
    op: under "mlp" every held dense layer's MLP forward ones, under "shared_experts" or "moe" every held MoE
    layer's shared-expert MLP's, per microbatch (`recompute.module_extra_collectives`); nothing for the other
    modules, and nothing without them."""
    par = plan.par
    if par.tp == 1 or not plan.modules & {"mlp", "shared_experts", "moe"}:
        return []
    held = [i for _, c in rank_chunks(cfg, plan, pp_rank) for i in c]
    out = []
    for moe_layer in (False, True):
        ops = recompute_analysis.module_extra_collectives(
            cfg,
            plan.micro_batch(batch),
            seq // par.cp,
            par.tp,
            plan.modules,
            sequence_parallel=plan.options.sequence_parallel,
            moe_layer=moe_layer,
        )
        n = plan.options.n_microbatches * sum(cfg.is_moe_layer(i) == moe_layer for i in held)
        where = "shared_experts" if moe_layer else None
        out += [
            compose_analysis.Traffic(
                "tp", "recompute", c.op, f"{where or c.where}.recompute", n, n * c.bytes_sent, c.payload_bytes
            )
            for c in ops
            if n
        ]
    return out


def _traffic_rows(cfg, plan, batch, seq, coords, layouts, moe_routing):
    """`rank_traffic_rows` without the recomputed modules' rows."""
    kw = dict(batch=batch, seq=seq, coords=coords, layouts=layouts)
    kw.update(options=plan.run_options, sp_regather=plan.sp_regather)
    if moe_routing is not None:
        return compose_analysis.step_traffic(cfg, plan.par, moe_routing=moe_routing, **kw)
    routing = expected_routing(cfg, plan, batch, seq, coords["pp"])
    cfg = _slots(cfg, plan)  # compose cuts equal stages: the slots' layers (see `Plan`)
    rows = compose_analysis.step_traffic(cfg, plan.par, moe_routing=routing[:1], **kw)
    if len(routing) <= 1:
        return rows
    # Every expected MoE forward is the same: the rows of one, times their number (m x MoE layers held), instead of
    # evaluating thousands of identical entries. The rows of one forward = those with it minus those without.
    extra = Counter(rows) - Counter(compose_analysis.step_traffic(cfg, plan.par, moe_routing=[], **kw))
    n = len(routing)
    for row, k in extra.items():
        rows += [replace(row, count=row.count * (n - 1), bytes_sent=row.bytes_sent * (n - 1))] * k
    return rows


def rank_traffic(cfg, plan: Plan, batch: int, seq: int, pp_rank: int, layouts=None) -> dict[str, dict]:
    """Bytes one rank sends per step on each axis: `compose.per_axis` of `rank_traffic_rows`."""
    return compose_analysis.per_axis(rank_traffic_rows(cfg, plan, batch, seq, pp_rank, layouts))


def rank_memory(cfg, plan: Plan, workload: Workload, pp_rank: int, world_size: int | None = None) -> dict:
    """Bytes one rank holds: model state (`model_state_bytes` of its `flat_layouts`), the activations at the
    schedule's peak (`activations.peak_saved_bytes`), ZeRO-3's gathered units (`zero3_gathered_bytes`), the total."""
    key = _LayoutKey.of(plan, pp_rank, world_size)
    params, grads, optim, gathered = _state(
        cfg, key, workload.precision, workload.optimizer_states, workload.grad_bytes
    )
    acts = _activations(cfg, plan, workload, pp_rank)
    out = dict(params=params, grads=grads, optim=optim, activations=acts, gathered=gathered)
    if workload.fp8 is not None:
        out["fp8"] = fp8_weight_copies(cfg, plan, workload, pp_rank)
    return out | dict(total=sum(out.values()))


def fp8_weight_shapes(cfg, plan: Plan, pp_rank: int, first_last_layers_bf16: bool = False) -> list[tuple[int, int]]:
    """[out, in] of every linear weight this rank runs in FP8, as TP, EP and ETP cut them (the N x K of each of
    `efficiency.layer_gemms` but the router; the LM head and, with `first_last_layers_bf16`, the first and last layers
    stay in 16 bits)."""
    return list(_fp8_shapes(cfg, _LayoutKey.of(plan, pp_rank), first_last_layers_bf16))


@functools.lru_cache(maxsize=16384)
def _fp8_shapes(cfg, key: _LayoutKey, first_last_layers_bf16: bool) -> tuple[tuple[int, int], ...]:
    out = []
    for _, layers in stage_chunks(cfg.n_layers, key.pp, key.v, key.pp_rank, key.balance_ends, key.placement):
        for i in layers:
            if first_last_layers_bf16 and i in (0, cfg.n_layers - 1):
                continue
            moe = cfg.moe is not None and cfg.is_moe_layer(i)
            router = _router_index(cfg, moe, key.ep)  # the router stays in 16 bits (shared experts follow it)
            gemms = layer_gemms(cfg, 1, key.tp, moe, key.ep, key.etp)
            out += [(n, k) for j, (_, n, k) in enumerate(gemms) if j != router]
    return tuple(out)


def fp8_weight_copies(cfg, plan: Plan, workload: Workload, pp_rank: int) -> int:
    """Bytes of FP8 weight copies and scales one rank holds between steps (`fp8.fp8_held_bytes`' "fp8": every FP8
    linear's copies and scales for DDP and ZeRO-1/2, delayed scaling's amax histories alone under ZeRO-3, whose
    copies live with the gathered unit)."""
    first_last = workload.fp8.first_last_layers_bf16
    return _fp8_copies(cfg, _LayoutKey.of(plan, pp_rank), first_last, workload.fp8_mixed)


@functools.lru_cache(maxsize=16384)
def _fp8_copies(cfg, key: _LayoutKey, first_last_layers_bf16: bool, precision: MixedPrecision) -> int:
    shapes = list(_fp8_shapes(cfg, key, first_last_layers_bf16))
    return fp8_analysis.fp8_held_bytes(0, shapes, 1, key.zero_stage, precision)["fp8"]


@functools.lru_cache(maxsize=65536)
def _state(cfg, key: _LayoutKey, precision: str, optimizer_states: int, grad_bytes: int = 2) -> tuple:
    layouts = list(_flat_layouts(cfg, key))
    state = model_state_bytes(layouts, key.zero_stage, precision, optimizer_states, grad_bytes)
    return state["params"], state["grads"], state["optim"], zero3_gathered_bytes(layouts, key.zero_stage)


@functools.lru_cache(maxsize=65536)
def _activations(cfg, plan: Plan, workload: Workload, pp_rank: int) -> int:
    """The activation bytes at the schedule's peak, remembered: like the model state (`_state`), they do not depend
    on the cluster's speeds or the cost model, which a fit and the explorers vary over the same plans. The
    workload's fp8 (its linears' inputs kept in FP8, `activations.fp8_rows`) and storage (`activations.storage_rows`)
    set what each layer keeps."""
    o = plan.options
    if plan.zb_schedule is not None:
        return _split_activations(cfg, plan, workload, pp_rank)
    key = (workload.attention, workload.fp8, workload.storage)
    chunks = _chunk_bytes(cfg, plan.micro_batch(workload.batch), workload.seq, _activation_key(plan), pp_rank, key)
    return _peak(chunks, o.schedule, plan.par.pp, o.n_microbatches, o.v, pp_rank, plan.group_size)


@functools.lru_cache(maxsize=65536)
def _peak(
    chunks: tuple, schedule: str, pp: int, n_microbatches: int, v: int, pp_rank: int, group_size: int | None
) -> int:
    """`peak_saved_bytes`, remembered: plans that differ only where neither a chunk's bytes nor the schedule look
    (the ZeRO stage, the data-parallel size, the cost model) share it."""
    return peak_saved_bytes(list(chunks), schedule, pp, n_microbatches, v, pp_rank, group_size)


def _split_activations(cfg, plan: Plan, workload: Workload, pp_rank: int) -> int:
    """A zero-bubble plan's activation peak on one rank: its order replayed (`pp.split_live_counts`), each
    microbatch of a chunk holding the chunk's saved bytes until its W (or its fused backward) and, from its B to
    its W, the output gradients W needs (`wgrad_kept_bytes`) and, under recomputation, what B regenerated (the
    chunk's saved bytes without recomputation less those with it: W reads the linears' recomputed inputs). A
    chunk's saved bytes are those of the same virtual stage in the loop placement (`chunk_saved_bytes` of rank
    k % p, chunk k // p)."""
    p, b, seq = plan.par.pp, plan.micro_batch(workload.batch), workload.seq
    key = _activation_key(replace(plan, zb_schedule=None))
    whole = _activation_key(replace(plan, zb_schedule=None).with_options(recompute="none"))
    kept_as = (workload.attention, workload.fp8, workload.storage)
    saved, kept = [], []
    for stage, layers in rank_chunks(cfg, plan, pp_rank):
        held = _chunk_bytes(cfg, b, seq, key, stage % p, kept_as)[stage // p]
        regenerated = _chunk_bytes(cfg, b, seq, whole, stage % p, kept_as)[stage // p] - held
        saved.append(held)
        last = stage == p * plan.options.v - 1
        kept.append(regenerated + wgrad_kept_bytes(cfg, plan, b * seq // plan.par.cp, layers, last))
    states = pp_analysis.split_live_counts(plan.zb_schedule, p, plan.options.n_microbatches, pp_rank)
    return max(sum(n * x for n, x in zip(a + g, saved + kept, strict=True)) for a, g in states)


def wgrad_kept_bytes(cfg, plan: Plan, tokens: int, layers, last_stage: bool) -> int:
    """Bytes a deferred W keeps for one microbatch of one chunk between its B and its W, beyond the saved
    activations (which its graph keeps alive anyway): the gradient of every weight GEMM's output, [M, N] of each
    (`efficiency.layer_gemms` on this rank's T = b s / cp tokens), and the LM head's [T, V / tp] on the last
    stage, in the model's dtype. What `pylib.pp.backward.backward_input` keeps at each frontier node."""
    par, e = plan.par, dtype_bytes(cfg.dtype)
    out = 0
    for i in layers:
        moe = cfg.moe is not None and cfg.is_moe_layer(i)
        out += sum(m * n for m, n, _ in layer_gemms(cfg, tokens, par.tp, moe, par.ep, par.etp))
    if last_stage:
        out += tokens * cfg.vocab_size // par.tp
    return int(out * e)


def _activation_key(plan: Plan) -> Plan:
    """The plan with the options `chunk_saved_bytes` does not read at one value (ZeRO stage, m, N; the CP kind
    without CP): plans that differ only there share `_chunk_bytes`' cache entry."""
    o = plan.options
    kind = o.cp_kind if plan.par.cp > 1 else RunOptions().cp_kind
    options = RunOptions(o.sequence_parallel, kind, o.cp_layout, v=o.v, recompute=o.recompute)
    return replace(plan, options=options, group_size=None)


@functools.lru_cache(maxsize=65536)
def _chunk_bytes(cfg, b: int, seq: int, plan: Plan, pp_rank: int, kept_as: tuple) -> tuple[int, ...]:
    """`chunk_saved_bytes`, remembered; kept_as: the workload's (attention, fp8, storage)."""
    attention, fp8, storage = kept_as
    return tuple(chunk_saved_bytes(cfg, b, seq, plan, pp_rank, attention=attention, fp8=fp8, storage=storage))


def _bandwidths(plan: Plan, cluster: Cluster) -> dict[str, bool]:
    out = {axis: not crosses_nodes(plan.par, cluster.world_size, axis, cluster.gpus_per_node) for axis in TRAFFIC_AXES}
    if plan.hsdp_shard is not None:
        crossing = hsdp_crosses_nodes(plan.par, cluster.world_size, plan.hsdp_shard, cluster.gpus_per_node)
        out.update({axis: not x for axis, x in crossing.items()})
    return out


def rank_times(cfg, plan: Plan, workload: Workload, cluster: Cluster, pp_rank: int) -> MicrobatchTime:
    """Seconds of one microbatch on this pipeline rank (`efficiency.microbatch_seconds`)."""
    return microbatch_seconds(
        cfg,
        plan,
        workload.seq,
        pp_rank,
        batch=workload.batch,
        peak_flops=cluster.peak_flops,
        hbm_bandwidth=cluster.hbm_bandwidth,
        model=cluster.model,
        fp8=fp8_compute(workload, cluster),
        storage=workload.storage,
    )


def fp8_compute(workload: Workload, cluster: Cluster) -> Fp8Compute | None:
    """The FP8 GEMMs of `workload` on `cluster` (`efficiency.Fp8Compute`), None without FP8."""
    if workload.fp8 is None:
        return None
    return Fp8Compute(workload.fp8, cluster.fp8_peak_flops)


def exposed_seconds(plan: Plan, counted, t: MicrobatchTime, cluster: Cluster, intra: dict) -> dict[str, float]:
    """Seconds of this rank's communication left on the critical path, by axis (the module docstring's overlap rules),
    from its traffic rows as (row, times) pairs (`compose.counted_rows`: a layer's rows repeat, priced once each): TP/SP
    (and ETP, TP-CP) in full, or (1 - tp_overlap) of it with `tp_comm_overlap`; ring CP less the attention core it hides
    behind; Ulysses and EP (the all-gather dispatcher's etp-ep too) in full; PP's sends of the fill and drain, (pp - 1)
    / (v m) of them; DP by ZeRO stage: DDP / ZeRO-1 reduce once, behind the last microbatch's backward, ZeRO-1/2 gather
    the updated parameters behind the next step's first forward, ZeRO-2 reduce-scatters every microbatch behind its
    backward, ZeRO-3 gathers every microbatch behind its forward and again (with the reduce-scatter) behind its
    backward.
    Without `overlap_dp` every DP byte counts. Megatron's SP (`Plan.sp_regather`) issues two of its backward
    collectives asynchronously in the column- parallel linears (`megatron/core/tensor_parallel/layers.py`): the
    regather of the saved input, under the input- gradient GEMM, and the input gradient's reduce-scatter, under the
    weight-gradient GEMM; each is exposed only past that GEMM (`MicrobatchTime.column_dgrad`, both GEMMs as long as
    the forward's), and at most as much as the other TP traffic. Every op of the model axes (tp, cp, ep, pp: each
    collective, each ring step's send) also waits `CostModel.latency` before its bytes move ("latency"): what makes
    many small messages (CP on short sequences, thousands of microbatches) cost more than their bytes. And hidden
    communication is not free: NCCL's kernels take SMs from the GEMMs they overlap, so every hidden second slows
    compute by `CostModel.contention` seconds ("contention")."""
    m = plan.options.n_microbatches
    secs: dict[tuple, float] = {}
    ops = 0  # the model axes' ops that move bytes (each waits the latency)
    for r, times in counted:
        bw = cluster.intra_node_bandwidth if intra[r.axis] else cluster.inter_node_bandwidth
        op = r.op
        if r.where.endswith(".regather"):
            op = "regather"
        elif plan.sp_regather and r.axis == "tp" and r.phase == "backward" and r.op == "reduce_scatter":
            op = "wgrad_overlap"  # Megatron: the input gradient's reduce-scatter runs under the weight gradient
        key = (r.axis, r.phase, op)
        secs[key] = secs.get(key, 0.0) + times * (r.bytes_sent / bw)
        if r.axis not in DP_AXES and r.bytes_sent and r.op != "recv":
            ops += times * r.count
    out: dict[str, float] = {}
    dp = {"reduce": 0.0, "gather_opt": 0.0, "gather_fwd": 0.0}
    tp_keep = 1 - cluster.model.tp_overlap if cluster.tp_comm_overlap else 1.0
    out["latency"] = cluster.model.latency * ops
    for (axis, phase, op), x in secs.items():
        if axis in DP_AXES:
            if op == "all_gather" and phase == "forward":
                dp["gather_fwd"] += x
            elif op == "all_gather" and phase != "backward":
                dp["gather_opt"] += x
            else:
                dp["reduce"] += x
            continue
        if op in ("regather", "wgrad_overlap"):  # launched async before the GEMM it runs under (dX, dW)
            x = min(tp_keep * x, max(0.0, x - m * t.column_dgrad))
        elif axis in ("tp", "tp-cp", "etp"):
            x *= tp_keep
        elif axis == "pp":
            x *= min(1.0, bubble_fraction(plan, t))
        out[axis] = out.get(axis, 0.0) + x
    if "cp" in out and plan.options.cp_kind == "ring":  # the K/V passes run while the core computes
        out["cp"] = max(0.0, out["cp"] - m * t.core)
    if "ep" in out and getattr(plan, "ep_overlap", False):  # under the other microbatch's compute (`Plan`)
        out["ep"] = max(0.0, out["ep"] - m * t.total)
    if not cluster.overlap_dp:
        out["dp"] = sum(dp.values())
    elif plan.options.zero_stage <= 1:
        out["dp"] = max(0.0, dp["reduce"] - t.backward) + max(0.0, dp["gather_opt"] - t.forward)
    elif plan.options.zero_stage == 2:
        out["dp"] = m * max(0.0, dp["reduce"] / m - t.backward) + max(0.0, dp["gather_opt"] - t.forward)
    else:
        out["dp"] = m * (max(0.0, dp["gather_fwd"] / m - t.forward) + max(0.0, dp["reduce"] / m - t.backward))
    hidden = sum(secs.values()) - sum(x for k, x in out.items() if k != "latency")
    out["contention"] = cluster.model.contention * max(0.0, hidden)
    return out


def predict(cfg, plan: Plan, workload: Workload, cluster: Cluster) -> Prediction:
    """Memory and traffic of the evaluated pipeline ranks, the times of the cost model, and whether it fits.
    Raises ValueError naming every constraint the plan breaks (`problems`) when the composed model cannot run it."""
    bad = problems(cfg, plan, cluster.world_size, workload.batch, workload.seq)
    if bad:
        raise ValueError(f"{plan.describe()} cannot run on {cluster.world_size} GPUs: " + "; ".join(bad))
    par = plan.par
    intra = _bandwidths(plan, cluster)
    ranks = []
    for r in evaluated_ranks(par.pp):
        mem = rank_memory(cfg, plan, workload, r, cluster.world_size)
        rows, by_axis = _predicted_rows(cfg, plan, workload, r, cluster.world_size)
        t = rank_times(cfg, plan, workload, cluster, r)
        exposed = exposed_seconds(plan, rows, t, cluster, intra)
        by_axis = {a: dict(bytes_sent=x["bytes_sent"], ops=dict(x["ops"])) for a, x in by_axis.items()}  # the caller's
        ranks.append(RankPrediction(r, mem, by_axis, sum(exposed.values()), t, exposed))
    peak = max(r.memory["total"] for r in ranks)
    slowest = max((r.times for r in ranks), key=lambda t: t.total)
    compute = plan.options.n_microbatches * slowest.total
    return Prediction(
        plan=plan,
        ranks=ranks,
        peak_memory=peak,
        fits=peak <= cluster.usable_memory,
        compute_time=compute,
        bubble_time=compute * bubble_fraction(plan, slowest),
        comm_time=max(r.comm_time for r in ranks),
        intra_node=intra,
        model_flops=step_flops(cfg, workload.batch, workload.seq),
        world_size=cluster.world_size,
    )


@functools.lru_cache(maxsize=4096)
def _predicted_rows(cfg, plan: Plan, workload: Workload, pp_rank: int, world_size: int) -> tuple[tuple, dict]:
    """(`counted_rows` of the traffic rows in the workload's gradient dtype, their `per_axis`) of one rank,
    remembered: they do not depend on the cluster's speeds or the cost model, which a fit varies over the same plans
    (all arguments immutable)."""
    layouts = flat_layouts(cfg, plan, pp_rank, world_size)
    rows = rank_traffic_rows(cfg, plan, workload.batch, workload.seq, pp_rank, layouts)
    counted = compose_analysis.counted_rows(rows)
    scaled = gradient_dtype_rows([r for r, _ in counted], workload)  # once per distinct row
    scaled = fp8_gather_rows(scaled, layouts, workload, cfg.n_layers)
    counted = tuple((r, times) for r, (_, times) in zip(scaled, counted, strict=True))
    return counted, compose_analysis.counted_per_axis(counted)


DP_AXES = ("dp-cp", "edp", HSDP_SHARD, HSDP_REPLICATE)


def gradient_dtype_rows(rows: list, workload: Workload) -> list:
    """The traffic rows with the data-parallel gradient reductions (all-reduce, reduce-scatter on dp-cp and edp)
    in the workload's gradient dtype: `compose.step_traffic` counts them in the parameters' 16 bits; fp32
    gradients (`Workload.grad_reduce="float32"`) send twice the bytes (`dp.mixed_traffic_by_op`). Parameter
    all-gathers stay 16-bit."""
    scale = workload.grad_bytes // 2
    if scale == 1:
        return rows
    grads = ("all_reduce", "reduce_scatter")
    return [
        replace(r, bytes_sent=r.bytes_sent * scale, payload=r.payload * scale)
        if r.axis in DP_AXES and r.op in grads
        else r
        for r in rows
    ]


def fp8_gather_rows(rows: list, layouts, workload: Workload, n_layers: int) -> list:
    """With the recipe's `param_gather` (`Workload.fp8`) the data-parallel parameter all-gathers (ZeRO-3's every
    microbatch, ZeRO-1/2's after the step) of each flat buffer move its FP8 linears' elements in 1 byte and the rest
    in 2: the row's bytes times 1 - f / 2, f the buffer's share of elements in FP8 linears (`fp8_entry`). Not
    counted: `pylib.dp.fp8_gather`'s own flat for the FP8 weights (its padding) and the all-reduce that agrees their
    scales (`fp8.fp8_param_gather_bytes`: 4 bytes per weight or block)."""
    if workload.fp8 is None or not workload.fp8.param_gather:
        return rows
    first_last = workload.fp8.first_last_layers_bf16
    share = {}
    for lay in layouts:
        fp8 = sum(e.numel for e in lay.entries if fp8_entry(e.name, n_layers, first_last))
        share[lay.key] = Fraction(fp8, lay.numel)
    return [
        replace(
            r,
            bytes_sent=int(r.bytes_sent * (1 - share[r.where] / 2)),
            payload=int(r.payload * (1 - share[r.where] / 2)),
        )
        if r.axis in DP_AXES and r.op == "all_gather" and r.where in share
        else r
        for r in rows
    ]


def fp8_entry(name: str, n_layers: int, first_last_layers_bf16: bool = False) -> bool:
    """Whether the flat-buffer entry `name` (`flat_layouts`) holds an FP8 linear's weight: a layer's attention
    projections, its dense MLP or its experts (not the norms, the router, the embedding or the LM head; not the
    first and last layer with `first_last_layers_bf16`)."""
    parts = name.split(".")
    if parts[0] != "layers" or (first_last_layers_bf16 and int(parts[1]) in (0, n_layers - 1)):
        return False
    rest = ".".join(parts[2:])
    return rest in ("mlp", "mlp.experts") or (rest.startswith("attn.") and rest.endswith("_proj.weight"))


def compute_time(cfg, plan: Plan, workload: Workload, cluster: Cluster) -> float:
    """Seconds the slowest evaluated pipeline rank computes per step: m microbatches of `rank_times`."""
    ranks = evaluated_ranks(plan.par.pp)
    return plan.options.n_microbatches * max(rank_times(cfg, plan, workload, cluster, r).total for r in ranks)


def peak_memory(cfg, plan: Plan, workload: Workload, cluster: Cluster) -> float:
    """The most bytes any pipeline rank holds (`rank_memory` of the evaluated ranks)."""
    return max(rank_memory(cfg, plan, workload, r, cluster.world_size)["total"] for r in evaluated_ranks(plan.par.pp))


def comm_lower_bound(cfg, plan: Plan, workload: Workload, cluster: Cluster) -> float:
    """Seconds of exposed communication the first pipeline rank cannot avoid, from terms `exposed_seconds` counts
    in full (so at most its total): TP's collectives around attention in every held layer (`tp.layer_collectives`,
    times 1 - tp_overlap when the run overlaps them), Ulysses' all-to-alls or all-gather CP's collectives in every
    held layer (`cp.ulysses_traffic`, `cp.allgather_traffic`), EP's dispatch and combine, forward and backward, in
    every held MoE layer (`ep.expected_alltoall_bytes`; the all-gather dispatcher's `ep.dispatcher_bytes` over
    the etp x ep grid, on "etp-ep" when etp > 1; none of the all-to-alls under `Plan.ep_overlap`, which may hide them
    all under the other microbatch's compute). 1% below, for the bytes the formulas round down per buffer. Used by
    `rank_plans` to skip plans that cannot win; never reported."""
    par = plan.par
    e = dtype_bytes(cfg.dtype)
    m, b, s_cp = plan.options.n_microbatches, plan.micro_batch(workload.batch), workload.seq // par.cp
    held = [i for _, c in rank_chunks(cfg, plan, 0) for i in c]
    intra = _bandwidths(plan, cluster)

    def bw(axis):
        return cluster.intra_node_bandwidth if intra[axis] else cluster.inter_node_bandwidth

    seconds = 0.0
    if par.tp > 1:
        keep = 1 - cluster.model.tp_overlap if cluster.tp_comm_overlap else 1.0
        collectives = tp_analysis.layer_collectives(
            b, s_cp, cfg.d_model, par.tp, e, sequence_parallel=plan.options.sequence_parallel
        )
        per_layer = sum(c.bytes_sent for c in collectives if c.where == "attn")
        seconds += keep * m * len(held) * per_layer / bw("tp")
    if par.cp > 1 and plan.options.cp_kind in ("ulysses", "allgather"):
        heads, (kv, _) = cfg.n_heads // par.tp, kv_heads_per_rank(cfg.n_heads, cfg.kv_heads, par.tp)
        if plan.options.cp_kind == "ulysses":
            u = cp_analysis.ulysses_traffic(b, workload.seq, heads, kv, cfg.d_head, par.cp, e)
        else:
            u = cp_analysis.allgather_traffic(b, workload.seq, kv, cfg.d_head, par.cp, e)
        seconds += m * len(held) * (u["forward_bytes_sent"] + u["backward_bytes_sent"]) / bw("cp")
    gather = dispatcher_of(cfg, plan) == "allgather" if cfg.moe is not None else False
    hidden = getattr(plan, "ep_overlap", False) and not gather  # the "ep" all-to-alls may hide entirely
    if cfg.moe is not None and (par.ep > 1 or (gather and par.etp > 1)) and not hidden:
        s_out = s_cp // (par.tp if plan.options.sequence_parallel and par.tp > 1 else 1)
        moe_layers = sum(cfg.is_moe_layer(i) for i in held)
        tokens, k = b * s_out, cfg.moe.top_k
        if gather:  # forward and backward, less the int64 ids (no gradient), over the etp x ep grid
            sent = ep_analysis.dispatcher_bytes("allgather", tokens, k, cfg.d_model, e, par.ep, par.etp)
            per_layer = 2 * sent["total"] - (par.ep * par.etp - 1) * tokens * k * 8
        else:
            per_layer = 4 * ep_analysis.expected_alltoall_bytes(tokens, k, cfg.d_model, par.ep, e)
        seconds += m * moe_layers * per_layer / bw("ep" if par.etp == 1 or not gather else "etp-ep")
    return 0.99 * seconds


def most_microbatches(plans: list[Plan]) -> list[Plan]:
    """The plans the cost model can prefer: all of them. (An earlier cost model kept only the largest m of plans
    that differ in m alone; with GEMM efficiency falling for small microbatches and DP hiding behind one
    microbatch's backward, a larger m is no longer always faster.)"""
    return list(plans)


@editions.shared  # the book's two editions run each search once (pylib.i18n.editions; nothing changes elsewhere)
def rank_plans(
    cfg,
    workload: Workload,
    cluster: Cluster,
    *,
    top: int = 10,
    plans: list[Plan] | None = None,
    space: SearchSpace = SearchSpace(),
) -> list[Prediction]:
    """The `top` plans by the cost model (module docstring): the plans that fit by step time, then the others by
    peak memory. Exact top-k with little work: every plan's memory and compute first (cheap), then traffic only
    while a plan's compute + bubble + `comm_lower_bound`, a lower bound of its step time, can still beat the k-th
    best found. plans: these (default: `enumerate_plans` over `space`)."""
    if plans is None:
        plans = enumerate_plans(cfg, cluster.world_size, workload.batch, workload.seq, space)
    if not plans:
        raise ValueError(
            f"no plan runs this model on {cluster.world_size} GPUs with batch={workload.batch}, seq={workload.seq}: "
            "every candidate breaks a constraint of pylib.compose (see `problems`)"
        )
    usable = cluster.usable_memory
    screened = []
    for p in most_microbatches(plans):
        mem = peak_memory(cfg, p, workload, cluster)
        if mem > usable:
            screened.append((mem, 0.0, p))
            continue
        compute = compute_time(cfg, p, workload, cluster)
        bound = compute * (1 + (0.0 if p.zb_schedule else bubble_fraction(p)))  # a ZB bubble: >= 0, priced later
        screened.append((mem, bound + comm_lower_bound(cfg, p, workload, cluster), p))
    fitting = sorted((s for s in screened if s[0] <= usable), key=lambda s: (s[1], s[0]))
    best: list[Prediction] = []
    for _, bound, plan in fitting:
        if len(best) >= top and bound >= best[-1].step_time:
            break
        best.append(predict(cfg, plan, workload, cluster))
        best.sort(key=lambda p: (p.step_time, p.peak_memory))
        best = best[:top]
    if len(best) < top:
        rest = sorted((s for s in screened if s[0] > usable), key=lambda s: s[0])[: top - len(best)]
        best += [predict(cfg, plan, workload, cluster) for _, _, plan in rest]
    return best
