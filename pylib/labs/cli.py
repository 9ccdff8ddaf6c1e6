"""The command line: `python -m pylib.labs run|learner|list|lint|new|split|i18n`.

    python -m pylib.labs run --all                       # every lab, solved, on this machine (what `make book` runs)
    python -m pylib.labs run 00 01 --learner             # the learner versions (their checks must fail)
    python -m pylib.labs run --all -p world_size=8 -p backend=nccl -p device=cuda --timeout 600
    python -m pylib.labs learner /srv/course/labs         # write the learner versions for a JupyterHub
    python -m pylib.labs list                            # labs, their parameters and exercises
    python -m pylib.labs lint                            # check every lab's format (--strip clears outputs)
    python -m pylib.labs new labs/08_my_topic.ipynb      # a skeleton lab in the format
    python -m pylib.labs nbgrader course/                # an nbgrader course: source/<lab>/<lab>.ipynb + config
    python -m pylib.labs grade submitted/ --out gradebook   # every student's notebooks: gradebook.csv and .html
    python -m pylib.labs times                           # labs/times.json from the last run --all (and --learner)
    python -m pylib.labs learner /tmp/solved --solved    # the solved labs, to edit in Jupyter; then
    python -m pylib.labs split /tmp/solved/03_*.ipynb    # store them back: learner notebook + labs/solutions/*.json
    python -m pylib.labs run 00 --lang zh                # the lab in Chinese: instructions and messages
    python -m pylib.labs run 00 --profile traces         # every launch under torch.profiler: traces/<lab>/launch<k>/
    python -m pylib.labs learner /srv/course/zh --lang zh   # the learner versions with Chinese instructions
    python -m pylib.labs i18n extract|check|todo|fill    # the labs' translation catalogs (see pylib.labs.i18n)

`run` exits 0 when every lab passed (or was blocked: it needs GPUs this machine lacks), 1 when any lab failed (the
failures are printed: lab, cell, check, rank and traceback), 2 on a usage error (a bad -p value, --timeout <= 0, a
lab that is not a readable notebook, an --out folder that cannot be written; the message names the value or the
path), 130 / 143 when interrupted by SIGINT / SIGTERM (the report, written after every lab, marks the running lab
`interrupted`).
"""

from __future__ import annotations

import argparse
import ast
import signal
import sys
from pathlib import Path

from pylib.i18n import normalise, set_language, tr

from . import interrupts
from .files import check_readable, default_labs_dir, find_labs, select_labs
from .notebook import (
    EXERCISE_NUMBER,
    lab_problems,
    new_lab,
    parameters,
    strip_outputs,
    tags,
    write_learner_versions,
)


def parse_override(text: str) -> tuple[str, object]:
    """ "world_size=4" -> ("world_size", 4); values are Python literals, anything else is a string ("gloo")."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip().isidentifier():
        raise argparse.ArgumentTypeError(f"-p takes NAME=VALUE, got {text!r}")
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        parsed = value
    return name.strip(), parsed


def positive_seconds(text: str) -> float:
    """--timeout: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--timeout takes seconds, a number > 0, not {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"--timeout must be a finite number of seconds > 0, not {text!r}")
    return value


