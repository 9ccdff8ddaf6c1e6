"""The TP (and TP+SP) Transformer equals the single-device reference: logits, loss, every gradient, and the
parameters after three AdamW steps, for tp in {1, 2, 4}, MHA and GQA (K/V heads split and replicated), GELU
and SwiGLU, RoPE, causal and full attention. Float64, so agreement is to ~1e-12.

Each launch runs many configurations on the same ranks (a launch costs ~0.1 s, a configuration ~0.2 s)."""

import pytest
import torch
import torch._dynamo  # noqa: F401  an optimizer's first step imports it (~5 s); once here, the forked ranks inherit it
import torch.distributed as dist

from pylib.model import ModelConfig, build_model, random_tokens
from pylib.runtime import collectives as C
from pylib.runtime import launch
from pylib.tp import (
    TPTransformer,
    allreduce_replicated_kv_grads,
    allreduce_sequence_parallel_grads,
    gather_full,
    vocab_parallel_cross_entropy,
)

TOL = 1e-11
B, S = 2, 8


def _cfg(mlp="gelu", kv=None, position="none", causal=True, heads=4, tie=False):
    return ModelConfig(
        vocab_size=32,
        d_model=16,
        n_layers=2,
        n_heads=heads,
        n_kv_heads=kv,
        d_ff=32,
        mlp=mlp,
        position=position,
        causal=causal,
        tie_embeddings=tie,
        dtype="float64",
        seed=3,
    )


# (name, config, sequence_parallel, regather, optimizer steps, the tp sizes it runs at)
ALL, SOME = (1, 2, 4), (1, 2)
CONFIGS = [
    ("mha-gelu", _cfg(), False, False, 3, ALL),
    ("mha-gelu-sp", _cfg(), True, False, 3, ALL),
    ("mha-gelu-sp-regather", _cfg(), True, True, 0, SOME),
    ("mha-swiglu-rope", _cfg("swiglu", position="rope"), False, False, 0, SOME),
    ("mha-swiglu-rope-sp", _cfg("swiglu", position="rope"), True, False, 0, ALL),
    ("mha-gelu-full-attention-sp", _cfg(causal=False), True, False, 0, SOME),
    ("gqa2-gelu-rope", _cfg(kv=2, position="rope"), False, False, 0, ALL),  # tp=4: K/V heads replicated
    ("gqa2-swiglu-sp", _cfg("swiglu", kv=2), True, False, 3, SOME),
    ("gqa2-swiglu-rope-sp-regather", _cfg("swiglu", kv=2, position="rope"), True, True, 3, ALL),
    ("mqa-gelu", _cfg(kv=1), False, False, 3, SOME),
    ("mqa-swiglu-rope-sp", _cfg("swiglu", kv=1, position="rope"), True, False, 0, ALL),
    ("tied-embeddings-sp", _cfg(tie=True), True, False, 3, SOME),  # embedding and LM head share [V/t, h]
]


def _max_err(a: dict, b: dict) -> tuple[float, str]:
    worst = max(a, key=lambda n: (a[n] - b[n]).abs().max().item())
    return (a[worst] - b[worst]).abs().max().item(), worst


def _compare(configs):
    """On every rank: build the reference and the TP model, run both, return the worst differences."""
    out = {}
    for name, cfg, sp, regather, steps, _ in configs:
        ref = build_model(cfg)
        tp = TPTransformer.from_full(ref, sequence_parallel=sp, regather=regather)
        ids, targets = random_tokens(cfg, B, S, seed=1)
        positions = torch.arange(3, 3 + S)  # global positions need not start at 0 (a later chunk of a document)
        local_logits = tp(ids, positions)  # [b, s, V/t]
        full = C.gather_from_group(local_logits.detach(), -1, tp.group)  # for the check only
        row = {"logits": (full - ref(ids, positions)).abs().max().item()}
        loss = vocab_parallel_cross_entropy(local_logits, targets, tp.group).mean()  # what tp.loss computes
        ref_loss = ref.loss(ids, targets, positions)
        row["loss"] = abs(loss.item() - ref_loss.item())
        loss.backward()
        ref_loss.backward()
        tp.finalize_grads()
        grads = gather_full(tp, grads=True)
        row["grads"] = _max_err(grads, {n: p.grad for n, p in ref.named_parameters()})
        row["grad_names"] = sorted(grads) == sorted(n for n, _ in ref.named_parameters())
        if steps:
            opt = torch.optim.AdamW(tp.parameters(), lr=1e-2)
            ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
            for step in range(steps):
                ids, targets = random_tokens(cfg, B, S, seed=10 + step)
                for model, o in ((tp, opt), (ref, ref_opt)):
                    o.zero_grad()
                    model.loss(ids, targets).backward()
                    if model is tp:
                        tp.finalize_grads()
                    o.step()
            row["params_after_steps"] = _max_err(gather_full(tp), dict(ref.named_parameters()))
            row["loss_after_steps"] = abs(tp.loss(ids, targets).item() - ref.loss(ids, targets).item())
        out[name] = row
    return out


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tp_model_matches_reference_logits_loss_grads_and_three_adamw_steps(tp):
    results = launch(_compare, tp, [c for c in CONFIGS if tp in c[-1]], timeout=120)
    for rank, res in enumerate(results):
        for name, row in res.items():
            assert row.pop("grad_names"), f"{name}: gathered gradients do not name every reference parameter"
            for what, val in row.items():
                err, where = val if isinstance(val, tuple) else (val, "")
                assert err < TOL, f"tp={tp} rank {rank} {name}: {what} differs by {err:.3g} {where}"


