"""The pieces of the local JupyterHub test (`make hub-test`), outside pytest: the repository served over git's dumb
HTTP from 127.0.0.1, the hub started from hub/jupyterhub_config.py, and the check that nothing it started is left.

Every process the hub starts (the proxy, each user's server, their kernels and the ranks those launch) carries
BOOK_HUB_MARK in its environment, so `processes_marked` finds them all, even ones a dying parent left behind."""

from __future__ import annotations

import functools
import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HUB = ROOT / "hub"
PROXY = HUB / "node_modules" / ".bin" / "configurable-http-proxy"
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


# ------------------------------------------------------------------------------------ the served repository


def snapshot_commit() -> str:
    """A commit of the working tree's tracked files as they are now (uncommitted edits included): what CI clones is
    the checkout, and what a developer tests is what they have. `git stash create` writes it without touching any
    branch, the index or the files; with nothing changed it prints nothing and HEAD is the snapshot."""
    made = subprocess.run(["git", "stash", "create"], cwd=ROOT, check=True, capture_output=True, text=True)
    return made.stdout.strip() or _git("rev-parse", "HEAD")


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def make_served_repository(where: Path, name: str, branch: str) -> Path:
    """A bare repository `where/name` whose `branch` is one parentless commit holding the snapshot's tree (so the
    hub clones one commit, not the project's history), prepared for git's dumb HTTP (update-server-info)."""
    bare = where / name
    _git("init", "--bare", "--quiet", str(bare))
    tree = _git("rev-parse", f"{snapshot_commit()}^{{tree}}")
    commit = _git(
        "-c", "user.name=hub-test", "-c", "user.email=hub-test@localhost", "commit-tree", tree, "-m", "hub-test"
    )
    _git("push", "--quiet", str(bare), f"{commit}:refs/heads/{branch}")
    _git("symbolic-ref", "HEAD", f"refs/heads/{branch}", cwd=bare)
    _git("update-server-info", cwd=bare)
    return bare


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


class StaticServer:
    """A folder served read-only over HTTP on 127.0.0.1 by a thread (git's dumb HTTP is plain files)."""

    def __init__(self, folder: Path):
        handler = functools.partial(_QuietHandler, directory=str(folder))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="git-dumb-http", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


# ------------------------------------------------------------------------------------------------- the hub


class LocalHub:
    """jupyterhub -f hub/jupyterhub_config.py on free ports of 127.0.0.1, state under `state`, output in `log`."""

    def __init__(self, state: Path):
        self.state = state
        self.mark = uuid.uuid4().hex
        self.ports = {"BOOK_HUB_PORT": free_port(), "BOOK_HUB_API_PORT": free_port(), "BOOK_HUB_INTERNAL_PORT": 0}
        self.ports["BOOK_HUB_INTERNAL_PORT"] = free_port()
        self.url = f"http://127.0.0.1:{self.ports['BOOK_HUB_PORT']}"
        self.log = state / "jupyterhub.log"
        self.proc: subprocess.Popen | None = None
        self.seen_running: dict[int, str] = {}  # the marked processes just before stop(), for the caller to check

    def start(self) -> None:
        if not PROXY.exists():
            raise RuntimeError(f"{PROXY} is missing: `make hub-test` installs it (npm ci --prefix hub)")
        env = dict(os.environ, BOOK_HUB_STATE=str(self.state), BOOK_HUB_PROXY=str(PROXY), BOOK_HUB_MARK=self.mark)
        env.update({k: str(v) for k, v in self.ports.items()})
        # The hub runs with this Python's folder first on PATH: its user servers and kernels use the same environment.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        jupyterhub = Path(sys.executable).with_name("jupyterhub")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [str(jupyterhub), "-f", str(HUB / "jupyterhub_config.py")],
                cwd=self.state,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyterhub exited with {self.proc.returncode} while starting:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/hub/api/", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"jupyterhub did not answer on {self.url} within {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> list[str]:
        """Stop the hub (it stops the user servers and the proxy itself), then end anything marked that is still
        there. Returns what had to be ended by force or is still listening: empty when the hub cleaned up."""
        left: list[str] = []
        self.seen_running = processes_marked(self.mark)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                left.append(f"jupyterhub (pid {self.proc.pid}) ignored SIGTERM for {STOP_TIMEOUT_S} s")
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        deadline = time.monotonic() + 10
        while processes_marked(self.mark) and time.monotonic() < deadline:
            time.sleep(0.2)  # user servers and kernels may take a moment after the hub said they stopped
        for pid, command in processes_marked(self.mark).items():
            left.append(f"pid {pid} still running after the hub stopped: {command}")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for name, port in self.ports.items():
            if port_is_open(port):
                left.append(f"port {port} ({name}) still listening after the hub stopped")
        return left


def processes_marked(mark: str) -> dict[int, str]:
    """Every live process whose environment holds BOOK_HUB_MARK=<mark>: {pid: command line}."""
    needle = f"BOOK_HUB_MARK={mark}".encode()
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # a zombie has ended; its parent has not collected it yet
            found[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found
