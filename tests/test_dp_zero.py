"""ZeRO-3 frees what it gathers; tied parameters go to the root unit; ZeRO-2 holds only its slice; bad requests
are refused with the numbers."""

import pytest
import torch
import torch.distributed as dist

from pylib.analysis.dp import traffic_by_op
from pylib.dp import FullyShardedDataParallel, ZeroDataParallel, assemble, default_units, micro_batch
from pylib.model import build_model, random_tokens, saved_activations
from pylib.plan.presets import tiny_odd
from pylib.runtime import launch, trace
from tests.conftest import FLOAT64_RTOL, assert_float64_close

CFG = tiny_odd()
BATCH, SEQ = 8, 8


def _forward_then_backward():
    rank, d = dist.get_rank(), dist.get_world_size()
    model = build_model(CFG)
    fsdp = FullyShardedDataParallel(model)
    ids, targets = random_tokens(CFG, BATCH, SEQ, seed=0)
    ids, targets = micro_batch(ids, rank, d), micro_batch(targets, rank, d)
    saved = []

    def pack(t):
        saved.append(t.untyped_storage())  # the storage object itself: its size is read after forward
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model.loss(ids, targets)
    shards = sum(p.numel() * p.element_size() for p in fsdp.parameters())
    resident = fsdp.resident_param_bytes()
    live = {s.data_ptr(): s.nbytes() for s in saved if s.nbytes()}
    meta = model.layers[0].attn.q_proj.weight.is_meta
    loss.backward()
    fsdp.finish_gradient_sync()
    specs = [(sp.name, sp.kind, sp.axis, sp.local_shape[0]) for sp in fsdp.shard_specs()]
    return dict(
        specs=specs,
        shards=shards,
        resident=resident,
        saved_after_forward=sum(live.values()),
        meta=meta,
        after_backward=fsdp.resident_param_bytes(),
        grads=fsdp.gradient_shards(),
        layouts=fsdp.layouts,
        timeline=list(fsdp.timeline),
        unit_bytes=fsdp.unit_bytes(),
        peak=fsdp.peak_param_bytes,
    )


def test_zero3_keeps_no_full_parameter_between_forward_and_backward():
    d = 2
    results = launch(_forward_then_backward, d)
    ref = build_model(CFG)
    ids, targets = random_tokens(CFG, BATCH, SEQ, seed=0)
    with saved_activations(exclude=ref.parameters()) as acts:
        ref.loss(micro_batch(ids, 0, d), micro_batch(targets, 0, d))
    for r in results:
        assert r["resident"] == r["shards"] == r["after_backward"]
        assert r["meta"]  # module attributes are shape-only between uses
    # the sharding specs say which elements of each parameter each rank holds: together, every element once
    held = {}
    for r in results:
        for name, kind, axis, n in r["specs"]:
            assert (kind, axis) == ("zero", "world")
            held[name] = held.get(name, 0) + n
    assert held == {n: p.numel() for n, p in ref.named_parameters()}
    # what autograd keeps alive after forward is exactly the activations: every saved view of a full parameter
    # now points at an emptied storage
    assert results[0]["saved_after_forward"] == acts.bytes
    # and backward still found the parameters it needed: the gradient is right
    full = build_model(CFG)
    full.loss(ids, targets).backward()
    grads = assemble(results[0]["layouts"], [r["grads"] for r in results])
    for n, p in full.named_parameters():
        assert_float64_close(grads[n], p.grad, rtol=FLOAT64_RTOL)


