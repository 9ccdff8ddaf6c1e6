"""Catch, on a CPU, the tensors that would land on the wrong device on a GPU node.

Under NCCL every tensor a collective touches must be on the rank's GPU, and every tensor an op mixes with the
rank's data must be on the same GPU. The classic bug is a tensor made without `device=` (`torch.zeros(n)`,
`torch.arange(s)`, `torch.tensor([...])`): on a laptop it is on the CPU like everything else and nothing fails;
on a GPU node it is on the CPU while the data is on `cuda:r`, and the op or the collective fails.

`stray_tensors_to_meta()` makes the same mistake fail on a CPU. While it is active, a factory call *made from
pylib's own code* that names no device creates its tensor on the `meta` device -- a device with no data -- instead
of the default one. The rank's data stays on the CPU, so the stray tensor is now on a different device from the
data, exactly as on a GPU node: mixing the two raises ("Tensor on device meta is not on the expected device cpu"),
a collective on it fails, reading its value fails. `sites` lists where each stray tensor was created.

    with stray_tensors_to_meta() as strays:
        run_the_mode()          # raises if pylib created a tensor without a device and used it with the data
    strays.sites                # ["pylib/pp/executor.py:123", ...], for the error message

Only calls whose immediate caller is a file under `pylib/` are redirected: the caller's own data generation (a
script making inputs on the CPU on purpose) and torch's internals (a module's `__init__`, an optimizer's step
counter) are left alone. It is a test aid for CPU runs (`bench/gpu_check.py --cpu`, the tests); it changes nothing
outside the `with` block and nothing on the thread it is not entered on.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

PYLIB = str(Path(__file__).resolve().parents[1])  # .../pylib

# Factory functions that create a tensor on the default device when no `device=` is given. (`*_like` functions
# and `as_tensor` of a tensor follow their argument's device, so they are not here.)
FACTORIES = frozenset(
    {
        torch.empty,
        torch.empty_strided,
        torch.zeros,
        torch.ones,
        torch.full,
        torch.arange,
        torch.range,
        torch.linspace,
        torch.logspace,
        torch.eye,
        torch.tensor,
        torch.scalar_tensor,
        torch.rand,
        torch.randn,
        torch.randint,
        torch.randperm,
    }
)


class StrayTensors(TorchFunctionMode):
    """The mode behind `stray_tensors_to_meta`: `sites` are "file:line" of every redirected factory call."""

    def __init__(self, root: str = PYLIB, device: str = "meta"):
        super().__init__()
        self.root, self.device = root, device
        self.sites: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            caller = sys._getframe(1)  # the Python frame that called the (C) factory function
            path = caller.f_code.co_filename
            if path.startswith(self.root):
                kwargs = {**kwargs, "device": self.device}
                site = f"{Path(self.root).name}/{Path(path).relative_to(self.root).as_posix()}:{caller.f_lineno}"
                if site not in self.sites:
                    self.sites.append(site)
        return func(*args, **kwargs)


@contextlib.contextmanager
def stray_tensors_to_meta(root: str = PYLIB):
    """Inside the block, tensors that code under `root` (pylib) creates without naming a device go to `meta`.
    Yields the `StrayTensors` mode; its `sites` say where they were created. See the module docstring."""
    mode = StrayTensors(root)
    with mode:
        yield mode
