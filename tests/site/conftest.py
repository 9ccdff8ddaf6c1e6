"""Fixtures of the site tests: the built site, served on 127.0.0.1, and Debian's chromium driven by Playwright."""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import threading
from pathlib import Path

import pytest

from tests.site import sitemap

# Debian's chromium (apt-get install chromium). Playwright drives it; `playwright install` is never run.
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# What the browser measured on each page (width at phone size, weight, ...), for the summary at the end of the run
# and _build/site-measures.json.
MEASURES = pytest.StashKey[dict]()
MEASURES_FILE = sitemap.ROOT / "_build" / "site-measures.json"


def pytest_generate_tests(metafunc):
    """`page` is every HTML page of the built site; `widget_page` those that show saved widgets; `key_page` the
    few pages that get screenshots. `page` covers both editions: the Chinese pages are the site's zh/ folder."""
    pages = sitemap.site_pages() if sitemap.SITE.is_dir() else []
    if "page" in metafunc.fixturenames:
        metafunc.parametrize("page", pages or ["(no built site)"])
    if "widget_page" in metafunc.fixturenames:
        # English only: the controls move the same saved state in both editions (each page's widgets are rendered
        # and checked in both by test_saved_widgets_render).
        widget_pages = [
            p for p in pages if not sitemap.edition(p) and sitemap.WIDGET_VIEW in sitemap.parse(p).script_types
        ]
        metafunc.parametrize("widget_page", widget_pages or ["(no page with widgets)"])
    if "edition" in metafunc.fixturenames:  # checks of the table of contents, once per edition ("" or "zh/")
        metafunc.parametrize("edition", list(sitemap.EDITIONS.values()), ids=list(sitemap.EDITIONS))
    if "key_page" in metafunc.fixturenames:
        metafunc.parametrize("key_page", [d + ".html" for d in sitemap.key_docnames()])


def pytest_collection_modifyitems(items):
    """Under `pytest -n N --dist loadgroup` (make site-test) every check of one page runs on the same worker, so the
    page is loaded once (`test_browser.visit` keeps one visit per page and process), not once per worker."""
    for item in items:
        page = getattr(item, "callspec", None) and item.callspec.params.get("page")
        if page:
            item.add_marker(pytest.mark.xdist_group(page))
        elif "screenshots" in getattr(item, "fixturenames", ()):  # one worker empties the folder, then fills it
            item.add_marker(pytest.mark.xdist_group("screenshots"))


@pytest.fixture(scope="session")
def site() -> Path:
    if not (sitemap.SITE / "index.html").is_file():
        pytest.fail(f"no built site in {sitemap.SITE}: run `make book` first")
    if not (sitemap.SITE / sitemap.ZH / "index.html").is_file():
        pytest.fail(f"no Chinese edition in {sitemap.SITE / sitemap.ZH}: run `make book` (tools/i18n/build_zh.py)")
    return sitemap.SITE


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="session")
def base_url(site):
    """The site served by a thread on 127.0.0.1 on a free port, for the whole session."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=site))
    thread = threading.Thread(target=server.serve_forever, name="site-server", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does it in CI)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        # launch() starts from a fresh, temporary user-data-dir every time.
        b = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def measures(pytestconfig) -> dict:
    """{page: {what: value}}: each browser check adds what it measured."""
    return pytestconfig.stash.setdefault(MEASURES, {})


@pytest.fixture(scope="session")
def screenshots() -> Path:
    shutil.rmtree(sitemap.SCREENSHOTS, ignore_errors=True)
    sitemap.SCREENSHOTS.mkdir(parents=True)
    return sitemap.SCREENSHOTS


def _report_measures(terminalreporter) -> None:
    measured = terminalreporter.config.stash.get(MEASURES, {})
    if not measured:
        return
    MEASURES_FILE.parent.mkdir(parents=True, exist_ok=True)
    MEASURES_FILE.write_text(json.dumps(measured, indent=1, sort_keys=True) + "\n")
    terminalreporter.section("pages as measured (also in _build/site-measures.json)")
    terminalreporter.write_line(
        f"{'page':34} {'width@390':>9} {'weight MB':>9} {'gzip MB':>8} {'requests':>8} {'widgets':>7}  heaviest"
    )
    for page in sorted(measured):
        m = measured[page]
        heaviest = ", ".join(f"{name} {size / 1e6:.2f}" for name, size in m.get("heaviest", [])[:3])
        terminalreporter.write_line(
            f"{page:34} {m.get('phone_width', '-'):>9} {m.get('weight', 0) / 1e6:>9.2f} "
            f"{m.get('weight_gzip', 0) / 1e6:>8.2f} {m.get('requests', 0):>8} {m.get('widget_views', 0):>7}  {heaviest}"
        )
    if any("column_px" in m for m in measured.values()):
        widths = sorted({m["column_px"] for m in measured.values() if m.get("column_px")})
        terminalreporter.write_line(f"width a wide figure gets at 1280 px (pylib.viz.style.COLUMN_PX): {widths}")


def pytest_sessionfinish(session):
    """A worker of `pytest -n N` hands its pages' measures to the controller, which reports them all."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["site_measures"] = json.dumps(session.config.stash.get(MEASURES, {}))


def pytest_testnodedown(node, error):
    """The controller gathers each worker's measures (`pytest_sessionfinish`)."""
    measured = json.loads(getattr(node, "workeroutput", {}).get("site_measures", "{}"))
    node.config.stash.setdefault(MEASURES, {}).update(measured)


def pytest_terminal_summary(terminalreporter):
    """The measures of each page; then the labels whose chapter is not in the TOC yet (not a failure; see
    book/labels.yml)."""
    _report_measures(terminalreporter)
    if not sitemap.LABELS.is_file():
        return
    in_toc = set(sitemap.toc_docnames())
    pending = {c: names for c, names in sitemap.label_map().items() if c not in in_toc}
    checked = sum(len(names) for c, names in sitemap.label_map().items() if c in in_toc)
    terminalreporter.section("book labels (book/labels.yml)")
    terminalreporter.write_line(f"{checked} labels of chapters in the TOC checked")
    for chapter, names in pending.items():
        terminalreporter.write_line(
            f"pending, chapter not written yet ({chapter} is not in _toc.yml): {len(names)} labels: " + ", ".join(names)
        )
