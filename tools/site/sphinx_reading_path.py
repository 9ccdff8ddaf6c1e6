"""The reading path on the page (loaded through _config.yml's `sphinx: local_extensions`): under each section title
of a chapter listed in book/reading-path.yml, a badge says whether the section is on the core path or a deep dive,
and how many minutes it takes to read ("Core · 12 min", "Deep dive · 5 min"). Under the chapter's title, the
badges give the chapter's core and deep-dive totals as the intro's table shows them (a kind with none left out);
under any other title, the badge counts the section and the
subsections of its own kind (a deep dive inside a core section has its own badge and is not in its parent's count).

Which sections are deep dives and how the minutes are counted is tools/site/reading_path.py's (the intro's table
asks the same module). The words are the config value `reading_path_words` ({"core", "deep", "minutes"}), English
by default; the Chinese build sets them (tools/i18n/build_zh.py), as it sets myst-nb's fold prompts.

The badges go in as a post-transform on the HTML builders only (after every translation: the gettext builder never
sees them, so they are no message of any catalog). The page's sections are matched to the source's in order, and
each pair must agree on an id (the section's label or its heading's id, which the Chinese edition keeps): a page
whose sections do not match its source gets no badge and a warning, which `-W` makes an error. The badge's style is
book/_static/reading-path.css, added to every page here.
"""

from __future__ import annotations

from pathlib import Path

import reading_path  # tools/site/reading_path.py; Jupyter Book puts this folder on sys.path
from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import logging

logger = logging.getLogger(__name__)

WORDS = {"core": "Core", "deep": "Deep dive", "minutes": "{n} min"}
CSS_FILE = "reading-path.css"


def badge_text(words: dict, deep: bool, minutes: float) -> str:
    words = {**WORDS, **(words or {})}
    n = max(1, round(minutes))
    return f"{words['deep' if deep else 'core']} · {words['minutes'].format(n=n)}"


def _badge(words: dict, deep: bool, minutes: float) -> nodes.inline:
    text = badge_text(words, deep, minutes)
    kind = "reading-path-deep" if deep else "reading-path-core"
    return nodes.inline(text, text, classes=["reading-path-badge", kind])


def add_badges(document: nodes.document, chapter: reading_path.ChapterPath, words: dict) -> list[str]:
    """Put the badges under the section titles of `document` (a chapter's doctree); return what did not match."""
    built = [s for s in document.findall(nodes.section)]
    if len(built) != len(chapter.sections):
        return [f"{len(built)} sections on the page, {len(chapter.sections)} in its source"]
    wrong = [
        f"section {i + 1} has the ids {', '.join(node['ids'])}, its source {', '.join(sorted(source.ids))}"
        for i, (node, source) in enumerate(zip(built, chapter.sections, strict=True))
        if not source.ids & set(node["ids"])
    ]
    if wrong:
        return wrong
    for node, source in zip(built, chapter.sections, strict=True):
        if source.level == min(s.level for s in chapter.sections):  # the chapter's title: the intro table's row
            core, deep = round(chapter.core_minutes), round(chapter.deep_minutes)
            badges = [_badge(words, False, core)] if core or not deep else []
            badges += [_badge(words, True, deep)] if deep else []
        else:
            badges = [_badge(words, source.deep, source.minutes(source.deep))]
        title = node.next_node(nodes.title)
        node.insert(node.index(title) + 1, nodes.paragraph("", "", *badges, classes=["reading-path"]))
    return []


class ReadingPathBadges(SphinxPostTransform):
    default_priority = 210
    formats = ("html",)

    def run(self, **kwargs) -> None:
        path_file = Path(self.env.srcdir) / self.config.reading_path_file
        if not path_file.is_file():
            return
        docname = self.env.docname
        chapters = reading_path.load(path_file)
        if docname not in chapters:
            return
        source = Path(self.env.doc2path(docname)).read_text(encoding="utf-8")
        try:
            chapter = reading_path.chapter_path(docname, chapters[docname], source=source)
        except KeyError as error:
            logger.warning(f"{self.config.reading_path_file}: {error.args[0]}", location=docname)
            return
        for problem in add_badges(self.document, chapter, self.config.reading_path_words):
            logger.warning(f"reading path: {problem}; no badges on this page", location=docname)


def setup(app):
    app.add_config_value("reading_path_file", "book/reading-path.yml", "env", types=[str])
    app.add_config_value("reading_path_words", dict(WORDS), "html", types=[dict])
    app.add_post_transform(ReadingPathBadges)
    app.add_css_file(CSS_FILE)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
