"""The static explorers (pylib.viz.live) as a reader's browser runs them: Pyodide computes exactly what pylib
computes, and the page's controls change the page's numbers, with no kernel and no other host.

- Pyodide under node, on a few hundred sampled states of the matrix-view explorer (presets x plans x sizes, refusals
  among them) and a few of the planner's, in both languages: the page's HTML equal to pylib's, character for
  character, and every number beneath it (shapes, memory, traffic; the planner's predictions) equal to pylib's,
  integers exactly and floats within 1e-12 relative.
- chromium, on a small page holding both explorers (needs only the vendored Pyodide, `make vendor`), then on the
  built site's two chapters (`make book`): a moved control recomputes the tables, which equal pylib's for that state.

Pyodide is read from book/_static/vendor/pyodide (tools/site/vendor.py); node is the one `npm` came with.
"""

from __future__ import annotations

import functools
import http.server
import json
import math
import random
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from pylib import i18n
from pylib.viz import explorer, live, planner
from tests.site import sitemap

PYODIDE = sitemap.ROOT / "book" / "_static" / "vendor" / "pyodide"
STATIC = sitemap.ROOT / "book" / "_static"
COMPUTE_TIMEOUT_MS = 240_000  # the first change loads Pyodide (13 MB) and starts Python: slow on a loaded CI machine


def _need_pyodide() -> Path:
    if not (PYODIDE / "pyodide.mjs").is_file():
        pytest.fail(f"no Pyodide in {PYODIDE}: run `make vendor` (tools/site/vendor.py)")
    return PYODIDE


# ------------------------------------------------------------------------------------------------ sampled states


def explorer_states(n: int, seed: int = 29) -> list[dict]:
    """n states of the matrix-view explorer's form: each preset's own plan, then presets with one to four controls
    moved to values a reader can pick (many of them plans that do not fit: the refusals are sampled too)."""
    rng = random.Random(seed)
    moves = {
        "tp": [1, 2, 4, 8, 16],
        "cp": [1, 2, 4],
        "dp": [1, 2, 4, 8, 64],
        "pp": [1, 2, 4, 8],
        "ep": [1, 2, 8, 32, 64],
        "etp": [1, 2],
        "sp": [True, False],
        "cp_kind": ["ring", "ulysses"],
        "zero": explorer.ZERO,
        "dtype": explorer.DTYPES,
        "stage": ["first", "last"],
        "m": [1, 2, 8],
        "b": [1, 2, 4, 8, 64],
        "s": [16, 1024, 4096, 32768],
        "layers": [30, 32, 80],
        "heads": [60, 64],
        "kv_heads": [4, 8],
        "experts": [0, 8],
    }
    presets = list(explorer.PRESETS)
    out = [{"preset": p, **explorer.preset_controls(p)} for p in presets]
    while len(out) < n:
        p = rng.choice(presets)
        state = {"preset": p, **explorer.preset_controls(p)}
        for name in rng.sample(sorted(moves), rng.randint(1, 4)):
            state[name] = rng.choice(moves[name])
        out.append(state)
    return out


def planner_states() -> list[dict]:
    """A few states of the planner explorer's form: the default, other GPUs, memory, batch and length, and sizes
    no plan can run."""
    default = {"preset": planner.DEFAULT, "memory": "80 GB (H100)", "world": 64, "batch": 512, "seq": 4096}
    return [
        default,
        default | {"world": 8},  # a 70B model on 8 GPUs: no plan fits
        {"preset": "Llama-2-7B-class dense", "memory": "40 GB (A100 40G)", "world": 16, "batch": 64, "seq": 8192},
        {"preset": "Mixtral-8x7B-class MoE", "memory": "141 GB (H200)", "world": 32, "batch": 256, "seq": 4096},
    ]


# The numbers beneath a state's HTML, computed by the same code here and in Pyodide.
NUMBERS = """
def numbers(kind, state):
    import dataclasses
    if kind == "explorer":
        from pylib.viz import explorer
        s = explorer._summary(explorer.PRESETS[state["preset"]][0], {k: state[k] for k in explorer.CONTROLS})
        return {
            "problems": s.problems,
            "weights": [[w.name, list(w.local or []), w.count, w.held_bytes] for w in s.weights],
            "activations": [[a.name, list(a.local or []), a.count, a.local_bytes] for a in s.activations],
            "memory": s.memory,
            "traffic": [[t.mode, t.op, t.count, t.message, t.sent] for t in s.traffic],
        }
    from pylib.viz import planner
    try:
        ranked = planner._ranked(state["preset"], state["world"], state["batch"], state["seq"],
                                 planner.GPU_MEMORY[state["memory"]], 8)
    except ValueError as err:
        return {"refused": str(err)}
    return {"plans": [[p.plan.describe(), p.fits, p.peak_memory, p.step_time, p.bubble_fraction, p.compute_time,
                       p.bubble_time, sorted(p.traffic_by_axis().items())] for p in ranked]}
"""


