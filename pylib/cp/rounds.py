"""Article A's round table, read back from a real ring's trace: which K/V block each rank holds at each round.

Ring attention tags its forward transfers "ring.kv.<t>" (under any enclosing tag): the block received with tag t
is the one used at step t (round t+1 in the seed's 1-based counting). Before the first transfer each rank holds
its own block. After that a rank holds, at round t+1, whatever its sender (the recv event's `peer`) held at
round t -- so the table follows from the recorded peers alone, not from the ring's formula.
"""

from __future__ import annotations

import re

from pylib.i18n import columns

_KV = re.compile(r"(?:^|\.)ring\.kv\.(\d+)$")


def _get(e, key):
    return e[key] if isinstance(e, dict) else getattr(e, key)


def ring_rounds(events_by_rank, *, tag: str | None = None) -> list[dict]:
    """Rows of the round table from each rank's trace of one forward ring pass.

    events_by_rank: one list of events (`CommEvent`s or their `as_dict()`) per cp rank, in cp-rank order, the
    group's global ranks as in the trace. tag: an enclosing tag that picks out one ring call (e.g. "layers.0").
    Returns [{"round": 1, "holds": [0, 1, 2, 3], "recv_from": None}, {"round": 2, "holds": [3, 0, 1, 2],
    "recv_from": [3, 0, 1, 2]}, ...]: `holds[i]` is the K/V block (owner's cp rank) cp rank i attends to in that
    round, `recv_from[i]` the cp rank it arrived from."""
    n = len(events_by_rank)
    arrivals: list[dict[int, int]] = []  # per cp rank: step -> sender's global rank
    group = None
    for i, events in enumerate(events_by_rank):
        got: dict[int, int] = {}
        for e in events:
            if _get(e, "op") != "recv" or _get(e, "phase") != "forward":
                continue
            t = _get(e, "tag")
            if tag is not None and not t.startswith(tag + "."):
                continue
            m = _KV.search(t)
            if not m:
                continue
            step = int(m.group(1))
            if step in got:
                raise ValueError(
                    f"cp rank {i}'s events hold two ring passes (step {step} twice); pass tag= to pick one"
                )
            got[step] = _get(e, "peer")
            group = tuple(_get(e, "group"))
        arrivals.append(got)
    if group is None:
        raise ValueError("no forward ring transfers (recv events tagged ring.kv.<t>) in the events")
    if len(group) != n:
        raise ValueError(f"events from {n} ranks but the ring's group has {len(group)} members {group}")
    steps = sorted(arrivals[0])
    if steps != list(range(1, n)) or any(sorted(a) != steps for a in arrivals):
        raise ValueError(f"expected steps 1..{n - 1} on every rank, got {[sorted(a) for a in arrivals]}")
    holds = list(range(n))
    rows = [dict(round=1, holds=list(holds), recv_from=None)]
    for step in steps:
        senders = [group.index(arrivals[i][step]) for i in range(n)]
        holds = [holds[senders[i]] for i in range(n)]
        rows.append(dict(round=step + 1, holds=list(holds), recv_from=senders))
    return rows


def format_round_table(rows) -> str:
    """The table as text, in the seed's shape: a row per round, a column per rank (Q_i stays put)."""
    n = len(rows[0]["holds"])
    head = ["round"] + [f"rank{i} (Q{i})" for i in range(n)]
    lines = [head]
    for row in rows:
        if row["recv_from"] is not None:
            lines.append(["  pass"] + [f"recv K{h}V{h} from {s}" for h, s in zip(row["holds"], row["recv_from"])])
        lines.append([str(row["round"])] + [f"K{h}V{h}" for h in row["holds"]])
    widths = [max(columns.width(line[c]) for line in lines) for c in range(len(head))]
    return "\n".join("  ".join(columns.ljust(cell, w) for cell, w in zip(line, widths)).rstrip() for line in lines)
