"""A reader's launch, end to end, on a real local JupyterHub (`make hub-test`): follow a chapter's launch link as the
site builds it (tools/site/launch_links.py, from _config.yml, with only the hub and the repository replaced by the
local ones), log in, land in JupyterLab with the chapter open as a notebook and its kernel started by itself, run it
top to bottom with no error output; then open a lab from the clone (the learner version: no solutions), run it and
read its checks fail with "not done yet".

The tests share one browser page and run in file order: each step starts where the previous one left the reader."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import time

import pytest

from tests.hub import localhub

sys.path.insert(0, str(localhub.ROOT / "tools" / "site"))
import launch_links  # noqa: E402 - tools/site is not a package; the site's Sphinx extension imports it the same way

CHAPTER = "book/intro.md"  # short: three code cells, about 10 s of ranks
LAB = "labs/00_collectives.ipynb"  # 4 gloo ranks, about 10 s
USER = "reader"
OPEN_TIMEOUT_MS = 120_000  # login, spawn, clone and JupyterLab's first load
RUN_TIMEOUT_S = 180
VIEWPORT = {"width": 1400, "height": 1000}
# MyST that JupyterLab shows as raw text when no MyST renderer (or one built for another JupyterLab) is installed.
RAW_MYST = re.compile(r"^\([\w-]+\)=|\{(numref|ref|term|doc|eq)\}`|^```\{|^:::\{", re.MULTILINE)
CHECKS_LINE = re.compile(r"(\d+) checks: (\d+) passed, (\d+) failed, (\d+) blocked")

# What JupyterLab logs when an extension was built for another JupyterLab (it then does not load, and
# `jupyter labextension list` may still call it OK) or when a default viewer of hub/overrides.json does not exist.
EXTENSION_FAULT = re.compile(r"Failed to create module|does not satisfy the requirement|Document viewer .* not found")

# In the page: what the reader has in front of them, read from JupyterLab itself (window.jupyterapp, which
# hub/jupyterhub_config.py exposes): the open document, how it is shown, its kernel, and every code cell's state.
CURRENT = """
() => {
  const app = window.jupyterapp;
  const w = app && app.shell.currentWidget;
  if (!w || !w.context) return null;
  const out = {path: w.context.path, notebook: w.node.classList.contains("jp-NotebookPanel"),
               editor: w.node.classList.contains("jp-FileEditor") || !!w.node.querySelector(".jp-FileEditor"),
               kernel: null, status: null, cells: []};
  const session = w.sessionContext;
  if (session) {
    out.kernel = session.session && session.session.kernel ? session.session.kernel.name : null;
    out.status = session.kernelDisplayStatus;
  }
  if (out.notebook) {
    for (const cell of w.content.widgets) {
      const m = cell.model;
      if (m.type === "markdown") {
        // What the cell shows: its rendered text, or its source when it is not rendered.
        const shown = cell.node.querySelector(".jp-Cell-inputWrapper");
        out.cells.push({type: "markdown", text: shown ? shown.innerText : null});
      } else if (m.type === "code") {
        out.cells.push({type: "code", count: m.executionCount, running: !!cell.node.querySelector(
          ".jp-InputArea-prompt") && cell.node.querySelector(".jp-InputArea-prompt").textContent.includes("*"),
          outputs: m.outputs.toJSON(), source: [].concat(m.toJSON().source).join("")});
      }
    }
  }
  return out;
}
"""


@pytest.fixture(scope="module")
def page(browser):
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.console_lines = []
    page.on("console", lambda m: page.console_lines.append(f"{m.type}: {m.text}"))
    yield page
    context.close()


def _current(page) -> dict | None:
    return page.evaluate(CURRENT)


def _wait_for_document(page, path: str) -> dict:
    """Until JupyterLab shows `path` and its kernel is idle; fails naming what the reader sees instead."""
    deadline = time.monotonic() + OPEN_TIMEOUT_MS / 1000
    seen = None
    while time.monotonic() < deadline:
        seen = _current(page)
        if seen and seen["path"].endswith(path):
            if seen["editor"] or not seen["notebook"]:
                pytest.fail(f"{path} opened as text (a file editor), not as a notebook: {seen}")
            if seen["kernel"] and seen["status"] == "idle":
                return seen
        time.sleep(0.5)
    pytest.fail(f"{path}: no notebook with an idle kernel within {OPEN_TIMEOUT_MS / 1000:.0f} s; the page shows {seen}")


def _errors(cells: list[dict]) -> list[str]:
    found = []
    for i, cell in enumerate(c for c in cells if c["type"] == "code"):
        for out in cell["outputs"]:
            if out.get("output_type") == "error":
                found.append(f"code cell {i}: {out.get('ename')}: {out.get('evalue')}")
            elif out.get("output_type") == "stream" and out.get("name") == "stderr":
                found.append(f"code cell {i} wrote to stderr: {''.join(out.get('text', ''))[:500]}")
    return found


def _only_imports(source: str) -> bool:
    """Whether a cell's source is import statements only (such a cell rightly shows nothing)."""
    body = ast.parse(source).body
    return bool(body) and all(isinstance(node, (ast.Import, ast.ImportFrom)) for node in body)