def _sp_without_layernorm_allreduce(cfg):
    """Run SP, skip the LayerNorm all-reduce: each rank's LN gradient covers only its s/t tokens."""
    ref = build_model(cfg)
    tp = TPTransformer.from_full(ref, sequence_parallel=True)
    ids, targets = random_tokens(cfg, B, S, seed=1)
    tp.loss(ids, targets).backward()
    ref.loss(ids, targets).backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    before = gather_full(tp, grads=True)
    allreduce_sequence_parallel_grads(tp, tp.group)
    after = gather_full(tp, grads=True)
    ln = [n for n in ref_grads if ".ln" in n or n.startswith("ln_f")]
    return (
        {n: (before[n] - ref_grads[n]).abs().max().item() for n in ln},
        {n: (after[n] - ref_grads[n]).abs().max().item() for n in ln},
        {n: (before[n] - ref_grads[n]).abs().max().item() for n in ref_grads if n not in ln},
        # the partial LN gradients of the ranks add up to the reference's
        {n: before[n] for n in ln},
        {n: ref_grads[n] for n in ln},
    )


def test_sequence_parallel_layernorm_grads_are_wrong_until_allreduced_over_tp():
    results = launch(_sp_without_layernorm_allreduce, 2, _cfg())
    for rank, (before, after, others, _, _) in enumerate(results):
        assert all(err > 1e-3 for err in before.values()), f"rank {rank}: an un-reduced LN grad matched: {before}"
        assert all(err < TOL for err in after.values()), f"rank {rank}: {after}"
        assert all(err < TOL for err in others.values()), f"rank {rank}: non-LN grads need no SP reduction: {others}"
    partial0, partial1, ref = results[0][3], results[1][3], results[0][4]
    for name in ref:
        torch.testing.assert_close(partial0[name] + partial1[name], ref[name], rtol=0, atol=TOL)


def _replicated_kv_without_allreduce(cfg):
    ref = build_model(cfg)
    tp = TPTransformer.from_full(ref)
    ids, targets = random_tokens(cfg, B, S, seed=1)
    tp.loss(ids, targets).backward()
    ref.loss(ids, targets).backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    local = {n: p.grad.clone() for n, p in tp.named_parameters() if getattr(p, "kv_replicas", 1) > 1}
    before = gather_full(tp, grads=True)
    allreduce_replicated_kv_grads(tp, tp.group)
    after = gather_full(tp, grads=True)
    kv = [n for n in ref_grads if "k_proj" in n or "v_proj" in n]
    return (
        sorted(local),
        {n: (before[n] - ref_grads[n]).abs().max().item() for n in kv},
        {n: (after[n] - ref_grads[n]).abs().max().item() for n in ref_grads},
        tp.layers[0].attn.layout,
    )


def test_replicated_kv_heads_need_their_gradients_summed_over_the_sharing_ranks():
    # n_kv_head = 2, tp = 4: ranks {0, 1} hold K/V head 0, ranks {2, 3} head 1
    results = launch(_replicated_kv_without_allreduce, 4, _cfg(kv=2))
    for rank, (replicated, before, after, layout) in enumerate(results):
        assert layout.kv_first == rank // 2 and layout.kv_count == 1 and layout.kv_replicas == 2
        assert replicated == sorted(f"layers.{i}.attn.{p}.weight" for i in range(2) for p in ("k_proj", "v_proj"))
        assert all(err > 1e-3 for err in before.values()), f"rank {rank}: {before}"
        assert all(err < TOL for err in after.values()), f"rank {rank}: {after}"


def test_kv_heads_are_split_when_tp_divides_them_and_nothing_is_reduced():
    def run():
        tp = TPTransformer.from_full(build_model(_cfg(kv=2)))
        return tp.layers[0].attn.layout, [n for n, p in tp.named_parameters() if getattr(p, "kv_replicas", 1) > 1]

    for rank, (layout, replicated) in enumerate(launch(run, 2)):
        assert (layout.q_first, layout.q_count, layout.kv_first, layout.kv_count) == (2 * rank, 2, rank, 1)
        assert layout.kv_replicas == 1 and replicated == []


def _loss_and_grad_with_core(cfg):
    """A replacement core with the reference signature is used as given (here: a wrapper that records calls)."""
    from pylib.tp import LocalAttention

    calls = []
    base = LocalAttention(cfg.causal)

    def core(q, k, v, positions):
        calls.append((tuple(q.shape), tuple(k.shape), positions.tolist()))
        return base(q, k, v, positions)

    ref = build_model(cfg)
    tp = TPTransformer.from_full(ref, core=core)
    ids, targets = random_tokens(cfg, B, S)
    positions = torch.arange(5, 5 + S)
    err = abs(tp.loss(ids, targets, positions).item() - ref.loss(ids, targets, positions).item())
    return calls, err, dist.get_world_size()


def test_attention_core_is_replaceable_and_sees_local_heads_and_global_positions():
    for calls, err, t in launch(_loss_and_grad_with_core, 2, _cfg(kv=2, position="rope")):
        assert err < TOL
        assert calls == [((B, 4 // t, S, 4), (B, 2 // t, S, 4), list(range(5, 5 + S)))] * 2
