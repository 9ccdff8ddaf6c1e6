"""The collectives primer's runs (book/part0/collectives.md): the inputs the ranks hold, a ring all-reduce built
from point-to-point sends (so the bytes it moves are the tensors it sends, not a formula), and the tables the
chapter prints from what the ranks return.

    block_values(rank, blocks)            # [blocks] float64: 10*rank + j, so a value names its rank and block
    power_of_ten(rank, numel)             # [numel] float64, every element 10**rank: a sum's digits name its ranks
    ring_all_reduce(x, steps=...)         # reduce-scatter then all-gather, 2(n-1) neighbour exchanges
    random_on_rank(seed, shape, same=)    # float64 noise, per rank or the same on every rank
    all_reduce_report(rank, total, event) # one rank's line: what it gave, what it got, what the tracer saw
    contributors(value)                   # 1101.0 -> (0, 2, 3): the ranks whose 10**r a sum holds
    ring_step_table(steps)                # the chunks each rank holds after each step, as a Markdown table
    collective_bytes_rows(...)            # per collective and world size: traced bytes against the formula
    conjugate_rows(result)                # per autograd op: traced forward and backward, the adjoint test
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from pylib.i18n import tr
from pylib.runtime import collectives as C

# ------------------------------------------------------------------------------------------------ inputs


def block_values(rank: int, blocks: int) -> torch.Tensor:
    """[blocks] float64: element j is 10*rank + j (rank 2's block 3 is 23), for up to 10 blocks and 10 ranks."""
    if blocks > 10:
        raise ValueError(f"block_values names blocks by one digit: {blocks} blocks is more than 10")
    return torch.arange(blocks, dtype=torch.float64) + 10.0 * rank


def power_of_ten(rank: int, numel: int) -> torch.Tensor:
    """[numel] float64, every element 10**rank: any sum of such tensors spells, in its decimal digits, which ranks
    it holds (exact in float64 up to 15 ranks)."""
    return torch.full((numel,), 10.0**rank, dtype=torch.float64)


def random_on_rank(seed: int, shape, *, same: bool = False) -> torch.Tensor:
    """float64 normal numbers of `shape`, different on each rank, or the same on every rank when `same` (one
    tensor of the model that every rank holds). Call inside a launched rank."""
    rank = 0 if same else dist.get_rank()
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1000 * seed + rank))


def all_reduce_report(rank: int, total: float, event) -> str:
    """The line one rank prints after contributing to an all-reduce (the book's first launch): what it contributed,
    the sum it got back, and what the tracer recorded for it (`event`, a `CommEvent`: op, group, bytes sent)."""
    return tr(
        "contributed {rank}, all-reduce gave {sum:g}; traced {op} over ranks {group}, sent {sent} B",
        rank=rank,
        sum=total,
        op=event.op,
        group=event.group,
        sent=event.bytes_sent,
    )


def contributors(value: float) -> tuple[int, ...]:
    """The ranks r whose 10**r the sum `value` holds: 1101.0 -> (0, 2, 3). Raises on a value that is not such a
    sum (a digit other than 0 or 1)."""
    digits = str(int(round(value)))[::-1]
    if set(digits) - {"0", "1"}:
        raise ValueError(f"{value} is not a sum of distinct powers of ten")
    return tuple(r for r, d in enumerate(digits) if d == "1")


# ------------------------------------------------------------------------------------------------ the ring


def ring_all_reduce(x: torch.Tensor, group=None, *, steps: list | None = None, tag: str = "ring") -> torch.Tensor:
    """The ring all-reduce of x [n*k] over the group's n members, built from neighbour exchanges only.

    The buffer is cut into n chunks of k elements. Each step, every member sends one chunk to the next member and
    receives one from the previous (one `batch_isend_irecv`, traced as one send and one recv of k elements):

        step s sends chunk (r - s) mod n to member r+1 and receives chunk (r - s - 1) mod n from member r-1:
        reduce-scatter, steps 1 .. n-1:  add the received chunk to its own; after step n-1 member r holds the
                                         whole sum of chunk r (chunk c set out from member c+1)
        all-gather, steps n .. 2(n-1):   keep the received (finished) chunk; after step 2(n-1) every member
                                         holds every summed chunk

    Returns the summed buffer [n*k] (a new tensor). `steps`, if given, gets the buffer as [n, k] before the first
    step and after every step (2(n-1) + 1 entries)."""
    g = C.resolve_group(group)
    n, r = g.size, g.rank
    if x.dim() != 1 or x.numel() % n:
        raise ValueError(f"ring_all_reduce needs a 1-D tensor whose size divides by {n}, got {tuple(x.shape)}")
    buf = x.clone().view(n, -1)
    if steps is not None:
        steps.append(buf.clone())
    for s in range(1, 2 * n - 1):
        reducing = s < n  # the first n-1 steps reduce-scatter, the last n-1 all-gather
        out, into = (r - s) % n, (r - s - 1) % n
        incoming = torch.empty_like(buf[into])
        works = C.batch_isend_irecv([("send", buf[out], (r + 1) % n), ("recv", incoming, (r - 1) % n)], g, tag=tag)
        for w in works:
            w.wait()
        buf[into] = buf[into] + incoming if reducing else incoming
        if steps is not None:
            steps.append(buf.clone())
    return buf.view(-1)


