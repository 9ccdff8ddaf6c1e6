"""The built site's links, anchors and assets, read from its HTML files (no browser): every internal link and
cross-reference lands on an existing page and anchor, every label of book/labels.yml is defined by its chapter, no
page loads an asset from another host, the widget manager only where there are widgets and the theme's icon script
nowhere, no emoji check marks, and the launch and download buttons point where they should."""

from __future__ import annotations

import html
import json
import posixpath
import re
import sys
from collections import Counter
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.site import sitemap

sys.path.insert(0, str(sitemap.ROOT / "tools" / "site"))
import launch_links  # noqa: E402 - tools/site is not a package; the site's Sphinx extension imports it the same way


def _broken_links(site, page: str) -> list[str]:
    broken = []
    for href in sitemap.parse(page, site).links:
        if sitemap.is_external(href):
            continue
        target, fragment = sitemap.resolve(page, href)
        if not (site / target).is_file():
            broken.append(f"{href!r}: no file {target}")
        elif fragment and target.endswith(".html") and fragment not in sitemap.parse(target, site).ids:
            broken.append(f"{href!r}: {target} has no anchor #{fragment}")
    return broken


def test_every_internal_link_and_cross_reference_resolves(site, page):
    broken = _broken_links(site, page)
    assert not broken, f"{page}: {len(broken)} broken internal links:\n  " + "\n  ".join(broken)


def test_page_loads_no_asset_from_another_host(site, page):
    parsed = sitemap.parse(page, site)
    external = [src for src, _ in parsed.scripts if sitemap.is_external(src)]
    external += [f"{href} ({rel})" for href, rel in parsed.stylesheets if sitemap.is_external(href)]
    external += [src for src, _ in parsed.images if sitemap.is_external(src) and not src.startswith("data:")]
    assert not external, f"{page} loads from other hosts (vendor them, see tools/site/vendor.py): {external}"
    missing = []
    for url in [s for s, _ in parsed.scripts] + [h for h, _ in parsed.stylesheets] + [s for s, _ in parsed.images]:
        if url.startswith("data:"):
            continue
        target, _ = sitemap.resolve(page, url)
        if not (site / target).is_file():
            missing.append(f"{url} (no file {target})")
    assert not missing, f"{page} names assets that are not in the site: {missing}"


def test_page_loads_each_script_once_and_only_the_vendored_entry_points(site, page):
    scripts = [sitemap.resolve(page, sitemap.strip_query(src))[0] for src, _ in sitemap.parse(page, site).scripts]
    scripts = [sitemap.in_edition(page, s) for s in scripts]
    repeated = [s for s, n in Counter(scripts).items() if n > 1]
    assert not repeated, f"{page} loads these scripts more than once: {repeated}"
    # _static/vendor/fontawesome/ is the pydata theme's own; the rest of _static/vendor/ is book/_static/vendor/.
    vendored = {s for s in scripts if s.startswith("_static/vendor/") and "/fontawesome/" not in s}
    unexpected = vendored - sitemap.VENDOR_ENTRY_POINTS
    assert not unexpected, (
        f"{page} loads vendored files directly: {sorted(unexpected)}. Is there a _static/ folder at the book root? "
        "Jupyter Book then adds every script of every static path to every page."
    )


def test_saved_widget_state_covers_every_widget_view(site, page):
    """A page that shows widgets carries their state (one state script) and the widget manager that renders it."""
    parsed = sitemap.parse(page, site)
    views = parsed.script_types.count(sitemap.WIDGET_VIEW)
    states = parsed.script_types.count(sitemap.WIDGET_STATE)
    if views == 0:
        return
    assert states == 1, f"{page}: {views} widget views but {states} saved widget-state scripts"
    scripts = {sitemap.in_edition(page, sitemap.resolve(page, sitemap.strip_query(s))[0]) for s, _ in parsed.scripts}
    needed = {"_static/vendor/requirejs/require.js", "_static/vendor/html-manager/embed-amd.js"}
    assert needed <= scripts, f"{page} shows widgets but does not load {sorted(needed - scripts)}"


WIDGET_SCRIPTS = {
    "_static/vendor/requirejs/require.js",
    "_static/widget-support.js",
    "_static/vendor/html-manager/embed-amd.js",
}


