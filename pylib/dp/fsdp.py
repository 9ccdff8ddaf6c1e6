"""ZeRO-3 / FSDP: shard the parameters too, and gather each module's full parameters only while it runs.

Each *unit* (by default every child module that has parameters, looking through ModuleList / Sequential: for the
reference model embed, layers.0, ..., layers.L-1, ln_f, lm_head) keeps its parameters as one flat buffer, padded to
a multiple of d; rank r holds slice r only, an `nn.Parameter` of [padded/d] elements -- the only parameter tensors
the rank keeps, and what its optimizer updates. Around each unit:

    before forward    full = all_gather(shard)                    module parameters become views into `full`
    after forward     free full's storage (resize to 0 bytes)     autograd's saved views now point at nothing
    before backward   re-allocate, all-gather again into it       (a hook on the unit's output gradient)
    during backward   the gradient of `full` is reduce-scattered into shard.grad -- automatically, because the
                      forward used `collectives.all_gather`, whose backward is reduce-scatter -- scaled by 1/d
    after backward    free full's storage again                   (a hook on full's gradient)

`timeline` records the resident parameter bytes after every gather and free, so a run can draw them.

`reshard_after_forward` (FSDP2's name and meaning): True, as above, for every unit; False keeps each unit's full
buffer from its forward until its backward has used it (no second all-gather: 2(d-1)/d * Psi per micro-batch, the
full parameters resident from forward to backward, as ZeRO-2's are); None is FSDP2's default, True for every unit
but the root, whose forward spans the whole forward anyway, so freeing it only to gather it again at once gains
nothing. `set_reshard_after_forward(reshard, units)` sets it unit by unit. A forward without autograd (no backward
to come) frees every unit; FP8-gathered flats are gathered again in backward either way.

Per micro-batch and rank that is all-gather + all-gather + reduce-scatter, 3(d-1)/d * Psi bytes: 1.5x DDP's
traffic for 1/d of the parameter memory (ZeRO paper, section 7.2.2). With m micro-batches per step every one of
them gathers again in its forward and its backward and reduce-scatters its own gradient (accumulated into the
shard's gradient): 3m(d-1)/d * Psi per step. Nothing here keeps a gather across micro-batches (FSDP2's
`set_reshard_after_backward(False)` and `set_requires_gradient_sync(False)` would trade memory for that), and
ZeRO-3 has no `no_sync`: the full gradient is never held. At any moment one unit (sometimes two, where backward
hands over from one to the next) is resident in full; `peak_param_bytes` measures it.

HSDP (`replicate=`, a second group): the shards are cut over `group` (s ranks, inside a node) and the whole of the
above runs there; each reduce-scattered shard gradient is then all-reduced over `replicate` (the r ranks holding
the same shard, one per node), and divided by d = r x s. That is torch 2.13's order for a 2-D mesh
(`torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py`, `foreach_reduce`: `reduce_scatter_comm` over the
shard group, then `dist.all_reduce` of its output over `all_reduce_group`, "not None iff HSDP"). Per micro-batch:
3(s-1)/s * Psi on the shard group, 2(r-1)/r * Psi/s on the replica group (`pylib.analysis.dp.hsdp_traffic_by_link`).
`hybrid_groups(s)` makes the two groups.

Freeing works the way PyTorch's FSDP does it: the autograd graph keeps *views* of `full` (Linear saves its weight,
LayerNorm its weight and bias), so the storage under them can be emptied after forward and refilled before
backward without the graph noticing. Between uses a module's parameter attributes are shape-only "meta" tensors.

    fsdp = FullyShardedDataParallel(model, group=mesh["dp-cp"], lr=1e-3)
    loss = model.loss(ids_mine, targets_mine); loss.backward()    # units gather / free / reduce-scatter
    fsdp.finish_gradient_sync(); fsdp.step(); fsdp.zero_grad()
"""

from __future__ import annotations

import collections
import functools

import torch
import torch.nn as nn

from pylib.plan.fields import instance
from pylib.plan.options import MixedPrecision

from ..runtime import collectives as C
from ..runtime import tracer
from ..runtime.sharding import ShardSpec
from .fp8_gather import Fp8ParamGather, fp8_weights
from .groups import GroupFor, check_divide_factor, dtype_name, split_by_group
from .layout import FlatLayout, flatten, single_flat
from .memory import HeldBytes, optimizer_state_tensors, storage_bytes
from .mixed import MasterWeights

