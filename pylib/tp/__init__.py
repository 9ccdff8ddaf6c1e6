"""Tensor parallelism, and sequence parallelism as its switch (Megatron-LM, Korthikanti et al. 2022).

Every module is built from the reference model's full module (`from_full`) and keeps this rank's slice; each
says in data how it holds its tensors (`shard_specs()` -> `pylib.runtime.ShardSpec`).

    regions.py        enter / leave the TP region: copy / all-reduce, or all-gather / reduce-scatter under SP
    linear.py         ColumnParallelLinear, RowParallelLinear
    fp8.py            Fp8ColumnParallelLinear, Fp8RowParallelLinear: the same shards with their GEMMs in FP8
    embedding.py      VocabParallelEmbedding
    cross_entropy.py  vocab_parallel_cross_entropy (the full logits are never formed)
    attention.py      TPAttention (heads split; GQA K/V heads split or replicated; replaceable core)
    mlp.py            TPMLP (GELU, SwiGLU with gate and up paired)
    transformer.py    TPBlock, TPTransformer
    grads.py          allreduce_sequence_parallel_grads, allreduce_replicated_kv_grads, finalize_grads
    state.py          gather_full: shards back to the reference's names and shapes
    dtensor.py        dtensor_block: PyTorch's own TP of a reference block, to cross-check against (untraced)
"""

from .attention import HeadLayout, LocalAttention, TPAttention, head_layout
from .cross_entropy import vocab_parallel_cross_entropy
from .embedding import VocabParallelEmbedding
from .grads import (
    allreduce_replicated_kv_grads,
    allreduce_sequence_parallel_grads,
    finalize_grads,
    mark_sequence_parallel,
    sequence_parallel_params,
)
from .linear import ColumnParallelLinear, RowParallelLinear
from .mlp import TPMLP
from .regions import (
    check_sequence_divisible,
    column_parallel_linears,
    enter_tp_region,
    gather_from_sequence_parallel_region,
    leave_tp_region,
    scatter_to_sequence_parallel_region,
)
from .state import gather_full
from .transformer import TPBlock, TPTransformer, check_tp_config

__all__ = [
    "TPMLP",
    "ColumnParallelLinear",
    "HeadLayout",
    "LocalAttention",
    "RowParallelLinear",
    "TPAttention",
    "TPBlock",
    "TPTransformer",
    "VocabParallelEmbedding",
    "allreduce_replicated_kv_grads",
    "allreduce_sequence_parallel_grads",
    "check_sequence_divisible",
    "check_tp_config",
    "column_parallel_linears",
    "enter_tp_region",
    "finalize_grads",
    "gather_from_sequence_parallel_region",
    "gather_full",
    "head_layout",
    "leave_tp_region",
    "mark_sequence_parallel",
    "scatter_to_sequence_parallel_region",
    "sequence_parallel_params",
    "vocab_parallel_cross_entropy",
]
