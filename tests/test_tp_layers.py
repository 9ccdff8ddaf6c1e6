"""The TP building blocks one by one: column/row-parallel linear, vocab-parallel embedding and cross-entropy, the
sharding specs the book prints, and the errors for sizes that do not divide."""

import pytest
import torch
import torch._dynamo  # noqa: F401  a dispatch mode's first use imports it (~3 s); once here, the ranks inherit it
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from pylib.model import ModelConfig, build_model, random_hidden, random_tokens
from pylib.plan.presets import tiny, tiny_layer
from pylib.runtime import AxisGroup, launch, trace
from pylib.tp import (
    TPMLP,
    ColumnParallelLinear,
    RowParallelLinear,
    TPAttention,
    TPBlock,
    TPTransformer,
    VocabParallelEmbedding,
    gather_full,
    scatter_to_sequence_parallel_region,
    vocab_parallel_cross_entropy,
)

TOL = 1e-12


def _linear(n_in, n_out, bias, seed):
    torch.manual_seed(seed)
    return nn.Linear(n_in, n_out, bias=bias, dtype=torch.float64)


def _linears():
    """Column then row (the MLP pattern) and each alone with its options, against nn.Linear."""
    t, r = dist.get_world_size(), dist.get_rank()
    up, down = _linear(8, 12, True, 0), _linear(12, 8, True, 1)
    x = random_hidden(2, 4, 8, dtype=torch.float64)
    w = random_hidden(2, 4, 8, seed=5, dtype=torch.float64)
    errs = {}

    # column (no gather) -> row (input_is_parallel): the pair communicates once forward, once backward
    col = ColumnParallelLinear.from_full(up, gather_output=False)
    row = RowParallelLinear.from_full(down, input_is_parallel=True)
    xa = x.clone().requires_grad_()
    xr = x.clone().requires_grad_()
    with trace() as tr:
        ya = row(torch.tanh(col(xa)))
        (ya * w).sum().backward()
    yr = down(torch.tanh(up(xr)))
    (yr * w).sum().backward()
    errs["pair.y"] = (ya - yr).abs().max().item()
    errs["pair.dx"] = (xa.grad - xr.grad).abs().max().item()
    full = gather_full(_Pair(col, row), grads=True)
    ref_grads = {f"{m}.{n}": p.grad for m, lin in (("up", up), ("down", down)) for n, p in lin.named_parameters()}
    assert sorted(full) == sorted(ref_grads)
    errs["pair.grads"] = max((full[n] - ref_grads[n]).abs().max().item() for n in full)
    pair_ops = [(e.phase, e.op) for e in tr.events]

    # column with gather_output: every rank holds the whole output
    g = ColumnParallelLinear.from_full(up, gather_output=True)
    errs["gather_output"] = (g(x) - up(x)).abs().max().item()
    # row with a replicated input: each rank takes its slice of the input features
    rr = RowParallelLinear.from_full(down, input_is_parallel=False)
    x12 = random_hidden(2, 4, 12, dtype=torch.float64)
    errs["row_replicated_input"] = (rr(x12) - down(x12)).abs().max().item()
    # column and row under SP: input and output are sequence slices
    cs = ColumnParallelLinear.from_full(up, sequence_parallel=True)
    rs = RowParallelLinear.from_full(down, sequence_parallel=True)
    y_sp = rs(torch.tanh(cs(scatter_to_sequence_parallel_region(x))))
    errs["sp_pair"] = (y_sp - down(torch.tanh(up(x))).chunk(t, 1)[r]).abs().max().item()
    # the row split's partial sums add up to the output (what the all-reduce computes)
    partial = row.partial(torch.tanh(col(x)))
    return errs, pair_ops, partial.detach(), tuple(col.weight.shape), tuple(row.weight.shape)


class _Pair(nn.Module):
    def __init__(self, up, down):
        super().__init__()
        self.up, self.down = up, down

    def shard_specs(self):
        return self.up.shard_specs("up.") + self.down.shard_specs("down.")


