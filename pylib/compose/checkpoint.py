"""Checkpoints across meshes: save the composed model and its optimizer on one mesh, load them on another.

    report = save_checkpoint(model, "run/step-4")      # every rank; a folder that must not exist yet
    model2 = ParallelTransformer.from_full(build_model(cfg), other_mesh, other_options, lr=...)
    load_checkpoint(model2, "run/step-4")              # every rank of the other mesh; resharded on the way in
    latest_checkpoint("run")                           # the newest *committed* folder under "run"
    read_checkpoint("run/step-4")                      # one process: every full tensor, {key: tensor}

The idea: a checkpoint is the full tensors of the single-device model, cut into pieces, each piece labelled with
where it sits in its full tensor (an offset and a size per axis). The keys are the reference model's names:
"model.<name>" for a parameter, "optim.<state>.<name>" for an elementwise optimizer state (Adam's exp_avg and
exp_avg_sq), so a key means the same on every mesh. A rank describes what it holds in those terms; what it holds
comes from three facts the composed model already keeps as data:

    which reference piece a local parameter is      `reductions.ParamInfo.ref_index` (TP rows or columns, PP's
                                                    stage by the name, EP's expert, ETP's slice)
    which elements of it this rank keeps            the DP wrapper's flat layouts and shard ranges (ZeRO-1/2:
                                                    its optimizer slice of each bucket; ZeRO-3: its parameter
                                                    shard; DDP: all of it)
    where each optimizer state element belongs      the optimizer steps those same flat slices, elementwise

A ZeRO range [lo, hi) of a flattened [r, c] block is not a box; `flat_range_boxes` cuts it into at most three
boxes (a partial row, whole rows, a partial row), each contiguous in memory, so each is a view, never a copy.

Why not DTensor: a DTensor's local tensor is one regular placement per mesh axis (Shard(dim) or Replicate). A
ZeRO-1/2/3 shard is a range of a flat buffer that concatenates several parameters and cuts rows in the middle,
and PP holds whole parameters on some ranks and none on others: neither is a placement. So each rank writes its
boxes as SHARD write items with explicit (offsets, sizes) through a small planner (`_PieceSavePlanner`), and
`torch.distributed.checkpoint` does the rest: dedups replicas (DP, and TP-replicated LayerNorms: the same box from
several ranks is written once), validates that the boxes tile every tensor without overlap, and on load
(`_PieceLoadPlanner`, `create_read_items_for_chunk_list`) reads, for each box a rank of the new mesh needs, the
overlapping parts of the saved boxes -- resharding, whatever either mesh was.

Crash safety: every rank writes into `<folder>.partial`; after DCP's save has collected every rank's write
results, rank 0 writes `checkpoint.json` (the manifest, last) and renames the folder to `<folder>` in one atomic
`os.rename`. A folder without the `.partial` suffix therefore always holds a complete checkpoint; a save that dies
at any point leaves at most a `.partial` folder, which `latest_checkpoint` ignores and the next save replaces.

Refusals happen on every rank alike, before any tensor moves: every rank checks, the ranks agree (one all-gather of
an error code per rank), and each raises the same named error (`CheckpointNotFound`, `CheckpointIncomplete`,
`CheckpointExists`, `CheckpointMismatch`; `restore` raises `ComposeConfigError` for a mesh that cannot hold the
saved model, before it builds anything).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans
from torch.distributed.checkpoint.default_planner import _validate_global_plan, create_default_global_save_plan
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from pylib.dp.fsdp import FullyShardedDataParallel
from pylib.dp.wrap import DDPTrainer
from pylib.dp.zero import ZeroDataParallel
from pylib.model import build_model
from pylib.plan.config import ModelConfig, MoEConfig
from pylib.plan.options import RunOptions
from pylib.runtime import collectives as C

from .checks import ComposeConfigError, compose_problems
from .model import ParallelTransformer
from .reductions import _held_pieces, held_parameter_pieces

MANIFEST = "checkpoint.json"  # written last, inside the folder, before the rename that commits it
PARTIAL = ".partial"  # the suffix of a folder being written
FORMAT = 1
PHASE = "checkpoint"  # the traced phase of the few small collectives a save or load adds to DCP's own


class CheckpointError(Exception):
    """A checkpoint refused; the subclasses say why."""


class CheckpointNotFound(CheckpointError, FileNotFoundError):
    """No checkpoint folder at the path."""


class CheckpointIncomplete(CheckpointError):
    """A folder without its manifest: a save that did not finish."""


class CheckpointExists(CheckpointError, FileExistsError):
    """A save into a folder that already holds something: checkpoints are never overwritten."""


class CheckpointMismatch(CheckpointError):
    """The checkpoint's model or optimizer differs from the model it is loaded into."""


