"""Context parallelism as formulas: traffic per rank for ring attention, Ulysses and all-gather CP, and causal work
per rank.

Symbols: b batch, s sequence length (whole), n_head, n_kv_head, d_head, cp the context-parallel size, B bytes per
element. Each rank holds s/cp tokens. The tests check every formula against the tracer and the ring's own work
records on real runs; the book evaluates them at real sizes.
"""

from __future__ import annotations


def _local(seq_len: int, cp: int) -> int:
    if cp < 1 or seq_len % cp:
        raise ValueError(f"cp={cp} does not divide s={seq_len}")
    return seq_len // cp


# --------------------------------------------------------------------------------------------------- ring


def ring_kv_message_bytes(batch: int, seq_len: int, n_kv_head: int, d_head: int, cp: int, bytes_per_elem: int) -> int:
    """One ring transfer: K and V of one rank's shard, 2 * b * n_kv_head * (s/cp) * d_head * B bytes."""
    return 2 * batch * n_kv_head * _local(seq_len, cp) * d_head * bytes_per_elem


def ring_traffic(
    batch: int,
    seq_len: int,
    n_kv_head: int,
    d_head: int,
    cp: int,
    bytes_per_elem: int,
    grad_bytes_per_elem: int | None = None,
) -> dict:
    """Per-rank point-to-point traffic of one ring-attention call.

    Forward: cp-1 K/V transfers (each rank sends as many as it receives). Backward: the K/V blocks go round
    again (cp-1 transfers) and the dK/dV accumulators make a full circle (cp transfers: cp-1 while gathering
    contributions, one last hop home), in the accumulation dtype (`grad_bytes_per_elem`, default float32's 4
    for half inputs, else `bytes_per_elem`)."""
    if grad_bytes_per_elem is None:
        grad_bytes_per_elem = max(bytes_per_elem, 4)
    kv = ring_kv_message_bytes(batch, seq_len, n_kv_head, d_head, cp, bytes_per_elem)
    dkv = ring_kv_message_bytes(batch, seq_len, n_kv_head, d_head, cp, grad_bytes_per_elem)
    fwd_n = cp - 1
    dkv_n = cp if cp > 1 else 0
    return dict(
        forward_kv_transfers=fwd_n,
        kv_message_bytes=kv,
        forward_bytes_sent=fwd_n * kv,
        backward_kv_transfers=fwd_n,
        backward_dkv_transfers=dkv_n,
        dkv_message_bytes=dkv,
        backward_bytes_sent=fwd_n * kv + dkv_n * dkv,
    )


def dkv_reduce_scatter_bytes(
    batch: int, seq_len: int, n_kv_head: int, d_head: int, cp: int, bytes_per_elem: int
) -> int:
    """Bytes each rank sends in a bandwidth-optimal (ring) reduce-scatter of the partial dK/dV.

    In backward every rank holds a partial dK/dV for *every* rank's block (cp blocks of
    2 * b * n_kv_head * (s/cp) * d_head elements); a reduce-scatter leaves each rank the sum for its own block and
    sends (cp-1)/cp of the cp blocks: cp-1 blocks. Ring attention's dK/dV ring (`ring_traffic`) sends cp blocks:
    its accumulator starts at the block's owner, so it needs one hop more to come home."""
    return (cp - 1) * ring_kv_message_bytes(batch, seq_len, n_kv_head, d_head, cp, bytes_per_elem)


def ring_attention_saved_bytes(
    batch: int,
    seq_len: int,
    n_head: int,
    n_kv_head: int,
    d_head: int,
    cp: int,
    bytes_per_elem: int,
    lse_bytes_per_elem: int | None = None,
) -> int:
    """Bytes ring attention keeps for backward on each rank: q and out [b, n_head, s/cp, d_head], k and v
    [b, n_kv_head, s/cp, d_head] in the input dtype, and the rows' LSE [b, n_head, s/cp] in the accumulation dtype
    (`lse_bytes_per_elem`, default float32's 4 for half inputs, else `bytes_per_elem`). No score matrix is kept
    (backward recomputes each block's probabilities from the LSE), so it is linear in s/cp: 1/cp of cp=1."""
    n = _local(seq_len, cp)
    own_kv = batch * n * d_head * 2 * n_kv_head * bytes_per_elem
    return _query_side_saved_bytes(batch, n, n_head, d_head, bytes_per_elem, lse_bytes_per_elem) + own_kv


