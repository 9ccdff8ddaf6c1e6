"""Published training runs, as data, and the planner's prediction of each: the calibration table.

    run = RUNS[i]; run.cfg                                           # a published run and its model (no torch)
    row = evaluate(run)                                              # predicted vs published TFLOP/s per GPU
    model, err = fit(FIT_ROWS)                                       # the free constants, grid-searched

Every row is a run whose layout and throughput a primary source prints, with the source and the table named in
`source`; a number that could not be read in a source is not here. What the sources leave open (micro-batch size,
virtual stages, the ZeRO stage of the distributed optimizer, selective recomputation) the planner chooses: the
published layout is the mesh (tp, cp, pp, dp) and the batch, and the prediction is the best plan with that mesh.

Throughput is compared in one FLOP count, `megatron_flops`: Megatron-LM's `num_floating_point_operations`
(megatron/training/training.py) as it stood when NVIDIA printed its table (f2e5db4, July 2024): model FLOPs with
the attention's full s x s, 3 x the forward, no recomputation. Since 8873b55 (March 2025; so at d98e8a6, the commit
this book cites) the function counts half of the causal core attention (the s / h term becomes s / 2h):
`megatron_flops(..., causal_half=True)`. The MLM-H100 rows were measured before that change, so the full count is
theirs. Meta's TFLOP/s are Meta's own count, whose formula the paper does not give; they are compared in the same
full count, which is an assumption (`flop_convention_gap` says how much the other count moves each row).

Sources:
  MLM-H100  NVIDIA Megatron-LM, README.md "Performance Benchmarking", images/model_table.png (commit f2e5db4 and
            later): GPT models of 2B to 462B parameters on H100 80 GB, V = 131072, s = 4096, with DP, TP
            (--tp-comm-overlap) and PP overlap; per-GPU teraFLOP/s and MFU per row.
  LLAMA3    Grattafiori et al. 2024, "The Llama 3 Herd of Models", Table 4 (scaling configurations of Llama 3
            405B on H100, BF16: GPUs, TP, CP, PP, 16M tokens per batch, TFLOP/s per GPU; the same rows shown by
            P. Balaji, SC'24, as reproduced at glennklockwood.com/garden/llama-3.1), at the 8K-token sequences of
            the initial pretraining; DP = GPUs / (TP CP PP); the model's shape from its Table 3
            (`presets.llama3_405b`). The table's third row (16,384 GPUs, CP 16, sequences of 131,072 tokens: the
            table lists that length) is not among these rows: they are the 8K-token rows of the initial
            pretraining, and this calibration's search (`LAYOUT_SEARCH`) tries ring CP only, where Meta's CP is
            the all-gather kind (section 3.3.2).
            Section 3.3.2 says Meta's schedule lets N, the microbatches per group of the interleaved schedule, be
            set freely; no value for these runs is read here, so the planner chooses N on the published mesh as it
            does on every row (`PUBLISHED_GROUP_SIZES`). Section 3.3.2 also says that with its memory work
            Meta "could pre-train Llama 3 on sequences of 8K tokens without activation checkpointing": the planner
            still recomputes on this mesh (`without_recomputation` says how far from fitting it is).
  DGXC      NVIDIA dgxc-benchmarking, llama3.1/README.md, the H100 table: Llama 3.1 405B at 8K tokens on 512
            H100s, TP 8, PP 8, CP 2, VP 8, DP 4, micro-batch 1, global batch 256 (BF16 and FP8 recipes), with
            Megatron-Bridge's split for the 405B model (account_for_embedding_in_pipeline_split and
            account_for_loss_in_pipeline_split: Meta's one layer fewer on the first and the last stage). The README
            prints no H100 throughput, so the row is in `LAYOUTS`: checked for acceptance, fit and rank, not speed.
  NEMO-FP8  NVIDIA NeMo Framework User Guide 24.12, "Performance" (docs.nvidia.com/nemo-framework/user-guide/24.12/
            nemotoolkit/performance/performance_summary.html), table "Pretraining", headed "pre-training performance
            ... at FP8 precision": per row GPUs, GBS, MBS, sequence length, TP, PP, CP, VP and tokens/s per GPU
            (and NeMo's own model TFLOP/s, whose FLOP count is not stated: the rows are compared in tokens/s, turned
            into `megatron_flops` TFLOP/s with `tokens_to_tflops`). The GPUs are DGX H100s (the table's FP8 TFLOP/s,
            711 to 780 per GPU, are 72-79% of the H100's dense BF16 peak, more than any BF16 run reaches). The page
            does not name the FP8 recipe; NeMo 24.12's default was Transformer Engine's delayed scaling, which the
            rows assume (`FP8_RECIPE`). The Llama 3 models' shapes: Llama 3 8B (h 4096, 32 layers, 32 heads with 8
            K/V, h_ffn 14336) and 70B (Llama 2 70B's shape), both with V = 128256 (the Llama 3 paper, Table 3).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from pylib.plan.config import ModelConfig
from pylib.plan.mesh import ParallelConfig
from pylib.plan.options import Fp8Recipe, RunOptions
from pylib.plan.presets import deepseek_v3, llama2_7b, llama2_70b, llama3_405b, megatron_gpt, mixtral_8x7b

from . import planner as P
from .activations import chunk_saved_bytes, split_layers
from .efficiency import CostModel
from .pp import split_live_counts


@dataclass(frozen=True)
class Run:
    """One published run: `cfg` the model (`flops_layers` the layer count the source's FLOPs count, when the
    planner's model differs), the cluster (GPUs, H100 80 GB), the global batch in sequences of `seq` tokens, the
    mesh and the published TFLOP/s per GPU; `fit` whether the constants are fitted on it."""

    name: str
    source: str
    cfg: ModelConfig
    gpus: int
    seq: int
    batch: int
    tp: int
    pp: int
    dp: int
    cp: int = 1
    tflops: float = 0.0
    tp_comm_overlap: bool = True
    fit: bool = False
    flops_layers: int | None = None
    # The pipeline split: Llama 3's (one layer fewer on the first and the last virtual stage, `Plan.balance_ends`).
    balance_ends: bool = False
    # The gradients' dtype in the DP reduction. No source states it; Megatron-LM defaults to fp32 for bf16, NVIDIA's
    # own H100 performance scripts pass --grad-reduce-in-bf16 (examples/llama/train_llama3_8b_h100_fp8.sh), and
    # these are tuned benchmark runs: bf16 (the ZeRO paper's 2 bytes per gradient).
    grad_reduce: str = "bfloat16"
    # Expert parallelism, folded onto the dense mesh (MoE rows only).
    ep: int = 1
    # The FP8 recipe of the linear layers' GEMMs (`planner.Workload.fp8`); None: a 16-bit run.
    fp8: Fp8Recipe | None = None
    # The published micro-batch size, where the source prints it (None: LAYOUT_SEARCH's 1 or 2 sequences).
    micro_batch: int | None = None

    @property
    def par(self) -> ParallelConfig:
        return ParallelConfig(tp=self.tp, cp=self.cp, dp=self.dp, pp=self.pp, ep=self.ep)

    @property
    def mfu(self) -> float:
        return self.tflops * 1e12 / P.Cluster(1).peak_flops


_MLM = "Megatron-LM README, images/model_table.png (H100, s = 4096)"
_L3 = "Llama 3 paper, Table 4 (405B on H100, BF16)"
_LLAMA3_405B = llama3_405b()

RUNS = (
    Run("GPT 1.7B", _MLM, megatron_gpt(2048, 16, 24), 48, 4096, 192, 1, 1, 48, tflops=408.8, fit=True),
    Run("GPT 7.1B", _MLM, megatron_gpt(4096, 32, 30), 96, 4096, 192, 2, 1, 48, tflops=465.9),
    Run("GPT 16B", _MLM, megatron_gpt(6144, 48, 32), 192, 4096, 192, 4, 1, 48, tflops=489.1, fit=True),
    Run("GPT 32B", _MLM, megatron_gpt(7168, 56, 48), 384, 4096, 192, 8, 1, 48, tflops=459.6),
    Run("GPT 70B", _MLM, megatron_gpt(8192, 64, 84), 768, 4096, 384, 8, 2, 48, tflops=419.7, fit=True),
    Run("GPT 119B", _MLM, megatron_gpt(10240, 80, 92), 1536, 4096, 768, 8, 4, 48, tflops=420.5),
    Run("GPT 177B", _MLM, megatron_gpt(12288, 96, 96), 2304, 4096, 1152, 8, 6, 48, tflops=432.8, fit=True),
    Run("GPT 314B", _MLM, megatron_gpt(16384, 128, 96), 3072, 4096, 1536, 8, 8, 48, tflops=474.4),
    Run("GPT 462B", _MLM, megatron_gpt(18432, 144, 112), 6144, 4096, 3072, 8, 16, 48, tflops=459.9),
    Run("Llama 3 405B", _L3, _LLAMA3_405B, 8192, 8192, 2048, 8, 16, 64, tflops=430, balance_ends=True),
    Run("Llama 3 405B", _L3, _LLAMA3_405B, 16384, 8192, 2048, 8, 16, 128, tflops=400, balance_ends=True),
)
FIT_ROWS = tuple(i for i, r in enumerate(RUNS) if r.fit)

# The rows the constants are not fitted on. What they test is narrower than "a holdout" suggests: five come from the
# fit rows' own sweep (one recipe, s = 4096, DP 48 by design; three sit between fit rows, two beyond the largest), and
# the two Llama 3 rows are predicted with a recomputation Meta says it did not run (`without_recomputation`).
HOLDOUT_ROWS = tuple(i for i, r in enumerate(RUNS) if not r.fit)

_DGXC = "NVIDIA dgxc-benchmarking, llama3.1/README.md (H100, 8K tokens)"
# Published layouts without a throughput this table can read (`tflops` 0): the planner must accept each, predict that
# it fits and rank it among its best plans, as for RUNS; there is no speed to compare.
LAYOUTS = (Run("Llama 3.1 405B", _DGXC, _LLAMA3_405B, 512, 8192, 256, 8, 8, 4, cp=2, balance_ends=True),)

# What a published layout leaves to the planner: micro-batches of 1 or 2 sequences, up to 8 virtual stages, DDP
# or the distributed optimizer (ZeRO-1), no, selective or full recomputation of the first 1, 2 or 4 layers of each
# chunk, where selective is the attention core (Megatron's default) or Megatron's modules "layernorm", "mlp" or
# "layernorm" with "moe_act" in every layer (a set that changes nothing for the model is the plan without it:
# `planner._recompute_choice`; in Megatron's layer a dense layer's norms are fused into the next GEMM); SP
# wherever there is TP (Megatron requires it for --tp-comm-overlap), as Megatron runs it (the saved inputs of the
# column-parallel linears kept as sequence shards and all-gathered again in backward: `planner.Plan.sp_regather`);
# ring CP.
LAYOUT_SEARCH = P.SearchSpace(
    sp_regather=True,
    micro_batch_sizes=(1, 2),
    virtual_stages=(1, 2, 3, 4, 5, 6, 7, 8),
    zero_stages=(0, 1),
    sequence_parallel=(True,),
    cp_kinds=("ring",),
    recompute=("none", "selective")
    + tuple(("selective", mods) for mods in (("layernorm",), ("mlp",), ("layernorm", "moe_act")))
    + tuple(("full", "block", k) for k in (1, 2, 4)),
)


# The interleaved group sizes N tried on the published mesh: every N Megatron accepts (`planner.group_sizes_for`;
# p <= N <= m). The bubble is the same for each, the warm-up grows with N, so the planner keeps N = p on every row;
# the mesh search keeps Megatron's default N = p (a larger N only repeats a plan with more memory).
PUBLISHED_GROUP_SIZES = "megatron"


# The meshes the search compares a published one with: TP inside a node (1 to 8), CP of 1 or 2 at these lengths,
# every PP and DP (`SearchSpace` fields, over LAYOUT_SEARCH's).
MESH_SEARCH = dict(tp_sizes=(1, 2, 4, 8), cp_sizes=(1, 2))


def megatron_flops(
    cfg: ModelConfig, batch: int, seq: int, n_layers: int | None = None, *, causal_half: bool = False
) -> float:
    """Model FLOPs of one step as Megatron-LM counted them before 8873b55 (`num_floating_point_operations`,
    megatron/training/training.py, e.g. at f2e5db4): 12 B s L h^2 [(1 + g/a + s/h) q/h + (h_ffn/h) k (3/2 if
    SwiGLU) + V / (2 L h)], q = a d the query width, g the K/V heads, k the experts a token is routed to.
    causal_half: the count since 8873b55 (March 2025, and at d98e8a6), s/(2h) for s/h: half the causal core
    attention. A MoE model's shared experts count as k more experts would (f_s / h, as the function does with
    moe_shared_expert_intermediate_size); every layer is counted as the model's kind (`cfg.moe`: all MoE)."""
    L = cfg.n_layers if n_layers is None else n_layers
    h, a, g = cfg.d_model, cfg.n_heads, cfg.kv_heads
    q = a * cfg.d_head
    k = 1 if cfg.moe is None else cfg.moe.top_k
    gated = 1.5 if cfg.mlp == "swiglu" else 1.0
    f = cfg.d_ff if cfg.moe is None else (cfg.moe.d_ff or cfg.d_ff)
    f_shared = 0 if cfg.moe is None else cfg.moe.n_shared_experts * f  # Megatron's shared_expert_ffn_hidden_size
    core = seq / h / (2 if causal_half else 1)
    per = (1 + g / a + core) * q / h + (f * k + f_shared) / h * gated + cfg.vocab_size / (2 * L * h)
    return 12.0 * batch * seq * L * h * h * per


