"""The labs' solutions, kept apart from the notebooks learners open.

A lab is stored as two files:

    labs/NN_name.ipynb            the learner version: every exercise, no solution cell, `solution = False`
    labs/solutions/NN_name.json   its solution cells, each naming (by cell id) the cell it follows

so that a launch link, which clones the repository and opens `labs/NN_name.ipynb`, opens a notebook without the
answers. `solved(learner, solutions)` puts the cells back (right after the exercise each names, `solution = True`)
and gives the solved lab the harness runs in CI and the book's build; `split(solved)` is its inverse, and what
`python -m pylib.labs new` and `solutions split` write. `Lab.read()` (pylib.labs.files) returns the solved lab
whenever a solutions file sits beside the notebook, so everything downstream (the runner, the translations, the
nbgrader export) sees one solved notebook, and `sync_problems` says where the two files disagree.

The solutions file is JSON: {"lab": "NN_name", "cells": [{"after": "<exercise cell id>", "cell": {<nbformat cell>}},
...]}, in notebook order, each cell's source a list of lines as in an .ipynb file.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import nbformat

FOLDER = "solutions"
SOLVED_LINE = "solution = True  # the harness runs the solved lab; the learner version sets False"
LEARNER_LINE = "solution = False  # the learner version: complete the exercise cells"
_SOLUTION_LINE = re.compile(r"^solution\s*=.*$", re.M)


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _set_solution_line(nb, line: str) -> None:
    cell = next((c for c in nb.cells if "parameters" in _tags(c)), None)
    if cell is not None:
        cell.source = _SOLUTION_LINE.sub(line, cell.source)


def path_for(notebook: Path) -> Path:
    """Where the solutions of the notebook at `notebook` are kept: `solutions/<stem>.json` beside it."""
    notebook = Path(notebook)
    return notebook.parent / FOLDER / f"{notebook.stem}.json"


def read(path: Path) -> dict:
    """A solutions file; ValueError naming the file when it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the solutions file: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise ValueError(f"{path}: a solutions file is {{'lab': ..., 'cells': [{{'after': id, 'cell': ...}}]}}")
    for n, entry in enumerate(data["cells"]):
        ok = isinstance(entry, dict) and isinstance(entry.get("after"), str) and isinstance(entry.get("cell"), dict)
        if not ok:
            raise ValueError(f"{path}: entry {n} needs 'after' (a cell id) and 'cell' (a notebook cell)")
    return data


def write(path: Path, solutions: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(solutions, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
    return path


def split(solved_nb, lab: str) -> tuple[nbformat.NotebookNode, dict]:
    """(learner notebook, solutions) from a solved lab: each `solution` cell leaves the notebook and is recorded
    with the id of the cell before it; the parameters cell says `solution = False`."""
    learner = copy.deepcopy(solved_nb)
    cells, entries = [], []
    for cell in learner.cells:
        if "solution" in _tags(cell):
            if not cells:
                raise ValueError(f"{lab}: a solution cell cannot be the notebook's first cell")
            stored = {**cell, "source": cell.source.splitlines(keepends=True)}  # one line a row, as .ipynb stores it
            entries.append({"after": cells[-1].get("id"), "cell": stored})
        else:
            cells.append(cell)
    learner.cells = cells
    _set_solution_line(learner, LEARNER_LINE)
    learner.metadata["pylib_lab"] = {"version": "learner"}
    return learner, {"lab": lab, "cells": entries}


def solved(learner_nb, solutions: dict, where: str = "the lab") -> nbformat.NotebookNode:
    """The solved lab: each solution cell put back right after the cell it names, `solution = True`. Raises
    ValueError naming the cell id when a solution names a cell the notebook lacks, or when the notebook already
    carries solution cells (then it is a solved lab and needs no solutions file)."""
    nb = copy.deepcopy(learner_nb)
    if any("solution" in _tags(c) for c in nb.cells):
        raise ValueError(f"{where}: the notebook already has cells tagged 'solution' and a solutions file too")
    after: dict[str, list] = {}
    for entry in solutions["cells"]:
        cell = copy.deepcopy(entry["cell"])
        if isinstance(cell.get("source"), list):
            cell["source"] = "".join(cell["source"])
        after.setdefault(entry["after"], []).append(nbformat.from_dict(cell))
    ids = {c.get("id") for c in nb.cells}
    missing = [i for i in after if i not in ids]
    if missing:
        raise ValueError(f"{where}: solutions follow cell id(s) {missing}, which the notebook does not have")
    cells = []
    for cell in nb.cells:
        cells.append(cell)
        cells += after.get(cell.get("id"), [])
    nb.cells = cells
    _set_solution_line(nb, SOLVED_LINE)
    nb.metadata.pop("pylib_lab", None)
    return nb


def sync_problems(notebook: Path) -> list[str]:
    """Where a learner notebook and its solutions file disagree (empty when they agree, or when the notebook has no
    solutions file): each solution follows an exercise cell (or another solution) and defines, under
    `if solution:`, what that exercise leaves undone; the notebook holds no solution and says `solution = False`;
    splitting the solved lab again gives back both files exactly."""
    notebook = Path(notebook)
    sol_path = path_for(notebook)
    if not sol_path.exists():
        return []
    try:
        stored = nbformat.read(notebook, as_version=4)
        data = read(sol_path)
        nb = solved(stored, data, str(notebook))
    except ValueError as exc:
        return [str(exc)]
    problems = []
    by_id = {c.get("id"): c for c in stored.cells}
    for n, entry in enumerate(data["cells"]):
        before = by_id.get(entry["after"])
        if before is not None and "exercise" not in _tags(before):
            problems.append(f"{sol_path.name}: solution {n} follows cell {entry['after']!r}, not an exercise cell")
        if "solution" not in entry["cell"].get("metadata", {}).get("tags", []):
            problems.append(f"{sol_path.name}: solution {n} (cell {entry['cell'].get('id')!r}) is not tagged solution")
    params = next((c.source for c in stored.cells if "parameters" in _tags(c)), "")
    if not re.search(r"^solution\s*=\s*False\b", params, re.M):
        problems.append(f"{notebook.name}: the learner notebook's parameters cell must say `solution = False`")
    learner, again = split(nb, notebook.stem)
    if again["cells"] != data["cells"]:
        problems.append(f"{sol_path.name}: not what splitting the solved lab gives (cell order or content differs)")
    if nbformat.writes(learner) != nbformat.writes(stored):
        problems.append(f"{notebook.name}: not the learner version of its solved lab (re-split the lab)")
    return problems
