"""What the site tests know about the built site and the book's sources: its pages, their anchors and links, the
table of contents, the configuration and the label map. Pure functions of files; no browser."""

from __future__ import annotations

import functools
import posixpath
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import yaml

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "_build" / "html"
# The two editions, as folders of the site: English at its root, Chinese in zh/ (tools/i18n/build_zh.py). A page
# is named by its path in the site ("book/part3/tp.html", "zh/book/part3/tp.html"); checks that compare a path with
# one of the edition's own (its _static/, its chapters) take the page's edition prefix off first (`in_edition`).
ZH = "zh/"
EDITIONS = {"en": "", "zh": ZH}
SCREENSHOTS = ROOT / "_build" / "screenshots"
LABELS = ROOT / "book" / "labels.yml"
SEED_MAP = ROOT / "SEED-MAP.md"  # what the book must carry from its two seed documents, with the labels it defines
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
# The scripts of book/_static/vendor/ a page may load (as _config.yml names them); everything else in that folder
# is loaded by these on demand.
VENDOR_ENTRY_POINTS = {
    "_static/vendor/mathjax/tex-mml-chtml.js",
    "_static/vendor/requirejs/require.js",
    "_static/vendor/html-manager/embed-amd.js",
}


# --------------------------------------------------------------------------------------------- configuration


@functools.cache
def config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text())


@functools.cache
def toc() -> dict:
    return yaml.safe_load((ROOT / "_toc.yml").read_text())


def toc_docnames(node=None) -> list[str]:
    """Every page of _toc.yml (the root first), as docnames (paths without suffix), in reading order."""
    node = toc() if node is None else node
    found: list[str] = []
    if isinstance(node, dict):
        for key in ("root", "file"):
            if isinstance(node.get(key), str):
                found.append(_docname(node[key]))
        for key, value in node.items():
            if key not in ("root", "file"):
                found += toc_docnames(value)
    elif isinstance(node, list):
        for item in node:
            found += toc_docnames(item)
    return found


def _docname(path: str) -> str:
    p = Path(path)
    return str(p.with_suffix("")) if p.suffix in (".md", ".ipynb", ".rst") else path


def key_docnames(limit: int = 4) -> list[str]:
    """The pages to screenshot: the root, then the first page of each part (or of the top-level chapter list)."""
    t = toc()
    picks = [_docname(t["root"])]
    groups = t.get("parts") or [t]
    for group in groups:
        pages = toc_docnames(group.get("chapters", []))
        if pages and pages[0] not in picks:
            picks.append(pages[0])
    return picks[:limit]


def source_of(docname: str) -> Path | None:
    for suffix in (".md", ".ipynb", ".rst"):
        if (ROOT / docname).with_suffix(suffix).exists():
            return (ROOT / docname).with_suffix(suffix)
    return None


def is_notebook_source(docname: str) -> bool:
    """A page executed as a notebook (an .ipynb, or MyST Markdown with a kernelspec): it gets launch buttons."""
    src = source_of(docname)
    if src is None:
        return False
    if src.suffix == ".ipynb":
        return True
    text = src.read_text()
    if not text.startswith("---"):
        return False
    front_matter = yaml.safe_load(text[3:].split("\n---", 1)[0]) or {}
    return "kernelspec" in front_matter


# ------------------------------------------------------------------------------------------------ the pages


def site_pages(site: Path = SITE) -> list[str]:
    """Every HTML page of the built site, relative to its root (asset folders such as _static/ left out)."""
    pages = []
    for path in sorted(site.rglob("*.html")):
        rel = path.relative_to(site)
        if any(part.startswith("_") for part in rel.parts[:-1]):
            continue
        pages.append(rel.as_posix())
    return pages


def edition(page: str) -> str:
    """The edition prefix of a page of the site: "zh/" for the Chinese edition, "" for the English one."""
    return ZH if page.startswith(ZH) else ""


def in_edition(page: str, target: str) -> str:
    """A site path resolved from `page`, relative to the root of the page's edition."""
    return target.removeprefix(edition(page))


def edition_pages(prefix: str, site: Path = SITE) -> list[str]:
    return [p for p in site_pages(site) if edition(p) == prefix]


@dataclass
class Page:
    """The parts of one HTML page the checks read."""

    redirect: str | None = None  # the URL of a <meta http-equiv="refresh"> (index.html points to the root page)
    ids: set[str] = field(default_factory=set)
    links: list[str] = field(default_factory=list)  # <a href>
    scripts: list[tuple[str, str]] = field(default_factory=list)  # (src, type) of <script src>
    script_types: list[str] = field(default_factory=list)  # type of every <script>, inline ones included
    stylesheets: list[tuple[str, str]] = field(default_factory=list)  # (href, rel) of <link>
    images: list[tuple[str, str | None]] = field(default_factory=list)  # (src, alt) of <img>
    lang: str | None = None  # <html lang>
    language_switch: list[str] = field(default_factory=list)  # href of the links in <p class="language-switch">


