"""The block kernel interface and the log-sum-exp merge, on one process."""

import inspect

import pytest
import torch

from pylib.cp import SDPAKernel, TorchKernel, choose_kernel, flash_available, merge_all, select_kernel
from pylib.cp.kernels import _flash_backward_kwargs
from pylib.model import attention_core
from tests.conftest import assert_float64_close


def _qkv(b=2, h=4, h_kv=2, s=6, d=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, s, d, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(b, h_kv, s, d, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(b, h_kv, s, d, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v


@pytest.mark.parametrize("h_kv", [4, 2, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_torch_kernel_output_and_lse_equal_full_attention(h_kv, causal):
    q, k, v = _qkv(h_kv=h_kv)
    scale = 0.37
    out, lse = TorchKernel().forward(q, k, v, causal=causal, scale=scale)
    torch.testing.assert_close(out, attention_core(q, k, v, causal=causal, scale=scale), rtol=0, atol=1e-13)
    kk = k.repeat_interleave(4 // h_kv, dim=1)
    scores = q @ kk.transpose(-1, -2) * scale
    if causal:
        scores = scores.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1), rtol=0, atol=1e-13)
    assert lse.dtype == torch.float64


@pytest.mark.parametrize("make_kernel", [TorchKernel, lambda: SDPAKernel("cpu")], ids=["torch", "fused"])
def test_block_gradients_from_the_global_lse_add_up_to_full_attention_gradients(make_kernel):
    """Cut the keys into two blocks (6 queries against 2 and 4 keys); each block's backward, given the whole row's
    out and lse, yields its exact share: dq adds over blocks, dk and dv are the blocks' slices. The same for the
    plain-torch kernel and torch's fused SDPA op (its CPU flash kernel), as the ring needs."""
    q, k, v = _qkv(s=6, h_kv=2)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = attention_core(q, k, v, causal=False)
    dout = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out.backward(dout)
    kern = make_kernel()
    scale = 5**-0.5
    _, lse = kern.forward(q.detach(), k.detach(), v.detach(), causal=False, scale=scale)
    dq = torch.zeros_like(q)
    dks, dvs = [], []
    for cols in (slice(0, 2), slice(2, 6)):
        dq_b, dk_b, dv_b = kern.backward(
            dout,
            q.detach(),
            k.detach()[:, :, cols],
            v.detach()[:, :, cols],
            out.detach(),
            lse,
            causal=False,
            scale=scale,
        )
        dq += dq_b
        dks.append(dk_b)
        dvs.append(dv_b)
    assert_float64_close(dq, q.grad)
    assert_float64_close(torch.cat(dks, 2), k.grad)
    assert_float64_close(torch.cat(dvs, 2), v.grad)


def test_lse_merge_of_key_blocks_equals_attention_over_their_union_even_with_huge_scores():
    q, k, v = _qkv(s=8, h_kv=4, dtype=torch.float32)
    scale = 60.0  # scores in the hundreds: exp() of them overflows float32, the sigmoid form never does
    kern = TorchKernel()
    blocks = [kern.forward(q, k[:, :, c], v[:, :, c], causal=False, scale=scale) for c in (slice(0, 3), slice(3, 8))]
    out, lse = merge_all(blocks)
    full_out, full_lse = kern.forward(q.double(), k.double(), v.double(), causal=False, scale=scale)
    assert torch.isfinite(out).all() and lse.max() > 88  # e^88 is float32's limit
    torch.testing.assert_close(out.double(), full_out, rtol=0, atol=1e-4)
    torch.testing.assert_close(lse.double(), full_lse, rtol=1e-6, atol=0)


def test_choose_kernel_picks_flash_only_when_every_condition_holds():
    bf16, f32 = torch.bfloat16, torch.float32
    assert choose_kernel("cuda", bf16, 64, True) == "flash"
    assert choose_kernel("cuda", torch.float16, 128, True) == "flash"
    assert choose_kernel("cuda", bf16, 64, False) == "torch"  # not installed
    assert choose_kernel("cpu", bf16, 64, True) == "torch"  # not CUDA
    assert choose_kernel("cuda", f32, 64, True) == "torch"  # fp32
    assert choose_kernel("cuda", bf16, 20, True) == "torch"  # d_head not a multiple of 8
    assert choose_kernel("cuda", bf16, 512, True) == "torch"  # d_head too large
    assert choose_kernel("cuda", bf16, 64, True, "torch") == "torch"  # asked for torch


def test_requesting_flash_where_it_cannot_run_raises_naming_every_reason():
    with pytest.raises(ValueError, match=r"not installed.*on cpu.*float64 is not float16/bfloat16.*d_head=5"):
        choose_kernel("cpu", torch.float64, 5, False, "flash")
    with pytest.raises(ValueError, match="kernel='tiled' must be"):
        choose_kernel("cpu", torch.float64, 8, False, "tiled")


def test_select_kernel_on_cpu_is_the_torch_kernel_and_accepts_kernel_objects():
    q = torch.zeros(1, 1, 2, 8, dtype=torch.bfloat16)
    assert isinstance(flash_available(), bool)  # the guarded import never raises
    assert select_kernel(q).name == "torch"
    mine = TorchKernel()
    assert select_kernel(q, mine) is mine
    with pytest.raises(TypeError, match="needs forward"):
        select_kernel(q, object())


def test_flash_backward_call_adapts_to_each_flash_attn_signature():
    def v25(
        dout,
        q,
        k,
        v,
        out,
        softmax_lse,
        dq,
        dk,
        dv,
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        deterministic,
        rng_state=None,
    ):
        pass

    def v26(
        dout,
        q,
        k,
        v,
        out,
        softmax_lse,
        dq,
        dk,
        dv,
        dropout_p,
        softmax_scale,
        causal,
        window_size_left,
        window_size_right,
        softcap,
        alibi_slopes,
        deterministic,
        rng_state=None,
    ):
        pass

    def v20(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal, rng_state=None):
        pass

    class CustomOp:  # flash-attn >= 2.6 wraps the function in a torch.library custom op
        _init_fn = staticmethod(v26)

        def __call__(self, *args, **kwargs):
            pass

    class Opaque:  # a signature that says nothing: the newest call is assumed
        def __call__(self, *args, **kwargs):
            pass

    for fn in (v20, v25, v26, CustomOp()):
        kw = _flash_backward_kwargs(fn, 0.5, True)
        bound = inspect.signature(getattr(fn, "_init_fn", fn)).bind(*range(9), **kw)  # raises on a bad call
        assert bound.arguments["causal"] is True and bound.arguments["softmax_scale"] == 0.5
    assert _flash_backward_kwargs(v25, 0.5, True)["window_size"] == (-1, -1)
    assert _flash_backward_kwargs(v26, 0.5, False)["window_size_left"] == -1
    assert _flash_backward_kwargs(Opaque(), 0.5, False) == _flash_backward_kwargs(v26, 0.5, False)


def test_causal_block_must_be_square():
    q, k, v = _qkv(s=4)
    with pytest.raises(ValueError, match="causal block must be square: s_q=4, s_k=2"):
        TorchKernel().forward(q, k[:, :, :2], v[:, :, :2], causal=True, scale=1.0)