def _run_all(page, path: str, last_cell_raises: str | None = None) -> dict:
    """Run > Run All Cells from the menu, then wait until every code cell ran (or one failed). `last_cell_raises`:
    the error the last code cell is expected to raise (a learner's lab: summary() raises ChecksFailed)."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    seen = None
    while time.monotonic() < deadline:
        seen = _current(page)
        code = [c for c in seen["cells"] if c["type"] == "code"]
        ran = code and all(c["count"] is not None and not c["running"] for c in code) and seen["status"] == "idle"
        expected = [f"code cell {len(code) - 1}: {last_cell_raises}: "] if last_cell_raises else []
        errors = _errors(seen["cells"])
        if errors and [e[: len(expected[0])] for e in errors] != expected:
            break
        if ran and len(errors) == len(expected):
            return seen
        time.sleep(0.5)
    errors = _errors(seen["cells"]) if seen else []
    pytest.fail(
        f"{path} did not run top to bottom cleanly within {RUN_TIMEOUT_S} s: " + ("; ".join(errors) or str(seen))
    )


def test_user_environment_has_every_jupyterlab_extension_compatible():
    """jupyterlab-myst, jupytext's viewer and the widget manager, each built for the installed JupyterLab."""
    listed = subprocess.run(
        [sys.executable, "-m", "jupyter", "labextension", "list"], capture_output=True, text=True, check=True
    )
    text = listed.stdout + listed.stderr
    for name in ("jupyterlab-myst", "jupyterlab-jupytext", "@jupyter-widgets/jupyterlab-manager"):
        line = next((ln for ln in text.splitlines() if ln.strip().startswith(name + " ")), None)
        assert line and "enabled" in line and "OK" in line, f"{name} is not installed, enabled and OK:\n{text}"
    assert "not compatible" not in text, text