def test_zero3_timeline_gathers_each_unit_before_use_and_frees_it_after():
    from pylib.analysis.dp import zero3_peak_param_bytes

    for r in launch(_forward_then_backward, 2):
        units = list(r["unit_bytes"])
        whats = [what for _, _, what in r["timeline"]]
        forward = [w for u in units for w in (f"gather {u}", f"free {u}")]
        backward = [w for u in reversed(units) for w in (f"gather {u} (backward)", f"free {u} (backward)")]
        assert whats == ["start", *forward, *backward]
        for (_, held, what), (_, before, _) in zip(r["timeline"][1:], r["timeline"]):
            unit = what.split()[1]
            if what.startswith("gather"):
                assert held == r["shards"] + r["unit_bytes"][unit]  # exactly this unit in full, on top of the shards
            else:
                assert held == r["shards"] and before - held == r["unit_bytes"][unit]
        peak = max(held for _, held, _ in r["timeline"])
        assert peak == r["peak"] == zero3_peak_param_bytes(r["shards"], list(r["unit_bytes"].values()))


def _tied(units):
    rank, d = dist.get_rank(), dist.get_world_size()
    cfg = CFG.with_(tie_embeddings=True)
    model = build_model(cfg)
    fsdp = FullyShardedDataParallel(model, units=units)
    ids, targets = random_tokens(cfg, BATCH, SEQ, seed=0)
    with trace() as tr:
        model.loss(micro_batch(ids, rank, d), micro_batch(targets, rank, d)).backward()
        fsdp.finish_gradient_sync()
    return fsdp.layouts, fsdp.gradient_shards(), [e.as_dict() for e in tr.events]


def test_tied_embedding_shared_by_two_units_is_refused():
    with pytest.raises(Exception, match=r"embed.weight, lm_head.weight is shared by units \['embed', 'lm_head'\]"):
        launch(_tied, 2, None)


def test_tied_embedding_left_to_the_root_unit_trains_like_the_reference():
    d = 2
    cfg = CFG.with_(tie_embeddings=True)
    units = [u for u in default_units(build_model(cfg)) if u not in ("embed", "lm_head")]
    results = launch(_tied, d, units)
    layouts = results[0][0]
    assert [lay.key for lay in layouts] == ["root", "layers.0", "layers.1", "ln_f"]
    assert [e.name for e in layouts[0].entries] == ["embed.weight"]  # one tensor, two homes
    ref = build_model(cfg)
    ids, targets = random_tokens(cfg, BATCH, SEQ, seed=0)
    ref.loss(ids, targets).backward()
    grads = assemble(layouts, [r[1] for r in results])
    for n, p in ref.named_parameters():
        assert_float64_close(grads[n], p.grad, rtol=FLOAT64_RTOL)
    psi = sum(lay.padded_bytes for lay in layouts)
    for _, _, events in results:
        sent = {}
        for e in events:
            sent[e["op"]] = sent.get(e["op"], 0) + e["bytes_sent"]
        assert sent == traffic_by_op(psi, d, "zero3")
        # the root unit is gathered first and its gradient reduced last (the embedding's backward ends it all)
        assert events[0]["tag"] == "zero3.root" and events[-1]["tag"] == "zero3.root"


def _kept(reshard, units):
    """One step of ZeRO-3 with `reshard_after_forward=reshard` over `units`; then a forward without autograd."""
    rank, d = dist.get_rank(), dist.get_world_size()
    model = build_model(CFG)
    fsdp = FullyShardedDataParallel(model, units=units, reshard_after_forward=reshard)
    ids, targets = random_tokens(CFG, BATCH, SEQ, seed=0)
    ids, targets = micro_batch(ids, rank, d), micro_batch(targets, rank, d)
    with trace() as tr:
        model.loss(ids, targets).backward()
        fsdp.finish_gradient_sync()
    after_backward = fsdp.resident_param_bytes()
    with torch.no_grad():
        model.loss(ids, targets)  # no backward will come: nothing may stay gathered
    sent = {}
    for e in tr.events:
        sent[e.op] = sent.get(e.op, 0) + e.bytes_sent
    whats = [what for _, _, what in fsdp.timeline]
    shards = fsdp.resident_param_bytes()
    return dict(
        grads=fsdp.gradient_shards(),
        layouts=fsdp.layouts,
        sent=sent,
        whats=whats,
        unit_bytes=fsdp.unit_bytes(),
        leftover=(after_backward - shards, fsdp.resident_param_bytes() - shards),
    )