def flop_convention_gap(run: Run) -> float:
    """How much lower a run's TFLOP/s per GPU reads when its FLOPs are counted as Megatron-LM counts them since
    8873b55 (half the causal core attention) instead of the full count of `megatron_flops`: 1 - half / full. The
    same factor scales the published and the predicted number alike when both use one count; it is the error a
    row carries when the source used the other count (Meta's count is not stated)."""
    full = megatron_flops(run.cfg, run.batch, run.seq, run.flops_layers)
    return 1 - megatron_flops(run.cfg, run.batch, run.seq, run.flops_layers, causal_half=True) / full


@dataclass(frozen=True)
class Evaluated:
    """A run and the planner's view of it: the best plan on the published mesh, its TFLOP/s per GPU (the source's
    FLOPs / predicted step time), whether it fits, and the best plan of the whole (restricted) search."""

    run: Run
    plan: P.Prediction
    predicted_tflops: float
    best: P.Prediction | None = None
    rank: int | None = None  # 1-based place of the published mesh's best plan among the search's plans

    @property
    def error(self) -> float:
        if not self.run.tflops:
            raise ValueError(f"{self.run.name} ({self.run.gpus} GPUs) has no published throughput to compare with")
        return self.predicted_tflops / self.run.tflops - 1

    @property
    def slower_than_best(self) -> float:
        return 0.0 if self.best is None else self.plan.step_time / self.best.step_time - 1


