"""Export the labs as nbgrader source notebooks: `python -m pylib.labs nbgrader OUT/`.

OUT/ becomes an nbgrader course folder: `OUT/source/<lab>/<lab>.ipynb` for each lab, and `OUT/nbgrader_config.py`.
In each notebook (the solved lab, from the learner notebook and its solutions):

- an exercise cell and its solution cell become one *autograded answer* cell: the exercise's placeholder (what the
  learner starts from) followed by the solution, un-indented from `if solution:`, between `### BEGIN SOLUTION` and
  `### END SOLUTION`. `nbgrader generate_assignment` replaces that region by the config's stub (`pass`), so the
  student sees the placeholder and its checks fail "not done yet", as in the learner notebook;
- each cell that records checks becomes an *autograder test* cell, locked, worth one point per `check(...)` /
  `step(...)` call in it that does not need a GPU (a check with `needs=` is blocked on a CPU grader, so it is not
  graded; a cell holding only such checks is locked and worth nothing). The cell ends with `cell_points(n)`, whose
  value, n times the share of the cell's gradable checks that passed, is nbgrader's partial credit;
- every other cell is locked (read-only), the parameters cell included.

The kernel that grades needs this package and torch, as the labs do (see labs/README.md).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import nbformat

from .files import Lab
from .notebook import tags

SCHEMA = 3
CONFIG = """\
# nbgrader's configuration for the labs exported by `python -m pylib.labs nbgrader`.
c = get_config()  # noqa: F821 - nbgrader's config loader defines it
c.CourseDirectory.root = {root!r}
# The exercise placeholder above the solution region stays in the released notebook; the region becomes `pass`.
c.ClearSolutions.code_stub = {{"python": "# YOUR CODE HERE: complete the exercise above\\npass"}}
c.ExecutePreprocessor.timeout = {timeout}
"""


def _gradable_checks(source: str) -> tuple[int, int]:
    """(checks in the cell, those without `needs=`): calls of check(...) and step(...), a decorator included."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return 0, 0
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) in ("check", "step")]
    return len(calls), sum(not any(k.arg == "needs" for k in c.keywords) for c in calls)


def _meta(cell, grade_id: str, *, grade: bool, solution: bool, locked: bool, points: int | None = None) -> None:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": SCHEMA, "solution": solution}
    if points is not None:
        meta["points"] = points
    cell.metadata["nbgrader"] = meta


def _answer(exercise, solution) -> str:
    body = solution.source.split("\n", 1)[1] if "\n" in solution.source else ""  # drop `if solution:`
    body = textwrap.dedent(body).strip("\n")
    return f"{exercise.source.rstrip()}\n\n### BEGIN SOLUTION\n{body}\n### END SOLUTION"


def nbgrader_notebook(lab: Lab) -> nbformat.NotebookNode:
    """The lab as an nbgrader source notebook (see the module's docstring)."""
    nb = lab.read()
    cells, skip = [], set()
    for i, cell in enumerate(nb.cells):
        if i in skip:
            continue
        cid = cell.get("id") or f"cell-{i}"
        if "exercise" in tags(cell):
            solution = nb.cells[i + 1]
            skip.add(i + 1)
            cell.source = _answer(cell, solution)
            _meta(cell, f"exercise-{cid}", grade=False, solution=True, locked=False)
        elif cell.cell_type == "code" and _gradable_checks(cell.source)[0]:
            _, gradable = _gradable_checks(cell.source)
            if gradable:
                cell.source = f"{cell.source.rstrip()}\n\ncell_points({gradable})  # nbgrader's partial credit"
                _meta(cell, f"checks-{cid}", grade=True, solution=False, locked=True, points=gradable)
            else:
                _meta(cell, f"locked-{cid}", grade=False, solution=False, locked=True)
        else:
            _meta(cell, f"locked-{cid}", grade=False, solution=False, locked=True)
        cells.append(cell)
    setup = next(c for c in cells if "begin(checks_report)" in c.source)
    graded = "from pylib.labs.checks import cell_points  # the test cells' partial credit\n\nbegin(checks_report)"
    setup.source = setup.source.replace("begin(checks_report)", graded, 1)
    nb.cells = cells
    nb.metadata.pop("pylib_lab", None)
    return nb


def export(labs: list[Lab], out: Path, timeout: int = 300) -> list[Path]:
    """Write each lab to out/source/<lab>/<lab>.ipynb and out/nbgrader_config.py; return the notebooks' paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "nbgrader_config.py").write_text(CONFIG.format(root=str(out.resolve()), timeout=int(timeout)))
    written = []
    for lab in labs:
        dest = out / "source" / lab.name / f"{lab.name}.ipynb"
        dest.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nbgrader_notebook(lab), dest)
        written.append(dest)
    return written
