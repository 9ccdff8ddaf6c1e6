"""Every constraint a run must satisfy, each written once, all reported at once: the one validity model.

    problems(cfg, par, world_size, batch=B, seq=S, options=RunOptions(...))   # [] when the run can go ahead

`cfg` is a `pylib.plan.config.ModelConfig` (read by attribute: n_heads, kv_heads, d_ff, vocab_size, n_layers, moe,
causal, tie_embeddings, is_moe_layer); `par` a `ParallelConfig`; B the global batch (sequences per step over all
data-parallel ranks), S the sequence length. Every part of pylib asks this module: the modes for their own rules
(`check_sequence` for CP's layouts, `check_heads` for Ulysses, `expert_parallel_problems` for EP, `check_split`
and `check_schedule` for PP), `pylib.compose` before it builds anything (`check_compose`), the explorer
(`pylib.analysis.shapes.check_plan`) and the planner (`pylib.analysis.planner.problems`) for what they show.

The rules come in two groups. `size_problems`: the sizes must divide (heads, h_ffn, V, experts, layers over the
mesh; the batch over dp and m; the sequence over the CP layout's chunks and, with SP, over tp) -- what the sharded
shapes need, for a mode alone or composed. `problems` adds the rules of the composed run: the choices must be known
ones, the schedule must accept (pp, m, v), no EP without experts, and the mesh must fit the world
(`ParallelConfig.problems`). One rule is about training only, `training_problems`: a MoE layer under TP needs
sequence parallelism to train. As in Megatron-Core, such a model is built and evaluates, and its first training
forward is refused (`problems(..., training=False)` leaves the rule out: what the composed model checks when it is
built); the planner and the explorer, which plan training steps, ask with the default training=True.

The zig-zag rule: `pylib.cp.shard_sequence` cuts every zig-zag sequence into 2 cp equal chunks whatever the
attention (ring or Ulysses, causal or not), so s must be divisible by 2 cp (`check_sequence`).
"""

from __future__ import annotations

import functools

from pylib.i18n import N_, tr

from .config import routing_problems
from .heads import head_layout
from .options import CP_LAYOUTS, RunOptions
from .schedules import CONTROLLED, DUAL, ZERO_BUBBLE, ScheduleError, check_schedule, placement_of
from .split import check_split

LAYOUTS = CP_LAYOUTS


class ComposeConfigError(ValueError):
    """A configuration that cannot run; `.problems` lists every violated constraint as a sentence."""

    def __init__(self, problems: list[str], what: str | None = None):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        what = tr("this configuration") if what is None else what
        super().__init__(tr("{what} cannot run ({n} problem(s)):", what=what, n=len(self.problems)) + f"\n{lines}")


# ------------------------------------------------------------------------------------------------ the modes' rules


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} must be one of {LAYOUTS}")


def n_chunks(cp_size: int, layout: str) -> int:
    """How many equal chunks the sequence is cut into: cp (contiguous) or 2*cp (zigzag)."""
    check_layout(layout)
    return cp_size if layout == "contiguous" else 2 * cp_size


def check_sequence(seq_len: int, cp_size: int, layout: str) -> None:
    """Raise when `seq_len` cannot be cut into the layout's equal chunks, naming the numbers."""
    check_layout(layout)
    if cp_size < 1:
        raise ValueError(f"cp={cp_size} must be >= 1")
    parts = n_chunks(cp_size, layout)
    if seq_len % parts:
        what = tr("2*cp={n} chunks", n=parts) if layout == "zigzag" else tr("cp={n} chunks", n=cp_size)
        raise ValueError(
            tr(
                "{layout} layout cuts the sequence into {what}: sequence length s={s} is not divisible by {parts}",
                layout=layout,
                what=what,
                s=seq_len,
                parts=parts,
            )
        )


