"""The planner on the page: its predictions checked against short real runs, its ranked plans as tables, article A's
selection guide read off its numbers, and an ipywidgets explorer.

    records = measure_plans(cfg, plans, batch=8, seq=16)       # pylib.experiments.plan_runs: every rank, one step
    rows = compare(cfg, plan, records[plan], batch=8, seq=16)   # predicted vs measured, per rank and quantity
    ranked = rank_plans(cfg, workload, cluster, top=8)          # pylib.analysis.planner
    print(plans_text(ranked))                                   # the table, as plain text (also plans_html)
    ex = PlannerExplorer(); ex.widget; print(ex.text())         # choose sizes, see the best plans
    best_plans(DEFAULT_JOB)                                     # the one ranking the explorer and the chapter show

Every number comes from `pylib.analysis.planner` (and through it from the per-mode formulas); the measurements from
`pylib.experiments.plan_runs` (`pylib.experiments.compose_training.train` inside launched ranks).
"""

from __future__ import annotations

import functools
import html
from dataclasses import dataclass, replace

from pylib.analysis import planner as P
from pylib.i18n import N_, shown, tr
from pylib.plan.config import ModelConfig
from pylib.plan.presets import deepseek_v3_like, llama2_7b, llama2_70b, mixtral_8x7b
from pylib.tables import fmt_bytes, html_table, text_table


@dataclass
class Check:
    """One quantity of one rank: what the planner predicted, what the rank measured, and whether the formula is
    exact for it (False: an expectation, e.g. expert traffic under data-dependent routing)."""

    rank: int
    quantity: str
    predicted: float
    measured: float
    exact: bool = True

    @property
    def equal(self) -> bool:
        return self.predicted == self.measured


def compare(cfg, plan: P.Plan, records: list[dict], *, batch: int, seq: int, routing: str = "measured") -> list[Check]:
    """Predicted vs measured, for every rank: model-state bytes (uniform precision, Adam), the bytes each chunk
    saves for one microbatch (MoE layers at the rank's measured expert rows), the activation peak of the schedule
    (dense models: every microbatch saves the same), and the bytes sent on each axis (with the rank's own ZeRO
    shard and EP/ETP indices).

    routing: which MoE routing the traffic formulas are evaluated on. "measured" (the run's own send/receive
    counts): every number is exact. "expected" (uniform, no dropping; what the planner predicts with): the EP and
    ETP axes carry what a data-dependent router sends, so their checks are marked inexact (`Check.exact`)."""
    from pylib.analysis.activations import chunk_saved_bytes, peak_saved_bytes

    if routing not in ("measured", "expected"):
        raise ValueError(f"routing={routing!r} must be 'measured' or 'expected'")
    par = plan.par
    work = P.Workload(batch, seq, precision="uniform", attention="math")
    b = plan.micro_batch(batch)
    out: list[Check] = []
    for rec in records:
        r, co = rec["rank"], rec["coords"]
        pp_rank = co["pp"]
        mem = P.rank_memory(cfg, plan, work, pp_rank)
        for k in ("params", "grads", "optim"):
            out.append(Check(r, k, mem[k], rec["memory"][k]))
        ran = P.Plan(par, plan.options)  # pylib's SP, equal stages, no Megatron modules: what compose measures
        chunks = chunk_saved_bytes(cfg, b, seq, ran, pp_rank, attention="math", expert_rows=rec["expert_rows"])
        for c, n in enumerate(chunks):
            out.append(Check(r, f"saved activations, chunk {c}", n, rec["activation_bytes"][(0, c)]))
        if cfg.moe is None:
            peak = peak_saved_bytes(
                chunks, plan.options.schedule, par.pp, plan.options.n_microbatches, plan.options.v, pp_rank
            )
            out.append(Check(r, "activation peak", peak, rec["peak_activation_bytes"]))
        rows = P.rank_traffic_rows(
            cfg,
            plan,
            batch,
            seq,
            pp_rank,
            coords=co,
            moe_routing=rec["moe_routing"] if routing == "measured" else None,
        )
        predicted: dict[str, int] = {}
        for row in rows:
            predicted[row.axis] = predicted.get(row.axis, 0) + row.bytes_sent
        for axis in sorted(set(predicted) | set(rec["traffic"])):
            got = sum(rec["traffic"].get(axis, {}).values())
            exact = routing == "measured" or axis not in ("ep", "etp")
            out.append(Check(r, f"sent on {axis}", predicted.get(axis, 0), got, exact=exact))
    return out