_CODES = {CheckpointNotFound: 1, CheckpointIncomplete: 2, CheckpointExists: 3, CheckpointMismatch: 4}


# -------------------------------------------------------------------------------------------- pieces as boxes


@dataclass(frozen=True)
class Box:
    """Elements [start, start + numel) of a flattened C-order block form the box offsets + sizes of the block."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    start: int

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)


def flat_range_boxes(shape: tuple[int, ...], lo: int, hi: int) -> list[Box]:
    """Cut elements [lo, hi) of a C-order tensor of `shape` into boxes, each contiguous in memory (so each is a view
    of the flat range), in order: per axis at most a partial head, a run of whole slabs, a partial tail."""
    total = math.prod(shape)
    if not 0 <= lo <= hi <= total:
        raise ValueError(f"range [{lo}, {hi}) is outside a tensor of {total} elements (shape {tuple(shape)})")
    if lo == hi:
        return []
    if not shape:
        return [Box((), (), 0)]
    inner, rest = math.prod(shape[1:]), tuple(shape[1:])
    out: list[Box] = []
    if lo % inner:  # a partial first slab
        end = min(hi, (lo // inner + 1) * inner)
        out += _in_slab(lo // inner, inner, rest, lo, end)
        lo = end
    if hi - lo >= inner:  # whole slabs
        rows = (hi - lo) // inner
        out.append(Box((lo // inner, *(0 for _ in rest)), (rows, *rest), lo))
        lo += rows * inner
    if lo < hi:  # a partial last slab
        out += _in_slab(lo // inner, inner, rest, lo, hi)
    return out


def _in_slab(row: int, inner: int, rest: tuple, lo: int, hi: int) -> list[Box]:
    """The boxes of elements [lo, hi), all inside slab `row` of the first axis (slabs of `inner` elements)."""
    base = row * inner
    return [Box((row, *b.offsets), (1, *b.sizes), base + b.start) for b in flat_range_boxes(rest, lo - base, hi - base)]


@dataclass
class Piece:
    """One box of one full tensor that this rank holds: `key` (the reference name, prefixed), the full tensor's
    shape, where the box starts in it and its sizes, and `tensor`, a view of this rank's storage of that shape."""

    key: str
    full_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    tensor: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()


def _starts(index: tuple) -> tuple[int, ...]:
    """Where a tuple of slices starts in each axis of the reference tensor (an axis not named starts at 0)."""
    return tuple(0 if s.start is None else int(s.start) for s in index)


def _block_pieces(key, full_shape, block_start, block_shape, lo, hi, flat) -> list[Piece]:
    """Elements [lo, hi) of a block of `block_shape` sitting at `block_start` of a full tensor, held flat in `flat`
    (flat[0] is element lo), as boxes of the full tensor."""
    out = []
    starts = tuple(block_start) + (0,) * (len(block_shape) - len(block_start))
    for b in flat_range_boxes(tuple(block_shape), lo, hi):
        view = flat[b.start - lo : b.start - lo + b.numel].view(b.sizes)
        out.append(Piece(key, tuple(full_shape), tuple(s + o for s, o in zip(starts, b.offsets)), b.sizes, view))
    return out


def _optimizer_slots(w) -> list[tuple[torch.Tensor, object, int, int, str | None]]:
    """What the wrapper's optimizer steps, as (tensor, flat layout or None, lo, hi, local name or None): the tensor
    holds elements [lo, hi) of the layout's buffer (ZeRO), or is the whole local parameter `name` (DDP)."""
    if isinstance(w, DDPTrainer):
        return [(p, None, 0, p.numel(), n) for n, p in w.module.named_parameters()]
    if isinstance(w, ZeroDataParallel):
        return [(s, b.layout, *b.shard_range, None) for b, s in zip(w.buckets.buckets, w.shards)]
    if isinstance(w, FullyShardedDataParallel):
        return [(f.shard, f.layout, *f.layout.shard_range(f.group.rank), None) for u in w.units for f in u.flats]
    raise TypeError(f"unknown data-parallel wrapper {type(w).__name__}")


