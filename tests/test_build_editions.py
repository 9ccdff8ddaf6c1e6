"""tools/i18n/build_editions.py runs the two editions' builds side by side: both must succeed, and one that fails
stops the other at once, with everything it started (no orphan kernel or rank keeps running)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools" / "i18n"
sys.path.insert(0, str(TOOLS))
import build_editions  # noqa: E402


def _python(code: str) -> tuple[list[str], dict[str, str]]:
    return [sys.executable, "-c", code], dict(os.environ)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) is not running.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def test_both_succeed_and_their_lines_carry_their_edition():
    out = io.StringIO()
    failed, status = build_editions.run_side_by_side(
        {"en": _python("print('one'); print('two')"), "zh": _python("print('三')")}, out=out
    )
    assert (failed, status) == (None, 0)
    lines = out.getvalue().splitlines()
    assert [line for line in lines if line.startswith("en| ")] == ["en| one", "en| two"]
    assert [line for line in lines if line.startswith("zh| ")] == ["zh| 三"]


def test_a_failed_build_stops_the_other_and_its_children(tmp_path):
    pid_file = tmp_path / "child.pid"
    # The long build starts a child of its own (as Sphinx starts kernels, and kernels start ranks).
    slow = _python(
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(120)\n"
    )
    failing = _python(
        f"import os, sys, time\nwhile not os.path.exists({str(pid_file)!r}): time.sleep(0.05)\nsys.exit(3)"
    )
    start = time.monotonic()
    failed, status = build_editions.run_side_by_side({"en": slow, "zh": failing}, out=io.StringIO())
    assert (failed, status) == ("zh", 3)
    assert time.monotonic() - start < 30, "the other build was not stopped promptly"
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the stopped build left a process running"


def _orders(node, path=()):
    """Every mapping's keys, in order, by where it sits in the config."""
    if isinstance(node, dict):
        yield path, list(node)
        for key, value in node.items():
            yield from _orders(value, (*path, key))


def test_the_chinese_config_keeps_the_order_of_every_mapping():
    """The order of nb_ipywidgets_js is the order of the page's scripts: require.js must load before the widget
    manager, or every page with saved widgets fails with "define is not defined" (it did, in the Chinese edition,
    when the config was copied through a sorting YAML round trip)."""
    import yaml

    base = yaml.safe_load((build_editions.ROOT / "_config.yml").read_text(encoding="utf-8"))
    chinese = dict(_orders(build_editions.build_zh.zh_config(base)))
    for path, keys in _orders(base):
        assert [k for k in chinese[path] if k in keys] == keys, path
    scripts = list(build_editions.build_zh.zh_config(base)["sphinx"]["config"]["nb_ipywidgets_js"])
    assert scripts.index("vendor/requirejs/require.js") < scripts.index("vendor/html-manager/embed-amd.js")


PAGE = """---
jupytext:
  text_representation: {extension: .md, format_name: myst}
kernelspec: {display_name: Python 3, language: python, name: python3}
---
# Chapter

```{code-cell} ipython3
:tags: [hide-input]
print(1 + 1)
```

```{code-cell} ipython3
:tags: [hide-cell]
print(2 + 2)
```
"""


@pytest.mark.slow
def test_the_chinese_build_translates_part_titles_and_fold_prompts(tmp_path):
    """A two-page book built with build_zh's config and the book's sphinx_i18n extension: the part title comes from
    the root page's catalog (it stayed English: sphinx-external-toc inserts the toctree after the Locale transform)
    and myst-nb's "Show code cell source" / "content" prompts read in Chinese. (About 20 s: one kernel.)"""
    import yaml

    (tmp_path / "intro.md").write_text("# Intro\n\nHello.\n", encoding="utf-8")
    (tmp_path / "ch.md").write_text(PAGE, encoding="utf-8")
    toc = {
        "format": "jb-book",
        "root": "intro",
        "parts": [{"caption": "Part 0 — Collectives", "chapters": [{"file": "ch"}]}],
    }
    (tmp_path / "_toc.yml").write_text(yaml.safe_dump(toc), encoding="utf-8")
    po = tmp_path / "locale" / "zh_CN" / "LC_MESSAGES" / "intro.po"
    po.parent.mkdir(parents=True)
    po.write_text(
        'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
        'msgid "Part 0 — Collectives"\nmsgstr "第零部分 — 集合通信"\n',
        encoding="utf-8",
    )
    base = {
        "title": "t",
        "only_build_toc_files": True,
        "execute": {"execute_notebooks": "force"},
        "sphinx": {
            "local_extensions": {"sphinx_i18n": str(build_editions.ROOT / "tools" / "site")},
            "recursive_update": True,
            "config": {"locale_dirs": ["locale"], "gettext_compact": False},
        },
    }
    config = build_editions.build_zh.zh_config(base)
    # The reading-path badges' words belong to tools/site/sphinx_reading_path.py, which this two-page book does not
    # load (its pages are not on the reading path); left in, Sphinx warns of an unknown config value and -W fails.
    del config["sphinx"]["config"]["reading_path_words"]
    (tmp_path / "_config.yml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    jupyter_book = str(Path(sys.executable).parent / "jupyter-book")
    subprocess.run([jupyter_book, "build", str(tmp_path), "-q", "-W"], check=True, cwd=tmp_path, timeout=300)
    html = (tmp_path / "_build" / "html" / "ch.html").read_text(encoding="utf-8")
    assert '<span class="caption-text">第零部分 — 集合通信</span>' in html
    assert "Show code cell" not in html and "Part 0" not in html
    for prompt in ("显示代码", "隐藏代码", "显示代码和输出", "隐藏代码和输出"):
        assert f'admonition-title">{prompt}</p>' in html, prompt


def test_the_editions_share_rank_runs_through_the_variable_pylib_reads():
    from pylib.i18n import editions

    assert build_editions.REPLAY_ENV == editions.ENV