def cluster(run: Run, model: CostModel | None = None) -> P.Cluster:
    return P.Cluster(run.gpus, tp_comm_overlap=run.tp_comm_overlap, model=model or CostModel())


def workload(run: Run) -> P.Workload:
    """The run's step: mixed precision with gradients reduced in `run.grad_reduce`, its GEMMs in `run.fp8`."""
    return P.Workload(run.batch, run.seq, grad_reduce=run.grad_reduce, fp8=run.fp8)


def published_plans(run: Run, **knobs) -> list[P.Plan]:
    """Every plan of the published mesh with LAYOUT_SEARCH's knobs (`knobs` replacing some of them; the published
    micro-batch size, `run.micro_batch`, in place of LAYOUT_SEARCH's; FP8 rows with Megatron's default group size
    N = p, which NeMo's recipes keep, where the BF16 rows try every N: `PUBLISHED_GROUP_SIZES`)."""
    if run.micro_batch is not None:
        knobs = dict(micro_batch_sizes=(run.micro_batch,)) | knobs
    if run.fp8 is not None:
        knobs = dict(group_sizes="default") | knobs
    return list(_published_plan_tuple(run, tuple(sorted(knobs.items()))))


@functools.lru_cache(maxsize=256)
def _published_plan_tuple(run: Run, knobs: tuple) -> tuple[P.Plan, ...]:
    """`published_plans`, remembered (a fit asks for the same run's plans once per set of constants)."""
    fields = dict(meshes=(run.par,), group_sizes=PUBLISHED_GROUP_SIZES, balance_ends=run.balance_ends)
    space = replace(LAYOUT_SEARCH, **(fields | dict(knobs)))
    plans = P.enumerate_plans(run.cfg, run.gpus, run.batch, run.seq, space)
    if not plans:
        raise ValueError(f"{run.name}: the planner accepts no plan with the published mesh {run.par.describe()}")
    return tuple(plans)