def _host(calls: list[tuple[str, str, dict]]) -> list[dict]:
    scope: dict = {}
    exec(NUMBERS, scope)
    out = []
    for lang, kind, state in calls:
        i18n.set_language(lang)
        try:
            html = live.call(kind, json.dumps(state))
            out.append({"html": html, "numbers": json.loads(json.dumps(scope["numbers"](kind, state)))})
        finally:
            i18n.set_language(None)
    return out


NODE_RUNNER = r"""
import { loadPyodide } from "PYODIDE/pyodide.mjs";
import { readFileSync, writeFileSync } from "node:fs";
const [bundle, calls, numbers, result] = process.argv.slice(2);
const py = await loadPyodide({ indexURL: "PYODIDE/" });
py.unpackArchive(new Uint8Array(readFileSync(bundle)), "zip", { extractDir: "/home/pyodide/pb-live" });
py.runPython("import sys; sys.path.insert(0, '/home/pyodide/pb-live')");
py.runPython(readFileSync(numbers, "utf8"));
py.globals.set("CALLS", readFileSync(calls, "utf8"));
const out = py.runPython(`
import json
from pylib import i18n
from pylib.viz import live
results = []
for lang, kind, state in json.loads(CALLS):
    live.start("/home/pyodide/pb-live", lang)
    results.append({"html": live.call(kind, json.dumps(state)), "numbers": numbers(kind, state)})
json.dumps(results)
`);
writeFileSync(result, out);
"""


def _start_pyodide(tmp_path: Path, calls: list[tuple[str, str, dict]]) -> subprocess.Popen:
    """Start node running Pyodide on `calls` (one process, one core): the caller computes meanwhile."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is needed to run Pyodide outside the browser (it comes with npm)")
    folder = _need_pyodide()
    (tmp_path / "run.mjs").write_text(NODE_RUNNER.replace("PYODIDE", folder.as_posix()))
    (tmp_path / "bundle.zip").write_bytes(live.bundle())
    (tmp_path / "calls.json").write_text(json.dumps(calls))
    (tmp_path / "numbers.py").write_text(NUMBERS)
    args = [str(tmp_path / n) for n in ("bundle.zip", "calls.json", "numbers.py", "result.json")]
    with (tmp_path / "node.stderr").open("w") as stderr:  # the child keeps its own copy of the file
        return subprocess.Popen([node, str(tmp_path / "run.mjs"), *args], stdout=subprocess.DEVNULL, stderr=stderr)


def _pyodide_result(run: subprocess.Popen, tmp_path: Path) -> list[dict]:
    """Each call's page and numbers as Pyodide computed them, once node has finished."""
    try:
        status = run.wait(timeout=1800)
    finally:
        run.kill()
        run.wait()
    assert status == 0, (tmp_path / "node.stderr").read_text()[-3000:]
    return json.loads((tmp_path / "result.json").read_text())


def _same(a, b, where: str) -> None:
    """Integers (and strings, booleans) exactly; floats within 1e-12 relative."""
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)), where
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0) or a == b, f"{where}: {a!r} != {b!r}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} != {b!r}"


# The sample is sized for CI's time budget (tests/site runs serially after the book): Pyodide runs pylib's own code,
# so what can differ is the platform (WASM's libm and float formatting, the stdlib modules present), which a hundred
# states over every preset, refusals included, reach as well as three hundred did.
@pytest.mark.timeout(1800)  # Pyodide's start, 120 explorer states and 4 rankings: minutes on a loaded machine
def test_pyodide_computes_what_pylib_computes_on_sampled_states(tmp_path):
    states = explorer_states(120)
    calls = [("en", "explorer", s) for s in states] + [("zh", "explorer", s) for s in states[::4]]
    calls += [(lang, "planner", s) for lang, s in zip(("en", "zh", "en", "en"), planner_states())]
    node = _start_pyodide(tmp_path, calls)
    want = _host(calls)  # on the other core while node runs
    got = _pyodide_result(node, tmp_path)
    refused = sum(1 for w in want if w["numbers"].get("problems") or "refused" in w["numbers"])
    assert 15 <= refused <= len(calls) - 40, refused  # both plans that run and plans refused were sampled
    for (lang, kind, state), g, w in zip(calls, got, want):
        where = f"{lang} {kind} {state}"
        assert g["html"] == w["html"], where
        _same(g["numbers"], w["numbers"], where)


# ------------------------------------------------------------------------------------------------ in the browser


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@pytest.fixture
def small_site(tmp_path):
    """A page holding both static explorers, with the site's _static folder beside it, served on 127.0.0.1."""
    _need_pyodide()
    body = explorer.static_explorer()._repr_html_() + planner.static_explorer()._repr_html_()
    (tmp_path / "index.html").write_text(
        f"<!doctype html><html lang='en' data-content_root='./'><head><meta charset='utf-8'></head><body>{body}"
        "</body></html>"
    )
    (tmp_path / "_static").symlink_to(STATIC, target_is_directory=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=tmp_path))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def _serialised(tab, html: str) -> str:
    """`html` as the browser serialises it (attribute quoting, entities), to compare with what the page shows."""
    return tab.evaluate("h => { const d = document.createElement('div'); d.innerHTML = h; return d.innerHTML; }", html)