def test_widget_manager_loads_only_on_pages_with_widgets(site, page):
    """The widget manager's bundle is 3.6 MB: a page without saved widget views must not load it."""
    parsed = sitemap.parse(page, site)
    if parsed.script_types.count(sitemap.WIDGET_VIEW):
        return
    scripts = {sitemap.in_edition(page, sitemap.resolve(page, sitemap.strip_query(s))[0]) for s, _ in parsed.scripts}
    assert not scripts & WIDGET_SCRIPTS, f"{page} shows no widget but loads {sorted(scripts & WIDGET_SCRIPTS)}"


ICON_SCRIPT = "_static/scripts/fontawesome.js"


def test_no_page_loads_the_theme_icon_script(site, page):
    """pydata-sphinx-theme's fontawesome.js (1.5 MB) draws nothing its stylesheet's icon fonts do not already draw;
    tools/site/sphinx_site.py leaves it out (and tests/site/test_browser.py checks that every icon is drawn)."""
    scripts = {sitemap.resolve(page, sitemap.strip_query(s))[0] for s, _ in sitemap.parse(page, site).scripts}
    scripts = {sitemap.in_edition(page, s) for s in scripts}
    assert ICON_SCRIPT not in scripts, f"{page} loads {ICON_SCRIPT}"
    assert not (site / sitemap.edition(page) / ICON_SCRIPT).exists(), f"{ICON_SCRIPT} is in the site"


# The emoji check marks: without an emoji font (many Linux desktops) they are empty boxes; the book writes ✓ and ✗.
EMOJI_MARKS = re.compile("\u2705|\u274c|\u274e|\u2714\ufe0f|\u2716\ufe0f")
_JSON_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})")


def test_no_emoji_check_marks(site, page):
    """Over the whole page as written: its text, code, outputs, and the saved widget state (whose HTML is in JSON,
    where a character may be \\u-escaped)."""
    text = html.unescape((site / page).read_text(encoding="utf-8"))
    text = _JSON_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text)
    found = Counter(m.group(0) for m in EMOJI_MARKS.finditer(text))
    assert not found, f"{page}: emoji check marks {dict(found)} (write ✓ and ✗)"


def test_every_chapter_in_the_toc_was_built(site, edition):
    missing = [d for d in sitemap.toc_docnames() if not (site / f"{edition}{d}.html").is_file()]
    assert not missing, f"chapters of _toc.yml with no page in the site: {missing}"


# ------------------------------------------------------------------------------------------------ labels


def test_labels_of_chapters_in_the_toc_are_defined_by_their_chapter(site, edition):
    in_toc = set(sitemap.toc_docnames())
    missing = []
    for chapter, labels in sitemap.label_map().items():
        if chapter not in in_toc:
            continue
        ids = sitemap.parse(f"{edition}{chapter}.html", site).ids
        missing += [f"{label} (in {chapter})" for label in labels if label not in ids]
    assert not missing, (
        "labels of book/labels.yml whose chapter is in the TOC but defines no such anchor "
        f"(add `(label)=` or `name: label` in the chapter, or fix book/labels.yml): {missing}"
    )


def test_pending_labels_are_not_defined_on_another_page(site):
    """A label listed under a chapter that is not in the TOC yet must not already live on some other page: if it
    does, book/labels.yml names the wrong chapter and the label would stay unchecked."""
    in_toc = set(sitemap.toc_docnames())
    pending = {
        label: chapter for chapter, labels in sitemap.label_map().items() if chapter not in in_toc for label in labels
    }
    elsewhere = []
    for page in sitemap.site_pages(site):
        for label in pending.keys() & sitemap.parse(page, site).ids:
            elsewhere.append(f"{label}: listed under {pending[label]} but defined in {page}")
    assert not elsewhere, "fix book/labels.yml:\n  " + "\n  ".join(elsewhere)


# ------------------------------------------------------------------------------- launch and download buttons


def _notebook_chapters() -> list[str]:
    return [d for d in sitemap.toc_docnames() if sitemap.is_notebook_source(d)]


def _launch_settings():
    """The launch settings as the site's build reads them: _config.yml through Jupyter Book's own conversion."""
    from jupyter_book.config import yaml_to_sphinx

    return launch_links.LaunchSettings.from_theme_options(yaml_to_sphinx(sitemap.config())[0]["html_theme_options"])


