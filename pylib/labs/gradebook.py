"""Grade many students' lab notebooks: `python -m pylib.labs grade SUBMISSIONS/`.

    SUBMISSIONS/<student>/**/NN_name.ipynb      e.g. alice/00_collectives.ipynb, or nbgrader's
                                                submitted/<student>/<lab>/<lab>.ipynb (pass submitted/)

Each notebook runs as the harness runs a learner's lab (papermill, a fresh kernel, `pylib.labs.runner.run_lab` in
learner mode: no solution is added), with a time limit counted from its first cell, and becomes one row of
`gradebook.csv` and `gradebook.html` in the output folder: student, lab, status, checks passed / failed / blocked /
not run, seconds, and the reason it did not pass (the first exercise not done, the first failed check, or the error:
a timeout, a kernel that died, a notebook that is not one). The executed notebooks go to OUT/<student>/.

What protects what:

- each submission runs in its own temporary copy of its folder (its working directory), removed afterwards, so
  files it writes there or in `..` land in the copy, never in SUBMISSIONS/ or beside another student's work;
- a cell that loops is stopped at the time limit and its kernel's whole process group killed (ranks included);
- a kernel that exits or is killed ends that submission only ("failed", the reason named); the next one runs;
- text from a notebook (names, messages) is escaped in the HTML page.

What is not sandboxed: the code runs as the grading user, with that user's files, network and processes. A
notebook can write to an absolute path, read other files, or start a process in its own session that outlives the
kernel. For untrusted submissions run the grader inside a container or as an unprivileged user with nothing else
to reach (nbgrader's autograde has the same limits).
"""

from __future__ import annotations

import csv
import html
import shutil
import tempfile
from pathlib import Path

from .files import LAB_NAME, Lab, check_readable
from .report import _NOT_DONE

COLUMNS = ("student", "lab", "status", "passed", "failed", "blocked", "not_run", "seconds", "reason")


def find_submissions(root: Path) -> list[tuple[str, Path]]:
    """(student, notebook) for every NN_name.ipynb under root/<student>/, in order. ValueError when there is none."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"the submissions folder {root} is not a folder")
    found = []
    for student in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for path in sorted(student.rglob("*.ipynb")):
            if LAB_NAME.match(path.name) and ".ipynb_checkpoints" not in path.parts:
                found.append((student.name, path))
    if not found:
        raise ValueError(f"no NN_name.ipynb under {root}/<student>/ (one folder per student)")
    return found


def _reason(result: dict) -> str:
    """Why a lab did not pass, in one line: its error, else the first exercise not done, else the first failed
    check."""
    error = result.get("error")
    if error:
        text = error["evalue"].strip().splitlines()[0] if error["evalue"].strip() else ""
        return text if text.startswith(error["ename"]) else f"{error['ename']}: {text}"
    failed = [c for c in result["checks"] if c["status"] == "failed"]
    for check in failed:
        m = _NOT_DONE.search(check["message"] or "")
        if m:
            return m.group(0).splitlines()[0]
    if failed:
        first = failed[0]
        return f"{first['name']}: {(first['message'] or '').strip().splitlines()[0] if first['message'] else ''}"
    return ""


def _unreadable(student: str, path: Path, why: str) -> dict:
    counts = dict(passed=0, failed=0, blocked=0, not_run=0)
    return dict(student=student, lab=path.stem, status="failed", **counts, seconds=0.0, reason=why)


def grade_one(student: str, path: Path, out_dir: Path, timeout: float) -> dict:
    """Run one submission in a temporary copy of its folder; its gradebook row."""
    from .runner import run_lab

    try:
        check_readable(path)
    except ValueError as exc:
        return _unreadable(student, path, str(exc))
    scratch = Path(tempfile.mkdtemp(prefix="pylib-grade-"))
    try:
        copy = scratch / student
        shutil.copytree(path.parent, copy, symlinks=True, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        lab = Lab(copy / path.name)
        result = run_lab(lab, mode="learner", out_dir=Path(out_dir) / student, timeout=timeout, cells_only=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    counts = result["counts"]
    return dict(
        student=student,
        lab=lab.name,
        status=result["status"],
        passed=counts["passed"],
        failed=counts["failed"],
        blocked=counts["blocked"],
        not_run=counts["not_run"],
        seconds=round(result["seconds"], 1),
        reason="" if result["status"] == "passed" else _reason(result),
    )


def grade(root: Path, out_dir: Path, timeout: float = 300.0, echo=print) -> list[dict]:
    """Grade every submission under `root`; write out_dir/gradebook.csv and gradebook.html after each; the rows."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for student, path in find_submissions(root):
        row = grade_one(student, path, out_dir, timeout)
        rows.append(row)
        write(rows, out_dir)
        echo(f"{student:<16} {row['lab']:<34} {row['status']:<8} {row['passed']:>3} passed  {row['reason']}")
    return rows


def write(rows: list[dict], out_dir: Path) -> tuple[Path, Path]:
    """gradebook.csv (COLUMNS) and gradebook.html (one self-contained table) in out_dir."""
    csv_path, html_path = Path(out_dir) / "gradebook.csv", Path(out_dir) / "gradebook.html"
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    head = "".join(f"<th>{c.replace('_', ' ')}</th>" for c in COLUMNS)
    body = "".join(
        f'<tr class="{html.escape(r["status"])}">'
        + "".join(f"<td>{html.escape(str(r[c]))}</td>" for c in COLUMNS)
        + "</tr>"
        for r in rows
    )
    html_path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>Gradebook</title><style>"
        "body{font-family:sans-serif}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}"
        "tr.passed td:nth-child(3){color:#070}tr.failed td:nth-child(3),tr.timeout td:nth-child(3){color:#a00}"
        f"</style></head><body><h1>Gradebook</h1><table><tr>{head}</tr>{body}</table></body></html>\n"
    )
    return csv_path, html_path
