"""Run a command while holding an exclusive lock on a file (POSIX flock), so that two `make` targets running at once
do not run it together.

    python tools/locked.py LOCKFILE COMMAND [ARG ...]

CI starts `make hub-setup` beside `make test` (.ci/run): each venv installs this repository editable with pip, which
writes pylib.egg-info/ in the source tree, so the two installs take turns. Exits with the command's status.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    with open(argv[0], "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return subprocess.call(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