def _query_side_saved_bytes(
    batch: int, n: int, n_head: int, d_head: int, bytes_per_elem: int, lse_bytes_per_elem: int | None
) -> int:
    """What every CP kind keeps of its own n query rows for backward: q and out [b, n_head, n, d_head] in the input
    dtype and the rows' LSE [b, n_head, n] in the accumulation dtype (default float32's 4 for half inputs)."""
    if lse_bytes_per_elem is None:
        lse_bytes_per_elem = max(bytes_per_elem, 4)
    return batch * n * d_head * 2 * n_head * bytes_per_elem + batch * n_head * n * lse_bytes_per_elem


# --------------------------------------------------------------------------------------------------- all-gather


def allgather_traffic(
    batch: int,
    seq_len: int,
    n_kv_head: int,
    d_head: int,
    cp: int,
    bytes_per_elem: int,
    grad_bytes_per_elem: int | None = None,
) -> dict:
    """Per-rank traffic of one all-gather CP call (`pylib.cp.allgather`): one all-gather of K and V forward, its
    conjugate reduce-scatter of dK and dV backward.

    The local message is a rank's K and V, 2 b n_kv_head (s/cp) d_head elements (`ring_kv_message_bytes`); the
    all-gather's payload is cp of them and each rank sends cp-1, as the ring's forward does, in one collective.
    The reduce-scatter's input is the gathered size, and each rank sends (cp-1)/cp of it: cp-1 messages again, in
    the gradient's dtype (`grad_bytes_per_elem`, default the input's: autograd hands the all-gather a gradient of
    its output's dtype), one message fewer than the ring's dK/dV circle and no second pass of K/V."""
    if grad_bytes_per_elem is None:
        grad_bytes_per_elem = bytes_per_elem
    kv = ring_kv_message_bytes(batch, seq_len, n_kv_head, d_head, cp, bytes_per_elem)
    dkv = ring_kv_message_bytes(batch, seq_len, n_kv_head, d_head, cp, grad_bytes_per_elem)
    n = 1 if cp > 1 else 0
    return dict(
        forward_collectives=n,
        gathered_bytes=cp * kv,
        forward_bytes_sent=(cp - 1) * kv,
        backward_collectives=n,
        reduce_scatter_bytes=cp * dkv,
        backward_bytes_sent=(cp - 1) * dkv,
    )


def allgather_saved_bytes(
    batch: int,
    seq_len: int,
    n_head: int,
    n_kv_head: int,
    d_head: int,
    cp: int,
    bytes_per_elem: int,
    lse_bytes_per_elem: int | None = None,
) -> int:
    """Bytes all-gather CP keeps for backward on each rank: q and out [b, n_head, s/cp, d_head] and the LSE
    [b, n_head, s/cp] as the ring keeps them, but K and V *gathered*, [2, b, n_kv_head, s, d_head]: the whole
    sequence's, whatever cp is (the ring keeps its own s/cp). The same tensor is what a rank holds while it
    attends; `allgather_gathered_bytes` alone."""
    mine = _query_side_saved_bytes(batch, _local(seq_len, cp), n_head, d_head, bytes_per_elem, lse_bytes_per_elem)
    return mine + allgather_gathered_bytes(batch, seq_len, n_kv_head, d_head, bytes_per_elem)


def allgather_gathered_bytes(batch: int, seq_len: int, n_kv_head: int, d_head: int, bytes_per_elem: int) -> int:
    """The gathered K and V a rank holds: 2 b n_kv_head s d_head B bytes, independent of cp."""
    return 2 * batch * n_kv_head * seq_len * d_head * bytes_per_elem


def allgather_work_per_rank(seq_len: int, cp: int, layout: str, causal: bool = True, what: str = "computed"):
    """Score entries each rank evaluates under all-gather CP (per batch row and head), from its block plan.

    Each chunk i of c tokens a rank holds evaluates i c^2 entries in full and a c x c diagonal block (whole when
    what="computed", c(c+1)/2 when "unmasked"). zigzag: chunks r and 2cp-1-r, so (2cp+1) c^2 computed on every
    rank (the ring's zig-zag evaluates (2cp+2) c^2: its first step's diagonal block holds one fully masked quarter);
    contiguous: chunk r of n = s/cp tokens, (r+1) n^2. Not causal: every rank n s."""
    n = _local(seq_len, cp)
    if what not in ("computed", "unmasked"):
        raise ValueError(f"what={what!r} must be 'computed' or 'unmasked'")
    if not causal:
        return [n * seq_len] * cp
    if layout == "contiguous":
        chunks, c = [(r,) for r in range(cp)], n
    elif layout == "zigzag":
        if n % 2:
            raise ValueError(f"zigzag needs 2*cp={2 * cp} to divide s={seq_len}")
        chunks, c = [(r, 2 * cp - 1 - r) for r in range(cp)], n // 2
    else:
        raise ValueError(f"layout={layout!r} must be 'contiguous' or 'zigzag'")
    diag = c * c if what == "computed" else c * (c + 1) // 2
    return [sum(i * c * c + diag for i in mine) for mine in chunks]


