"""The rank's device, checked without a GPU: what NCCL would refuse is refused here too, with the reason.

Under NCCL every tensor a collective touches must be on the rank's GPU and every module a mode builds must be on
the reference model's device. A CPU has only one real device, so these tests use `meta` as the "other" device:
a collective given a meta tensor must refuse it as NCCL would refuse a CPU tensor; a mode built from a reference
model on meta must hold every parameter and buffer on meta (one left on the CPU is one that would stay on the CPU
on a GPU node); pylib's factory calls without `device=` are caught by `stray_tensors_to_meta`."""

import collections
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from pylib.model import ModelConfig, MoEConfig, Transformer
from pylib.plan import RunOptions
from pylib.runtime import collectives as C
from pylib.runtime import launch
from pylib.runtime.launch import _to_cpu
from pylib.runtime.placement import stray_tensors_to_meta

HERE = str(Path(__file__).resolve().parent)


# ------------------------------------------------------------------------------------------------ collectives


def _refusals():
    """Each raw op given a meta tensor on a 2-rank gloo group: the message it raises (None if it did not)."""
    meta = torch.ones(4, 2, device="meta")
    peer = 1 - dist.get_rank()
    ops = {
        "all_reduce_": lambda: C.all_reduce_(meta),
        "all_gather_tensor": lambda: C.all_gather_tensor(meta),
        "reduce_scatter_tensor": lambda: C.reduce_scatter_tensor(meta),
        "all_to_all_rows": lambda: C.all_to_all_rows(meta, [2, 2], [2, 2]),
        "exchange_counts": lambda: C.exchange_counts(torch.ones(2, dtype=torch.int64, device="meta")),
        "all_reduce_async": lambda: C.all_reduce_async(meta),
        "send": lambda: C.send(meta, peer),
        "batch_isend_irecv": lambda: C.batch_isend_irecv([("send", meta, peer), ("recv", torch.empty(2), peer)]),
    }
    out = {}
    for name, op in ops.items():
        try:
            op()
            out[name] = None
        except ValueError as exc:
            out[name] = str(exc)
    return out


def test_every_collective_refuses_a_tensor_that_is_not_on_the_ranks_device_and_says_which():
    for rank_result in launch(_refusals, 2, backend="gloo"):
        for op, message in rank_result.items():
            assert message is not None, f"{op} accepted a meta tensor on a gloo (CPU) rank"
            assert "on meta" in message and "computes on cpu" in message, (op, message)


def test_a_group_of_one_communicates_nothing_and_checks_nothing():
    def one():
        return C.all_reduce_(torch.ones(2, device="meta")).device.type

    assert launch(one, 1, backend="gloo") == ["meta"]


# ------------------------------------------------------------------------------------------------ stray tensors


def _strays_here():
    """Factory calls from this file under stray_tensors_to_meta(root=this folder)."""
    with stray_tensors_to_meta(root=HERE) as mode:
        stray = torch.zeros(3)
        named = torch.zeros(3, device="cpu")
        like = torch.zeros_like(named)
        inside_torch = nn.Linear(2, 2).weight  # created by torch.nn's own code: not ours, left alone
    return mode, dict(stray=stray, named=named, like=like, inside_torch=inside_torch)


def test_a_factory_call_without_a_device_from_the_watched_code_lands_on_meta_and_is_listed():
    mode, made = _strays_here()
    assert made["stray"].device.type == "meta"
    assert {k: made[k].device.type for k in ("named", "like", "inside_torch")} == dict.fromkeys(
        ("named", "like", "inside_torch"), "cpu"
    )
    assert mode.sites == [f"tests/{Path(__file__).name}:{_strays_here.__code__.co_firstlineno + 3}"]
    assert torch.zeros(3).device.type == "cpu"  # nothing changes after the block


def test_a_stray_tensor_fails_where_it_meets_the_data_as_on_a_gpu_node():
    data = torch.ones(3)
    with stray_tensors_to_meta(root=HERE), pytest.raises(RuntimeError, match="meta"):
        data + torch.arange(3)


# ------------------------------------------------------------------------------------------------ modes on meta

CFG = ModelConfig(vocab_size=16, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=32, position="rope")
MOE_CFG = CFG.with_(moe=MoEConfig(n_experts=4, top_k=2, every=2))


def _on_meta(cfg):
    with torch.device("meta"):
        return Transformer(cfg)


def _devices(*modules) -> dict[str, str]:
    """name -> device type of every parameter and buffer of the modules."""
    out = {}
    for i, m in enumerate(modules):
        for name, t in [*m.named_parameters(), *m.named_buffers()]:
            out[f"{i}.{name}"] = t.device.type
    return out


def _built_from_meta():
    """Inside one gloo rank (every group of one): each mode built from a reference model that lives on meta."""
    from pylib.compose import ParallelTransformer
    from pylib.cp import CPTransformer
    from pylib.ep import ExpertParallelMoE
    from pylib.pp import PipelineParallel
    from pylib.runtime import Mesh, ParallelConfig
    from pylib.tp import TPTransformer

    out = {
        "tp": _devices(TPTransformer.from_full(_on_meta(CFG))),
        "tp+sp": _devices(TPTransformer.from_full(_on_meta(CFG), sequence_parallel=True)),
        "cp": _devices(CPTransformer.from_full(_on_meta(CFG), kind="ring")),
        "ep": _devices(ExpertParallelMoE.from_full(_on_meta(MOE_CFG).layers[1].mlp)),
        "pp": _devices(*PipelineParallel(_on_meta(CFG)).chunks),
    }
    for zero in (0, 1, 2, 3):
        model = ParallelTransformer.from_full(_on_meta(MOE_CFG), Mesh(ParallelConfig()), RunOptions(zero_stage=zero))
        held = _devices(*model.stages, *[w if zero else w.ddp for w in model.wrappers])
        if zero in (1, 2):
            held |= {f"flat{i}": f.device.type for w in model.wrappers for i, f in enumerate(w.flats)}
        out[f"compose zero{zero}"] = held | {"model.device": model.device.type}
    return out


def test_every_mode_builds_its_modules_on_the_reference_models_device():
    """A module made on the default device and never moved (as `nn.LayerNorm(...)` without device=) would show
    up here as "cpu": on a GPU node it would stay on the CPU next to the rank's GPU data."""
    (built,) = launch(_built_from_meta, 1, backend="gloo")
    for mode, devices in built.items():
        assert devices, mode
        elsewhere = {name: d for name, d in devices.items() if d != "meta"}
        assert not elsewhere, f"{mode}: not on the reference's device: {elsewhere}"


# ------------------------------------------------------------------------------------------------ pipeline buffers


def test_pipeline_receive_buffers_go_where_the_rank_computes_when_the_chunks_hold_no_parameters(monkeypatch):
    """Under ZeRO-3 a stage module holds no parameter of its own (the wrapper does): the executor must not fall
    back to the CPU but to the rank's device (its GPU under NCCL; meta stands in for it here)."""
    import pylib.pp.executor as executor

    monkeypatch.setattr(executor, "current_device", lambda: torch.device("meta"))
    bare = nn.Sequential(nn.GELU())  # no parameters, no buffers
    assert executor.pipeline_device([bare]).type == "meta"
    assert executor.pipeline_device([bare], "cpu").type == "cpu"  # the caller's device wins
    assert executor.pipeline_device([nn.Linear(2, 2)]).type == "cpu"  # else the chunks' own


# ------------------------------------------------------------------------------------------------ results


class Pair(NamedTuple):
    a: torch.Tensor
    b: int


def test_results_come_back_detached_on_the_cpu_and_keep_their_container_types():
    x = torch.ones(2, requires_grad=True) * 2
    counts = collections.Counter({("all_reduce", 8): 2})
    by_kind = collections.defaultdict(list, {"k": [x]})
    out = _to_cpu(dict(pair=Pair(x, 3), counts=counts, by_kind=by_kind, items=[x, (x,)]))
    assert isinstance(out["pair"], Pair) and not out["pair"].a.requires_grad and out["pair"].b == 3
    assert type(out["counts"]) is collections.Counter and out["counts"] == counts
    assert type(out["by_kind"]) is collections.defaultdict and out["by_kind"]["missing"] == []
    assert not out["by_kind"]["k"][0].requires_grad and not out["items"][1][0].requires_grad
