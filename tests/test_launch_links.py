"""The labs page's launch links and downloads (tools/site/launch_links.py): every lab in labs/ is on the page with
a launch placeholder and a download of its learner version; the placeholders become the hub link `launch_url`
makes, or a pointer to running the lab locally; the downloads are the harness's learner versions."""

import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "site"))
import launch_links  # noqa: E402 - tools/site is not a package; the site's Sphinx extension imports it the same way

from pylib.labs.files import find_labs  # noqa: E402
from pylib.labs.notebook import tags  # noqa: E402

PAGE = ROOT / "book" / "labs" / "index.md"
HUB = launch_links.LaunchSettings("https://hub.invalid", "https://git.invalid/course/book.git", "main")
NO_HUB = launch_links.LaunchSettings("", "", "main")


def test_every_lab_is_on_the_labs_page_with_a_launch_and_a_learner_download():
    text = PAGE.read_text()
    launches = launch_links.LAB_PLACEHOLDER.findall(text)
    downloads = re.findall(r"\{download\}`[^`<]*<\.learner/([\w.-]+\.ipynb)>`", text)
    labs = [lab.path.name for lab in find_labs(ROOT / "labs")]
    assert len(labs) >= 11
    assert launches == [f"labs/{name}" for name in labs], launches
    assert downloads == labs, downloads
    assert f"({launch_links.RUN_LAB_LOCALLY})=" in text  # where the no-hub pointer leads


def test_with_a_hub_each_placeholder_becomes_the_hubs_link_for_that_lab():
    body = '<p>Open: <span class="pb-lab-launch" data-lab="labs/00_collectives.ipynb"></span></p>'
    filled = launch_links.fill_lab_launch_links(body, HUB)
    url = launch_links.launch_url(HUB, "labs/00_collectives.ipynb")
    assert "urlpath=lab/tree/book.git/labs/00_collectives.ipynb" in url
    assert f'href="{url.replace("&", "&amp;")}"' in filled and "data-lab" not in filled


def test_with_no_hub_each_placeholder_points_to_running_the_lab_locally():
    body = '<span class="pb-lab-launch" data-lab="labs/01_tensor_parallel.ipynb"></span>'
    filled = launch_links.fill_lab_launch_links(body, NO_HUB)
    assert "/hub/" not in filled and f'href="#{launch_links.RUN_LAB_LOCALLY}"' in filled and "data-lab" not in filled


def test_learner_labs_are_the_harness_learner_versions(tmp_path):
    (tmp_path / "labs").mkdir()
    source = ROOT / "labs" / "00_collectives.ipynb"
    (tmp_path / "labs" / source.name).write_bytes(source.read_bytes())
    (path,) = launch_links.write_learner_labs(tmp_path)
    assert path == tmp_path / launch_links.LEARNER_DIR / source.name
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata["pylib_lab"] == {"version": "learner"}
    assert not [c for c in nb.cells if "solution" in tags(c)]
    assert any("solution = False" in c.source for c in nb.cells if "parameters" in tags(c))
    before = path.stat().st_mtime_ns
    launch_links.write_learner_labs(tmp_path)  # unchanged: not rewritten
    assert path.stat().st_mtime_ns == before


@pytest.mark.parametrize("settings", [HUB, NO_HUB], ids=["hub", "no hub"])
def test_a_page_without_labs_is_left_as_it_is(settings):
    body = "<p>nothing to launch</p>"
    assert launch_links.fill_lab_launch_links(body, settings) == body
