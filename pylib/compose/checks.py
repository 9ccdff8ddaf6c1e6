"""Every constraint a composed TP x SP x CP x EP x DP x PP run must satisfy, checked up front, ALL reported at once.

Each mode has its own checks (`ParallelConfig.problems`, `pylib.tp.head_layout`, `pylib.cp.check_sequence`,
`pylib.cp.check_heads`, `pylib.pp.check_split`, `pylib.pp.build`, `pylib.ep.expert_parallel_problems`); most raise at
the first problem. Here each is run in turn and its message collected, so one error lists everything that is
wrong with a configuration -- a reader fixing a 16-rank setup should not discover the problems one launch at a
time.

    problems = compose_problems(model_cfg, ParallelConfig(tp=2, cp=2, dp=2, pp=2), world_size=16, batch=8, seq=16)
    check_compose(...)          # raises ComposeConfigError(problems) when the list is not empty
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from pylib.cp.layout import LAYOUTS, check_sequence
from pylib.cp.ulysses import check_heads
from pylib.ep.checks import expert_parallel_problems
from pylib.pp.schedules import SCHEDULES, ScheduleError, check_schedule
from pylib.pp.split import check_split
from pylib.runtime.mesh import ParallelConfig
from pylib.tp.attention import head_layout

CP_KINDS = ("ring", "ulysses")
ZERO_STAGES = (0, 1, 2, 3)


class ComposeConfigError(ValueError):
    """A configuration that cannot run; `.problems` lists every violated constraint as a sentence."""

    def __init__(self, problems: list[str], what: str = "this configuration"):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{what} cannot run ({len(self.problems)} problem(s)):\n{lines}")


def _collect(out: list[str], fn: Callable, *args, **kwargs) -> None:
    """Run one mode's check; keep its message instead of stopping at it."""
    try:
        fn(*args, **kwargs)
    except (ValueError, ScheduleError) as exc:
        msg = str(exc)
        if msg not in out:
            out.append(msg)


@functools.lru_cache(maxsize=4096)
def _mesh_problems(pc: ParallelConfig, world_size: int) -> tuple[str, ...]:
    """`pc.problems(world_size)`, remembered: with pp > 1 it lays out the dense and the expert rank grids (O(world
    size)), and a planner asks about the same mesh once per schedule, ZeRO stage and microbatch count. Both
    arguments are immutable, so the answer cannot go stale."""
    return tuple(pc.problems(world_size))


