"""The package's layering, read from the source, as ARCHITECTURE.md states it: each package imports only the packages
its row of `ALLOWED` names; no two pylib modules import each other, directly or round a longer loop; the core (the
modes and what they stand on) imports nothing of the book side; `pylib.i18n` is the leaf every layer may ask for the
reader's words; `pylib.viz` only draws (it never launches ranks).

Imports are read with `ast` from every file, imports inside functions included (an import moved into a function
still ties the two modules together), relative imports resolved."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PYLIB = Path(__file__).resolve().parents[1] / "pylib"
MODES = ("tp", "cp", "ep", "pp", "dp")
# The core: the modes and what they stand on, then what stacks and predicts them. Nothing here is the book's.
CORE = ("plan", "model", "runtime", *MODES, "compose", "analysis")
# The book side: what prints tables, draws figures, runs the book's evidence, checks the seeds and runs the labs.
BOOK_SIDE = ("tables", "seedcheck", "viz", "experiments", "labs")


def module_name(path: Path) -> str:
    parts = path.relative_to(PYLIB.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: str, module: str, is_package: bool = False) -> list[tuple[str, str | None, int]]:
    """(module, name, line) for every import in `source` (name None for `import x`), at any depth (inside functions
    too); relative imports made absolute against `module` (a package's own name when `is_package`)."""
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out += [(base, a.name, node.lineno) for a in node.names]
    return out


def _files(unit: str) -> list[Path]:
    """The files of one top-level part of pylib: a package's folder, or a module's one file."""
    folder = PYLIB / unit
    return sorted(folder.rglob("*.py")) if folder.is_dir() else [PYLIB / f"{unit}.py"]


def units() -> list[str]:
    """The top-level parts of pylib: every sub-package and every module beside `__init__.py`."""
    found = [p.name for p in PYLIB.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    found += [p.stem for p in PYLIB.glob("*.py") if p.stem != "__init__"]
    return sorted(found)


def _all_files() -> list[Path]:
    return sorted(PYLIB.rglob("*.py"))


# ------------------------------------------------------------------------------------------------ viz only draws


def launches(source: str, module: str, is_package: bool = False) -> list[str]:
    """What in `source` starts ranks: an import of the launcher, or a call of anything named `launch`."""
    found = []
    for mod, name, _ in imports(source, module, is_package):
        full = f"{mod}.{name}" if name else mod
        if full.startswith("pylib.runtime.launch") or (mod == "pylib.runtime" and name == "launch"):
            found.append(f"imports {full}")
        if full.startswith("pylib.experiments"):
            found.append(f"imports {full} (the runs)")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Name) and f.id == "launch") or (isinstance(f, ast.Attribute) and f.attr == "launch"):
                found.append(f"calls launch(...) on line {node.lineno}")
    return found


@pytest.mark.parametrize("path", _files("viz"), ids=lambda p: p.name)
def test_viz_only_draws_it_never_launches_ranks(path):
    found = launches(path.read_text(), module_name(path), path.name == "__init__.py")
    assert not found, f"{path.relative_to(PYLIB.parent)}: {found}; a run that launches ranks goes in pylib/experiments"


def test_the_launch_check_catches_what_it_forbids():
    """The checker itself: it flags a file that launches, through a relative or a function-level import too."""
    assert launches("from pylib.runtime import launch\n", "pylib.viz.x") == ["imports pylib.runtime.launch"]
    assert launches("def f():\n    from ..runtime.launch import spawn\n", "pylib.viz.x") == [
        "imports pylib.runtime.launch.spawn"
    ]
    assert launches("import pylib.runtime as R\nR.launch(f, 2)\n", "pylib.viz.x") == ["calls launch(...) on line 2"]
    assert launches("from pylib.runtime import trace\n", "pylib.viz.x") == []


# ------------------------------------------------------------------------------------------------ the package table

