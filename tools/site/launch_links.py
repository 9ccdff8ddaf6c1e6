"""The launch buttons of the chapter pages: one link per chapter that opens it on a JupyterHub, built here rather
than by sphinx-book-theme, so that the hub and the repository are set in one place (_config.yml's
`launch_buttons: jupyterhub_url:` and `repository: url: / branch:`) and an empty value never leaves a dead link.

- A hub and a repository: each chapter page gets a rocket menu with one "JupyterHub" link,
  <hub>/hub/user-redirect/git-pull?repo=<repository>&branch=<branch>&urlpath=lab/tree/<clone>/<source>. nbgitpuller
  (on the hub) clones or updates the repository into the folder <clone>, named as nbgitpuller names it (the last part
  of the repository URL), and JupyterLab opens <source>, the chapter's file in the repository.
- No hub: no launch button, and the page ends with a note saying how to run the chapter locally.
- A hub without a repository is an error: the hub would have nothing to clone.
- The download button stays either way, with the executed notebook (.ipynb) next to the source.

The labs page (book/labs/index.md) gets the same links for the labs: each `<span class="pb-lab-launch"
data-lab="labs/NN_name.ipynb"></span>` in it becomes a link that opens that lab from the clone on the hub
(`launch_url` with the lab's path), or, with no hub, a pointer to the page's section on running a lab locally. Its
downloads are the learner versions (solution cells removed, `solution = False`): `write_learner_labs` writes them
with the lab harness (`pylib.labs`) into book/labs/.learner/ (ignored by git and by Sphinx's source search) before
the pages are read, and the page offers them with the `{download}` role.

The theme's own JupyterHub link is switched off (it names the clone after the URL without nbgitpuller's rule, and
refuses repositories outside GitHub, GitLab and Bitbucket). `make hub-test` follows the link `launch_url` gives,
with the hub and the repository replaced by local ones.
"""

from __future__ import annotations

import html
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode, urlsplit

from sphinx.errors import ConfigError

# The JupyterLab (or classic notebook) route that opens a file, as sphinx-book-theme names the interfaces.
INTERFACES = {"jupyterlab": "lab/tree", "classic": "tree"}
# The hosts whose icon sphinx-book-theme's repository button knows; for any other it stops the build.
THEME_REPOSITORY_HOSTS = ("github.com", "gitlab.com", "bitbucket.org")


