"""Check the catalogs and build both editions, the three side by side: English into _build/html/, Chinese into
_build/html/zh/.

    python tools/i18n/build_editions.py     # I18N_ALLOW_INCOMPLETE=1: a failed catalog check does not stop it

The two builds share nothing while they run (their own output folders, execution caches and kernels; a chapter's
ranks meet through a fresh temporary folder, never a port), and each chapter's kernel keeps about one core busy, so
on a 2-core machine the two side by side take little more than the slower one alone. The catalog check
(`catalog_command`: extract the English messages, then tools/i18n/catalogs.py check) runs beside them. Each job's
output is printed line by line with its name in front (`catalogs| `, `en| `, `zh| `). If one fails, the others are
stopped at once (each whole process group: Sphinx, the kernels and their ranks) and this exits with the failed
job's status after naming it; the Chinese site is copied into _build/html/zh/ only when all succeeded."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import build_zh  # noqa: E402 - tools/i18n is not a package

REPLAY_ENV = "PYLIB_LAUNCH_REPLAY"  # pylib.i18n.editions.ENV, not imported: that loads torch (a test checks both)

ROOT = build_zh.ROOT


def english_command() -> list[str]:
    return [
        str(Path(sys.executable).parent / "jupyter-book"),
        "build",
        str(ROOT),
        "--all",
        "--builder",
        "html",
        "-W",
        "-n",
    ]


def _relay(name: str, stream, out, lock: threading.Lock) -> None:
    for line in iter(stream.readline, b""):
        text = line.decode("utf-8", errors="replace").rstrip("\n")
        with lock:
            out.write(f"{name}| {text}\n")
            out.flush()
    stream.close()


def _stop(process: subprocess.Popen) -> None:
    """Stop a build and everything it started (it leads its own process group)."""
    if process.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_side_by_side(builds: dict[str, tuple[list[str], dict[str, str]]], out=sys.stdout) -> tuple[str | None, int]:
    """Run each build (name -> (command, environment)) at once; return (the first failed build or None, its status).

    A build that fails stops the others; the function returns only when every build has ended."""
    lock = threading.Lock()
    processes: dict[str, subprocess.Popen] = {}
    relays = []
    try:
        for name, (command, env) in builds.items():
            process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
            )
            processes[name] = process
            relay = threading.Thread(target=_relay, args=(name, process.stdout, out, lock), daemon=True)
            relay.start()
            relays.append(relay)
        while True:
            failed = next(((n, p.returncode) for n, p in processes.items() if p.poll() not in (None, 0)), None)
            if failed or all(p.poll() == 0 for p in processes.values()):
                break
            time.sleep(0.5)
    finally:
        # On a failure, or on Ctrl-C here: no build is left running.
        for process in processes.values():
            _stop(process)
        for relay in relays:
            relay.join(timeout=10)
    return failed if failed else (None, 0)


def catalog_command(allow_incomplete: bool) -> list[str]:
    """Extract the English messages and check the catalogs against them (tools/i18n/catalogs.py), as one command;
    with `allow_incomplete` a failed check is reported and not fatal (development only)."""
    catalogs = f"{shlex.quote(sys.executable)} {shlex.quote(str(ROOT / 'tools' / 'i18n' / 'catalogs.py'))}"
    check = f"{catalogs} check"
    if allow_incomplete:
        check += ' || echo "I18N_ALLOW_INCOMPLETE: building with incomplete catalogs" >&2'
    return ["bash", "-c", f"{catalogs} extract && {check}"]


def main() -> int:
    zh_command = build_zh.prepare()
    start = time.monotonic()
    # The catalog check runs beside the two builds, not before them: it needs one core for about 25 s (a gettext
    # build of the sources, then the review), the builds need the book's kernels; a failed check still stops both
    # builds at once. The Chinese build reads the committed .po files, which the check only reads.
    # The two builds share their chapters' rank runs through a fresh folder (pylib.i18n.editions): whichever
    # edition reaches a launch first runs it, the other replays its results, unless the ranks asked for the language.
    shared = ROOT / "_build" / ".launch-replay"
    shutil.rmtree(shared, ignore_errors=True)
    editions = {**os.environ, REPLAY_ENV: str(shared)}
    builds = {
        "catalogs": (catalog_command(bool(os.environ.get("I18N_ALLOW_INCOMPLETE"))), dict(os.environ)),
        "en": (english_command(), editions),
        "zh": (zh_command, {**editions, "PYLIB_LANG": "zh"}),
    }
    try:
        failed, status = run_side_by_side(builds)
    finally:
        build_zh.ZH_CONFIG.unlink(missing_ok=True)
        replayed = len(list(shared.glob("*.replayed"))), len(list(shared.glob("*.lock")))
        unshared = run_twice(shared)
        shutil.rmtree(shared, ignore_errors=True)
    if failed:
        print(f"{failed} failed (status {status}); the other jobs were stopped", file=sys.stderr)
        return status
    build_zh.move_site()
    print(
        f"catalogs checked and both editions built side by side in {time.monotonic() - start:.0f} s; "
        f"{replayed[0]} of {replayed[1]} rank runs were run once for both editions"
    )
    if unshared:
        print("run by each edition (a language-dependent argument or global splits the chain): " + unshared)
    return 0


def run_twice(shared: Path) -> str:
    """The English runs the other edition did not replay, by function, from the store's runs.log
    (`pylib.i18n.editions.slot`): where to look for what makes the editions' chains part."""
    log = shared / "runs.log"
    if not log.is_file():
        return ""
    replayed = {p.stem for p in shared.glob("*.replayed")}
    counts: dict[str, int] = {}
    for line in log.read_text().splitlines():
        lang, _, name, _, key = line.split(" ")
        if lang == "en" and key not in replayed:
            counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{name} x{n}" if n > 1 else name for name, n in sorted(counts.items(), key=lambda x: -x[1]))


if __name__ == "__main__":
    sys.exit(main())
