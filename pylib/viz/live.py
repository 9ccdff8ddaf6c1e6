"""Explorers that compute in the page, with no kernel: a plain HTML form whose every control reruns pylib itself in
the reader's browser, so the static site answers exactly what the kernel's explorers answer.

    page = LivePage("explorer", fields, presets, args, html)  # what a chapter cell displays (_repr_html_)
    bundle()                                                  # the zip of pylib's torch-free modules the page runs
    call("explorer", '{"preset": ..., "controls": {...}}')    # what the page's script calls: one state's HTML

How it runs: the page carries the form, the first state's tables (computed when the book was built, so the page
reads complete without JavaScript), and this bundle (base64, inside the page: it is the pylib that computed those
tables, so the two cannot drift). On the first change of a control, book/_static/live-explorer.js loads Pyodide
(CPython in WebAssembly, vendored from the npm registry by tools/site/vendor.py: the site needs no other host),
unpacks the bundle and from then on calls `call` for every change. The formulas are pylib's, not a copy:
`pylib.analysis.shapes` and `pylib.analysis.planner` run unchanged (tests/test_viz_live.py checks that the bundle
imports with no torch, ipywidgets, matplotlib or Babel; tests/site/test_live_explorers.py that Pyodide computes
exactly what pylib computes, on a few hundred sampled states, and that the page's controls change its numbers).

Translations: the bundle carries pylib's messages from its catalogs (`pylib.i18n.catalog`, read where the book is
built: Pyodide has no Babel), the same bytes in both editions, and `start` speaks the page's language with them, so
a refusal reads as pylib writes it in either edition; the form's labels are pylib messages, translated when the
page is built.
"""

from __future__ import annotations

import base64
import functools
import html
import importlib
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pylib.i18n import language, tr

ROOT = Path(__file__).resolve().parents[2]  # the folder holding the pylib package
# The modules the page runs: the package roots, the one validity / memory / traffic / cost model, and the explorers'
# widget-free parts. Whole folders for plan and analysis (all torch-free); tests/test_viz_live.py imports the bundle
# alone, with torch and the widget and figure libraries blocked, so a new import outside it fails there.
BUNDLED = (
    "pylib/__init__.py",
    "pylib/i18n/__init__.py",
    "pylib/i18n/columns.py",
    "pylib/i18n/editions.py",
    "pylib/tables.py",
    "pylib/plan",
    "pylib/analysis",
    "pylib/viz/__init__.py",
    "pylib/viz/live.py",
    "pylib/viz/explorer.py",
    "pylib/viz/planner.py",
)
MESSAGES = "pylib_messages.json"  # in the bundle, beside the package: {language: {English message: translation}}
# What each explorer's form computes: "module:function", called with the form's state (a dict) and returning HTML.
KINDS = {
    "explorer": "pylib.viz.explorer:live_state_html",
    "planner": "pylib.viz.planner:live_state_html",
}
_EPOCH = (1980, 1, 1, 0, 0, 0)  # every member's date: the same pylib gives the same bytes (and the same page)


def _member(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, _EPOCH)
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def _files() -> list[Path]:
    out = []
    for name in BUNDLED:
        path = ROOT / name
        out += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return out


@functools.cache
def bundle() -> bytes:
    """The zip the page runs: the BUNDLED sources and MESSAGES, every language's messages from pylib's catalogs
    (both editions carry the same bytes, so their pages differ only in words); deterministic (fixed dates, sorted
    names)."""
    from pylib import i18n

    messages = {lang: i18n.catalog(lang) for lang in i18n.LANGUAGES if lang != "en"}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path in _files():
            z.writestr(_member(path.relative_to(ROOT).as_posix()), path.read_bytes())
        z.writestr(_member(MESSAGES), json.dumps(messages, ensure_ascii=False, sort_keys=True).encode())
    return buf.getvalue()


def start(folder: str, lang: str) -> None:
    """In the page, once, after the bundle is unpacked into `folder` (on sys.path): speak `lang`, the page's
    language, with the bundle's messages (pylib.i18n reads its .po catalogs with Babel, which the page lacks: the
    catalogs read at build time stand in for them)."""
    from pylib import i18n

    messages = json.loads((Path(folder) / MESSAGES).read_text())
    i18n.catalog = lambda language: messages.get(language, {})  # tr looks the catalog up by this name
    i18n.set_language(lang)


def call(kind: str, state: str) -> str:
    """The HTML of one state of explorer `kind` (a key of KINDS); `state` is the form's JSON."""
    module, name = KINDS[kind].split(":")
    return getattr(importlib.import_module(module), name)(json.loads(state))


