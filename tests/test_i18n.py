"""pylib's message catalog (pylib.i18n): every message a reader can see has its Chinese entry, none is left unused,
the entries keep the English fields and format specs, and the Chinese output carries the same numbers as the English."""

from __future__ import annotations

import re
import string
import sys
from pathlib import Path

import pytest

from pylib import i18n
from pylib.i18n import MissingTranslation, pofile, set_language, tr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "i18n"))
import messages  # noqa: E402  (tools/i18n/messages.py: the tr(...) literals, the catalogs' template)

TR_CALLS = [(where, node, message) for _, where, node, message in messages.tr_calls()]
LITERALS: dict[str, list[str]] = {}  # message -> [where]
for _where, _, _message in TR_CALLS:
    LITERALS.setdefault(_message, []).append(_where)


def _fields(message: str) -> list[tuple[str, str, str | None]]:
    return sorted((f, spec or "", conv) for _, f, spec, conv in string.Formatter().parse(message) if f is not None)


def test_the_scan_finds_the_messages():
    assert len(LITERALS) > 50, "the AST scan found almost no tr(...) call: is it broken?"


def test_every_message_has_its_chinese_entry():
    zh = i18n.catalog("zh")
    missing = {m: w[0] for m, w in LITERALS.items() if m not in zh}
    assert not missing, f"{len(missing)} messages without a zh entry in {i18n.LOCALE.relative_to(ROOT)}: {missing}"


@pytest.fixture(scope="module")
def templates():
    return messages.templates()  # one scan of every tr(...) of the repository for both domains


@pytest.mark.parametrize("domain", i18n.DOMAINS)
def test_each_catalog_holds_exactly_its_messages(domain, templates):
    """No entry is unused, and a message is in the catalog of its domain (labs.po: used only by pylib/labs)."""
    held = {m.id for m in pofile.entries(pofile.read(i18n.catalog_path(domain)))}
    wanted = {m.id for m in pofile.entries(templates[domain])}
    assert held == wanted, (
        f"{domain}.po: unused {sorted(held - wanted)[:10]}, missing {sorted(wanted - held)[:10]} "
        "(python tools/i18n/catalogs.py update)"
    )


def test_a_fuzzy_entry_counts_as_missing(tmp_path, monkeypatch):
    """An entry whose English changed since it was translated (fuzzy) is not shown: tr raises."""
    for domain in i18n.DOMAINS:
        catalog = pofile.read(i18n.catalog_path(domain))
        if domain == "pylib":
            catalog["rank"].flags.add("fuzzy")
        pofile.write(catalog, tmp_path / "zh_CN" / "LC_MESSAGES" / f"{domain}.po")
    monkeypatch.setattr(i18n, "LOCALE", tmp_path)
    i18n.catalog.cache_clear()
    set_language("zh")
    try:
        assert tr("phase") == "阶段"  # the rest of the catalog still speaks Chinese
        with pytest.raises(MissingTranslation, match="'rank'"):
            tr("rank")
    finally:
        set_language(None)
        monkeypatch.undo()
        i18n.catalog.cache_clear()


@pytest.mark.parametrize("message", sorted(i18n.catalog("zh")))
def test_fields_match(message):
    zh = i18n.catalog("zh")[message]
    assert _fields(message) == _fields(zh), f"fields differ: {message!r} -> {zh!r}"
    string.Formatter().parse(zh)  # a well-formed format string


def test_every_call_passes_its_fields():
    """A tr(...) or later(...) call's keyword arguments are exactly its message's fields (a chapter cell fails late
    otherwise). A message marked N_(...) gets its fields where tr formats it, which raises `MissingField` naming one
    left out."""
    bad = []
    for where, node, message in TR_CALLS:
        kws = {k.arg for k in node.keywords}
        if None in kws or getattr(node.func, "id", None) == "N_":  # tr(message, **fields), N_: checked where it runs
            continue
        fields = {name for name, _, _ in _fields(message)}
        if fields != kws:
            bad.append(f"{where}: fields {sorted(fields)}, arguments {sorted(kws)}")
    assert not bad, "\n".join(bad)


def test_unknown_message_raises():
    set_language("zh")
    try:
        with pytest.raises(MissingTranslation, match="no zh entry"):
            tr("a message nobody translated {n}", n=1)
    finally:
        set_language(None)
    set_language("en")
    try:
        assert tr("a message nobody translated {n}", n=1) == "a message nobody translated 1"
    finally:
        set_language(None)


NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
CJK = re.compile(r"[\u4e00-\u9fff]")


def _numbers(text: str) -> list[str]:
    return NUMBER.findall(text)


def _in(language, fn):
    set_language(language)
    try:
        return fn()
    finally:
        set_language(None)


def _figure_text(fig) -> str:
    """Every visible text of a figure (titles, axis labels, tick labels, legends, annotations), in order."""
    import matplotlib.text

    fig.canvas.draw()
    texts = [t.get_text() for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text()]
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "\n".join(texts)


def _bubble_rows():
    from pylib.analysis import pp as A
    from pylib.plan.schedules import build
    from pylib.pp.simulate import simulate
    from pylib.pp.timeline import bubble

    return [
        {
            "schedule": name,
            "m": m,
            "formula": A.bubble_fraction(4, m, v),
            "measured: schedule": bubble(simulate(build(name, 4, m, v))).mean_relative,
        }
        for name, v in [("1f1b", 1), ("interleaved", 2)]
        for m in (4, 8, 16)
    ]


def _builders():
    from pylib.plan.schedules import build
    from pylib.viz import pp as vpp
    from pylib.viz import pp_tables

    rows = _bubble_rows()
    for r in rows:
        r["measured: replay"] = r["measured: schedule"]
        r["share"] = r["formula"] / (1 + r["formula"])
    return {
        "pp.plot_schedule": lambda: _figure_text(vpp.plot_schedule(build("1f1b", 4, 8))),
        "pp.plot_bubble_sweep": lambda: _figure_text(vpp.plot_bubble_sweep(rows)),
        "pp_tables.bubble_sweep": lambda: pp_tables.bubble_sweep(rows, 4),
        "pp_tables.blocking": lambda: pp_tables.blocking([[4, "interleaved", (1, 2), 0.1875, 0.1875, 0.25]]),
    }


BUILDERS = ["pp.plot_schedule", "pp.plot_bubble_sweep", "pp_tables.bubble_sweep", "pp_tables.blocking"]


@pytest.mark.parametrize("name", BUILDERS)
def test_chinese_output_same_numbers(name):
    build = _builders()[name]
    en = _in("en", build)
    zh = _in("zh", build)
    assert CJK.search(zh), f"{name}: no Chinese in the zh output:\n{zh}"
    assert _numbers(en) == _numbers(zh), f"{name}: the numbers differ\nen: {en}\nzh: {zh}"


def test_shown_is_the_entry_in_the_language_of_the_call_or_the_key():
    """A label written once, N_("params"): the catalog holds it and `shown` translates it when it is shown; a key
    without a label is shown as itself; a mapping gives a key other words."""
    labels = frozenset({i18n.N_("params")})
    words = {"optim": i18n.N_("optimizer state")}
    assert "params" in LITERALS and "optimizer state" in LITERALS  # the scan finds N_(...) marks too
    assert i18n.shown(labels, "params") == "params" and i18n.shown(labels, "other") == "other"
    assert i18n.shown(words, "optim") == "optimizer state" and i18n.shown(words, "other") == "other"
    set_language("zh")
    try:
        zh = i18n.catalog("zh")
        assert i18n.shown(labels, "params") == zh["params"] != "params"
        assert i18n.shown(words, "optim") == zh["optimizer state"]
        assert i18n.shown(labels, "other") == "other"
    finally:
        set_language(None)
