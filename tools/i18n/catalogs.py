"""The Chinese edition's translation catalogs: one gettext .po file per chapter, kept in step with the English text.

    python tools/i18n/catalogs.py extract   # English sources -> _build/i18n/_build/gettext/**/*.pot (no execution)
    python tools/i18n/catalogs.py update    # .pot -> book/locale/zh_CN/LC_MESSAGES/**/*.po (new, outdated, gone)
    python tools/i18n/catalogs.py check     # 0 missing, 0 outdated, markup kept, glossary terms: or exit 1
    python tools/i18n/catalogs.py todo PO   # the entries of one .po still to translate, as JSON (for translators)
    python tools/i18n/catalogs.py fill PO JSON   # put translations ({"msgid": "msgstr", ...}) into one .po
        (or [{"msgid": ..., "msgstr": ..., "other_senses": ["rank"]}, ...]: a glossary word the message uses in
        another sense, e.g. the verb "rank", recorded as a translator comment the term check honours)

`extract` runs Sphinx's own gettext builder over the book with notebook execution off (the messages are the
chapters' Markdown; code cells and their outputs are never messages: outputs are translated by pylib's catalog,
`pylib.i18n`). `update` merges the templates into the catalogs the way `msgmerge` does (Babel, which Sphinx itself
depends on): a paragraph whose English changed keeps its old translation marked fuzzy, which is what "outdated"
means here and what `check` counts; Sphinx ignores fuzzy translations, so an outdated paragraph shows in English
until it is translated again. A message that left the English text is dropped.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml
from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po, write_po

ROOT = Path(__file__).resolve().parents[2]
LANGUAGE = "zh_CN"
LOCALE = ROOT / "book" / "locale" / LANGUAGE / "LC_MESSAGES"
TEMPLATES = ROOT / "_build" / "i18n" / "_build" / "gettext"
GETTEXT_CONFIG = ROOT / ".i18n-gettext.yml"  # Jupyter Book resolves the config's relative paths from the root

sys.path.insert(0, str(Path(__file__).resolve().parent))
import markup  # noqa: E402  (tools/i18n/markup.py)
import terms  # noqa: E402  (tools/i18n/terms.py)


def extract() -> None:
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    config["execute"]["execute_notebooks"] = "off"
    GETTEXT_CONFIG.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    try:
        command = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(ROOT), "--config"]
        command += [str(GETTEXT_CONFIG), "--builder", "custom", "--custom-builder", "gettext"]
        command += ["--path-output", str(ROOT / "_build" / "i18n"), "--all", "-q"]
        subprocess.run(command, check=True, cwd=ROOT)
    finally:
        GETTEXT_CONFIG.unlink(missing_ok=True)
    # Sphinx writes each location relative to the output folder; keep only the chapter's own path.
    for pot in TEMPLATES.rglob("*.pot"):
        text = pot.read_text(encoding="utf-8")
        pot.write_text(text.replace(str(ROOT) + "/", "").replace("../", ""), encoding="utf-8")
    print(f"templates in {TEMPLATES.relative_to(ROOT)}: {len(list(TEMPLATES.rglob('*.pot')))}")


def _read(path: Path) -> Catalog:
    with path.open("rb") as f:
        return read_po(f, locale=LANGUAGE)


def _write(catalog: Catalog, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        write_po(f, catalog, width=0, omit_header=False, include_previous=True)  # in the template's order


def _entries(catalog: Catalog):
    return [m for m in catalog if m.id]


def update() -> None:
    if not TEMPLATES.is_dir():
        sys.exit(f"no templates in {TEMPLATES}: run `extract` first")
    for pot in sorted(TEMPLATES.rglob("*.pot")):
        po_path = LOCALE / pot.relative_to(TEMPLATES).with_suffix(".po")
        template = _read(pot)
        if po_path.is_file():
            catalog = _read(po_path)
            catalog.update(template, no_fuzzy_matching=False, update_header_comment=False)
            catalog.obsolete.clear()
        else:
            catalog = Catalog(locale=LANGUAGE, project="Parallelism, Computed", fuzzy=False)
            for message in _entries(template):
                catalog.add(message.id, "", locations=message.locations)
        catalog.fuzzy = False
        _write(catalog, po_path)
    gone = {p.relative_to(LOCALE).with_suffix("") for p in LOCALE.rglob("*.po")}
    gone -= {p.relative_to(TEMPLATES).with_suffix("") for p in TEMPLATES.rglob("*.pot")}
    for name in sorted(gone):
        (LOCALE / name).with_suffix(".po").unlink()
        print(f"removed the catalog of a page that is gone: {name}")
    check(strict=False)


def problems() -> dict[str, list[str]]:
    """Every catalog's missing and outdated entries, broken markup and glossary terms translated another way."""
    found: dict[str, list[str]] = {}
    glossary = terms.load()
    pages = {p.relative_to(TEMPLATES).with_suffix("") for p in TEMPLATES.rglob("*.pot")}
    for name in sorted(pages - {p.relative_to(LOCALE).with_suffix("") for p in LOCALE.rglob("*.po")}):
        found.setdefault(str(name), []).append("no catalog for this page")
    for po_path in sorted(LOCALE.rglob("*.po")):
        name = str(po_path.relative_to(LOCALE).with_suffix(""))
        pot = (TEMPLATES / name).with_suffix(".pot")
        if pot.is_file():  # the English as extracted now, against the catalog as last updated
            current = {m.id for m in _entries(_read(pot))}
            held = {m.id for m in _entries(_read(po_path))}
            for msgid in sorted(current - held):
                found.setdefault(name, []).append(f"missing (English changed; run update): {msgid[:70]}")
            for msgid in sorted(held - current):
                found.setdefault(name, []).append(f"outdated (no longer in the English; run update): {msgid[:70]}")
        for message in _entries(_read(po_path)):
            short = message.id[:70].replace("\n", " ")
            if not message.string:
                found.setdefault(name, []).append(f"missing: {short}")
            elif message.fuzzy:
                found.setdefault(name, []).append(f"outdated: {short}")
            else:
                for fault in markup.differences(message.id, message.string):
                    found.setdefault(name, []).append(f"markup ({fault}): {short}")
                senses = terms.other_senses(message.user_comments)
                for fault in terms.violations(message.id, message.string, glossary, senses):
                    found.setdefault(name, []).append(f"term ({fault}): {short}")
    return found


