"""The harness's report: one JSON document, a terminal table, and a self-contained HTML page.

report.json (schema "pylib.labs.report/1"):

    {
      "schema": "pylib.labs.report/1",
      "mode": "solution" | "learner",
      "passed": true,                      # no lab failed, timed out or was interrupted (blocked labs do not fail)
      "interrupted": null | "SIGINT" | "SIGTERM",   # the run was stopped while a lab ran (that lab: "interrupted")
      "not_started": [],                   # labs selected but never started (after an interrupt)
      "started": "2026-01-01T12:00:00+00:00", "seconds": 21.4,
      "overrides": {"world_size": 4},      # -p NAME=VALUE given on the command line
      "machine": {"python", "executable", "torch", "platform", "cpus", "cuda_gpus"},
      "out_dir": "labs/_runs/solution",    # where the executed notebooks, checks/ and this report are
      "totals": {"labs": 3, "labs_passed": 3, "checks": {"passed": 20, "failed": 0, "blocked": 1, "not_run": 0}},
      "labs": [
        {
          "lab": "00_collectives", "path": ".../labs/00_collectives.ipynb", "mode": "solution",
          "status": "passed" | "failed" | "timeout" | "blocked" | "interrupted", "seconds": 6.2,
          "executed": ".../00_collectives.ipynb",          # the executed notebook, saved for inspection
          "kernel": {"python", "torch", "cuda_gpus"},        # what the lab's kernel ran on (from begin())
          "parameters": {"world_size": 4, ...},              # the values the lab ran with
          "counts": {"passed": 7, "failed": 0, "blocked": 1, "not_run": 0},   # not_run: checks never reached
          "checks": [
            {"name": "...", "kind": "check" | "step", "status": "passed" | "failed" | "blocked",
             "seconds": 0.12, "message": "...", "detail": "full traceback", "needs": null | "gpu" | "gpu:4",
             "rank": null | 1, "cell": 9, "execution_count": 7, "first_line": "check(...)", "tags": []}
          ],
          "error": null | {"cell", "execution_count", "first_line", "tags", "ename", "evalue", "traceback", "rank"}
        }
      ]
    }

`cell` is the index in the notebook that ran (the source lab in solution mode, the learner version in learner mode;
papermill's injected-parameters cell is not counted); `execution_count` is the In [n] shown in the executed notebook.
`error` is set when a cell raised outside a check (or the lab timed out, was blocked or interrupted); when summary()
raised only because checks failed, the failed checks are the explanation and `error` is null. A lab is *blocked*
when its parameters ask for GPUs this machine lacks (`-p backend=nccl` on a CPU machine): it is not run.
`not_run` counts the check(...) and step(...) calls in cells that never ran (after a cell raised outside a check)
and in the raising cell after the point it raised.
"""

from __future__ import annotations

import datetime
import html
import json
import os
import re
from pathlib import Path

from pylib.i18n import tr

SCHEMA = "pylib.labs.report/1"
_MARK = {"passed": "✓", "failed": "✗", "blocked": "⊘", "timeout": "⏱", "interrupted": "⏹"}
_COUNTS = ("passed", "failed", "blocked", "not_run")
# ExerciseNotDone's message in either language (pylib.i18n: "Exercise {number} not done yet: {what}")
_NOT_DONE = re.compile(r"(?:Exercise (\d+) not done yet: |练习 (\d+) 尚未完成：)(.*)")


def build_report(
    results: list[dict],
    *,
    mode: str,
    overrides: dict,
    started: float,
    seconds: float,
    machine: dict,
    out_dir: Path,
    interrupted: str | None = None,
    not_started: list[str] | None = None,
) -> dict:
    checks = {s: sum(r["counts"].get(s, 0) for r in results) for s in _COUNTS}
    return dict(
        schema=SCHEMA,
        mode=mode,
        passed=interrupted is None and all(r["status"] in ("passed", "blocked") for r in results),
        interrupted=interrupted,
        not_started=list(not_started or []),
        started=datetime.datetime.fromtimestamp(started, datetime.UTC).isoformat(timespec="seconds"),
        seconds=round(seconds, 3),
        overrides=overrides,
        machine=machine,
        out_dir=str(out_dir),
        totals=dict(labs=len(results), labs_passed=sum(r["status"] == "passed" for r in results), checks=checks),
        labs=results,
    )


