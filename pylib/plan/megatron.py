"""A plan as Megatron-LM's command line: `megatron_args(par, options, global_batch=B)` and back.

    megatron_args(ParallelConfig(tp=4, dp=4, pp=4), RunOptions(schedule="interleaved", v=2,
                  n_microbatches=128, zero_stage=1), global_batch=512)
    -> ['--tensor-model-parallel-size', '4', '--pipeline-model-parallel-size', '4',
        '--num-virtual-stages-per-pipeline-rank', '2', '--context-parallel-size', '1', '--sequence-parallel',
        '--use-distributed-optimizer', '--micro-batch-size', '1', '--global-batch-size', '512']

    from_megatron_args(argv, world_size) -> (ParallelConfig, RunOptions, global_batch)

Every field of `ParallelConfig` and `RunOptions` has a row in `MAPPING`: the Megatron-LM flags that set it, or none
(what Megatron offers instead is said below). The flags' spelling and meaning were read in NVIDIA/Megatron-LM,
`megatron/training/arguments.py` at commit 67f3515c8a0539d38c23f59dd8b85efdcbb3af3d (January 2026, where each is
an explicit `add_argument`), and checked at d98e8a64ddf34856e74b24714e3bedb2f5a39553 (August 2026), where most are
generated from the config dataclasses' fields (`megatron/core/model_parallel_config.py`,
`megatron/core/transformer/transformer_config.py`, `megatron/training/config/`) by `ArgumentGroupFactory`
(`megatron/training/argument_utils.py`: `--` + the field name with `_` -> `-`), with the same spelling. What the
flags mean there:

- The data-parallel size has no flag: Megatron derives dp = world / (tp cp pp) from the launcher's world size, as
  `ParallelConfig` does; `--global-batch-size` = `--micro-batch-size` x dp x m sets the microbatch count m.
- Rank order: Megatron's default is "tp-cp-ep-dp-pp"; `--use-tp-pp-dp-mapping` gives "tp-cp-ep-pp-dp"
  (`megatron/training/initialize.py`). No other order has a flag.
- `--sequence-parallel` is dropped by Megatron when tp = 1 (arguments.py: "Disabling sequence parallelism because
  tensor model parallelism is disabled"). Megatron's SP saves the sequence shard and all-gathers it again in
  backward (the planner's `sp_regather`); pylib's SP keeps the gathered input.
- CP: `--cp-comm-type p2p` is the ring (K/V passed rank to rank), `a2a` is Ulysses, `all_gather` is all-gather CP
  (Megatron passes the value to TransformerEngine, whose `AttnFuncWithCPAndKVAllGather` runs for "all_gather";
  the flag's help text spells it "allgather", which TransformerEngine does not accept); `a2a+p2p` with
  `--hierarchical-context-parallel-sizes` is not pylib's. Megatron always cuts a
  sequence into 2 cp chunks, zig-zag (`get_batch_on_this_cp_rank`, `megatron/core/utils.py`): pylib's
  `cp_layout="contiguous"` has no flag.
- Experts: `--expert-tensor-parallel-size` left unset means etp = tp in Megatron (etp = 1 in `ParallelConfig`), so
  for a model with experts both expert flags are always written.
- Pipeline: interleaving is `--num-virtual-stages-per-pipeline-rank v` (or `--num-layers-per-virtual-pipeline-stage
  L/(p v)`); `virtual_pipeline_model_parallel_size` is derived and has no flag. Megatron has no GPipe schedule
  (all forwards, then all backwards): `schedule="gpipe"` has no flag.
- ZeRO: `--use-distributed-optimizer` shards the optimizer state and the fp32 master weights over the dp x cp
  group (ZeRO-1; `docs/user-guide/features/dist_optimizer.md`). The distributed optimizer has no ZeRO-2 or -3. What
  Megatron offers instead is another implementation, Megatron-FSDP: `--use-megatron-fsdp
  --data-parallel-sharding-strategy optim_grads` (gradients sharded too) or `optim_grads_params` (parameters too),
  with `--ckpt-format fsdp_dtensor`; written here for zero_stage 2 and 3. (PyTorch's FSDP2, `--use-torch-fsdp2`,
  refuses PP and EP.)
- Recomputation: `--recompute-granularity selective` reruns the attention core (Megatron's default
  `--recompute-modules core_attn`, pylib's "selective"); `full` with `--recompute-method uniform|block` and
  `--recompute-num-layers k`, as `pylib.plan.recompute` reads them.

Pure string work: no torch, nothing outside `pylib.plan`.
"""