@pytest.mark.parametrize("docname", _notebook_chapters())
def test_notebook_page_launches_its_own_source_or_says_how_to_run_it(site, docname, edition):
    """With a hub configured, one launch link, exactly the one tools/site/launch_links.py makes for the chapter's
    source (the link make hub-test follows); with none, no launch link and the note on running it locally."""
    settings = _launch_settings()
    page = sitemap.parse(f"{edition}{docname}.html", site)
    launches = [h for h in page.links if "/hub/user-redirect/" in h]
    source = sitemap.source_of(docname).relative_to(sitemap.ROOT).as_posix()
    if not settings.hub_url:
        assert not launches, f"{docname}.html: launch links with no hub configured: {launches}"
        assert "run-this-chapter" in page.ids, f"{docname}.html: no hub and no note on running the chapter locally"
        return
    assert launches == [launch_links.launch_url(settings, source)], f"{docname}.html: {launches}"
    query = {k: v[0] for k, v in parse_qs(urlsplit(launches[0]).query).items()}
    # nbgitpuller clones into a folder named after the repository; the rest is the chapter's source path.
    assert query["urlpath"] == f"lab/tree/{posixpath.basename(settings.repository_url)}/{source}", query
    assert "run-this-chapter" not in page.ids, f"{docname}.html has a launch button and the run-locally note"


# Hosts and paths that are placeholders, never a real destination (RFC 2606 names, GitHub's "example" user).
PLACEHOLDER = re.compile(
    r"^https?://([^/]*\.)?example\.(org|com|net)(/|$)|^https?://[^/]+\.invalid(/|$)|github\.com/example/"
)


def test_no_page_links_to_a_placeholder(site):
    found = [
        f"{page}: {href}"
        for page in sitemap.site_pages(site)
        for href in sitemap.parse(page, site).links
        if PLACEHOLDER.search(href)
    ]
    assert not found, "links that lead nowhere (set or empty them in _config.yml):\n  " + "\n  ".join(found)


@pytest.mark.parametrize("docname", _notebook_chapters())
def test_notebook_page_offers_the_executed_notebook_for_download(site, docname, edition):
    page = f"{edition}{docname}.html"
    downloads = [h for h in sitemap.parse(page, site).links if h.endswith(".ipynb") and not sitemap.is_external(h)]
    assert downloads, (
        f"{page}: no download link to an .ipynb (tools/site/launch_links.py puts the executed notebook in _sources/ "
        "for the theme's download button)"
    )
    for href in downloads:
        target, _ = sitemap.resolve(page, href)
        notebook = site / target
        assert notebook.is_file(), f"{page}: {href} -> missing {target}"
        cells = json.loads(notebook.read_text())["cells"]
        code = [c for c in cells if c["cell_type"] == "code"]
        assert any(c.get("outputs") for c in code), f"{target}: no outputs, so not the executed notebook"


# ------------------------------------------------------------------------------------------------ the labs page

LABS_PAGE = "book/labs/index.html"


def _lab_names() -> list[str]:
    return sorted(p.name for p in (sitemap.ROOT / "labs").glob("[0-9][0-9]_*.ipynb"))


def test_labs_page_launches_every_lab_or_says_how_to_run_it(site, edition):
    """With a hub, one launch link per lab in labs/, the one launch_links.launch_url makes for the lab's path; with
    none, no launch link and the section on running a lab locally."""
    settings = _launch_settings()
    page = sitemap.parse(edition + LABS_PAGE, site)
    launches = [h for h in page.links if "/hub/user-redirect/" in h]
    if not settings.hub_url:
        assert not launches, f"{LABS_PAGE}: launch links with no hub configured: {launches}"
        assert launch_links.RUN_LAB_LOCALLY in page.ids, f"{LABS_PAGE}: no section on running a lab locally"
        return
    assert launches == [launch_links.launch_url(settings, f"labs/{name}") for name in _lab_names()], launches


def test_labs_page_offers_every_learner_version_for_download(site, edition):
    """One download per lab in labs/, and each is the learner version (no solution cell, solution = False)."""
    page = sitemap.parse(edition + LABS_PAGE, site)
    downloads = [h for h in page.links if h.endswith(".ipynb") and "_downloads/" in h and not sitemap.is_external(h)]
    assert sorted(posixpath.basename(h) for h in downloads) == _lab_names(), downloads
    for href in downloads:
        target, _ = sitemap.resolve(edition + LABS_PAGE, href)
        notebook = json.loads((site / target).read_text())
        assert notebook["metadata"].get("pylib_lab") == {"version": "learner"}, f"{target}: not the learner version"
        solution_cells = [c for c in notebook["cells"] if "solution" in c.get("metadata", {}).get("tags", [])]
        assert not solution_cells, f"{target}: {len(solution_cells)} solution cells"