def _quantity(q: str) -> str:
    """A Check's quantity (a key: "params", "saved activations, chunk 0", "sent on tp", ...) as a table shows it."""
    if q.startswith("saved activations, chunk "):
        return tr("saved activations, chunk {c}", c=int(q.rsplit(" ", 1)[1]))
    if q.startswith("sent on "):
        return tr("sent on {axis}", axis=q.removeprefix("sent on "))
    quantities = frozenset({N_("params"), N_("grads"), N_("optim"), N_("activation peak")})
    return shown(quantities, q)


def compare_table(checks: list[Check]) -> list[list[str]]:
    """One row per quantity: how many ranks were checked, the largest predicted and measured values, the largest
    |predicted - measured| over the ranks and whether the formula is exact for it."""
    by: dict[str, list[Check]] = {}
    for c in checks:
        by.setdefault(c.quantity, []).append(c)
    rows = []
    for q, cs in by.items():
        diff = max(abs(c.predicted - c.measured) for c in cs)
        rows.append(
            [
                _quantity(q),
                str(len(cs)),
                f"{max(c.predicted for c in cs):,.0f}",
                f"{max(c.measured for c in cs):,.0f}",
                f"{diff:,.0f}",
                tr("exact") if all(c.exact for c in cs) else tr("expectation"),
            ]
        )
    return rows


COMPARE_HEADER = ["quantity", "ranks", "predicted (max)", "measured (max)", "max |pred − meas|", "formula"]


def compare_header() -> list[str]:
    """COMPARE_HEADER in the reader's language (pylib.i18n)."""
    return [
        tr("quantity"),
        tr("ranks"),
        tr("predicted (max)"),
        tr("measured (max)"),
        tr("max |pred − meas|"),
        tr("formula"),
    ]


# ------------------------------------------------------------------------------------------------ presets


# name -> (model, world size, global batch in sequences, sequence length)
PRESETS: dict[str, tuple[ModelConfig, int, int, int]] = {
    "Llama-2-7B-class dense": (llama2_7b(), 8, 256, 4096),
    "Llama-2-70B-class dense (GQA)": (llama2_70b(), 64, 512, 4096),
    "Mixtral-8x7B-class MoE": (mixtral_8x7b(), 64, 512, 4096),
    "DeepSeek-V3-class MoE": (deepseek_v3_like(), 256, 1024, 4096),
}
DEFAULT = "Llama-2-70B-class dense (GQA)"


def megatron_workload(batch: int, seq: int) -> P.Workload:
    """A step of `batch` sequences of `seq` tokens as Megatron-LM trains it in bf16 by default: mixed precision
    with fp32 gradients (`--main-grads-dtype fp32`, which turns on `accumulate_allreduce_grads_in_fp32`: 4-byte
    gradient buffers and DP reductions). The chapter and the explorer rank real models on it."""
    return P.Workload(batch, seq, grad_reduce="float32")


# The chapter's search (see rank_plans). sp_regather: real models are predicted as Megatron runs SP (the saved
# inputs of the column-parallel linears kept as shards, all-gathered again in backward: `planner.Plan.sp_regather`).
SEARCH = P.SearchSpace(micro_batch_sizes=(1, 2), virtual_stages=(1, 2), sp_regather=True)


# ------------------------------------------------------------------------------------------------ tables


def _seconds(x: float) -> str:
    return f"{x:.3g} s" if x >= 0.1 else f"{1000 * x:.3g} ms"


PLAN_HEADER = ["#", "plan", "fits", "memory / GPU", "state", "activations", "traffic / GPU / step", "bubble", "step"]


def plan_header() -> list[str]:
    """PLAN_HEADER in the reader's language (pylib.i18n)."""
    return [
        "#",
        tr("plan"),
        tr("fits"),
        tr("memory / GPU"),
        tr("state"),
        tr("activations"),
        tr("traffic / GPU / step"),
        tr("bubble"),
        tr("step"),
    ]


