"""What an instructor plans a course with: how long each lab runs, on what, and what hardware each one needs.

    python -m pylib.labs run --all && python -m pylib.labs run --all --learner   # measure (labs/_runs/)
    python -m pylib.labs times                                                   # -> labs/times.json (committed)

`record_times` keeps, from the harness's two reports, each lab's seconds (solved and learner runs, kernel start
included), its checks, and the machine it ran on (the report's, plus the load average at the time: the
machine is shared). `lab_profiles` reads each lab's hardware needs from the lab itself: its default `world_size`
(gloo processes on CPU; with NCCL one GPU per rank) and its checks that need GPUs (`needs="gpu:N"`).
book/labs/instructor.md shows both (`course_table`, `plot_times`).
"""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path

from pylib.i18n import tr

from .files import Lab, default_labs_dir, find_labs
from .notebook import parameters

TIMES_FILE = "times.json"  # in the labs folder


def times_path(labs_dir: Path | None = None) -> Path:
    return Path(labs_dir or default_labs_dir()) / TIMES_FILE


def record_times(solution: dict, learner: dict) -> dict:
    """labs/times.json's content from the harness's solution and learner reports (report.json, see
    pylib.labs.report). Refuses reports that did not run the same labs, or a solution run that did not pass."""
    if solution.get("mode") != "solution" or learner.get("mode") != "learner":
        raise ValueError("record_times takes a solution-mode report and a learner-mode report, in that order")
    if not solution["passed"]:
        raise ValueError("the solution run did not pass: measure the labs when every one passes")
    sol = {r["lab"]: r for r in solution["labs"]}
    lrn = {r["lab"]: r for r in learner["labs"]}
    if set(sol) != set(lrn):
        raise ValueError(f"the reports ran different labs: {sorted(set(sol) ^ set(lrn))}")
    machine = {k: solution["machine"].get(k) for k in ("platform", "cpus", "python", "torch", "cuda_gpus")}
    machine["load_average_1min"] = round(os.getloadavg()[0], 1)
    labs = {
        name: dict(
            solution_seconds=round(sol[name]["seconds"], 1),
            learner_seconds=round(lrn[name]["seconds"], 1),
            checks=sum(sol[name]["counts"][k] for k in ("passed", "failed", "blocked")),
            blocked=sol[name]["counts"]["blocked"],
        )
        for name in sorted(sol)
    }
    return dict(measured=solution["started"][:10], overrides=solution.get("overrides", {}), machine=machine, labs=labs)


def read_times(labs_dir: Path | None = None) -> dict:
    return json.loads(times_path(labs_dir).read_text())


def _gpu_needs(nb) -> list[str]:
    """The `needs=` of every check in the lab that asks for GPUs, as written ("gpu:{world_size}" resolved)."""
    ranks = parameters(nb).get("world_size")
    found = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "needs":
                text = ast.unparse(node.value).strip("f\"'")
                found.append(re.sub(r"\{world_size\}", str(ranks), text))
    return found


def lab_profiles(labs: list[Lab] | None = None) -> dict[str, dict]:
    """Per lab: `ranks` (its default world_size: processes on CPU, GPUs under NCCL) and `gpu_checks` (the needs of
    its checks that need GPUs, blocked without them)."""
    out = {}
    for lab in labs if labs is not None else find_labs():
        nb = lab.read()
        out[lab.name] = dict(ranks=parameters(nb)["world_size"], gpu_checks=_gpu_needs(nb))
    return out


def course_table(times: dict, profiles: dict[str, dict]) -> str:
    """tbl-labs-times: one row per lab: its ranks (processes on CPU, GPUs under NCCL), seconds solved and as the
    learner gets it, the checks that need GPUs."""
    from pylib.tables import markdown_table

    if set(times["labs"]) != set(profiles):
        raise ValueError(f"labs/times.json and the labs differ: {sorted(set(times['labs']) ^ set(profiles))}")
    rows = []
    for name in sorted(profiles):
        t, p = times["labs"][name], profiles[name]
        gpu = ", ".join(f"`{n}`" for n in p["gpu_checks"]) or tr("none")
        rows.append([f"`{name}`", p["ranks"], f"{t['solution_seconds']:.0f}", f"{t['learner_seconds']:.0f}", gpu])
    header = [
        tr("lab"),
        tr("ranks (GPUs under NCCL)"),
        tr("solved run (s)"),
        tr("learner run (s)"),
        tr("checks that need GPUs"),
    ]
    caption = tr(
        "Each lab on {cpus} CPU cores ({torch}, gloo), measured {date}, kernel start included",
        cpus=times["machine"]["cpus"],
        torch=f"torch {times['machine']['torch']}",
        date=times["measured"],
    )
    return markdown_table(header, rows, caption, "tbl-labs-times")


def plot_times(times: dict):
    """Horizontal bars: each lab's seconds, solved and learner runs."""
    from pylib.viz import style

    names = sorted(times["labs"])
    solved = [times["labs"][n]["solution_seconds"] for n in names]
    learner = [times["labs"][n]["learner_seconds"] for n in names]
    with style.use():  # every text in the book's fonts (the CJK one in the Chinese edition)
        fig, ax = style.subplots(figsize=(6.4, 0.32 * len(names) + 1.2), grid="x")
        ys = range(len(names))
        bar = dict(height=0.4)
        ax.barh([y - 0.2 for y in ys], solved, color=style.rank_colour(0), label=tr("solved"), **bar)
        ax.barh([y + 0.2 for y in ys], learner, color=style.rank_colour(1), label=tr("as the learner gets it"), **bar)
        ax.set_yticks(list(ys), names)
        ax.invert_yaxis()
        ax.set_xlabel(tr("seconds on {cpus} CPU cores", cpus=times["machine"]["cpus"]))
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
        fig.tight_layout()
    return fig
