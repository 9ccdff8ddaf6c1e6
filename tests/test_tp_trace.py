"""What TP and SP put on the wire equals the textbook formula, byte for byte (pylib.analysis.tp against the tracer).

Per layer: TP = 2 all-reduces of b*s*h*dtype forward and 2 backward; SP = all-gathers + reduce-scatters of the same
payloads, and since a ring all-reduce moves 2(t-1)/t*S and an all-gather or reduce-scatter (t-1)/t*S, SP moves
exactly what TP moves (AR = AG + RS). The whole model adds the vocab-parallel embedding, LM head and
cross-entropy collectives and the gradient reductions; each is listed by the formula too."""

import collections

import pytest
import torch.distributed as dist

from pylib.analysis.tp import Collective, layer_collectives, logits_gather, model_collectives
from pylib.model import ModelConfig, build_model, random_hidden, random_tokens, torch_dtype
from pylib.plan.presets import tiny
from pylib.runtime import launch, tag, trace
from pylib.tp import TPBlock, TPTransformer, scatter_to_sequence_parallel_region

DTYPE_BYTES = {"float32": 4, "float64": 8}

# (b, s, h, n_heads, d_ff, dtype)
SIZES = [(2, 8, 16, 4, 32, "float64"), (1, 16, 32, 8, 48, "float32"), (3, 4, 8, 4, 16, "float64")]


def _layer_events(cases):
    t = dist.get_world_size()
    out = []
    for b, s, h, heads, ff, dtype, sp, regather in cases:
        cfg = ModelConfig(d_model=h, n_heads=heads, d_ff=ff, dtype=dtype, n_layers=1)
        block = TPBlock.from_full(build_model(cfg).layers[0], sequence_parallel=sp, regather=regather)
        x = random_hidden(b, s, h, dtype=torch_dtype(cfg.dtype))
        x = (scatter_to_sequence_parallel_region(x) if sp else x).detach().requires_grad_()
        with trace() as tr:
            block(x).square().sum().backward()
        events = [Collective(e.phase, e.op, e.tag, e.payload_bytes, e.bytes_sent) for e in tr.events]
        assert all(e.group_size == t and e.dtype == dtype for e in tr.events)
        out.append(events)
    return out


CASES = [(*size, sp, regather) for size in SIZES for sp, regather in ((False, False), (True, False), (True, True))]


@pytest.mark.parametrize("t", [2, pytest.param(4, marks=pytest.mark.slow)])  # t=4: the same code, 1 s more
def test_one_layer_issues_exactly_the_textbook_collectives(t):
    for rank_events in launch(_layer_events, t, CASES):
        for (b, s, h, _, _, dtype, sp, regather), events in zip(CASES, rank_events):
            e = DTYPE_BYTES[dtype]
            expected = layer_collectives(b, s, h, t, e, sequence_parallel=sp, regather=regather)
            assert events == expected, f"b={b} s={s} h={h} {dtype} sp={sp} regather={regather}"
            assert all(c.payload_bytes == b * s * h * e for c in events)  # every payload is b*s*h*dtype


@pytest.mark.parametrize("t", [2, pytest.param(4, marks=pytest.mark.slow)])  # t=4: the same code, 1 s more
def test_sequence_parallel_moves_exactly_what_tensor_parallel_moves(t):
    """Measured, not just formula: per phase, the bytes SP's all-gathers and reduce-scatters send equal the
    bytes TP's all-reduces send (AR = AG + RS); the regather adds one all-gather per region entry in backward."""
    for rank_events in launch(_layer_events, t, CASES):
        by_case = {case: events for case, events in zip(CASES, rank_events)}
        for b, s, h, heads, ff, dtype in SIZES:
            tp = by_case[(b, s, h, heads, ff, dtype, False, False)]
            sp = by_case[(b, s, h, heads, ff, dtype, True, False)]
            rg = by_case[(b, s, h, heads, ff, dtype, True, True)]
            S = b * s * h * DTYPE_BYTES[dtype]
            for phase in ("forward", "backward"):
                sent = {
                    name: sum(c.bytes_sent for c in ev if c.phase == phase)
                    for name, ev in (("tp", tp), ("sp", sp), ("rg", rg))
                }
                assert sent["tp"] == sent["sp"] == 2 * 2 * (t - 1) * S // t
                extra = 2 * (t - 1) * S // t if phase == "backward" else 0
                assert sent["rg"] == sent["sp"] + extra
            assert collections.Counter(c.op for c in tp) == {"all_reduce": 4}
            assert collections.Counter(c.op for c in sp) == {"all_gather": 4, "reduce_scatter": 4}