def plan_rows(ranked: list[P.Prediction]) -> list[list[str]]:
    """One row per plan: the plan, whether it fits, the busiest rank's memory (model state = parameters +
    gradients + optimizer state, activations), bytes sent per axis (the busiest rank's, per axis; ⇄ marks an axis
    whose groups cross nodes), the bubble and the cost model's step time."""
    rows = []
    for i, p in enumerate(ranked, 1):
        worst = p.worst_rank().memory
        state = worst["params"] + worst["grads"] + worst["optim"] + worst["gathered"]
        moved = ", ".join(
            f"{axis}{'' if p.intra_node.get(axis, True) else ' ⇄'} {fmt_bytes(v)}"
            for axis, v in sorted(p.traffic_by_axis().items(), key=lambda kv: -kv[1])
            if v >= 1e6
        )
        rows.append(
            [
                str(i),
                p.plan.describe(),
                tr("yes") if p.fits else tr("no"),
                fmt_bytes(p.peak_memory),
                fmt_bytes(state),
                fmt_bytes(worst["activations"]),
                moved or "—",
                f"{p.bubble_fraction:.1%}",
                _seconds(p.step_time),
            ]
        )
    return rows


def plans_text(ranked: list[P.Prediction]) -> str:
    return "\n".join(line.rstrip() for line in text_table(plan_header(), plan_rows(ranked)))


def plans_html(ranked: list[P.Prediction]) -> str:
    return html_table(plan_header(), plan_rows(ranked))


# ------------------------------------------------------------------------------------------------ the explorer

EXPLORER_SEARCH = P.SearchSpace(
    micro_batch_sizes=(1,), virtual_stages=(1,), expert_tp=(1,), sequence_parallel=(True,), sp_regather=True
)
# The explorer's job space (`Job.space`): EXPLORER_SEARCH with one or two chunks per pipeline rank, the interleaving
# NVIDIA's recipes use. (EXPLORER_SEARCH itself, without interleaving, is what other chapters count plans over.)
JOB_SEARCH = replace(EXPLORER_SEARCH, virtual_stages=(1, 2))
EXPLORER_PRESETS = [name for name in PRESETS if not name.startswith("DeepSeek")]  # 256 experts: seconds per update
WORLD_SIZES = [8, 16, 32, 64, 128, 256]
GPU_MEMORY = {"40 GB (A100 40G)": 40e9, "80 GB (H100)": 80e9, "141 GB (H200)": 141e9}


def explorer_cluster(world: int, memory: float) -> P.Cluster:
    """The explorer's machines: H100-class nodes of 8 with `memory` bytes per GPU, TP's collectives overlapped
    with the GEMMs (`tp_comm_overlap`, Megatron's --tp-comm-overlap) as in every published run the cost model's
    constants were fitted on (`calibration.RUNS`) and in NVIDIA's recipes for these models."""
    return P.Cluster(world, gpu_memory=memory, tp_comm_overlap=True)


@dataclass(frozen=True)
class Job:
    """One planning question: the preset model `preset` (a key of PRESETS) on `world` GPUs of `memory` bytes
    (`explorer_cluster`), `batch` sequences of `seq` tokens per step, the gradients reduced in `grad_reduce`
    (Megatron-LM's default fp32: `megatron_workload`). The explorer, the planner chapter's ranking and its knob
    table all ask `best_plans` about a Job, so one job has one answer."""

    preset: str
    world: int
    batch: int
    seq: int
    memory: float = 80e9
    grad_reduce: str = "float32"

    @property
    def cfg(self) -> ModelConfig:
        return PRESETS[self.preset][0]

    @property
    def workload(self) -> P.Workload:
        return P.Workload(self.batch, self.seq, grad_reduce=self.grad_reduce)

    @property
    def cluster(self) -> P.Cluster:
        return explorer_cluster(self.world, self.memory)

    @property
    def space(self) -> P.SearchSpace:
        return JOB_SEARCH


def preset_job(name: str = DEFAULT, world: int | None = None) -> Job:
    """The preset's job: its model, GPUs (or `world`), global batch and sequence length, on 80 GB GPUs."""
    _cfg, w, batch, seq = PRESETS[name]
    return Job(name, world or w, batch, seq)


DEFAULT_JOB = preset_job()  # Llama-2-70B-class on 64 GPUs, 512 x 4096 tokens: the explorer's default, the chapter's


@functools.lru_cache(maxsize=256)
def best_plans(job: Job, top: int = 8) -> list[P.Prediction]:
    """The `top` plans of `job` by the cost model (`planner.rank_plans` over `job.space`): the one ranking the
    explorer shows and the planner chapter starts from."""
    return P.rank_plans(job.cfg, job.workload, job.cluster, top=top, space=job.space)