def _tflops(run: Run, step_time: float) -> float:
    """TFLOP/s per GPU as the sources count them (`megatron_flops`) for a step of `step_time` seconds."""
    return megatron_flops(run.cfg, run.batch, run.seq, run.flops_layers) / (run.gpus * step_time) / 1e12


def evaluate(run: Run, model: CostModel | None = None, *, search: bool = False, top: int = 10) -> Evaluated:
    """The planner on one run: the best plan with the published mesh (LAYOUT_SEARCH for the rest); with `search`
    also the best `top` plans of every mesh (same knobs) and the published mesh's place among them."""
    work, c = workload(run), cluster(run, model)
    mine = P.rank_plans(run.cfg, work, c, top=1, plans=published_plans(run))[0]
    tflops = _tflops(run, mine.step_time)
    if not search:
        return Evaluated(run, mine, tflops)
    space = replace(LAYOUT_SEARCH, balance_ends=run.balance_ends, **MESH_SEARCH)
    ranked = P.rank_plans(run.cfg, work, c, top=top, space=space)
    faster = [x for x in ranked if x.step_time < mine.step_time and x.plan.par != run.par]
    return Evaluated(run, mine, tflops, ranked[0], len(faster) + 1)


@dataclass(frozen=True)
class WithoutRecomputation:
    """The published mesh's fastest plan with no recomputation, whether it fits or not (`without_recomputation`):
    the TFLOP/s it would reach, its most loaded rank's memory, and `activation_share`, the largest fraction of
    the activations this model counts that could be kept with the rest of that rank's bytes in the whole card."""

    run: Run
    plan: P.Prediction
    tflops: float
    gpu_memory: float

    @property
    def memory(self) -> dict:
        return self.plan.worst_rank().memory

    @property
    def activation_share(self) -> float:
        m = self.memory
        return (self.gpu_memory - (m["total"] - m["activations"])) / m["activations"]


def without_recomputation(run: Run, model: CostModel | None = None) -> WithoutRecomputation:
    """The published mesh with LAYOUT_SEARCH's knobs but recompute="none", ranked by step time alone (the memory
    limit ignored): what the planner says of a run whose source states it recomputed nothing."""
    work, c = workload(run), cluster(run, model)
    predicted = (P.predict(run.cfg, p, work, c) for p in published_plans(run, recompute=("none",)))
    fastest = min(predicted, key=lambda x: (x.step_time, x.peak_memory))
    return WithoutRecomputation(run, fastest, _tflops(run, fastest.step_time), c.gpu_memory)


# ------------------------------------------------------------------------------------------------ SP's cost, measured

# A100 SXM 80 GB, as in Korthikanti et al.'s Selene nodes: 312 TFLOP/s dense bf16, 2.039 TB/s HBM2e, NVLink 3
# (600 GB/s both directions), one 200 Gb/s HDR NIC per GPU.
A100 = dict(peak_flops=312e12, hbm_bandwidth=2.039e12, intra_node_bandwidth=300e9, inter_node_bandwidth=25e9)


@dataclass(frozen=True)
class LayerTimes:
    """One transformer layer's measured forward and backward milliseconds without and with SP (`forward_ms`,
    `backward_ms`: (off, on)), nothing recomputed, and the run that measured them: `cfg` on `tp` GPUs of one node
    (`A100`), micro-batches of `micro_batch` sequences of `seq` tokens, PP 1, DP 1."""

    name: str
    source: str
    cfg: ModelConfig
    tp: int
    micro_batch: int
    seq: int
    forward_ms: tuple[float, float]
    backward_ms: tuple[float, float]

    @property
    def measured_delta(self) -> float:
        """The layer's forward + backward without SP over with it, minus 1."""
        return (self.forward_ms[0] + self.backward_ms[0]) / (self.forward_ms[1] + self.backward_ms[1]) - 1


# Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Table 4 (the rows
# "Baseline no recompute" and "Sequence Parallelism") for Table 3's 22B model (a = 64, h = 6144, 48 layers, TP 8,
# micro-batch 4) at s = 2048, V = 51200 (section 6). The paper prints layer times with and without SP for this model
# only; its Figure 8 shows the larger ones as bars.
KORTHIKANTI_SP = LayerTimes(
    "22B",
    "Korthikanti et al. 2022, Table 4 (22B, A100 80 GB)",
    replace(megatron_gpt(6144, 64, 48), vocab_size=51200),
    tp=8,
    micro_batch=4,
    seq=2048,
    forward_ms=(7.7, 7.2),
    backward_ms=(11.9, 11.8),
)