@functools.lru_cache(maxsize=256)
def _layer_kinds(cfg) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(MoE layers, dense layers) of a model config, remembered (the config is immutable; a planner asks about the
    same model thousands of times)."""
    moe = tuple(i for i in range(cfg.n_layers) if cfg.is_moe_layer(i))
    return moe, tuple(i for i in range(cfg.n_layers) if i not in moe)


def _divides(out: list[str], part: int, whole: int, sentence: str) -> None:
    if part < 1 or whole % part:
        out.append(sentence)


def compose_problems(
    cfg,
    pc: ParallelConfig,
    world_size: int | None = None,
    *,
    batch: int | None = None,
    seq: int | None = None,
    sequence_parallel: bool = True,
    cp_layout: str = "zigzag",
    cp_kind: str = "ring",
    schedule: str = "1f1b",
    n_microbatches: int = 1,
    v: int = 1,
    zero_stage: int = 0,
) -> list[str]:
    """Every violated constraint of running model `cfg` (a `pylib.model.ModelConfig`) on `pc` over `world_size`
    ranks with a global batch [batch, seq]; empty when it can run. `batch` / `seq` None skip the data checks."""
    out: list[str] = []
    tp, cp, ep, dp, pp, etp = pc.tp, pc.cp, pc.ep, pc.dp, pc.pp, pc.etp
    # sizes vs world, folding (ParallelConfig's own check)
    if world_size is not None:
        out += _mesh_problems(pc, world_size)
    # choices
    if cp_layout not in LAYOUTS:
        out.append(f"cp_layout={cp_layout!r} must be one of {LAYOUTS}")
    if cp_kind not in CP_KINDS:
        out.append(f"cp_kind={cp_kind!r} must be one of {CP_KINDS}")
    if zero_stage not in ZERO_STAGES:
        out.append(f"zero_stage={zero_stage!r} must be one of {ZERO_STAGES} (0 = DDP)")
    if cfg.tie_embeddings:
        out.append(
            "tie_embeddings=True is not supported here: the embedding (first stage) and the LM head (last stage) "
            "would share one weight across pipeline stages and data-parallel shards"
        )
    # tensor parallelism: heads, K/V heads, h_ffn, vocabulary
    _collect(out, head_layout, cfg.n_heads, cfg.kv_heads, tp, 0)
    moe_layers, dense_layers = _layer_kinds(cfg)
    if dense_layers:
        _divides(out, tp, cfg.d_ff, f"tp={tp} does not divide d_ff={cfg.d_ff} (h_ffn of the dense MLP layers)")
    _divides(out, tp, cfg.vocab_size, f"tp={tp} does not divide vocab_size={cfg.vocab_size}")
    # expert parallelism
    if moe_layers:
        d_ff_expert = cfg.moe.d_ff or cfg.d_ff
        out += [p for p in expert_parallel_problems(cfg.moe, ep=ep, etp=etp, d_ff_expert=d_ff_expert) if p not in out]
        if tp > 1 and not sequence_parallel:
            out.append(
                f"expert parallelism with tp={tp} needs sequence_parallel=True: the MoE layer takes each rank's own "
                "tokens, and without SP every TP rank would hold (and route) the same tokens (Megatron requires SP)"
            )
    else:
        if ep > 1:
            out.append(f"ep={ep} but the model has no MoE layers (cfg.moe is None): nothing to split over experts")
        if etp > 1:
            out.append(f"etp={etp} but the model has no MoE layers (cfg.moe is None)")
    # context parallelism: Ulysses needs whole heads per rank after TP took its share
    if cp_kind == "ulysses" and cp > 1 and cfg.n_heads % tp == 0:
        try:
            lay = head_layout(cfg.n_heads, cfg.kv_heads, tp, 0)
        except ValueError:
            lay = None  # already reported by the TP check
        if lay is not None:
            found: list[str] = []
            _collect(found, check_heads, lay.q_count, lay.kv_count, cp)
            out += [
                f"{msg} [after tp={tp}: each TP rank attends n_head/tp = {lay.q_count} query and "
                f"{lay.kv_count} K/V head(s); Ulysses splits those over cp]"
                for msg in found
            ]
    # pipeline: layers vs pp*v, schedule vs microbatches
    _collect(out, check_split, cfg.n_layers, pp, v)
    if schedule not in SCHEDULES:
        out.append(f"schedule={schedule!r} must be one of {SCHEDULES}")
    elif isinstance(n_microbatches, int) and n_microbatches >= 1:
        _collect(out, check_schedule, schedule, pp, n_microbatches, v)  # what build() checks, unbuilt
    else:
        out.append(f"n_microbatches={n_microbatches!r} must be a positive integer")
    # data: batch over dp and microbatches, sequence over cp (zig-zag: 2*cp chunks) and tp (SP)
    if batch is not None:
        _divides(out, dp, batch, f"dp={dp} does not divide the global batch size B={batch}")
        if dp >= 1 and batch % dp == 0 and isinstance(n_microbatches, int) and n_microbatches >= 1:
            _divides(
                out,
                n_microbatches,
                batch // dp,
                f"n_microbatches={n_microbatches} does not divide the batch per data-parallel rank "
                f"B/dp = {batch}/{dp} = {batch // dp}",
            )
    if seq is not None:
        if cp_layout in LAYOUTS:
            _collect(out, check_sequence, seq, cp, cp_layout)
        if sequence_parallel and tp > 1 and seq % cp == 0:
            _divides(
                out,
                tp,
                seq // cp,
                f"sequence parallelism splits each CP rank's s/cp = {seq}/{cp} = {seq // cp} tokens over tp={tp} "
                f"ranks: tp does not divide {seq // cp}",
            )
    return out


def check_compose(cfg, pc: ParallelConfig, world_size: int | None = None, **kwargs) -> None:
    """Raise `ComposeConfigError` listing every problem `compose_problems` finds."""
    problems = compose_problems(cfg, pc, world_size, **kwargs)
    if problems:
        raise ComposeConfigError(problems, f"ParallelConfig({pc.describe()}) on {world_size} ranks")