@dataclass(frozen=True)
class LaunchSettings:
    """Where the launch links go: the hub ("" for none), the repository the hub clones and its branch, the chapter
    sources' folder inside the repository, and the interface that opens them."""

    hub_url: str
    repository_url: str
    branch: str
    path_to_book: str = ""
    interface: str = "jupyterlab"

    @classmethod
    def from_theme_options(cls, options: dict) -> LaunchSettings:
        """From html_theme_options as Jupyter Book fills them from _config.yml (launch_buttons, repository_*)."""
        buttons = options.get("launch_buttons") or {}
        settings = cls(
            hub_url=(buttons.get("jupyterhub_url") or "").strip().rstrip("/"),
            repository_url=(options.get("repository_url") or "").strip().rstrip("/"),
            branch=(options.get("repository_branch") or "main").strip(),
            path_to_book=(options.get("path_to_docs") or "").strip("/"),
            interface=buttons.get("notebook_interface") or "jupyterlab",
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        if self.interface not in INTERFACES:
            raise ConfigError(
                f"launch_buttons.notebook_interface is {self.interface!r}; it must be one of {sorted(INTERFACES)}"
            )
        for name, url in (("launch_buttons.jupyterhub_url", self.hub_url), ("repository.url", self.repository_url)):
            if url and (urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc):
                raise ConfigError(f"{name} in _config.yml is {url!r}: it must be an http(s) URL, or empty")
        if self.hub_url and not self.repository_url:
            raise ConfigError(
                f"launch_buttons.jupyterhub_url is {self.hub_url!r} but repository.url is empty in _config.yml: the "
                "launch links would give the hub nothing to clone. Set repository.url, or empty jupyterhub_url."
            )


def clone_folder(repository_url: str) -> str:
    """The folder nbgitpuller clones into when the link names none: the last part of the repository URL."""
    return repository_url.rstrip("/").split("/")[-1]


def launch_url(settings: LaunchSettings, source: str) -> str:
    """The link that opens `source` (the chapter's path inside the repository, e.g. "book/intro.md") on the hub."""
    if not settings.hub_url:
        raise ValueError("no hub configured (launch_buttons.jupyterhub_url is empty): no launch link")
    query = urlencode(
        {
            "repo": settings.repository_url,
            "branch": settings.branch,
            "urlpath": f"{INTERFACES[settings.interface]}/{clone_folder(settings.repository_url)}/{source}",
        },
        safe="/",
    )
    return f"{settings.hub_url}/hub/user-redirect/git-pull?{query}"


def source_in_repository(settings: LaunchSettings, app, pagename: str) -> str:
    """The page's source file as a path inside the repository (book/part1/glossary.md)."""
    relative = Path(app.env.doc2path(pagename)).relative_to(app.srcdir).as_posix()
    return f"{settings.path_to_book}/{relative}" if settings.path_to_book else relative


def _is_notebook_page(app, pagename: str) -> bool:
    return "kernelspec" in app.env.metadata.get(pagename, {})


# ------------------------------------------------------------------------------------------------ labs

ROOT = Path(__file__).resolve().parents[2]
# Under the repository root; the labs page's {download} links point here. A hidden folder: Sphinx's source search
# skips it (_config.yml excludes ".*" and "**/.*"), in a whole-book build and in a one-page build alike, so the
# learner notebooks are offered as files and never read (or executed) as pages.
LEARNER_DIR = "book/labs/.learner"
LAB_PLACEHOLDER = re.compile(r'<span class="pb-lab-launch" data-lab="([^"<>]+)"></span>')
RUN_LAB_LOCALLY = "sec-labs-locally"  # the labs page's section on running a lab without a hub


# The words of a lab's link, per edition (Sphinx's language: None or "en", "zh_CN"). Whether a hub is connected is
# said once, in the labs page's own note (book/labs/index.md, translated by its catalog), not beside every lab.
LAB_LINK_WORDS = {
    "en": {"hub": "open it on JupyterHub", "local": "run it locally"},
    "zh": {"hub": "在 JupyterHub 上打开", "local": "在本地运行"},
}


def lab_launch_html(settings: LaunchSettings, lab: str, language: str | None = None) -> str:
    """What replaces one lab's placeholder: a link opening `lab` (its path in the repository, labs/NN_name.ipynb)
    on the hub, or, with no hub, a link to the page's section on running a lab locally; in the edition's words."""
    words = LAB_LINK_WORDS["zh" if (language or "en").lower().startswith("zh") else "en"]
    if settings.hub_url:
        url = html.escape(launch_url(settings, lab))
        return f'<a class="reference external pb-lab-launch" href="{url}">{words["hub"]}</a>'
    return f'<a class="reference internal pb-lab-launch" href="#{RUN_LAB_LOCALLY}">{words["local"]}</a>'


def fill_lab_launch_links(body: str, settings: LaunchSettings, language: str | None = None) -> str:
    """`body` with every lab placeholder replaced by `lab_launch_html`."""
    return LAB_PLACEHOLDER.sub(lambda m: lab_launch_html(settings, html.unescape(m.group(1)), language), body)


def write_learner_labs(root: Path = ROOT) -> list[Path]:
    """Write the learner version of every lab in root/labs to root/LEARNER_DIR (the harness's own
    `learner_version`: solution cells removed, `solution = False`, outputs stripped); a file whose content is
    unchanged is left as it is. Returns the paths."""
    import nbformat

    from pylib.labs.files import find_labs
    from pylib.labs.notebook import learner_version

    out = root / LEARNER_DIR
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for lab in find_labs(root / "labs"):
        dest = out / f"{lab.name}.ipynb"
        text = nbformat.writes(learner_version(lab.read()))
        if not dest.is_file() or dest.read_text() != text:
            dest.write_text(text)
        written.append(dest)
    return written


# ------------------------------------------------------------------------------------------------ Sphinx hooks


def take_over_launch_buttons(app, config) -> None:
    """config-inited: read the settings once, switch the theme's JupyterHub link off (ours replaces it), and show the
    header's repository button when there is a repository the theme can show (on GitHub, GitLab or Bitbucket; the
    launch links work with any git host)."""
    options = config.html_theme_options
    app.launch_settings = LaunchSettings.from_theme_options(options)
    # html_theme_options as Sphinx compares them between builds no longer hold the hub (taken out below), so this
    # value does: a changed hub or repository rewrites every page instead of leaving the old links in place.
    config.launch_links = repr(app.launch_settings)
    buttons = dict(options.get("launch_buttons") or {})
    buttons["jupyterhub_url"] = ""
    options["launch_buttons"] = buttons
    host = urlsplit(app.launch_settings.repository_url).netloc.lower()
    if not options.get("repository_provider") and not any(host.endswith(known) for known in THEME_REPOSITORY_HOSTS):
        options["repository_url"] = ""
    options["use_repository_button"] = bool(options.get("repository_url"))


def offer_executed_notebook(app, pagename: str, templatename: str, context: dict, doctree) -> None:
    """html-page-context, before the theme's download button (priority 501): put the executed notebook next to the
    page's source in _sources/, as the theme does only when one of its launch providers is set."""
    if not _is_notebook_page(app, pagename) or not context.get("page_source_suffix"):
        return
    executed = Path(app.outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"
    if not executed.is_file():
        return
    target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(executed, target)
    context["ipynb_source"] = f"{pagename}.ipynb"


def add_launch_button(app, pagename: str, templatename: str, context: dict, doctree) -> None:
    """html-page-context, after the theme made its header buttons (priority 501): the rocket menu first among them,
    or, with no hub, a note at the end of the page on running the chapter locally."""
    if not _is_notebook_page(app, pagename):
        return
    settings: LaunchSettings = app.launch_settings
    source = source_in_repository(settings, app, pagename)
    if settings.hub_url:
        link = {
            "type": "link",
            "text": "JupyterHub",
            "tooltip": "Launch on JupyterHub",
            "icon": "_static/images/logo_jupyterhub.svg",
            "url": launch_url(settings, source),
        }
        group = {
            "type": "group",
            "tooltip": "Launch interactive content",
            "icon": "fas fa-rocket",
            "buttons": [link],
            "label": "launch-buttons",
        }
        context.setdefault("header_buttons", []).insert(0, group)
    else:
        context["body"] = context.get("body", "") + run_locally_note(settings, source)


def exclude_learner_labs(app, config) -> None:
    """config-inited: keep the learner notebooks out of Sphinx's sources. _config.yml's ".*" patterns do that in a
    whole-book build, but a one-page build (`jupyter-book build book/labs/index.md`) replaces exclude_patterns by
    the files present when it started, before `write_learner_labs` ran."""
    folder = Path(os.path.relpath(ROOT / LEARNER_DIR, app.srcdir)).as_posix()
    if not folder.startswith(".."):
        config.exclude_patterns = [*config.exclude_patterns, folder, f"{folder}/**"]


def launch_labs(app, pagename: str, templatename: str, context: dict, doctree) -> None:
    """html-page-context: the labs' placeholders become launch links (or pointers to running a lab locally)."""
    body = context.get("body", "")
    if "pb-lab-launch" in body:
        context["body"] = fill_lab_launch_links(body, app.launch_settings, app.config.language)


def run_locally_note(settings: LaunchSettings, source: str) -> str:
    """The HTML of the note that replaces the launch button when no hub is configured."""
    clone = "a clone of this book's repository"
    if settings.repository_url:
        url = html.escape(settings.repository_url)
        clone = f'a clone of <a class="reference external" href="{url}">this book\'s repository</a>'
    return (
        '<div class="admonition note" id="run-this-chapter">\n'
        '<p class="admonition-title">Run this chapter</p>\n'
        "<p>This site is not connected to a JupyterHub. To run the chapter yourself, download its notebook "
        "(<code>.ipynb</code>, in the download menu at the top of the page) and open it in Jupyter with "
        f"<code>pylib</code> installed, or, in {clone}, run "
        "<code>pip install -r hub/requirements.txt &amp;&amp; pip install -e .</code> and then "
        f"<code>jupyter lab {html.escape(source)}</code>, and open the file with <em>Open With &gt; Jupytext "
        "Notebook</em> (or install <code>hub/overrides.json</code> as <code>hub/README.md</code> says, and it opens "
        "as a notebook by itself).</p>\n"
        "</div>\n"
    )


def setup(app) -> None:
    """Called from sphinx_site.setup."""
    app.add_config_value("launch_links", "", "html")
    app.connect("config-inited", take_over_launch_buttons)
    app.connect("html-page-context", offer_executed_notebook, priority=450)
    app.connect("html-page-context", add_launch_button, priority=510)
    app.connect("html-page-context", launch_labs, priority=510)
    app.connect("config-inited", exclude_learner_labs)
    app.connect("builder-inited", lambda app: write_learner_labs())