def _add_run(sub, common) -> None:
    """The `run` command: execute labs with papermill and write a report."""
    run = sub.add_parser("run", parents=[common], help="execute labs with papermill and write a report")
    run.add_argument("labs", nargs="*", help="lab paths, names (00_collectives), numbers (00) or short names")
    run.add_argument("--all", action="store_true", help="every lab in the labs folder")
    mode = run.add_mutually_exclusive_group()
    mode.add_argument(
        "--solution",
        dest="mode",
        action="store_const",
        const="solution",
        help="run the solved labs (default): every check must pass",
    )
    mode.add_argument(
        "--learner",
        dest="mode",
        action="store_const",
        const="learner",
        help="run the learner versions (solutions removed): their checks fail until solved",
    )
    run.set_defaults(mode="solution")
    run.add_argument("--lang", default=None, help="the labs' language: en (default) or zh (passed as -p lang=...)")
    run.add_argument(
        "-p",
        "--parameter",
        dest="overrides",
        action="append",
        type=parse_override,
        default=[],
        metavar="NAME=VALUE",
        help="override a parameters-cell value (repeatable)",
    )
    run.add_argument(
        "--timeout", type=positive_seconds, default=300.0, help="seconds per lab, kernel start included (300)"
    )
    run.add_argument("--out", type=Path, default=None, help="executed notebooks and report (default: labs/_runs/MODE)")
    run.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="run every launch under torch.profiler; traces in DIR/<lab>/launch<k>/ (trace.json: every rank merged)",
    )
    bars = run.add_mutually_exclusive_group()
    bars.add_argument(
        "--progress",
        dest="progress",
        action="store_const",
        const=True,
        help="progress bars even when stderr is not a terminal",
    )
    bars.add_argument("--no-progress", dest="progress", action="store_const", const=False, help="no progress bars")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pylib.labs", description="Run and manage the book's labs.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--labs-dir", type=Path, default=None, help="where the labs are (default: the repo's labs/)")
    sub = p.add_subparsers(dest="command", required=True)

    _add_run(sub, common)

    learner = sub.add_parser("learner", parents=[common], help="write the learner versions of labs to a folder")
    learner.add_argument("out", type=Path, help="folder to write NN_name.ipynb files to")
    learner.add_argument("labs", nargs="*", help="labs to export (default: all)")
    learner.add_argument("--lang", default="en", help="the instructions' language: en (default) or zh")
    learner.add_argument("--solved", action="store_true", help="write the solved labs instead (e.g. with --lang zh)")

    i18n = sub.add_parser("i18n", parents=[common], help="the labs' translation catalogs (labs/locale)")
    i18n_sub = i18n.add_subparsers(dest="i18n_command", required=True)
    i18n_sub.add_parser("extract", parents=[common], help="create or update every lab's catalog from its markdown")
    i18n_check = i18n_sub.add_parser("check", parents=[common], help="0 missing, 0 outdated, markup, terms")
    i18n_check.add_argument("labs", nargs="*", help="labs to check (default: all)")
    i18n_todo = i18n_sub.add_parser("todo", parents=[common], help="entries still to translate, as JSON")
    i18n_todo.add_argument("labs", nargs="*", help="labs (default: all)")
    i18n_fill = i18n_sub.add_parser("fill", parents=[common], help="put translations from a JSON file into a catalog")
    i18n_fill.add_argument("lab")
    i18n_fill.add_argument("json", type=Path)

    sub.add_parser("list", parents=[common], help="list the labs, their parameters and exercises")

    lint = sub.add_parser("lint", parents=[common], help="check that labs follow the lab format")
    lint.add_argument("labs", nargs="*", help="labs to check (default: all)")
    lint.add_argument("--strip", action="store_true", help="first clear outputs and execution counts in place")

    grader = sub.add_parser("nbgrader", parents=[common], help="the labs as nbgrader source notebooks")
    grader.add_argument("out", type=Path, help="course folder: OUT/source/<lab>/<lab>.ipynb, OUT/nbgrader_config.py")
    grader.add_argument("labs", nargs="*", help="labs to export (default: all)")
    grader.add_argument("--timeout", type=int, default=300, help="nbgrader's per-cell timeout in seconds (300)")

    grade = sub.add_parser("grade", help="run many students' notebooks; write gradebook.csv and gradebook.html")
    grade.add_argument("submissions", type=Path, help="SUBMISSIONS/<student>/**/NN_name.ipynb")
    grade.add_argument("--out", type=Path, default=Path("gradebook"), help="where the gradebook goes (./gradebook)")
    grade.add_argument(
        "--timeout", type=positive_seconds, default=300.0, help="seconds per notebook, from its first cell (300)"
    )

    times = sub.add_parser("times", parents=[common], help="record each lab's measured seconds in labs/times.json")
    times.add_argument("--runs", type=Path, default=None, help="where run --all wrote (default: labs/_runs)")

    split = sub.add_parser(
        "split", parents=[common], help="store solved labs in the labs folder: learner notebook + solutions file"
    )
    split.add_argument("solved", nargs="+", type=Path, help="solved NN_name.ipynb files (e.g. from `learner --solved`)")

    new = sub.add_parser("new", help="write a skeleton lab")
    new.add_argument("path", type=Path, help="labs/NN_name.ipynb")
    return p


