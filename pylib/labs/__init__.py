"""The labs and their harness: run lab notebooks headlessly with papermill and write a graded report.

    python -m pylib.labs run --all               # every lab, solved; exit 1 naming lab, cell and rank on failure
    python -m pylib.labs run 00 --learner        # the learner version (its checks fail until the exercises are done)

In a lab notebook (this package imports only the checks, so a rank that unpickles ExerciseNotDone stays light):

    from pylib.labs.checks import ExerciseNotDone, begin, check, step, summary

The rest lives in submodules: `pylib.labs.files` (find labs), `pylib.labs.notebook` (the lab format: lint, learner
version), `pylib.labs.i18n` (the labs' Chinese catalogs), `pylib.labs.runner` (`run_lab`, `run_labs` through
papermill), `pylib.labs.report` (the report's shape, the terminal table, the HTML page), `pylib.labs.cli` (the
command line). labs/README.md documents the format.
"""

import sys

if sys.argv[:1] == ["-m"]:  # `python -m pylib.labs ...` is starting: an interrupt from here on is noted, and the
    from . import interrupts  # harness answers it with a report and exit 130 (see pylib.labs.interrupts)

    interrupts.note()

from .checks import ChecksFailed, ExerciseNotDone, begin, check, step, summary

__all__ = ["ChecksFailed", "ExerciseNotDone", "begin", "check", "step", "summary"]
