"""tools/i18n on small fixtures: the markup check (a lost role, lost math), the glossary-term check (a term
translated another way, an old rendering the glossary retired) and the catalog check (a fuzzy entry counts as
outdated, an empty one as missing)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from babel.messages.catalog import Catalog
from babel.messages.pofile import write_po

TOOLS = Path(__file__).resolve().parents[1] / "tools" / "i18n"
sys.path.insert(0, str(TOOLS))
import catalogs  # noqa: E402
import markup  # noqa: E402
import terms  # noqa: E402


def test_markup_kept_is_clean():
    msgid = "See {numref}`Figure %s <fig-tp>` and $b \\cdot s$ with `all_reduce`, [docs](https://x.org/a)."
    msgstr = "见 {numref}`图 %s <fig-tp>`，$b \\cdot s$ 与 `all_reduce`，[文档](https://x.org/a)。"
    assert markup.differences(msgid, msgstr) == []


def test_markup_lost_role():
    faults = markup.differences("As in {ref}`the primer <collectives>`.", "如入门所述。")
    assert faults == ["role lost: ('ref', 'collectives')"]


def test_markup_role_label_changed():
    faults = markup.differences("{ref}`x <tp-layer>`", "{ref}`张量并行 <tp-层>`")
    assert "role lost: ('ref', 'tp-layer')" in faults and "role added: ('ref', 'tp-层')" in faults


def test_markup_lost_math():
    faults = markup.differences("Each rank holds $1/t$ of the weights.", "每个 rank 持有权重的 1/t。")
    assert faults == ["math lost: 1/t"]


def test_markup_altered_code_and_link():
    faults = markup.differences("Call `psum` [here](a.md).", "调用 `psum()` [这里](b.md)。")
    assert "code lost: psum" in faults and "link lost: a.md" in faults


GLOSSARY = """
| this book | 中文 | from |
|---|---|---|
| microbatch | micro-batch | seed B |
| bubble (pipeline) | 气泡 | seed B |
| up-projection | 升维 | seed A |
| up-projection | 上投影 | seed B |
"""


@pytest.fixture
def glossary(tmp_path):
    path = tmp_path / "glossary.md"
    path.write_text(GLOSSARY, encoding="utf-8")
    return terms.load.__wrapped__(path)


def test_glossary_reads_both_renderings(glossary):
    assert glossary["bubble"] == {"气泡"}
    assert glossary["up-projection"] == {"升维", "上投影"}


def test_term_translated_another_way(glossary):
    faults = terms.violations("Four microbatches fill the bubble.", "四个微批填满空泡。", glossary)
    assert sorted(faults) == ["'bubble' is 气泡", "'microbatch' is micro-batch"]


def test_term_seed_word_passes(glossary):
    assert terms.violations("The bubble shrinks.", "气泡变小。", glossary) == []
    assert terms.violations("the up-projection", "上投影", glossary) == []


def test_term_inside_code_or_math_is_not_prose(glossary):
    assert terms.violations("Set `bubble` to $microbatch$.", "把 `bubble` 设为 $microbatch$。", glossary) == []


def _po(path: Path, entries: list[tuple[str, str, bool]]) -> None:
    catalog = Catalog(locale="zh_CN")
    for msgid, msgstr, fuzzy in entries:
        catalog.add(msgid, msgstr, flags=["fuzzy"] if fuzzy else [])
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        write_po(f, catalog)


TP_MESSAGES = ("The bubble.", "One microbatch.", "Not yet.", "See $p$.", "The bubble grows.")


@pytest.fixture
def book(tmp_path, monkeypatch, glossary):
    """A book of two pages: templates in TEMPLATES, catalogs in LOCALE."""
    templates, locale = tmp_path / "gettext", tmp_path / "locale"
    _po(templates / "part3" / "tp.pot", [(m, "", False) for m in TP_MESSAGES])
    _po(templates / "part3" / "pp.pot", [("The bubble.", "", False)])
    monkeypatch.setattr(catalogs, "TEMPLATES", templates)
    monkeypatch.setattr(catalogs, "LOCALE", locale)
    monkeypatch.setattr(catalogs.terms, "load", lambda: glossary)
    monkeypatch.setattr(catalogs, "pylib_problems", lambda glossary: {})  # pylib's own: test_book_catalogs
    return locale


def test_check_counts_outdated_missing_and_no_catalog(book, capsys):
    _po(
        book / "part3" / "tp.po",
        [
            ("The bubble.", "气泡。", False),  # fine
            ("One microbatch.", "一个 micro-batch。", True),  # fuzzy: outdated
            ("Not yet.", "", False),  # missing
            ("See $p$.", "见 p。", False),  # math lost
            ("The bubble grows.", "空泡变大。", False),  # term another way
        ],
    )
    found = catalogs.problems()
    assert found["part3/pp"] == ["no catalog for this page"]
    lines = found["part3/tp"]
    assert "outdated: One microbatch." in lines
    assert "missing: Not yet." in lines
    assert any(line.startswith("markup (math lost: p)") for line in lines)
    assert any(line.startswith("term ('bubble' is 气泡)") for line in lines)
    assert len(lines) == 4
    assert catalogs.check() == 1
    assert "1 missing, 1 outdated, 1 markup, 1 term, 1 no catalog" in capsys.readouterr().out


COMPLETE_TP = [
    ("The bubble.", "气泡。", False),
    ("One microbatch.", "一个 micro-batch。", False),
    ("Not yet.", "还没有。", False),
    ("See $p$.", "见 $p$。", False),
    ("The bubble grows.", "气泡变大。", False),
]


def test_check_passes_when_complete(book):
    _po(book / "part3" / "tp.po", COMPLETE_TP)
    _po(book / "part3" / "pp.po", [("The bubble.", "气泡。", False)])
    assert catalogs.problems() == {}
    assert catalogs.check() == 0


def test_check_compares_the_catalogs_with_the_english_as_extracted_now(book):
    """An English paragraph edited after the last `update`: the new text is missing, the old one outdated."""
    _po(book / "part3" / "tp.po", COMPLETE_TP)
    _po(book / "part3" / "pp.po", [("The bubble shrinks.", "气泡变小。", False)])
    assert catalogs.problems() == {
        "part3/pp": [
            "missing (English changed; run update): The bubble.",
            "outdated (no longer in the English; run update): The bubble shrinks.",
        ]
    }


def test_fill_drops_the_previous_english_of_an_outdated_entry(tmp_path):
    """An entry merged as outdated carries its old English ("#| msgid"); translated again, it carries none."""
    from pylib.i18n import pofile

    path = tmp_path / "tp.po"
    _po(path, [("One microbatch.", "一个 micro-batch。", False)])
    template = Catalog(locale="zh_CN")
    template.add("One microbatch, twice.")
    pofile.merge(template, path, project="test")
    assert "#| msgid" in path.read_text(encoding="utf-8")
    catalog = pofile.read(path)
    assert catalog["One microbatch, twice."].fuzzy
    pofile.fill(catalog, {"One microbatch, twice.": "一个 micro-batch，两次。"}, {}, terms.OTHER_SENSE)
    pofile.write(catalog, path)
    text = path.read_text(encoding="utf-8")
    assert "One microbatch." not in text and "fuzzy" not in text, text


def test_retired_rendering_is_a_fault_whatever_the_english():
    """One rendering per term: the old words for rank, seed A, microbatch, pipeline stage and a collective's casing
    are faults even where the English message does not use the glossary's term."""
    faults = terms.retired("Each one holds a shard.", "每个进程号持有一个分片，见种子 A。")
    assert faults == ["'rank' is rank, not 进程号", "'seed A / seed B' is 原文 A / 原文 B, not 种子 A"]
    assert terms.retired("Sum them.", "对它们做 all-reduce。") == ["'all-reduce' is All-Reduce, not all-reduce"]
    assert terms.retired("Four microbatches.", "四个微批次。") == ["'microbatch' is micro-batch, not 微批次"]
    assert terms.retired("A stage boundary.", "一个流水线阶段边界。") == ["'pipeline stage' is stage, not 流水线阶段"]


