"""Pipeline schedules as data live in `pylib.plan.schedules` (pure, torch-free: the planner and the analysis ask
them too). This module is that same module under its old name, so `from pylib.pp.schedules import build` and
`pylib.pp.schedules.place_communication` keep working."""

import sys

from pylib.plan import schedules as _schedules

sys.modules[__name__] = _schedules
