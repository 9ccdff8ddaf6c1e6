"""Gettext catalogs (.po) as the book's and the labs' translations keep them: read, written in the template's
order, merged from a template the way `msgmerge` does, and filled by translators. Babel (which Sphinx depends on)
does the file format; this is the one place that says how the project uses it, for tools/i18n/catalogs.py (the
book's pages), pylib.labs.i18n (the labs' markdown) and pylib.i18n itself (pylib's messages) alike."""

from __future__ import annotations

from pathlib import Path

from babel.messages.catalog import Catalog, Message
from babel.messages.pofile import read_po, write_po

LANGUAGE = "zh_CN"


def read(path: Path) -> Catalog:
    with Path(path).open("rb") as f:
        return read_po(f, locale=LANGUAGE)


def write(catalog: Catalog, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        write_po(f, catalog, width=0, omit_header=False, include_previous=True)  # in the template's order


def entries(catalog: Catalog) -> list[Message]:
    """The catalog's messages, without its header entry (whose id is empty)."""
    return [m for m in catalog if m.id]


def merge(template: Catalog, path: Path, project: str) -> Catalog:
    """Merge `template` into the catalog at `path` (a new, empty one if there is none) and write it back: a message
    whose English changed keeps its old translation marked fuzzy ("outdated"); one that left the English is
    dropped."""
    path = Path(path)
    if path.is_file():
        catalog = read(path)
        catalog.update(template, no_fuzzy_matching=False, update_header_comment=False)
        catalog.obsolete.clear()
    else:
        catalog = Catalog(locale=LANGUAGE, project=project, fuzzy=False)
        for message in entries(template):
            catalog.add(message.id, "", locations=message.locations)
    catalog.fuzzy = False
    write(catalog, path)
    return catalog


def todo(catalog: Catalog) -> list[dict]:
    """The entries still to translate, as a translator gets them: {"msgid"}, plus for an outdated one the English
    and the translation it had before ("previous_msgid", "previous_msgstr")."""
    out = []
    for message in entries(catalog):
        if message.string and not message.fuzzy:
            continue
        entry = {"msgid": message.id}
        if message.fuzzy and message.previous_id:
            previous = message.previous_id
            entry["previous_msgid"] = previous[0] if isinstance(previous, list | tuple) else previous
            entry["previous_msgstr"] = message.string
        out.append(entry)
    return out


def translations(data) -> tuple[dict[str, str], dict[str, list[str]]]:
    """A translator's answer, {"msgid": "msgstr"} or [{"msgid", "msgstr", optional "other_senses"}], as
    ({msgid: msgstr}, {msgid: the glossary words the message uses in another sense})."""
    if isinstance(data, list):
        senses = {t["msgid"]: t["other_senses"] for t in data if t.get("other_senses")}
        return {t["msgid"]: t["msgstr"] for t in data}, senses
    return dict(data), {}


def fill(catalog: Catalog, translated: dict[str, str], senses: dict[str, list[str]], sense_comment: str) -> None:
    """Put translations into `catalog` (each one current: no longer fuzzy). A message in `senses` gets the translator
    comment `sense_comment` followed by its words. Raises ValueError, writing nothing, when a msgid is not there."""
    unknown = [k for k in translated if k not in catalog]
    if unknown:
        raise ValueError(f"{len(unknown)} msgids are not in the catalog, e.g. {unknown[0][:80]!r}")
    for msgid, msgstr in translated.items():
        message = catalog[msgid]
        message.string = msgstr
        message.flags.discard("fuzzy")
        message.previous_id = []
        # Babel's reader keeps an outdated entry's "#| msgid ..." lines as translator comments ("| msgid ..."):
        # they are the previous English, gone once the entry is translated again.
        message.user_comments = [c for c in message.user_comments if not c.startswith("|")]
        if msgid in senses:
            kept = [c for c in message.user_comments if not c.strip().startswith(sense_comment)]
            message.user_comments = kept + [f"{sense_comment} {', '.join(senses[msgid])}"]