@dataclass(frozen=True)
class SPCheck:
    """The planner on a `LayerTimes` run: predicted milliseconds per layer of one step (forward + backward +
    exposed communication, over the layers) without and with SP, beside the measured ones."""

    times: LayerTimes
    off: P.Prediction
    on: P.Prediction

    def per_layer_ms(self, x: P.Prediction) -> float:
        return 1e3 * x.step_time / self.times.cfg.n_layers

    @property
    def predicted_delta(self) -> float:
        """The predicted step without SP over with it, minus 1."""
        return self.off.step_time / self.on.step_time - 1


def sp_check(times: LayerTimes = KORTHIKANTI_SP, model: CostModel | None = None) -> SPCheck:
    """The planner's step for `times`' run with and without SP (Megatron's SP: `Plan.sp_regather`, as the paper
    runs it, which saves the sequence shard and all-gathers it again in backward) on `A100` nodes."""
    c = P.Cluster(times.tp, model=model or CostModel(), **A100)
    work = P.Workload(times.micro_batch, times.seq)
    par = ParallelConfig(tp=times.tp)
    on, off = (
        P.predict(times.cfg, P.Plan(par, RunOptions(sequence_parallel=sp), sp_regather=sp), work, c)
        for sp in (True, False)
    )
    return SPCheck(times, off, on)


def errors(model: CostModel, rows) -> list[float]:
    """Relative errors predicted / published - 1 of `rows` (indices into RUNS) under `model`."""
    return [evaluate(RUNS[i], model).error for i in rows]


# ------------------------------------------------------------------------------------------------ FP8 runs


def tokens_to_tflops(cfg: ModelConfig, seq: int, tokens_per_gpu: float) -> float:
    """TFLOP/s per GPU, in `megatron_flops`' count, of a run that processes `tokens_per_gpu` tokens per second per
    GPU on sequences of `seq` tokens."""
    return tokens_per_gpu * megatron_flops(cfg, 1, seq) / seq / 1e12


_NEMO = "NeMo 24.12 performance summary, table Pretraining (FP8, H100)"
FP8_RECIPE = Fp8Recipe("delayed")
_LLAMA2_13B = llama2_7b().with_(d_model=5120, n_layers=40, n_heads=40, d_ff=13824)
_LLAMA3_8B = llama2_7b().with_(vocab_size=128256, n_kv_heads=8, d_ff=14336)
_LLAMA3_70B = llama2_70b().with_(vocab_size=128256)


def _fp8_run(name, cfg, gpus, batch, seq, mesh, tokens, fit=False):
    tp, pp, cp = mesh
    dp = gpus // (tp * pp * cp)
    tflops = tokens_to_tflops(cfg, seq, tokens)
    return Run(name, _NEMO, cfg, gpus, seq, batch, tp, pp, dp, cp, tflops, fit=fit, fp8=FP8_RECIPE, micro_batch=1)


# The published GPUs, GBS, sequence length, (TP, PP, CP) and tokens/s per GPU (the table's columns; MBS is 1 in
# every row). The table's VP (1, 10, 20, 1, 5) is left to the search (1 to 8 chunks), as on the BF16 rows.
FP8_RUNS = (
    _fp8_run("Llama 2 7B", llama2_7b(), 8, 128, 4096, (1, 1, 1), 16934, fit=True),
    _fp8_run("Llama 2 13B", _LLAMA2_13B, 16, 128, 4096, (1, 4, 1), 8715),
    _fp8_run("Llama 2 70B", llama2_70b(), 64, 128, 4096, (4, 4, 1), 1728, fit=True),
    _fp8_run("Llama 3 8B", _LLAMA3_8B, 8, 128, 8192, (1, 1, 2), 12273),
    _fp8_run("Llama 3 70B", _LLAMA3_70B, 64, 128, 8192, (4, 4, 2), 1524),
)
FP8_FIT_ROWS = tuple(i for i, r in enumerate(FP8_RUNS) if r.fit)
FP8_HOLDOUT_ROWS = tuple(i for i, r in enumerate(FP8_RUNS) if not r.fit)
# The one new constant's grid: the fraction of the FP8 peak an FP8 GEMM reaches (the BF16 constants stay as fitted).
FP8_GRID = tuple(x / 100 for x in range(40, 91, 5))


def fp8_errors(model: CostModel, rows) -> list[float]:
    """Relative errors predicted / published - 1 of FP8 `rows` (indices into FP8_RUNS) under `model`."""
    return [evaluate(FP8_RUNS[i], model).error for i in rows]


def fit_fp8(rows=FP8_FIT_ROWS, grid: tuple = FP8_GRID, base: CostModel | None = None) -> tuple[CostModel, float]:
    """`CostModel.eta_fp8` minimising the largest |error| over FP8 `rows`, every other constant as `base`
    (default: `CostModel()`, the BF16 fit)."""
    base = base or CostModel()
    best = None
    for eta in grid:
        model = replace(base, eta_fp8=eta)
        worst = max(abs(x) for x in fp8_errors(model, rows))
        if best is None or worst < best[1]:
            best = (model, worst)
    return best


# The grid `fit` searches; its answer on FIT_ROWS is `efficiency.CostModel()`'s defaults.
GRID = dict(eta=(0.6, 0.65, 0.7, 0.75, 0.8), c_elem=(100, 140, 180, 220, 260), tp_overlap=(0.5, 0.8))