@pytest.mark.parametrize("t", [2, 4])
def test_column_then_row_parallel_linear_equals_the_two_full_linears(t):
    results = launch(_linears, t)
    for rank, (errs, ops, _, col_shape, row_shape) in enumerate(results):
        assert all(v < TOL for v in errs.values()), f"rank {rank}: {errs}"
        assert ops == [("forward", "all_reduce"), ("backward", "all_reduce")]
        assert col_shape == (12 // t, 8) and row_shape == (8, 12 // t)  # torch [out, in]
    up, down = _linear(8, 12, True, 0), _linear(12, 8, True, 1)
    x = random_hidden(2, 4, 8, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(sum(r[2] for r in results) + down.bias, down(torch.tanh(up(x))), rtol=0, atol=TOL)


def _vocab(V, sp):
    t = dist.get_world_size()
    cfg = tiny_layer().with_(vocab_size=V)
    ref = build_model(cfg)
    ids, targets = random_tokens(cfg, 2, 8, seed=4)
    ids[0, :4] = torch.tensor([0, V // t - 1, V // t, V - 1])  # both edges of every rank's range
    emb = VocabParallelEmbedding.from_full(ref.embed, sequence_parallel=sp)
    head = ColumnParallelLinear.from_full(ref.lm_head, sequence_parallel=sp)
    x = emb(ids)
    local_logits = head(x)  # [b, s, V/t]
    per_token = vocab_parallel_cross_entropy(local_logits, targets)
    per_token.mean().backward()
    rx = ref.embed(ids)
    ref_per_token = F.cross_entropy(ref.lm_head(rx).reshape(-1, V), targets.reshape(-1), reduction="none")
    ref_per_token.mean().backward()
    rank = dist.get_rank()
    ref_x = rx.chunk(t, 1)[rank] if sp else rx
    errs = {
        "embedding": (x - ref_x).abs().max().item(),
        "per_token_loss": (per_token - ref_per_token.view(2, 8)).abs().max().item(),
        "embed.grad": (emb.weight.grad - ref.embed.weight.grad.chunk(t, 0)[rank]).abs().max().item(),
        "lm_head.grad": (head.weight.grad - ref.lm_head.weight.grad.chunk(t, 0)[rank]).abs().max().item(),
    }
    return errs, tuple(local_logits.shape)


@pytest.mark.parametrize("t, sp", [(2, False), (4, False), (4, True)])
def test_vocab_parallel_embedding_and_cross_entropy_equal_the_reference(t, sp):
    V = 16
    for rank, (errs, shape) in enumerate(launch(_vocab, t, V, sp)):
        assert all(v < TOL for v in errs.values()), f"rank {rank}: {errs}"
        assert shape == (2, 8, V // t)


class _Widths(TorchDispatchMode):
    """Records the last-dim size of every tensor any op produces (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.widths = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(o, torch.Tensor) and o.dim():
                self.widths.add(o.shape[-1])
        return out


def _loss_widths(V):
    cfg = tiny_layer().with_(vocab_size=V, n_heads=4)
    model = TPTransformer.from_full(build_model(cfg))
    ids, targets = random_tokens(cfg, 2, 8)
    with trace() as tr, _Widths() as seen:
        model.loss(ids, targets).backward()
    ce = [(e.op, e.extra.get("reduce_op"), e.payload_bytes) for e in tr.events if e.tag.startswith("cross_entropy")]
    return seen.widths, ce


def test_vocab_parallel_loss_never_forms_a_tensor_as_wide_as_the_vocabulary():
    V, t = 40, 4  # V differs from every other size in the model
    for widths, ce in launch(_loss_widths, t, V):
        assert V // t in widths and V not in widths
        # three all-reduces of b*s float64 numbers: max, target logit, sum of exp
        assert ce == [
            ("all_reduce", "max", 2 * 8 * 8),
            ("all_reduce", "sum", 2 * 8 * 8),
            ("all_reduce", "sum", 2 * 8 * 8),
        ]


# ------------------------------------------------------------------------------------------------ specs, errors


def _fake_group(t, rank=0):
    """A TP group as seen by one rank, enough to build (not run) the modules without launching."""
    return AxisGroup("tp", tuple(range(t)), rank, None)


def test_shard_specs_cover_every_parameter_with_its_local_and_full_shape():
    cfg = ModelConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=32, mlp="swiglu")
    ref = build_model(cfg)
    ref_shapes = {n: tuple(p.shape) for n, p in ref.named_parameters()}
    for t in (1, 2, 4):
        for sp in (False, True):
            model = TPTransformer.from_full(ref, group=_fake_group(t, t - 1), sequence_parallel=sp)
            specs = {s.name: s for s in model.shard_specs()}
            local = {n: tuple(p.shape) for n, p in model.named_parameters()}
            assert sorted(specs) == sorted(local) == sorted(ref_shapes)
            for name, spec in specs.items():
                assert spec.local_shape == local[name] and spec.full_shape == ref_shapes[name], name
                assert spec.axis == "tp"
            kinds = {n.split(".", 2)[-1] if n.startswith("layers") else n: s.kind for n, s in specs.items()}
            kv_kind = "kv-replicated" if t > 2 else "column"
            assert kinds == {
                "embed.weight": "vocab",
                "lm_head.weight": "column",
                "ln_f.weight": "replicated",
                "ln_f.bias": "replicated",
                "ln1.weight": "replicated",
                "ln1.bias": "replicated",
                "ln2.weight": "replicated",
                "ln2.bias": "replicated",
                "attn.q_proj.weight": "column",
                "attn.k_proj.weight": kv_kind,
                "attn.v_proj.weight": kv_kind,
                "attn.o_proj.weight": "row",
                "mlp.gate_proj.weight": "column",
                "mlp.up_proj.weight": "column",
                "mlp.down_proj.weight": "row",
            }
            fractions = {n: s.fraction for n, s in specs.items()}
            assert fractions["layers.0.attn.q_proj.weight"] == 1 / t
            assert fractions["layers.0.attn.k_proj.weight"] == (1 / t if t <= 2 else 1 / 2)
            assert fractions["layers.0.ln1.weight"] == 1.0
            assert all(("gradient all-reduced" in s.note) == sp for s in specs.values() if ".ln" in s.name)


def test_column_split_is_torch_dim_0_and_row_split_is_dim_1():
    lin = _linear(6, 4, False, 0)
    for r in range(2):
        col = ColumnParallelLinear.from_full(lin, group=_fake_group(2, r))
        row = RowParallelLinear.from_full(lin, group=_fake_group(2, r))
        assert torch.equal(col.weight, lin.weight[2 * r : 2 * r + 2])
        assert torch.equal(row.weight, lin.weight[:, 3 * r : 3 * r + 3])
        assert col.shard_specs()[0].dim == 0 and row.shard_specs()[0].dim == 1


@pytest.mark.parametrize(
    "t, kwargs, message",
    [
        (3, dict(n_heads=8, d_model=16), "tp=3 does not divide n_heads=8"),
        (4, dict(n_heads=4, n_kv_heads=None, d_ff=30), "tp=4 does not divide d_ff=30"),
        (4, dict(vocab_size=30), "tp=4 does not divide vocab_size=30"),
        (
            2,
            dict(n_heads=6, d_model=24, n_kv_heads=3),
            "tp=2 does not divide n_kv_heads=3, and n_kv_heads=3 does not divide tp=2",
        ),
        (
            4,
            dict(n_heads=12, d_model=24, n_kv_heads=6),
            "tp=4 does not divide n_kv_heads=6, and n_kv_heads=6 does not divide tp=4",
        ),
    ],
)
def test_sizes_tp_cannot_split_are_refused_naming_the_constraint(t, kwargs, message):
    cfg = ModelConfig(**{"vocab_size": 32, "d_model": 16, "n_heads": 4, "d_ff": 32, **kwargs})
    ref = build_model(cfg)
    with pytest.raises(ValueError, match=message):
        TPTransformer.from_full(ref, group=_fake_group(t))
    parts = {"n_heads": TPAttention, "n_kv_heads": TPAttention, "d_ff": TPMLP}
    for key, cls in parts.items():
        if f"{key}=" in message.split(",")[0]:
            module = ref.layers[0].attn if cls is TPAttention else ref.layers[0].mlp
            with pytest.raises(ValueError, match=message):
                cls.from_full(module, group=_fake_group(t))


def test_linear_sizes_that_do_not_divide_are_refused():
    with pytest.raises(ValueError, match="tp=3 does not divide out_features=4"):
        ColumnParallelLinear.from_full(_linear(6, 4, False, 0), group=_fake_group(3))
    with pytest.raises(ValueError, match="tp=4 does not divide in_features=6"):
        RowParallelLinear.from_full(_linear(6, 4, False, 0), group=_fake_group(4))
    with pytest.raises(ValueError, match="tp=3 does not divide vocab_size=32"):
        VocabParallelEmbedding.from_full(nn.Embedding(32, 4), group=_fake_group(3))


def test_sequence_parallel_refuses_a_sequence_the_tp_ranks_cannot_split():
    cfg = tiny().with_(n_layers=2, dtype="float32")
    model = TPTransformer.from_full(build_model(cfg), group=_fake_group(4), sequence_parallel=True)
    ids, targets = random_tokens(cfg, 2, 10)
    with pytest.raises(ValueError, match="tp=4 does not divide sequence length s=10"):
        model.loss(ids, targets)
    with pytest.raises(ValueError, match="tp=4 does not divide sequence length s=10"):
        scatter_to_sequence_parallel_region(torch.zeros(2, 10, 16), _fake_group(4))
    with pytest.raises(ValueError, match="tp=4 does not divide sequence length s=10"):
        TPBlock.from_full(build_model(cfg).layers[0], group=_fake_group(4), sequence_parallel=True).mlp.down_proj(
            torch.zeros(2, 10, 8)
        )


def test_moe_layers_are_left_to_expert_parallelism():
    from pylib.model import MoEConfig

    ref = build_model(ModelConfig(moe=MoEConfig(n_experts=4, top_k=2)))
    with pytest.raises(ValueError, match="expert parallelism"):
        TPTransformer.from_full(ref, group=_fake_group(2))
    with pytest.raises(TypeError, match="expert parallelism"):
        TPMLP.from_full(ref.layers[0].mlp, group=_fake_group(2))
