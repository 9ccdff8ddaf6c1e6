"""Repository hygiene: clean committed notebooks, a whole table of contents, a CPU path that stays CPU."""

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _tracked(pattern: str) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", pattern], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [ROOT / p for p in out.split("\0") if p]


def _toc_files(node) -> list[str]:
    """Every `file:` (and the `root:`) named anywhere in a sphinx-external-toc tree."""
    if isinstance(node, dict):
        found = [node[k] for k in ("root", "file") if isinstance(node.get(k), str)]
        for value in node.values():
            found += _toc_files(value)
        return found
    if isinstance(node, list):
        return [f for item in node for f in _toc_files(item)]
    return []


def _requirement_lines(path: Path) -> list[str]:
    stripped = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in stripped if line]


@pytest.mark.parametrize("notebook", _tracked("*.ipynb"), ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_notebook_has_no_outputs_or_execution_counts(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    dirty = [
        i
        for i, cell in enumerate(cells)
        if cell["cell_type"] == "code" and (cell.get("outputs") or cell.get("execution_count") is not None)
    ]
    assert not dirty, f"{notebook.relative_to(ROOT)}: code cells {dirty} carry outputs or execution counts"


def test_every_page_in_the_toc_exists():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = _toc_files(toc)
    assert pages, "_toc.yml names no page"
    missing = [p for p in pages if not any((ROOT / p).with_suffix(s).exists() for s in (".md", ".ipynb", ".rst"))]
    assert not missing, f"_toc.yml names pages that do not exist: {missing}"


def test_cpu_requirements_pin_torch_and_jupyter_book_1():
    lines = _requirement_lines(ROOT / "requirements.txt")
    assert "torch==2.13.0" in lines, "requirements.txt must pin torch==2.13.0 (the local CPU build)"
    assert "jupyter-book>=1.0.4,<2" in lines, "without the lower bound pip may fall back to 0.6.5"


def test_cpu_requirements_never_install_flash_attn():
    text = (ROOT / "requirements.txt").read_text().lower()
    assert not re.search(r"flash[-_]?attn", text), "flash-attn belongs in requirements-gpu.txt only"