# A preset's name as the reader sees it (the English name stays the key of PRESETS).
_PRESET_LABELS = frozenset(
    {
        N_("Llama-2-7B-class dense"),
        N_("Llama-2-70B-class dense (GQA)"),
        N_("Mixtral-8x7B-class MoE"),
        N_("DeepSeek-V3-class MoE"),
    }
)


def preset_label(name: str) -> str:
    """A preset's name in the reader's language."""
    return shown(_PRESET_LABELS, name)


def explorer_title(name: str, world: int, batch: int, seq: int, memory: float) -> str:
    return tr(
        "{name} on {world} GPUs of {gb:.0f} GB, 8 per node; {batch} sequences of {seq} tokens per step",
        name=preset_label(name),
        world=world,
        gb=memory / 1e9,
        batch=batch,
        seq=seq,
    )


class PlannerExplorer:
    """Choose a model, the GPUs and the step's batch; see the cost model's best plans with their memory and traffic
    per GPU (`best_plans` of the chosen `Job`, the function the planner chapter asks too; `planner.rank_plans`
    over `JOB_SEARCH`: one sequence per microbatch, one or two chunks per pipeline rank, no expert TP, SP whenever
    TP > 1 -- Megatron's, with the regather -- and Megatron's default fp32 gradients, `megatron_workload`; TP
    overlapped with the GEMMs, `explorer_cluster`). On a 2-core CPU an update takes about a second for the dense
    presets and a few seconds for the MoE on 256 GPUs (answers are cached, so
    going back is instant). Its controls need a kernel: the container carries the class "pb-needs-kernel", which
    the static site disables with a notice; `static_explorer` is the kernel-free version. `text()` prints the
    default table."""

    def __init__(self, preset: str = DEFAULT, top: int = 8):
        import ipywidgets as widgets

        _cfg, world, batch, seq = PRESETS[preset]
        slider = dict(continuous_update=False, style={"description_width": "initial"})
        self.top = top
        self.preset = widgets.Dropdown(
            options=[(preset_label(n), n) for n in EXPLORER_PRESETS], value=preset, description=tr("model")
        )
        self.world = widgets.SelectionSlider(options=WORLD_SIZES, value=world, description=tr("GPUs"), **slider)
        self.memory = widgets.Dropdown(
            options=list(GPU_MEMORY), value="80 GB (H100)", description=tr("GPU memory"), style=slider["style"]
        )
        self.batch = widgets.SelectionSlider(
            options=[2**i for i in range(3, 12)], value=batch, description=tr("global batch (sequences)"), **slider
        )
        self.seq = widgets.SelectionSlider(
            options=[2**i for i in range(10, 18)], value=seq, description=tr("sequence length"), **slider
        )
        self.out = widgets.HTML()
        self._loading = False
        for c in (self.world, self.memory, self.batch, self.seq):
            c.observe(lambda _change: self.update(), names="value")
        self.preset.observe(lambda change: self.load(change["new"]), names="value")
        controls = widgets.HBox(
            [widgets.VBox([self.preset, self.world, self.memory]), widgets.VBox([self.batch, self.seq])]
        )
        self.widget = widgets.VBox([controls, self.out])
        self.widget.add_class("pb-needs-kernel")  # the site disables these controls until a kernel runs
        self.update()

    def load(self, preset: str) -> None:
        """Take the preset's GPUs, batch and sequence length, then recompute once."""
        _cfg, world, batch, seq = PRESETS[preset]
        self._loading = True
        try:
            self.world.value, self.batch.value, self.seq.value = world, batch, seq
        finally:
            self._loading = False
        self.update()

    def state(self) -> tuple[str, int, int, int, float]:
        return self.preset.value, self.world.value, self.batch.value, self.seq.value, GPU_MEMORY[self.memory.value]

    def ranked(self) -> list[P.Prediction]:
        return _ranked(*self.state(), self.top)

    def title(self) -> str:
        return explorer_title(*self.state())

    def update(self) -> None:
        if self._loading:
            return
        try:
            body = plans_html(self.ranked())
        except ValueError as err:  # no plan can run these sizes: say why
            body = f"<p>{html.escape(str(err))}</p>"
        self.out.value = f"<p><b>{html.escape(self.title())}</b></p>{body}"

    def text(self) -> str:
        try:
            return self.title() + "\n" + plans_text(self.ranked())
        except ValueError as err:
            return self.title() + "\n" + str(err)


