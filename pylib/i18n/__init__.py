"""The one message catalog of pylib's output: what a reader sees in a table caption or header, a figure's title,
axes and legend, a verdict or a printed explanation, in the reader's language.

    from pylib.i18n import tr
    tr("{n} ranks, {bytes:,} bytes sent", n=4, bytes=8192)   # English: the message itself; Chinese: its entry

The message is the English text (a format string); `tr` looks it up in the catalog of the current language and
formats it with the same fields, so a number is formatted by the same format spec in both editions and only the
words around it change. The language is `set_language(...)`, else the environment's `PYLIB_LANG` (the book's
Chinese build sets `PYLIB_LANG=zh`), else English. A message missing from the Chinese catalog raises
`MissingTranslation` naming it: the Chinese edition never shows English by accident (tests/test_i18n.py also
checks, without running anything, that every literal passed to `tr` has its entry and that no entry is unused).

The catalogs are gettext .po files in this package, read as they are (no compiled .mo) with the book's own tooling
(`pofile`): locale/zh_CN/LC_MESSAGES/pylib.po (the chapters' tables, figures and verdicts) and labs.po (the lab
harness), merged into one catalog; a message is in only one of them. An entry marked fuzzy (its English changed
since it was translated) counts as missing. `python tools/i18n/catalogs.py update` merges the messages found in
the source (tools/i18n/messages.py) into them, `check` reviews them with the chapters' checks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

LANGUAGES = ("en", "zh")
LOCALE = Path(__file__).resolve().parent / "locale"  # <LOCALE>/zh_CN/LC_MESSAGES/<domain>.po
DOMAINS = ("pylib", "labs")
_ALIASES = {"en": "en", "en_us": "en", "en_gb": "en", "zh": "zh", "zh_cn": "zh", "zh_hans": "zh", "cn": "zh"}
_chosen: str | None = None


class MissingTranslation(KeyError):
    """A message has no entry in the current language's catalog."""


class UnknownLanguage(ValueError):
    """A language name pylib does not speak (in `set_language` or in the environment's PYLIB_LANG)."""


class MissingField(ValueError):
    """A message formatted without a value for one of its fields: `tr` never shows the braces."""


def normalise(language: str) -> str:
    """'zh', 'zh_CN', 'zh-CN', 'zh-Hans' -> 'zh'; 'en', 'en_US' -> 'en'; anything else is an error."""
    key = str(language).strip().lower().replace("-", "_")
    if key not in _ALIASES:
        raise UnknownLanguage(
            f"unknown language {language!r}: pylib speaks {', '.join(LANGUAGES)} (e.g. 'zh' or 'zh_CN')"
        )
    return _ALIASES[key]


_read: tuple[str, str] = ("en", "en")  # (PYLIB_LANG as last read, the language it names)


def _environment() -> str:
    """The language $PYLIB_LANG names (unset or empty: English), normalised once per value it takes."""
    global _read
    raw = os.environ.get("PYLIB_LANG") or "en"
    if raw != _read[0]:
        try:
            _read = (raw, normalise(raw))
        except UnknownLanguage:
            raise UnknownLanguage(
                f"PYLIB_LANG={raw!r} in the environment is not a language pylib speaks: {', '.join(LANGUAGES)} "
                "(e.g. PYLIB_LANG=zh); unset it for English"
            ) from None
    return _read[1]


_asked = 0  # how many times language() was asked: pylib.i18n.editions tells language-free rank runs by it


def language_asked() -> int:
    """How many times this process has asked for the language (every translation asks)."""
    return _asked


_unspoken = 0  # inside `unspoken()`: messages are made in English, and making them is not asking


@contextmanager
def unspoken():
    """Inside, a message is made in English and does not count as asking for the language (`language_asked`). For
    code that makes messages only to see whether there are any, and shows none: a planner search asks every
    candidate's problems and keeps the candidates with none. Its result is then the same in every language, which
    is what lets the book's two editions share it (`pylib.i18n.editions`)."""
    global _unspoken
    _unspoken += 1
    try:
        yield
    finally:
        _unspoken -= 1