def check_heads(n_head: int, n_kv_head: int, cp_size: int) -> None:
    """Ulysses gives each rank n_head/cp query heads and n_kv_head/cp K/V heads: both must divide."""
    if n_head % cp_size:
        raise ValueError(
            tr("ulysses: cp={cp} does not divide n_head={n} (each rank attends n_head/cp heads)", cp=cp_size, n=n_head)
        )
    if n_kv_head % cp_size:
        raise ValueError(
            tr(
                "ulysses: cp={cp} does not divide n_kv_head={n} (each rank needs whole K/V heads; "
                "use ring attention, or cp <= {n})",
                cp=cp_size,
                n=n_kv_head,
            )
        )


def expert_parallel_problems(moe, *, ep: int, etp: int, d_ff_expert: int) -> list[str]:
    """Every violated constraint of running the MoE layer `moe` (a `MoEConfig`) with `ep` expert-parallel and
    `etp` expert-tensor-parallel ranks, as sentences (empty when it can run)."""
    out = []
    if ep < 1 or moe.n_experts % ep:
        out.append(tr("ep={ep} does not divide n_experts={n}", ep=ep, n=moe.n_experts))
    out += routing_problems(moe)  # the MoEConfig's own rules, for a config built some other way
    if etp < 1 or d_ff_expert % etp:
        out.append(tr("etp={etp} does not divide expert h_ffn={n}", etp=etp, n=d_ff_expert))
    return out


# ------------------------------------------------------------------------------------------------ collected


def _collect(out: list[str], fn, *args, **kwargs) -> None:
    """Run one rule that raises; keep its message instead of stopping at it."""
    try:
        fn(*args, **kwargs)
    except (ValueError, ScheduleError) as exc:
        msg = str(exc)
        if msg not in out:
            out.append(msg)


def _divides(out: list[str], part: int, whole: int, message: str, **fields) -> None:
    """Add `message` (an N_ message) translated and filled with `fields` unless `part` divides `whole`: a planner
    asks this hundreds of thousands of times, so the sentence is made only when it is said."""
    if part < 1 or whole % part:
        out.append(tr(message, **fields))


@functools.lru_cache(maxsize=4096)
def _mesh_problems(par, world_size: int) -> tuple[str, ...]:
    """`par.problems(world_size)`, remembered: with pp > 1 it lays out the dense and the expert rank grids (O(world
    size)), and a planner asks about the same mesh once per schedule, ZeRO stage and microbatch count. Both
    arguments are immutable, so the answer cannot go stale."""
    return tuple(par.problems(world_size))