def lab_line(result: dict) -> str:
    c = result["counts"]
    if result["status"] == "blocked":
        return tr(
            "{mark} {lab}: blocked, {why}", mark=_MARK["blocked"], lab=result["lab"], why=result["error"]["evalue"]
        )
    not_run = tr(", {n} not run", n=c["not_run"]) if c.get("not_run") else ""
    return tr(
        "{mark} {lab}: {status} in {seconds:.1f} s ({passed} passed, {failed} failed, {blocked} blocked{not_run})",
        mark=_MARK.get(result["status"], "?"),
        lab=result["lab"],
        status=status_text(result["status"]),
        seconds=result["seconds"],
        passed=c["passed"],
        failed=c["failed"],
        blocked=c["blocked"],
        not_run=not_run,
    )


def status_text(status: str) -> str:
    """A lab's or a check's status in the current language (the report's JSON keeps the English word)."""
    words = {
        "passed": tr("passed"),
        "failed": tr("failed"),
        "blocked": tr("blocked"),
        "interrupted": tr("interrupted"),
        "timeout": tr("timeout"),
    }
    return words.get(status, status)


def _width(text: str) -> int:
    """Columns a terminal gives `text` (a CJK character takes two)."""
    import unicodedata

    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _where(d: dict) -> str:
    """'cell 9 (In [7]) `check("...", ...)` [exercise]' -- the cell a check or an error belongs to."""
    if d.get("cell") is None and d.get("execution_count") is None:
        return tr("cell ?")
    text = tr("cell {n}", n=d.get("cell"))
    if d.get("execution_count") is not None:
        text += f" (In [{d['execution_count']}])"
    if d.get("first_line"):
        line = d["first_line"]
        text += f" `{line if len(line) <= 70 else line[:67] + '...'}`"
    if d.get("tags"):
        text += f" [{', '.join(d['tags'])}]"
    return text


def terminal_table(report: dict) -> str:
    """A plain-text table: one row per lab, then the totals."""
    rows = [(tr("lab"), tr("status"), tr("passed"), tr("failed"), tr("blocked"), tr("not run"), tr("seconds"))]
    for r in report["labs"]:
        c = r["counts"]
        rows.append(
            (
                r["lab"],
                f"{_MARK.get(r['status'], '?')} {status_text(r['status'])}",
                *(str(c.get(k, 0)) for k in _COUNTS),
                f"{r['seconds']:.1f}",
            )
        )
    t = report["totals"]
    rows.append(
        (
            tr("{passed}/{labs} labs passed", passed=t["labs_passed"], labs=t["labs"]),
            "",
            *(str(t["checks"].get(k, 0)) for k in _COUNTS),
            f"{report['seconds']:.1f}",
        )
    )
    widths = [max(_width(row[i]) for row in rows) for i in range(len(rows[0]))]

    def fmt(row):
        pads = [" " * (w - _width(cell)) for cell, w in zip(row, widths)]
        return "  ".join(cell + pad if i < 2 else pad + cell for i, (cell, pad) in enumerate(zip(row, pads)))

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(rows[0]), rule, *map(fmt, rows[1:-1]), rule, fmt(rows[-1])])


def _indent(text: str, prefix: str = "      ") -> str:
    return "\n".join(prefix + line for line in text.rstrip().splitlines())


def _unfinished_exercises(checks: list[dict]) -> dict[int, tuple[str, int]]:
    """{exercise number: (what to write, how many failed checks it explains)} for failures that only say an
    exercise is not done yet (its own check, and the checks that needed its step)."""
    out: dict[int, tuple[str, int]] = {}
    for c in checks:
        m = _NOT_DONE.search(c["message"].splitlines()[0]) if c["status"] == "failed" and c["message"] else None
        if m:
            n = int(m.group(1) or m.group(2))
            out[n] = (m.group(3).strip(), out.get(n, ("", 0))[1] + 1)
    return out


