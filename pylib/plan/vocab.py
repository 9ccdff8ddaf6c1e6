"""Vocabulary padding, as Megatron-LM pads it: the one rule every TP module and formula asks.

    padded_vocab_size(V, tp, divisible_by)   the smallest multiple of divisible_by * tp that is >= V

Megatron-LM pads the tokenizer's V up to a multiple of `make_vocab_size_divisible_by * tensor_model_parallel_size`
(`vocab_size_with_padding` in megatron/core/tokenizers/utils/build_tokenizer.py, default 128 from
`--make-vocab-size-divisible-by` in megatron/training/arguments.py, both at d98e8a6), so that any V splits over
any t and each rank's slice of the embedding and the LM head is a multiple of 128 rows. The padded rows are ids no
tokenizer emits: `pylib.tp` never looks them up, masks their logits to -inf (no probability, no gradient) and
refuses them as targets, so the loss and every gradient equal the unpadded model's.

`divisible_by=None` is pylib's exact split (no padding, t must divide V). Each argument is checked
(`pylib.plan.fields`): a bad value raises naming it.
"""

from __future__ import annotations

from .fields import integer

# Megatron-LM's default for --make-vocab-size-divisible-by (megatron/training/arguments.py at d98e8a6)
MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int | None = MAKE_VOCAB_SIZE_DIVISIBLE_BY) -> int:
    """V rounded up to a multiple of divisible_by * tp (Megatron's rule); V itself when divisible_by is None.

    padded_vocab_size(128256, 8) = 129024: Llama 3's tokenizer at t = 8, 768 rows of padding."""
    vocab_size = integer("padded_vocab_size", "vocab_size", vocab_size, low=1)
    tp = integer("padded_vocab_size", "tp", tp, low=1)
    divisible_by = integer("padded_vocab_size", "make_vocab_size_divisible_by", divisible_by, low=1, none=True)
    if divisible_by is None:
        return vocab_size
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple
