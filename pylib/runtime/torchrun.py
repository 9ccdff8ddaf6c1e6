"""Run a pylib worker function under torchrun (multi-node, or one process per GPU without the notebook launcher).

    torchrun --nproc-per-node 8 -m pylib.runtime.torchrun mypackage.module:function [--backend nccl] [--timeout 600]

torchrun starts the processes and sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; this entry point
initialises the process group from them (NCCL with one GPU per local rank when CUDA is there, gloo otherwise),
calls `function()` -- the same function you would pass to `pylib.runtime.launch` -- and prints each rank's result
as one line `[rank r] result: ...`. Nothing else about the function changes between the two launchers.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import sys

import torch
import torch.distributed as dist


def resolve(target: str):
    """ "package.module:function" -> the function."""
    module_name, sep, attr = target.partition(":")
    if not sep or not attr:
        raise ValueError(f"expected 'module:function', got {target!r}")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def initialise(backend: str = "auto", timeout: float = 600.0) -> str:
    """Initialise torch.distributed from torchrun's environment variables; returns the backend used."""
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise RuntimeError(f"{var} is not set: start this module with torchrun")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    kwargs = dict(backend=backend, timeout=datetime.timedelta(seconds=timeout))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        kwargs["device_id"] = torch.device("cuda", local_rank)
    else:
        torch.set_num_threads(1)
    dist.init_process_group(**kwargs)
    return backend


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="module:function to run on every rank")
    parser.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    parser.add_argument("--timeout", type=float, default=600.0, help="process-group timeout in seconds")
    args = parser.parse_args(argv)
    fn = resolve(args.target)
    initialise(args.backend, args.timeout)
    try:
        result = fn()
        # one write per line: lines from ranks sharing a pipe then never interleave
        sys.stdout.write(f"[rank {dist.get_rank()}] result: {result!r}\n")
        sys.stdout.flush()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
