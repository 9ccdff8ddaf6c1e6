"""torch's own fused attention (SDPAKernel) behind the block-kernel interface, and how a kernel is chosen.

On CPU the same class runs torch's CPU fused kernel (`_scaled_dot_product_flash_attention_for_cpu`, which also
returns the LSE and has a backward that takes it), so its GQA expansion, LSE handling and block gradients from the
global LSE are checked here against TorchKernel in float64; the CUDA variants share that code and differ only in
which op they call (bench/gpu_single.py checks them on a GPU). The selection is checked with fake probes."""

import sys
import types

import pytest
import torch
import torch.distributed as dist

from pylib.cp import kernels as K
from pylib.cp import ring_attention, shard_sequence, ulysses_attention, unshard_sequence
from pylib.cp.kernels import SDPAKernel, TorchKernel, choose_kernel, fused_kernel, select_kernel
from pylib.model import attention_core
from pylib.runtime import launch
from tests.conftest import assert_float64_close


@pytest.fixture(autouse=True)
def fresh_cache():
    K.clear_kernel_cache()
    yield
    K.clear_kernel_cache()


def _qkv(b=2, h=4, h_kv=2, s_q=6, s_k=6, d=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, s_q, d, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(b, h_kv, s_k, d, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(b, h_kv, s_k, d, generator=g, dtype=torch.float64).to(dtype)
    dout = torch.randn(b, h, s_q, d, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v, dout


@pytest.mark.parametrize("h_kv", [4, 2, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_torchs_fused_kernel_equals_the_reference_kernel_forward_and_backward(h_kv, causal):
    q, k, v, dout = _qkv(h_kv=h_kv)
    fused, ref = SDPAKernel("cpu"), TorchKernel()
    out, lse = fused.forward(q, k, v, causal=causal, scale=0.4)
    out_r, lse_r = ref.forward(q, k, v, causal=causal, scale=0.4)
    assert_float64_close(out, out_r)
    assert_float64_close(lse, lse_r)
    assert lse.dtype == torch.float64 and lse.shape == (2, 4, 6)
    grads = fused.backward(dout, q, k, v, out_r, lse_r, causal=causal, scale=0.4)
    for got, want in zip(grads, ref.backward(dout, q, k, v, out_r, lse_r, causal=causal, scale=0.4)):
        assert got.shape == want.shape and got.dtype == torch.float64
        assert_float64_close(got, want)


def test_a_bf16_merge_lse_reaches_the_fused_backward_as_float32():
    q, k, v, dout = _qkv(dtype=torch.bfloat16)
    fused, ref = SDPAKernel("cpu"), TorchKernel()
    out, lse = ref.forward(q, k, v, causal=True, scale=0.4)
    from_bf16 = fused.backward(dout, q, k, v, out, lse.to(torch.bfloat16), causal=True, scale=0.4)
    from_f32 = fused.backward(dout, q, k, v, out, lse.to(torch.bfloat16).float(), causal=True, scale=0.4)
    for a, b in zip(from_bf16, from_f32):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _cp_rank(qkv, dout, layout, kind):
    r, n = dist.get_rank(), dist.get_world_size()
    q, k, v = (shard_sequence(x, 2, r, n, layout).requires_grad_() for x in qkv)
    fn = ring_attention if kind == "ring" else ulysses_attention
    out = fn(q, k, v, causal=True, layout=layout, kernel="sdpa")
    out.backward(shard_sequence(dout, 2, r, n, layout))
    return [t.detach() for t in (out, q.grad, k.grad, v.grad)]


@pytest.mark.parametrize("kind", ["ring", "ulysses"])
def test_ring_and_ulysses_with_torchs_fused_kernel_equal_full_attention(kind):
    q, k, v, dout = _qkv(b=1, h=4, h_kv=2, s_q=16, s_k=16)
    parts = launch(_cp_rank, 2, (q, k, v), dout, "zigzag", kind, backend="gloo")
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = attention_core(q, k, v, causal=True)
    out.backward(dout)
    for j, want in enumerate((out, q.grad, k.grad, v.grad)):
        got = unshard_sequence([p[j] for p in parts], 2, "zigzag")
        assert_float64_close(got, want.detach())


@pytest.mark.parametrize("variant", ["flash", "efficient"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_cuda_variants_calls_fit_the_ops_as_their_meta_kernels_see_them(variant, causal):
    """No GPU here, but torch registers shape-only (meta) kernels for the CUDA ops: the calls SDPAKernel makes --
    positional arguments, None where the op's autograd passes an undefined tensor, the backward template from a
    forward, the memory-efficient op's LSE padded to 32 rows and back -- are accepted and give the right shapes.
    A rectangular non-causal block (50 queries, 100 keys) is what the ring's zig-zag steps ask for."""
    kernel = K.prepare_sdpa(variant, "meta", torch.bfloat16, 64)
    assert kernel.lse_align == (32 if variant == "efficient" else 1)
    s_q = 100 if causal else 50
    q = torch.empty(2, 8, s_q, 64, device="meta", dtype=torch.bfloat16)
    k = v = torch.empty(2, 2, 100, 64, device="meta", dtype=torch.bfloat16)
    out, lse = kernel.forward(q, k, v, causal=causal, scale=0.125)
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    assert lse.shape == (2, 8, s_q) and lse.dtype == torch.float32
    grads = kernel.backward(out, q, k, v, out, lse.to(torch.bfloat16), causal=causal, scale=0.125)
    assert [tuple(g.shape) for g in grads] == [tuple(q.shape), tuple(k.shape), tuple(v.shape)]
    assert all(g.dtype == torch.float32 for g in grads)


# ------------------------------------------------------------------------------------------------ selection


def test_auto_on_cuda_prefers_flash_attn_then_torchs_fused_op_then_torch():
    bf16 = torch.bfloat16
    assert choose_kernel("cuda", bf16, 64, True, fused="flash") == "flash"  # flash-attn installed wins
    assert choose_kernel("cuda", bf16, 64, False, fused="flash") == "sdpa"  # no flash-attn: torch's own
    assert choose_kernel("cuda", torch.float32, 64, True, fused="efficient") == "sdpa"
    assert choose_kernel("cuda", torch.float64, 64, False, fused=None) == "torch"
    assert choose_kernel("cpu", torch.float64, 64, False, fused="cpu") == "torch"  # the CPU path is unchanged
    assert choose_kernel("cpu", torch.float64, 64, False, "sdpa", fused="cpu") == "sdpa"
    with pytest.raises(ValueError, match="kernel='sdpa' cannot run: no fused torch op for float16 on cpu"):
        choose_kernel("cpu", torch.float16, 8, False, "sdpa", fused_problem="no fused torch op for float16 on cpu")


def test_the_fused_op_is_probed_once_per_device_dtype_and_head_size_falling_back_in_order(monkeypatch):
    probed = []

    def fake_probe(variant, device, dtype, d_head):
        probed.append((variant, str(device), dtype, d_head))
        if variant == "flash":
            raise RuntimeError("FlashAttention only supports Ampere GPUs or newer.\nmore")
        return SDPAKernel(variant)

    monkeypatch.setattr(K, "probe_sdpa", fake_probe)
    kernel, why = fused_kernel(torch.device("cuda", 0), torch.bfloat16, 64)
    assert kernel.variant == "efficient" and why == "flash: FlashAttention only supports Ampere GPUs or newer."
    assert fused_kernel(torch.device("cuda", 0), torch.bfloat16, 64)[0] is kernel  # cached: no second probe
    fused_kernel(torch.device("cuda", 0), torch.float32, 64)  # fp32: only the memory-efficient op
    fused_kernel(torch.device("cuda", 1), torch.bfloat16, 128)
    assert probed == [
        ("flash", "cuda:0", torch.bfloat16, 64),
        ("efficient", "cuda:0", torch.bfloat16, 64),
        ("efficient", "cuda:0", torch.float32, 64),
        ("flash", "cuda:1", torch.bfloat16, 128),
        ("efficient", "cuda:1", torch.bfloat16, 128),
    ]
    none, why = fused_kernel(torch.device("cuda", 0), torch.float64, 64)
    assert none is None and "no fused torch op for float64 on cuda" in why


def test_select_kernel_decides_once_and_reuses_the_kernel_object(monkeypatch):
    calls = []
    real = K.probe_sdpa
    monkeypatch.setattr(K, "probe_sdpa", lambda *a: calls.append(a) or real(*a))
    q = torch.zeros(1, 2, 4, 8, dtype=torch.float64)
    first = select_kernel(q, "sdpa")
    assert isinstance(first, SDPAKernel) and first.variant == "cpu"
    assert select_kernel(q, "sdpa") is first and len(calls) == 1
    assert isinstance(select_kernel(q, "auto"), TorchKernel) and len(calls) == 1  # CPU auto never probes


def test_a_fused_op_that_disagrees_with_the_reference_is_not_chosen(monkeypatch):
    monkeypatch.setitem(K.PROBE_TOLERANCE, torch.float64, 0.0)  # demand exact equality: rounding fails it
    kernel, why = fused_kernel(torch.device("cpu"), torch.float64, 8)
    assert kernel is None and "cpu: SDPAKernel('cpu') out differs from TorchKernel" in why
    with pytest.raises(ValueError, match="kernel='sdpa' cannot run: cpu: SDPAKernel"):
        select_kernel(torch.zeros(1, 1, 2, 8, dtype=torch.float64), "sdpa")


def test_flash_attn_backward_receives_a_float32_lse_whatever_the_merge_dtype(monkeypatch):
    """flash-attn reads softmax_lse as float32 without checking; a bf16 LSE (merge_dtype=torch.bfloat16) would be
    read as garbage. A fake flash_attn records what FlashKernel hands it."""
    seen = {}

    def _flash_attn_backward(
        dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal, window_size_left,
        window_size_right, softcap, alibi_slopes, deterministic, rng_state=None,
    ):  # fmt: skip
        seen["lse"] = softmax_lse
        for g in (dq, dk, dv):
            g.zero_()

    fake = types.ModuleType("flash_attn.flash_attn_interface")
    fake._flash_attn_backward = _flash_attn_backward
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", fake)
    q, k, v, dout = _qkv(dtype=torch.bfloat16)
    lse = torch.randn(2, 4, 6).to(torch.bfloat16)
    K.FlashKernel().backward(dout, q, k, v, q, lse, causal=False, scale=0.5)
    assert seen["lse"].dtype == torch.float32 and seen["lse"].is_contiguous()
    torch.testing.assert_close(seen["lse"], lse.float(), rtol=0, atol=0)
