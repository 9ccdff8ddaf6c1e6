"""Text tables line up in both editions: a CJK character is two columns wide, everything else as str.ljust."""

from hypothesis import given
from hypothesis import strategies as st

from pylib.i18n import columns


def test_cjk_characters_take_two_columns_latin_one():
    assert columns.width("rank") == 4
    assert columns.width("专家数") == 6
    assert columns.width("步 ms") == 5
    assert columns.width("（，）") == 6  # fullwidth punctuation


def test_a_chinese_header_and_its_numbers_end_in_the_same_column():
    head, cell = columns.rjust("专家数", 8), columns.rjust("12", 8)
    assert columns.width(head) == columns.width(cell) == 8
    assert columns.ljust("层", 4) == "层  "


@given(st.text(alphabet=st.characters(max_codepoint=0x7E, min_codepoint=0x20)), st.integers(0, 40))
def test_for_ascii_text_they_are_str_ljust_and_rjust(text, n):
    assert columns.ljust(text, n) == text.ljust(n)
    assert columns.rjust(text, n) == text.rjust(n)


def test_the_books_text_tables_line_up_under_chinese_headers():
    from pylib.tables import text_table

    lines = text_table(["专家数", "层", "步 ms"], [["0", "0,1", "945"], ["12", "2,3", "1021"]])
    # Every column starts at the same display column on every line.
    starts = [
        [columns.width(line[: line.index(cell)]) for cell in cells]
        for line, cells in zip(lines, [["专家数", "层", "步 ms"], ["0", "0,1", "945"], ["12", "2,3", "1021"]])
    ]
    assert starts[0] == starts[1] == starts[2] == [0, 8, 13]
