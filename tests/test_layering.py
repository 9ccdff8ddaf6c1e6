"""The package's layering, read from the source: `pylib.viz` only draws (it never launches ranks), and a mode folder
holds only its mode (it never imports another mode, `compose`, `experiments`, `seedcheck`, `viz` or `labs`).

Imports are read with `ast` from every file, lazy imports inside functions included, relative imports resolved."""

import ast
from pathlib import Path

import pytest

PYLIB = Path(__file__).resolve().parents[1] / "pylib"
MODES = ("tp", "cp", "ep", "pp", "dp")
ABOVE_A_MODE = ("compose", "experiments", "seedcheck", "viz", "labs")


def module_name(path: Path) -> str:
    parts = path.relative_to(PYLIB.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: str, module: str, is_package: bool = False) -> list[tuple[str, str | None]]:
    """(module, name) for every import in `source` (name None for `import x`); relative imports made absolute
    against `module` (a package's own name when `is_package`)."""
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out += [(base, a.name) for a in node.names]
    return out


def launches(source: str, module: str, is_package: bool = False) -> list[str]:
    """What in `source` starts ranks: an import of the launcher, or a call of anything named `launch`."""
    found = []
    for mod, name in imports(source, module, is_package):
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


def mode_violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of a mode's file that reach above it or into another mode."""
    mode = module.split(".")[1]
    banned = [f"pylib.{p}" for p in ABOVE_A_MODE] + [f"pylib.{m}" for m in MODES if m != mode]
    found = []
    for mod, name in imports(source, module, is_package):
        full = f"{mod}.{name}" if name else mod
        for b in banned:
            if mod == b or mod.startswith(b + ".") or (mod == "pylib" and full == b):
                found.append(f"imports {full}")
    return found


def _files(folder: str):
    return sorted((PYLIB / folder).rglob("*.py"))


@pytest.mark.parametrize("path", _files("viz"), ids=lambda p: p.name)
def test_viz_only_draws_it_never_launches_ranks(path):
    found = launches(path.read_text(), module_name(path), path.name == "__init__.py")
    assert not found, f"{path.relative_to(PYLIB.parent)}: {found}; a run that launches ranks goes in pylib/experiments"


@pytest.mark.parametrize("path", [p for m in MODES for p in _files(m)], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_mode_folder_imports_no_other_mode_and_nothing_above_it(path):
    found = mode_violations(path.read_text(), module_name(path), path.name == "__init__.py")
    assert not found, f"{path.relative_to(PYLIB.parent)}: {found}; a mode stands on runtime and model only"


def test_the_checks_catch_what_they_forbid():
    """The checkers themselves: each rule flags a file that breaks it, relative imports and lazy imports too."""
    assert launches("from pylib.runtime import launch\n", "pylib.viz.x") == ["imports pylib.runtime.launch"]
    assert launches("def f():\n    from ..runtime.launch import spawn\n", "pylib.viz.x") == [
        "imports pylib.runtime.launch.spawn"
    ]
    assert launches("import pylib.runtime as R\nR.launch(f, 2)\n", "pylib.viz.x") == ["calls launch(...) on line 2"]
    assert launches("from pylib.runtime import trace\n", "pylib.viz.x") == []
    assert mode_violations("from ..compose import train\n", "pylib.dp.x") == ["imports pylib.compose.train"]
    assert mode_violations("from pylib.tp import TPBlock\n", "pylib.cp.x") == ["imports pylib.tp.TPBlock"]
    assert mode_violations("from pylib import viz\n", "pylib.ep.x") == ["imports pylib.viz"]
    assert mode_violations("from .layout import shard\nfrom pylib.model import MoE\n", "pylib.cp.x") == []
    assert mode_violations("from .ring import x\n", "pylib.cp", is_package=True) == []


# Which pylib packages each package may import (besides itself): DESIGN.md's layering, one rule per arrow.
ALLOWED = {
    "plan": (),  # torch-free sizes and rules: imports nothing of the project (and no torch: see test_plan)
    "model": ("plan",),  # the single-device reference: knows nothing of ranks
    "runtime": ("plan",),  # ranks, mesh, traced collectives: knows nothing of models
    "analysis": ("plan",),  # pure functions of sizes
    "compose": ("plan", "model", "runtime", *MODES, "analysis"),  # stacks the modes; its report asks the formulas
    "experiments": ("plan", "model", "runtime", *MODES, "compose", "analysis", "seedcheck"),
    "seedcheck": ("plan", "model", "runtime", *MODES, "compose", "analysis", "viz"),
    "viz": ("plan", "model", "analysis", "seedcheck", "pp"),  # draws (pp: the timeline's pure replay/simulator)
    "labs": ("plan", "model", "runtime"),  # the harness and the lab checks
}
# pylib.i18n, the message catalog of what readers see, is the bottom layer: it imports nothing of the project, and
# every layer may ask it for the reader's words.
ALLOWED = {"i18n": (), **{package: (*below, "i18n") for package, below in ALLOWED.items()}}


def layer_violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """The pylib imports of a file in a layered package (`ALLOWED`) that reach a package it may not import."""
    package = module.split(".")[1] if module.count(".") else None
    if package not in ALLOWED:
        return []
    allowed = {package, *ALLOWED[package]}
    found = []
    for mod, name in imports(source, module, is_package):
        parts = mod.split(".")
        if parts[0] != "pylib":
            continue
        target = parts[1] if len(parts) > 1 else name
        if target not in allowed and not (len(parts) == 1 and name in ("__version__",)):
            found.append(f"imports pylib.{target} ({mod}{'.' + name if name else ''})")
    return found


@pytest.mark.parametrize("path", [p for pkg in ALLOWED for p in _files(pkg)], ids=lambda p: str(p.relative_to(PYLIB)))
def test_each_package_imports_only_the_layers_below_it(path):
    found = layer_violations(path.read_text(), module_name(path), path.name == "__init__.py")
    assert not found, f"{path.relative_to(PYLIB.parent)}: {found}; see DESIGN's layering (tests/test_layering.ALLOWED)"


def test_the_layer_check_flags_an_upward_import():
    assert layer_violations("from pylib.model import ModelConfig\n", "pylib.runtime.x") == [
        "imports pylib.model (pylib.model.ModelConfig)"
    ]
    assert layer_violations("from ..runtime import launch\n", "pylib.analysis.x") == [
        "imports pylib.runtime (pylib.runtime.launch)"
    ]
    assert layer_violations("from .options import RunOptions\n", "pylib.plan.x") == []
    assert layer_violations("from pylib.tp import TPBlock\n", "pylib.compose.x") == []