def _state_kinds(model: ParallelTransformer) -> tuple[list[str], dict[str, tuple[str, str]]]:
    """The optimizer's state names: elementwise ones (a tensor shaped like its parameter: Adam's exp_avg,
    exp_avg_sq) and scalars (0-d tensors, the same for every parameter: Adam's step), each scalar as
    (float.hex of its value, dtype name). Raises if the scalars differ between parameters or a state is neither."""
    elementwise: set[str] = set()
    scalars: dict[str, tuple[str, str]] = {}
    for w in model.wrappers:
        for t, *_ in _optimizer_slots(w):
            for k, v in w.optimizer.state.get(t, {}).items():
                if torch.is_tensor(v) and v.shape == t.shape and v.dim() > 0:
                    elementwise.add(k)
                elif torch.is_tensor(v) and v.dim() == 0 or isinstance(v, (int, float)):
                    value = (float(v).hex(), str(v.dtype).removeprefix("torch.") if torch.is_tensor(v) else "python")
                    if scalars.setdefault(k, value) != value:
                        raise CheckpointError(
                            f"optimizer state {k!r} differs between parameters ({scalars[k][0]} and {value[0]}): "
                            "a checkpoint keeps one value per scalar state"
                        )
                else:
                    raise CheckpointError(f"optimizer state {k!r} is neither elementwise nor a scalar: cannot shard it")
    return sorted(elementwise), scalars


def model_pieces(model: ParallelTransformer, elementwise: list[str]) -> list[Piece]:
    """Every box this rank holds: its parameter elements ("model.<reference name>") and the elements of each
    elementwise optimizer state ("optim.<state>.<reference name>"), views of the live storage (so a load writes
    straight into the model and its optimizer)."""
    infos = {i.name: i for i in model.infos}
    out: list[Piece] = []

    def add(prefix: str, held: dict):
        for name, parts in held.items():
            i = infos[name]
            for lo, hi, flat in parts:
                out.extend(
                    _block_pieces(prefix + i.ref_name, i.full_shape, _starts(i.ref_index), i.local_shape, lo, hi, flat)
                )

    for w in model.wrappers:
        add("model.", held_parameter_pieces(w))
        for k in elementwise:
            held: dict = {}
            for t, layout, lo, hi, name in _optimizer_slots(w):
                s = w.optimizer.state[t][k].reshape(-1)
                if layout is None:
                    held[name] = [(0, t.numel(), s)]
                else:
                    _held_pieces(held, layout, lo, hi, s)
            add(f"optim.{k}.", held)
    unique: dict[tuple, Piece] = {}
    for p in out:  # a tied weight is one reference tensor held under two local names: keep one box
        unique.setdefault((p.key, p.offsets), p)
    return list(unique.values())


# -------------------------------------------------------------------------------------------- DCP planners


class _PieceSavePlanner(SavePlanner):
    """Write this rank's boxes as SHARD items; the coordinator dedups replicas and checks the tiling (DCP's
    default global plan). `written` is this rank's final share, after the dedup."""

    def __init__(self, pieces: list[Piece], fault=None):
        self.pieces = {(p.key, p.offsets): p for p in pieces}
        self.written: list[Piece] = []
        self.fault, self.resolved = fault, 0

    def set_up_planner(self, state_dict, storage_meta=None, is_coordinator=False) -> None:
        self.is_coordinator = is_coordinator

    def create_local_plan(self) -> SavePlan:
        items = []
        for p in self.pieces.values():
            chunk = ChunkStorageMetadata(offsets=torch.Size(p.offsets), sizes=torch.Size(p.sizes))
            data = TensorWriteData(chunk, TensorProperties.create_from_tensor(p.tensor), torch.Size(p.full_shape))
            items.append(WriteItem(MetadataIndex(p.key, p.offsets), WriteItemType.SHARD, tensor_data=data))
        return SavePlan(items)

    def create_global_plan(self, all_plans):
        plans, metadata = create_default_global_save_plan(dedup_save_plans(all_plans))
        errors = _validate_global_plan(plans, metadata)
        if errors:
            raise CheckpointError("the ranks' pieces do not tile the full tensors: " + "; ".join(errors[:3]))
        return plans, metadata

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        self.written = [self.pieces[(i.index.fqn, tuple(i.index.offset))] for i in new_plan.items]
        return new_plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor:
        if self.fault is not None:
            rank, hook = self.fault
            hook(rank, self.resolved)
        self.resolved += 1
        p = self.pieces[(write_item.index.fqn, tuple(write_item.index.offset))]
        return p.tensor.detach().clone()  # compact: torch.save of a view would write its whole storage


