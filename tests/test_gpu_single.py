"""bench/gpu_single.py, the one-GPU check, run here with --cpu: every row (launch, fused kernel, ring / zig-zag /
Ulysses on thread ranks, the merge, the timing) on the CPU in float64, through the same code the GPU run takes."""

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_single.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_single", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_single"] = module  # its dataclass looks its module up while being defined
    spec.loader.exec_module(module)
    return module


def test_gpu_single_on_the_cpu_passes_every_row(capsys):
    # In this process, as the wrong-merge test below runs it: a subprocess only added a second torch import.
    assert _load().main(["--cpu"]) == 0, capsys.readouterr().out[-3000:]
    out = capsys.readouterr().out
    rows = [line.split()[:2] for line in out.splitlines() if line.startswith(("PASS", "FAIL"))]
    kinds = [kind for _, kind in rows]
    assert kinds == ["launch"] + ["kernel"] * 4 + ["cp"] * 3 + ["merge"], out
    assert all(status == "PASS" for status, _ in rows)
    assert "SDPAKernel('cpu')" in out  # the fused kernel class itself ran, through torch's CPU op
    for n in (2, 4, 8):
        assert f"ring zigzag cp={n} (all ranks, one device)" in out
    assert "9 of 9 checks passed" in out


def test_a_wrong_ring_merge_fails_the_cp_and_merge_rows(monkeypatch, capsys):
    gpu_single = _load()
    import pylib.cp.ring as ring

    real = ring.merge_block
    monkeypatch.setattr(ring, "merge_block", lambda out, lse, bo, bl: real(out, lse, bo * 1.001, bl))
    assert gpu_single.main(["--cpu"]) == 1
    out = capsys.readouterr().out
    failed = [line.split()[1] for line in out.splitlines() if line.startswith("FAIL")]
    assert failed == ["cp", "cp", "merge"], out  # Ulysses does not merge; the kernel rows do not use the ring


def test_without_a_gpu_the_gpu_run_refuses_and_says_how_to_run_on_the_cpu(capsys):
    gpu_single = _load()
    if gpu_single.torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert gpu_single.main([]) == 2
    assert "use --cpu" in capsys.readouterr().out