# Which pylib packages each package may import (besides itself): ARCHITECTURE.md's layers, one rule per arrow.
_BELOW = {
    "plan": (),  # torch-free sizes, rules and schedules as data: imports nothing of the project (and no torch)
    "model": ("plan",),  # the single-device reference: knows nothing of ranks
    "runtime": ("plan",),  # ranks, mesh, traced collectives: knows nothing of models
    **{mode: ("plan", "model", "runtime") for mode in MODES},  # a mode stands on these only, never on another mode
    "analysis": ("plan",),  # pure functions of sizes
    "compose": ("plan", "model", "runtime", *MODES, "analysis"),  # stacks the modes; its report asks the formulas
    "tables": (),  # tables as text: what viz and seedcheck both print
    "seedcheck": ("plan", "model", "runtime", *MODES, "compose", "analysis", "tables"),
    "viz": ("plan", "model", "analysis", "pp", "seedcheck", "tables"),  # draws (pp: the timeline's pure replay)
    "experiments": ("plan", "model", "runtime", *MODES, "compose", "analysis", "seedcheck"),
    "labs": ("plan", "model", "runtime"),  # the harness and the lab checks
}
# pylib.i18n, the reader's words (messages and their catalogs), is the leaf: it imports nothing of the project and
# loads no torch, and every layer, plan included, may ask it for the words of what it prints or raises.
ALLOWED = {"i18n": (), **{package: (*below, "i18n") for package, below in _BELOW.items()}}


def _target(mod: str, name: str | None) -> str | None:
    """The top-level part of pylib an import reaches (None outside pylib, or for `from pylib import __version__`)."""
    parts = mod.split(".")
    if parts[0] != "pylib":
        return None
    if len(parts) > 1:
        return parts[1]
    return None if name == "__version__" else name


def layer_violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """The pylib imports of a file in a layered package (`ALLOWED`) that reach a package it may not import."""
    package = module.split(".")[1] if module.count(".") else None
    if package not in ALLOWED:
        return []
    allowed = {package, *ALLOWED[package]}
    found = []
    for mod, name, line in imports(source, module, is_package):
        target = _target(mod, name)
        if target is not None and target not in allowed:
            found.append(f"line {line} imports pylib.{target} ({mod}{'.' + name if name else ''})")
    return found


@pytest.mark.parametrize("path", [p for pkg in ALLOWED for p in _files(pkg)], ids=lambda p: str(p.relative_to(PYLIB)))
def test_each_package_imports_only_the_layers_below_it(path):
    found = layer_violations(path.read_text(), module_name(path), path.name == "__init__.py")
    assert not found, f"{path.relative_to(PYLIB.parent)}: {found}; see ARCHITECTURE.md (tests/test_layering.ALLOWED)"


def test_every_part_of_pylib_has_a_row_in_the_table():
    """A new package or top-level module is placed in the layers before it lands (else nothing checks it)."""
    new, gone = set(units()) - set(ALLOWED), set(ALLOWED) - set(units())
    assert not new and not gone, f"not in ALLOWED: {sorted(new)}; in ALLOWED but not in pylib: {sorted(gone)}"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (or a node with an arrow to itself): every set of
    nodes that reach each other. Tarjan's algorithm, iterative."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    out.append(sorted(component))
    return out


def test_the_package_table_has_no_cycle():
    """No two packages may import each other, directly or round a loop (seedcheck and viz once did)."""
    found = cycles({package: set(below) for package, below in ALLOWED.items()})
    assert not found, f"packages that may import each other: {found}"


def test_the_core_imports_nothing_of_the_book_side():
    """Read from the files, not from the table: no file of the core imports tables, seedcheck, viz, experiments or
    labs, so the library runs, is tested and is read without the book's machinery."""
    assert set(CORE) | set(BOOK_SIDE) | {"i18n"} == set(units())
    found = []
    for package in CORE:
        for path in _files(package):
            for mod, name, line in imports(path.read_text(), module_name(path), path.name == "__init__.py"):
                if _target(mod, name) in BOOK_SIDE:
                    found.append(f"{path.relative_to(PYLIB.parent)}:{line} imports {mod}{'.' + name if name else ''}")
    assert not found, found


