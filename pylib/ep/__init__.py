"""Expert parallelism: a real MoE layer over an EP group, with all-to-all dispatch and combine, ETP inside each
expert, and the folding of the expert layout ETP x EP x EDP onto the dense ranks TP x CP x DP.

    ExpertParallelMoE.from_full(moe, *, ep_group=None, etp_group=None, aux_group=None)   # or .from_mesh(moe, mesh)
    AllToAllDispatcher(n_experts, ep_group, etp_group).dispatch(...) / .combine(...)   (cfg.dispatcher "alltoall")
    AllGatherDispatcher(n_experts, grid_group, first, n_local)                          (cfg.dispatcher "allgather")
    SharedExperts(moe.shared, tp_group)      # the shared MLP, TP-cut and replicated over EP
    permute(x, experts, n_experts, keep) -> rows, plan;  unpermute(rows, plan, weights);  sort_chunks(rows, counts)
    group_aux_loss(routing, cfg, group)      # this rank's share of the aux losses over the group's tokens
    folding_table(config, world_size)        # each rank's place in the dense and in the expert layout
    routing_table(routing, n_experts, ep, token_names, keep)   # token -> experts, weights, owning EP ranks
    interleave([stack.steps(x_a), stack.steps(x_b)], overlap=True)   # one micro-batch's all-to-all under the
                                   # other's compute (pylib.ep.overlap; stack = ExpertParallelStack(blocks, ...))
"""

from .aux_loss import group_aux_loss, group_token_stats
from .checks import check_expert_parallel, expert_parallel_problems
from .dispatcher import AllToAllDispatcher, DispatchState
from .experts import LocalExperts
from .gather_dispatcher import AllGatherDispatcher, AllGatherState
from .layer import ExpertParallelMoE
from .overlap import ExpertParallelStack, OverlapRecorder, Segments, interleave
from .permute import PermutePlan, permute, sort_chunks, unpermute
from .routing_table import format_routing_table, routing_table
from .shared import SharedExperts

__all__ = [
    "AllGatherDispatcher",
    "AllGatherState",
    "SharedExperts",
    "AllToAllDispatcher",
    "DispatchState",
    "ExpertParallelMoE",
    "ExpertParallelStack",
    "OverlapRecorder",
    "Segments",
    "interleave",
    "LocalExperts",
    "PermutePlan",
    "check_expert_parallel",
    "expert_parallel_problems",
    "group_aux_loss",
    "format_routing_table",
    "group_token_stats",
    "permute",
    "routing_table",
    "sort_chunks",
    "unpermute",
]
