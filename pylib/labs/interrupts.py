"""SIGINT and SIGTERM from the first moment of `python -m pylib.labs`: noted, then acted on where the harness can
write its report.

Python turns SIGINT into KeyboardInterrupt wherever the interpreter happens to be; in the first second of a lab
run that is an import or the argument parsing, and the run would end with a traceback and no report. So
`pylib.labs` (when started with `python -m`) calls `note()` before it imports anything else: from then on the two
signals are only recorded. The harness checks `pending()` when it enters `runner.interrupt_on_sigterm` (from there
on a signal raises `Interrupted`, the running lab is recorded and the report written) and once more before it
exits, and answers 128 + the signal's number (130 for SIGINT). A second SIGINT while only noting raises
KeyboardInterrupt as usual, so Ctrl-C twice always ends a program that never looks. Standard library only: this
module is imported before anything heavy.
"""

from __future__ import annotations

import signal

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_pending: list[int] = []


def _note(signum, frame) -> None:
    if signum == signal.SIGINT and signal.SIGINT in _pending:
        raise KeyboardInterrupt
    _pending.append(signum)


def note() -> None:
    """From now on, SIGINT and SIGTERM are recorded, not raised (main thread only, as signal handlers are)."""
    for sig in _SIGNALS:
        signal.signal(sig, _note)


def stop_noting() -> None:
    """Back to Python's defaults (KeyboardInterrupt on SIGINT, termination on SIGTERM), for the commands that do
    not write a report."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def pending() -> int | None:
    """The first signal noted and not yet acted on, or None."""
    return _pending[0] if _pending else None


def clear() -> None:
    _pending.clear()