def fit(rows, grid: dict | None = None) -> tuple[CostModel, float]:
    """The constants minimising the largest |error| over `rows` on a grid (each constant's values in `grid`)."""
    grid = grid or GRID
    best = None
    for eta in grid["eta"]:
        for c_elem in grid["c_elem"]:
            for tp_overlap in grid["tp_overlap"]:
                model = CostModel(eta=eta, c_elem=c_elem, tp_overlap=tp_overlap)
                worst = max(abs(x) for x in errors(model, rows))
                if best is None or worst < best[1]:
                    best = (model, worst)
    return best


# ------------------------------------------------------------------------------------------------ MoE runs

# Megatron-LM, megatron/core/transformer/moe/README.md from c230e0d (the MoE documentation update) to 0888a06
# (e.g. at 4015ff1): the opening paragraph, "Mixtral 8X7B bf16 training ... 468 TFLOPS as of MCore v0.9", and the
# table "Reference Best Parallel Mapping" (MCore v0.8): Mixtral 8x7B (dropless), V = 32K, the all-to-all dispatcher,
# BF16, 64 GPUs, s = 4096, TP 1, EP 8, PP 4, VP 8, MBS 1, GBS 256, on 8 x H100 80 GB HBM3 per server, NVLink 4,
# InfiniBand 8 x 400 Gbit/s. The README prints the throughput and the mapping in two places; that the 468 TFLOP/s
# were measured on this mapping is this row's reading of it. TFLOP/s in the full s x s count of `megatron_flops`
# (MCore v0.9, October 2024, is before 8873b55). Not fitted: the constants are the dense fit's (`CostModel()`).
_MOE_README = "Megatron-LM MoE README (468 TFLOPS, Mixtral 8x7B bf16, MCore v0.9; its best parallel mapping)"
MOE_RUNS = (
    Run("Mixtral 8x7B", _MOE_README, mixtral_8x7b(), 64, 4096, 256, 1, 4, 16, ep=8, tflops=468, tp_comm_overlap=False),
)


# H800 SXM 80 GB (DeepSeek-V3's cluster, technical report section 3.1): the H100's 989 TFLOP/s dense bf16 and
# 3.35 TB/s HBM3; NVLink at 160 GB/s and InfiniBand at 50 GB/s per GPU, the report's own figures (section 3.2.2).
H800 = dict(
    gpu_memory=80e9, peak_flops=989e12, hbm_bandwidth=3.35e12, intra_node_bandwidth=160e9, inter_node_bandwidth=50e9
)


@dataclass(frozen=True)
class PublishedMoELayout:
    """DeepSeek-V3's pre-training as its technical report (DeepSeek-AI 2024, arXiv 2412.19437) prints it: 2048
    H800 GPUs (section 3.1), PP 16, EP 64 over 8 nodes, ZeRO-1 DP, no TP (3.2), DualPipe with each device's EP
    all-to-alls under another microbatch's compute (3.2.1), selective recomputation of RMSNorm and the MLA
    up-projections (3.2.3), sequences of 4096 tokens and a batch of 15360 after its ramp (4.2), 14.8T tokens in
    2664K H800 GPU hours of pre-training, 180K per trillion tokens (Table 1 and section 1). The model:
    `pylib.plan.presets.deepseek_v3` (its stated approximations). `modules` the recomputation the report names,
    in Megatron's spelling; `fp8` whether its GEMMs ran in FP8 (3.3: they did, `DEEPSEEK_V3_FP8`)."""

    name: str
    source: str
    gpus: int
    seq: int
    batch: int
    pp: int
    ep: int
    dp: int
    gpu_hours_per_trillion: float
    modules: tuple[str, ...]
    fp8: bool = True

    @property
    def par(self) -> ParallelConfig:
        return ParallelConfig(tp=1, ep=self.ep, dp=self.dp, pp=self.pp)


DEEPSEEK_V3 = PublishedMoELayout(
    "DeepSeek-V3",
    "DeepSeek-V3 Technical Report, sections 3.1-3.3, 4.2 and Table 1",
    gpus=2048,
    seq=4096,
    batch=15360,
    pp=16,
    ep=64,
    dp=128,
    gpu_hours_per_trillion=180e3,
    modules=("layernorm", "mla_up_proj"),
)

# DeepSeek-V3's FP8 recipe (technical report, section 3.3): 1 x 128 tiles for activations and gradients, 128 x 128
# blocks for weights, E4M3 everywhere, fp32 scales; the router, the norms, the attention core and the head in 16 bits
# or more (3.3.1), as the planner keeps them.
DEEPSEEK_V3_FP8 = Fp8Recipe("blockwise")
# Its own storage beyond what a linear keeps (3.3.3): the SwiGLU's inputs cached in FP8 and its output recomputed,
# W_O's input in E5M6; and the combine's un-permute fused, the expert outputs kept once (`Workload.storage`).
DEEPSEEK_V3_STORAGE = ("swiglu_fp8", "attn_out_e5m6", "fused_unpermute")
# Those, and one of ours the report does not describe: the combine weights applied inside the experts, their gradient
# read off the down projection's input gradient, so no expert output is kept ("gate_in_expert").
GATE_IN_EXPERT_STORAGE = (*DEEPSEEK_V3_STORAGE, "gate_in_expert")

