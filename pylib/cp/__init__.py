"""Context parallelism: every activation split along the sequence over the cp group; attention made whole again
by ring attention (K/V blocks passed around a ring, merged with the log-sum-exp), by Ulysses (all-to-all from
sequence-sharded to head-sharded and back) or by all-gather CP (Llama 3's: K and V all-gathered once).

    shard_sequence(x, dim, cp_rank, cp_size, layout="zigzag")       # this rank's part of x along dim
    unshard_sequence(parts, dim, layout="zigzag")                   # every rank's part -> original order
    sequence_positions(seq_len, cp_rank, cp_size, layout="zigzag")  # global token positions of a rank's rows
    ring_attention(q, k, v, *, group=None, causal=False, layout="zigzag", kernel="auto", ...)
    ulysses_attention(q, k, v, *, group=None, causal=False, layout="zigzag", kernel="auto")
    allgather_attention(q, k, v, *, group=None, causal=False, layout="zigzag", kernel="auto")
        q [b, n_head, s/cp, d_head]; k, v [b, n_kv_head, s/cp, d_head] -> out [b, n_head, s/cp, d_head]
    CPAttentionCore(group, layout=, kind="ring"|"ulysses"|"allgather", causal=)  # core(q, k, v, positions)
    CPAttention.from_full(attn, group=, layout=, kind=); cp_block(block, ...); CPTransformer.from_full(model, ...)
    ring_rounds(events_by_rank)                                     # article A's round table from the trace

Files: layout.py (the shardings), kernels.py (the block kernel: torch, torch's fused SDPA ops, flash-attn),
merge.py (the LSE merge), ring.py (the ring; recorder.py observes its steps), ulysses.py, allgather.py (all-gather
CP and its block plan, `allgather_block_plan`), layer.py (drop-in modules),
rounds.py (article A's round table). The merge-precision experiment is `pylib.experiments.ring_merge_drift`.
"""

from .allgather import AllGatherAttention, GatherBlock, allgather_attention, allgather_block_plan
from .kernels import (
    FlashKernel,
    SDPAKernel,
    TorchKernel,
    block_attention,
    block_attention_backward,
    choose_kernel,
    flash_available,
    kernel_attention,
    select_kernel,
)
from .layer import CPAttention, CPAttentionCore, CPTransformer, cp_block
from .layout import (
    LAYOUTS,
    check_sequence,
    layout_chunks,
    layout_order,
    sequence_positions,
    sequence_shard_spec,
    shard_sequence,
    unshard_sequence,
)
from .merge import merge_all, merge_block
from .recorder import RingRecorder, RingStats, RingStep
from .ring import BlockPlan, Ring, RingAttention, ring_attention, ring_block_plan
from .rounds import format_round_table, ring_rounds
from .ulysses import check_heads, ulysses_attention

__all__ = [
    "LAYOUTS",
    "AllGatherAttention",
    "BlockPlan",
    "CPAttention",
    "CPAttentionCore",
    "CPTransformer",
    "FlashKernel",
    "GatherBlock",
    "Ring",
    "RingAttention",
    "RingRecorder",
    "RingStats",
    "RingStep",
    "SDPAKernel",
    "TorchKernel",
    "allgather_attention",
    "allgather_block_plan",
    "block_attention",
    "block_attention_backward",
    "check_heads",
    "check_sequence",
    "choose_kernel",
    "cp_block",
    "flash_available",
    "format_round_table",
    "kernel_attention",
    "layout_chunks",
    "layout_order",
    "merge_all",
    "merge_block",
    "ring_attention",
    "ring_block_plan",
    "ring_rounds",
    "select_kernel",
    "sequence_positions",
    "sequence_shard_spec",
    "shard_sequence",
    "ulysses_attention",
    "unshard_sequence",
]
