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
from babel.messages.pofile import read_po, write_po

from pylib.i18n import normalise

from .notebook import Lab, default_labs_dir, find_labs

LANGUAGE = "zh_CN"
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


def _read(path: Path) -> Catalog:
    with path.open("rb") as f:
        return read_po(f, locale=LANGUAGE)


def _write(catalog: Catalog, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        write_po(f, catalog, width=0, omit_header=False, include_previous=True)
    _catalog.cache_clear()


def _template(lab: Lab) -> Catalog:
    template = Catalog(locale=LANGUAGE, project="Parallelism, Computed: labs", fuzzy=False)
    for text, cell in messages(lab.read()):
        template.add(text, "", locations=[(f"labs/{lab.path.name}", cell)])
    return template


def extract(labs_dir: Path | None = None) -> list[Path]:
    """Create or update every lab's catalog from its markdown; drop the catalogs of labs that are gone."""
    written = []
    labs = find_labs(labs_dir)
    for lab in labs:
        path, template = catalog_path(lab), _template(lab)
        if path.is_file():
            catalog = _read(path)
            catalog.update(template, no_fuzzy_matching=False, update_header_comment=False)
            catalog.obsolete.clear()
        else:
            catalog = Catalog(locale=LANGUAGE, project="Parallelism, Computed: labs", fuzzy=False)
            for message in template:
                if message.id:
                    catalog.add(message.id, "", locations=message.locations)
        catalog.fuzzy = False
        _write(catalog, path)
        written.append(path)
    folder = locale_dir(labs_dir)
    for po in sorted(folder.glob("*.po")) if folder.is_dir() else []:
        if po.stem not in {lab.name for lab in labs}:
            po.unlink()
            print(f"removed the catalog of a lab that is gone: {po.name}")
    return written


def _tools():
    tools = Path(__file__).resolve().parents[2] / "tools" / "i18n"
    if str(tools) not in sys.path:
        sys.path.insert(0, str(tools))
    import markup
    import terms

    return markup, terms


def problems(labs: list[Lab] | None = None) -> dict[str, list[str]]:
    """{lab: lines} for missing and outdated entries, broken markup and glossary terms translated another way;
    an entry for a lab whose catalog lacks a message of its notebook or has one it no longer has (run extract)."""
    markup, terms = _tools()
    glossary = terms.load()
    found: dict[str, list[str]] = {}
    for lab in labs if labs is not None else find_labs():
        path = catalog_path(lab)
        if not path.is_file():
            found.setdefault(lab.name, []).append("no catalog for this lab (run `python -m pylib.labs i18n extract`)")
            continue
        catalog = _read(path)
        ids = {m.id for m in catalog if m.id}
        wanted = {text for text, _ in messages(lab.read())}
        for text in sorted(wanted - ids):
            found.setdefault(lab.name, []).append(f"missing: {text[:70]!r} (not in the catalog: run extract)")
        for message in catalog:
            if not message.id:
                continue
            short = message.id[:70].replace("\n", " ")
            if message.id not in wanted:
                found.setdefault(lab.name, []).append(f"outdated: {short} (gone from the lab: run extract)")
            elif not message.string:
                found.setdefault(lab.name, []).append(f"missing: {short}")
            elif message.fuzzy:
                found.setdefault(lab.name, []).append(f"outdated: {short}")
            else:
                # a line break inside inline math or a code span is a space to Markdown (and to this check)
                flat_id, flat_str = message.id.replace("\n", " "), message.string.replace("\n", " ")
                for fault in markup.differences(flat_id, flat_str):
                    found.setdefault(lab.name, []).append(f"markup ({fault}): {short}")
                for fault in terms.violations(flat_id, flat_str, glossary):
                    found.setdefault(lab.name, []).append(f"term ({fault}): {short}")
    return found


def check(labs: list[Lab] | None = None, verbose: bool = True) -> int:
    found = problems(labs)
    counts = {"missing": 0, "outdated": 0, "markup": 0, "term": 0, "no catalog": 0}
    for name, lines in found.items():
        for line in lines:
            counts[next(k for k in counts if line.startswith(k))] += 1
            if verbose:
                print(f"{name}: {line}")
    print(", ".join(f"{v} {k}" for k, v in counts.items()))
    return 1 if any(counts.values()) else 0


def todo(lab: Lab) -> list[dict]:
    out = []
    for message in _read(catalog_path(lab)):
        if not message.id or (message.string and not message.fuzzy):
            continue
        entry = {"msgid": message.id}
        if message.fuzzy and message.previous_id:
            previous = message.previous_id
            entry["previous_msgid"] = previous[0] if isinstance(previous, list | tuple) else previous
            entry["previous_msgstr"] = message.string
        out.append(entry)
    return out


def fill(lab: Lab, translations: dict[str, str]) -> int:
    path = catalog_path(lab)
    catalog = _read(path)
    unknown = [k for k in translations if k not in catalog]
    if unknown:
        raise ValueError(f"{len(unknown)} msgids are not in {path}, e.g. {unknown[0][:80]!r}")
    for msgid, msgstr in translations.items():
        message = catalog[msgid]
        message.string = msgstr
        message.flags.discard("fuzzy")
        message.previous_id = []
    _write(catalog, path)
    return len(translations)


@cache
def _catalog(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    return {m.id: m.string for m in _read(path) if m.id and m.string and not m.fuzzy}


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
    from .notebook import select_labs

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
    translations = json.loads(Path(args.json).read_text(encoding="utf-8"))
    if isinstance(translations, list):
        translations = {t["msgid"]: t["msgstr"] for t in translations}
    print(f"{fill(lab, translations)} entries written to {catalog_path(lab)}")
    return 0