_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)
TIMELINE_LENGTH = 4096  # resident-bytes records kept (a few per unit and step)


def default_units(module: nn.Module) -> list[str]:
    """Every child module that has parameters, looking through containers (FSDP's usual "wrap each layer")."""
    out = []

    def walk(m: nn.Module, prefix: str):
        for name, child in m.named_children():
            if isinstance(child, _CONTAINERS):
                walk(child, f"{prefix}{name}.")
            elif any(True for _ in child.parameters()):
                out.append(f"{prefix}{name}")

    walk(module, "")
    return out


class _ScaleGrad(torch.autograd.Function):
    """Forward: identity (a view). Backward: multiply the gradient by `scale` (1/d turns a sum into a mean)."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return dy * ctx.scale, None


class _GatherReduce(torch.autograd.Function):
    """Forward: all-gather this rank's shard over the shard group (`flat.group`). Backward: the full buffer's gradient,
    in `flat.main_grad`'s dtype when there is one, reduce-scattered over the shard group; with HSDP
    (`flat.replicate`) the slice then all-reduced over the replica group; divided by `divide_by`. It is added into
    `flat.main_grad` (Megatron's main_grad: a float32 reduction of a bf16 parameter cannot be an autograd gradient,
    which must have its tensor's dtype) and the shard gets none, or, without main_grad, returned as the shard's
    gradient."""

    @staticmethod
    def forward(ctx, shard, flat, divide_by, tag):
        ctx.flat, ctx.divide_by, ctx.tag = flat, divide_by, tag
        return C.all_gather_tensor(shard.detach(), 0, flat.group, tag=tag)

    @staticmethod
    def backward(ctx, dy):
        flat = ctx.flat
        dtype = dy.dtype if flat.main_grad is None else flat.main_grad.dtype
        part = C.reduce_scatter_tensor(dy.to(dtype), 0, flat.group, phase="backward", tag=ctx.tag)
        if part is dy:  # a shard group of one: the gradient autograd handed us is not ours to change in place
            part = part.clone()
        if flat.replicate is not None:
            part = C.all_reduce_(part.contiguous(), flat.replicate, phase="backward", tag=ctx.tag)
        if ctx.divide_by != 1:
            part = part.div_(ctx.divide_by)
        if flat.main_grad is None:
            return part, None, None, None
        flat.main_grad.add_(part)
        return None, None, None, None


class _Fp8GatherReduce(_GatherReduce):
    """`_GatherReduce` with the forward's all-gather in FP8 (`Fp8ParamGather.gather`): the full buffer it returns
    holds the dequantized weights; the backward reduce-scatters the gradient in its dtype, as without FP8."""

    @staticmethod
    def forward(ctx, shard, flat, divide_by, tag):
        ctx.flat, ctx.divide_by, ctx.tag = flat, divide_by, tag
        return flat.fp8.gather(shard.detach(), tag)


class _Flat:
    """One unit's parameters of one reduction group: layout, group, the shard this rank keeps, and where each
    parameter is referenced in the module tree (a tied parameter has several homes). main_grad: with a
    mixed-precision recipe that reduces in another dtype than the shard's, the reduced gradient slice in it."""

    def __init__(self, layout: FlatLayout, group, shard: nn.Parameter, homes: list[list[tuple[nn.Module, str]]]):
        self.layout, self.group, self.shard, self.homes = layout, group, shard, homes
        self.main_grad: torch.Tensor | None = None
        self.replicate = None  # HSDP: the group whose members hold the same shard (its gradient all-reduced there)
        self.fp8: Fp8ParamGather | None = None  # FP8 parameter gather: a flat of Fp8Linear weights only

    @property
    def grad(self) -> torch.Tensor | None:
        """The reduced gradient of this rank's shard: main_grad if there is one, else the shard's autograd grad."""
        return self.main_grad if self.main_grad is not None else self.shard.grad

    def set_views(self, full: torch.Tensor | None) -> None:
        for e, homes in zip(self.layout.entries, self.homes):
            if full is None:
                t = torch.empty(e.shape, dtype=self.shard.dtype, device="meta")
            else:
                t = full[e.offset : e.offset + e.numel].view(e.shape)
            for owner, attr in homes:
                setattr(owner, attr, t)


class _Unit:
    def __init__(self, name: str, module: nn.Module, flats: list[_Flat]):
        self.name, self.module, self.flats = name, module, flats
        self.reshard_after_forward = True  # False: the full buffers stay from forward until backward used them


class _Gathered:
    """The full buffers of one call of one unit, and whether backward has re-gathered them yet."""

    def __init__(self, unit: _Unit):
        self.unit = unit
        self.storages: list[tuple[_Flat, torch.UntypedStorage]] = []
        self.kept: set[int] = set()  # id(flat) of the flats whose full buffer stays from forward to backward
        self.regathered = False


def _params_by_unit(module: nn.Module, modules: dict, unit_names: list[str]):
    """Which unit owns each parameter: the innermost unit whose name prefixes every name it is known by.

    Returns ({unit name ("" = root), in order: [(name, parameter)]}, {id(parameter): [(name, owner module, attr)]});
    raises on a unit that is not a module, or a parameter two units share."""
    missing = [u for u in unit_names if u not in modules]
    if missing:
        raise ValueError(f"units {missing} are not modules of {type(module).__name__}")
    homes: dict[int, list[tuple[str, nn.Module, str]]] = {}
    params: dict[int, nn.Parameter] = {}
    for qual, p in module.named_parameters(remove_duplicate=False):
        owner_name, _, attr = qual.rpartition(".")
        homes.setdefault(id(p), []).append((qual, modules[owner_name], attr))
        params[id(p)] = p

    def unit_of(qual: str) -> str:
        best = ""
        for u in unit_names:
            if qual.startswith(u + ".") and len(u) > len(best):
                best = u
        return best

    by_unit: dict[str, list[tuple[str, nn.Parameter]]] = {u: [] for u in ["", *unit_names]}
    for pid, places in homes.items():
        owners = {unit_of(q) for q, _, _ in places}
        if len(owners) > 1:
            names = ", ".join(q for q, _, _ in places)
            raise ValueError(
                f"parameter {names} is shared by units {sorted(owners)}: a parameter must belong to "
                "one unit (leave those modules out of `units` and it falls to the root unit)"
            )
        by_unit[owners.pop()].append((places[0][0], params[pid]))
    return by_unit, homes


def _shard_flat(key: str, g, dtype: torch.dtype, members, homes) -> _Flat:
    """Flatten `members` [(name, parameter)] into one padded buffer over group g, keep this rank's slice as the
    only parameter, and turn the modules' attributes into shape-only placeholders."""
    layout = single_flat(
        key,
        [(n, tuple(p.shape)) for n, p in members],
        element_size=torch.empty((), dtype=dtype).element_size(),
        parts=g.size,
        axis=g.name,
        group=g.ranks,
        dtype=dtype_name(dtype),
    )
    with torch.no_grad():
        full = flatten(layout, [p for _, p in members])
        lo, hi = layout.shard_range(g.rank)
        shard = nn.Parameter(full[lo:hi].clone())
    member_homes = [[(m, a) for _, m, a in homes[id(p)]] for _, p in members]
    for places in member_homes:
        for owner, attr in places:
            owner._parameters.pop(attr, None)  # the module no longer owns it: the shard does
    flat = _Flat(layout, g, shard, member_homes)
    flat.set_views(None)
    return flat


class FullyShardedDataParallel(nn.Module):
    """ZeRO-3 over `group` (None = every rank) or per-parameter `group_for(name, param)`.

    units: dotted names of the modules that gather and free together (default `default_units(module)`); parameters
    not inside any unit form a root unit gathered for the whole forward. A parameter shared by two units (tied
    embeddings) must sit in one: leave both modules out of `units` so it falls to the root unit.
    Forward is the module's own; every rank must run the same units in the same order.
    gradient_divide_factor: None averages each gradient over its group; a number divides every group's sum by it.
    precision: a `MixedPrecision` recipe (the module already in its compute dtype) or None. With a recipe the
    16-bit shards get fp32 master copies and fp32 optimizer state (`MasterWeights`), updated and cast back into
    the shards at each step. grad_reduce = compute: autograd reduce-scatters each unit's gradient in the shards'
    dtype into shard.grad; grad_reduce = float32: the gradient is cast and reduce-scattered in fp32 into a
    persistent fp32 slice per flat (`_GatherReduce`, Megatron's main_grad).
    replicate: HSDP's replica group (`hybrid_groups`): `group` is then the shard group, each shard's reduced
    gradient is all-reduced over `replicate` too, and the default divisor is d = r x s (`_GatherReduce`).
    A recipe whose `fp8.param_gather` is set gathers the Fp8Linear weights of each unit in FP8, from a flat of their
    own (`pylib.dp.fp8_gather`).
    """

    tag_prefix = "zero3"

    def __init__(
        self,
        module: nn.Module,
        group=None,
        *,
        units: list[str] | None = None,
        group_for: GroupFor | None = None,
        gradient_divide_factor: int | float | None = None,
        optimizer=torch.optim.Adam,
        precision=None,
        replicate=None,
        reshard_after_forward: bool | None = True,
        **optim_kwargs,
    ):
        super().__init__()
        _check_reshard(reshard_after_forward, "reshard_after_forward")
        self.replicate = None if replicate is None else C.resolve_group(replicate)
        if self.replicate is not None:
            if group_for is not None:
                raise ValueError(
                    "replicate= (HSDP) with group_for=: one replica group cannot serve parameters reduced over "
                    "different groups; shard those parameters with a wrapper of their own"
                )
            self.tag_prefix = "hsdp"
        self.reduce_dtype = None
        if (
            precision is not None
            and instance("FSDP", "precision", precision, MixedPrecision).grad_reduce != precision.compute
        ):
            self.reduce_dtype = getattr(torch, precision.grad_reduce)
        self.module = module
        self.divide_by = check_divide_factor(gradient_divide_factor)
        unit_names = default_units(module) if units is None else list(units)
        modules = dict(module.named_modules())
        by_unit, homes = _params_by_unit(module, modules, unit_names)
        fp8_gather = precision is not None and precision.fp8 is not None and precision.fp8.param_gather
        owners = fp8_weights(module) if fp8_gather else {}
        self.units: list[_Unit] = []
        self.shards = nn.ParameterList()
        for uname, named in by_unit.items():
            if not named:
                continue
            sets = split_by_group(named, group, group_for)
            flats = []
            for g, dtype, members, fp8 in _split_fp8(sets, owners):
                key = uname or "root"
                key = f"{key}.{g.name}" if len(sets) > 1 else key
                flat = _shard_flat(f"{key}.fp8" if fp8 else key, g, dtype, members, homes)
                if fp8:
                    flat.fp8 = Fp8ParamGather(flat, [owners[id(p)] for _, p in members])
                if self.reduce_dtype is not None:
                    flat.main_grad = torch.zeros(flat.shard.numel(), dtype=self.reduce_dtype, device=flat.shard.device)
                flat.replicate = self.replicate
                self.shards.append(flat.shard)
                flats.append(flat)
            unit = _Unit(uname, modules[uname], flats)
            unit.module.register_forward_pre_hook(functools.partial(self._before_forward, unit))
            unit.module.register_forward_hook(functools.partial(self._after_forward, unit))
            self.units.append(unit)
        for unit in self.units:
            unit.reshard_after_forward = bool(unit.name) if reshard_after_forward is None else reshard_after_forward
        self.weights: MasterWeights | None = None
        if precision is None:
            self.optimizer = optimizer(list(self.shards), **optim_kwargs)
        else:
            groups = [f.group for u in self.units for f in u.flats]
            self.weights = MasterWeights(list(self.shards), precision, optimizer, groups, **optim_kwargs)
            self.optimizer = self.weights.optimizer
        self._live: dict[int, torch.UntypedStorage] = {}
        self._shard_bytes = storage_bytes(self.shards)  # fixed: the shards never change size
        self._calls: dict[int, _Gathered] = {}
        self._callback_queued = False
        self.peak_param_bytes = 0
        self.peak_grad_bytes = 0
        self.reset_peaks()

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # -------------------------------------------------------------------------------------------- hooks

    def _before_forward(self, unit: _Unit, module, args):
        call = _Gathered(unit)
        for flat in unit.flats:
            tag = f"{self.tag_prefix}.{flat.layout.key}"
            divide_by = self._group_size(flat) if self.divide_by is None else self.divide_by
            # HSDP (all-reduced over the replicas too), or mixed precision reduced in another dtype (into main_grad)
            if flat.fp8 is not None:
                full = _Fp8GatherReduce.apply(flat.shard, flat, divide_by, tag)
            elif flat.replicate is not None or flat.main_grad is not None:
                full = _GatherReduce.apply(flat.shard, flat, divide_by, tag)
            else:
                full = C.all_gather(flat.shard, 0, flat.group, tag=tag)
                if divide_by != 1:  # backward: the all-gather's reduce-scatter sums, this turns the sum into the mean
                    full = _ScaleGrad.apply(full, 1.0 / divide_by)
            if flat.group.size > 1:
                storage = full.untyped_storage()
                call.storages.append((flat, storage))
                self._live[id(storage)] = storage
                if full.requires_grad:
                    full.register_hook(functools.partial(self._after_backward, storage, unit.name or "root"))
            flat.set_views(full)
        self._calls[id(unit)] = call
        self._note_params(f"gather {unit.name or 'root'}")

    def _after_forward(self, unit: _Unit, module, args, output):
        call = self._calls.pop(id(unit))
        hooked = False
        if torch.is_grad_enabled():
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(functools.partial(self._before_backward, call))
                    hooked = True
        for flat, storage in call.storages:
            # kept for backward only where a backward will come to use it and free it (`_after_backward`)
            if hooked and not unit.reshard_after_forward and flat.fp8 is None and flat.shard.requires_grad:
                call.kept.add(id(flat))
            else:
                self._free(storage)
        for flat in unit.flats:
            flat.set_views(None)
            if flat.fp8 is not None:
                flat.fp8.release()
        self._note_params(f"free {unit.name or 'root'}")

    def _before_backward(self, call: _Gathered, grad):
        if call.regathered:
            return
        call.regathered = True
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
        for flat, storage in call.storages:
            if id(flat) in call.kept:
                continue  # still resident since its forward: nothing to gather
            storage.resize_(flat.layout.padded_numel * flat.shard.element_size())
            tag = f"{self.tag_prefix}.{flat.layout.key}"
            if flat.fp8 is not None:
                again = flat.fp8.gather(flat.shard.detach(), tag, phase="backward")
            else:
                again = C.all_gather_tensor(flat.shard.detach(), 0, flat.group, phase="backward", tag=tag)
            storage.copy_(again.untyped_storage())
            self._live[id(storage)] = storage
        if len(call.kept) < len(call.storages):
            self._note_params(f"gather {call.unit.name or 'root'} (backward)")

    def _after_backward(self, storage: torch.UntypedStorage, name: str, grad):
        # the whole gradient of this unit's full buffer exists now (next: scaled, reduce-scattered into the shard)
        self.peak_grad_bytes = max(self.peak_grad_bytes, self._grad_bytes() + grad.numel() * grad.element_size())
        self._free(storage)
        self._note_params(f"free {name} (backward)")

    def _end_backward(self):
        self._callback_queued = False
        if self._live:
            for storage in list(self._live.values()):  # a unit whose parameters got no gradient
                self._free(storage)
            self._note_params("free at the end of backward")

    def _free(self, storage: torch.UntypedStorage) -> None:
        storage.resize_(0)
        self._live.pop(id(storage), None)

    @staticmethod
    def _group_size(flat: _Flat) -> int:
        """The ranks that computed parts of this flat's gradient: the group, times the replicas under HSDP."""
        return flat.group.size * (1 if flat.replicate is None else flat.replicate.size)

    def _note_params(self, what: str) -> None:
        resident = self.resident_param_bytes()
        self.peak_param_bytes = max(self.peak_param_bytes, resident)
        self.timeline.append((tracer.now(), resident, what))

    def _grad_bytes(self) -> int:
        return storage_bytes([p.grad for p in self.shards] + [f.main_grad for f in self._flats()])

    def _flats(self) -> list[_Flat]:
        return [f for u in self.units for f in u.flats]

    # -------------------------------------------------------------------------------------------- training

    def set_reshard_after_forward(self, reshard: bool, units=None) -> None:
        """Whether `units` (names as in `unit_bytes`, "root" for the root unit; None: every unit) free their full
        parameters after forward and gather them again in backward (True), or keep them until their backward has
        used them (False: one all-gather of the unit fewer per micro-batch; FSDP2's `set_reshard_after_forward`)."""
        _check_reshard(reshard, "set_reshard_after_forward: reshard", none=False)
        by_name = {u.name or "root": u for u in self.units}
        names = list(by_name) if units is None else list(units)
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise ValueError(f"set_reshard_after_forward: {unknown} are not units of this wrapper ({list(by_name)})")
        for n in names:
            by_name[n].reshard_after_forward = reshard

    def finish_gradient_sync(self) -> None:
        """Nothing is left in flight: each unit's reduce-scatter ran inside backward. Kept for the common API."""
        self._end_backward()

    def step(self) -> None:
        """Update this rank's shards (no communication: the next forward gathers the new values)."""
        with tracer.phase("optimizer"):
            if self.weights is None:
                self.optimizer.step()
            else:
                self.weights.step([f.grad for f in self._flats()])

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward on: multiplied by the loss scale of the recipe (fp16), else itself."""
        return loss if self.weights is None else self.weights.scale_loss(loss)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        for f in self._flats():
            f.shard.grad = None
            if f.main_grad is not None:
                f.main_grad.zero_()

    # -------------------------------------------------------------------------------------------- reports

    @property
    def layouts(self) -> list[FlatLayout]:
        return [f.layout for u in self.units for f in u.flats]

    def gradient_shards(self) -> dict[str, torch.Tensor]:
        return {f.layout.key: f.grad for u in self.units for f in u.flats}

    def parameter_shards(self) -> dict[str, torch.Tensor]:
        return {f.layout.key: f.shard for u in self.units for f in u.flats}

    def resident_param_bytes(self) -> int:
        """Parameter bytes alive right now: the shards plus every full buffer currently gathered."""
        return self._shard_bytes + sum(s.nbytes() for s in self._live.values())

    def reset_peaks(self) -> None:
        """Measure afresh from now: peaks from what is held now, and a new `timeline` of resident parameter bytes
        -- (time, bytes, what just happened) after every gather and free, the last TIMELINE_LENGTH of them."""
        self.peak_param_bytes = self.resident_param_bytes()
        self.peak_grad_bytes = self._grad_bytes()
        self.timeline = collections.deque([(tracer.now(), self.peak_param_bytes, "start")], maxlen=TIMELINE_LENGTH)

    def memory(self) -> HeldBytes:
        params = self.resident_param_bytes()
        grads = self._grad_bytes()
        state = optimizer_state_tensors(self.optimizer) if self.weights is None else self.weights.state_tensors()
        optim = storage_bytes(state)
        return HeldBytes(params, grads, optim, max(params, self.peak_param_bytes), max(grads, self.peak_grad_bytes))

    def unit_bytes(self) -> dict[str, int]:
        """Full (padded) bytes of each unit's parameters: what gathering it makes resident."""
        out = {}
        for u in self.units:
            out[u.name or "root"] = sum(f.layout.padded_bytes for f in u.flats)
        return out

    def shard_specs(self) -> list[ShardSpec]:
        """Every parameter: which elements of it this rank's shard holds (a parameter may straddle shards)."""
        out = []
        for u in self.units:
            for f in u.flats:
                owned = {name: (a, b) for name, a, b in f.layout.owned(f.group.rank)}
                for e in f.layout.entries:
                    a, b = owned.get(e.name, (0, 0))
                    out.append(
                        ShardSpec(
                            e.name,
                            f.layout.axis,
                            None,
                            "zero",
                            e.shape,
                            (b - a,),
                            f"flat {f.layout.key}: elements [{a}, {b}) of {e.numel}",
                        )
                    )
        return out


def _check_reshard(value, what: str, none: bool = True) -> None:
    """`value` is True or False, or (`none`) None: FSDP2's default, every unit but the root."""
    if not isinstance(value, bool) and not (none and value is None):
        allowed = "True, False or None (FSDP2's default: every unit but the root)" if none else "True or False"
        raise TypeError(f"{what} must be {allowed}, got {value!r}")


def _split_fp8(sets, owners: dict):
    """Each (group, dtype, members) set as (group, dtype, members, False) and, where some members are Fp8Linear
    weights (`owners`), those apart as (group, dtype, weights, True): the flats gathered in FP8."""
    for g, dtype, members in sets:
        fp8 = [(n, p) for n, p in members if id(p) in owners]
        rest = [(n, p) for n, p in members if id(p) not in owners]
        if rest:
            yield g, dtype, rest, False
        if fp8:
            yield g, dtype, fp8, True


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)
