"""The lab format: read a lab's parameters, check their shape, and write the learner version.

A lab is `labs/NN_name.ipynb` (`pylib.labs.files` finds them), stored with outputs stripped. Its cells carry tags
(cell metadata "tags"):

    parameters   exactly one code cell; one `name = literal  # comment` per line, no "=" in the comment (papermill's
                 parser skips such a line: "Unable to parse line n"); papermill injects overrides after it.
                 Every lab has REQUIRED_PARAMETERS; sizes are the lab's own names.
    exercise     a cell the learner completes. Its placeholder raises ExerciseNotDone(n, "what to write").
    solution     right after its exercise: the same definitions, complete, under `if solution:`. The source lab
                 is therefore the solved lab (solution=True); the learner version drops these cells.

The setup cell calls `begin(checks_report)` and the last code cell calls `summary()` (see pylib.labs.checks).
`lab_problems(path)` lists every way a notebook breaks these rules; the tests and `python -m pylib.labs lint` use it.
"""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path

import nbformat

from pylib.i18n import normalise

from .files import LAB_NAME, Lab
from .i18n import translated
from .solutions import LEARNER_LINE, path_for, split, sync_problems
from .solutions import write as write_solutions

REQUIRED_PARAMETERS = ("world_size", "backend", "device", "solution", "checks_report")
EXERCISE_NUMBER = re.compile(r"ExerciseNotDone\(\s*(\d+)")


def tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def first_line(cell) -> str:
    for line in cell.get("source", "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def parameters_cell(nb) -> int | None:
    """Index of the cell tagged `parameters` (the first one), or None."""
    return next((i for i, c in enumerate(nb.cells) if "parameters" in tags(c)), None)


def parameters(nb) -> dict[str, object]:
    """The parameters cell's names and default values (in order); values that are not literals map to their source."""
    i = parameters_cell(nb)
    if i is None:
        return {}
    out: dict[str, object] = {}
    for node in ast.parse(nb.cells[i].source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                out[node.targets[0].id] = ast.unparse(node.value)
    return out


def _parameter_problems(source: str) -> list[str]:
    try:
        body = ast.parse(source).body
    except SyntaxError as exc:
        return [f"the parameters cell does not parse: {exc}"]
    problems = []
    for n, line in enumerate(source.splitlines(), 1):
        if line.count("=") > 1:  # papermill's parameter parser (its `inspect`) skips such a line with a warning
            problems.append(
                f"parameters cell line {n}: one '=' per line (keep '=' out of the comments; papermill cannot parse "
                f"{line.strip()!r})"
            )
    for node in body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            problems.append(
                f"parameters cell line {node.lineno}: only `name = literal` assignments, one per line "
                f"(papermill injects overrides by name), not {ast.unparse(node)!r}"
            )
            continue
        try:
            ast.literal_eval(node.value)
        except ValueError:
            problems.append(f"parameters cell: {node.targets[0].id} = {ast.unparse(node.value)} is not a literal")
    return problems


def _storage_problems(cells) -> list[str]:
    """Stored stripped, every cell with a unique id."""
    problems = []
    dirty = [i for i, c in enumerate(cells) if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))]
    if dirty:
        problems.append(f"code cells {dirty} carry outputs or execution counts (store labs stripped)")
    ids = [c.get("id") for c in cells]
    if None in ids or len(set(ids)) != len(ids):
        problems.append("every cell needs a unique id (nbformat >= 4.5); the harness maps report cells by id")
    return problems


def _parameters_problems(nb) -> list[str]:
    """Exactly one parameters cell, papermill-parsable, with every required name and the right defaults."""
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in tags(c)]
    if len(tagged) != 1:
        return [f"exactly one cell must be tagged 'parameters', found {len(tagged)}"]
    problems = _parameter_problems(nb.cells[tagged[0]].source)
    values = parameters(nb)
    lacking = [p for p in REQUIRED_PARAMETERS if p not in values]
    if lacking:
        problems.append(f"the parameters cell lacks {lacking} (every lab has {list(REQUIRED_PARAMETERS)})")
    elif values["solution"] is not True:
        problems.append("the source lab sets solution = True (it is the solved lab; the learner version flips it)")
    if "checks_report" in values and values["checks_report"] is not None:
        problems.append("checks_report must default to None (the harness passes a file)")
    return problems


