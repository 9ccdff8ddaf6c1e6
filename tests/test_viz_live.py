"""The static site's explorers (pylib.viz.live): the bundle the page runs is pylib's own modules, the same bytes for
the same pylib, and it runs alone -- no site-packages, with torch, numpy, ipywidgets, matplotlib and Babel blocked, as
in Pyodide -- computing exactly what pylib computes here, in both languages. (Pyodide itself, on a few hundred
sampled states, and the page in a browser: tests/site/test_live_explorers.py.)"""

import io
import json
import subprocess
import sys
import zipfile

import pytest

from pylib import i18n
from pylib.viz import explorer, live

BLOCKED = ("torch", "numpy", "ipywidgets", "IPython", "matplotlib", "babel")


def test_the_bundle_is_pylibs_modules_and_the_same_bytes_in_both_editions():
    first = live.bundle.__wrapped__()
    i18n.set_language("zh")
    try:
        assert first == live.bundle.__wrapped__()  # the same for the same pylib, whichever edition is built
    finally:
        i18n.set_language(None)
    names = zipfile.ZipFile(io.BytesIO(first)).namelist()
    for path in live._files():
        assert path.relative_to(live.ROOT).as_posix() in names
    assert "pylib/viz/live.py" in names and "pylib/analysis/shapes.py" in names
    messages = json.loads(zipfile.ZipFile(io.BytesIO(first)).read(live.MESSAGES))
    assert messages == {"zh": i18n.catalog("zh")}


# Run in a fresh interpreter with no site-packages (-I -S): the bundle is on sys.path, the heavy libraries blocked.
RUNNER = """
import importlib.abc, json, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError("blocked in the page: " + name)
sys.meta_path.insert(0, Block())
sys.path.insert(0, {folder!r})
from pylib.viz import live
live.start({folder!r}, {lang!r})
print(json.dumps([live.call(kind, state) for kind, state in {calls!r}]))
"""


def _run_bundle(tmp_path, lang: str, calls: list[tuple[str, dict]]) -> list[str]:
    zipfile.ZipFile(io.BytesIO(live.bundle())).extractall(tmp_path)
    calls = [(k, json.dumps(s)) for k, s in calls]
    code = RUNNER.format(blocked=BLOCKED, folder=str(tmp_path), lang=lang, calls=calls)
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _state(**controls) -> dict:
    return {"preset": explorer.DEFAULT, **explorer.preset_controls(explorer.DEFAULT), **controls}


@pytest.mark.slow  # a fresh interpreter importing the bundle: about a second
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_bundle_alone_computes_what_pylib_computes_in_both_languages(tmp_path, lang):
    states = [_state(), _state(tp=4, sp=False, zero="zero1"), _state(layers=30), _state(heads=60)]
    got = _run_bundle(tmp_path, lang, [("explorer", s) for s in states])
    i18n.set_language(lang)
    try:
        want = [explorer.live_state_html(s) for s in states]
    finally:
        i18n.set_language(None)
    assert got == want
    refusal = i18n.catalog(lang).get("This plan does not fit the model:", "This plan does not fit the model:")
    assert refusal in got[2] and refusal in got[3]  # the refusals, in the page's language


def test_the_form_says_what_the_page_does_in_the_readers_language():
    i18n.set_language("zh")
    try:
        messages = live.status_messages()
        page_zh = explorer.static_explorer()._repr_html_()
    finally:
        i18n.set_language(None)
    for key in ("loading", "computing", "ready", "failed"):
        assert messages[key] != live.status_messages()[key]  # translated
    assert "{error}" in messages["failed"]  # the script puts the error there
    assert i18n.catalog("zh")["plan"] in page_zh and "Pyodide" in page_zh