class _Collector(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.page = Page()

        self._in_switch = False

    def handle_endtag(self, tag):
        if tag == "p":
            self._in_switch = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "html":
            self.page.lang = a.get("lang")
        elif tag == "p" and "language-switch" in (a.get("class") or "").split():
            self._in_switch = True
        if tag == "a" and self._in_switch and a.get("href") is not None:
            self.page.language_switch.append(a["href"])
        if a.get("id"):
            self.page.ids.add(a["id"])
        if tag == "a":
            if a.get("name"):
                self.page.ids.add(a["name"])
            if a.get("href") is not None:
                self.page.links.append(a["href"])
        elif tag == "script":
            self.page.script_types.append(a.get("type") or "")
            if a.get("src"):
                self.page.scripts.append((a["src"], a.get("type") or ""))
        elif tag == "link" and a.get("href"):
            self.page.stylesheets.append((a["href"], a.get("rel") or ""))
        elif tag == "img":
            self.page.images.append((a.get("src") or "", a.get("alt")))
        elif tag == "meta" and (a.get("http-equiv") or "").lower() == "refresh":
            match = re.search(r"url=(.+)$", a.get("content") or "", re.IGNORECASE)
            self.page.redirect = match.group(1).strip().strip("'\"") if match else None


@functools.cache
def parse(page: str, site: Path = SITE) -> Page:
    collector = _Collector()
    collector.feed((site / page).read_text(encoding="utf-8"))
    return collector.page


def is_external(url: str) -> bool:
    """A URL that names a scheme or a host (http:, https:, //host, mailto:, javascript:), not a site path."""
    parts = urlsplit(url)
    return bool(parts.scheme or parts.netloc)


def resolve(page: str, url: str) -> tuple[str, str]:
    """(site-relative path, fragment) that a relative URL on `page` points to; a path ending in / gets index.html."""
    parts = urlsplit(url)
    path = unquote(parts.path)
    if not path:
        target = page
    else:
        target = posixpath.normpath(posixpath.join(posixpath.dirname(page), path))
        if path.endswith("/"):
            target = posixpath.join(target, "index.html")
    return target, unquote(parts.fragment)


def strip_query(url: str) -> str:
    return urlsplit(url)._replace(query="", fragment="").geturl()


# A matplotlib SVG draws each text as paths (pylib.viz.style: svg.fonttype "path") in a group scaled from its font's
# units: `scale(s -s)`, s = fontsize / 100 (matplotlib.textpath's FONT_SCALE), in the SVG's user units (points,
# the viewBox's). So the smallest text of a figure can be read from its file, with no font and no browser.
_SVG_TEXT_SCALE = re.compile(r"scale\((-?[0-9.]+) (-?[0-9.]+)\)")
_SVG_VIEWBOX = re.compile(r'<svg[^>]*\sviewBox="[-0-9. ]*?\s([0-9.]+)\s+[0-9.]+"')


@functools.cache
def svg_text_size(path: Path) -> tuple[float, float] | None:
    """(smallest text size, viewBox width) of a matplotlib SVG, both in its user units: shown w CSS px wide, its
    smallest text is size * w / width px high. None for an SVG with no text drawn as paths (or no viewBox)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    box = _SVG_VIEWBOX.search(text)
    sizes = [100 * float(a) for a, b in _SVG_TEXT_SCALE.findall(text) if float(a) > 0 and float(b) == -float(a)]
    if box is None or not sizes:
        return None
    return min(sizes), float(box[1])


# ------------------------------------------------------------------------------------------------ the labels


SEED_LABEL = re.compile(r"^(sec|tbl|fig)-[a-z0-9]+(-[a-z0-9]+)*$")


@functools.cache
def label_map() -> dict[str, list[str]]:
    """book/labels.yml: {chapter docname: [labels it must define]}."""
    data = yaml.safe_load(LABELS.read_text())
    return {str(chapter): list(labels or []) for chapter, labels in data.items()}


def seed_map_labels(text: str) -> list[str]:
    """The labels in `code font` in the "label" column of every table of SEED-MAP.md, in order."""
    labels: list[str] = []
    column = None
    for line in text.splitlines():
        if not line.startswith("|"):
            column = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if column is None:
            column = cells.index("label") if "label" in cells else -1
            continue
        if column < 0 or column >= len(cells) or set(cells[column]) <= set("-: "):
            continue
        labels += re.findall(r"`([^`]+)`", cells[column])
    return labels
