"""Multi-node: the same worker code under `torchrun --nnodes 2`, two agents meeting through c10d rendezvous.

Both "nodes" are agents on 127.0.0.1 (2 processes each, gloo), started as a real cluster would start them: one
torchrun per node, the same command, the rendezvous endpoint on the first. The workers run one composed training
step (bench/multinode_step.py: TP=2 with SP inside a node, ZeRO-1 data parallelism across the nodes) and each
compares what it holds with the single-device reference; bench/slurm/train_2node.sbatch is the same launch under
Slurm."""

import ast
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(300)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_torchrun_agents_on_localhost_run_a_composed_step_equal_to_the_reference():
    port, run_id = _free_port(), uuid.uuid4().hex[:8]
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO}:{REPO / 'bench'}",
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    agents = []
    for node in range(2):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            run_id,
            "--rdzv-conf",
            f"is_host={'1' if node == 0 else '0'},join_timeout=120",
            "--local-addr",
            "127.0.0.1",
            "--max-restarts",
            "0",
            "-m",
            "pylib.runtime.torchrun",
            "multinode_step:composed_step",
            "--backend",
            "gloo",
            "--timeout",
            "120",
        ]
        agents.append(  # each agent leads its own process group: a failure ends it together with its workers
            subprocess.Popen(
                cmd,
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    outputs = []
    try:
        for agent in agents:
            out, err = agent.communicate(timeout=260)
            outputs.append((agent.returncode, out, err))
    finally:
        for agent in agents:  # never leave an agent (or its workers) behind
            try:
                os.killpg(agent.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # the agent and all its workers have exited
            if agent.poll() is None:
                agent.communicate()
    for code, out, err in outputs:
        assert code == 0, f"agent exited {code}:\n{out[-2000:]}\n{err[-4000:]}"
    results = {}
    for _, out, _ in outputs:
        for rank, text in re.findall(r"\[rank (\d+)\] result: (\{.*\})", out):
            results[int(rank)] = ast.literal_eval(text)
    assert sorted(results) == [0, 1, 2, 3], outputs
    assert {r["node"] for r in results.values()} == {"0", "1"}  # two agents, two ranks each
    assert {r["mesh"] for r in results.values()} == {"tp=2 dp=2"}
    for r in results.values():
        assert r["loss_err"] < 1e-12 and r["param_err"] < 1e-12, r
    every = results[0]["every"]
    assert sorted(set().union(*(r["covered"] for r in results.values()))) == every


def test_the_slurm_example_is_valid_bash_and_launches_the_tested_worker_with_c10d_rendezvous():
    script = REPO / "bench" / "slurm" / "train_2node.sbatch"
    text = script.read_text()
    if shutil.which("bash"):
        check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
    for needed in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "srun",
        "torch.distributed.run",
        "--rdzv-backend c10d",
        '--rdzv-endpoint "$HEAD_NODE:$RDZV_PORT"',
        "-m pylib.runtime.torchrun multinode_step:composed_step",
    ):
        assert needed in text, needed
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import multinode_step
    finally:
        sys.path.remove(str(REPO / "bench"))
    assert callable(multinode_step.composed_step)
    assert multinode_step.mesh_for(8, 4).tp == 4 and multinode_step.mesh_for(8, 4).dp == 2
    with pytest.raises(ValueError, match="world size 6 is not a whole number of nodes of 4 processes"):
        multinode_step.mesh_for(6, 4)
