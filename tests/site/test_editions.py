"""The two editions side by side, from their HTML files: every English page has its Chinese twin, and the language
switch (tools/site/sphinx_site.py) links each page to its twin both ways; the Chinese pages say lang="zh-CN" and
their figures' alt texts are Chinese. (Every other check of tests/site runs on both editions: the `page` fixture is
every page of the site, zh/ included; no foreign host is one of them.)"""

from __future__ import annotations

import os
import re

import pytest

from tests.site import sitemap

CJK = re.compile("[\u3400-\u9fff]")
# Development builds (make book I18N_ALLOW_INCOMPLETE=1) show untranslated messages in English; CI is strict.
INCOMPLETE = bool(os.environ.get("I18N_ALLOW_INCOMPLETE"))


def _content_pages() -> list[str]:
    """English pages with an article (not the redirect stub, the search page or the index)."""
    if not sitemap.SITE.is_dir():
        return []
    pages = sitemap.edition_pages("")
    return [p for p in pages if not sitemap.parse(p).redirect and p not in ("search.html", "genindex.html")]


def test_every_english_page_has_its_chinese_twin(site):
    english = sitemap.edition_pages("", site)
    chinese = set(sitemap.edition_pages(sitemap.ZH, site))
    missing = [p for p in english if sitemap.ZH + p not in chinese]
    assert english and not missing, f"English pages with no Chinese twin in {sitemap.ZH}: {missing}"
    extra = sorted(p.removeprefix(sitemap.ZH) for p in chinese) != sorted(english)
    assert not extra, f"Chinese pages with no English twin: {sorted(chinese - {sitemap.ZH + p for p in english})}"


@pytest.mark.parametrize("english_page", _content_pages() or ["(no built site)"])
def test_language_switch_leads_to_the_twin_and_back(site, english_page):
    page = english_page
    english, chinese = sitemap.parse(page, site), sitemap.parse(sitemap.ZH + page, site)
    assert len(english.language_switch) == 1, f"{page}: language switch links {english.language_switch}"
    assert len(chinese.language_switch) == 1, f"{sitemap.ZH}{page}: language switch links {chinese.language_switch}"
    there, _ = sitemap.resolve(page, english.language_switch[0])
    assert there == sitemap.ZH + page, f"{page}: 中文 leads to {there}"
    back, _ = sitemap.resolve(sitemap.ZH + page, chinese.language_switch[0])
    assert back == page, f"{sitemap.ZH}{page}: English leads to {back}"
    assert "中文" in (site / page).read_text(encoding="utf-8")


def test_pages_say_their_language(site):
    """Every page but the redirect stubs (index.html: a bare <meta refresh> to the root page)."""
    pages = [p for p in sitemap.site_pages(site) if not sitemap.parse(p, site).redirect]
    wrong = [p for p in pages if sitemap.edition(p) and sitemap.parse(p, site).lang != "zh-CN"]
    wrong += [p for p in pages if not sitemap.edition(p) and (sitemap.parse(p, site).lang or "en")[:2] != "en"]
    assert not wrong, f"pages whose <html lang> is not their edition's (zh-CN / en): {wrong}"


def _alts(page: str) -> list[str]:
    """Alt texts of a page's content images that say something (a path as alt is the browser test's fault)."""
    return [
        (alt or "").strip()
        for src, alt in sitemap.parse(page).images
        if "_static/" not in src and (alt or "").strip() and alt.strip() != src and re.search("[A-Za-z]", alt)
    ]


@pytest.mark.parametrize("english_page", _content_pages() or ["(no built site)"])
def test_figure_alt_texts_on_chinese_pages_are_chinese(site, english_page):
    page = english_page
    english = set(_alts(page))
    problems = []
    for alt in _alts(sitemap.ZH + page):
        if CJK.search(alt):
            continue
        if INCOMPLETE and alt in english:
            continue  # not translated yet (book/locale/**.po for :alt:, pylib/i18n for figures pylib draws)
        problems.append(alt[:100])
    assert not problems, f"{sitemap.ZH}{page}: alt texts with no Chinese:\n  " + "\n  ".join(problems)


# The sidebar's part titles: a toctree caption (a heading paragraph), not a figure's caption, which shares the span.
PART_TITLE = re.compile(r'<p [^>]*class="caption"[^>]*>\s*<span class="caption-text">(.*?)</span>', re.S)
FOLD_PROMPT = re.compile(r'<p class="(?:collapsed|expanded) admonition-title">(.*?)</p>', re.S)


@pytest.mark.parametrize("english_page", _content_pages() or ["(no built site)"])
def test_part_titles_and_fold_prompts_on_chinese_pages_are_chinese(site, english_page):
    """The sidebar's part titles (_toc.yml's captions, translated in the root page's catalog) and a folded cell's
    prompt ("Show code cell source") were English on the Chinese site; tools/site/sphinx_i18n.py puts them in."""
    html = (site / (sitemap.ZH + english_page)).read_text(encoding="utf-8")
    english = [t.strip() for t in PART_TITLE.findall(html) + FOLD_PROMPT.findall(html) if not CJK.search(t)]
    assert not english, f"{sitemap.ZH}{english_page}: part titles or fold prompts in English: {english[:5]}"


# A figure's caption: <figcaption> holds the number ("图 1") and the text (glued numbers are spans inside it).
FIGURE_CAPTION = re.compile(r"<figcaption>(.*?)</figcaption>", re.S)
CAPTION_NUMBER = re.compile(r'<span class="caption-number">.*?</span>', re.S)


@pytest.mark.parametrize("english_page", _content_pages() or ["(no built site)"])
def test_figure_captions_on_chinese_pages_are_chinese(site, english_page):
    """Every figure's caption on a Chinese page holds Chinese, the glued figures' ({glue:figure}) included: they
    never reached the catalogs until tools/site/sphinx_i18n.py built them in the gettext build."""
    html = (site / (sitemap.ZH + english_page)).read_text(encoding="utf-8")
    texts = [re.sub(r"<[^>]+>", "", CAPTION_NUMBER.sub("", t)).strip() for t in FIGURE_CAPTION.findall(html)]
    english = [t[:100] for t in texts if t and not CJK.search(t) and not INCOMPLETE]
    assert not english, f"{sitemap.ZH}{english_page}: figure captions in English:\n  " + "\n  ".join(english)