def live_state_html(state: dict, top: int = 8) -> str:
    """What the static explorer shows for a state of its form ("preset", "world", "memory": a key of GPU_MEMORY,
    "batch", "seq"): the title and the `top` plans, or why no plan can run these sizes, as the live explorer shows
    them (tests/test_viz_planner.py compares the two). pylib.viz.live runs this in the page."""
    name, world, batch, seq = state["preset"], state["world"], state["batch"], state["seq"]
    memory = GPU_MEMORY[state["memory"]]
    try:
        body = plans_html(_ranked(name, world, batch, seq, memory, top))
    except ValueError as err:  # no plan can run these sizes: say why
        body = f"<p>{html.escape(str(err))}</p>"
    return f"<p><b>{html.escape(explorer_title(name, world, batch, seq, memory))}</b></p>{body}"


def static_explorer(preset: str = DEFAULT):
    """A kernel-free explorer: the live explorer's controls (model, GPUs, GPU memory, global batch, sequence length)
    as a plain HTML form, its first state ranked here and every other ranked in the page by pylib itself
    (`pylib.viz.live`: `live_state_html`, run by Pyodide), so every control works on the static site."""
    from pylib.viz.live import LivePage, select

    powers = [2**i for i in range(3, 12)], [2**i for i in range(10, 18)]
    fields = [
        select("preset", tr("model"), EXPLORER_PRESETS, [preset_label(n) for n in EXPLORER_PRESETS]),
        select("world", tr("GPUs"), WORLD_SIZES),
        select("memory", tr("GPU memory"), list(GPU_MEMORY)),
        select("batch", tr("global batch (sequences)"), powers[0]),
        select("seq", tr("sequence length"), powers[1]),
    ]
    presets = {n: dict(zip(("world", "batch", "seq"), PRESETS[n][1:])) for n in EXPLORER_PRESETS}
    state = {"preset": preset, "memory": "80 GB (H100)", **presets[preset]}
    return LivePage("planner", [("", fields)], presets, state, live_state_html(state))


def _ranked(name: str, world: int, batch: int, seq: int, memory: float, top: int) -> list[P.Prediction]:
    return best_plans(Job(name, world, batch, seq, memory), top)


# ------------------------------------------------------------------------------------------------ calibration, knobs

CALIBRATION_HEADER = ["run", "GPUs", "mesh", "plan chosen", "published", "predicted", "error", "row"]


def calibration_header() -> list[str]:
    """CALIBRATION_HEADER in the reader's language (pylib.i18n)."""
    return [
        tr("run"),
        tr("GPUs"),
        tr("mesh"),
        tr("plan chosen"),
        tr("published"),
        tr("predicted"),
        tr("error"),
        tr("row"),
    ]


def calibration_rows(evaluated) -> list[list[str]]:
    """One row per `calibration.Evaluated`: the run, its GPUs and published mesh, the knobs the planner chose for
    what the source leaves open, TFLOP/s per GPU published and predicted, the error and fit/holdout."""
    rows = []
    for e in evaluated:
        r, plan = e.run, e.plan.plan
        chosen = plan.describe().replace(r.par.describe(), "").replace("SP", "").strip() or "—"
        rows.append(
            [
                r.name,
                f"{r.gpus:,}",
                r.par.describe(),
                chosen,
                f"{r.tflops:.0f}",
                f"{e.predicted_tflops:.0f}",
                f"{e.error:+.1%}",
                "fit" if r.fit else "holdout",
            ]
        )
    return rows


def ranked_sentence(e) -> str:
    """Where a searched run's published mesh ranks (a `calibration.Evaluated` with `search=True`), as a sentence:
    the planner's first choice, or its place and how far behind the first plan."""
    if e.rank == 1:
        return tr(
            "{name}: the published mesh, {par}, is the planner's first choice ({best}).",
            name=e.run.name,
            par=e.run.par.describe(),
            best=e.best.plan.describe(),
        )
    return tr(
        "{name}: the published mesh, {par}, ranks {rank}, {slower:.1%} behind the planner's first choice, {best}.",
        name=e.run.name,
        par=e.run.par.describe(),
        rank=e.rank,
        slower=e.slower_than_best,
        best=e.best.plan.describe(),
    )


