"""Expert parallelism in numbers: all-to-all volume, ETP gather volume, capacity, expert memory per rank.

Symbols: T tokens on a rank, k = top_k, h = d_model, h_ffn = expert hidden size, E experts, ep / etp group sizes,
b = bytes per element. Rank r of the EP group holds experts [r * E/ep, (r+1) * E/ep).

The dispatch all-to-all moves one row of h numbers per kept (token, expert) assignment whose expert lives on
another rank; the combine all-to-all moves the same rows back. So for rank r

    dispatch sent  = (A_r - A_r,local) * h * b       A_r = kept assignments of r's tokens (T*k without dropping)
    combine  sent  = dispatch received                A_r,local = those whose expert is on r itself

and with uniform routing and no dropping the expected volume is T * k * h * b * (ep - 1) / ep each way.
Backward repeats both exchanges with the directions swapped: the same bytes again.
"""

from __future__ import annotations

from collections.abc import Sequence


def owner(expert: int, n_experts: int, ep: int) -> int:
    """EP rank holding `expert` (contiguous blocks of E/ep experts)."""
    return expert // (n_experts // ep)


def _flat(values) -> list:
    """The numbers of a [T, k] table in row-major order: nested sequences, or anything with `.tolist()` (a tensor
    handed over from a run)."""
    values = values.tolist() if hasattr(values, "tolist") else values
    out: list = []
    stack = [values]
    while stack:
        v = stack.pop()
        if isinstance(v, (list, tuple)):
            stack.extend(reversed(v))
        else:
            out.append(v)
    return out


