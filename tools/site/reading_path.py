"""The book's reading path: which sections of each chapter are core and which are deep dives, and how long each
takes to read. Plain Python and PyYAML, no torch: the intro's hidden cell (its core-path table), the Sphinx
extension `sphinx_reading_path` (the badge under each section title) and tests/test_reading_path.py all ask this
module, so the three cannot disagree.

    chapters = load()                       # book/reading-path.yml: docname -> the deep-dive section ids
    path = chapter_path("book/part3/tp")    # the chapter's sections, each with its kind and minutes
    path.core_minutes, path.deep_minutes
    table_rows()                            # (docname, core, deep) in _toc.yml's order

A section is a Markdown heading outside code and fenced blocks, with the text up to the next heading. Its id is
its MyST label (the `(sec-...)=` line above the heading) when it has one, else the id docutils gives the heading
(`nodes.make_id` of its English text), which the Chinese edition keeps: a translated title changes the section's
text, not its ids. A section named in the YAML is a deep dive, and so is everything under it; the rest is core.

Reading time, as the lead's chapter_stats.py counts it: prose words at 200 a minute (a role such as {ref}`x` is one
word), visible code lines (non-blank lines of a code cell that no hide-/remove- tag folds) at 20 a minute; code
cells tagged hide-input, hide-cell, remove-input or remove-cell, and folded dropdowns (a {dropdown}, or an
admonition with `:class: dropdown`), are not counted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PATH_FILE = ROOT / "book" / "reading-path.yml"
TOC_FILE = ROOT / "_toc.yml"

WORDS_PER_MINUTE = 200
CODE_LINES_PER_MINUTE = 20
CORE_BUDGET_MINUTES = 240  # the whole core path
CHAPTER_CORE_BUDGET_MINUTES = 45  # one chapter's core

FOLDED_TAGS = {"hide-input", "hide-cell", "remove-input", "remove-cell"}
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_LABEL = re.compile(r"^\((?P<label>[^)\s]+)\)=\s*$")
_FENCE = re.compile(r"^(`{3,}|:{3,})")
_DROPDOWN_OPEN = re.compile(r"^(`{3,}|:{3,})\{(dropdown|admonition|note|warning|tip|important|seealso|hint)\}")
_ROLE = re.compile(r"\{[a-z:-]+\}`[^`]*`")
_WORD = re.compile(r"[A-Za-z0-9][\w'.,-]*")


def heading_id(title: str) -> str:
    """The id docutils gives a section whose heading is `title` (MyST markup read as the text it renders)."""
    from docutils.nodes import make_id

    text = re.sub(r"\{[a-z:-]+\}`([^`<]*?)(?:\s*<[^>]*>)?`", r"\1", title)  # {ref}`text <target>` -> text
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # [text](url) -> text
    text = re.sub(r"[`*$]|(?<!\w)_|_(?!\w)", "", text)
    return make_id(text)


@dataclass
class Section:
    """One heading and its own text (up to the next heading of any level)."""

    level: int
    title: str
    label: str | None
    words: int = 0
    code_lines: int = 0
    deep: bool = False
    children: list[Section] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.label or heading_id(self.title)

    @property
    def ids(self) -> set[str]:
        """Every id the built section carries that names it here: its label and its heading's id."""
        return {heading_id(self.title), *([self.label] if self.label else [])}

    @property
    def own_minutes(self) -> float:
        return self.words / WORDS_PER_MINUTE + self.code_lines / CODE_LINES_PER_MINUTE

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()

    def minutes(self, deep: bool) -> float:
        """This section and everything under it, counting only the sections of one kind."""
        return sum(s.own_minutes for s in self.walk() if s.deep == deep)


def _cell_tags(lines: list[str], i: int) -> tuple[set[str], int]:
    """The tags of the code cell whose options start at line i (`:tags: [...]` lines or a `---` block), and the
    line its code starts on."""
    tags: set[str] = set()
    if i < len(lines) and lines[i].strip() == "---":
        i += 1
        while i < len(lines) and lines[i].strip() != "---":
            if lines[i].lstrip().startswith("tags:"):
                tags |= set(re.findall(r"[\w-]+", lines[i].split(":", 1)[1]))
            i += 1
        return tags, i + 1
    while i < len(lines) and lines[i].startswith(":"):
        if lines[i].startswith(":tags:"):
            tags |= set(re.findall(r"[\w-]+", lines[i].split(":", 2)[2]))
        i += 1
    return tags, i


def _is_folded(lines: list[str], i: int) -> bool:
    opening = _DROPDOWN_OPEN.match(lines[i])
    if not opening:
        return False
    return opening.group(2) == "dropdown" or any("dropdown" in x for x in lines[i + 1 : i + 4] if x.startswith(":"))


