"""Both editions computed the same numbers: the executed notebooks of the English build (_build/jupyter_execute/)
and of the Chinese one (_build/zh/_build/jupyter_execute/, tools/i18n/build_zh.py), compared cell by cell. The
words of an output differ (pylib prints Chinese under PYLIB_LANG=zh); its numbers, in order, must not. A cell whose
output is a wall-clock timing is left out by its tag, `measured-time`, in the cell's metadata. Within a cell the
numbers are compared as a multiset, since a translation may order a message's fields differently. A widget's
output is compared through its saved state (what the static page shows), not its cut-off repr."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.site import sitemap

EN = sitemap.ROOT / "_build" / "jupyter_execute"
ZH = sitemap.ROOT / "_build" / "zh" / "_build" / "jupyter_execute"
TIMED = "measured-time"
# A number as printed: digits with , or _ grouping, a decimal part, an exponent, and a sign when the sign starts a
# word (the hyphen of "step-0" or "ZeRO-1" is not a minus).
NUMBER = re.compile(r"(?:(?<![\w.])[-+−])?(?<![\w.])\d[\d,_]*(?:\.\d+)?(?:[eE][-+]?\d+)?")
# What an output carries besides numbers that are not the computation's: memory addresses, widget and plot ids.
NOISE = re.compile(r"0x[0-9a-fA-F]+|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f-]{14,}|\"model_id\": \"[^\"]*\"|id=\"[^\"]*\"")


def _notebooks() -> list[str]:
    return sorted(str(p.relative_to(EN)) for p in EN.rglob("*.ipynb")) if EN.is_dir() else []


def _text(output: dict) -> str:
    """The text of an output a reader sees: stream text, text/plain, text/html, text/markdown, tracebacks. Images
    are pictures of the numbers (their titles and labels are language-dependent; the PNG bytes are too)."""
    if output.get("output_type") == "stream":
        return "".join(output.get("text", ""))
    if output.get("output_type") == "error":
        return "\n".join(output.get("traceback", []))
    data = output.get("data", {})
    if sitemap.WIDGET_VIEW in data:
        # A widget's text/plain is its repr cut at a fixed number of characters, so a Chinese one shows more of its
        # options (and their numbers) than the English; what the page shows is the saved widget state.
        return ""
    parts = [data[k] for k in ("text/plain", "text/html", "text/markdown", "text/latex") if k in data]
    return "\n".join("".join(p) if isinstance(p, list) else str(p) for p in parts)


def numbers(text: str) -> list[str]:
    text = NOISE.sub(" ", text)
    return [n.replace(",", "").replace("_", "").replace("−", "-") for n in NUMBER.findall(text)]


def _cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("notebook", _notebooks() or ["(no built book)"])
def test_both_editions_computed_the_same_numbers(notebook):
    english, chinese = EN / notebook, ZH / notebook
    if not english.is_file():
        pytest.fail(f"no executed notebooks in {EN}: run `make book` first")
    assert chinese.is_file(), f"{notebook}: executed in English but not in Chinese ({ZH})"
    en_cells, zh_cells = _cells(english), _cells(chinese)
    assert len(en_cells) == len(zh_cells), f"{notebook}: {len(en_cells)} code cells in English, {len(zh_cells)}"
    differ = []
    for i, (en, zh) in enumerate(zip(en_cells, zh_cells, strict=True)):
        assert en["source"] == zh["source"], f"{notebook}: code cell {i} differs between the editions"
        if TIMED in en.get("metadata", {}).get("tags", []):
            continue
        a = numbers("\n".join(_text(o) for o in en.get("outputs", [])))
        b = numbers("\n".join(_text(o) for o in zh.get("outputs", [])))
        # As multisets: a translation may put a message's fields in another order ("{a} of {b}" -> "{b} 中的 {a}").
        a, b = sorted(a), sorted(b)
        if a != b:
            first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            differ.append(
                f"cell {i} ({''.join(en['source'])[:60]!r}): {len(a)} numbers vs {len(b)}; first difference at "
                f"#{first}: {a[first : first + 3]} vs {b[first : first + 3]}"
            )
    assert not differ, (
        f"{notebook}: numbers differ between the editions (tag a cell that prints wall-clock time `{TIMED}`):\n  "
        + "\n  ".join(differ)
    )


def test_number_extraction():
    assert numbers("加速 3.5× at b=1,024 (−2e-3), 0x7f3a 12_000") == ["3.5", "1024", "-2e-3", "12000"]
    assert numbers("step-0 of ZeRO-1, +3072 B and -3072 B") == ["0", "1", "+3072", "-3072"]


def _widget_state_numbers(path: Path) -> list[str]:
    state = json.loads(path.read_text(encoding="utf-8"))["metadata"].get("widgets", {}).get(sitemap.WIDGET_STATE, {})
    found: list[str] = []
    for model in state.get("state", {}).values():
        found += numbers(json.dumps(model.get("state", {}), ensure_ascii=False))
    return sorted(found)


@pytest.mark.parametrize("notebook", _notebooks() or ["(no built book)"])
def test_both_editions_saved_widgets_with_the_same_numbers(notebook):
    """What a page's widgets show on the static site is their saved state: the same numbers in both editions (the
    options of every control, the tables and plots inside, the selected values)."""
    english, chinese = EN / notebook, ZH / notebook
    if not english.is_file():
        pytest.fail(f"no executed notebooks in {EN}: run `make book` first")
    a, b = _widget_state_numbers(english), _widget_state_numbers(chinese)
    assert a == b, f"{notebook}: {len(a)} numbers in the English widgets' saved state, {len(b)} in the Chinese"
