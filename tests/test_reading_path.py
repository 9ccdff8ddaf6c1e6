"""The reading path (book/reading-path.yml, read through tools/site/reading_path.py): every page of the book is in
it, every deep dive it names is a section of its chapter, the core path fits its budgets (240 minutes in all, 45 per
page), the minutes follow the stated rule, and the badges reach the page: on a doctree (fast), on every real chapter
as MyST parses it, and in a tiny book built in English and in Chinese (slow)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from docutils import nodes
from docutils.utils import new_document

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "site"))
import reading_path as R  # noqa: E402
import sphinx_reading_path as S  # noqa: E402

sys.path.insert(0, str(ROOT / "tools" / "i18n"))
import build_zh  # noqa: E402


def test_every_page_of_the_toc_is_in_the_reading_path():
    listed = R.load()
    pages = R.toc_docnames()
    missing = [d for d in pages if d not in listed]
    assert not missing, "book/reading-path.yml has no entry for " + "; ".join(
        f"{d} (add `{d}: []` if all of it is core, or `{d}:` and one `  - <section id>` line per deep dive)"
        for d in missing
    )
    stale = [d for d in listed if d not in pages]
    assert not stale, f"book/reading-path.yml lists pages that are not in _toc.yml: {', '.join(stale)}; remove them"


def test_every_named_deep_dive_is_a_section_of_its_chapter():
    problems = []
    for docname, ids in R.load().items():
        if (ROOT / f"{docname}.md").is_file():
            try:
                R.chapter_path(docname, ids)
            except KeyError as error:
                problems.append(error.args[0])
    assert not problems, "\n".join(problems)


def _largest_core_sections(chapter: R.ChapterPath, n: int = 3) -> str:
    core = sorted((s for s in chapter.sections if not s.deep), key=lambda s: -s.own_minutes)[:n]
    return ", ".join(f"{s.id} ({s.own_minutes:.1f} min)" for s in core)


def test_the_core_path_fits_its_budgets():
    chapters = R.load()
    paths = [R.chapter_path(d, chapters.get(d, [])) for d in R.toc_docnames()]
    over = [
        f"{p.docname}: core {p.core_minutes:.1f} min > {R.CHAPTER_CORE_BUDGET_MINUTES} "
        f"(its largest core sections: {_largest_core_sections(p)})"
        for p in paths
        if p.core_minutes > R.CHAPTER_CORE_BUDGET_MINUTES
    ]
    assert not over, "a page's core is over its budget; name deep dives in book/reading-path.yml:\n" + "\n".join(over)
    total = sum(p.core_minutes for p in paths)
    shown = sum(round(p.core_minutes) for p in paths)  # as R.path_table adds it up for the intro's table
    assert max(total, shown) <= R.CORE_BUDGET_MINUTES, (
        f"the core path is {total:.1f} min ({shown} as the intro's table adds it up), over "
        f"{R.CORE_BUDGET_MINUTES}; the largest cores: "
        + "; ".join(f"{p.docname} {p.core_minutes:.1f}" for p in sorted(paths, key=lambda p: -p.core_minutes)[:4])
    )


CHAPTER = """---
kernelspec: {name: python3}
---
(sec-x)=
# A `chapter` title

one two three four {ref}`sec-y` five

```{code-cell} ipython3
a = 1

b = 2
```

```{code-cell} ipython3
:tags: [hide-input]
hidden = 1
```

```{code-cell} ipython3
---
tags: [remove-cell]
---
removed = 1
```

## From bytes to $t$ seconds

six seven

:::{admonition} Checking the source
:class: dropdown
folded words are not read
:::

````{dropdown} Answer
more folded words
````

(sec-y)=
## A derivation

eight nine

### Step one

ten

