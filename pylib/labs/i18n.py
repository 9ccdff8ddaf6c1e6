"""The labs' instructions in Chinese: one gettext catalog per lab, the markdown of its cells as messages.

    python -m pylib.labs i18n extract     # labs/*.ipynb -> labs/locale/zh_CN/LC_MESSAGES/<lab>.po (new, outdated, gone)
    python -m pylib.labs i18n check       # 0 missing, 0 outdated, markup kept, glossary terms: or exit 1
    python -m pylib.labs i18n todo LAB    # the entries of one lab still to translate, as JSON
    python -m pylib.labs i18n fill LAB JSON   # put translations ({"msgid": "msgstr", ...}) into one lab's catalog

A message is one block of a markdown cell: the text between blank lines, a fenced code block or a `$$` display
kept whole. Code cells are never messages: they are the same cells in both languages (their output speaks the
reader's language through `pylib.i18n`, chosen by the lab's `lang` parameter). The catalogs are merged with Babel
the way tools/i18n/catalogs.py merges the book's (a changed block keeps its old translation marked fuzzy, which
is "outdated"), and checked by the book's own markup and glossary checks (tools/i18n/markup.py, terms.py).
`translated(nb, "zh")` is the notebook with every translated block in Chinese (an untranslated one stays English).
"""

from __future__ import annotations

import copy
import json
import sys
from functools import cache
from pathlib import Path

from babel.messages.catalog import Catalog

from pylib.i18n import normalise, pofile
from pylib.i18n.pofile import LANGUAGE

from .files import Lab, default_labs_dir, find_labs, select_labs

PROJECT = "Parallelism, Computed: labs"
FENCES = ("```", "~~~", "$$")


def locale_dir(labs_dir: Path | None = None) -> Path:
    return Path(labs_dir or default_labs_dir()) / "locale" / LANGUAGE / "LC_MESSAGES"


def catalog_path(lab: Lab) -> Path:
    return lab.path.parent / "locale" / LANGUAGE / "LC_MESSAGES" / f"{lab.name}.po"


def blocks(source: str) -> list[tuple[str, bool]]:
    """A markdown cell as [(text, is_message)]: its blocks and the blank lines between them, in order, so that
    "".join(text for text, _ in blocks(s)) == s. A fenced code block or $$ display stays one block."""
    out: list[tuple[str, bool]] = []
    current: list[str] = []
    fence = None
    for line in source.splitlines(keepends=True):
        stripped = line.strip()
        if fence is None and not stripped:
            if current:
                out.append(("".join(current), True))
                current = []
            out.append((line, False))
            continue
        current.append(line)
        opener = next((f for f in FENCES if stripped.startswith(f)), None)
        if fence is None and opener is not None:
            rest = stripped[len(opener) :]
            if not (opener == "$$" and rest.rstrip().endswith("$$") and len(rest) > 2):
                fence = opener
        elif fence is not None and stripped.startswith(fence) and len(current) > 1:
            fence = None
    if current:
        out.append(("".join(current), True))
    result = []
    for text, is_message in out:  # a message's own trailing newline is kept outside it
        if is_message and text.endswith("\n"):
            result += [(text[:-1], True), ("\n", False)]
        else:
            result.append((text, is_message))
    return result


def messages(nb) -> list[tuple[str, int]]:
    """(message, cell index) for every block of every markdown cell, first occurrence only, in order."""
    seen, out = set(), []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for text, is_message in blocks(cell.source):
            if is_message and text.strip() and text not in seen:
                seen.add(text)
                out.append((text, i))
    return out


def _write(catalog: Catalog, path: Path) -> None:
    pofile.write(catalog, path)
    _catalog.cache_clear()


def _template(lab: Lab) -> Catalog:
    template = Catalog(locale=LANGUAGE, project=PROJECT, fuzzy=False)
    for text, cell in messages(lab.read()):
        template.add(text, "", locations=[(f"labs/{lab.path.name}", cell)])
    return template


