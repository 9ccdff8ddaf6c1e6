"""Vocabulary padding as Megatron-LM pads it (`pylib.plan.vocab`): V rounded up to a multiple of d * t, the padded
ids never sampled and never a target, and the TP model with a V that t does not divide equal to the unpadded
single-device reference in float64 (logits, loss, every gradient, parameters after AdamW steps)."""

import pytest
import torch
import torch._dynamo  # noqa: F401  an optimizer's first step imports it; once here, the forked ranks inherit it

from pylib.analysis.tp import cross_entropy_collectives, logits_gather, model_collectives
from pylib.model import ModelConfig, TokenError, build_model, random_tokens
from pylib.plan.vocab import MAKE_VOCAB_SIZE_DIVISIBLE_BY, padded_vocab_size
from pylib.runtime import collectives as C
from pylib.runtime import launch, tag, trace
from pylib.tp import TPTransformer, VocabParallelEmbedding, check_tp_config, gather_full, vocab_parallel_cross_entropy
from tests.conftest import FLOAT64_ATOL

B, S = 2, 8


def _cfg(tie=False, vocab=37):
    """V = 37, a prime: no t > 1 divides it, so without padding TP refuses it."""
    return ModelConfig(
        vocab_size=vocab, d_model=24, n_layers=1, n_heads=12, d_ff=48, tie_embeddings=tie, dtype="float64", seed=3
    )


def test_padded_vocab_size_is_megatrons_rule_on_real_tokenizers():
    assert MAKE_VOCAB_SIZE_DIVISIBLE_BY == 128  # --make-vocab-size-divisible-by's default at d98e8a6
    assert padded_vocab_size(128256, 8) == 129024  # Llama 3 at t = 8: 768 padded rows
    assert padded_vocab_size(128256, 1) == 128256  # a multiple of 128 already
    assert padded_vocab_size(32000, 8) == 32768  # Llama 2 at t = 8
    assert padded_vocab_size(50257, 1) == 50304  # GPT-2, Megatron's "padded vocab (size: 50257) with 47 dummy tokens"
    assert padded_vocab_size(50257, 2) == 50432
    assert padded_vocab_size(37, 4, None) == 37  # no padding
    for V in range(1, 300):
        for t in (1, 2, 3, 8):
            for d in (1, 8, 128):
                p = padded_vocab_size(V, t, d)
                assert p % (d * t) == 0 and V <= p < V + d * t


@pytest.mark.parametrize(
    "args, field",
    [
        ((0, 8), "vocab_size=0"),
        ((100, 0), "tp=0"),
        ((100, 2, 0), "make_vocab_size_divisible_by=0"),
        ((100, 2, -128), "make_vocab_size_divisible_by=-128"),
        ((100, 2, 1.5), "make_vocab_size_divisible_by=1.5"),
        ((100, 2, True), "make_vocab_size_divisible_by=True"),
        ((100.0, 2), "vocab_size=100.0"),
    ],
)
def test_a_bad_padding_value_is_refused_naming_the_field(args, field):
    with pytest.raises((ValueError, TypeError), match=f"padded_vocab_size: {field}"):
        padded_vocab_size(*args)


def test_without_padding_t_must_divide_v_and_with_it_any_v_splits():
    with pytest.raises(ValueError, match="tp=2 does not divide vocab_size=37"):
        check_tp_config(_cfg(), 2)
    for t in (2, 3, 4):
        check_tp_config(_cfg(), t, make_vocab_size_divisible_by=1)


def _largest(x: torch.Tensor) -> float:
    """max |x|, 0 for an empty tensor (a rank with no padded rows)."""
    return x.detach().abs().max().item() if x.numel() else 0.0


def _compare(d, tie, sp, steps):
    """On every rank: the padded TP model against the unpadded reference; the worst differences and the padding."""
    cfg = _cfg(tie)
    ref = build_model(cfg)
    tp = TPTransformer.from_full(ref, sequence_parallel=sp, make_vocab_size_divisible_by=d)
    ids, targets = random_tokens(cfg, B, S, seed=1)
    local = tp(ids)
    everything = C.gather_from_group(local.detach(), -1, tp.group)  # [b, s, V_p], padded columns included
    out = {
        "width": local.shape[-1],
        "padded_prob": torch.softmax(everything, -1)[..., cfg.vocab_size :].abs().max().item(),
        "logits": (tp.full_logits(ids) - ref(ids)).abs().max().item(),
    }
    loss, ref_loss = tp.loss(ids, targets), ref.loss(ids, targets)
    out["loss"] = abs(loss.item() - ref_loss.item())
    loss.backward()
    ref_loss.backward()
    tp.finalize_grads()
    grads = gather_full(tp, grads=True)
    assert sorted(grads) == sorted(n for n, _ in ref.named_parameters())
    out["grads"] = max((grads[n] - p.grad).abs().max().item() for n, p in ref.named_parameters())
    start = tp.group.rank * local.shape[-1]
    pad = slice(max(cfg.vocab_size - start, 0), None)  # this rank's padded rows
    out["padded_grad"] = max(_largest(tp.embed.weight.grad[pad]), _largest(tp.lm_head.weight.grad[pad]))
    if steps:
        opt = torch.optim.AdamW(tp.parameters(), lr=1e-2, weight_decay=0.1)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
        for step in range(steps):
            ids, targets = random_tokens(cfg, B, S, seed=10 + step)
            for model, o in ((tp, opt), (ref, ref_opt)):
                o.zero_grad()
                model.loss(ids, targets).backward()
                if model is tp:
                    tp.finalize_grads()
                o.step()
        params = gather_full(tp)
        out["params"] = max((params[n] - p).abs().max().item() for n, p in ref.named_parameters())
        out["padded_rows"] = max(_largest(tp.embed.weight[pad]), _largest(tp.lm_head.weight[pad]))
    return out