from __future__ import annotations

from .mesh import ParallelConfig
from .options import RunOptions
from .recompute import Recompute

MEGATRON_COMMIT = "67f3515c8a0539d38c23f59dd8b85efdcbb3af3d"  # arguments.py read there (module docstring)
MEGATRON_ORDER = "tp-cp-ep-dp-pp"
TP_PP_DP_ORDER = "tp-cp-ep-pp-dp"  # --use-tp-pp-dp-mapping
CP_COMM_TYPE = {"ring": "p2p", "ulysses": "a2a", "allgather": "all_gather"}
FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}  # --data-parallel-sharding-strategy

# Every field of ParallelConfig and RunOptions (and of its Recompute: "recompute" is its granularity,
# "recompute.method" and "recompute.num_layers" the rest) -> the Megatron-LM flags that set it; () where Megatron has
# none (the module docstring says what it does instead).
MAPPING: dict[str, tuple[str, ...]] = {
    "tp": ("--tensor-model-parallel-size",),
    "cp": ("--context-parallel-size",),
    "ep": ("--expert-model-parallel-size",),
    "dp": (),
    "pp": ("--pipeline-model-parallel-size",),
    "etp": ("--expert-tensor-parallel-size",),
    "order": ("--use-tp-pp-dp-mapping",),
    "sequence_parallel": ("--sequence-parallel",),
    "cp_kind": ("--cp-comm-type",),
    "cp_layout": (),
    "schedule": (),
    "n_microbatches": ("--micro-batch-size", "--global-batch-size"),
    "v": ("--num-virtual-stages-per-pipeline-rank", "--num-layers-per-virtual-pipeline-stage"),
    "zero_stage": ("--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy"),
    "recompute": ("--recompute-granularity", "--recompute-modules"),
    "recompute.method": ("--recompute-method",),
    "recompute.num_layers": ("--recompute-num-layers",),
}


def megatron_args(par: ParallelConfig, options: RunOptions, *, global_batch: int, moe: bool = False) -> list[str]:
    """Megatron-LM's flags for running `par` with `options` and a global batch of `global_batch` sequences (argv
    tokens; `shlex.join` prints them). moe: the model has expert layers (writes both expert sizes, since Megatron's
    default etp is tp). Raises ValueError naming every option that has no Megatron flag and what Megatron offers."""
    bad = _problems(par, options, global_batch, moe)
    if bad:
        raise ValueError("no Megatron-LM flags for this plan: " + "; ".join(bad))
    o = options
    argv = ["--tensor-model-parallel-size", str(par.tp), "--pipeline-model-parallel-size", str(par.pp)]
    if o.v > 1:
        argv += ["--num-virtual-stages-per-pipeline-rank", str(o.v)]
    argv += ["--context-parallel-size", str(par.cp)]
    if par.cp > 1:
        argv += ["--cp-comm-type", CP_COMM_TYPE[o.cp_kind]]
    if moe:
        argv += ["--expert-model-parallel-size", str(par.ep), "--expert-tensor-parallel-size", str(par.etp)]
    if par.order == TP_PP_DP_ORDER:
        argv.append("--use-tp-pp-dp-mapping")
    if o.sequence_parallel and par.tp > 1:
        argv.append("--sequence-parallel")
    if o.zero_stage == 1:
        argv.append("--use-distributed-optimizer")
    elif o.zero_stage in FSDP_STRATEGY:
        argv += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", FSDP_STRATEGY[o.zero_stage]]
        argv += ["--ckpt-format", "fsdp_dtensor"]
    rc = o.recompute
    if rc.granularity != "none":
        argv += ["--recompute-granularity", rc.granularity]
    if rc.granularity == "full":
        argv += ["--recompute-method", rc.method, "--recompute-num-layers", str(rc.num_layers)]
    micro = global_batch // (par.dp * o.n_microbatches)
    argv += ["--micro-batch-size", str(micro), "--global-batch-size", str(global_batch)]
    return argv


