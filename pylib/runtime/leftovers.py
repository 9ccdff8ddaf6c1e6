"""Temporary folders named after the process that owns them, and a sweep that removes those whose owner is gone.

    workdir = owned_tempdir("pylib-launch")      # /tmp/pylib-launch-<pid>-<start>-<random>
    sweep("pylib-launch")                         # remove every such folder whose owner no longer runs

A folder's owner is a (pid, start time) pair: the start time (in clock ticks since boot, /proc/<pid>/stat) tells a
live owner from a new process that happens to have been given the same pid. A process killed with SIGKILL (or one
whose kernel died) cannot clean up after itself; the next launch or harness run on the machine removes what it left.
The launcher also writes the process groups of its ranks into the folder (`record_groups`); sweeping a folder first
kills any of those groups still alive, so a rank's own child processes do not outlive a caller killed with SIGKILL.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile

_NAME = re.compile(r"^(?P<prefix>[a-z-]+)-(?P<pid>\d+)-(?P<start>\d+)-")


def start_time(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot, or None when no such process runs (or on a
    system without /proc, where owners cannot be told apart and nothing is swept)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the name in (...) may hold spaces
    if fields[0] == "Z":  # a zombie has finished; its parent only has not reaped it yet
        return None
    return int(fields[19])  # field 22 of stat(5), counted from field 3 (the state)


def owned_tempdir(prefix: str) -> str:
    """A fresh folder under the temp dir named `<prefix>-<pid>-<start>-<random>` for this process."""
    pid = os.getpid()
    return tempfile.mkdtemp(prefix=f"{prefix}-{pid}-{start_time(pid) or 0}-")


def owner_alive(name: str) -> bool | None:
    """True/False for a folder name made by owned_tempdir; None for a name that carries no owner."""
    m = _NAME.match(name)
    if m is None:
        return None
    start = start_time(int(m.group("pid")))
    return start is not None and start == int(m.group("start"))


def record_groups(folder: str, pids: list[int]) -> None:
    """Write the ranks' process groups (each rank leads its own) with their start times into `folder`."""
    with open(os.path.join(folder, "groups"), "w") as f:
        f.writelines(f"{pid} {start_time(pid) or 0}\n" for pid in pids)


def _kill_recorded_groups(folder: str) -> None:
    try:
        with open(os.path.join(folder, "groups")) as f:
            rows = [tuple(int(v) for v in line.split()) for line in f if line.strip()]
    except (OSError, ValueError):
        return
    for pid, start in rows:
        now = start_time(pid)
        if now is not None and now != start:
            continue  # the pid now belongs to an unrelated process: its group is not ours
        try:  # leader gone or still ours: a group with this id can only be the one our rank led
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def sweep(prefix: str, tmpdir: str | None = None) -> list[str]:
    """Remove every `<prefix>-<pid>-<start>-*` folder in the temp dir whose owner no longer runs (first killing
    the process groups it records). Returns the folders removed."""
    if not os.path.exists("/proc/self/stat"):
        return []  # no way to tell a live owner from a dead one here: leave everything
    tmpdir = tmpdir or tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(tmpdir) if n.startswith(prefix + "-")]
    except OSError:
        return []
    removed = []
    for name in names:
        m = _NAME.match(name)
        if m is None or m.group("prefix") != prefix or owner_alive(name) is not False:
            continue
        path = os.path.join(tmpdir, name)
        _kill_recorded_groups(path)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