def _model_events(cases):
    out = []
    for cfg, b, s, sp, regather in cases:
        model = TPTransformer.from_full(build_model(cfg), sequence_parallel=sp, regather=regather)
        ids, targets = random_tokens(cfg, b, s)
        with trace() as tr, tag("step"):
            model.loss(ids, targets).backward()
            model.finalize_grads()
        out.append(
            [Collective(e.phase, e.op, e.tag.removeprefix("step."), e.payload_bytes, e.bytes_sent) for e in tr.events]
        )
    return out


def _model_cases():
    base = dict(vocab_size=32, d_model=16, n_layers=2, n_heads=4, d_ff=32)
    return [
        (ModelConfig(**base, dtype="float64"), 2, 8, False, False),
        (ModelConfig(**base, dtype="float64"), 2, 8, True, False),
        (ModelConfig(**base, dtype="float32", n_kv_heads=1, mlp="swiglu"), 1, 12, True, True),
        (ModelConfig(**base, dtype="float32", n_kv_heads=2, position="rope"), 3, 4, False, False),
    ]


@pytest.mark.parametrize("t", [2, pytest.param(4, marks=pytest.mark.slow)])  # t=4: the same code, 1 s more
def test_a_training_step_issues_the_embedding_head_loss_and_gradient_collectives_of_the_formula(t):
    cases = [c for c in _model_cases() if not c[3] or c[2] % t == 0]
    for rank_events in launch(_model_events, t, cases):
        for (cfg, b, s, sp, regather), events in zip(cases, rank_events):
            expected = model_collectives(cfg, b, s, t, sequence_parallel=sp, regather=regather)
            assert collections.Counter(events) == collections.Counter(expected), (cfg, sp, regather)
            # the layers' ops come in layer order forward and reverse layer order backward
            fwd = [c.where.split(".")[1] for c in events if c.phase == "forward" and c.where.startswith("layers")]
            bwd = [c.where.split(".")[1] for c in events if c.phase == "backward" and c.where.startswith("layers")]
            assert fwd == sorted(fwd) and bwd == sorted(bwd, reverse=True)


def test_vocab_parallel_loss_moves_b_s_numbers_where_gathering_logits_would_move_b_s_V():
    cfg = tiny().with_(vocab_size=64, n_layers=1)
    t, b, s = 4, 2, 8
    events = launch(_model_events, t, [(cfg, b, s, False, False)])[0][0]
    ce = [c for c in events if c.where.startswith("cross_entropy")]
    assert [c.where for c in ce] == ["cross_entropy.max", "cross_entropy.target_logit", "cross_entropy.sum_exp"]
    assert sum(c.payload_bytes for c in ce) == 3 * b * s * 8
    assert sum(c.bytes_sent for c in ce) == 3 * 2 * (t - 1) * b * s * 8 // t
    # gathering the logits instead would carry b*s*V numbers: V/3 times the payload, and since an all-reduce sends
    # 2(t-1)/t of its payload where an all-gather sends (t-1)/t, V/6 times the bytes on the wire
    assert 3 * (b * s * cfg.vocab_size * 8) == cfg.vocab_size * sum(c.payload_bytes for c in ce)
    gather = logits_gather(b, s, cfg.vocab_size, t, 8)
    assert gather.bytes_sent == (t - 1) * b * s * cfg.vocab_size * 8 // t
    assert 6 * gather.bytes_sent == cfg.vocab_size * sum(c.bytes_sent for c in ce)
