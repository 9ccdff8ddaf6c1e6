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