# --------------------------------------------------------------------------------------------------- Ulysses


def ulysses_traffic(
    batch: int, seq_len: int, n_head: int, n_kv_head: int, d_head: int, cp: int, bytes_per_elem: int
) -> dict:
    """Per-rank all-to-all traffic of one Ulysses call.

    Forward: q, k, v in (scatter heads, gather sequence) and out back; each all-to-all keeps 1/cp of its input
    local and sends (cp-1)/cp of it. The local tensors are q and out [b, n_head, s/cp, d_head] (out after
    attention is [b, n_head/cp, s, d_head], the same size) and k, v [b, n_kv_head, s/cp, d_head]. Backward moves
    the same four sizes back (dout in; dq, dk, dv out)."""
    n = _local(seq_len, cp)
    q = batch * n_head * n * d_head * bytes_per_elem
    kv = batch * n_kv_head * n * d_head * bytes_per_elem
    sent = {name: (cp - 1) * size // cp for name, size in (("q", q), ("k", kv), ("v", kv), ("out", q))}
    total = sum(sent.values())
    return dict(
        all_to_alls_forward=4 if cp > 1 else 0,
        all_to_alls_backward=4 if cp > 1 else 0,
        local_bytes=dict(q=q, k=kv, v=kv, out=q),
        sent_bytes=sent,
        forward_bytes_sent=total if cp > 1 else 0,
        backward_bytes_sent=total if cp > 1 else 0,
    )


# --------------------------------------------------------------------------------------------------- causal work


def causal_work_per_rank(seq_len: int, cp: int, layout: str) -> list[int]:
    """Score entries left unmasked by the causal mask in each rank's rows (per batch row and head).

    Token i attends i+1 keys. contiguous: rank r holds tokens [r n, (r+1) n), n = s/cp, so
    sum_{i} (i+1) = r n^2 + n(n+1)/2 -- linear in r. zigzag: rank r holds chunks r and 2cp-1-r of c = s/(2cp)
    tokens; the two chunks' costs add to c (2 cp c + 1) -- the same for every r."""
    if layout == "contiguous":
        n = _local(seq_len, cp)
        return [r * n * n + n * (n + 1) // 2 for r in range(cp)]
    if layout == "zigzag":
        if seq_len % (2 * cp):
            raise ValueError(f"zigzag needs 2*cp={2 * cp} to divide s={seq_len}")
        c = seq_len // (2 * cp)

        def chunk(i):  # sum over tokens i*c .. (i+1)*c - 1 of (token + 1)
            return c * (2 * i * c + c + 1) // 2

        return [chunk(r) + chunk(2 * cp - 1 - r) for r in range(cp)]
    raise ValueError(f"layout={layout!r} must be 'contiguous' or 'zigzag'")


def ring_work_per_rank(seq_len: int, cp: int, layout: str, causal: bool = True, what: str = "computed") -> list[int]:
    """Score entries each rank's ring evaluates (per batch row and head), from the block schedule.

    what="computed": what a dense block kernel evaluates (a causal diagonal block counts whole);
    what="unmasked": only the entries that count (equals `causal_work_per_rank` when causal).
    Non-causal: cp full blocks of n^2 (n = s/cp). Causal contiguous: the diagonal block plus r full blocks from
    earlier ranks (later ranks' blocks are skipped). Causal zigzag: the diagonal block plus cp-1 half blocks."""
    n = _local(seq_len, cp)
    if what not in ("computed", "unmasked"):
        raise ValueError(f"what={what!r} must be 'computed' or 'unmasked'")
    diag = n * n if what == "computed" else n * (n + 1) // 2
    if not causal:
        return [cp * n * n] * cp
    if layout == "contiguous":
        return [diag + r * n * n for r in range(cp)]
    if layout == "zigzag":
        if n % 2:
            raise ValueError(f"zigzag needs 2*cp={2 * cp} to divide s={seq_len}")
        return [diag + (cp - 1) * n * n // 2] * cp
    raise ValueError(f"layout={layout!r} must be 'contiguous' or 'zigzag'")


def balance_ratio(work) -> float:
    """max / min of per-rank work: 1.0 is perfect balance; the slowest rank sets the step time."""
    work = list(work)
    return max(work) / min(work)


def attention_flops(score_entries: int, d_head: int) -> int:
    """Forward FLOPs for that many score entries: q.k and p.v, one multiply-add (2 FLOPs) per d_head each."""
    return 4 * d_head * score_entries