@dataclass(frozen=True)
class Read:
    """One read of a load: `nbytes` of the saved box of `key` at `saved_offsets`, written by global rank
    `saved_by` (its file), into the box at `offsets` this rank holds."""

    key: str
    offsets: tuple[int, ...]
    saved_offsets: tuple[int, ...]
    saved_by: int
    nbytes: int


class _PieceLoadPlanner(LoadPlanner):
    """For each box this rank holds, read the overlapping parts of the saved boxes, straight into its storage."""

    def __init__(self, pieces: list[Piece]):
        self.pieces = {(p.key, p.offsets): p for p in pieces}
        self.reads: list[Read] = []

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False) -> None:
        self.metadata = metadata

    def create_local_plan(self) -> LoadPlan:
        md = self.metadata.state_dict_metadata
        by_key: dict[str, list[Piece]] = {}
        for p in self.pieces.values():
            by_key.setdefault(p.key, []).append(p)
        items = []
        for key, pieces in by_key.items():
            if key not in md or tuple(md[key].size) != pieces[0].full_shape:
                have = "absent" if key not in md else f"of shape {tuple(md[key].size)}"
                raise CheckpointMismatch(
                    f"{key}: the model holds a tensor of shape {pieces[0].full_shape}, the checkpoint's is {have}"
                )
            chunks = [ChunkStorageMetadata(torch.Size(p.offsets), torch.Size(p.sizes)) for p in pieces]
            items += create_read_items_for_chunk_list(key, md[key], chunks)
        for r in items:
            p = self.pieces[(r.dest_index.fqn, tuple(r.dest_index.offset))]
            source = self.metadata.storage_data[r.storage_index].relative_path
            self.reads.append(
                Read(
                    p.key,
                    p.offsets,
                    tuple(r.storage_index.offset),
                    _file_rank(source),
                    math.prod(r.lengths) * p.tensor.element_size(),
                )
            )
        return LoadPlan(items)

    def create_global_plan(self, global_plan):
        return global_plan

    def finish_plan(self, central_plan):
        return central_plan

    def load_bytes(self, read_item, value) -> None:
        raise CheckpointError(f"unexpected bytes entry {read_item.dest_index.fqn!r}: this format stores tensors only")

    def resolve_tensor(self, read_item) -> torch.Tensor:
        t = self.pieces[(read_item.dest_index.fqn, tuple(read_item.dest_index.offset))].tensor
        for d, (o, n) in enumerate(zip(read_item.dest_offsets, read_item.lengths)):
            t = t.narrow(d, o, n)
        return t

    def commit_tensor(self, read_item, tensor) -> None:
        pass  # resolve_tensor handed out a view of the live storage: the data is already in place


def _file_rank(relative_path: str) -> int:
    """The global rank that wrote a DCP file ("__3_0.distcp" -> 3)."""
    return int(relative_path.split("_")[2])


# -------------------------------------------------------------------------------------------- manifest and checks


def _config_dict(cfg: ModelConfig) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def _config_from(d: dict) -> ModelConfig:
    d = dict(d)
    if d.get("moe") is not None:
        d["moe"] = MoEConfig(**d["moe"])
    return ModelConfig(**d)


def _hyper(optimizer) -> dict:
    """The optimizer's class and the hyperparameters of its first group, JSON-clean."""
    group = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    kind = type(optimizer)
    return {"class": f"{kind.__module__}.{kind.__qualname__}", "hyper": json.loads(json.dumps(group, default=repr))}


def read_manifest(folder) -> dict:
    """The manifest of a committed checkpoint (raises `CheckpointNotFound` / `CheckpointIncomplete`)."""
    folder = Path(folder)
    problem = _folder_problem(folder)
    if problem:
        raise problem
    return json.loads((folder / MANIFEST).read_text())


def _folder_problem(folder: Path) -> CheckpointError | None:
    if not folder.is_dir():
        partial = folder.with_name(folder.name + PARTIAL)
        hint = f"; {partial.name} is a save that did not finish" if partial.exists() else ""
        return CheckpointNotFound(f"no checkpoint folder {str(folder)!r}{hint}")
    if not (folder / MANIFEST).is_file():
        return CheckpointIncomplete(f"{str(folder)!r} has no {MANIFEST}: not a committed checkpoint")
    return None