# MLA's published shapes (DeepSeek-V3 technical report, section 4.2): 128 heads, q compressed to 1536, K/V to 512,
# per head 128 dimensions without RoPE and 64 with it for q and k, 128 for v.
MLA_V3 = dict(heads=128, q_rank=1536, kv_rank=512, qk_nope=128, qk_rope=64, v_head=128)


def mla_flops_per_token(cfg: ModelConfig, seq: int, mla: dict | None = None) -> dict:
    """Forward multiply-adds per token of one attention layer, MLA's (DeepSeek-V3's shapes, `MLA_V3`) beside the
    multi-head attention that stands in for it in `cfg`: "projections" (MLA: q down and up, K/V down with the RoPE
    key, K/V up, the output; the stand-in: Q, K, V and O) and "core" (q.k and p.v over the causal half of s x s
    scores, per token: MLA's q.k over 192 dimensions and p.v over 128, the stand-in's over d_head each)."""
    m = MLA_V3 if mla is None else mla
    h, n = cfg.d_model, m["heads"]
    qk = m["qk_nope"] + m["qk_rope"]
    proj = (
        h * m["q_rank"]
        + m["q_rank"] * n * qk
        + h * (m["kv_rank"] + m["qk_rope"])
        + m["kv_rank"] * n * (m["qk_nope"] + m["v_head"])
        + n * m["v_head"] * h
    )
    half = (seq + 1) / 2  # scores per query, causal
    stand_proj = h * (2 * cfg.n_heads + 2 * cfg.kv_heads) * cfg.d_head
    return dict(
        mla=dict(projections=proj, core=half * n * (qk + m["v_head"])),
        stand_in=dict(projections=stand_proj, core=half * cfg.n_heads * 2 * cfg.d_head),
    )


@dataclass(frozen=True)
class MoELayoutCheck:
    """The planner on a `PublishedMoELayout`: `report`, the published mesh with the recomputation the report names
    (and DualPipe's EP overlap, `Plan.ep_overlap`); `fitting`, the published mesh's fastest plan that fits
    (the planner may recompute more); both on `cluster` (`H800`) for `workload`, a 16-bit run; `fp8_report`, the
    report's plan for `fp8_workload`, the same step with the layout's FP8 recipe (`DEEPSEEK_V3_FP8`: its GEMMs at
    the FP8 peak, its linears' saved inputs and its weight copies in FP8); `v3_report`, the report's plan for
    `v3_workload`, FP8 with DeepSeek-V3's own activation storage (`DEEPSEEK_V3_STORAGE`); `gate_report`, the same
    plan for `gate_workload`, that storage and the combine weights applied in the experts (`GATE_IN_EXPERT_STORAGE`);
    `predict` prices another
    plan of the same job, `dualpipe_memory` a priced plan's rank as DualPipe would hold it."""

    layout: PublishedMoELayout
    report: P.Prediction
    fitting: P.Prediction | None
    cfg: ModelConfig
    workload: P.Workload
    cluster: P.Cluster
    fp8_report: P.Prediction | None = None
    fp8_workload: P.Workload | None = None
    v3_report: P.Prediction | None = None
    v3_workload: P.Workload | None = None
    gate_report: P.Prediction | None = None
    gate_workload: P.Workload | None = None

    def predict(self, plan: P.Plan, fp8: bool = False) -> P.Prediction:
        """`plan` priced for `workload`, or with fp8 for `fp8_workload`."""
        return P.predict(self.cfg, plan, self.fp8_workload if fp8 else self.workload, self.cluster)

    def gpu_hours_per_trillion(self, x: P.Prediction) -> float:
        """H800 hours per 10^12 tokens at the predicted step time: N t_step / 3600 / (B s) x 10^12."""
        lay = self.layout
        return lay.gpus * x.step_time / 3600 / (lay.batch * lay.seq) * 1e12

    def gap(self, x: P.Prediction) -> float:
        """Predicted hours per trillion tokens over the report's, minus 1."""
        return self.gpu_hours_per_trillion(x) / self.layout.gpu_hours_per_trillion - 1

    def dualpipe_memory(self, x: P.Prediction, workload: P.Workload, pp_rank: int) -> dict[str, int]:
        """What rank `pp_rank` of x (priced for `workload` on the planner's 1F1B) would hold under DualPipe
        (technical report 3.2.1; `pylib.plan.schedules._dualpipe`): "activations" its order replayed
        (`dualpipe_activations`), and "total" with DualPipe's two copies of the parameters (their gradients and
        FP8 copies too, summed over the rank pair after the step) and one optimizer state."""
        mem = next(r.memory for r in x.ranks if r.pp_rank == pp_rank)
        acts = dualpipe_activations(self.cfg, x.plan, workload, pp_rank)
        copies = 2 * (mem["params"] + mem["grads"] + mem.get("fp8", 0))
        return dict(activations=acts, total=acts + copies + mem["optim"] + mem["gathered"])


