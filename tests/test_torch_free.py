"""The configs, the presets, the planner and the calibration run where torch and numpy cannot be imported: a
`ModelConfig` is plain data (`pylib.plan.config`), so the torch-free layers can be used on a machine without torch.

The checks run in a subprocess whose `import torch` and `import numpy` fail (`sys.modules[name] = None`), so any
torch or numpy import on the way -- in the config, a preset, the planner or the calibration -- fails the test."""

import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pylib.analysis import calibration as C
from pylib.analysis import planner as P
from pylib.plan import presets
from pylib.plan.config import ModelConfig
from pylib.plan.options import DTYPE_BYTES

ROOT = Path(__file__).resolve().parents[1]
CALIBRATED = (0, 9)  # a Megatron-LM GPT row and a Llama 3 405B row (the model from `presets.llama3_405b`)

SCRIPT = """
import inspect, json, sys
sys.modules["torch"] = None  # `import torch` now raises ImportError
sys.modules["numpy"] = None

from pylib.analysis import calibration as C
from pylib.analysis import planner as P
from pylib.plan import presets
from pylib.plan.config import SEED_A, TINY, ModelConfig
from pylib.viz.planner import EXPLORER_SEARCH  # the planner explorer's knobs: one micro-batch size, no interleaving

out = {"presets": {}, "calibration": {}, "runs": []}
named = {"SEED_A": SEED_A, "TINY": TINY}
for name, fn in inspect.getmembers(presets, inspect.isfunction):
    if fn.__module__ == presets.__name__ and all(
        p.default is not p.empty for p in inspect.signature(fn).parameters.values()
    ):
        named[name] = fn()
for name, cfg in named.items():
    assert isinstance(cfg, ModelConfig), name
    sixteen = cfg.dtype in ("bfloat16", "float16")
    world, batch, seq = (8, 64, 4096) if sixteen else (4, 8, 16)
    work = P.Workload(batch, seq, precision="mixed" if sixteen else "uniform")
    best = P.rank_plans(cfg, work, P.Cluster(world), top=1, space=EXPLORER_SEARCH)
    out["presets"][name] = dict(
        repr=repr(cfg), dtype=cfg.dtype, plans=len(best), plan=best[0].plan.describe(), fits=best[0].fits,
        step_time=best[0].step_time, tflops=best[0].tflops_per_gpu, memory=best[0].peak_memory,
    )
for run in C.RUNS + C.LAYOUTS:
    flops = C.megatron_flops(run.cfg, 1, run.seq)
    out["runs"].append(dict(name=run.name, gpus=run.gpus, cfg=repr(run.cfg), flops=flops))
for i in json.loads(sys.argv[1]):
    e = C.evaluate(C.RUNS[i])
    out["calibration"][i] = dict(
        mesh=e.plan.plan.par == e.run.par, fits=e.plan.fits, tflops=e.predicted_tflops, error=e.error
    )
out["modules"] = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy") and sys.modules[m])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def without_torch() -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", SCRIPT, json.dumps(CALIBRATED)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _preset_names() -> set[str]:
    return {
        name
        for name, fn in inspect.getmembers(presets, inspect.isfunction)
        if fn.__module__ == presets.__name__
        and all(p.default is not p.empty for p in inspect.signature(fn).parameters.values())
    }


@pytest.mark.slow
def test_every_preset_is_built_without_torch_and_equals_the_one_built_here(without_torch):
    built = without_torch["presets"]
    assert set(built) == _preset_names() | {"SEED_A", "TINY"} and set(presets.PRESETS) <= set(built)
    for name in _preset_names():
        assert built[name]["repr"] == repr(getattr(presets, name)()), name
        assert built[name]["dtype"] in DTYPE_BYTES
    assert without_torch["modules"] == []


def test_the_planner_ranks_plans_for_every_preset_without_torch(without_torch):
    for name, got in without_torch["presets"].items():
        assert got["plans"] == 1 and got["plan"], name
        assert got["step_time"] > 0 and got["memory"] > 0, (name, got)
        assert 0 < got["tflops"] < P.Cluster(1).peak_flops / 1e12, (name, got)  # below the GPU's peak
    # the small models fit a few GPUs; so does Llama-2-7B on 8 (ZeRO-1 over 8 data-parallel ranks)
    small = [n for n, got in without_torch["presets"].items() if got["dtype"] in ("float32", "float64")]
    assert small and all(without_torch["presets"][n]["fits"] for n in small)
    assert without_torch["presets"]["llama2_7b"]["fits"]


@pytest.mark.slow
def test_the_calibration_runs_without_torch_and_gives_the_same_numbers(without_torch):
    runs = without_torch["runs"]
    assert [r["name"] for r in runs] == [r.name for r in C.RUNS + C.LAYOUTS]
    assert all(r["cfg"] == repr(run.cfg) and r["flops"] > 0 for r, run in zip(runs, C.RUNS + C.LAYOUTS))
    assert all(isinstance(run.cfg, ModelConfig) for run in C.RUNS + C.LAYOUTS)
    assert C.RUNS[9].cfg == presets.llama3_405b() and C.LAYOUTS[0].cfg == presets.llama3_405b()
    for i in CALIBRATED:
        got, here = without_torch["calibration"][str(i)], C.evaluate(C.RUNS[i])
        assert got["mesh"] and got["fits"] and abs(got["error"]) <= 0.20, (i, got)
        assert got["tflops"] == here.predicted_tflops  # the same arithmetic, torch present or not


def test_a_torch_import_added_to_the_config_fails_the_set_up(tmp_path):
    """The guard itself: a copy of pylib whose config imports torch cannot even give the presets here."""
    shutil.copytree(ROOT / "pylib", tmp_path / "pylib", ignore=shutil.ignore_patterns("__pycache__"))
    config = tmp_path / "pylib" / "plan" / "config.py"
    future = "from __future__ import annotations\n"
    config.write_text(config.read_text().replace(future, future + "import torch\n", 1))
    code = "import sys; sys.modules['torch'] = None; from pylib.plan import presets"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "import torch" in done.stderr, done.stderr[-2000:]
