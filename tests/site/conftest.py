"""Fixtures of the site tests: the built site, served on 127.0.0.1, and Debian's chromium driven by Playwright."""

from __future__ import annotations

import functools
import http.server
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


def pytest_generate_tests(metafunc):
    """`page` is every HTML page of the built site; `key_page` the few pages that get screenshots."""
    if "page" in metafunc.fixturenames:
        pages = sitemap.site_pages() if sitemap.SITE.is_dir() else []
        metafunc.parametrize("page", pages or ["(no built site)"])
    if "key_page" in metafunc.fixturenames:
        metafunc.parametrize("key_page", [d + ".html" for d in sitemap.key_docnames()])


@pytest.fixture(scope="session")
def site() -> Path:
    if not (sitemap.SITE / "index.html").is_file():
        pytest.fail(f"no built site in {sitemap.SITE}: run `make book` first")
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
def screenshots() -> Path:
    shutil.rmtree(sitemap.SCREENSHOTS, ignore_errors=True)
    sitemap.SCREENSHOTS.mkdir(parents=True)
    return sitemap.SCREENSHOTS


def pytest_terminal_summary(terminalreporter):
    """List the labels whose chapter is not in the TOC yet (not a failure; see book/labels.yml)."""
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