@functools.lru_cache(maxsize=256)
def _layer_kinds(cfg) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(MoE layers, dense layers) of a model config, remembered (the config is immutable; a planner asks about the
    same model thousands of times)."""
    moe = tuple(i for i in range(cfg.n_layers) if cfg.is_moe_layer(i))
    return moe, tuple(i for i in range(cfg.n_layers) if i not in moe)


def _tp_problems(out: list[str], cfg, par) -> None:
    """Heads, K/V heads, the dense h_ffn and the vocabulary over tp."""
    tp = par.tp
    _collect(out, head_layout, cfg.n_heads, cfg.kv_heads, tp, 0)
    if _layer_kinds(cfg)[1]:
        _divides(
            out, tp, cfg.d_ff, N_("tp={tp} does not divide d_ff={n} (h_ffn of the dense MLP layers)"), tp=tp, n=cfg.d_ff
        )
    _divides(out, tp, cfg.vocab_size, N_("tp={tp} does not divide vocab_size={n}"), tp=tp, n=cfg.vocab_size)
    shared = getattr(cfg.moe, "n_shared_experts", 0) if _layer_kinds(cfg)[0] else 0
    if shared:  # one dense MLP of n_shared * (expert h_ffn) units, cut over TP as the dense MLP is
        f_s = shared * (cfg.moe.d_ff or cfg.d_ff)
        _divides(
            out,
            tp,
            f_s,
            N_("tp={tp} does not divide the shared experts' h_ffn={n} (n_shared_experts x the expert h_ffn)"),
            tp=tp,
            n=f_s,
        )


def _ep_sizes(out: list[str], cfg, par) -> None:
    if _layer_kinds(cfg)[0]:
        d_ff_expert = cfg.moe.d_ff or cfg.d_ff
        found = expert_parallel_problems(cfg.moe, ep=par.ep, etp=par.etp, d_ff_expert=d_ff_expert)
        out += [p for p in found if p not in out]


def _ulysses_problems(out: list[str], cfg, par, opt: RunOptions) -> None:
    """Ulysses needs whole heads per rank after TP took its share."""
    tp, cp = par.tp, par.cp
    if opt.cp_kind != "ulysses" or cp == 1 or cfg.n_heads % tp:
        return
    try:
        lay = head_layout(cfg.n_heads, cfg.kv_heads, tp, 0)
    except ValueError:
        return  # already reported by the TP rule
    found: list[str] = []
    _collect(found, check_heads, lay.q_count, lay.kv_count, cp)
    out += [
        tr(
            "{msg} [after tp={tp}: each TP rank attends n_head/tp = {q} query and {kv} K/V head(s); Ulysses splits "
            "those over cp]",
            msg=msg,
            tp=tp,
            q=lay.q_count,
            kv=lay.kv_count,
        )
        for msg in found
    ]


def _data_problems(out: list[str], par, batch, seq, opt: RunOptions) -> None:
    """The batch over dp and the microbatches; the sequence over the CP layout's chunks and, with SP, over tp."""
    dp, cp, tp, m = par.dp, par.cp, par.tp, opt.n_microbatches
    for name, n in (("batch", batch), ("seq", seq)):
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            out.append(f"{name}={n!r} must be a positive integer")
            return
    m_ok = isinstance(m, int) and not isinstance(m, bool) and m >= 1
    if batch is not None:
        _divides(out, dp, batch, N_("dp={dp} does not divide the global batch size B={b}"), dp=dp, b=batch)
        if dp >= 1 and batch % dp == 0 and m_ok:
            _divides(
                out,
                m,
                batch // dp,
                N_("n_microbatches={m} does not divide the batch per data-parallel rank B/dp = {b}/{dp} = {per}"),
                m=m,
                b=batch,
                dp=dp,
                per=batch // dp,
            )
    if seq is not None:
        if opt.cp_layout in LAYOUTS:
            _collect(out, check_sequence, seq, cp, opt.cp_layout)
        if opt.sequence_parallel and tp > 1 and seq % cp == 0:
            _divides(
                out,
                tp,
                seq // cp,
                N_(
                    "sequence parallelism splits each CP rank's s/cp = {s}/{cp} = {per} tokens over tp={tp} "
                    "ranks: tp does not divide {per}"
                ),
                s=seq,
                cp=cp,
                per=seq // cp,
                tp=tp,
            )


def size_problems(cfg, par, *, batch=None, seq=None, options: RunOptions | None = None) -> list[str]:
    """The rules that make the sharded shapes exist (module docstring): heads, h_ffn, V and experts over the mesh,
    layers over pp v, batch over dp m, sequence over the CP layout and SP. A mode run alone needs these only."""
    opt = RunOptions() if options is None else options
    out: list[str] = []
    _tp_problems(out, cfg, par)
    _ep_sizes(out, cfg, par)
    _ulysses_problems(out, cfg, par, opt)
    _collect(out, check_split, cfg.n_layers, par.pp, opt.v)
    _data_problems(out, par, batch, seq, opt)
    return out


def _choice_problems(out: list[str], cfg, par, opt: RunOptions) -> None:
    """The compositions the composed model refuses (each choice alone is checked when `RunOptions` is built)."""
    rc = opt.recompute
    k = rc.num_layers
    if opt.zero_stage == 3 and rc.granularity == "full" and rc.method == "uniform" and k != 1:
        out.append(
            f"recompute='full' with recompute_num_layers={k!r} (uniform) and zero_stage=3: a recomputed group spans "
            "several ZeRO-3 units, and each unit frees its gathered parameters after its forward, before the group's "
            "backward reads them; recompute one layer per group (recompute_num_layers=1, or recompute_method='block')"
        )
    if not _layer_kinds(cfg)[0]:
        if par.ep > 1:
            out.append(f"ep={par.ep} but the model has no MoE layers (cfg.moe is None): nothing to split over experts")
        # etp > 1 is accepted: as in Megatron-Core (whose expert_tensor_parallel_size defaults to tp), it shapes only
        # the expert rank layout, which the order rules of ParallelConfig check; Megatron's own dp-last tests of a
        # dense model set it to tp*cp


