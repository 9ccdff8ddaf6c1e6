"""A small Sphinx extension for the site (loaded through _config.yml's `sphinx: local_extensions`). It fixes two
faults of the Jupyter Book 1 stack that the site test found:

- Repeated scripts. Sphinx 7 adds a body-only script twice when an extension registers it after the builder
  started (once as `None`, once as `""`); sphinx-thebe does that with `const THEBE_JS_URL = ...`, so every page
  threw "Identifier 'THEBE_JS_URL' has already been declared". `drop_repeated_scripts` keeps the first of any
  repeated script (same file or body, same attributes).
- An empty download. With `execute_notebooks: cache`, myst-nb writes the notebook it was given to
  _build/jupyter_execute/, and when the outputs come from the cache they went into a copy, so the download button
  (which serves that file) gave a notebook without outputs on every rebuild. `restore_executed_notebook` merges
  the cached outputs (and widget state) back in before the theme copies the file.

And it takes out a script nothing needs:

- The icon script. pydata-sphinx-theme puts `_static/scripts/fontawesome.js` (Font Awesome's SVG replacement, 1.5 MB,
  "so that users can add custom icons") on every page, but its own stylesheet already draws every icon the themes
  use (`<i class="fa-solid fa-...">`) from Font Awesome's web fonts, which load only with a page that shows one.
  The template has no switch for it, so `drop_icon_script` takes the tag out of each written page and the file out
  of the site. tests/site checks that every icon still renders.

And it adds the language switch:

- `language_switch` puts a link to the same page in the other edition at the top of every page's article: "中文" on
  an English page (to zh/<page>.html, relative), "English" on a Chinese one (the Chinese site is _build/html/zh/,
  built by tools/i18n/build_zh.py with Sphinx's language zh_CN). tests/site follows it both ways.

It also loads launch_links (this folder): the launch buttons, the run-locally note and the notebook download.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import launch_links  # tools/site/launch_links.py; Jupyter Book puts this folder on sys.path
import nbformat


def _script_key(script: Any) -> tuple:
    attributes = getattr(script, "attributes", {}) or {}
    return (getattr(script, "filename", None) or "", tuple(sorted(attributes.items())))


def drop_repeated_scripts(app, pagename: str, templatename: str, context: dict, doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen: set[tuple] = set()
    kept = []
    for script in scripts:
        key = _script_key(script)
        if key not in seen:
            seen.add(key)
            kept.append(script)
    scripts[:] = kept  # the builder's own list (reset before each page), so modify it in place


def restore_executed_notebook(app, pagename: str, templatename: str, context: dict, doctree) -> None:
    if app.config.nb_execution_mode != "cache":
        return
    path = Path(app.outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"
    if not path.is_file():
        return
    notebook = nbformat.read(path, as_version=4)
    if any(cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"):
        return
    from jupyter_cache import get_cache

    cache_path = app.config.nb_execution_cache_path or str(Path(app.outdir).parent / ".jupyter_cache")
    try:
        _, merged = get_cache(cache_path).merge_match_into_notebook(notebook)
    except KeyError:
        return  # nothing cached for this code (a page with no code cells, or one that was not executed)
    nbformat.write(merged, path)


# The theme's tag, as its webpack-macros.html writes it: <script defer src="../_static/scripts/fontawesome.js?digest=">
ICON_SCRIPT = "_static/scripts/fontawesome.js"
_ICON_SCRIPT_TAG = re.compile(
    r'[ \t]*<script\b[^>]*\bsrc="[^"]*' + re.escape(ICON_SCRIPT) + r'[^"]*"[^>]*>\s*</script>[ \t]*\n?'
)


def drop_icon_script(app, exception) -> None:
    """build-finished: take the icon script's tag out of every page of the site, and the script out of _static."""
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    for page in out.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        kept = _ICON_SCRIPT_TAG.sub("", text)
        if kept != text:
            page.write_text(kept, encoding="utf-8")
    for path in out.joinpath(ICON_SCRIPT).parent.glob(Path(ICON_SCRIPT).name + "*"):  # the script, map, licence
        path.unlink()


def _is_chinese(app) -> bool:
    return (app.config.language or "en").lower().startswith("zh")


def language_switch_href(pagename: str, chinese: bool) -> str:
    """The relative link from `pagename` in one edition to the same page in the other."""
    up = "../" * pagename.count("/")
    return f"{up}../{pagename}.html" if chinese else f"{up}zh/{pagename}.html"


def language_switch(app, pagename: str, templatename: str, context: dict, doctree) -> None:
    if "body" not in context or app.builder.format != "html":
        return
    chinese = _is_chinese(app)
    text, lang = ("English", "en") if chinese else ("中文", "zh-CN")
    href = language_switch_href(pagename, chinese)
    link = f'<p class="language-switch"><a href="{href}" hreflang="{lang}" lang="{lang}">{text}</a></p>\n'
    context["body"] = link + context["body"]


def setup(app) -> dict:
    launch_links.setup(app)
    # Before sphinx-book-theme copies the notebook for its download button (html-page-context, priority 501).
    app.connect("html-page-context", restore_executed_notebook, priority=400)
    # After the extensions that add per-page scripts in html-page-context (myst-nb's widgets: priority 500).
    app.connect("html-page-context", drop_repeated_scripts, priority=900)
    app.connect("html-page-context", language_switch)
    app.connect("build-finished", drop_icon_script)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