def mismatches(manifest: dict, model: ParallelTransformer) -> list[str]:
    """How the checkpoint's model and optimizer differ from `model`'s (the seed excepted: it only drew the initial
    weights the load replaces), one line per field, with both values."""
    saved, mine = dict(manifest["model"]), _config_dict(model.cfg)
    out = [
        f"model {k}: checkpoint {saved.get(k)!r}, model {mine.get(k)!r}"
        for k in sorted(set(saved) | set(mine))
        if k != "seed" and saved.get(k) != mine.get(k)
    ]
    opt = _hyper(model.wrappers[0].optimizer)
    if manifest["optimizer"]["class"] != opt["class"]:
        out.append(f"optimizer: checkpoint {manifest['optimizer']['class']}, model {opt['class']}")
    else:
        a, b = manifest["optimizer"]["hyper"], opt["hyper"]
        out += [
            f"optimizer {k}: checkpoint {a.get(k)!r}, model {b.get(k)!r}"
            for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)
        ]
    return out


def _agree(problem: CheckpointError | None, world, device) -> None:
    """Every rank raises, or none: one all-gather of an error code per rank (phase "checkpoint"; on the ranks'
    device, which NCCL needs)."""
    code = 0 if problem is None else _CODES.get(type(problem), 9)
    mine = torch.tensor([code], dtype=torch.int64, device=device)
    codes = C.all_gather_tensor(mine, 0, world, phase=PHASE, tag="checkpoint.agree")
    codes = [int(c) for c in codes]
    if problem is not None:
        raise problem
    if any(codes):  # this rank saw no problem, another did: they do not see the same files
        bad = [r for r, c in enumerate(codes) if c]
        raise CheckpointError(f"ranks {bad} refused the checkpoint (error codes {codes}): they see different files")


def _barrier(world, device) -> None:
    C.all_reduce_(torch.zeros(1, device=device), world, phase=PHASE, tag="checkpoint.barrier")


# -------------------------------------------------------------------------------------------- save and load


@dataclass
class SaveReport:
    """What this rank wrote: its boxes after DCP's dedup, their payload bytes and its file's size on disk."""

    folder: str
    rank: int
    pieces: list[tuple[str, tuple, tuple]]
    payload_bytes: int
    file_bytes: int