def _solution_problems(cells, i: int) -> list[str]:
    cell, problems = cells[i], []
    if i == 0 or not ({"exercise", "solution"} & set(tags(cells[i - 1]))):
        problems.append(f"solution cell {i} must come right after an exercise cell")
    if cell.cell_type == "code" and first_line(cell) != "if solution:":
        problems.append(f"solution cell {i} must start with `if solution:` (so solution=False skips it)")
    if "ExerciseNotDone" in cell.source:
        problems.append(f"solution cell {i} still raises ExerciseNotDone")
    return problems


def _exercise_problems(cells) -> list[str]:
    """Each exercise raises ExerciseNotDone(n, ...) and is followed by its solution; exercises numbered 1..n."""
    problems, numbers = [], []
    for i, cell in enumerate(cells):
        t = tags(cell)
        if "exercise" in t:
            found = EXERCISE_NUMBER.findall(cell.source)
            if not found:
                problems.append(f"exercise cell {i} has no placeholder raising ExerciseNotDone(n, ...)")
            numbers += [int(n) for n in found]
            nxt = cells[i + 1] if i + 1 < len(cells) else None
            if nxt is None or "solution" not in tags(nxt):
                problems.append(f"exercise cell {i} must be followed by its cell tagged 'solution'")
        if "solution" in t:
            problems += _solution_problems(cells, i)
    if not numbers:
        problems.append("a lab has at least one exercise cell (tagged 'exercise')")
    elif sorted(set(numbers)) != list(range(1, max(numbers) + 1)):
        problems.append(f"exercises are numbered 1..n without gaps, found {sorted(set(numbers))}")
    return problems


def _checks_wiring_problems(cells) -> list[str]:
    """A cell calls begin(checks_report) and the last code cell calls summary()."""
    problems = []
    code = [c for c in cells if c.cell_type == "code"]
    if not any(re.search(r"\bbegin\(\s*checks_report\s*\)", c.source) for c in code):
        problems.append("no cell calls begin(checks_report) (checks would not reach the harness)")
    if not code or not re.search(r"\bsummary\(\)", code[-1].source):
        problems.append("the last code cell must call summary() (so a failed check fails the notebook)")
    return problems


def lab_problems(path: Path) -> list[str]:
    """Every way the notebook at `path` breaks the lab format (empty when it is a well-formed lab)."""
    path = Path(path)
    problems = []
    if not LAB_NAME.match(path.name):
        problems.append(f"{path.name}: a lab is named NN_name.ipynb (two digits, lower-case words)")
    try:
        nb = Lab(path).read()  # the solved lab: with its solutions file put back, when it has one
    except Exception as exc:  # noqa: BLE001 - report any unreadable notebook as a problem
        return problems + [f"cannot read the notebook: {exc}"]
    problems += sync_problems(path)
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as exc:
        problems.append(f"invalid notebook: {exc.message}")
    problems += _storage_problems(nb.cells)
    problems += _parameters_problems(nb)
    problems += _exercise_problems(nb.cells)
    problems += _checks_wiring_problems(nb.cells)
    return problems


