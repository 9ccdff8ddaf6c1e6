"""The Chinese edition's catalogs as committed: every page of _toc.yml has one, every entry is translated and not
outdated, the markup and the glossary's terms are carried over; pylib's own catalogs (pylib/i18n/locale) likewise.
(`make book` also re-extracts the English messages first, so an English paragraph changed since the catalogs were
last updated fails there: `python tools/i18n/catalogs.py extract && ... update` marks it outdated.)"""

import sys
from pathlib import Path

import pytest
import yaml

from pylib import i18n
from pylib.i18n import pofile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "i18n"))
import catalogs  # noqa: E402
import review  # noqa: E402
import terms  # noqa: E402


def _toc_pages() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    pages = [toc["root"]]
    for part in toc.get("parts", []):
        pages += [chapter["file"] for chapter in part["chapters"]]
    return pages


def test_every_page_has_a_chinese_catalog():
    missing = [p for p in _toc_pages() if not (catalogs.LOCALE / f"{p}.po").is_file()]
    assert not missing, f"pages without {catalogs.LOCALE.relative_to(ROOT)}/<page>.po: {missing}"


@pytest.mark.slow  # reviews every entry of every catalog (4 s), as `catalogs.py check` does in `make book`
def test_committed_catalogs_are_complete_and_keep_markup_and_terms():
    glossary = terms.load()
    faults = []
    for locale in (catalogs.LOCALE, i18n.LOCALE):
        for po in sorted(locale.rglob("*.po")):
            for message in pofile.entries(pofile.read(po)):
                where = f"{po.relative_to(ROOT)}: {message.id[:60]!r}"
                faults += [f"{where}: {f}" for f in review.faults(message, glossary)]
    assert not faults, "\n".join(faults[:30])


@pytest.mark.slow
def test_check_reviews_pylib_catalogs(tmp_path, monkeypatch):
    """`catalogs.py check` finds a fault in pylib's catalogs as in a chapter's: an entry emptied (missing), one
    dropped (missing), one no tr(...) uses (outdated), a glossary term translated another way (term)."""
    for domain in i18n.DOMAINS:
        catalog = pofile.read(i18n.catalog_path(domain))
        if domain == "pylib":
            catalog["rank"].string = ""
            catalog.delete("microbatches m")
            catalog.add("a message nobody uses", "没人用的消息")
            catalog["rank {r}"].string = "秩 {r}"
        pofile.write(catalog, tmp_path / "zh_CN" / "LC_MESSAGES" / f"{domain}.po")
    monkeypatch.setattr(i18n, "LOCALE", tmp_path)
    found = catalogs.pylib_problems(terms.load())
    name = str(i18n.catalog_path("pylib"))
    assert list(found) == [name], found
    lines = sorted(found[name])
    assert [line.split(" ")[0].rstrip(":") for line in lines] == ["missing", "missing", "outdated", "term"], lines
