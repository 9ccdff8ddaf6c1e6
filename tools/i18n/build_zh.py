"""Build the Chinese edition: the same sources and code cells, Sphinx's language zh_CN, pylib's output in Chinese.

    python tools/i18n/build_zh.py [--toc TOC] [--no-move]

It writes a config generated from _config.yml (so nothing is duplicated) to a hidden file in the repository root
(Jupyter Book resolves the config's relative paths from the config's own folder), runs

    PYLIB_LANG=zh jupyter-book build . --config .i18n-zh.yml --path-output _build/zh -W -n

and moves the site to _build/html/zh/ (English stays at _build/html/). The Chinese build has its own execution
cache, _build/zh/_build/.jupyter_cache: outputs depend on the language (pylib prints Chinese under PYLIB_LANG=zh),
and its executed notebooks are in _build/zh/_build/jupyter_execute/ (tests/site compares their numbers with the
English ones). `--toc` builds only the pages of another table of contents (for measuring one chapter).
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
ZH_CONFIG = ROOT / ".i18n-zh.yml"
ZH_OUT = ROOT / "_build" / "zh"
ZH_HTML = ZH_OUT / "_build" / "html"
SITE_ZH = ROOT / "_build" / "html" / "zh"
TITLE_ZH = "并行，算出来"


def zh_config(base: dict) -> dict:
    # A deep copy that keeps every mapping's order: the order of nb_ipywidgets_js is the order of the page's scripts
    # (require.js before the widget manager), and a YAML round trip would sort it.
    config = copy.deepcopy(base)
    config["title"] = TITLE_ZH
    sphinx = config.setdefault("sphinx", {}).setdefault("config", {})
    sphinx["language"] = "zh_CN"
    sphinx["html_search_language"] = "zh"  # Sphinx's Chinese search splits words with jieba when it is installed
    # The theme's own texts come from its zh_CN catalog through `language`; the search box's placeholder is Jupyter
    # Book's default theme option, in English, so it is set here (merged: _config.yml has recursive_update).
    sphinx.setdefault("html_theme_options", {})["search_bar_text"] = "搜索本书……"
    # myst-nb's prompts on a folded code cell ("Show code cell source"), and the word it puts for {type}, which
    # tools/site/sphinx_i18n.py translates; sphinx-togglebutton's hints on a folded admonition. The part titles
    # need nothing here: they are translated in the root page's catalog (book/locale/.../book/intro.po).
    sphinx["nb_code_prompt_show"] = "显示{type}"
    sphinx["nb_code_prompt_hide"] = "隐藏{type}"
    sphinx["book_code_prompt_types"] = {"source": "代码", "output": "输出", "outputs": "输出", "content": "代码和输出"}
    sphinx["togglebutton_hint"] = "点击显示"
    sphinx["togglebutton_hint_hide"] = "点击隐藏"
    # The reading-path badges under each section title ("Core · 12 min", tools/site/sphinx_reading_path.py).
    sphinx["reading_path_words"] = {"core": "核心", "deep": "深入", "minutes": "{n} 分钟"}
    return config


def prepare(toc: str | None = None, lenient: bool = False) -> list[str]:
    """Write the generated config and return the command that builds the Chinese edition with it (run it with
    PYLIB_LANG=zh; remove ZH_CONFIG afterwards)."""
    config = zh_config(yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8")))
    ZH_CONFIG.write_text(yaml.safe_dump(config, allow_unicode=True, sort_keys=False), encoding="utf-8")
    command = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(ROOT), "--config", str(ZH_CONFIG)]
    command += ["--path-output", str(ZH_OUT), "-n", "--builder", "html", "--all"]
    command += [] if lenient else ["-W"]
    if toc:
        command += ["--toc", toc]
    return command


def move_site() -> None:
    """Copy the built Chinese site to _build/html/zh/, replacing an older one."""
    shutil.rmtree(SITE_ZH, ignore_errors=True)
    SITE_ZH.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ZH_HTML, SITE_ZH)
    print(f"Chinese edition in {SITE_ZH.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--toc", help="another table of contents (default: the book's _toc.yml)")
    parser.add_argument("--lenient", action="store_true", help="warnings are not errors (a partial --toc)")
    parser.add_argument("--no-move", action="store_true", help="leave the site in _build/zh/_build/html")
    args = parser.parse_args(argv)
    command = prepare(args.toc, args.lenient)
    try:
        subprocess.run(command, check=True, cwd=ROOT, env={**os.environ, "PYLIB_LANG": "zh"})
    except subprocess.CalledProcessError as error:
        return error.returncode
    finally:
        ZH_CONFIG.unlink(missing_ok=True)
    if not args.no_move:
        move_site()
    return 0


if __name__ == "__main__":
    sys.exit(main())