def ring_phase(step: int, n: int) -> str:
    """ "input" for step 0, "reduce-scatter" for steps 1 .. n-1, "all-gather" for n .. 2(n-1)."""
    return "input" if step == 0 else ("reduce-scatter" if step < n else "all-gather")


def ring_contributors(steps_by_rank: list[list[torch.Tensor]]) -> list[list[list[tuple[int, ...]]]]:
    """[step][rank][chunk] -> the ranks summed into that chunk, from each rank's `steps` of `ring_all_reduce` run
    on `power_of_ten` inputs (every element of a chunk is the same sum; the first is read)."""
    n_steps = len(steps_by_rank[0])
    return [
        [[contributors(float(c[0])) for c in rank_steps[s]] for rank_steps in steps_by_rank] for s in range(n_steps)
    ]


def ring_step_table(held: list[list[list[tuple[int, ...]]]]) -> list[list[str]]:
    """Rows for a table of the ring's steps: step, phase, then per rank its chunks as "c:ranks" strings, the chunk
    that changed at that step marked with *. `held` is `ring_contributors`' result."""
    n = len(held[0])
    rows = []
    for s, ranks in enumerate(held):
        row = [str(s), ring_phase(s, n)]
        for r, chunks in enumerate(ranks):
            changed = {c for c in range(n) if s and chunks[c] != held[s - 1][r][c]}
            row.append(" ".join(("*" if c in changed else "") + "".join(map(str, chunks[c])) for c in range(n)))
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------ bytes


# Per-rank bytes sent under the bandwidth-optimal (ring) algorithms, S the payload the tracer names
# (pylib.runtime.tracer): the all-reduced tensor, the gathered output, the reduce-scattered input, the all-to-all
# input.
FORMULAS = {
    "all_reduce": ("2(N−1)/N · S", lambda s, n: 2 * (n - 1) * s // n),
    "reduce_scatter": ("(N−1)/N · S", lambda s, n: (n - 1) * s // n),
    "all_gather": ("(N−1)/N · S", lambda s, n: (n - 1) * s // n),
    "all_to_all": ("(N−1)/N · S", lambda s, n: (n - 1) * s // n),
}


def formula_bytes(op: str, payload: int, n: int) -> int:
    """Bytes one rank sends (and receives) for `op` on n ranks with payload S = `payload` bytes."""
    return FORMULAS[op][1](payload, n)


def collective_bytes_rows(traced: dict[int, dict[str, tuple[int, int, int]]]) -> list[list[str]]:
    """Rows op, formula, then one "sent B" cell per world size. traced: {n: {op: (payload, sent, received)}} from
    rank 0 of each run. Raises if a traced count is not the formula's."""
    ns = sorted(traced)
    rows = []
    for op, (text, _) in FORMULAS.items():
        cells = []
        for n in ns:
            payload, sent, recv = traced[n][op]
            want = formula_bytes(op, payload, n)
            if sent != want or recv != want:
                raise AssertionError(f"{op} on {n} ranks: traced sent {sent}, received {recv}, formula {want}")
            cells.append(f"{sent:,}")
        rows.append([op.replace("_", "-"), text, *cells])
    return rows


# ------------------------------------------------------------------------------------------------ conjugates


def _ops(events, phase: str) -> str:
    ops = [op.replace("_", "-") for ph, op in events if ph == phase]
    return ", ".join(ops) or "—"


def conjugate_rows(result: dict, tol: float = 1e-9) -> list[list[str]]:
    """Rows op, forward ops, backward ops, <x, dx> / <y, dy>. result: {op name: (events, (<y, dy>, <x, dx>))},
    events the traced (phase, op) pairs, the inner products summed over the ranks. Raises if an op fails the
    adjoint test <A x, dy> = <x, A^T dy> (its backward is not the transpose of its forward)."""
    rows = []
    for name, (events, (y_dy, x_dx)) in result.items():
        ratio = x_dx / y_dy
        if abs(ratio - 1) > tol:
            raise AssertionError(f"{name}: <x, dx> / <y, dy> = {ratio:.6f}, not 1: backward is not the transpose")
        rows.append([name, _ops(events, "forward"), _ops(events, "backward"), f"{ratio:.6f}"])
    return rows