def parse(source: str) -> list[Section]:
    """The level-1 sections of a MyST chapter (normally one: the title), each with its subsections."""
    lines = source.splitlines()
    i = 0
    if lines and lines[0].strip() == "---":  # the page's front matter
        i = 1
        while i < len(lines) and lines[i].strip() != "---":
            i += 1
        i += 1
    roots: list[Section] = []
    stack: list[Section] = []
    current: Section | None = None
    label: str | None = None
    prose: list[str] = []

    def flush():
        if current is not None:
            text = _ROLE.sub("x", "\n".join(prose))
            current.words += len(_WORD.findall(text))
        prose.clear()

    while i < len(lines):
        line = lines[i]
        if line.startswith("```{code-cell}"):
            tags, i = _cell_tags(lines, i + 1)
            body = []
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            if current is not None and not tags & FOLDED_TAGS:
                current.code_lines += sum(1 for x in body if x.strip())
        elif _is_folded(lines, i):
            fence = _FENCE.match(line).group(1)
            i += 1
            while i < len(lines) and not lines[i].startswith(fence):
                i += 1
        elif _FENCE.match(line):  # any other fenced block (a console listing, a figure, a table): its text is read
            fence = _FENCE.match(line).group(1)
            prose.append(line)
            i += 1
            while i < len(lines) and not lines[i].startswith(fence):
                prose.append(lines[i])
                i += 1
        elif _LABEL.match(line):
            label = _LABEL.match(line).group("label")
        elif _HEADING.match(line):
            flush()
            hashes, title = _HEADING.match(line).groups()
            section = Section(level=len(hashes), title=title, label=label)
            label = None
            while stack and stack[-1].level >= section.level:
                stack.pop()
            (stack[-1].children if stack else roots).append(section)
            stack.append(section)
            current = section
        else:
            if line.strip():
                label = None  # a label names only the heading right after it
            prose.append(line)
        i += 1
    flush()
    return roots


@dataclass
class ChapterPath:
    docname: str
    sections: list[Section]  # every section, in the page's order

    @property
    def core_minutes(self) -> float:
        return sum(s.own_minutes for s in self.sections if not s.deep)

    @property
    def deep_minutes(self) -> float:
        return sum(s.own_minutes for s in self.sections if s.deep)


def load(path: Path = PATH_FILE) -> dict[str, list[str]]:
    """book/reading-path.yml: chapter docname -> the ids of its deep-dive sections (an empty list: all core)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return {docname: list(ids or []) for docname, ids in data.items()}


def toc_docnames(toc: Path = TOC_FILE) -> list[str]:
    """The pages of _toc.yml, in the book's order (the root first)."""
    data = yaml.safe_load(toc.read_text(encoding="utf-8"))
    names = [data["root"]]

    def chapters(entries):
        for entry in entries or []:
            if "file" in entry:
                names.append(entry["file"])
            chapters(entry.get("sections"))

    for part in data.get("parts", []):
        chapters(part.get("chapters"))
    chapters(data.get("chapters"))
    return names


def chapter_path(docname: str, deep_ids: list[str] | None = None, source: str | None = None) -> ChapterPath:
    """A chapter's sections, each marked core or deep dive. Raises if an id names no section of the chapter."""
    if deep_ids is None:
        deep_ids = load().get(docname, [])
    if source is None:
        source = (ROOT / f"{docname}.md").read_text(encoding="utf-8")
    sections = [s for root in parse(source) for s in root.walk()]
    by_id = {}
    for section in sections:
        for sid in section.ids:
            by_id.setdefault(sid, section)
    unknown = [sid for sid in deep_ids if sid not in by_id]
    if unknown:
        known = ", ".join(s.id for s in sections)
        raise KeyError(f"{docname}: no section has the id {', '.join(unknown)} (its sections: {known})")
    for sid in deep_ids:
        for section in by_id[sid].walk():
            section.deep = True
    return ChapterPath(docname, sections)


def table_rows(path_file: Path = PATH_FILE, toc: Path = TOC_FILE) -> list[tuple[str, float, float]]:
    """(docname, core minutes, deep-dive minutes) for every page of the book, in _toc.yml's order."""
    chapters = load(path_file)
    rows = []
    for docname in toc_docnames(toc):
        chapter = chapter_path(docname, chapters.get(docname, []))
        rows.append((docname, chapter.core_minutes, chapter.deep_minutes))
    return rows


@dataclass
class PathTable:
    """The intro's table: each page's core and deep-dive minutes as the page shows them (whole minutes), and the
    totals of those shown numbers, so the table adds up as printed."""

    rows: list[tuple[str, int, int]]  # (docname, core, deep dive)

    @property
    def core_total(self) -> int:
        return sum(core for _, core, _ in self.rows)

    @property
    def deep_total(self) -> int:
        return sum(deep for _, _, deep in self.rows)


def path_table(path_file: Path = PATH_FILE, toc: Path = TOC_FILE) -> PathTable:
    return PathTable([(d, round(core), round(deep)) for d, core, deep in table_rows(path_file, toc)])