def language() -> str:
    """The current language: set_language(...), else $PYLIB_LANG, else 'en' (English inside `unspoken()`)."""
    global _asked
    if _unspoken:
        return "en"
    _asked += 1
    if _chosen is not None:
        return _chosen
    return _environment()


def set_language(language: str | None) -> None:
    """Choose the language for this process (None: back to $PYLIB_LANG or English)."""
    global _chosen
    _chosen = None if language is None else normalise(language)


@cache
def catalog(language: str) -> dict[str, str]:
    """{English message: translation} for one language ('en' is empty: the message is its own text)."""
    language = normalise(language)
    if language == "en":
        return {}
    # Babel reads the .po files: imported here, so English output (and `import pylib`) never needs it.
    from pylib.i18n import pofile

    merged: dict[str, str] = {}
    for domain in DOMAINS:
        path = catalog_path(domain)
        for message in pofile.entries(pofile.read(path)):
            if message.id in merged:
                raise ValueError(f"message in two of pylib's catalogs ({path.name} and another): {message.id!r}")
            if message.string and not message.fuzzy:
                merged[message.id] = message.string
    return merged


def catalog_path(domain: str) -> Path:
    """The Chinese catalog of one of pylib's DOMAINS."""
    from pylib.i18n.pofile import LANGUAGE

    return LOCALE / LANGUAGE / "LC_MESSAGES" / f"{domain}.po"


def tr(message: str, /, **fields) -> str:
    """The message in the current language, formatted with `fields` (str.format). A field the message names and
    `fields` lacks raises `MissingField` naming it; an unknown $PYLIB_LANG raises `UnknownLanguage` carrying the
    message being said, so the error it was about is not lost."""
    try:
        lang = language()
    except UnknownLanguage as e:
        raise UnknownLanguage(f"{e}; the message was: {_english(message, fields)}") from None
    if lang == "en":
        text = message
    else:
        text = catalog(lang).get(message)
        if text is None:
            where = ", ".join(str(catalog_path(d).relative_to(LOCALE.parent)) for d in DOMAINS)
            raise MissingTranslation(f"no {lang} entry in pylib.i18n ({where}) for {message!r}")
    if not fields and "{" not in text:
        return text
    try:
        return text.format(**fields)
    except (KeyError, IndexError) as e:
        given = ", ".join(sorted(fields)) or "none"
        raise MissingField(f"message {message!r} needs the field {e.args[0]!r} (fields given: {given})") from None


def _english(message: str, fields: dict) -> str:
    try:
        return message.format(**fields)
    except (KeyError, IndexError, ValueError):
        return f"{message!r} with {fields!r}"


@dataclass(frozen=True)
class Said:
    """A message held as data and said in the reader's language where it is shown: `str(said)` is
    `tr(said.message, **fields)` at that moment. Made by `later`."""

    message: str
    fields: tuple = ()  # (name, value) pairs

    def __str__(self) -> str:
        return tr(self.message, **dict(self.fields))


def later(message: str, /, **fields) -> Said:
    """`tr(message, **fields)`, said when it is shown (`str(...)`) instead of now. For text that code computes by the
    thousand and rarely shows (a planner search builds every candidate's rows and reads only their bytes): it costs
    no catalog lookup, and a result that holds it does not depend on the language (`language_asked` does not move,
    so the book's two editions share it, `pylib.i18n.editions`). The catalogs hold it as a tr(...) literal."""
    return Said(message, tuple(sorted(fields.items())))


def N_(message: str, /) -> str:
    """`message` itself, marked as a message (gettext's N_): the catalogs hold it like a tr(...) literal, and `tr` or
    `shown` translates it later, where it is shown. For labels held as data (a table's words for a key)."""
    return message


def shown(labels, key):
    """`key` in the reader's language when `labels` has it, else `key` itself. `labels` is either a collection of
    messages, each written once as N_("..."), or a mapping key -> N_("its label") for a key whose label is other
    words (or a key that is not text)."""
    if isinstance(labels, Mapping):
        return tr(labels[key]) if key in labels else key
    return tr(key) if key in labels else key


_environment()  # $PYLIB_LANG is read when pylib is imported: a name pylib does not speak fails here, before anything