def training_problems(cfg, par, options: RunOptions | None = None) -> list[str]:
    """What a training step refuses that building and evaluating accept: a MoE layer with tp > 1 and no sequence
    parallelism. Megatron-Core's MoELayer.forward raises ValueError when `self.training` and TP > 1 without SP
    (megatron/core/transformer/moe/moe_layer.py at d98e8a6, since 28c8dd7): without SP every TP rank holds, and
    would route and dispatch, the same tokens."""
    opt = RunOptions() if options is None else options
    if _layer_kinds(cfg)[0] and par.tp > 1 and not opt.sequence_parallel:
        return [
            tr(
                "MoE layers with tp={tp} need sequence_parallel=True to train: without SP every TP rank holds the "
                "same tokens and would route them, so each expert would see every token tp times (Megatron-Core's "
                "MoELayer.forward raises ValueError in training; building and evaluating are accepted)",
                tp=par.tp,
            )
        ]
    return []


def _schedule_problems(out: list[str], cfg, par, opt: RunOptions) -> None:
    _collect(out, check_schedule, opt.schedule, par.pp, opt.n_microbatches, opt.v)  # what build() checks, unbuilt
    if opt.schedule in ZERO_BUBBLE + CONTROLLED and par.pp > 1 and int(opt.zero_stage) == 3:
        out.append(
            tr(
                "the schedule {name} splits each backward into B and W, which ZeRO-3 cannot follow: it "
                "gathers a unit's parameters for one backward and frees them after it (use zero_stage 0, 1 or 2)",
                name=opt.schedule,
            )
        )
    if opt.schedule in DUAL:
        out.append(
            tr(
                "{name} keeps two copies of every stage and sums their gradients over rank pairs, which the composed "
                "model does not build: run it with pylib.pp.PipelineParallel(model, v=2, placement='dual')",
                name=opt.schedule,
            )
        )
    if cfg.tie_embeddings and par.pp > 1 and placement_of(opt.schedule) == "v":
        out.append(
            tr(
                "{name} puts the first and the last stage on pipeline rank 0 (the V), but tied embeddings are "
                "summed over the first and the last pipeline rank: untie them (tie_embeddings=False)",
                name=opt.schedule,
            )
        )


def problems(
    cfg,
    par,
    world_size: int | None = None,
    *,
    batch=None,
    seq=None,
    options: RunOptions | None = None,
    training: bool = True,
):
    """Every violated constraint of running model `cfg` on mesh `par` over `world_size` ranks with a global batch
    [batch, seq] and `options`; empty when it can run. world_size / batch / seq None skip those checks.
    training=False leaves out `training_problems` (what building and evaluating need)."""
    opt = RunOptions() if options is None else options
    out: list[str] = []
    if world_size is not None:
        out += _mesh_problems(par, world_size)
    _choice_problems(out, cfg, par, opt)
    if training:
        out += training_problems(cfg, par, opt)
    for p in size_problems(cfg, par, batch=batch, seq=seq, options=opt):
        if p not in out:
            out.append(p)
    _schedule_problems(out, cfg, par, opt)
    return out


def check(cfg, par, world_size: int | None = None, **kwargs) -> None:
    """Raise `ComposeConfigError` listing every problem `problems` finds."""
    found = problems(cfg, par, world_size, **kwargs)
    if found:
        raise ComposeConfigError(found, tr("ParallelConfig({plan}) on {n} ranks", plan=par.describe(), n=world_size))