def _check(results, t, d, V=37):
    for rank, row in enumerate(results):
        assert row.pop("width") * t == padded_vocab_size(V, t, d)
        for what, err in row.items():
            assert err <= FLOAT64_ATOL, f"t={t} d={d} rank {rank}: {what} = {err:.3g}"


def test_padded_tp_model_equals_the_unpadded_reference_and_never_uses_a_padded_id():
    # t = 2, d = 8: V = 37 -> 48, rank 1 holds ids 24..47, of which 37..47 are padding
    _check(launch(_compare, 2, 8, False, True, 0), 2, 8)


@pytest.mark.slow
@pytest.mark.parametrize("t", [2, 3, 4])
@pytest.mark.parametrize("d", [1, 8, MAKE_VOCAB_SIZE_DIVISIBLE_BY])  # d = 128: ranks past the first hold only padding
def test_padded_tp_model_equals_the_reference_tied_and_untied_with_and_without_sp_after_adamw(t, d):
    for tie in (False, True):
        for sp in (False, True):
            if sp and S % t:
                continue
            _check(launch(_compare, t, d, tie, sp, 2), t, d)


def _targets_at_padding(d):
    cfg = _cfg()
    tp = TPTransformer.from_full(build_model(cfg), make_vocab_size_divisible_by=d)
    ids, targets = random_tokens(cfg, B, S, seed=1)
    refusals = []
    for bad in (cfg.vocab_size, padded_vocab_size(cfg.vocab_size, 2, d) - 1):
        for what, call in (("target", lambda x: tp.loss(ids, x)), ("id", lambda x: tp(x))):
            try:
                call(torch.full_like(targets, bad))
            except TokenError as e:
                refusals.append((what, bad, str(e)))
    return refusals


def test_a_padded_id_is_refused_as_a_token_and_as_a_target():
    for refusals in launch(_targets_at_padding, 2, 8):
        assert [(w, v) for w, v, _ in refusals] == [("target", 37), ("id", 37), ("target", 47), ("id", 47)]
        assert all("37" in msg for _, _, msg in refusals)  # each message names V


def _wider_vocab_size():
    logits, targets = torch.zeros(1, 2, 5, dtype=torch.float64), torch.zeros(1, 2, dtype=torch.long)
    try:
        vocab_parallel_cross_entropy(logits, targets, None, vocab_size=11)
    except ValueError as e:
        return str(e)


def test_the_loss_refuses_a_vocab_size_wider_than_the_logits():
    message = "vocab_size=11 must be in [1, 10], the 2 ranks' logits' width 5 times 2"
    assert launch(_wider_vocab_size, 2) == [message] * 2


def _embedding_alone():
    emb = torch.nn.Embedding(37, 4, dtype=torch.float64)
    one = VocabParallelEmbedding.from_full(emb, make_vocab_size_divisible_by=8)
    assert (one.vocab_size, one.padded_vocab_size, tuple(one.weight.shape)) == (37, 48, (24, 4))
    assert "padded to 48" in one.shard_specs()[0].note
    return emb.weight.detach(), one.weight.detach()


def test_the_embedding_alone_pads_its_table_with_zero_rows():
    (full, rows0), (_, rows1) = launch(_embedding_alone, 2)
    assert torch.equal(torch.cat([rows0, rows1])[:37], full) and not rows1[37 - 24 :].any()


def _traffic(d):
    cfg = _cfg()
    tp = TPTransformer.from_full(build_model(cfg), make_vocab_size_divisible_by=d)
    ids, targets = random_tokens(cfg, B, S, seed=1)
    with trace() as tr:
        with tag("step"):
            tp.loss(ids, targets).backward()
            tp.finalize_grads()
        tp.full_logits(ids)
    return [(e.tag, e.op, e.payload_bytes, e.bytes_sent) for e in tr.events]


def test_padding_leaves_the_step_traffic_alone_and_the_logits_gather_moves_the_padded_v():
    t, d, e = 2, 8, 8
    events = launch(_traffic, t, d)[0]
    step = sorted((w.removeprefix("step."), op, p, s) for w, op, p, s in events if w.startswith("step."))
    assert step == sorted((c.where, c.op, c.payload_bytes, c.bytes_sent) for c in model_collectives(_cfg(), B, S, t))
    gather = [(p, s) for w, op, p, s in events if w == "full_logits"]
    formula = logits_gather(B, S, 37, t, e, d)
    assert gather == [(formula.payload_bytes, formula.bytes_sent)] and formula.payload_bytes == B * S * 48 * e
    # on the wire the loss's three all-reduces send V_p/6 times less than the gather (here 48/6 = 8)
    ce = sum(c.bytes_sent for c in cross_entropy_collectives(B, S, t, e))
    assert formula.bytes_sent * 6 == ce * padded_vocab_size(37, t, d)
