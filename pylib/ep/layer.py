"""The expert-parallel MoE layer: a replicated router, the all-to-all dispatcher, and this rank's experts.

    moe_ep = ExpertParallelMoE.from_full(moe, ep_group=mesh.ep, etp_group=mesh.etp, aux_group=mesh["tp-cp"])
    y = moe_ep(x)           # x [b, s_local, h]: THIS rank's tokens -> [b, s_local, h]

Which rank holds what:
  router.gate  [E, h]                  replicated on every rank; each rank routes its own tokens
  experts      E_local = E / ep        rank i of the EP group holds experts [i * E_local, (i+1) * E_local)
  inside one   h_ffn / etp             rank j of the ETP group holds slice j of every local expert's FFN
  shared       n_s*h_ffn / tp          rank j of the TP group holds slice j of the shared MLP, replicated over EP
                                       (`pylib.ep.shared`: placed as Megatron-Core places its SharedExpertMLP)

Tokens differ across the ranks of the EP and ETP groups (different sequence shards under SP/CP, or different
micro-batches). So the layer's output on the union of all ranks' tokens is the reference MoE's output on that
union; the gradients are too, provided:
  * the router gradient is summed over the ranks holding different tokens (`reduce_router_grad(group)`; in a
    full model the data-parallel / sequence-parallel gradient reduction does this) -- each rank only sees its
    own tokens' contribution;
  * expert gradients need nothing inside the EP x ETP group: every token that chose expert e reached e's ranks,
    so each slice's gradient is already complete for the tokens of this EP group. Ranks holding the same slice for
    other tokens -- the expert data-parallel group, EDP -- sum those gradients and divide by dp*cp, the number of
    batch shards the loss averages over (Megatron's rule; `pylib.dp`'s `gradient_divide_factor`). Averaging over
    EDP alone would leave expert gradients too large by dp*cp/edp.

Capacity and dropping follow Megatron-Core's default: each rank computes C from its own token count and drops
among its own tokens before sending (reference: `MoE.forward(x, drop_groups=rank_of_each_token)`).
The aux losses are taken over the tokens of `aux_group` (Megatron: the tp-cp group); each rank adds its share.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from pylib.model.moe import (
    AddAuxiliaryLoss,
    MoE,
    Routing,
    capacity_keep_mask,
    tokens_per_expert,
    updated_expert_bias,
)
from pylib.plan.config import expert_capacity
from pylib.runtime import collectives
from pylib.runtime.mesh import AxisGroup
from pylib.runtime.sharding import ShardSpec
from pylib.runtime.tracer import tag

from .aux_loss import group_aux_loss
from .checks import check_expert_parallel, check_orthogonal
from .dispatcher import AllToAllDispatcher, DispatchState
from .experts import LocalExperts
from .gather_dispatcher import AllGatherDispatcher, AllGatherState
from .shared import SharedExperts


def _single(name: str) -> AxisGroup:
    import torch.distributed as dist

    me = dist.get_rank() if dist.is_initialized() else 0
    return AxisGroup(name, (me,), 0, None)


class ExpertParallelMoE(nn.Module):
    """The reference `MoE` split over an EP group (and an ETP group inside each expert). See the module docstring.

    After a forward: `last_routing` and `last_keep` (this rank's tokens), `last_state` (the dispatch counts),
    `last_aux_loss` (this rank's share, detached) are kept for inspection."""

    def __init__(
        self,
        moe: MoE,
        ep_group: AxisGroup,
        etp_group: AxisGroup,
        aux_group: AxisGroup | None,
        tp_group: AxisGroup | None = None,
        grid_group: AxisGroup | None = None,
        sequence_parallel: bool = True,
    ):
        super().__init__()
        cfg = moe.cfg
        d_ff, d_model = moe.experts[0].up_proj.weight.shape
        check_expert_parallel(cfg, ep=ep_group.size, etp=etp_group.size, d_ff_expert=d_ff)
        check_orthogonal(ep_group.ranks, etp_group.ranks, ep_group.global_rank)
        self.cfg, self.d_model, self.d_ff = cfg, d_model, d_ff
        self.ep_group, self.etp_group, self.aux_group = ep_group, etp_group, aux_group
        self.n_local = cfg.n_experts // ep_group.size
        self.router = copy.deepcopy(moe.router)
        self.experts = LocalExperts(
            moe.experts, ep_group.rank * self.n_local, self.n_local, etp_group.rank, etp_group.size
        )
        if cfg.dispatcher == "allgather":
            if grid_group is None and etp_group.size > 1:
                raise ValueError(
                    f"the all-gather dispatcher gathers over the etp x ep = {etp_group.size} x {ep_group.size} grid: "
                    "pass grid_group (mesh['etp-ep'])"
                )
            grid = ep_group if grid_group is None else grid_group
            if grid.size != ep_group.size * etp_group.size:
                raise ValueError(f"grid_group has {grid.size} ranks, etp x ep = {etp_group.size * ep_group.size}")
            self.dispatcher = AllGatherDispatcher(cfg.n_experts, grid, ep_group.rank * self.n_local, self.n_local)
        else:
            self.dispatcher = AllToAllDispatcher(cfg.n_experts, ep_group, etp_group)
        self.tp_group = tp_group if tp_group is not None else _single("tp")
        self.shared = None if moe.shared is None else SharedExperts(moe.shared, self.tp_group, sequence_parallel)
        device = moe.router.gate.weight.device
        self.register_buffer(
            "routed_counts", torch.zeros(cfg.n_experts, dtype=torch.int64, device=device), persistent=False
        )
        self.last_routing: Routing | None = None
        self.last_keep: torch.Tensor | None = None
        self.last_state: DispatchState | AllGatherState | None = None
        self.last_aux_loss: torch.Tensor | None = None

    @classmethod
    def from_full(
        cls,
        moe: MoE,
        *,
        ep_group=None,
        etp_group=None,
        aux_group=None,
        tp_group=None,
        grid_group=None,
        sequence_parallel: bool = True,
    ) -> ExpertParallelMoE:
        """Keep this rank's experts (and ETP slices) of the reference `moe`.

        ep_group: the EP group (None = every rank). etp_group: the ETP group (None = no ETP).
        aux_group: the ranks whose tokens form one batch for the aux losses (None = this rank's tokens only).
        tp_group: the dense TP group the shared experts are cut over, its ranks holding sequence shards of the
        same sequences (None = each rank computes the whole shared MLP on its own tokens).
        grid_group: the etp x ep ranks the all-gather dispatcher gathers over (None = the EP group; needed when
        cfg.dispatcher == "allgather" and etp > 1). sequence_parallel: whether the ranks of tp_group hold sequence
        shards (True) or the same tokens (False: the shared experts enter and leave TP by Megatron's f and g)."""
        ep = collectives.resolve_group(ep_group)
        etp = _single("etp") if etp_group is None else collectives.resolve_group(etp_group)
        aux = None if aux_group is None else collectives.resolve_group(aux_group)
        tp = None if tp_group is None else collectives.resolve_group(tp_group)
        grid = None if grid_group is None else collectives.resolve_group(grid_group)
        return cls(moe, ep, etp, aux, tp, grid, sequence_parallel)

    @classmethod
    def from_mesh(cls, moe: MoE, mesh, *, aux_group: str | None = "tp-cp") -> ExpertParallelMoE:
        """The folded layout: EP and ETP groups from the mesh's expert layout; aux losses over the mesh's
        `aux_group` (default "tp-cp", Megatron's: the ranks holding pieces of the same sequences)."""
        return cls.from_full(
            moe,
            ep_group=mesh.ep,
            etp_group=mesh.etp,
            aux_group=None if aux_group is None else mesh[aux_group],
            tp_group=mesh.tp,
            grid_group=mesh["etp-ep"],
        )

    @property
    def expert_ids(self) -> range:
        """Global ids of the experts this rank holds."""
        return range(self.experts.first, self.experts.first + self.n_local)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x has hidden size h={x.shape[-1]}, the MoE layer expects h={self.d_model}")
        shape = x.shape
        xt = x.reshape(-1, shape[-1])
        routing = self.router(xt)
        capacity = expert_capacity(xt.shape[0], self.cfg)
        keep = capacity_keep_mask(routing, self.cfg, capacity)
        if torch.is_grad_enabled():
            self.routed_counts += tokens_per_expert(routing.experts, self.cfg.n_experts)
        if self.cfg.pad_to_capacity:
            rows, state = self.dispatcher.dispatch(xt, routing.experts, keep, capacity)
        else:
            rows, state = self.dispatcher.dispatch(xt, routing.experts, keep)
        if getattr(self.dispatcher, "gate_in_expert", False):  # the combine weights applied by the experts
            gates = self.dispatcher.dispatch_gates(routing.weights, state)
            out = self.dispatcher.combine(self.experts(rows, state.rows_per_local_expert, gates), state, None)
        else:
            y = self.experts(rows, state.rows_per_local_expert)
            out = self.dispatcher.combine(y, state, routing.weights)
        if self.shared is not None:
            out = out + self.shared(x).reshape(out.shape)
        aux = group_aux_loss(routing, self.cfg, self.aux_group)
        if aux is not None:
            out = AddAuxiliaryLoss.apply(out, aux)
            self.last_aux_loss = aux.detach()
        self.last_routing = Routing(*(t.detach() for t in routing))
        self.last_keep, self.last_state = keep, state
        return out.view(shape)

    # ------------------------------------------------------------------------------------------ gradients, bias

    def reduce_router_grad(self, group=None) -> None:
        """Sum the router's gradient over `group` (the ranks that hold different tokens and share this router).

        Each rank's backward only sees its own tokens; the reference's gradient is the sum over all of them. In a
        full model this is the data-parallel / sequence-parallel gradient reduction of a replicated weight."""
        for p in self.router.parameters():
            if p.grad is not None:
                with tag("router_grad"):
                    collectives.all_reduce_(p.grad, group, phase="grad_sync")

    def reduce_shared_grad(self, group=None) -> None:
        """Sum the shared experts' gradients over `group`: the ranks holding the same TP slice for other tokens
        (the data-parallel ranks of the dense layout; in a full model its gradient reduction does this)."""
        if self.shared is None:
            return
        for p in self.shared.parameters():
            if p.grad is not None:
                with tag("shared_grad"):
                    collectives.all_reduce_(p.grad, group, phase="grad_sync")

    @torch.no_grad()
    def update_expert_bias(self, rate: float | None = None, group=None) -> torch.Tensor:
        """Aux-loss-free balancing: sum the routed counts over `group` (the ranks sharing this router), apply
        `updated_expert_bias`, reset the counts. Every rank ends with the same bias."""
        rate = self.cfg.bias_update_rate if rate is None else rate
        counts = self.routed_counts.clone()
        with tag("expert_bias"):
            collectives.all_reduce_(counts, group, phase="grad_sync")
        bias = self.router.expert_bias
        bias.copy_(updated_expert_bias(bias, counts, rate))
        self.routed_counts.zero_()
        return bias.clone()

    # ------------------------------------------------------------------------------------------ layout as data

    def param_map(self) -> list[tuple[str, nn.Parameter, str, tuple]]:
        """(local name, local parameter, reference name, index into the reference tensor) for the router and the
        routed experts: `reference_param[index]` is what this rank holds. The shared experts (dense, TP-cut) are
        in `shared.param_map()`."""
        out = [("router.gate.weight", self.router.gate.weight, "router.gate.weight", (slice(None),))]
        step = self.d_ff // self.etp_group.size
        lo = self.etp_group.rank * step
        for local, expert in enumerate(self.experts.experts):
            e = self.experts.global_id(local)
            for name, p in expert.named_parameters():
                cut = slice(lo, lo + step)
                index = (cut,) if LocalExperts.split_dim(name) == 0 else (slice(None), cut)
                out.append((f"experts.experts.{local}.{name}", p, f"experts.{e}.{name}", index))
        return out

    def shard_specs(self) -> list[ShardSpec]:
        """How this rank holds each weight: experts stacked [E, ...] split over "ep" along dim 0, each expert's
        FFN split over "etp" (column for up/gate, row for down), the router replicated."""
        etp = self.etp_group.size
        gate = tuple(self.router.gate.weight.shape)
        specs = [
            ShardSpec("router.gate.weight", "ep", None, "replicated", gate, gate, "each rank routes its own tokens")
        ]
        first = self.experts.experts[0]
        for name, p in first.named_parameters():
            full = list(p.shape)
            d = LocalExperts.split_dim(name)
            full[d] *= etp
            stacked_full = (self.cfg.n_experts, *full)
            stacked_local = (self.n_local, *p.shape)
            specs.append(
                ShardSpec(
                    f"experts.*.{name}",
                    "ep",
                    0,
                    "expert",
                    stacked_full,
                    (self.n_local, *full),
                    f"experts {self.expert_ids.start}..{self.expert_ids.stop - 1} of {self.cfg.n_experts} on ep rank "
                    f"{self.ep_group.rank}",
                )
            )
            kind = "column" if d == 0 else "row"
            specs.append(
                ShardSpec(
                    f"experts.*.{name}",
                    "etp",
                    d + 1,
                    kind,
                    (self.n_local, *full),
                    stacked_local,
                    f"h_ffn slice {self.etp_group.rank} of {etp}" if etp > 1 else "whole expert (etp=1)",
                )
            )
        if self.shared is not None:
            tp = self.tp_group.size
            for _, p, ref, index in self.shared.param_map():
                d = len(index) - 1
                full = list(p.shape)
                full[d] *= tp
                kind = "column" if d == 0 else "row"
                specs.append(ShardSpec(ref, "tp", d, kind, tuple(full), tuple(p.shape), "shared, replicated over ep"))
        return specs
