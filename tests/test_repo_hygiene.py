"""Repository hygiene: clean committed notebooks, a whole table of contents, a CPU path that stays CPU."""

import ast
import json
import re
import subprocess
import sys
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
    """The requirement lines of `path`, with the files it includes (`-r other.txt`) read in their place."""
    lines = []
    for line in (raw.split("#", 1)[0].strip() for raw in path.read_text().splitlines()):
        if line.startswith("-r "):
            lines += _requirement_lines(path.parent / line[3:].strip())
        elif line:
            lines.append(line)
    return lines


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
    text = "\n".join(_requirement_lines(ROOT / "requirements.txt")).lower()
    assert not re.search(r"flash[-_]?attn", text), "flash-attn is optional, on GPU nodes only"


def test_gpu_requirements_accept_every_torch_of_the_supported_range_and_share_the_rest():
    """A GPU image keeps its CUDA torch (2.6 .. 2.13): requirements-gpu.txt ranges torch where requirements.txt pins
    it, and both install the same other packages (requirements-common.txt)."""
    from pylib.runtime.compat import SUPPORTED

    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED
    gpu = _requirement_lines(ROOT / "requirements-gpu.txt")
    cpu = _requirement_lines(ROOT / "requirements.txt")
    assert f"torch>={lo_major}.{lo_minor},<{hi_major}.{hi_minor + 1}" in gpu
    assert [x for x in gpu if not x.startswith("torch")] == [x for x in cpu if not x.startswith("torch")]
    assert not any(re.search(r"flash[-_]?attn", x) for x in gpu), "flash-attn is optional: never installed by -r"


# torch.distributed's communication calls. pylib issues them only from pylib/runtime/collectives.py (and from the
# torch-version shim it calls, pylib/runtime/compat.py, whose communication functions only collectives.py uses:
# tests/test_torch_range.py), so the tracer sees every byte; process-group setup (init_process_group, new_group,
# destroy_process_group) may live elsewhere.
COMMUNICATION = {
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv",
    "batch_isend_irecv", "P2POp", "broadcast", "broadcast_object_list", "reduce", "gather", "scatter", "barrier",
}  # fmt: skip


def _untraced_communication(source: str) -> list[str]:
    """`line: name` for each use of a torch.distributed communication function in `source`, however imported."""
    tree = ast.parse(source)
    aliases = {"torch.distributed"}  # names bound to the torch.distributed module
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name == "torch.distributed" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            aliases |= {a.asname or a.name for a in node.names if a.name == "distributed"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch.distributed"):
            found += [f"{node.lineno}: {a.name}" for a in node.names if a.name in COMMUNICATION]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in COMMUNICATION and ast.unparse(node.value) in aliases:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_untraced_communication_finder_sees_every_import_style():
    source = "import torch.distributed as d\nfrom torch import distributed\nfrom torch.distributed import isend\n"
    source += "d.all_reduce(x)\ndistributed.barrier()\ntorch.distributed.send(x, 1)\nd.new_group([0])\n"
    assert _untraced_communication(source) == ["3: isend", "4: d.all_reduce", "5: distributed.barrier",
                                               "6: torch.distributed.send"]  # fmt: skip


def test_pylib_communicates_only_through_the_traced_collectives():
    # agreement.py: the untraced check before each collective (one all-reduce of two int64; it moves no model data)
    allowed = {ROOT / "pylib" / "runtime" / name for name in ("collectives.py", "compat.py", "agreement.py")}
    offenders = {
        str(path.relative_to(ROOT)): hits
        for path in sorted((ROOT / "pylib").rglob("*.py"))
        if path not in allowed and (hits := _untraced_communication(path.read_text()))
    }
    assert not offenders, f"torch.distributed communication outside pylib/runtime/collectives.py: {offenders}"


LINTED_FOLDERS = ("pylib", "tests", "labs", "bench", "tools")


def _hidden_from_ruff(root: Path, folders: tuple[str, ...]) -> list[str]:
    """The `.py` / `.ipynb` files under `folders` of `root` that `ruff check` would not read.

    ruff skips folders it takes for build output (`dist`, `build`, `node_modules`, ...) and whatever the config
    excludes, silently; the file list it prints (`--show-files`) is what it lints.
    """
    present = [f for f in folders if (root / f).exists()]
    wanted = {
        str(p.relative_to(root))
        for f in present
        for p in (root / f).rglob("*")
        if p.suffix in (".py", ".ipynb") and "_runs" not in p.parts and "__pycache__" not in p.parts
    }
    shown = subprocess.run(  # ruff of this interpreter's environment, found without an activated venv on PATH
        [sys.executable, "-m", "ruff", "check", "--show-files", *present],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    seen = {
        str(Path(line.strip()).resolve().relative_to(root.resolve())) for line in shown.splitlines() if line.strip()
    }
    return sorted(wanted - seen)


def test_ruff_lints_every_python_file_of_the_repository():
    hidden = _hidden_from_ruff(ROOT, LINTED_FOLDERS)
    assert not hidden, f"ruff never reads {hidden}: rename the folder or stop excluding it"


def test_the_ruff_file_check_catches_a_folder_ruff_skips(tmp_path):
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "pylib" / "dist").mkdir(parents=True)
    (tmp_path / "pylib" / "ok.py").write_text("X = 1\n")
    (tmp_path / "pylib" / "dist" / "hidden.py").write_text("Y = 2\n")
    assert _hidden_from_ruff(tmp_path, ("pylib",)) == ["pylib/dist/hidden.py"]


GPU_BENCHES = {"gpu_check.py", "gpu_single.py", "cp_gpu_check.py"}  # these pick the backend on purpose


@pytest.mark.parametrize(
    "script", sorted(p for p in (ROOT / "bench").glob("*.py") if p.name not in GPU_BENCHES), ids=lambda p: p.name
)
def test_cpu_benches_name_the_gloo_backend_in_every_launch(script):
    """A bench that measures CPU ranks must not turn into NCCL on a machine with GPUs (backend="auto" would, and
    its CPU tensors would then fail): every launch(...) it makes says backend="gloo"."""
    calls = [
        n
        for n in ast.walk(ast.parse(script.read_text()))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "launch"
    ]
    unnamed = [n.lineno for n in calls if not any(k.arg == "backend" for k in n.keywords)]
    assert not unnamed, f"bench/{script.name}: launch(...) without backend= on lines {unnamed}"


LONGEST_FUNCTION = 100  # lines, decorators and docstring included: past this a function has seams to split along


def test_no_pylib_function_is_longer_than_a_hundred_lines():
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted((ROOT / "pylib").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > LONGEST_FUNCTION
    ]
    assert not long, f"functions over {LONGEST_FUNCTION} lines (split them along their seams): {long}"
