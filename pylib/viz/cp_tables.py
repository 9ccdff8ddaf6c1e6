"""Table rows for the context-parallelism chapter, formatted from real runs (cells to hand to `markdown_table`).

ring_round_table_rows(rounds)   article A's round table: what each rank receives and attends to, round by round
                                (rounds from `pylib.cp.ring_rounds`, read from the trace)
overlap_table_rows(result)      the ring overlapped vs blocking: slowest rank's wall, compute and wait (ms)
                                (result from `pylib.experiments.ring_overlap.ring_overlap_timings`)
overlap_order_rows(result)      per rank and ring step: was the K/V transfer in flight across the compute?
"""

from __future__ import annotations

from pylib.i18n import tr

MARK = {True: "✓", False: "✗"}


def ring_round_table_rows(rounds: list[dict]) -> list[list[str]]:
    """One "pass" row (who receives which block from whom) before every round but the first, one row per round
    (which block each rank attends to), and an end row. Columns: label, then one per rank."""
    n = len(rounds[0]["holds"])
    table = []
    for row in rounds:
        if row["recv_from"] is not None:
            cells = [
                tr("receives K{h}V{h} from rank {src}", h=h, src=src) for h, src in zip(row["holds"], row["recv_from"])
            ]
            table.append([tr("pass ↓"), *cells])
        table.append([tr("round {n}", n=row["round"]), *(tr("attends to K{h}V{h}", h=h) for h in row["holds"])])
    table.append([tr("end"), *[tr("Q has seen every K, V ✓")] * n])
    return table


def overlap_table_rows(result: dict) -> list[list[str]]:
    """Rows: variant, wall, compute, waiting on a transfer (ms, the slowest rank's median over the repeats),
    wait as a share of wall."""
    rows = []
    for name, label in (("overlap", tr("overlapped (overlap=True)")), ("blocking", tr("blocking (overlap=False)"))):
        v = result["variants"][name]
        rows.append(
            [
                label,
                f"{1e3 * v['wall']:.1f}",
                f"{1e3 * v['compute']:.1f}",
                f"{1e3 * v['wait']:.1f}",
                f"{100 * v['wait'] / v['wall']:.0f} %",
            ]
        )
    return rows


def overlap_order_rows(result: dict) -> list[list[str]]:
    """Rows: variant, rank, then per forward step with a next block: ✓ if the transfer was issued before the
    step's compute and completed after it (in flight across it), ✗ if it completed before the compute began."""
    rows = []
    for name in ("overlap", "blocking"):
        for rank, steps in enumerate(result["orders"][name]):
            rows.append([name, rank, *(MARK[o["spans_compute"]] for o in steps)])
    return rows
