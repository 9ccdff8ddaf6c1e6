"""pylib's message catalog (pylib.i18n): every message a reader can see has its Chinese entry, none is left unused,
the entries keep the English fields and format specs, and the Chinese output carries the same numbers as the English."""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path

import pytest

from pylib import i18n
from pylib.i18n import MissingTranslation, set_language, tr, zh_book

ROOT = Path(__file__).resolve().parents[1]
CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```", re.S | re.M)


def _cell_source(body: str) -> str:
    """A MyST code cell's Python: its `:option:` / `---` front matter and IPython magics blanked (lines kept)."""
    lines = body.split("\n")
    out = []
    front = bool(lines) and lines[0].strip() == "---"
    closed = not front
    for i, line in enumerate(lines):
        if not closed:
            out.append("")
            if i > 0 and line.strip() == "---":
                closed = True
            continue
        out.append("" if line.lstrip().startswith(("%", "!", ":")) and not out[-1:] == ["\\"] else line)
    return "\n".join(out)


def _sources():
    """(label, python source) for every module of pylib and every code cell of the chapters."""
    for path in sorted((ROOT / "pylib").rglob("*.py")):
        yield str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")
    for path in sorted((ROOT / "book").rglob("*.md")):
        if "_static" in path.parts or "locale" in path.parts:
            continue
        for k, m in enumerate(CELL.finditer(path.read_text(encoding="utf-8"))):
            yield f"{path.relative_to(ROOT)}[cell {k}]", _cell_source(m.group(1))


def _tr_calls():
    """(where, call node, message) for every tr(...) call whose first argument is a string literal, each source
    parsed once."""
    calls = []
    for where, src in _sources():
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            arg = node.args[0]
            if name == "tr" and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                calls.append((f"{where}:{node.lineno}", node, arg.value))
    return calls


TR_CALLS = _tr_calls()
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
    assert not missing, f"{len(missing)} messages without a zh entry in pylib/i18n/zh_book.py: {missing}"


def test_no_chinese_entry_is_unused():
    unused = [m for m in zh_book.MESSAGES if m not in LITERALS]
    assert not unused, f"zh_book entries no tr(...) call uses: {unused}"


@pytest.mark.parametrize("message", sorted(i18n.catalog("zh")))
def test_fields_match(message):
    zh = i18n.catalog("zh")[message]
    assert _fields(message) == _fields(zh), f"fields differ: {message!r} -> {zh!r}"
    string.Formatter().parse(zh)  # a well-formed format string


def test_every_call_passes_its_fields():
    """A tr(...) call's keyword arguments are exactly its message's fields (a chapter cell fails late otherwise)."""
    bad = []
    for where, node, message in TR_CALLS:
        kws = {k.arg for k in node.keywords}
        if None in kws:  # tr(message, **fields): checked where it runs
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
    table = {"params": lambda: tr("params")}
    assert i18n.shown(table, "params") == "params" and i18n.shown(table, "other") == "other"
    set_language("zh")
    try:
        assert i18n.shown(table, "params") == i18n.catalog("zh")["params"]
    finally:
        set_language(None)