def _problems(par: ParallelConfig, o: RunOptions, global_batch: int, moe: bool) -> list[str]:
    out = []
    if par.order not in (MEGATRON_ORDER, TP_PP_DP_ORDER):
        out.append(
            f"order={par.order!r}: Megatron builds {MEGATRON_ORDER!r} or, with --use-tp-pp-dp-mapping, "
            f"{TP_PP_DP_ORDER!r}"
        )
    if o.schedule == "gpipe":
        out.append("schedule='gpipe': Megatron runs 1F1B (interleaved with v > 1) and has no GPipe schedule")
    if (o.schedule == "interleaved") != (o.v > 1):
        out.append(f"schedule={o.schedule!r} with v={o.v}: Megatron interleaves exactly when v > 1")
    if par.cp > 1 and o.cp_layout != "zigzag":
        out.append(f"cp_layout={o.cp_layout!r}: Megatron always cuts 2 cp chunks per sequence, zig-zag")
    if par.cp > 1 and o.cp_kind not in CP_COMM_TYPE:
        out.append(f"cp_kind={o.cp_kind!r} must be one of {tuple(CP_COMM_TYPE)} (--cp-comm-type p2p, a2a, all_gather)")
    if not moe and (par.ep, par.etp) != (1, 1):
        out.append(f"ep={par.ep}, etp={par.etp} without experts: pass moe=True for a model with expert layers")
    # the ZeRO stage and the recomputation choice are checked when `RunOptions` is built: each has a flag
    if not isinstance(global_batch, int) or global_batch % (par.dp * o.n_microbatches) or global_batch < 1:
        out.append(
            f"global_batch={global_batch!r} must be a positive multiple of dp x m = {par.dp} x {o.n_microbatches} "
            "(--global-batch-size = --micro-batch-size x dp x m)"
        )
    return out


# Flags that change the layout in a way RunOptions cannot hold: refused by name rather than ignored.
UNSUPPORTED = {
    "--hierarchical-context-parallel-sizes": "hierarchical CP (a2a+p2p) is not pylib's",
    "--decoder-first-pipeline-num-layers": "uneven stages: pylib.pp cuts equal stages",
    "--decoder-last-pipeline-num-layers": "uneven stages: pylib.pp cuts equal stages",
    "--pipeline-model-parallel-layout": "a custom layer layout: pylib.pp cuts equal stages",
    "--use-torch-fsdp2": "PyTorch FSDP2 is not one of pylib's ZeRO stages",
    "--microbatch-group-size-per-virtual-pipeline-stage": "RunOptions runs Megatron's default N = p",
}
SWITCHES = ("--sequence-parallel", "--use-distributed-optimizer", "--use-megatron-fsdp", "--use-tp-pp-dp-mapping")
LISTS = ("--cp-comm-type", "--recompute-modules")  # nargs: one value or several
VALUED = {f for flags in MAPPING.values() for f in flags if f not in SWITCHES} | {"--num-layers", "--num-experts"}
SHARDING = {"no_shard": 0, "optim": 1, **{s: z for z, s in FSDP_STRATEGY.items()}}  # Megatron-FSDP's strategies


def _read(argv: list[str]) -> tuple[dict[str, list[str]], set[str]]:
    """The values of the layout flags in argv (`--flag v`, `--flag=v`, lists for LISTS) and the switches present."""
    values: dict[str, list[str]] = {}
    switches: set[str] = set()
    i = 0
    while i < len(argv):
        flag, eq, inline = argv[i].partition("=")
        i += 1
        if flag in UNSUPPORTED:
            raise ValueError(f"{flag}: {UNSUPPORTED[flag]}")
        if flag not in VALUED:
            switches.add(flag)
            continue
        taken = [inline] if eq else []
        while i < len(argv) and not argv[i].startswith("--") and (not taken or flag in LISTS):
            taken.append(argv[i])
            i += 1
        if not taken:
            raise ValueError(f"{flag} needs a value")
        values[flag] = taken
    return values, switches


