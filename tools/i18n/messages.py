"""pylib's messages as gettext finds a program's: every string literal passed to `tr(...)` (or marked `N_(...)`, a
label translated where it is shown) in pylib's modules and in the chapters' code cells, read from the source without
running anything (Python's `ast`), with the files it is in.

This is the template (.pot) of pylib's catalogs, pylib/i18n/locale/zh_CN/LC_MESSAGES/{pylib,labs}.po: a message
every one of whose files is in pylib/labs/ belongs to `labs` (the lab harness), any other to `pylib` (the chapters'
tables, figures and verdicts). tools/i18n/catalogs.py merges the template into the catalogs (`update`) and checks
them (`check`) as it does the chapters'; tests/test_i18n.py checks every call against it.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

from babel.messages.catalog import Catalog

from pylib.i18n import DOMAINS
from pylib.i18n.pofile import LANGUAGE

ROOT = Path(__file__).resolve().parents[2]
CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```", re.S | re.M)
LABS = "pylib/labs/"


def cell_source(body: str) -> str:
    """A MyST code cell's Python: its `:option:` / `---` front matter and IPython magics blanked (lines kept)."""
    lines = body.split("\n")
    out: list[str] = []
    front = bool(lines) and lines[0].strip() == "---"
    closed = not front
    for i, line in enumerate(lines):
        if not closed:
            out.append("")
            if i > 0 and line.strip() == "---":
                closed = True
            continue
        out.append("" if line.lstrip().startswith(("%", "!", ":")) and not out[-1:] == ["\\"] else line)
    return "\n".join(out)


def sources(root: Path = ROOT) -> Iterator[tuple[str, str, str]]:
    """(file, label, python source) for every module of pylib and every code cell of the chapters."""
    for path in sorted((root / "pylib").rglob("*.py")):
        name = str(path.relative_to(root))
        yield name, name, path.read_text(encoding="utf-8")
    for path in sorted((root / "book").rglob("*.md")):
        if "_static" in path.parts or "locale" in path.parts:
            continue
        name = str(path.relative_to(root))
        for k, m in enumerate(CELL.finditer(path.read_text(encoding="utf-8"))):
            yield name, f"{name}[cell {k}]", cell_source(m.group(1))


@functools.cache  # one scan per process: the catalog checks and the tests ask again for the same tree
def tr_calls(root: Path = ROOT) -> tuple[tuple[str, str, ast.Call, str], ...]:
    """(file, where, call node, message) for every tr(...), later(...) or N_(...) call whose first argument is a string
    literal."""
    calls = []
    for name, label, src in sources(root):
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in sorted(ast.walk(tree), key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            f = node.func
            called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            arg = node.args[0]
            if called in ("tr", "later", "N_") and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                calls.append((name, f"{label}:{node.lineno}", node, arg.value))
    return tuple(calls)


def domain(files: list[str]) -> str:
    """'labs' when every file using the message is the lab harness's, else 'pylib'."""
    return "labs" if all(f.startswith(LABS) for f in files) else "pylib"


def templates(root: Path = ROOT) -> dict[str, Catalog]:
    """{domain: template}: each message once, in the order the scan first meets it, referenced by its files."""
    files: dict[str, list[str]] = {}
    for name, _, _, message in tr_calls(root):
        held = files.setdefault(message, [])
        if name not in held:
            held.append(name)
    out = {d: Catalog(locale=LANGUAGE, project="pylib", fuzzy=False) for d in DOMAINS}
    for message, where in files.items():
        out[domain(where)].add(message, locations=[(f, None) for f in where])
    return out