```python
# a fenced listing is read as text
```
"""


def test_minutes_follow_the_rule_and_a_deep_dive_takes_its_subsections():
    chapter = R.chapter_path("x", ["sec-y"], source=CHAPTER)
    by_id = {s.id: s for s in chapter.sections}
    assert list(by_id) == ["sec-x", "from-bytes-to-t-seconds", "sec-y", "step-one"]
    title = by_id["sec-x"]
    assert (title.words, title.code_lines) == (6, 2)  # the role is one word; hidden and removed cells not counted
    assert (by_id["from-bytes-to-t-seconds"].words, by_id["from-bytes-to-t-seconds"].code_lines) == (2, 0)
    assert by_id["step-one"].words == 9  # "ten", "python" on the fence line, the listing's seven words
    assert [s.deep for s in chapter.sections] == [False, False, True, True]
    assert chapter.core_minutes == pytest.approx(8 / 200 + 2 / 20)
    assert chapter.deep_minutes == pytest.approx(11 / 200)
    assert title.ids == {"sec-x", "a-chapter-title"}
    with pytest.raises(KeyError, match="no section has the id sec-z"):
        R.chapter_path("x", ["sec-z"], source=CHAPTER)


def _doctree(ids: list[list[str]], titles: list[str], levels: list[int]) -> nodes.document:
    """A document whose sections nest by `levels`, as docutils builds them (ids, then a title)."""
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser

    document = new_document("x", get_default_settings(Parser))
    stack: list[tuple[int, nodes.Element]] = [(0, document)]
    for section_ids, title, level in zip(ids, titles, levels, strict=True):
        section = nodes.section(ids=section_ids)
        section += nodes.title(title, title)
        section += nodes.paragraph("text", "text")
        while stack[-1][0] >= level:
            stack.pop()
        stack[-1][1].append(section)
        stack.append((level, section))
    return document


def _badges(document: nodes.document) -> list[list[tuple[str, str]]]:
    out = []
    for section in document.findall(nodes.section):
        paragraph = section[1]
        assert "reading-path" in paragraph["classes"], "the badge is not right under the title"
        out.append([(b["classes"][1], b.astext()) for b in paragraph.findall(nodes.inline)])
    return out


def test_a_badge_goes_under_each_section_title():
    chapter = R.chapter_path("x", ["sec-y"], source=CHAPTER)
    ids = [["a-chapter-title", "sec-x"], ["from-bytes-to-t-seconds"], ["a-derivation", "sec-y"], ["step-one"]]
    # the Chinese edition's titles: translated text, the same ids
    document = _doctree(ids, ["一章", "从字节到秒", "推导", "第一步"], [1, 2, 2, 3])
    assert S.add_badges(document, chapter, build_zh.zh_config({})["sphinx"]["config"]["reading_path_words"]) == []
    core, deep = round(chapter.core_minutes), round(chapter.deep_minutes)
    assert (core, deep) == (0, 0)  # a tiny chapter: the title shows the core badge alone, at its least, 1 min
    assert _badges(document) == [
        [("reading-path-core", "核心 · 1 分钟")],
        [("reading-path-core", "核心 · 1 分钟")],
        [("reading-path-deep", "深入 · 1 分钟")],
        [("reading-path-deep", "深入 · 1 分钟")],
    ]
    assert S.badge_text({}, False, 12.4) == "Core · 12 min" and S.badge_text({}, True, 4.6) == "Deep dive · 5 min"


def test_a_page_that_does_not_match_its_source_gets_no_badge_and_says_why():
    chapter = R.chapter_path("x", [], source=CHAPTER)
    ids = [["a-chapter-title", "sec-x"], ["from-bytes-to-t-seconds"], ["another"], ["step-one"]]
    document = _doctree(ids, ["a", "b", "c", "d"], [1, 2, 2, 3])
    problems = S.add_badges(document, chapter, {})
    assert problems == ["section 3 has the ids another, its source a-derivation, sec-y"]
    assert not list(document.findall(nodes.inline))
    fewer = _doctree(ids[:3], ["a", "b", "c"], [1, 2, 2])
    assert S.add_badges(fewer, chapter, {}) == ["3 sections on the page, 4 in its source"]


@pytest.mark.slow
def test_every_chapter_as_myst_parses_it_has_the_sections_and_ids_of_the_reading_path():
    """Each page of _toc.yml parsed by MyST (as Sphinx does: no title promoted to the document's): its sections are
    the reading path's, in order, and each heading's id is the one reading_path gives it. (About 7 s.)"""
    from docutils.core import publish_doctree
    from myst_parser.parsers.docutils_ import Parser

    settings = {
        "myst_enable_extensions": ["colon_fence", "dollarmath", "amsmath", "deflist", "substitution"],
        "report_level": 5,
        "halt_level": 5,
        "doctitle_xform": False,
    }
    problems = []
    for docname in R.toc_docnames():
        source = (ROOT / f"{docname}.md").read_text(encoding="utf-8")
        document = publish_doctree(source, parser=Parser(), settings_overrides=settings)
        chapter = R.chapter_path(docname, [], source=source)
        built = list(document.findall(nodes.section))
        for node, section in zip(built, chapter.sections, strict=False):
            if R.heading_id(section.title) not in node["ids"]:
                problems.append(f"{docname}: {section.title!r} has the ids {node['ids']}")
        problems += [f"{docname}: {p}" for p in S.add_badges(document, chapter, {})]
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_a_tiny_book_shows_the_badges_in_both_editions_and_the_chinese_keeps_the_ids(tmp_path):
    """A two-page book built with the book's extensions, in English and with build_zh's config: the badges sit under
    the titles, in each edition's words, and the unlabelled deep dive is found by its English heading id in the
    Chinese build too. (About 25 s: two builds, no kernel.)"""
    (tmp_path / "intro.md").write_text("# Intro\n\nHello.\n", encoding="utf-8")
    (tmp_path / "ch.md").write_text(
        "(sec-ch)=\n# The chapter\n\nSome words.\n\n## From bytes to seconds\n\nWords.\n\n"
        "## A derivation\n\nDeep words.\n\n### Step one\n\nMore.\n",
        encoding="utf-8",
    )
    (tmp_path / "reading-path.yml").write_text("intro: []\nch: [a-derivation]\n", encoding="utf-8")
    toc = {"format": "jb-book", "root": "intro", "parts": [{"caption": "Part", "chapters": [{"file": "ch"}]}]}
    (tmp_path / "_toc.yml").write_text(yaml.safe_dump(toc), encoding="utf-8")
    po = tmp_path / "locale" / "zh_CN" / "LC_MESSAGES" / "ch.po"
    po.parent.mkdir(parents=True)
    po.write_text(
        'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
        'msgid "A derivation"\nmsgstr "一个推导"\n\nmsgid "The chapter"\nmsgstr "本章"\n',
        encoding="utf-8",
    )
    site = str(ROOT / "tools" / "site")
    base = {
        "title": "t",
        "only_build_toc_files": True,
        "execute": {"execute_notebooks": "off"},
        "sphinx": {
            "local_extensions": {"sphinx_i18n": site, "sphinx_reading_path": site},
            "recursive_update": True,
            "config": {"locale_dirs": ["locale"], "gettext_compact": False, "reading_path_file": "reading-path.yml"},
        },
    }
    jupyter_book = str(Path(sys.executable).parent / "jupyter-book")
    pages = {}
    for edition, config in (("en", base), ("zh", build_zh.zh_config(base))):
        (tmp_path / "_config.yml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
        out = tmp_path / edition
        command = [jupyter_book, "build", str(tmp_path), "--path-output", str(out), "-q", "-W"]
        subprocess.run(command, check=True, cwd=tmp_path, timeout=300)
        pages[edition] = (out / "_build" / "html" / "ch.html").read_text(encoding="utf-8")

    def badge(kind, text):
        return f'<span class="reading-path-badge reading-path-{kind}">{text}</span>'

    en, zh = pages["en"], pages["zh"]
    assert badge("core", "Core · 1 min") in en and badge("deep", "Deep dive · 1 min") in en
    assert badge("core", "核心 · 1 分钟") in zh and badge("deep", "深入 · 1 分钟") in zh
    assert "Deep dive" not in zh and "一个推导" in zh
    for page in (en, zh):
        derivation = page.index('<section id="a-derivation">')
        assert page.index("reading-path-deep", derivation) < page.index("<section", derivation + 1)
        assert page.count('class="reading-path"') == 4
        assert "_static/reading-path.css" in page  # the style, which the book's html_static_path serves
