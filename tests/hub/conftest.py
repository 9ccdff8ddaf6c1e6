"""Fixtures of the hub test (`make hub-test`): the repository served over git's dumb HTTP on 127.0.0.1, a local
JupyterHub (hub/jupyterhub_config.py) on free ports, and Debian's chromium driven by Playwright. Run with the Python
of .venv-hub, which holds the hub's user environment (hub/requirements.txt, pylib, the settings overrides)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.hub import localhub
from tests.site.conftest import browser  # noqa: F401 -- the site test's browser fixture (Debian's chromium)

# The repository's name as the local server offers it: nbgitpuller clones into a folder of that name.
SERVED_NAME = "parallelism-book"


@pytest.fixture(scope="session")
def book_config() -> dict:
    return yaml.safe_load((localhub.ROOT / "_config.yml").read_text())


@pytest.fixture(scope="session")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hub")


@pytest.fixture(scope="session")
def served_repository(scratch, book_config):
    """The working tree's tracked files as one commit on the configured branch, at http://127.0.0.1:<port>/<name>."""
    branch = (book_config.get("repository") or {}).get("branch") or "main"
    served = scratch / "served"
    served.mkdir()
    localhub.make_served_repository(served, SERVED_NAME, branch)
    server = localhub.StaticServer(served)
    yield f"{server.url}/{SERVED_NAME}"
    server.stop()
    assert not localhub.port_is_open(server.port), f"the git server's port {server.port} is still open"


@pytest.fixture(scope="session")
def hub(scratch):
    """The local hub, started for the session; stopping it must leave no process and no open port behind."""
    state = scratch / "state"
    state.mkdir()
    local = localhub.LocalHub(state)
    print(f"\nthe hub's log: {local.log}")
    local.start()
    yield local
    left = local.stop()
    # The leak check sees what the hub started only if the mark reached it: the hub, its proxy, the user's server.
    commands = list(local.seen_running.values())
    for part in ("jupyterhub_config.py", "configurable-http-proxy", "jupyterhub-singleuser"):
        if not any(part in command for command in commands):
            left.append(f"no process with {part!r} carried BOOK_HUB_MARK while the hub ran: {commands}")
    if left:
        pytest.fail(
            "stopping the hub left things behind (ended by force now), or the check could not see them:\n  "
            + "\n  ".join(left)
        )


@pytest.fixture(scope="session")
def screenshots(scratch) -> Path:
    """Screenshots of each step go to _build/hub-screenshots/ (kept when a test fails, for a person to look at)."""
    folder = localhub.ROOT / "_build" / "hub-screenshots"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder
