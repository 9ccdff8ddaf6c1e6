"""book/labels.yml, the map from each label the book must define to the chapter that defines it, is well formed and
lists every label of the seed map. (The built site is checked against it by `make site-test`.)"""

from collections import Counter

from tests.site import sitemap


def test_labels_file_lists_each_label_once_under_a_chapter_docname():
    labels = sitemap.label_map()
    assert labels, "book/labels.yml lists no chapter"
    for chapter, names in labels.items():
        assert chapter.startswith("book/") and not chapter.endswith((".md", ".ipynb")), (
            f"{chapter!r}: name a chapter as _toc.yml does, a path under book/ without suffix"
        )
        assert names, f"{chapter}: no labels listed"
        bad = [n for n in names if not sitemap.SEED_LABEL.match(n)]
        assert not bad, f"{chapter}: labels must look like sec-/tbl-/fig- plus lowercase words: {bad}"
    repeated = [n for n, k in Counter(n for names in labels.values() for n in names).items() if k > 1]
    assert not repeated, f"labels listed more than once: {repeated}"


def test_labels_file_lists_every_label_of_the_seed_map():
    required = sitemap.seed_map_labels(sitemap.SEED_MAP.read_text())
    assert len(required) >= 20, f"read only {len(required)} labels from SEED-MAP.md: has its table layout changed?"
    listed = {n for names in sitemap.label_map().values() for n in names}
    missing = [n for n in required if n not in listed]
    assert not missing, f"labels of SEED-MAP.md missing from book/labels.yml: {missing}"


def test_seed_map_label_column_parser_reads_only_the_label_column():
    text = "\n".join(
        [
            "| # | item | label | computed |",
            "|---|---|---|---|",
            "| A1 | uses `code` here | `sec-a` | — |",
            "| A2 | x | `tbl-b`, `fig-c` | **computed** `not-a-label` |",
            "",
            "| # | seed item | label |",
            "|---|---|---|",
            "| B1 | `noise` | `tbl-d` |",
        ]
    )
    assert sitemap.seed_map_labels(text) == ["sec-a", "tbl-b", "fig-c", "tbl-d"]
