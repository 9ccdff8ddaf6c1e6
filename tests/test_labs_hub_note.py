"""The labs page says once, in its own note, how a JupyterHub is connected (in both editions); each lab's link says
only where it goes, in the edition's words (tools/site/launch_links.py), instead of repeating the note eleven
times."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "site"))
import launch_links  # noqa: E402 - tools/site is not a package; the site's Sphinx extension imports it the same way

from pylib.i18n import pofile  # noqa: E402

PAGE = ROOT / "book" / "labs"
CATALOG = ROOT / "book" / "locale" / "zh_CN" / "LC_MESSAGES" / "book" / "labs"
NOTE = "Connect a JupyterHub"
HUB = launch_links.LaunchSettings("https://hub.invalid", "https://git.invalid/course/book.git", "main")
NO_HUB = launch_links.LaunchSettings("", "", "main")
LAB = '<span class="pb-lab-launch" data-lab="labs/00_collectives.ipynb"></span>'


def test_every_labs_page_has_one_hub_note_translated():
    pages = [p for p in sorted(PAGE.glob("*.md")) if "pb-lab-launch" in p.read_text()]  # those with lab links
    assert pages
    for page in pages:
        assert page.read_text().count(f":::{{admonition}} {NOTE}") == 1, page
        entries = {m.id: m for m in pofile.entries(pofile.read(CATALOG / f"{page.stem}.po"))}
        title = entries[NOTE]
        body = next(m for k, m in entries.items() if k.startswith("Each lab's **Open** link"))
        assert title.string and body.string and not title.fuzzy and not body.fuzzy, page


def test_each_labs_link_says_where_it_goes_in_the_editions_words_and_no_more():
    english = launch_links.fill_lab_launch_links(LAB, NO_HUB)
    chinese = launch_links.fill_lab_launch_links(LAB, NO_HUB, "zh_CN")
    assert "JupyterHub" not in english and "run it locally" in english  # the note says it once, not every lab
    assert f'href="#{launch_links.RUN_LAB_LOCALLY}"' in chinese and "在本地运行" in chinese
    assert "在 JupyterHub 上打开" in launch_links.fill_lab_launch_links(LAB, HUB, "zh_CN")
    assert "open it on JupyterHub" in launch_links.fill_lab_launch_links(LAB, HUB, None)