KNOB_HEADER = ["change (one knob)", "plan", "memory / GPU", "step", "vs baseline", "what moved most"]


def knob_header() -> list[str]:
    """KNOB_HEADER in the reader's language (pylib.i18n)."""
    return [
        tr("change (one knob)"),
        tr("plan"),
        tr("memory / GPU"),
        tr("step"),
        tr("vs baseline"),
        tr("what moved most"),
    ]


def _terms(x: P.Prediction) -> dict[str, float]:
    """Seconds by term of a prediction (compute, bubble, each exposed axis of the busiest rank)."""
    rank = max(x.ranks, key=lambda r: r.comm_time)
    out = {"compute": x.compute_time, "bubble": x.bubble_time}
    out.update({f"exposed {k}": v for k, v in rank.exposed.items()})
    return out


def knob_rows(base: P.Prediction, changed: list[tuple[str, P.Prediction]], usable: float) -> list[list[str]]:
    """The baseline and one row per single-knob change: the plan, its memory, its step time (only when it fits:
    a plan that does not fit has no step time worth printing), the change against the baseline and the term of
    the cost model that moved most (or the memory, when it decides)."""

    def step(x):
        return _seconds(x.step_time) if x.fits else tr("does not fit (> {memory})", memory=fmt_bytes(usable))

    def term(k: str) -> str:  # a key of `_terms`: "compute", "bubble", "exposed tp", ...
        if k.startswith("exposed "):
            return tr("exposed {axis}", axis=k.removeprefix("exposed "))
        return {"compute": tr("compute"), "bubble": tr("bubble")}.get(k, k)

    rows = [[tr("baseline"), base.plan.describe(), fmt_bytes(base.peak_memory), step(base), "—", "—"]]
    t0 = _terms(base)
    for label, x in changed:
        if not x.fits or not base.fits:
            why = tr("memory {before} → {after}", before=fmt_bytes(base.peak_memory), after=fmt_bytes(x.peak_memory))
            delta = "—"
        else:
            t1 = _terms(x)
            k = max(set(t0) | set(t1), key=lambda k: abs(t1.get(k, 0) - t0.get(k, 0)))
            why = f"{term(k)} {_seconds(t0.get(k, 0))} → {_seconds(t1.get(k, 0))}"
            delta = f"{x.step_time / base.step_time - 1:+.1%}"
        rows.append([label, x.plan.describe(), fmt_bytes(x.peak_memory), step(x), delta, why])
    return rows


# ------------------------------------------------------------------------------------ memory against step time


@functools.lru_cache(maxsize=16)
def feasible_plans(job: Job) -> tuple[P.Prediction, ...]:
    """Every plan of `job` that fits its GPUs, predicted: `planner.enumerate_plans` over `job.space` (the plans
    `best_plans` ranks), kept where the busiest rank's peak memory is within the usable memory (the screen
    `rank_plans` applies first), each through `planner.predict`. Ordered by step time, then peak memory."""
    cfg, work, cluster = job.cfg, job.workload, job.cluster
    plans = P.enumerate_plans(cfg, cluster.world_size, work.batch, work.seq, job.space)
    fits = [p for p in plans if P.peak_memory(cfg, p, work, cluster) <= cluster.usable_memory]
    preds = [P.predict(cfg, p, work, cluster) for p in fits]
    return tuple(sorted(preds, key=lambda x: (x.step_time, x.peak_memory)))


def pareto_front(preds) -> list[P.Prediction]:
    """The plans no other plan beats on both counts: none needs no more memory and takes no more time, and less of
    one. In order of peak memory (step time falling)."""
    front: list[P.Prediction] = []
    for x in sorted(preds, key=lambda x: (x.peak_memory, x.step_time)):
        if not front or x.step_time < front[-1].step_time:
            front.append(x)
    return front


def fig_plan_frontier(preds, chosen: P.Prediction, usable: float, *, title: str | None = None):
    """Every feasible plan as a point, peak memory of its busiest GPU (GB) against predicted step time (s), with
    the Pareto front drawn (`pareto_front`), the chosen plan marked and named, the usable memory as a line."""
    # matplotlib (and numpy with it) only here: the rest of this module runs where neither can be imported
    # (tests/test_torch_free.py; the explorer's formulas)
    from pylib.viz import style

    with style.use():
        return _plan_frontier(style, preds, chosen, usable, title)


