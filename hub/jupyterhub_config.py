"""A JupyterHub on 127.0.0.1 for trying the book's launch links on one machine (`make hub-test` starts it).

Not a deployment: anyone may log in with any name (DummyAuthenticator) and every user's server runs as the hub's own
Unix user (SimpleLocalProcessSpawner), with its home in a scratch folder. For a real hub see hub/README.md.

    jupyterhub -f hub/jupyterhub_config.py          # then open http://127.0.0.1:8000

Everything it needs is in the environment that runs it: hub/requirements.txt (the user environment, which includes
jupyterhub), pylib, hub/overrides.json in <prefix>/share/jupyter/lab/settings/overrides.d/, and configurable-http-proxy
(`make hub-test` installs them all into .venv-hub). Set by the environment (all optional):

- BOOK_HUB_PORT: the port the proxy serves on (default 8000); BOOK_HUB_API_PORT, BOOK_HUB_INTERNAL_PORT: the
  proxy's API and the hub's own port (default 8001, 8081); all on 127.0.0.1 only.
- BOOK_HUB_STATE: the folder for the hub's database, cookie secret and users' homes (default ./.hub-state).
- BOOK_HUB_PROXY: the configurable-http-proxy command (default: the one on PATH).
- BOOK_HUB_PASSWORD: a shared password for every user name (default: none asked).
- BOOK_HUB_MARK: copied into every user server's environment, so a caller can find every process the hub started.
"""

import os
import sys
from pathlib import Path

c = get_config()  # noqa: F821 - jupyterhub passes get_config to its config file

state = Path(os.environ.get("BOOK_HUB_STATE", ".hub-state")).resolve()
(state / "home").mkdir(parents=True, exist_ok=True)

c.JupyterHub.bind_url = f"http://127.0.0.1:{os.environ.get('BOOK_HUB_PORT', '8000')}"
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{os.environ.get('BOOK_HUB_INTERNAL_PORT', '8081')}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ.get('BOOK_HUB_API_PORT', '8001')}"
if os.environ.get("BOOK_HUB_PROXY"):
    c.ConfigurableHTTPProxy.command = [os.environ["BOOK_HUB_PROXY"]]
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(state / "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True  # stopping the hub stops every user's server (and so their kernels)
c.JupyterHub.cleanup_proxy = True

c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
if os.environ.get("BOOK_HUB_PASSWORD"):
    c.DummyAuthenticator.password = os.environ["BOOK_HUB_PASSWORD"]

c.JupyterHub.spawner_class = "simple"  # jupyterhub.spawner.SimpleLocalProcessSpawner
c.SimpleLocalProcessSpawner.home_dir_template = str(state / "home" / "{username}")
# The user's server is this Python's jupyterhub-singleuser, so it sees the same environment (and pylib).
c.Spawner.cmd = [str(Path(sys.executable).with_name("jupyterhub-singleuser"))]
c.Spawner.ip = "127.0.0.1"
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 60
c.Spawner.http_timeout = 60
c.Spawner.environment = {
    # nbgitpuller clones with --depth 1 by default, which git's dumb HTTP (how make hub-test serves the repository)
    # cannot do; 0 is a full clone. A hub that clones from GitHub or GitLab does not need this.
    "NBGITPULLER_DEPTH": "0",
    "BOOK_HUB_MARK": os.environ.get("BOOK_HUB_MARK", ""),
    "PATH": os.environ.get("PATH", ""),
}
c.Spawner.args = [
    # CI runs as root, and every user's server runs as the hub's user here.
    "--ServerApp.allow_root=True",
    # The page exposes `window.jupyterapp`, which the browser test reads the notebook's outputs from.
    "--LabApp.expose_app_in_browser=True",
]