def strip_outputs(nb) -> nbformat.NotebookNode:
    """A copy with every code cell's outputs and execution count cleared (and papermill's metadata dropped)."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
    nb.metadata.pop("papermill", None)
    return nb


def learner_version(nb) -> nbformat.NotebookNode:
    """The notebook a learner gets: every `solution` cell removed, `solution = False`, outputs stripped."""
    nb = strip_outputs(nb)
    nb.cells = [c for c in nb.cells if "solution" not in tags(c)]
    i = parameters_cell(nb)
    if i is not None:
        nb.cells[i].source = re.sub(r"^solution\s*=.*$", LEARNER_LINE, nb.cells[i].source, flags=re.M)
    nb.metadata["pylib_lab"] = {"version": "learner"}
    return nb


def localised(nb, lang: str, lab: Lab) -> nbformat.NotebookNode:
    """`nb` with its markdown in `lang` (labs/locale catalogs) and its parameters cell's `lang` default set to it;
    code cells otherwise identical."""
    lang = normalise(lang)
    if lang == "en":
        return nb
    nb = translated(nb, lang, lab)
    i = parameters_cell(nb)
    if i is not None:
        nb.cells[i].source = re.sub(r'^lang\s*=\s*"[^"]*"', f'lang = "{lang}"', nb.cells[i].source, flags=re.M)
    return nb


def write_learner_versions(labs: list[Lab], out_dir: Path, lang: str = "en", solved: bool = False) -> list[Path]:
    """Write each lab's learner version (`solved`: the solved lab, stripped) to `out_dir`/<lab>.ipynb, its
    instructions in `lang`; returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for lab in labs:
        dest = out_dir / lab.path.name
        nb = strip_outputs(lab.read()) if solved else learner_version(lab.read())
        nbformat.write(localised(nb, lang, lab), dest)
        written.append(dest)
    return written


_TEMPLATE = [
    ("markdown", [], "# Lab {num}: {title}\n\nWhat the learner builds, and what the checks prove."),
    (
        "code",
        ["parameters"],
        'world_size = 2  # ranks\nbackend = "gloo"  # "gloo" on CPU; "nccl" with one GPU per rank\n'
        'device = "cpu"  # "cpu", or "cuda" (with the nccl backend)\nh = 16  # sizes: tiny on CPU\n'
        "solution = True  # the harness runs the solved lab; the learner version sets False\n"
        'lang = "en"  # "en" or "zh": the language of the messages (the harness passes it)\n'
        "checks_report = None  # the harness passes a file; checks append one JSON line each",
    ),
    (
        "code",
        [],
        "import torch\nimport torch.distributed as dist\n\nfrom pylib.runtime import current_device, launch\n"
        "from pylib.i18n import set_language\n"
        "from pylib.labs.checks import ExerciseNotDone, begin, check, step, summary\n\n"
        "set_language(lang)  # the checks and pylib speak the lab's language\nbegin(checks_report)",
    ),
    ("markdown", [], "## Exercise 1\n\nWhat to write, and the idea behind it."),
    (
        "code",
        ["exercise"],
        'def exercise_1(x):\n    """Say what it returns, with shapes."""\n'
        '    raise ExerciseNotDone(1, "write exercise_1: ...")',
    ),
    (
        "code",
        ["solution"],
        'if solution:\n\n    def exercise_1(x):\n        """Say what it returns."""\n        return x',
    ),
    (
        "code",
        [],
        "def worker(h):\n    x = torch.ones(h, device=current_device())  # the rank's GPU under NCCL, else the CPU\n"
        "    return exercise_1(x * dist.get_rank())\n\n\n"
        'out = step(f"exercise 1 runs on {world_size} ranks", lambda: launch(worker, world_size, h, backend=backend))\n'
        'check("every rank returns its own rank", lambda: [float(o[0]) for o in out] == list(range(world_size)))',
    ),
    ("code", [], "summary()"),
]


def new_lab(path: Path) -> Path:
    """Write a skeleton lab (parameters, setup, one exercise with its solution, a check, the summary) to `path`, stored
    as the labs are: the learner notebook at `path`, its solution in solutions/<name>.json beside it."""
    path = Path(path)
    m = LAB_NAME.match(path.name)
    if m is None:
        raise ValueError(f"{path.name}: a lab is named NN_name.ipynb (two digits, lower-case words)")
    if path.exists():
        raise FileExistsError(f"{path} exists; pick another name")
    num, title = m.group(1), m.group(2).replace("_", " ")
    nb = nbformat.v4.new_notebook()
    for kind, cell_tags, source in _TEMPLATE:
        make = nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell
        cell = make(source.format(num=num, title=title) if kind == "markdown" else source)
        if cell_tags:
            cell.metadata["tags"] = cell_tags
        nb.cells.append(cell)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    learner, sol = split(nb, path.stem)
    if path_for(path).exists():
        raise FileExistsError(f"{path_for(path)} exists; pick another name")
    nbformat.write(learner, path)
    write_solutions(path_for(path), sol)
    return path
