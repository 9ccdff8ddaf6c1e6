"""The Chinese edition's catalogs as committed: every page of _toc.yml has one, every entry is translated and not
outdated, the markup and the glossary's terms are carried over, and pylib's Chinese output uses the glossary's words.
(`make book` also re-extracts the English messages first, so an English paragraph changed since the catalogs were
last updated fails there: `python tools/i18n/catalogs.py extract && ... update` marks it outdated.)"""

import sys
from pathlib import Path

import yaml

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


def test_committed_catalogs_are_complete_and_keep_markup_and_terms():
    glossary = terms.load()
    faults = []
    for po in sorted(catalogs.LOCALE.rglob("*.po")):
        for message in pofile.entries(pofile.read(po)):
            where = f"{po.relative_to(catalogs.LOCALE)}: {message.id[:60]!r}"
            faults += [f"{where}: {f}" for f in review.faults(message, glossary)]
    assert not faults, "\n".join(faults[:30])


# pylib messages that use a glossary word in another sense (the catalogs' translator comments, for pylib.i18n).
OTHER_SENSES = {
    "{name}: published {par} ranks {rank}, {slower:.1%} slower than the best, {best}": frozenset({"rank"}),  # verb
}


def test_pylib_chinese_messages_use_the_glossary_terms():
    from pylib.i18n import catalog

    glossary = terms.load()
    faults = []
    for english, chinese in catalog("zh").items():
        senses = OTHER_SENSES.get(english, frozenset())
        faults += [f"{english[:60]!r}: {f}" for f in terms.violations(english, chinese, glossary, senses)]
    assert not faults, "pylib.i18n's Chinese uses another word for a glossary term:\n" + "\n".join(faults[:30])