def _plan_frontier(style, preds, chosen, usable, title):
    front = pareto_front(preds)
    fig, ax = style.subplots(figsize=(7, 4.2))
    gb = 1e9
    ax.scatter(
        [x.peak_memory / gb for x in preds],
        [x.step_time for x in preds],
        s=14,
        color=style.tint(style.BLUE, 0.35),
        edgecolor="none",
        label=tr("a plan that fits ({n})", n=len(preds)),
        zorder=2,
    )
    ax.plot(
        [x.peak_memory / gb for x in front],
        [x.step_time for x in front],
        color=style.ORANGE,
        lw=1.6,
        marker="o",
        ms=4,
        label=tr("Pareto front ({n} plans)", n=len(front)),
        zorder=3,
    )
    ax.axvline(usable / gb, color=style.MUTED, lw=1, ls="--", zorder=1)
    ax.annotate(
        tr("usable memory {gb:.0f} GB", gb=usable / gb),
        (usable / gb, 1),
        xycoords=("data", "axes fraction"),
        xytext=(-4, -4),
        textcoords="offset points",
        ha="right",
        va="top",
        fontsize=9,
        color=style.MUTED,
    )
    ax.plot(
        chosen.peak_memory / gb,
        chosen.step_time,
        marker="*",
        ms=15,
        color=style.RED,
        markeredgecolor=style.CARD,
        ls="none",
        label=tr("chosen: {plan}", plan=chosen.plan.describe()),
        zorder=4,
    )
    ax.set_yscale("log")  # step times span two orders of magnitude: the slowest plans barely compute
    ax.set_xlabel(tr("peak memory of the busiest GPU (GB)"), fontsize=10)
    ax.set_ylabel(tr("predicted step time (s, log scale)"), fontsize=10)
    ax.tick_params(labelsize=9)
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def fig_moe_memory(labelled: list[tuple[str, P.Prediction]], gpu_memory: float):
    """What each evaluated pipeline rank holds under each of `labelled`'s plans ((label, prediction) pairs), as
    stacked horizontal bars (parameters, gradients, optimizer state, FP8 weight copies where a plan has them,
    activations; GB), the GPU's memory as a line:
    `calibration.moe_layout_check`'s published layout with the report's recomputation and the plan that fits."""
    from pylib.viz import style

    with style.use():
        return _moe_memory(style, labelled, gpu_memory)


def _moe_memory(style, labelled, gpu_memory):
    gb = 1e9
    parts = (
        ("params", tr("parameters"), style.PARAMS),
        ("grads", tr("gradients"), style.GRADS),
        ("optim", tr("optimizer state"), style.OPTIM),
        ("fp8", tr("FP8 weight copies"), style.OCHRE),
        ("activations", tr("activations"), style.PURPLE),
    )
    if not any("fp8" in r.memory for _, x in labelled for r in x.ranks):
        parts = tuple(p for p in parts if p[0] != "fp8")
    bars = [
        (f"{label}\n" + tr("pipeline rank {r}", r=r.pp_rank), {k: r.memory.get(k, 0) for k, _, _ in parts})
        for label, x in labelled
        for r in x.ranks
    ]
    fig, ax = style.subplots(figsize=(7, 0.55 * len(bars) + 1.6))
    ys = list(range(len(bars)))[::-1]
    for key, name, colour in parts:
        left = [sum(m[k] for k, _, _ in parts[: [p[0] for p in parts].index(key)]) / gb for _, m in bars]
        ax.barh(ys, [m[key] / gb for _, m in bars], left=left, color=colour, label=name, height=0.7)
    ax.axvline(gpu_memory / gb, color=style.RED, lw=1.2, ls="--")
    ax.annotate(
        tr("{gb:.0f} GB per GPU", gb=gpu_memory / gb),
        (gpu_memory / gb, 1),
        xycoords=("data", "axes fraction"),
        xytext=(4, -4),
        textcoords="offset points",
        ha="left",
        va="top",
        fontsize=9,
        color=style.RED,
    )
    ax.set_yticks(ys, [name for name, _ in bars], fontsize=9)
    ax.set_xlabel(tr("bytes held by one GPU (GB)"), fontsize=10)
    ax.tick_params(labelsize=9)
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3 if len(parts) > 4 else 4)
    fig.tight_layout()
    return fig
