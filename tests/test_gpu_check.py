"""bench/gpu_check.py, the one script an instructor runs on a GPU node, run here on gloo CPU ranks (`--cpu`).

CI has no GPU, so the NCCL run itself is not tested here; what is: the script runs every mode end to end on the
same code path (one launch per mode, the same worker functions, `current_device()` for every tensor), compares
with the single-device reference and the formulas, fails when either disagrees, and refuses to run "on GPUs"
where there are none."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_check.py"

pytestmark = pytest.mark.timeout(300)


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_gpu_check_on_cpu_ranks_passes_every_mode_with_bytes_equal_to_the_formulas():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu", "--quick"], capture_output=True, text=True, env=env, timeout=280
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = {line.split()[0]: line for line in run.stdout.splitlines() if line.split()[:1] and " 4  " in line}
    for mode in _load().MODES:
        assert mode in rows, f"no row for {mode}:\n{run.stdout}"
        assert " yes (" in rows[mode] and "FAIL" not in rows[mode], rows[mode]
    assert f"{len(_load().MODES)} of {len(_load().MODES)} checks passed" in run.stdout


def test_gpu_check_fails_a_mode_whose_traced_bytes_disagree_with_its_formula(monkeypatch, capsys):
    gpu_check = _load()
    real = gpu_check.p2p_bytes_per_rank
    monkeypatch.setattr(gpu_check, "p2p_bytes_per_rank", lambda *a: real(*a) + 1)  # inherited by the forked ranks
    assert gpu_check.main(["--cpu", "--quick", "--ranks", "2", "--only", "pp"]) == 1
    out = capsys.readouterr().out
    assert "NO (" in out and "FAILED: ['pp']" in out


def test_gpu_check_refuses_to_run_on_gpus_that_are_not_there_and_names_unknown_modes(capsys):
    gpu_check = _load()
    assert gpu_check.main(["--cpu", "--only", "tp,bogus"]) == 2
    assert "unknown mode(s) ['bogus']" in capsys.readouterr().out
    if gpu_check.torch.cuda.device_count() < 2:
        assert gpu_check.main([]) == 2
        assert "GPU(s) visible" in capsys.readouterr().out
