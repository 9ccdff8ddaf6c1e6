"""The Chinese edition's translation catalogs: one gettext .po file per chapter, kept in step with the English text.

    python tools/i18n/catalogs.py extract   # English sources -> _build/i18n/_build/gettext/**/*.pot (no execution)
    python tools/i18n/catalogs.py update    # .pot -> book/locale/zh_CN/LC_MESSAGES/**/*.po (new, outdated, gone),
                                            # and pylib's messages -> pylib/i18n/locale/zh_CN/LC_MESSAGES/*.po
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

pylib's own messages (the literals passed to `pylib.i18n.tr`, found in the source by tools/i18n/messages.py
without running anything) live in the catalogs pylib/i18n/locale/zh_CN/LC_MESSAGES/pylib.po and labs.po; `update`
merges them the same way and `check` reviews them with the same checks (their template is the source itself, so
they need no `extract`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

from pylib import i18n
from pylib.i18n import pofile
from pylib.i18n.pofile import LANGUAGE

ROOT = Path(__file__).resolve().parents[2]
LOCALE = ROOT / "book" / "locale" / LANGUAGE / "LC_MESSAGES"
TEMPLATES = ROOT / "_build" / "i18n" / "_build" / "gettext"
GETTEXT_CONFIG = ROOT / ".i18n-gettext.yml"  # Jupyter Book resolves the config's relative paths from the root

sys.path.insert(0, str(Path(__file__).resolve().parent))
import messages  # noqa: E402  (tools/i18n/messages.py)
import review  # noqa: E402  (tools/i18n/review.py)
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


def update() -> None:
    if not TEMPLATES.is_dir():
        sys.exit(f"no templates in {TEMPLATES}: run `extract` first")
    for pot in sorted(TEMPLATES.rglob("*.pot")):
        po_path = LOCALE / pot.relative_to(TEMPLATES).with_suffix(".po")
        pofile.merge(pofile.read(pot), po_path, project="Parallelism, Computed")
    gone = {p.relative_to(LOCALE).with_suffix("") for p in LOCALE.rglob("*.po")}
    gone -= {p.relative_to(TEMPLATES).with_suffix("") for p in TEMPLATES.rglob("*.pot")}
    for name in sorted(gone):
        (LOCALE / name).with_suffix(".po").unlink()
        print(f"removed the catalog of a page that is gone: {name}")
    for domain, template in messages.templates().items():
        pofile.merge(template, i18n.catalog_path(domain), project="pylib")
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
        held = pofile.entries(pofile.read(po_path))
        pot = (TEMPLATES / name).with_suffix(".pot")
        if pot.is_file():  # the English as extracted now, against the catalog as last updated
            current = {m.id for m in pofile.entries(pofile.read(pot))}
            _compare(found.setdefault(name, []), current, held, "English changed", "no longer in the English")
        for message in held:
            found.setdefault(name, []).extend(review.faults(message, glossary))
    found.update(pylib_problems(glossary))
    return {name: lines for name, lines in found.items() if lines}


def _compare(lines: list[str], current: set[str], held, why_missing: str, why_outdated: str) -> None:
    """Name each message the source has and the catalog lacks (missing), and each the catalog holds for nothing."""
    ids = {m.id for m in held}
    lines.extend(f"missing ({why_missing}; run update): {msgid[:70]}" for msgid in sorted(current - ids))
    lines.extend(f"outdated ({why_outdated}; run update): {msgid[:70]}" for msgid in sorted(ids - current))


def pylib_problems(glossary) -> dict[str, list[str]]:
    """The same for pylib's catalogs, against the tr(...) messages in the source now."""
    found: dict[str, list[str]] = {}
    for domain, template in messages.templates().items():
        path = i18n.catalog_path(domain)
        name = str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
        current = {m.id for m in pofile.entries(template)}
        held = pofile.entries(pofile.read(path))
        _compare(found.setdefault(name, []), current, held, "a new tr(...) message", "no tr(...) uses it")
        for message in held:
            found.setdefault(name, []).extend(review.faults(message, glossary))
    return {name: lines for name, lines in found.items() if lines}


def check(strict: bool = True) -> int:
    return review.tally(problems(), show=strict)


def todo(po_path: Path) -> None:
    json.dump(pofile.todo(pofile.read(po_path)), sys.stdout, ensure_ascii=False, indent=1)
    print()


def fill(po_path: Path, json_path: Path) -> None:
    translated, senses = pofile.translations(json.loads(json_path.read_text(encoding="utf-8")))
    catalog = pofile.read(po_path)
    try:
        pofile.fill(catalog, translated, senses, terms.OTHER_SENSE)
    except ValueError as error:
        sys.exit(f"{po_path}: {error}")
    pofile.write(catalog, po_path)
    print(f"{len(translated)} entries written to {po_path}")


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
