"""Rank x rank traffic of the dispatcher, read back from the tracer's records of a real run."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def _field(e, name):
    return e[name] if isinstance(e, dict) else getattr(e, name)


def traffic_matrix(
    events_per_rank: Sequence[Iterable], world_size: int, *, tag: str = "dispatch", phase: str = "forward"
) -> list[list[int]]:
    """[world][world] bytes that rank s (row) addressed to rank d (column) in the all-to-alls whose tag ends with
    `tag` in `phase`, including the diagonal (rows a rank keeps for its own experts, which never hit the wire).

    events_per_rank: each rank's trace events (CommEvent or `as_dict()` dicts), e.g. returned from `launch`."""
    m = [[0] * world_size for _ in range(world_size)]
    for events in events_per_rank:
        for e in events:
            t = _field(e, "tag")
            if _field(e, "op") != "all_to_all" or _field(e, "phase") != phase:
                continue
            if not (t == tag or t.endswith("." + tag)):
                continue
            splits = _field(e, "extra").get("input_splits")
            if splits is None or sum(splits) == 0:
                continue
            row = _field(e, "payload_bytes") // sum(splits)
            src = _field(e, "rank")
            for j, dst in enumerate(_field(e, "group")):
                m[src][dst] += splits[j] * row
    return m


def node_split(matrix: Sequence[Sequence[int]], group_ranks: Sequence[int], ranks_per_node: int) -> list[dict]:
    """Split each EP rank's sent bytes into those that stay on its node and those that cross to another node.

    matrix: the world x world bytes of `traffic_matrix`; group_ranks: the EP group's global ranks in group order;
    nodes are blocks of `ranks_per_node` consecutive members of that order (member i on node i // ranks_per_node).
    One dict per member, in group order: rank, node, intra (bytes to other ranks of its node), inter (bytes to
    ranks of other nodes), local (its own rows, which never leave it)."""
    n = len(group_ranks)
    if ranks_per_node < 1 or n % ranks_per_node:
        raise ValueError(f"ranks_per_node={ranks_per_node} does not divide the EP group's {n} ranks into nodes")
    out = []
    for i, src in enumerate(group_ranks):
        row = dict(rank=src, node=i // ranks_per_node, intra=0, inter=0, local=matrix[src][src])
        for j, dst in enumerate(group_ranks):
            if j != i:
                row["intra" if j // ranks_per_node == i // ranks_per_node else "inter"] += matrix[src][dst]
        out.append(row)
    return out
