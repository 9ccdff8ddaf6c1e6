"""Write the public API surface of one torch release, read statically from its source, for the torch-range test.

    python tools/torch_api_surface.py SITE_PACKAGES_DIR > tests/data/torch26_api.txt

SITE_PACKAGES_DIR is a folder holding that release's `torch/` and `torchgen/` packages as Python source -- an
unpacked wheel works for any platform (the .py and .pyi files are the same on every platform; nothing is
imported or run). How tests/data/torch26_api.txt was made:

    pip download torch==2.6.0 --no-deps --only-binary=:all: --platform macosx_11_0_arm64 --python-version 3.12 -d W
    python -c "import zipfile,sys; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" W/torch-2.6.0-*.whl X
    python tools/torch_api_surface.py X > tests/data/torch26_api.txt
    python tools/torch_api_surface.py X --signatures > tests/data/torch26_signatures.txt

Output: one `module.name` a line, sorted, for every module in MODULES: the names the module binds at its top
level (def, class, assignment, import, and `from m import *` resolved through m's `__all__` or public names,
inside top-level if/try/with blocks too, since torch guards whole modules with `if is_available():`), from its
.py and its .pyi stub (torch's C functions are declared in stubs: `torch._C._VariableFunctions.pyi`), plus its
subpackages. `torch.ops.aten.<op>` lines come from torchgen's packaged `native_functions.yaml`.

With --signatures: `module.name param,...` for each function (and class, from its __init__) of those modules whose
parameters are written out -- a def's, or the union of a stub's @overload defs -- so a test can check the keyword
arguments pylib passes, too.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

MODULES = (
    "torch",
    "torch.autograd",
    "torch.autograd.graph",
    "torch.backends",
    "torch.backends.cuda",
    "torch.cuda",
    "torch.distributed",
    "torch.distributed.device_mesh",
    "torch.distributed.elastic",
    "torch.distributed.pipelining",
    "torch.distributed.run",
    "torch.distributed.tensor",
    "torch.distributed.tensor.parallel",
    "torch.library",
    "torch.nn",
    "torch.nn.attention",
    "torch.nn.functional",
    "torch.nn.init",
    "torch.nn.parameter",
    "torch.optim",
    "torch.overrides",
    "torch.random",
    "torch.testing",
    "torch.utils",
    "torch.utils.checkpoint",
)


def _files(root: Path, module: str) -> list[Path]:
    """The .py and .pyi files that define `module` (a package's __init__, or a module file)."""
    base = root.joinpath(*module.split("."))
    candidates = [base / "__init__.py", base / "__init__.pyi", base.with_suffix(".py"), base.with_suffix(".pyi")]
    return [p for p in candidates if p.is_file()]


def _is_package(root: Path, module: str) -> bool:
    return (root.joinpath(*module.split(".")) / "__init__.py").is_file()


def _absolute(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of `from <level dots><target> import ...` written in `module`."""
    if level == 0:
        return target or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([target] if target else []))


def _static_all(tree: ast.Module) -> list[str] | None:
    """`__all__` when it is written as literal lists of strings (=, += and .extend), else None."""
    names, found = [], False
    for node in ast.walk(tree):
        value = None
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            value, found = node.value, True
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "__all__":
            value, found = node.value, True
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id == "__all__":
            value = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "extend"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "__all__"
            and node.args
        ):
            value = node.args[0]
        if isinstance(value, (ast.List, ast.Tuple)):
            names += [e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return names if found else None


def _top_level(body):
    """Statements at module level, looking inside if/try/with blocks (not into functions or classes)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _top_level(block)
        elif isinstance(node, ast.With):
            yield from _top_level(node.body)


def _targets(target) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in _targets(e)]
    return []


def module_names(root: Path, module: str, _seen: set | None = None) -> set[str]:
    """Every name `module` binds at its top level (see the module docstring)."""
    seen = set() if _seen is None else _seen
    if module in seen:
        return set()
    seen.add(module)
    names: set[str] = set()
    package = _is_package(root, module)
    for path in _files(root, module):
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        for node in _top_level(tree.body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    names.update(_targets(t))
            elif isinstance(node, ast.AnnAssign):
                names.update(_targets(node.target))
            elif isinstance(node, ast.Import):
                for a in node.names:
                    names.add(a.asname or a.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(module, package, node.level, node.module)
                for a in node.names:
                    if a.name == "*":
                        names.update(public_names(root, source, seen))
                    else:
                        names.add(a.asname or a.name)
    if package:
        base = root.joinpath(*module.split("."))
        names.update(p.stem for p in base.glob("*.py") if p.stem != "__init__")
        names.update(p.name for p in base.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    return names


def public_names(root: Path, module: str, seen: set | None = None) -> set[str]:
    """What `from module import *` brings: its static `__all__`, else its names without a leading underscore."""
    files = _files(root, module)
    declared = None
    for path in files:
        found = _static_all(ast.parse(path.read_text(encoding="utf-8", errors="replace")))
        if found is not None:
            declared = (declared or []) + found
    names = module_names(root, module, seen)
    if declared is not None:
        return set(declared)
    return {n for n in names if not n.startswith("_")}


ANY = None  # a callable that takes **kwargs: every keyword is accepted


def _params(fn) -> set[str] | None:
    """Keyword-usable parameter names of a def (ANY when it takes **kwargs)."""
    a = fn.args
    if a.kwarg is not None:
        return ANY
    return {x.arg for x in (*a.args, *a.kwonlyargs)} - {"self", "cls"}


def _class_params(cls: ast.ClassDef) -> set[str] | None:
    inits = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    if not inits:
        return ANY  # inherited or generated (dataclass): not known statically
    return _union([_params(f) for f in inits])


def _union(sets):
    if any(x is ANY for x in sets):
        return ANY
    return set().union(*sets)


_SIGS: dict[str, dict] = {}
_PREVIOUS: dict[str, dict] = {}  # the last round's answers, which a module inside an import cycle sees


def module_signatures(root: Path, module: str) -> dict[str, set[str] | None]:
    """name -> keyword parameter names (or ANY) for the functions and classes `module` defines or imports from
    another torch module (the re-exports torch is made of: `from .distributed_c10d import *`)."""
    if module in _SIGS:
        return _SIGS[module]
    sigs: dict[str, list] = {}
    _SIGS[module] = _PREVIOUS.get(module, {})  # an import cycle sees the previous round's answer
    package = _is_package(root, module)
    for path in _files(root, module):
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        for node in _top_level(tree.body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                sigs.setdefault(node.name, []).append(_params(node))
            elif isinstance(node, ast.ClassDef):
                sigs.setdefault(node.name, []).append(_class_params(node))
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(module, package, node.level, node.module)
                if not source.startswith("torch") or not _files(root, source):
                    continue
                theirs = module_signatures(root, source)
                for a in node.names:
                    if a.name == "*":
                        for name in public_names(root, source):
                            if name in theirs:
                                sigs.setdefault(name, []).append(theirs[name])
                    elif a.name in theirs:
                        sigs.setdefault(a.asname or a.name, []).append(theirs[a.name])
    _SIGS[module] = {name: _union(found) for name, found in sigs.items()}
    return _SIGS[module]


def signatures(root: Path) -> list[str]:
    """`module.name param,param,...` for every function or class of MODULES whose keywords are known.

    torch's modules import each other in cycles, so one pass can miss a re-export; passes repeat, each cycle
    seeing the previous pass's answers, until nothing changes."""
    lines, previous = None, None
    while lines is None or lines != previous:
        previous = lines
        _PREVIOUS.clear()
        _PREVIOUS.update(_SIGS)
        _SIGS.clear()
        found = []
        for module in MODULES:
            for name, params in module_signatures(root, module).items():
                if params is not ANY:
                    found.append(f"{module}.{name} {','.join(sorted(params))}")
        lines = sorted(found)
    return lines


def aten_ops(root: Path) -> set[str]:
    """Operator names (without overloads) in torchgen's packaged native_functions.yaml."""
    yaml_path = root / "torchgen" / "packaged" / "ATen" / "native" / "native_functions.yaml"
    ops = set()
    for line in yaml_path.read_text().splitlines():
        m = re.match(r"- func: ([A-Za-z0-9_]+)(\.[A-Za-z0-9_]+)?\(", line)
        if m:
            ops.add(m.group(1))
    return ops


def surface(root: Path) -> list[str]:
    lines = set()
    for module in MODULES:
        if not _files(root, module):
            raise SystemExit(f"{module} is not under {root}: is this an unpacked torch wheel?")
        lines.update(f"{module}.{name}" for name in module_names(root, module))
    lines.update(f"torch.ops.aten.{op}" for op in aten_ops(root))
    return sorted(lines)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (1, 2) or (len(argv) == 2 and argv[1] != "--signatures"):
        raise SystemExit(__doc__)
    root = Path(argv[0])
    if len(argv) == 2:
        version = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", (root / "torch" / "version.py").read_text())
        print(
            f"# torch {version.group(1) if version else '?'} keyword parameters, "
            "written by tools/torch_api_surface.py --signatures"
        )
        print("# One `module.name param,param,...` a line; functions taking **kwargs are left out (any keyword goes).")
        for line in signatures(root):
            print(line)
        return
    version = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", (root / "torch" / "version.py").read_text())
    print(f"# torch {version.group(1) if version else '?'} public API surface, written by tools/torch_api_surface.py")
    print("# (see its docstring for how this file was made). One module.name a line.")
    for line in surface(root):
        print(line)


if __name__ == "__main__":
    main()