def check(strict: bool = True) -> int:
    found = problems()
    counts = {"missing": 0, "outdated": 0, "markup": 0, "term": 0, "no catalog": 0}
    for lines in found.values():
        for line in lines:
            counts[next(k for k in counts if line.startswith(k))] += 1
    if strict:
        for name, lines in found.items():
            for line in lines:
                print(f"{name}: {line}")
    print(", ".join(f"{v} {k}" for k, v in counts.items()))
    return 1 if any(counts.values()) else 0


def todo(po_path: Path) -> None:
    out = []
    for message in _entries(_read(po_path)):
        if message.string and not message.fuzzy:
            continue
        entry = {"msgid": message.id}
        if message.fuzzy and message.previous_id:
            previous = message.previous_id
            entry["previous_msgid"] = previous[0] if isinstance(previous, list | tuple) else previous
            entry["previous_msgstr"] = message.string
        out.append(entry)
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    print()


def fill(po_path: Path, json_path: Path) -> None:
    translations = json.loads(json_path.read_text(encoding="utf-8"))
    senses: dict[str, list[str]] = {}
    if isinstance(translations, list):  # [{"msgid", "msgstr", optional "other_senses": ["rank", ...]}]
        senses = {t["msgid"]: t["other_senses"] for t in translations if t.get("other_senses")}
        translations = {t["msgid"]: t["msgstr"] for t in translations}
    catalog = _read(po_path)
    unknown = [k for k in translations if k not in catalog]
    if unknown:
        sys.exit(f"{len(unknown)} msgids are not in {po_path}, e.g. {unknown[0][:80]!r}")
    for msgid, msgstr in translations.items():
        message = catalog[msgid]
        message.string = msgstr
        message.flags.discard("fuzzy")
        message.previous_id = []
        if msgid in senses:
            kept = [c for c in message.user_comments if not c.strip().startswith(terms.OTHER_SENSE)]
            message.user_comments = kept + [f"{terms.OTHER_SENSE} {', '.join(senses[msgid])}"]
    _write(catalog, po_path)
    print(f"{len(translations)} entries written to {po_path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("extract")
    sub.add_parser("update")
    sub.add_parser("check")
    p = sub.add_parser("todo")
    p.add_argument("po", type=Path)
    p = sub.add_parser("fill")
    p.add_argument("po", type=Path)
    p.add_argument("json", type=Path)
    args = parser.parse_args(argv)
    if args.command == "extract":
        extract()
    elif args.command == "update":
        update()
    elif args.command == "check":
        return check()
    elif args.command == "todo":
        todo(args.po)
    else:
        fill(args.po, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