def _move(tab, index: int, control: str, value, computed: int) -> str:
    """Set one control of the index-th explorer (a select by its option's JSON value, a number, a checkbox), wait
    until the page has computed `computed` states, return what its output shows (HTML)."""
    box = tab.locator(".pb-live").nth(index)
    field = box.locator(f"[name={control}]")
    kind = field.get_attribute("type")
    if kind == "checkbox":
        field.set_checked(bool(value))
    elif kind == "number":
        field.fill(str(value))
        field.dispatch_event("change")
    else:
        field.select_option(value=json.dumps(value))
    tab.wait_for_function(
        f"(() => {{ const b = document.querySelectorAll('.pb-live')[{index}];"
        f" return b.dataset.computed === '{computed}' || b.dataset.state === 'failed'; }})()",
        timeout=COMPUTE_TIMEOUT_MS,
    )
    assert box.get_attribute("data-state") == "ready", box.locator(".pb-live-status").inner_text()
    return box.locator(".pb-live-out").inner_html()


def _open(browser, url: str):
    context = browser.new_context()
    tab = context.new_page()
    hosts: set[str] = set()
    tab.on("request", lambda r: hosts.add(r.url.split("/")[2]) if r.url.startswith("http") else None)
    tab.goto(url, wait_until="load")
    return context, tab, hosts


@pytest.mark.timeout(900)  # Pyodide's start in the browser, then seven states
def test_every_control_recomputes_the_page_with_no_kernel(browser, small_site):
    context, tab, hosts = _open(browser, small_site)
    try:
        state = {"preset": explorer.DEFAULT, **explorer.preset_controls(explorer.DEFAULT)}
        steps = [("tp", 4), ("sp", False), ("layers", 30), ("layers", 80), ("zero", "zero3")]
        for i, (control, value) in enumerate(steps, 1):
            state[control] = value
            shown = _move(tab, 0, control, value, i)
            assert shown == _serialised(tab, explorer.live_state_html(state)), (control, value)
            if control == "layers" and value == 30:  # the refusal, as pylib words it
                assert "n_layers=30 is not divisible by pp × v = 4 × 1 = 4" in shown
        # a preset sets every control to its own plan
        shown = _move(tab, 0, "preset", "Mixtral-8x7B-class MoE", len(steps) + 1)
        mixtral = {"preset": "Mixtral-8x7B-class MoE", **explorer.preset_controls("Mixtral-8x7B-class MoE")}
        assert shown == _serialised(tab, explorer.live_state_html(mixtral))
        assert tab.locator(".pb-live").nth(0).locator("[name=experts]").input_value() == "8"
        # the planner: another GPU count, ranked in the page
        ranked = {"preset": planner.DEFAULT, "memory": "80 GB (H100)", "world": 128, "batch": 512, "seq": 4096}
        shown = _move(tab, 1, "world", 128, 1)
        assert shown == _serialised(tab, planner.live_state_html(ranked))
        assert hosts == {small_site.split("/")[2]}  # nothing from another host: Pyodide is the site's own copy
    finally:
        context.close()


@pytest.mark.parametrize(
    "path, index, control, value",
    [
        ("book/part2/matrix-view.html", 0, "tp", 4),
        (sitemap.ZH + "book/part2/matrix-view.html", 0, "cp", 2),
        (sitemap.ZH + "book/part1/traffic-plan.html", 0, "world", 32),
    ],
)
@pytest.mark.timeout(600)
def test_the_chapters_explorers_compute_on_the_built_site(browser, base_url, path, index, control, value):
    context, tab, hosts = _open(browser, base_url + path)
    try:
        box = tab.locator(".pb-live").nth(index)
        kind = box.get_attribute("data-kind")
        data = json.loads(box.locator("script.pb-live-data").text_content())
        state = {"preset": json.loads(box.locator("[name=preset]").input_value())}
        state |= data["presets"][state["preset"]]
        if kind == "planner":
            state["memory"] = json.loads(box.locator("[name=memory]").input_value())
        state[control] = value
        shown = _move(tab, index, control, value, 1)
        lang = "zh" if path.startswith(sitemap.ZH) else "en"
        i18n.set_language(lang)
        try:
            want = live.call(kind, json.dumps(state))
            ready = live.status_messages()["ready"]
        finally:
            i18n.set_language(None)
        assert shown == _serialised(tab, want)
        assert box.locator(".pb-live-status").inner_text() == ready  # in the page's language
        assert hosts == {base_url.split("/")[2]}
    finally:
        context.close()