def _labs(args, names):
    labs = select_labs(names, args.labs_dir) if names else find_labs(args.labs_dir)
    for lab in labs:
        check_readable(lab.path)
    return labs


def check_writable(folder: Path) -> None:
    """Raise ValueError naming `folder` unless it can be created and written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".pylib-write-check"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"--out {folder}: cannot write there ({exc.strerror or exc})") from None


def _run(args) -> int:
    from .report import failure_text, terminal_table
    from .runner import Interrupted, interrupt_on_sigterm, interrupted_report, resolve_overrides, run_labs

    if args.all and args.labs:
        raise ValueError("give lab names or --all, not both")
    labs = _labs(args, args.labs)
    if not labs:
        raise ValueError(f"no labs found in {args.labs_dir or default_labs_dir()}")
    labs_dir = args.labs_dir or default_labs_dir()
    out = args.out or (Path(labs_dir) / "_runs" / args.mode)
    overrides = dict(args.overrides)
    if args.lang is not None:
        overrides["lang"] = normalise(args.lang)
        set_language(overrides["lang"])  # the terminal summary and failures in the labs' language
    resolve_overrides(labs, overrides)  # reject unknown names and ill-typed values before anything runs
    check_writable(Path(out))
    mode = tr("solution") if args.mode == "solution" else tr("learner")
    if overrides:
        text = tr(
            "running {n} lab(s) in {mode} mode with {overrides}; executed notebooks and report in {out}",
            n=len(labs),
            mode=mode,
            overrides=overrides,
            out=out,
        )
    else:
        text = tr(
            "running {n} lab(s) in {mode} mode; executed notebooks and report in {out}", n=len(labs), mode=mode, out=out
        )
    print(text, flush=True)
    try:
        with interrupt_on_sigterm():
            report = run_labs(
                labs,
                mode=args.mode,
                overrides=overrides,
                out_dir=out,
                timeout=args.timeout,
                progress=args.progress,
                profile_dir=args.profile,
            )
    except Interrupted as stop:
        report = getattr(stop, "report", None)
        if report is None:  # interrupted before the first lab started: every lab is listed as not started
            report = interrupted_report(labs, args.mode, overrides, Path(out), stop)
        if report is not None:
            print()
            print(terminal_table(report))
            print(tr("report: {json} and {html}", json=Path(out) / "report.json", html=Path(out) / "report.html"))
        print(tr("INTERRUPTED ({why}): the report marks the running lab 'interrupted'", why=stop), file=sys.stderr)
        return 128 + stop.signum
    json_path, html_path = Path(out) / "report.json", Path(out) / "report.html"
    print()
    print(terminal_table(report))
    details = failure_text(report)
    if details:
        print(details, file=sys.stderr if not report["passed"] else sys.stdout, flush=True)
    print(tr("report: {json} and {html}", json=json_path, html=html_path))
    if not report["passed"]:
        bad = [r["lab"] for r in report["labs"] if r["status"] not in ("passed", "blocked")]
        print(
            tr(
                "FAILED: {bad} of {n} lab(s) did not pass ({mode} mode): {names}",
                bad=len(bad),
                n=len(labs),
                mode=mode,
                names=", ".join(bad),
            ),
            file=sys.stderr,
        )
        return _exit_noted(1)
    return _exit_noted(0)


def _exit_noted(code: int) -> int:
    """128 + the signal noted after the report was written (the run is done, the report complete), else `code`."""
    signum = interrupts.pending()
    if signum is None:
        return code
    print(tr("INTERRUPTED ({why}) after the report was written", why=signal.Signals(signum).name), file=sys.stderr)
    return 128 + signum


def _list(args) -> int:
    for lab in find_labs(args.labs_dir):
        nb = lab.read()
        numbers = sorted({int(n) for c in nb.cells if "exercise" in tags(c) for n in EXERCISE_NUMBER.findall(c.source)})
        params = ", ".join(f"{k}={v!r}" for k, v in parameters(nb).items() if k != "checks_report")
        print(f"{lab.name}: {len(numbers)} exercise(s); parameters: {params}")
    return 0


def _lint(args) -> int:
    import nbformat

    bad = 0
    for lab in _labs(args, args.labs):
        if args.strip:
            nbformat.write(strip_outputs(lab.read_stored()), lab.path)
        problems = lab_problems(lab.path)
        bad += bool(problems)
        print(f"{'✗' if problems else '✓'} {lab.name}")
        for problem in problems:
            print(f"    {problem}")
    return 1 if bad else 0


def _times(args) -> int:
    """labs/times.json from the last `run --all` and `run --all --learner` (their report.json files)."""
    import json

    from .course import record_times, times_path

    runs = Path(args.runs or Path(args.labs_dir or default_labs_dir()) / "_runs")
    try:
        reports = [json.loads((runs / mode / "report.json").read_text()) for mode in ("solution", "learner")]
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{runs}: run --all and run --all --learner first ({exc})") from None
    path = times_path(args.labs_dir)
    path.write_text(json.dumps(record_times(*reports), indent=1) + "\n")
    print(path)
    return 0


def _split(args) -> int:
    """Each solved notebook becomes labs/NN_name.ipynb (the learner version) and labs/solutions/NN_name.json."""
    import nbformat

    from . import solutions
    from .files import LAB_NAME

    labs_dir = Path(args.labs_dir or default_labs_dir())
    for path in args.solved:
        check_readable(path)
        if not LAB_NAME.match(path.name):
            raise ValueError(f"{path.name}: a lab is named NN_name.ipynb (two digits, lower-case words)")
        learner, sol = solutions.split(strip_outputs(nbformat.read(path, as_version=4)), path.stem)
        if not sol["cells"]:
            raise ValueError(f"{path}: no cell tagged 'solution' (split takes the solved lab)")
        nbformat.write(learner, labs_dir / path.name)
        print(labs_dir / path.name)
        print(solutions.write(solutions.path_for(labs_dir / path.name), sol))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command != "run":  # only `run` writes a report: the other commands take Ctrl-C as Python does
        if interrupts.pending() is not None:
            return 128 + interrupts.pending()
        interrupts.stop_noting()
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "learner":
            lang = normalise(args.lang)
            for path in write_learner_versions(_labs(args, args.labs), args.out, lang=lang, solved=args.solved):
                print(path)
            return 0
        if args.command == "list":
            return _list(args)
        if args.command == "i18n":
            from .i18n import main as i18n_main

            return i18n_main(args)
        if args.command == "lint":
            return _lint(args)
        if args.command == "nbgrader":
            from .nbgrader import export

            for path in export(_labs(args, args.labs), args.out, timeout=args.timeout):
                print(path)
            return 0
        if args.command == "grade":
            from .gradebook import grade

            check_writable(args.out)
            rows = grade(args.submissions, args.out, timeout=args.timeout)
            passed = sum(r["status"] == "passed" for r in rows)
            csv_path, html_path = args.out / "gradebook.csv", args.out / "gradebook.html"
            print(
                tr(
                    "{passed} of {n} notebook(s) passed; gradebook: {csv} and {html}",
                    passed=passed,
                    n=len(rows),
                    csv=csv_path,
                    html=html_path,
                )
            )
            return 0
        if args.command == "times":
            return _times(args)
        if args.command == "split":
            return _split(args)
        print(new_lab(args.path))
        return 0
    except (ValueError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