def test_retired_rendering_allowed_where_the_english_names_it_or_in_code():
    assert terms.retired("Each rank holds a shard.", "每个 rank 持有一个分片。") == []
    assert terms.retired("the old 进程号 for rank", "旧译法进程号（rank）") == []  # the glossary names it
    assert terms.retired("Call `all_reduce`; see `all-reduce`.", "调用 `all_reduce`；见 `all-reduce`。") == []
    assert terms.retired("Seeded weights.", "用同样设定随机种子的权重。") == []  # a random seed is a seed
    quoted = "Seed B writes 「TP 每层 AllReduce」 here."
    assert terms.retired(quoted, "原文 B 写道「TP 每层 AllReduce」。") == []  # the article's own Chinese, quoted
    assert terms.retired("TP all-reduces.", "TP 做 AllReduce。") == ["'all-reduce' is All-Reduce, not AllReduce"]


def test_check_names_the_catalog_entry_and_rule_of_a_retired_rendering(book, capsys):
    """A planted bad entry: `check` fails, naming the page, the rule and the entry's English."""
    planted = [*COMPLETE_TP[:4], ("The bubble grows.", "每个进程号上的气泡变大。", False)]
    _po(book / "part3" / "tp.po", planted)
    _po(book / "part3" / "pp.po", [("The bubble.", "气泡。", False)])
    assert catalogs.problems() == {
        "part3/tp": ["term (retired rendering: 'rank' is rank, not 进程号): The bubble grows."]
    }
    assert catalogs.check() == 1
    out = capsys.readouterr().out
    assert "part3/tp: term (retired rendering: 'rank' is rank, not 进程号): The bubble grows." in out
    assert "0 missing, 0 outdated, 0 markup, 1 term, 0 no catalog" in out