def from_megatron_args(argv: list[str], world_size: int) -> tuple[ParallelConfig, RunOptions, int]:
    """The (ParallelConfig, RunOptions, global batch) a Megatron-LM command line runs on `world_size` GPUs.
    Flags that do not touch the layout (learning rate, data paths, model sizes) are skipped; `--num-experts` marks
    a model with experts (Megatron's etp = tp then, unless `--expert-tensor-parallel-size` says otherwise);
    `--num-layers` is read for `--num-layers-per-virtual-pipeline-stage`. Raises ValueError naming the flag."""
    values, switches = _read(argv)

    def number(flag, default):
        if flag not in values:
            return default
        try:
            return int(values[flag][0])
        except ValueError:
            raise ValueError(f"{flag} {values[flag][0]!r} must be an integer") from None

    tp, cp, pp = (number(f"--{a}-parallel-size", 1) for a in ("tensor-model", "context", "pipeline-model"))
    moe = "--num-experts" in values or "--expert-model-parallel-size" in values
    ep, etp = number("--expert-model-parallel-size", 1), number("--expert-tensor-parallel-size", tp if moe else 1)
    if world_size % (tp * cp * pp):
        raise ValueError(f"world_size={world_size} is not a multiple of tp x cp x pp = {tp} x {cp} x {pp}")
    order = TP_PP_DP_ORDER if "--use-tp-pp-dp-mapping" in switches else MEGATRON_ORDER
    par = ParallelConfig(tp=tp, cp=cp, ep=ep, dp=world_size // (tp * cp * pp), pp=pp, etp=etp, order=order)

    v = number("--num-virtual-stages-per-pipeline-rank", 1)
    per_chunk = number("--num-layers-per-virtual-pipeline-stage", None)
    if per_chunk is not None:
        layers = number("--num-layers", None)
        if layers is None or layers % (pp * per_chunk):
            raise ValueError(
                f"--num-layers-per-virtual-pipeline-stage {per_chunk} needs --num-layers, a multiple of pp x "
                f"{per_chunk} = {pp * per_chunk} (got {layers})"
            )
        v = layers // (pp * per_chunk)
    kinds = set(values.get("--cp-comm-type", ["p2p"]))
    by_type = {t: k for k, t in CP_COMM_TYPE.items()}
    if len(kinds) != 1 or not kinds <= set(by_type):
        raise ValueError(f"--cp-comm-type {sorted(kinds)}: one of {sorted(by_type)} for every layer (p2p = ring)")

    zero = 1 if "--use-distributed-optimizer" in switches else 0
    if "--use-megatron-fsdp" in switches:
        strategy = values.get("--data-parallel-sharding-strategy", [None])[0]
        if strategy not in SHARDING:
            raise ValueError(f"--use-megatron-fsdp needs --data-parallel-sharding-strategy, one of {tuple(SHARDING)}")
        zero = SHARDING[strategy]
    recompute = "selective" if "--recompute-activations" in switches else "none"  # the old spelling of selective
    recompute = values.get("--recompute-granularity", [recompute])[0]
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"--recompute-granularity {recompute!r} must be 'selective' or 'full'")
    if values.get("--recompute-modules", ["core_attn"]) != ["core_attn"]:
        raise ValueError(
            f"--recompute-modules {values['--recompute-modules']}: RunOptions recomputes the attention core "
            "(core_attn) only"
        )
    choice = Recompute(recompute)
    if recompute == "full":
        method = values.get("--recompute-method", [None])[0]
        if method not in ("uniform", "block"):
            raise ValueError(f"--recompute-granularity full needs --recompute-method uniform or block, not {method!r}")
        choice = Recompute(recompute, method, number("--recompute-num-layers", 1))

    micro = number("--micro-batch-size", None)
    if micro is None or micro < 1:
        raise ValueError(f"--micro-batch-size must be a positive integer (got {micro})")
    batch = number("--global-batch-size", micro * par.dp)  # Megatron's default: one microbatch per step
    if batch % (micro * par.dp):
        raise ValueError(
            f"--global-batch-size {batch} is not a multiple of --micro-batch-size x dp = {micro} x {par.dp}"
        )
    options = RunOptions(
        sequence_parallel="--sequence-parallel" in switches and tp > 1,
        cp_kind=by_type[kinds.pop()],
        schedule="interleaved" if v > 1 else "1f1b",
        n_microbatches=batch // (micro * par.dp),
        v=v,
        zero_stage=zero,
        recompute=choice,
    )
    return par, options, batch
