"""What an instructor plans a course with: how long each lab runs, on what, and what hardware each one needs.

    python -m pylib.labs run --all && python -m pylib.labs run --all --learner   # measure (labs/_runs/)
    python -m pylib.labs times                                                   # -> labs/times.json (committed)

`record_times` keeps, from the harness's two reports, each lab's seconds (solved and learner runs, kernel start
included), its checks, and the machine it ran on (the report's, plus the load average at the time: the
machine is shared). `lab_profiles` reads each lab's hardware needs from the lab itself: its default `world_size`
(gloo processes on CPU; with NCCL one GPU per rank) and its checks that need GPUs (`needs="gpu:N"`).
book/labs/instructor.md shows both (pylib.viz.lab_times draws them).
"""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path

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