def save_checkpoint(model: ParallelTransformer, folder, *, fault=None) -> SaveReport:
    """Save `model`'s parameters and optimizer state into `folder` (every rank calls it; a shared filesystem).

    Written into `<folder>.partial` (a stale one from a crashed save is removed first), committed by rank 0 with
    the manifest and one atomic rename once every rank's data is on disk. Raises `CheckpointExists` on every rank
    if `folder` exists. fail_after_write: a test hook, called on each rank after its data is written and before
    the commit (to show that a crash there leaves the previous checkpoint as it was)."""
    folder = Path(folder)
    world = model.mesh["world"]
    problem = None
    if folder.exists():
        problem = CheckpointExists(f"{str(folder)!r} exists: a checkpoint is never overwritten (save to a new folder)")
    elif any(getattr(w, "weights", None) is not None for w in model.wrappers):
        problem = CheckpointError("mixed-precision master weights are not checkpointed here: train in one dtype")
    _agree(problem, world, model.device)
    elementwise, scalars = _state_kinds(model)
    partial = folder.with_name(folder.name + PARTIAL)
    if world.rank == 0:
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir(parents=True)
    _barrier(world, model.device)
    planner = _PieceSavePlanner(
        model_pieces(model, elementwise), fault=None if fault is None else (world.global_rank, fault)
    )
    dcp.save({}, storage_writer=dcp.FileSystemWriter(partial), planner=planner, process_group=world.pg)
    if world.rank == 0:
        manifest = dict(
            format=FORMAT,
            model=_config_dict(model.cfg),
            optimizer=_hyper(model.wrappers[0].optimizer) | {"elementwise": elementwise, "scalars": scalars},
            saved_on=dict(mesh=model.mesh.config.describe(), world=model.mesh.world_size, zero=model.zero_stage.key),
        )
        with open(partial / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.rename(partial, folder)  # the commit: atomic on one filesystem
        fd = os.open(folder.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    _barrier(world, model.device)
    mine = folder / f"__{world.global_rank}_0.distcp"
    return SaveReport(
        str(folder),
        world.global_rank,
        [(p.key, p.offsets, p.sizes) for p in planner.written],
        sum(p.nbytes for p in planner.written),
        mine.stat().st_size if mine.exists() else 0,
    )


@dataclass
class LoadReport:
    """What this rank read: one `Read` per (saved box, held box) overlap; held_bytes: the bytes of every box it
    holds (the reads add up to it: the saved boxes do not overlap)."""

    folder: str
    rank: int
    reads: list[Read]
    held_bytes: int

    def bytes_from(self) -> dict[int, int]:
        """Bytes read from each saving rank's file."""
        out: dict[int, int] = {}
        for r in self.reads:
            out[r.saved_by] = out.get(r.saved_by, 0) + r.nbytes
        return out


def _init_state(model: ParallelTransformer, elementwise: list[str], scalars: dict) -> None:
    """Give every optimizer tensor the checkpoint's state names before the load fills them (torch optimizers
    create their state lazily at the first step; a present state is used as it is)."""
    for w in model.wrappers:
        for t, *_ in _optimizer_slots(w):
            state = w.optimizer.state[t]
            state.clear()
            for k in elementwise:
                state[k] = torch.zeros_like(t, memory_format=torch.contiguous_format).detach()
            for k, (value, dtype) in scalars.items():
                v = float.fromhex(value)
                state[k] = v if dtype == "python" else torch.tensor(v, dtype=getattr(torch, dtype))


def load_checkpoint(model: ParallelTransformer, folder) -> LoadReport:
    """Load a committed checkpoint into `model`, whatever mesh saved it: its parameters and its optimizer state
    (every rank calls it). Raises, on every rank alike and before anything changes, `CheckpointNotFound`,
    `CheckpointIncomplete` or `CheckpointMismatch` (another model shape or optimizer, every difference listed)."""
    folder = Path(folder)
    world = model.mesh["world"]
    problem = _folder_problem(folder)
    manifest = None
    if problem is None:
        manifest = json.loads((folder / MANIFEST).read_text())
        diff = mismatches(manifest, model)
        if diff:
            problem = CheckpointMismatch(f"{str(folder)!r} does not fit this model: " + "; ".join(diff))
    _agree(problem, world, model.device)
    elementwise = manifest["optimizer"]["elementwise"]
    _init_state(model, elementwise, manifest["optimizer"]["scalars"])
    pieces = model_pieces(model, elementwise)
    planner = _PieceLoadPlanner(pieces)
    with torch.no_grad():
        dcp.load({}, storage_reader=dcp.FileSystemReader(folder), planner=planner, process_group=world.pg)
    _barrier(world, model.device)
    return LoadReport(str(folder), world.global_rank, planner.reads, sum(p.nbytes for p in pieces))


def restore(folder, mesh, options: RunOptions = RunOptions(), **model_kw) -> tuple[ParallelTransformer, LoadReport]:
    """Build the checkpoint's model on `mesh` with `options` and load it. Raises `ComposeConfigError` (every
    constraint the mesh breaks, with the numbers) before building anything if the mesh cannot hold the saved
    model. model_kw go to `ParallelTransformer.from_full` (the optimizer and its keywords: they must match the
    checkpoint's; `bucket_bytes`)."""
    manifest = read_manifest(folder)
    cfg = _config_from(manifest["model"])
    problems = compose_problems(cfg, mesh.config, mesh.world_size, options=options)
    if problems:
        raise ComposeConfigError(problems, f"the checkpoint {str(folder)!r}")
    model = ParallelTransformer.from_full(build_model(cfg), mesh, options, **model_kw)
    return model, load_checkpoint(model, folder)


def latest_checkpoint(root) -> Path | None:
    """The committed checkpoint folder under `root` whose name sorts last (name them step-000004, ...), or None;
    `.partial` folders and folders without a manifest are skipped."""
    root = Path(root)
    if not root.is_dir():
        return None
    done = [p for p in root.iterdir() if p.is_dir() and not p.name.endswith(PARTIAL) and (p / MANIFEST).is_file()]
    return max(done, key=lambda p: p.name, default=None)


def read_checkpoint(folder) -> dict[str, torch.Tensor]:
    """Every full tensor of a committed checkpoint, in one process: {key: tensor} (what a single device loads)."""
    folder = Path(folder)
    read_manifest(folder)
    md = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata
    out = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype) for k, m in md.items()}
    with warnings.catch_warnings():  # DCP warns that it loads in one process: that is the point here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(out, storage_reader=dcp.FileSystemReader(folder), no_dist=True)
    return out
