"""Parallel folding: the same ranks, grouped two ways.

Attention (and dense MLP) layers use the dense layout TP x CP x DP x PP; MoE layers use the expert layout
ETP x EP x EDP x PP, with EDP = world / (ETP * EP * PP). Both come from Megatron's rank generator
(`pylib.runtime.rank_groups`) with the same order string, so they agree on PP: a rank sits in the same pipeline stage
whatever the layer. Inside one stage the dense axes TP x CP x DP and the expert axes ETP x EP x EDP are two
factorisations of the same ranks -- e.g. tp2 cp2 dp2 pp2 with ep4 etp1 puts the 4 ranks of one (TP x CP) block
into one EP group, and DP's pairs become EDP's pairs.
"""

from __future__ import annotations

from pylib.runtime.mesh import ParallelConfig, rank_groups

DENSE_AXES = ("tp", "cp", "dp", "pp")
EXPERT_AXES = ("etp", "ep", "edp", "pp")


def folding_groups(config: ParallelConfig, world_size: int) -> dict[str, dict[str, list[list[int]]]]:
    """{"dense": {"tp": groups, "cp": ..., "dp": ..., "pp": ...}, "expert": {"etp": ..., "ep": ..., "edp": ...,
    "pp": ...}} from the real rank generator."""
    groups = rank_groups(config, world_size)
    return {
        "dense": {a: groups[a] for a in DENSE_AXES},
        "expert": {a: groups[a] for a in EXPERT_AXES},
    }


def folding_table(config: ParallelConfig, world_size: int) -> list[dict]:
    """One row per rank: its index along each dense axis (tp, cp, dp, pp) and each expert axis (etp, ep, edp, pp),
    and the number of its group along each axis ("tp_group", ..., "ep_group", ...), all from `rank_groups`."""
    layouts = folding_groups(config, world_size)
    rows = []
    for rank in range(world_size):
        row = {"rank": rank}
        for layout, axes in layouts.items():
            for axis, groups in axes.items():
                (which,) = [i for i, g in enumerate(groups) if rank in g]
                key = axis if layout == "dense" or axis != "pp" else "pp_expert"
                row[key] = groups[which].index(rank)
                row[f"{key}_group"] = which
        rows.append(row)
    return rows


def format_folding_table(config: ParallelConfig, world_size: int) -> str:
    """The folding table as aligned text: rank | TP CP DP PP (dense) | ETP EP EDP PP (expert)."""
    rows = folding_table(config, world_size)
    head = ["rank", "tp", "cp", "dp", "pp", "|", "etp", "ep", "edp", "pp"]
    lines = [" ".join(f"{h:>4}" for h in head)]
    for r in rows:
        cells = [r["rank"], r["tp"], r["cp"], r["dp"], r["pp"], "|", r["etp"], r["ep"], r["edp"], r["pp_expert"]]
        lines.append(" ".join(f"{c:>4}" for c in cells))
    return "\n".join(lines)


def rank_layout(mesh) -> dict:
    """Inside a rank: the global ranks of each of its dense groups and each of its expert groups."""
    return {
        "rank": mesh.global_rank,
        "dense": {a: mesh[a].ranks for a in DENSE_AXES},
        "expert": {a: mesh[a].ranks for a in EXPERT_AXES},
    }