# ------------------------------------------------------------------------------------------------ the form


@dataclass(frozen=True)
class Field:
    """One control of the form. kind: "select" (options: [(value, label)]), "number" (an integer input from low
    to high in steps of `step`) or "check" (a checkbox)."""

    name: str
    label: str
    kind: str
    options: tuple = ()
    low: int = 1
    high: int = 1 << 20
    step: int = 1


def select(name: str, label: str, values, labels=None) -> Field:
    labels = labels or [str(v) for v in values]
    return Field(name, label, "select", tuple(zip(values, labels)))


def _control(f: Field, value) -> str:
    name, label = html.escape(f.name), html.escape(f.label)
    if f.kind == "check":
        checked = " checked" if value else ""
        return f"<label class='pb-live-check'><input type='checkbox' name='{name}'{checked}> {label}</label>"
    if f.kind == "number":
        box = (
            f"<input type='number' name='{name}' value='{int(value)}' min='{f.low}' max='{f.high}' step='{f.step}'"
            " required>"
        )
    else:
        opts = "".join(
            f"<option value='{html.escape(json.dumps(v))}'{' selected' if v == value else ''}>{html.escape(t)}</option>"
            for v, t in f.options
        )
        box = f"<select name='{name}'>{opts}</select>"
    return f"<label><span>{label}</span>{box}</label>"


_CSS = (
    "<style>.pb-live form{display:flex;flex-wrap:wrap;gap:4px 14px;margin:0 0 8px 0}"
    ".pb-live fieldset{display:flex;flex-wrap:wrap;gap:4px 14px;border:1px solid #8884;padding:4px 8px;margin:0}"
    ".pb-live label{display:flex;gap:6px;align-items:center;font-size:0.9em}"
    ".pb-live input[type=number]{width:7em}.pb-live-status{font-size:0.85em;min-height:1.3em;margin:0;opacity:.8}"
    ".pb-live-out.pb-live-busy{opacity:.5}</style>"
)
# The page's script, loaded once however many explorers the page has, from the site's _static folder
# (content_root: the site root relative to this page, which the theme writes on <html>).
_LOADER = (
    "<script>(function(){if(window.pbLiveLoading)return;window.pbLiveLoading=true;"
    "var r=document.documentElement.dataset.content_root;var s=document.createElement('script');"
    "s.src=(r===undefined?'':r)+'_static/live-explorer.js';document.head.appendChild(s);})();</script>"
)


def status_messages() -> dict[str, str]:
    """What the page's script says while it works, in the reader's language."""
    return {
        "loading": tr("Loading the calculator (Pyodide: Python in the page, about 13 MB, once per visit)…"),
        "computing": tr("Computing…"),
        "ready": tr("Computed in this page by pylib (Pyodide)."),
        "failed": tr("The calculator could not run here: {error}", error="{error}"),
    }


@dataclass
class LivePage:
    """One explorer as the page shows it: the form (`groups`: titled lists of Fields, one of them named "preset"),
    each preset's control values (`presets`, set when the preset changes), the first state (`state`: every field's
    value by name; `html`: what KINDS[kind] returns for it, computed here) and `kind`, which computes every other
    state in the page."""

    kind: str
    groups: list[tuple[str, list[Field]]]
    presets: dict[str, dict]
    state: dict
    html: str

    def form_html(self) -> str:
        values = self.state
        parts = []
        for title, fields in self.groups:
            inner = "".join(_control(f, values[f.name]) for f in fields)
            parts.append(f"<fieldset><legend>{html.escape(title)}</legend>{inner}</fieldset>" if title else inner)
        return "<form onsubmit='return false'>" + "".join(parts) + "</form>"

    def _repr_html_(self) -> str:
        data = json.dumps(
            {"kind": self.kind, "language": language(), "presets": self.presets, "messages": status_messages()},
            ensure_ascii=False,
            sort_keys=True,
        ).replace("</", "<\\/")
        packed = base64.b64encode(bundle()).decode()
        return (
            f"{_CSS}<div class='pb-live' data-kind='{html.escape(self.kind)}'>"
            f"<script type='application/json' class='pb-live-data'>{data}</script>"
            f"<script type='application/zip' class='pb-live-bundle'>{packed}</script>"
            f"{self.form_html()}<p class='pb-live-status' aria-live='polite'></p>"
            f"<div class='pb-live-out'>{self.html}</div></div>{_LOADER}"
        )

    def __repr__(self) -> str:
        return f"LivePage({self.kind!r}, {self.state!r})"
