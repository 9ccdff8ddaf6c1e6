"""Every page of the built site, opened in Debian's chromium from a server on 127.0.0.1, as a reader would see it:
nothing fails to load, nothing is logged as an error, nothing is fetched from another host, math is typeset, images
load and say what they show, the sidebar reaches every chapter, saved widgets render. Screenshots of a few key pages
in the light and the dark theme go to _build/screenshots/ for a person to look at."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest

from tests.site import sitemap

LOAD_TIMEOUT_MS = 30_000
WIDGET_TIMEOUT_MS = 20_000
VIEWPORT = {"width": 1280, "height": 900}

# Raw TeX a reader would see if MathJax did not run or did not find the math: \( \) \[ \] delimiters, $$, or a $...$
# pair around something TeX-like (a backslash command, ^ or _).
RAW_TEX = re.compile(r"\\\(|\\\)|\\\[|\\\]|\$\$|\$[^$\n]{0,200}?(\\[A-Za-z]+|[\^_])[^$\n]{0,200}?\$")
IMAGE_FILE = re.compile(r"\.(png|jpe?g|gif|svg|webp)$", re.IGNORECASE)

# The pydata theme's light/dark switch: data-theme (and data-mode, which its toggle button reads) on <html>.
SET_THEME = "t => { document.documentElement.dataset.theme = t; document.documentElement.dataset.mode = t; }"

# Runs in the page once it has loaded: everything the checks need, in one pass.
COLLECT = """
() => {
  const skip = "pre, code, script, style, textarea, mjx-container, .highlight, .cell_output pre";
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const texts = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (el && !el.closest(skip) && n.textContent.trim()) texts.push(n.textContent);
  }
  const math = Array.from(document.querySelectorAll(".math"));
  const views = Array.from(document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]'));
  return {
    url: location.href,
    text: texts.join(" "),
    math: math.length,
    mathUntypeset: math.filter(m => !m.querySelector("mjx-container")).map(m => m.textContent.slice(0, 80)),
    mathErrors: document.querySelectorAll("mjx-merror, .MathJax_Error").length,
    images: Array.from(document.images).map(i => ({
      src: i.getAttribute("src"), alt: i.getAttribute("alt"), loaded: i.complete && i.naturalWidth > 0,
      inContent: !!i.closest("article"),
    })),
    figures: Array.from(document.querySelectorAll("article figure")).map(f => ({
      id: f.id, hasImage: !!f.querySelector("img, svg, canvas, .widget-subarea, [role=img]"),
    })),
    sidebar: Array.from(document.querySelectorAll(".bd-sidebar-primary a[href]")).map(a => a.href),
    widgetViews: views.length,
    widgetsRendered: views.filter(v => {
      const area = v.previousElementSibling;
      return area && area.classList.contains("widget-subarea") && area.firstElementChild
        && area.getBoundingClientRect().height > 0;
    }).length,
  };
}
"""


@dataclass
class Visit:
    """What one visit of a page saw."""

    data: dict = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)  # requests that failed or answered >= 400
    foreign: list[str] = field(default_factory=list)  # requests to another host (blocked)
    errors: list[str] = field(default_factory=list)  # console errors and uncaught exceptions


_visits: dict[str, Visit] = {}


def _local(url: str, base_url: str) -> bool:
    return url.startswith(base_url) or urlsplit(url).scheme in ("data", "blob", "about")


def _open(browser, base_url: str, path: str, color_scheme: str = "light"):
    """A new page on `path`, loaded, with MathJax done and saved widgets rendered; and what the visit saw."""
    visit = Visit()
    context = browser.new_context(viewport=VIEWPORT, color_scheme=color_scheme)

    def route(r):
        if _local(r.request.url, base_url):
            r.continue_()
        else:
            visit.foreign.append(r.request.url)
            r.abort("blockedbyclient")

    context.route("**/*", route)
    page = context.new_page()

    # A request to another host is aborted by the route above and counted there, not again as a failure here.
    def failed(r):
        if _local(r.url, base_url):
            visit.failed.append(f"{r.url} ({r.failure})")

    def answered(r):
        if r.status >= 400:
            visit.failed.append(f"{r.url} (HTTP {r.status})")

    def logged(m):
        if m.type == "error":
            visit.errors.append(f"console.error: {m.text}")

    page.on("requestfailed", failed)
    page.on("response", answered)
    page.on("console", logged)
    page.on("pageerror", lambda e: visit.errors.append(f"uncaught: {e}"))
    page.goto(base_url + path, wait_until="load", timeout=LOAD_TIMEOUT_MS)
    redirect = sitemap.parse(path).redirect
    if redirect:  # a redirect stub (index.html): check the page it leads to
        target, _ = sitemap.resolve(path, redirect)
        page.wait_for_url(base_url + target, timeout=LOAD_TIMEOUT_MS)
        page.wait_for_load_state("load", timeout=LOAD_TIMEOUT_MS)
    page.evaluate("() => window.MathJax && MathJax.startup ? MathJax.startup.promise : null")
    views = page.locator('script[type="application/vnd.jupyter.widget-view+json"]').count()
    if views:
        try:
            page.wait_for_function(
                """n => Array.from(document.querySelectorAll(
                     'script[type="application/vnd.jupyter.widget-view+json"]')).filter(v => {
                       const a = v.previousElementSibling;
                       return a && a.classList.contains("widget-subarea") && a.firstElementChild; }).length >= n""",
                arg=views,
                timeout=WIDGET_TIMEOUT_MS,
            )
        except Exception:  # noqa: BLE001 - reported by the widget check below, with the counts
            pass
    page.wait_for_load_state("networkidle", timeout=LOAD_TIMEOUT_MS)
    visit.data = page.evaluate(COLLECT)
    return context, page, visit


@pytest.fixture
def visit(browser, base_url, page) -> Visit:
    """One visit per page for all the checks below (opened by the first check that asks)."""
    if page not in _visits:
        context, _, v = _open(browser, base_url, page)
        context.close()
        _visits[page] = v
    return _visits[page]


def test_page_loads_with_no_failed_request_and_no_console_error(page, visit):
    assert not visit.failed, f"{page}: failed requests: {visit.failed}"
    assert not visit.errors, f"{page}: errors: {visit.errors}"


def test_page_requests_nothing_from_another_host(page, visit):
    assert not visit.foreign, f"{page} requested other hosts (blocked): {visit.foreign}"


def test_math_is_typeset_and_no_raw_tex_is_left(page, visit):
    d = visit.data
    problems = [f"not typeset: {m!r}" for m in d["mathUntypeset"]]
    if d["mathErrors"]:
        problems.append(f"{d['mathErrors']} TeX errors (MathJax error boxes: an undefined macro or a syntax error)")
    problems += [f"raw TeX in the text: {m.group(0)[:60]!r}" for m in RAW_TEX.finditer(d["text"])]
    assert not problems, f"{page} ({d['math']} math elements):\n  " + "\n  ".join(problems)


def test_every_image_loads_and_says_what_it_shows(page, visit):
    problems = [f"did not load: {i['src']}" for i in visit.data["images"] if not i["loaded"]]
    # With no alt text Sphinx writes the image's path as its alt: that says nothing to a reader either.
    for i in visit.data["images"]:
        alt = (i["alt"] or "").strip()
        if not alt or alt == i["src"] or IMAGE_FILE.search(alt):
            problems.append(f"no alt text (give the figure `alt`, see pylib/viz/style.py): {i['src']} alt={i['alt']!r}")
    problems += [f"figure shows nothing: {f['id'] or '(no id)'}" for f in visit.data["figures"] if not f["hasImage"]]
    assert not problems, f"{page}:\n  " + "\n  ".join(problems)


def test_sidebar_reaches_every_chapter_in_the_toc(page, visit, base_url):
    reached = {urlsplit(u)._replace(query="", fragment="").geturl() for u in visit.data["sidebar"]}
    reached = {u[len(base_url) :] for u in reached if u.startswith(base_url)}
    missing = [d for d in sitemap.toc_docnames() if f"{d}.html" not in reached]
    assert not missing, f"{page}: the sidebar has no link to {missing}"


def test_saved_widgets_render(page, visit):
    d = visit.data
    assert d["widgetsRendered"] == d["widgetViews"], (
        f"{page}: {d['widgetViews']} saved widget views, {d['widgetsRendered']} rendered"
    )


def test_screenshot_key_page_in_light_and_dark_theme(browser, base_url, key_page, screenshots):
    """The top of the page, and the first figure or widget scrolled into view, in each theme (the pydata theme
    switches with data-theme on <html>), saved to _build/screenshots/ for a person to look at."""
    context, page, visit = _open(browser, base_url, key_page)
    stem = key_page.removesuffix(".html").replace("/", "-")
    try:
        for theme in ("light", "dark"):
            page.evaluate(SET_THEME, theme)
            page.evaluate("() => window.scrollTo(0, 0)")
            page.wait_for_timeout(300)
            assert page.evaluate("() => getComputedStyle(document.body).backgroundColor") != "", theme
            page.screenshot(path=screenshots / f"{stem}-{theme}.png")
            first = page.locator("article figure, article .cell_output img, article .widget-subarea").first
            if first.count():
                first.evaluate("e => e.scrollIntoView({block: 'center'})")
                page.wait_for_timeout(200)
                page.screenshot(path=screenshots / f"{stem}-{theme}-figure.png")
        light, dark = (screenshots / f"{stem}-{t}.png" for t in ("light", "dark"))
        assert light.stat().st_size > 10_000 and dark.stat().st_size > 10_000
        assert light.read_bytes() != dark.read_bytes(), f"{key_page}: the dark theme did not change the page"
        assert not visit.errors, f"{key_page}: {visit.errors}"
    finally:
        context.close()
