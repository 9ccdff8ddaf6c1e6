"""Cell formatting for the expert-parallelism chapter's tables (strings for `markdown_table` cells).

weight_pair(w)     a token's two combine weights and their sum: "0.512, 0.301 (Σ 0.813)"
split_sizes(e)     an uneven all-to-all's rows per rank, out → in, from a tracer event dict ("" otherwise)
"""

from __future__ import annotations


def weight_pair(w) -> str:
    """w: a token's k = 2 combine weights (a 1-d tensor or sequence)."""
    return f"{float(w[0]):.3f}, {float(w[1]):.3f} (Σ {float(sum(w)):.3f})"


def split_sizes(event: dict) -> str:
    """`event`: `CommEvent.as_dict()`; the input and output split sizes an uneven all-to-all recorded."""
    x = event["extra"]
    return f"{x['input_splits']} → {x['output_splits']}" if "input_splits" in x else ""
