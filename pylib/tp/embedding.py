"""Vocab-parallel embedding: rank r owns the rows of token ids [r*V/t, (r+1)*V/t) of the table [V, h].

Every rank sees all ids [b, s]. It looks up the ids it owns, writes zeros for the others, and the sum over the
TP group puts every token's row in place (exactly one rank contributed a non-zero row for it):

    TP only   all-reduce      -> x [b, s, h] on every rank        backward: identity
    TP + SP   reduce-scatter  -> x [b, s/t, h], my sequence slice  backward: all-gather

The gradient of the table is local: rank r's rows receive gradient only from the tokens it owns.

Padding (Megatron-LM's `--make-vocab-size-divisible-by`, `pylib.plan.vocab`): with make_vocab_size_divisible_by=d
the table is first padded with zero rows to V_p = `padded_vocab_size(V, t, d)`, a multiple of d*t, and rank r owns
ids [r*V_p/t, (r+1)*V_p/t). Ids in [V, V_p) are no token: `check_tokens` refuses them, so the padded rows are never
looked up and their gradient stays zero. d=None (the default) is the exact split, and t must divide V.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from pylib.model.data import check_tokens
from pylib.plan.vocab import padded_vocab_size
from pylib.runtime import ShardSpec, require_divisible
from pylib.runtime import collectives as C
from pylib.runtime.tracer import current_tag

from .regions import leave_tp_region


class VocabParallelEmbedding(nn.Module):
    """ids [b, s] (the same on every TP rank) -> x [b, s, h] (TP) or [b, s/t, h] (SP). Holds weight [V_p/t, h]
    (V_p = V unless the vocabulary is padded)."""

    def __init__(self, weight: torch.Tensor, vocab_size: int, group, *, sequence_parallel: bool = False):
        super().__init__()
        self.group = C.resolve_group(group)
        self.weight = nn.Parameter(weight.detach().clone().contiguous())
        self.vocab_size = vocab_size  # V, the tokenizer's; ids at or past it are refused
        per_rank = weight.shape[0]
        self.padded_vocab_size = per_rank * self.group.size  # V_p >= V
        self.vocab_start, self.vocab_end = self.group.rank * per_rank, (self.group.rank + 1) * per_rank
        self.sequence_parallel = sequence_parallel

    @classmethod
    def from_full(
        cls,
        embedding: nn.Embedding,
        *,
        group=None,
        sequence_parallel: bool = False,
        make_vocab_size_divisible_by: int | None = None,
    ):
        """Keep this rank's rows of the table, padded first to a multiple of make_vocab_size_divisible_by * t."""
        g = C.resolve_group(group)
        V = embedding.weight.shape[0]
        table = pad_vocab_rows(embedding.weight, padded_vocab_size(V, g.size, make_vocab_size_divisible_by))
        Vp = table.shape[0]
        require_divisible(Vp, g.size, "tp", "vocab_size")
        rows = table[g.rank * Vp // g.size : (g.rank + 1) * Vp // g.size]
        return cls(rows, V, g, sequence_parallel=sequence_parallel)

    def partial(self, ids: torch.Tensor) -> torch.Tensor:
        """This rank's contribution [b, s, h]: its own rows for the ids it owns, zeros elsewhere. An id no rank
        owns (outside [0, V)) would be zeros on every rank, a silent wrong row: `check_tokens` refuses it first."""
        check_tokens(ids, self.vocab_size, "ids")
        mine = (ids >= self.vocab_start) & (ids < self.vocab_end)
        local_ids = torch.where(mine, ids - self.vocab_start, torch.zeros_like(ids))
        return F.embedding(local_ids, self.weight).masked_fill(~mine.unsqueeze(-1), 0.0)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return leave_tp_region(self.partial(ids), self.group, self.sequence_parallel, tag=current_tag())

    def shard_specs(self, prefix: str = "") -> list[ShardSpec]:
        note = f"rank r owns token ids [r*V/t, (r+1)*V/t); here [{self.vocab_start}, {self.vocab_end})"
        if self.padded_vocab_size != self.vocab_size:
            note += f"; V={self.vocab_size} padded to {self.padded_vocab_size}"
        full = (self.vocab_size, self.weight.shape[1])
        return [ShardSpec(prefix + "weight", "tp", 0, "vocab", full, tuple(self.weight.shape), note)]

    def extra_repr(self) -> str:
        padded = f" (padded to {self.padded_vocab_size})" if self.padded_vocab_size != self.vocab_size else ""
        return f"vocab=[{self.vocab_start}, {self.vocab_end}) of {self.vocab_size}{padded}, h={self.weight.shape[1]}"


def pad_vocab_rows(weight: torch.Tensor, padded: int) -> torch.Tensor:
    """weight [V, h] -> [padded, h]: the same rows, then padded - V rows of zeros (weight itself when padded = V).
    The embedding never looks the zero rows up; the LM head's zero rows give logits that are masked to -inf."""
    V = weight.shape[0]
    if padded == V:
        return weight
    return torch.cat([weight, weight.new_zeros(padded - V, *weight.shape[1:])])