@pytest.mark.parametrize("reshard", [None, False])
def test_kept_units_skip_the_backward_gather_and_still_train_like_the_reference(reshard):
    """FSDP2's default (None) keeps the root unit from forward to backward, False keeps every unit: each kept unit
    is all-gathered once per micro-batch instead of twice, and the gradient is the reference's."""
    d = 2
    units = [f"layers.{i}" for i in range(CFG.n_layers)]  # embed, ln_f and lm_head fall to the root unit
    results = launch(_kept, d, reshard, units)
    ref = build_model(CFG)
    ids, targets = random_tokens(CFG, BATCH, SEQ, seed=0)
    ref.loss(ids, targets).backward()
    grads = assemble(results[0]["layouts"], [r["grads"] for r in results])
    for n, p in ref.named_parameters():
        assert_float64_close(grads[n], p.grad, rtol=FLOAT64_RTOL)
    for r in results:
        kept = ["root"] if reshard is None else list(r["unit_bytes"])
        psi = sum(r["unit_bytes"].values())
        kept_bytes = sum(r["unit_bytes"][u] for u in kept)
        assert r["sent"] == {"all_gather": (2 * psi - kept_bytes) // d, "reduce_scatter": psi // d}
        gathered_again = [w.split()[1] for w in r["whats"] if w.startswith("gather") and w.endswith("(backward)")]
        assert not set(gathered_again) & set(kept)
        assert r["leftover"] == (0, 0)  # freed by backward; and a forward without autograd frees what it gathers


def _refusals(what):
    model = build_model(CFG)
    if what == "stage3":
        ZeroDataParallel(model, 3)
    elif what == "no_sync":
        with ZeroDataParallel(model, 2).no_sync():
            pass
    elif what == "units":
        FullyShardedDataParallel(model, units=["layers.7"])
    elif what == "reshard":
        FullyShardedDataParallel(model, reshard_after_forward="root")
    elif what == "reshard_unit":
        FullyShardedDataParallel(model).set_reshard_after_forward(False, ["layers.7"])


@pytest.mark.parametrize(
    "what, message",
    [
        ("stage3", "ZeroDataParallel does stages 1 and 2, got zero_stage=3"),
        ("no_sync", "ZeRO-2 keeps only its shard"),
        ("units", r"units \['layers.7'\] are not modules of Transformer"),
        ("reshard", "reshard_after_forward must be True, False or None"),
        ("reshard_unit", r"\['layers.7'\] are not units of this wrapper"),
    ],
)
def test_impossible_requests_are_refused_with_the_reason(what, message):
    with pytest.raises(Exception, match=message):
        launch(_refusals, 2, what)


def _zero2_peak(max_in_flight):
    rank, d = dist.get_rank(), dist.get_world_size()
    model = build_model(CFG)
    zero = ZeroDataParallel(model, 2, bucket_bytes=512, max_buckets_in_flight=max_in_flight)
    ids, targets = random_tokens(CFG, BATCH, SEQ, seed=0)
    model.loss(micro_batch(ids, rank, d), micro_batch(targets, rank, d)).backward()
    zero.finish_gradient_sync()
    mem = zero.memory()
    return mem.grads, mem.peak_grads, [lay.padded_bytes for lay in zero.layouts]


def test_zero2_holds_its_gradient_slices_and_only_a_few_full_buckets_at_once():
    k = 1
    for grads, peak, buckets in launch(_zero2_peak, 2, k):
        assert grads * 2 == sum(buckets)  # after the sync: the slices, 1/d of the padded gradient
        assert len(buckets) > 8
        # during backward: at most k buckets on the wire, plus the ones still filling (one, or two where a layer's
        # gradients arrive out of registration order)
        assert grads < peak <= grads + (k + 2) * max(buckets)
        assert peak < grads + sum(buckets) / 2
