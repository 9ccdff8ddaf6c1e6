"""The glossary (book/part1/glossary.md) as the one source of the Chinese edition's terms.

`load()` reads its three tables (this book | 中文 | from) into {English term: {Chinese renderings}}: the term is
the cell's text before any parenthesis or backquote ("split by column", "microbatch"); where the seeds themselves
give one English word two Chinese words (up-projection: seed A's 升维, seed B's 上投影) both are accepted.
`violations(msgid, msgstr, glossary)` names each glossary term that the English message uses (outside code, math and
roles; plural -s/-es included) and whose Chinese word the translation does not contain: the term translated another
way. `retired(msgid, msgstr)` names each old rendering (RETIRED) the translation's prose still uses, whatever its
English: one rendering per term, the glossary's. A message kept unchanged (msgstr = msgid: a number, a code name, the
glossary's English column) is exempt from both."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import markup

GLOSSARY = Path(__file__).resolve().parents[2] / "book" / "part1" / "glossary.md"
ROW = re.compile(r"^\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|\s*$")


def _base(english: str) -> str:
    return re.split(r"\s*[(`]", english, maxsplit=1)[0].strip().lower()


@lru_cache(maxsize=1)
def load(path: Path = GLOSSARY) -> dict[str, frozenset[str]]:
    table: dict[str, set[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        row = ROW.match(line)
        if not row or row.group(1) in {"this book", "---"} or set(row.group(1)) <= {"-"}:
            continue
        english, chinese = _base(row.group(1)), row.group(2).strip()
        if len(english) > 2:
            table.setdefault(english, set()).add(chinese)
    if not table:
        raise ValueError(f"no terms found in {path}: the tables must be '| this book | 中文 | from |'")
    return {k: frozenset(v) for k, v in table.items()}


def _pattern(term: str) -> re.Pattern:
    return re.compile(r"(?<![\w-])" + re.escape(term) + r"(?:s|es)?(?![\w-])", re.IGNORECASE)


# Proper names that contain a glossary word in another sense: the paper's name stays as it is.
PROPER_NAMES = re.compile(r"Switch Transformers?", re.IGNORECASE)


def _prose(text: str) -> str:
    text = PROPER_NAMES.sub(" ", text)
    text = markup.ROLE.sub(" ", text)
    text = markup.MATH.sub(" ", text)
    return markup.CODE.sub(" ", text)


def violations(
    msgid: str, msgstr: str, glossary: dict[str, frozenset[str]], other_senses: frozenset[str] = frozenset()
) -> list[str]:
    """The glossary terms `msgid` uses whose Chinese word `msgstr` lacks. A term inside a longer term that matched
    ("rank" in "rank generator") is that longer term's; `other_senses` are terms the message uses in another sense
    than the glossary's (the verb "rank", a network "switch"), recorded on the catalog entry by the translator."""
    if msgstr == msgid:  # kept as it is on purpose: a number, a symbol, the glossary's own English column
        return []
    english = _prose(msgid)
    claimed: list[tuple[int, int]] = []
    faults = []
    for term in sorted(glossary, key=len, reverse=True):
        spans = [m.span() for m in _pattern(term).finditer(english)]
        spans = [(a, b) for a, b in spans if not any(c <= a and b <= d for c, d in claimed)]
        if not spans:
            continue
        claimed += spans
        if term not in other_senses and not any(word in msgstr for word in glossary[term]):
            faults.append(f"'{term}' is {' / '.join(sorted(glossary[term]))}")
    return faults


OTHER_SENSE = "not the glossary's term:"


def other_senses(comments) -> frozenset[str]:
    """The terms a catalog entry's translator comments mark as used in another sense
    (`# not the glossary's term: rank, switch`)."""
    found: set[str] = set()
    for comment in comments:
        if comment.strip().startswith(OTHER_SENSE):
            found |= {t.strip().lower() for t in comment.split(":", 1)[1].split(",") if t.strip()}
    return frozenset(found)


# Renderings the Chinese edition no longer uses, each with the glossary term it rendered and what to write instead
# (book/part1/glossary.md says why: the two articles' own words). A Chinese pattern the English message itself
# names is allowed (the glossary page names the old renderings); a Latin one is allowed inside a quotation of the
# articles' own Chinese that the English message carries (原文 B writes AllReduce).
RETIRED: tuple[tuple[str, str, str], ...] = (
    (r"进程号", "rank", "rank"),
    (r"种子\s*[AB]|两篇种子|种子文章", "seed A / seed B", "原文 A / 原文 B"),
    (r"微批次", "microbatch", "micro-batch"),
    (r"流水线阶段|虚拟阶段|阶段边界", "pipeline stage", "stage"),
    (r"ZeRO\s*(?:第\s*\d\s*)?阶段", "ZeRO stage", "ZeRO-1/2/3, ZeRO 级别"),
    (r"因果掩码", "causal mask", "causal mask"),
    (r"进程组生成器", "rank generator", "RankGenerator"),
    (r"隐藏(?:维度|大小|轴|状态)", "hidden dimension", "hidden 维度, hidden state"),
    (r"(?<![\w-])(?:all-reduce|All-reduce|AllReduce|allreduce)(?![\w-])", "all-reduce", "All-Reduce"),
    (r"(?<![\w-])(?:all-gather|All-gather|AllGather|allgather)(?![\w-])", "all-gather", "All-Gather"),
    (r"(?<![\w-])(?:reduce-scatter|Reduce-scatter|ReduceScatter)(?![\w-])", "reduce-scatter", "Reduce-Scatter"),
    (r"(?<![\w-])(?:all-to-all|All-to-all|AllToAll|alltoall)(?![\w-])", "all-to-all", "All-to-All"),
    (r"(?<![\w-])attention(?![\w-])", "attention", "Attention (注意力 in compounds)"),
)
QUOTED = re.compile(r"「[^」]*」|“[^”]*”|\"[^\"]*\"")
CJK = re.compile(r"[\u4e00-\u9fff]")
LATEX = re.compile(r"\\[A-Za-z]+\{[^{}]*\}")


def retired(msgid: str, msgstr: str) -> list[str]:
    """The old renderings `msgstr`'s prose uses, each as "'term' is NEW, not OLD"."""
    if msgstr == msgid:
        return []
    prose, english = (LATEX.sub(" ", _prose(text)) for text in (msgstr, msgid))  # \text{...} in math: not prose
    quoted = " ".join(q for q in QUOTED.findall(msgid) if CJK.search(q))
    faults = []
    for pattern, term, use in RETIRED:
        for old in dict.fromkeys(re.findall(pattern, prose)):
            allowed = quoted if re.match(r"[A-Za-z]", old) else english
            if old not in allowed:
                faults.append(f"'{term}' is {use}, not {old}")
    return faults