def test_i18n_is_a_leaf_that_loads_no_torch():
    """Every layer, the torch-free plan included, asks pylib.i18n for its words, so it imports nothing of the project
    (the table's row, checked per file above) and no torch."""
    assert ALLOWED["i18n"] == ()
    code = "import sys, pylib.i18n; bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')]; "
    code += "assert not bad, bad[:5]"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=PYLIB.parent)


def test_the_layer_check_flags_an_upward_import():
    assert layer_violations("from pylib.model import ModelConfig\n", "pylib.runtime.x") == [
        "line 1 imports pylib.model (pylib.model.ModelConfig)"
    ]
    assert layer_violations("from ..runtime import launch\n", "pylib.analysis.x") == [
        "line 1 imports pylib.runtime (pylib.runtime.launch)"
    ]
    assert layer_violations("def f():\n    from pylib.compose import train\n", "pylib.dp.x") == [
        "line 2 imports pylib.compose (pylib.compose.train)"
    ]
    assert layer_violations("from pylib.tp import TPBlock\n", "pylib.cp.x") == [
        "line 1 imports pylib.tp (pylib.tp.TPBlock)"
    ]
    assert layer_violations("from pylib import viz\n", "pylib.seedcheck.x") == ["line 1 imports pylib.viz (pylib.viz)"]
    assert layer_violations("from .options import RunOptions\n", "pylib.plan.x") == []
    assert layer_violations("from pylib.i18n import tr\n", "pylib.plan.x") == []
    assert layer_violations("from pylib.tp import TPBlock\n", "pylib.compose.x") == []
    assert layer_violations("from .ring import x\n", "pylib.cp", is_package=True) == []


# ------------------------------------------------------------------------------------------------ module cycles


def module_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, dict[str, int]]:
    """{module: {module it imports: first line}} over the pylib modules in `sources` ({name: (source,
    is_package)}), imports inside functions included. `from a.b import c` reaches module a.b.c when that is a
    module, else a.b (the package's `__init__`); arrows to modules outside `sources` and to itself are left out."""
    graph: dict[str, dict[str, int]] = {}
    for module, (source, is_package) in sources.items():
        arrows = graph.setdefault(module, {})
        for mod, name, line in imports(source, module, is_package):
            target = f"{mod}.{name}" if name and f"{mod}.{name}" in sources else mod
            if target in sources and target != module:
                arrows.setdefault(target, line)
    return graph


def module_cycles(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """Each set of modules that import each other, with the arrows that close it ("a:12 -> b")."""
    graph = module_graph(sources)
    out = []
    for component in cycles({m: set(arrows) for m, arrows in graph.items()}):
        arrows = [f"{m}:{graph[m][t]} -> {t}" for m in component for t in sorted(graph[m]) if t in component]
        out.append("; ".join(arrows))
    return out


def test_no_two_pylib_modules_import_each_other():
    """The module graph of all of pylib, imports inside functions included, has no cycle: when two modules need a
    piece of each other, the piece moves down to a module both import (dp.batch, analysis.weights, labs.files)."""
    sources = {module_name(p): (p.read_text(), p.name == "__init__.py") for p in _all_files()}
    found = module_cycles(sources)
    assert not found, "import cycles (move the shared piece down):\n" + "\n".join(found)


def test_the_cycle_check_finds_a_cycle_hidden_inside_a_function():
    sources = {
        "pylib.a": ("from pylib.a import b\n", True),
        "pylib.a.b": ("from .c import f\n", False),
        "pylib.a.c": ("def f():\n    from .b import g\n", False),
        "pylib.a.d": ("from . import b, c\n", False),
    }
    assert module_cycles(sources) == ["pylib.a.b:1 -> pylib.a.c; pylib.a.c:2 -> pylib.a.b"]
    sources["pylib.a.c"] = ("def f():\n    return 1\n", False)
    assert module_cycles(sources) == []
    assert cycles({"x": {"x"}}) == [["x"]]
    assert cycles({"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}) == [["x", "y", "z"]]