def failure_text(report: dict, blocked: bool = True) -> str:
    """For every lab that did not pass: the lab, one line per exercise not done yet, each other failed check (cell,
    message, the rank's traceback) and any error outside a check. Blocked checks are listed too (what this
    machine could not run)."""
    parts = []
    for r in report["labs"]:
        if r["status"] == "blocked":
            parts.append(tr("⊘ lab {lab} blocked, {why}", lab=r["lab"], why=r["error"]["evalue"]))
            continue
        if r["status"] != "passed":
            status = status_text(r["status"])
            parts.append(
                tr("✗ lab {lab} {status} (executed notebook: {path})", lab=r["lab"], status=status, path=r["executed"])
            )
            unfinished = _unfinished_exercises(r["checks"])
            for n, (what, count) in sorted(unfinished.items()):
                also = tr(" ({count} checks wait on it)", count=count) if count > 1 else ""
                parts.append(tr("  ✗ exercise {n} not done yet: {what}{also}", n=n, what=what, also=also))
            if r["counts"].get("not_run"):
                parts.append(tr("  … {n} check(s) never ran (the lab stopped before them)", n=r["counts"]["not_run"]))
            for c in r["checks"]:
                first = c["message"].splitlines()[0] if c["message"] else ""
                if c["status"] == "failed" and not _NOT_DONE.search(first):
                    parts.append(tr("  ✗ check {name!r} failed in {where}:", name=c["name"], where=_where(c)))
                    parts.append(_indent(c["message"]))
                    if c.get("rank") is not None and c.get("detail"):
                        parts.append(tr("    rank {rank}'s traceback:", rank=c["rank"]))
                        parts.append(_indent(c["detail"]))
            e = r.get("error")
            if e:
                rank = f" on rank {e['rank']}" if e.get("rank") is not None else ""
                parts.append(f"  ✗ {e['ename']}{rank} in {_where(e)}:")
                parts.append(_indent(e["evalue"]))
                if e.get("traceback") and e.get("rank") is None:
                    parts.append(_indent("\n".join(e["traceback"].splitlines()[-12:])))
        if blocked:
            for c in r["checks"]:
                if c["status"] == "blocked":
                    parts.append(
                        tr("  ⊘ {lab}: check {name!r} blocked: {why}", lab=r["lab"], name=c["name"], why=c["message"])
                    )
    return "\n".join(parts)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; padding: 0 1em;
       color: #333; background: #fff; }