def dualpipe_activations(cfg: ModelConfig, plan: P.Plan, workload: P.Workload, pp_rank: int) -> int:
    """The activation bytes rank `pp_rank` of `plan` (v = 1) holds at its peak under DualPipe: its model stages r and
    p - 1 - r (the plan's split: `activations.split_layers`), each microbatch holding its stage's saved bytes
    (`activations.chunk_saved_bytes`) from its F to its W and, from its B to a deferred W, the output gradients W
    needs and what B regenerated, as the planner prices the zero-bubble schedules (`planner._split_activations`),
    on DualPipe's order (`pp.split_live_counts("dualpipe", ...)`: p + 1 stage microbatches on every rank)."""
    p, b, seq = plan.par.pp, plan.micro_batch(workload.batch), workload.seq
    kw = dict(attention=workload.attention, fp8=workload.fp8, storage=workload.storage)
    whole = plan.with_options(recompute="none")
    saved, kept = [], []
    for stage in (pp_rank, p - 1 - pp_rank):
        held = chunk_saved_bytes(cfg, b, seq, plan, stage, **kw)[0]
        regenerated = chunk_saved_bytes(cfg, b, seq, whole, stage, **kw)[0] - held
        layers = split_layers(cfg.n_layers, p, 1, stage, plan.balance_ends)[0]
        saved.append(held)
        kept.append(regenerated + P.wgrad_kept_bytes(cfg, plan, b * seq // plan.par.cp, layers, stage == p - 1))
    states = split_live_counts("dualpipe", p, plan.options.n_microbatches, pp_rank)
    return max(sum(n * x for n, x in zip(a + g, saved + kept, strict=True)) for a, g in states)


# What the planner may add to the report's recomputation to fit: the experts' activation (the report caches the
# SwiGLU's inputs and recomputes its output, section 3.3.2) or the whole MoE layer.
MOE_LAYOUT_EXTRA = ((), ("moe_act",), ("moe",))


def _layout_plans(lay: PublishedMoELayout, cfg: ModelConfig) -> list[P.Plan]:
    """The published mesh, micro-batches of one sequence, 1F1B with Llama 3's split of L + 2 slots (62 layers +
    embedding + head: 4 slots a stage), ZeRO-1, EP overlapped, each recomputation of MOE_LAYOUT_EXTRA."""
    space = P.SearchSpace(
        meshes=(lay.par,),
        micro_batch_sizes=(1,),
        virtual_stages=(1,),
        zero_stages=(1,),
        sequence_parallel=(False,),
        balance_ends=True,
        recompute=tuple(("selective", lay.modules + extra) for extra in MOE_LAYOUT_EXTRA),
    )
    plans = P.enumerate_plans(cfg, lay.gpus, lay.batch, lay.seq, space)
    if not plans:
        raise ValueError(f"{lay.name}: the planner accepts no plan with the published mesh {lay.par.describe()}")
    return [replace(p, ep_overlap=True) for p in plans]


def moe_layout_check(lay: PublishedMoELayout = DEEPSEEK_V3, model: CostModel | None = None) -> MoELayoutCheck:
    """The planner on DeepSeek-V3's published layout (`MoELayoutCheck`), fp32 gradients (the report keeps
    them in FP32, section 3.3); with `lay.fp8`, the report's plan again in FP8 (`DEEPSEEK_V3_FP8`)."""
    cfg = deepseek_v3()
    c = P.Cluster(lay.gpus, model=model or CostModel(), **H800)
    work = P.Workload(lay.batch, lay.seq, grad_reduce="float32")
    predicted = [P.predict(cfg, p, work, c) for p in _layout_plans(lay, cfg)]
    report = next(x for x in predicted if x.plan.modules == frozenset(lay.modules))
    fits = sorted((x for x in predicted if x.fits), key=lambda x: x.step_time)
    check = MoELayoutCheck(lay, report, fits[0] if fits else None, cfg, work, c)
    if not lay.fp8:
        return check
    fp8_work = replace(work, fp8=DEEPSEEK_V3_FP8)
    v3_work = replace(fp8_work, storage=DEEPSEEK_V3_STORAGE)
    gate_work = replace(fp8_work, storage=GATE_IN_EXPERT_STORAGE)
    return replace(
        check,
        fp8_workload=fp8_work,
        fp8_report=P.predict(cfg, report.plan, fp8_work, c),
        v3_workload=v3_work,
        v3_report=P.predict(cfg, report.plan, v3_work, c),
        gate_workload=gate_work,
        gate_report=P.predict(cfg, report.plan, gate_work, c),
    )


__all__ = [
    "A100",
    "DEEPSEEK_V3",
    "DEEPSEEK_V3_FP8",
    "DEEPSEEK_V3_STORAGE",
    "GATE_IN_EXPERT_STORAGE",
    "dualpipe_activations",
    "FIT_ROWS",
    "H800",
    "MLA_V3",
    "MOE_LAYOUT_EXTRA",
    "MOE_RUNS",
    "MoELayoutCheck",
    "PublishedMoELayout",
    "mla_flops_per_token",
    "moe_layout_check",
    "FP8_FIT_ROWS",
    "FP8_GRID",
    "FP8_HOLDOUT_ROWS",
    "FP8_RECIPE",
    "FP8_RUNS",
    "KORTHIKANTI_SP",
    "GRID",
    "HOLDOUT_ROWS",
    "LAYOUTS",
    "LAYOUT_SEARCH",
    "MESH_SEARCH",
    "PUBLISHED_GROUP_SIZES",
    "published_plans",
    "RUNS",
    "Evaluated",
    "LayerTimes",
    "Run",
    "SPCheck",
    "WithoutRecomputation",
    "evaluate",
    "fit",
    "fit_fp8",
    "fp8_errors",
    "tokens_to_tflops",
    "flop_convention_gap",
    "workload",
    "megatron_flops",
    "sp_check",
    "without_recomputation",
]
