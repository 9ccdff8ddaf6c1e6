"""The same worker function runs under torchrun (the launcher for multi-node and GPU clusters)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]


def rank_sum():
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return float(t)


@pytest.mark.slow  # starts a torchrun agent and its workers, each importing torch: 5 s
def test_a_worker_function_runs_under_torchrun():
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "pylib.runtime.torchrun",
        "test_runtime_torchrun:rank_sum",
        "--backend",
        "gloo",
        "--timeout",
        "60",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(re.findall(r"\[rank \d\] result: [0-9.]+", out.stdout)) == [
        "[rank 0] result: 3.0",
        "[rank 1] result: 3.0",
    ]