@media (prefers-color-scheme: dark) { body { color: #ddd; background: #1e1e1e; } pre { background: #2a2a2a; } }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border-bottom: 1px solid #8884; padding: .3em .8em; text-align: left; vertical-align: top; }
td.n { text-align: right; }
.passed { color: #2a8a3a; } .failed, .timeout { color: #c0392b; } .blocked { color: #b7791f; }
pre { background: #f4f4f4; padding: .6em; overflow-x: auto; font-size: 85%; }
summary { cursor: pointer; }
"""


def html_page(report: dict) -> str:
    """A self-contained page (inline CSS, no scripts): summary table, then each lab's checks and errors."""
    e = html.escape
    t = report["totals"]
    stopped = ""
    if report.get("interrupted"):
        stopped = tr(
            "<b>Interrupted ({why})</b>; not started: {labs}. ",
            why=e(report["interrupted"]),
            labs=e(", ".join(report["not_started"])),
        )
    m, mode = report["machine"], e(report["mode"])
    checks = t["checks"]
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        "<title>" + tr("Labs report ({mode})", mode=mode) + f"</title><style>{_CSS}</style></head><body>",
        "<h1>"
        + tr(
            "Labs report: {passed}/{labs} labs passed ({mode} mode)", passed=t["labs_passed"], labs=t["labs"], mode=mode
        )
        + "</h1>",
        "<p>"
        + tr(
            "{started}, {seconds:.1f} s. Checks: {passed} passed, {failed} failed, {blocked} blocked (need hardware "
            "this machine lacks), {not_run} never ran. ",
            started=e(report["started"]),
            seconds=report["seconds"],
            passed=checks["passed"],
            failed=checks["failed"],
            blocked=checks["blocked"],
            not_run=checks.get("not_run", 0),
        )
        + stopped
        + tr(
            "Machine: Python {python}, torch {torch}, {cpus} CPUs, {gpus} CUDA GPUs. ",
            python=e(str(m.get("python"))),
            torch=e(str(m.get("torch"))),
            cpus=m.get("cpus"),
            gpus=m.get("cuda_gpus"),
        )
        + tr("Overrides: {overrides}.", overrides=e(json.dumps(report["overrides"])))
        + "</p>",
        "<table><tr>"
        + "".join(
            f"<th>{e(h)}</th>"
            for h in (tr("lab"), tr("status"), tr("passed"), tr("failed"), tr("blocked"), tr("not run"), tr("seconds"))
        )
        + "</tr>",
    ]
    for r in report["labs"]:
        c = r["counts"]
        out.append(
            f"<tr><td><a href='#{e(r['lab'])}'>{e(r['lab'])}</a></td>"
            f"<td class='{e(r['status'])}'>{_MARK.get(r['status'], '?')} {e(status_text(r['status']))}</td>"
            f"<td class='n'>{c['passed']}</td><td class='n'>{c['failed']}</td><td class='n'>{c['blocked']}</td>"
            f"<td class='n'>{c.get('not_run', 0)}</td><td class='n'>{r['seconds']:.1f}</td></tr>"
        )
    out.append("</table>")
    for r in report["labs"]:
        out.append(f"<h2 id='{e(r['lab'])}' class='{e(r['status'])}'>{_MARK.get(r['status'], '?')} {e(r['lab'])}</h2>")
        link = f"<a href='{e(os.path.relpath(r['executed'], report['out_dir']))}'><code>{e(r['executed'])}</code></a>"
        params = f"<code>{e(json.dumps(r['parameters']))}</code>"
        out.append("<p>" + tr("Executed notebook: {link}. Parameters: {params}", link=link, params=params) + "</p>")
        if r.get("error"):
            err = r["error"]
            rank = tr(" on rank {rank}", rank=err["rank"]) if err.get("rank") is not None else ""
            where = tr("{error}{who} in {where}", error=e(err["ename"]), who=e(rank), where=e(_where(err)))
            out.append(f"<p class='failed'>{where}</p>")
            out.append(f"<pre>{e(err['evalue'])}</pre>")
            if err.get("traceback"):
                summary = e(tr("traceback"))
                out.append(f"<details><summary>{summary}</summary><pre>{e(err['traceback'])}</pre></details>")
        head = "".join(f"<th>{e(h)}</th>" for h in ("", tr("check"), tr("cell"), tr("seconds"), tr("message")))
        out.append(f"<table><tr>{head}</tr>")
        for c in r["checks"]:
            msg = f"<pre>{e(c['message'])}</pre>" if c["message"] else ""
            if c["status"] == "failed" and c.get("detail"):
                msg += f"<details><summary>{e(tr('details'))}</summary><pre>{e(c['detail'])}</pre></details>"
            step = " <small>" + e(tr("(step)")) + "</small>" if c.get("kind") == "step" else ""
            out.append(
                f"<tr><td class='{e(c['status'])}'>{_MARK[c['status']]}</td><td>{e(c['name'])}"
                f"{step}</td><td>{e(_where(c))}</td>"
                f"<td class='n'>{c['seconds']:.2f}</td><td>{msg}</td></tr>"
            )
        out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out)


def write_report(report: dict, out_dir: Path) -> tuple[Path, Path]:
    """Write report.json and report.html into `out_dir`; return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out_dir / "report.json", out_dir / "report.html"
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    html_path.write_text(html_page(report))
    return json_path, html_path