def extract(labs_dir: Path | None = None) -> list[Path]:
    """Create or update every lab's catalog from its markdown; drop the catalogs of labs that are gone."""
    written = []
    labs = find_labs(labs_dir)
    for lab in labs:
        path = catalog_path(lab)
        pofile.merge(_template(lab), path, PROJECT)
        written.append(path)
    folder = locale_dir(labs_dir)
    for po in sorted(folder.glob("*.po")) if folder.is_dir() else []:
        if po.stem not in {lab.name for lab in labs}:
            po.unlink()
            print(f"removed the catalog of a lab that is gone: {po.name}")
    return written


def _review():
    """tools/i18n/review.py: the book's own checks of a translated entry (a checkout's tools, not a package)."""
    tools = Path(__file__).resolve().parents[2] / "tools" / "i18n"
    if str(tools) not in sys.path:
        sys.path.insert(0, str(tools))
    import review
    import terms

    return review, terms


def problems(labs: list[Lab] | None = None) -> dict[str, list[str]]:
    """{lab: lines} for missing and outdated entries, broken markup and glossary terms translated another way;
    an entry for a lab whose catalog lacks a message of its notebook or has one it no longer has (run extract)."""
    review, terms = _review()
    glossary = terms.load()
    found: dict[str, list[str]] = {}
    for lab in labs if labs is not None else find_labs():
        path = catalog_path(lab)
        if not path.is_file():
            found.setdefault(lab.name, []).append("no catalog for this lab (run `python -m pylib.labs i18n extract`)")
            continue
        held = pofile.entries(pofile.read(path))
        wanted = {text for text, _ in messages(lab.read())}
        for text in sorted(wanted - {m.id for m in held}):
            found.setdefault(lab.name, []).append(f"missing: {text[:70]!r} (not in the catalog: run extract)")
        for message in held:
            if message.id not in wanted:
                short = message.id[:70].replace("\n", " ")
                found.setdefault(lab.name, []).append(f"outdated: {short} (gone from the lab: run extract)")
            else:
                found.setdefault(lab.name, []).extend(review.faults(message, glossary))
    return {name: lines for name, lines in found.items() if lines}


def check(labs: list[Lab] | None = None, verbose: bool = True) -> int:
    review, _ = _review()
    return review.tally(problems(labs), show=verbose)


def todo(lab: Lab) -> list[dict]:
    return pofile.todo(pofile.read(catalog_path(lab)))


def fill(lab: Lab, translations: dict[str, str], senses: dict[str, list[str]] | None = None) -> int:
    path = catalog_path(lab)
    catalog = pofile.read(path)
    _, terms = _review()
    pofile.fill(catalog, translations, senses or {}, terms.OTHER_SENSE)
    _write(catalog, path)
    return len(translations)


@cache
def _catalog(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    return {m.id: m.string for m in pofile.entries(pofile.read(path)) if m.string and not m.fuzzy}


def translated(nb, lang: str, lab: Lab):
    """A copy of `nb` whose markdown blocks are in `lang` (English: `nb` itself); code cells untouched."""
    if normalise(lang) == "en":
        return nb
    table = _catalog(catalog_path(lab))
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = "".join(table.get(t, t) if m else t for t, m in blocks(cell.source))
    nb.metadata.setdefault("pylib_lab", {})["lang"] = normalise(lang)
    return nb


def untranslated(nb, lab: Lab) -> int:
    """How many markdown messages of `nb` have no (current) translation."""
    table = _catalog(catalog_path(lab))
    return sum(text not in table for text, _ in messages(nb))


def main(args) -> int:
    if args.i18n_command == "extract":
        for path in extract(args.labs_dir):
            print(path)
        return check(verbose=False) and 0
    labs = select_labs(args.labs, args.labs_dir) if getattr(args, "labs", None) else find_labs(args.labs_dir)
    if args.i18n_command == "check":
        return check(labs)
    if args.i18n_command == "todo":
        json.dump([e for lab in labs for e in todo(lab)], sys.stdout, ensure_ascii=False, indent=1)
        print()
        return 0
    (lab,) = select_labs([args.lab], args.labs_dir)
    translations, senses = pofile.translations(json.loads(Path(args.json).read_text(encoding="utf-8")))
    print(f"{fill(lab, translations, senses)} entries written to {catalog_path(lab)}")
    return 0