def test_launch_link_opens_the_chapter_as_a_notebook(page, hub, served_repository, book_config, screenshots):
    from jupyter_book.config import yaml_to_sphinx  # how Jupyter Book turns _config.yml into the site's options

    options = yaml_to_sphinx(book_config)[0]["html_theme_options"]
    options["launch_buttons"] = dict(options.get("launch_buttons") or {}, jupyterhub_url=hub.url)
    options["repository_url"] = served_repository
    url = launch_links.launch_url(launch_links.LaunchSettings.from_theme_options(options), CHAPTER)
    t0 = time.monotonic()
    page.goto(url, timeout=OPEN_TIMEOUT_MS)
    page.wait_for_url(re.compile(r"/hub/login"), timeout=OPEN_TIMEOUT_MS)
    page.fill("#username_input", USER)
    page.click("#login_submit")
    page.wait_for_url(
        re.compile(rf"/user/{USER}/lab/tree/{launch_links.clone_folder(served_repository)}/"), timeout=OPEN_TIMEOUT_MS
    )
    seen = _wait_for_document(page, f"{launch_links.clone_folder(served_repository)}/{CHAPTER}")
    page.screenshot(path=str(screenshots / "1-chapter-opened.png"))
    print(f"login -> spawn -> clone -> {CHAPTER} open with an idle kernel: {time.monotonic() - t0:.1f} s")
    faults = [line for line in page.console_lines if EXTENSION_FAULT.search(line)]
    assert not faults, "JupyterLab extensions that do not fit this JupyterLab:\n  " + "\n  ".join(faults[:10])
    assert seen["kernel"] == "python3", seen
    rendered = [c["text"] for c in seen["cells"] if c["type"] == "markdown" and c["text"]]
    assert rendered, f"no rendered markdown cell in {CHAPTER}: {seen}"
    raw = [m.group(0) for text in rendered for m in RAW_MYST.finditer(text)]
    assert not raw, f"MyST shown as raw text in {CHAPTER} (is jupyterlab-myst installed and compatible?): {raw}"


def test_chapter_runs_top_to_bottom_in_the_hubs_kernel(page, screenshots):
    t0 = time.monotonic()
    seen = _run_all(page, CHAPTER)
    page.screenshot(path=str(screenshots / "2-chapter-ran.png"), full_page=True)
    print(f"{CHAPTER} ran top to bottom in {time.monotonic() - t0:.1f} s")
    code = [c for c in seen["cells"] if c["type"] == "code"]
    assert len(code) >= 3 and all(c["count"] is not None for c in code), f"a code cell of {CHAPTER} did not run: {code}"
    errors = [out for c in code for out in c["outputs"] if out.get("output_type") == "error"]
    assert not errors, f"a code cell of {CHAPTER} raised: {errors}"
    # A cell of imports only has nothing to show; every other cell of the chapter prints, displays or records.
    silent = [c for c in code if not c["outputs"] and not _only_imports(c["source"])]
    assert not silent, f"a code cell of {CHAPTER} shows nothing: {silent}"
    assert not page.errors, f"JupyterLab raised in the page: {page.errors}"


def test_lab_from_the_clone_is_the_learner_version_and_reports_each_exercise_not_done(
    page, hub, served_repository, screenshots
):
    """What a student launches holds no solution (labs/solutions/ keeps them apart): every cell runs, the checks fail
    saying "not done yet", and summary() raises ChecksFailed, as the harness's learner run."""
    path = f"{launch_links.clone_folder(served_repository)}/{LAB}"
    t0 = time.monotonic()
    page.goto(f"{hub.url}/user/{USER}/lab/tree/{path}", timeout=OPEN_TIMEOUT_MS)
    _wait_for_document(page, path)
    opened = _current(page)
    sources = [c["source"] for c in opened["cells"] if c["type"] == "code"]
    assert not [s for s in sources if s.lstrip().startswith("if solution:")], f"{LAB} opened with its solutions"
    seen = _run_all(page, LAB, last_cell_raises="ChecksFailed")
    page.screenshot(path=str(screenshots / "3-lab-ran.png"), full_page=True)
    print(f"{LAB} opened and ran in {time.monotonic() - t0:.1f} s")
    text = "\n".join(
        "".join(out.get("text", ""))
        for c in seen["cells"]
        if c["type"] == "code"
        for out in c["outputs"]
        if out.get("output_type") == "stream"
    )
    tally = CHECKS_LINE.findall(text)
    assert tally, f"{LAB} printed no checks summary:\n{text[-2000:]}"
    total, passed, failed, _ = map(int, tally[-1])
    assert failed > 0 and "not done yet" in text, f"{LAB}: {tally[-1]}\n{text[-2000:]}"
    print(f"{LAB}: {total} checks, {passed} passed, {failed} failed")
