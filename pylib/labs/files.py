"""The lab files: a lab is one `labs/NN_name.ipynb`; which there are, and the ones a command names.

    find_labs(labs_dir=None)            # every lab in the folder (the repository's labs/ by default), in name order
    select_labs(["00", "collectives"])  # by path, full name, number or name without number

A lab in the repository is stored as its learner version plus its solutions (`pylib.labs.solutions`); `Lab.read()`
gives the solved lab, `Lab.read_stored()` the file. The format of what is inside a lab (tags, parameters,
exercises) is `pylib.labs.notebook`'s; its translation
`pylib.labs.i18n`'s. Both find labs here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from pylib.i18n import tr

LAB_NAME = re.compile(r"^(\d\d)_([a-z0-9_]+)\.ipynb$")


@dataclass(frozen=True)
class Lab:
    """One lab notebook on disk."""

    path: Path

    @property
    def name(self) -> str:
        """The file name without .ipynb, e.g. "00_collectives" (the lab's name in reports)."""
        return self.path.stem

    def read(self) -> nbformat.NotebookNode:
        """The solved lab: the stored notebook with its solutions (labs/solutions/<name>.json) put back when that file
        exists (see pylib.labs.solutions), else the stored notebook as it is (a learner's copy, a solved notebook)."""
        from . import solutions

        stored = self.read_stored()
        sol_path = solutions.path_for(self.path)
        if not sol_path.exists():
            return stored
        return solutions.solved(stored, solutions.read(sol_path), str(self.path))

    def read_stored(self) -> nbformat.NotebookNode:
        """The notebook as stored on disk (in labs/: the learner version, without solutions)."""
        return nbformat.read(self.path, as_version=4)


def default_labs_dir() -> Path:
    """The repository's labs/ folder (next to the pylib package this module was imported from)."""
    return Path(__file__).resolve().parents[2] / "labs"


def find_labs(labs_dir: Path | None = None) -> list[Lab]:
    """Every NN_name.ipynb in `labs_dir`, in name order. A folder that does not exist is an error naming it (not
    "no lab matches"): a mistyped --labs-dir is told apart from a lab name that matches nothing."""
    labs_dir = Path(labs_dir) if labs_dir is not None else default_labs_dir()
    if not labs_dir.is_dir():
        what = tr("is not a folder") if labs_dir.exists() else tr("does not exist")
        raise ValueError(tr("the labs folder {folder} {what}", folder=str(labs_dir), what=what))
    return [Lab(p) for p in sorted(labs_dir.glob("*.ipynb")) if LAB_NAME.match(p.name)]


def select_labs(names: list[str], labs_dir: Path | None = None) -> list[Lab]:
    """Labs named by path ("labs/00_collectives.ipynb", any existing .ipynb), full name ("00_collectives"),
    number ("00") or name without number ("collectives"). Raises ValueError naming what matched nothing."""
    known = find_labs(labs_dir)
    chosen: list[Lab] = []
    for name in names:
        path = Path(name)
        if path.suffix == ".ipynb" and path.exists():
            hits = [Lab(path.resolve())]
        else:
            hits = [lab for lab in known if name in (lab.name, lab.name[:2], lab.name[3:])]
        if not hits:
            listing = ", ".join(lab.name for lab in known) or "none"
            raise ValueError(f"no lab matches {name!r} (labs: {listing})")
        if len(hits) > 1:
            raise ValueError(f"{name!r} matches several labs: {', '.join(lab.name for lab in hits)}")
        if hits[0] not in chosen:
            chosen.append(hits[0])
    return chosen


def check_readable(path: Path) -> None:
    """Raise ValueError naming `path` unless it is a JSON file that nbformat reads and validates as a notebook."""
    import json

    try:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the file: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a notebook: not JSON ({exc.msg} at line {exc.lineno})") from None
    except Exception as exc:  # noqa: BLE001 - nbformat raises jsonschema's, its own and KeyError/TypeError
        text = str(exc).strip()
        reason = getattr(exc, "message", None) or (text.splitlines()[0] if text else type(exc).__name__)
        raise ValueError(f"{path}: not a valid notebook: {reason}") from None