def dispatch_counts(experts, n_experts: int, ep: int, keep=None) -> list[int]:
    """Rows one rank sends to each EP rank (index = destination, the rank's own entry stays local).
    experts [T, k] expert ids of this rank's tokens; keep [T, k] the assignments surviving capacity (True = kept).
    Nested sequences or tensors (read through `.tolist()`)."""
    chosen = _flat(experts)
    if keep is not None:
        kept = _flat(keep)
        if len(kept) != len(chosen):
            raise ValueError(f"keep has {len(kept)} entries for {len(chosen)} expert choices")
        chosen = [e for e, k in zip(chosen, kept) if k]
    per_rank = [0] * ep
    for e in chosen:
        per_rank[int(e) // (n_experts // ep)] += 1
    return per_rank


def dispatch_matrix(routings: Sequence, n_experts: int, keeps: Sequence | None = None) -> list[list[int]]:
    """[ep][ep] rows sent from EP rank s (row) to EP rank d (column) in the dispatch, from every rank's routing.
    The diagonal is what stays local; combine is the transpose."""
    ep = len(routings)
    keeps = keeps if keeps is not None else [None] * ep
    return [dispatch_counts(e, n_experts, ep, kp) for e, kp in zip(routings, keeps)]


def alltoall_bytes(matrix: Sequence[Sequence[int]], h: int, dtype_bytes: int) -> list[dict]:
    """Per EP rank: bytes sent and received in the dispatch and in the combine, from a dispatch row matrix."""
    ep, row = len(matrix), h * dtype_bytes
    out = []
    for r in range(ep):
        sent = sum(matrix[r][d] for d in range(ep) if d != r) * row
        recv = sum(matrix[s][r] for s in range(ep) if s != r) * row
        out.append(
            dict(
                rank=r,
                dispatch_sent=sent,
                dispatch_recv=recv,
                combine_sent=recv,
                combine_recv=sent,
                local=matrix[r][r] * row,
            )
        )
    return out


def dispatch_bytes_sent(experts, rank: int, n_experts: int, ep: int, h: int, dtype_bytes: int, keep=None) -> int:
    """One rank's dispatch volume: tokens x k x h x b minus the rows that stay local (and minus dropped ones).
    experts, keep [T, k] as in `dispatch_counts`."""
    assignments = len(_flat(experts))
    sent_rows = dispatch_counts(experts, n_experts, ep, keep)
    dropped = 0 if keep is None else sum(not k for k in _flat(keep))
    return (assignments - dropped - sent_rows[rank]) * h * dtype_bytes


def expected_alltoall_bytes(tokens: int, top_k: int, h: int, ep: int, dtype_bytes: int) -> float:
    """Expected dispatch (= combine) bytes per rank with uniform routing and no dropping:
    T * k * h * b * (ep - 1) / ep."""
    return tokens * top_k * h * dtype_bytes * (ep - 1) / ep


def etp_gather_bytes(rows_per_member: Sequence[int], member: int, h: int, dtype_bytes: int) -> dict:
    """ETP all-gather of the rows each ETP member received (ring algorithm, uneven blocks):
    member r receives every block but its own and forwards every block but its successor's. The combine's
    reduce-scatter moves the same total: sends all but its own block, receives all but its predecessor's."""
    n, row = len(rows_per_member), h * dtype_bytes
    total = sum(rows_per_member) * row
    return dict(
        all_gather_sent=total - rows_per_member[(member + 1) % n] * row,
        all_gather_recv=total - rows_per_member[member] * row,
        reduce_scatter_sent=total - rows_per_member[member] * row,
        reduce_scatter_recv=total - rows_per_member[(member - 1) % n] * row,
    )


def node_rows(experts, ep_rank: int, n_experts: int, ep: int, ranks_per_node: int, keep=None) -> dict:
    """Rows EP rank `ep_rank` sends in one dispatch, by where they go, from its routing experts [T, k] (keep [T, k]):

    intra       kept assignments to another rank of its own node (node = ep rank // ranks_per_node)
    inter       kept assignments to a rank of another node: what the all-to-all moves across nodes
    inter_dedup distinct (token, other node) pairs: what crosses nodes when a token goes to each node once and
                fans out inside it (DeepSeek-V3's dispatch); node-limited routing caps it at T * topk_groups."""
    per_rank, home = n_experts // ep, ep_rank // ranks_per_node
    rows = experts.tolist() if hasattr(experts, "tolist") else experts
    keeps = [[True] * len(r) for r in rows] if keep is None else (keep.tolist() if hasattr(keep, "tolist") else keep)
    out = dict(intra=0, inter=0, inter_dedup=0)
    for chosen, kept in zip(rows, keeps):
        nodes = set()
        for e, kp in zip(chosen, kept):
            dst = int(e) // per_rank
            if not kp or dst == ep_rank:
                continue
            if dst // ranks_per_node == home:
                out["intra"] += 1
            else:
                out["inter"] += 1
                nodes.add(dst // ranks_per_node)
        out["inter_dedup"] += len(nodes)
    return out


def expected_inter_node_rows(
    tokens: int, top_k: int, n_experts: int, ep: int, ranks_per_node: int, topk_groups: int | None = None
) -> dict:
    """Expected rows crossing nodes in one dispatch, uniform routing, no dropping, N = ep / ranks_per_node nodes:

        inter       T * k * (N - 1) / N                            (each assignment lands on a node at random)
        inter_dedup T * (N - 1) * (1 - C(E - E/N, k) / C(E, k))    (a node is touched unless all k miss it)

    With node-limited routing (topk_groups = M, the groups being the nodes) `inter` is unchanged in expectation and
    inter_dedup becomes T * M * (N - 1) / N: M nodes at random, each remote with probability (N - 1) / N -- exact
    when each kept node receives at least one of the k experts (always for M = 1), an upper bound otherwise."""
    from math import comb

    N = ep // ranks_per_node
    if topk_groups is None:
        dedup = tokens * (N - 1) * (1 - comb(n_experts - n_experts // N, top_k) / comb(n_experts, top_k))
    else:
        dedup = tokens * topk_groups * (N - 1) / N
    return dict(inter=tokens * top_k * (N - 1) / N, inter_dedup=dedup)


def dispatcher_bytes(
    dispatcher: str,
    tokens: int,
    top_k: int,
    h: int,
    dtype_bytes: int,
    ep: int,
    etp: int = 1,
    n_experts: int | None = None,
    capacity: int | None = None,
) -> dict:
    """Bytes one rank sends in one MoE layer's forward, by collective, and their "total" (backward: the same again).

    T tokens on the rank, n = etp * ep, rows of h * b bytes; uniform routing, nothing dropped (T*k rows leave each
    rank, T*k arrive) unless `capacity` pads every expert to C rows (then E*C rows each way, whatever the routing).

      "alltoall"  dispatch + combine   2 * R * h b * (ep-1)/ep             R = T*k, or E*C padded
                  ETP gather + scatter 2 * (etp-1) * R * h b               (ring over the received rows)
                  counts               (ep-1) * E/ep * 8 + (etp-1) * E * 8  (int64; none when padded)
      "allgather" gather rows          (n-1) * T * h b                     (ring)
                  gather ids, weights  (n-1) * T * k * (8 + b)             (int64 expert ids, router weights)
                  reduce-scatter       (n-1) * T * h b

    The rows' parts reduce to 2 R h b (n-1)/ep for the all-to-all and 2 T h b (n-1) for the all-gather, so the
    crossover does not depend on etp (`dispatcher_crossover_top_k`)."""
    row, n = h * dtype_bytes, ep * etp
    if dispatcher == "allgather":
        parts = dict(
            gather_rows=(n - 1) * tokens * row,
            gather_routing=(n - 1) * tokens * top_k * (8 + dtype_bytes),
            reduce_scatter=(n - 1) * tokens * row,
        )
    elif dispatcher == "alltoall":
        if capacity is not None and n_experts is None:
            raise ValueError("a padded all-to-all moves E*C rows: give n_experts with capacity")
        rows = tokens * top_k if capacity is None else n_experts * capacity
        parts = dict(
            alltoall=2 * rows * row * (ep - 1) / ep,
            etp=2 * (etp - 1) * rows * row,
            counts=0
            if capacity is not None or n_experts is None
            else (ep - 1) * n_experts // ep * 8 + (etp - 1) * n_experts * 8,
        )
    else:
        raise ValueError(f"dispatcher={dispatcher!r}: 'alltoall' or 'allgather'")
    return dict(parts, total=sum(parts.values()))


def dispatcher_crossover_top_k(h: int, dtype_bytes: int, ep: int) -> float:
    """The top-k above which the all-gather dispatcher sends fewer bytes than the all-to-all (uniform routing, no
    padding, counts neglected): (n-1) T (2 h b + k (8 + b)) < 2 T k h b (n-1)/ep, i.e.

        k > 2 h b / (2 h b / ep - 8 - b)          (-> ep for large h; inf when 2 h b / ep <= 8 + b)

    The same for every etp: both sides scale with n - 1 = ep*etp - 1."""
    denom = 2 * h * dtype_bytes / ep - 8 - dtype_bytes
    return float("inf") if denom <= 0 else 2 * h * dtype_bytes / denom


def expert_params_per_rank(h: int, d_ff: int, n_experts: int, ep: int, etp: int = 1, mlp: str = "gelu") -> int:
    """Expert weights one rank holds: (E / ep) experts x (2 or 3) matrices of h x h_ffn / etp."""
    mats = 3 if mlp == "swiglu" else 2
    return (n_experts // ep) * mats * h * (d_ff // etp)


def router_params(h: int, n_experts: int) -> int:
    """The replicated router: one [E, h] matrix on every rank."""
    return n_experts * h


def dropped_assignments(counts_per_group: Sequence[Sequence[int]], capacity: int | Sequence[int] | None) -> int:
    """Assignments a capacity limit drops: sum over drop groups g and experts e of max(0, N_ge - C_g).

    counts_per_group [G][E]: assignments each group's tokens make to each expert (before dropping); capacity: C for
    every group, or one C_g per group (None: nothing is dropped). With Megatron-Core's rule a group is one rank's
    tokens and C_g = `pylib.plan.config.expert_capacity(T_g, moe)`, the one capacity formula."""
    if capacity is None:
        return 0
    caps = [capacity] * len(counts_per_group) if isinstance(capacity, int) else list(capacity)
    if len(caps) != len(counts_per_group):
        raise ValueError(f"{len(caps)} capacities for {len(counts_per_group)} drop groups")
    return sum(max(0, int(n) - c) for counts, c in zip(counts_per_group, caps) for n in counts)
