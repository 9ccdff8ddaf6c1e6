"""The block kernel: attention of one block of queries against one block of keys, returning the log-sum-exp too.

Ring attention never sees the whole score matrix; it calls a kernel on blocks and merges their outputs with the
log-sum-exp (LSE). Any object with this interface plugs in:

    kernel.forward(q, k, v, *, causal, scale) -> (out, lse)
        q [b, n_head, s_q, d_head]; k, v [b, n_kv_head, s_k, d_head]   (GQA: n_kv_head divides n_head)
        out [b, n_head, s_q, d_head] in q's dtype; lse [b, n_head, s_q] = log sum_j exp(scale * q.k_j)
        in float32 (float64 for float64 inputs). causal=True needs s_q == s_k: query i sees keys 0..i.
    kernel.backward(dout, q, k, v, out, lse, *, causal, scale) -> (dq, dk, dv)
        out and lse are the *final* (whole-row) output and LSE, so a block's gradient is exact without
        knowing the other blocks: P = exp(scale*q.k - lse), D = rowsum(dout * out),
        dv = P^T dout, dS = P * (dout v^T - D), dq = scale * dS k, dk = scale * dS^T q.
        Gradients come back in the accumulation dtype (float32, or float64 for float64 inputs).

Two kernels: `TorchKernel` (plain torch, any device and dtype; the CPU path) and `FlashKernel` (flash-attn 2 on
CUDA in fp16/bf16). `select_kernel(q, "auto")` picks flash when flash-attn imports, q is on CUDA, and dtype and
head size suit it; otherwise torch. The flash path is written against flash-attn 2.x's public `flash_attn_func`
and its `_flash_attn_backward`; it has not been run in this repository's CI (no GPU there) -- `bench/cp_gpu_check.py`
checks it against the torch kernel and times it on a GPU node.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math

import torch

from pylib.model.attention import expand_kv


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else (fp32, bf16, fp16) accumulates in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def default_scale(d_head: int) -> float:
    return 1.0 / math.sqrt(d_head)


def _check_shapes(q, k, v, causal):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"block kernel wants [b, heads, s, d_head] tensors, got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on batch or d_head")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"n_kv_head={k.shape[1]} does not divide n_head={q.shape[1]}")
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError(f"a causal block must be square: s_q={q.shape[2]}, s_k={k.shape[2]}")


class TorchKernel:
    """Attention of a block in plain torch: scores, masked, log-sum-exp, softmax, weighted sum.

    Computes in the accumulation dtype (float32 for half inputs, as a fused kernel does in registers)."""

    name = "torch"

    def _scores(self, q, k_full, causal, scale):
        """Scaled, masked scores [b, n_head, s_q, s_k]; q and k_full (K expanded to n_head heads) already in the
        accumulation dtype, so backward converts and expands them once for the scores and the gradients."""
        s = torch.matmul(q, k_full.transpose(-1, -2)) * scale  # [b, n_head, s_q, s_k]
        if causal:
            n = q.shape[2]
            keep = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
            s = s.masked_fill(~keep, float("-inf"))
        return s

    def forward(self, q, k, v, *, causal: bool, scale: float):
        _check_shapes(q, k, v, causal)
        acc = accumulation_dtype(q.dtype)
        s = self._scores(q.to(acc), expand_kv(k, q.shape[1]).to(acc), causal, scale)
        lse = torch.logsumexp(s, dim=-1)  # [b, n_head, s_q]
        p = torch.exp(s - lse.unsqueeze(-1))
        out = torch.matmul(p, expand_kv(v, q.shape[1]).to(acc))
        return out.to(q.dtype), lse

    def backward(self, dout, q, k, v, out, lse, *, causal: bool, scale: float):
        _check_shapes(q, k, v, causal)
        acc = accumulation_dtype(q.dtype)
        n_head, n_kv = q.shape[1], k.shape[1]
        q_acc, k_full = q.to(acc), expand_kv(k, n_head).to(acc)
        s = self._scores(q_acc, k_full, causal, scale)
        p = torch.exp(s - lse.to(acc).unsqueeze(-1))  # the block's share of the *global* softmax
        do = dout.to(acc)
        v_full = expand_kv(v, n_head).to(acc)
        dv_full = torch.matmul(p.transpose(-1, -2), do)  # [b, n_head, s_k, d]
        d_row = (do * out.to(acc)).sum(-1, keepdim=True)  # D = rowsum(dout * out)  [b, n_head, s_q, 1]
        ds = p * (torch.matmul(do, v_full.transpose(-1, -2)) - d_row)
        dq = torch.matmul(ds, k_full) * scale
        dk_full = torch.matmul(ds.transpose(-1, -2), q_acc) * scale
        if n_kv != n_head:  # each K/V head served n_head / n_kv_head query heads: add their gradients
            group = n_head // n_kv
            dk_full = dk_full.unflatten(1, (n_kv, group)).sum(2)
            dv_full = dv_full.unflatten(1, (n_kv, group)).sum(2)
        return dq, dk_full, dv_full


@functools.cache
def flash_available() -> bool:
    """True when flash-attn 2 imports (its CUDA extension included). Never raises."""
    try:
        importlib.import_module("flash_attn")
        importlib.import_module("flash_attn.flash_attn_interface")
    except Exception:  # noqa: BLE001 - ImportError, or an OSError/RuntimeError from a broken CUDA build
        return False
    return True


FLASH_DTYPES = (torch.float16, torch.bfloat16)
FLASH_MAX_HEAD_DIM = 256


class FlashKernel:
    """flash-attn 2 on CUDA. Tensors are [b, heads, s, d] here and [b, s, heads, d] inside flash-attn.

    Forward: `flash_attn_func(..., return_attn_probs=True)` returns (out, softmax_lse, _), lse [b, n_head, s_q]
    float32. Backward: `flash_attn.flash_attn_interface._flash_attn_backward` with the global out and lse; its
    signature changed across 2.x releases (window_size tuple vs two ints, softcap), so the call adapts to it.
    GQA is native in flash-attn. Unverified in CI: see the module docstring."""

    name = "flash"

    def forward(self, q, k, v, *, causal: bool, scale: float):
        _check_shapes(q, k, v, causal)
        from flash_attn import flash_attn_func

        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        out, lse, _ = flash_attn_func(
            qt, kt, vt, dropout_p=0.0, softmax_scale=scale, causal=causal, return_attn_probs=True
        )
        return out.transpose(1, 2), lse

    def backward(self, dout, q, k, v, out, lse, *, causal: bool, scale: float):
        _check_shapes(q, k, v, causal)
        from flash_attn.flash_attn_interface import _flash_attn_backward

        t = [x.transpose(1, 2).contiguous() for x in (dout, q, k, v, out)]
        dq, dk, dv = torch.empty_like(t[1]), torch.empty_like(t[2]), torch.empty_like(t[3])
        kwargs = _flash_backward_kwargs(_flash_attn_backward, scale, causal)
        _flash_attn_backward(*t, lse.contiguous(), dq, dk, dv, **kwargs)
        acc = accumulation_dtype(q.dtype)
        return tuple(x.transpose(1, 2).to(acc) for x in (dq, dk, dv))


def _flash_backward_kwargs(fn, scale: float, causal: bool) -> dict:
    """Keyword arguments for the installed flash-attn's `_flash_attn_backward` (no dropout, no window)."""
    target = getattr(fn, "_init_fn", fn)  # flash-attn >= 2.6 wraps it in a torch.library custom op
    try:
        sig = inspect.signature(target).parameters
        readable = not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.values())
        params = set(sig)
    except (TypeError, ValueError):
        readable = False
    if not readable:  # assume the newest (2.6+) signature
        params = {"window_size_left", "softcap", "alibi_slopes", "deterministic", "rng_state"}
    kw = dict(dropout_p=0.0, softmax_scale=scale, causal=causal)
    if "window_size_left" in params:
        kw.update(window_size_left=-1, window_size_right=-1)
    elif "window_size" in params:
        kw["window_size"] = (-1, -1)
    optional = dict(softcap=0.0, alibi_slopes=None, deterministic=False, rng_state=None)
    kw.update({k: v for k, v in optional.items() if k in params})
    return kw


KERNELS = {"torch": TorchKernel, "flash": FlashKernel}


def choose_kernel(
    device_type: str, dtype: torch.dtype, d_head: int, flash_is_available: bool, requested: str = "auto"
) -> str:
    """The kernel name for these tensors: "flash" or "torch". A pure function, so the choice is testable on CPU.

    requested="auto": flash when flash-attn is available, the tensors are CUDA, dtype is fp16/bf16 and d_head is a
    multiple of 8 up to 256; torch otherwise. requested="flash" raises naming the unmet condition."""
    if requested == "torch":
        return "torch"
    if requested not in ("auto", "flash"):
        raise ValueError(f"kernel={requested!r} must be 'auto', 'torch', 'flash' or a kernel object")
    problems = []
    if not flash_is_available:
        problems.append("flash-attn is not installed (pip install -r requirements-gpu.txt)")
    if device_type != "cuda":
        problems.append(f"tensors are on {device_type}, flash-attn needs cuda")
    if dtype not in FLASH_DTYPES:
        problems.append(f"dtype {str(dtype).replace('torch.', '')} is not float16/bfloat16")
    if d_head % 8 or d_head > FLASH_MAX_HEAD_DIM:
        problems.append(f"d_head={d_head} is not a multiple of 8 up to {FLASH_MAX_HEAD_DIM}")
    if not problems:
        return "flash"
    if requested == "flash":
        raise ValueError("kernel='flash' cannot run: " + "; ".join(problems))
    return "torch"


def select_kernel(q: torch.Tensor, kernel="auto"):
    """A kernel object for q's device, dtype and head size. `kernel` may already be a kernel object."""
    if not isinstance(kernel, str):
        if not (hasattr(kernel, "forward") and hasattr(kernel, "backward")):
            raise TypeError(f"a block kernel needs forward() and backward(); got {type(kernel).__name__}")
        return kernel
    name = choose_kernel(q.device.type, q.dtype, q.shape[-1], flash_available() if kernel != "torch" else False, kernel)
    return KERNELS[name]()


def block_attention(q, k, v, *, causal: bool, scale: float | None = None, kernel="auto"):
    """(out, lse) of one block; see the module docstring for shapes."""
    scale = default_scale(q.shape[-1]) if scale is None else scale
    return select_kernel(q, kernel).forward(q, k, v, causal=causal, scale=scale)


def block_attention_backward(dout, q, k, v, out, lse, *, causal: bool, scale: float | None = None, kernel="auto"):
    """(dq, dk, dv) of one block given the whole row's out and lse; see the module docstring."""
    scale = default_scale(q.shape[-1]) if scale is None else scale
    return select_kernel(q, kernel).backward(dout, q, k, v, out, lse, causal=causal, scale=scale)


class KernelAttention(torch.autograd.Function):
    """Full attention through a block kernel, autograd-aware (Ulysses' per-rank attention, the single-device
    baseline). q [b, n_head, s, d], k, v [b, n_kv_head, s, d] -> out [b, n_head, s, d]."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, kernel):
        out, lse = kernel.forward(q, k, v, causal=causal, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.kernel = causal, scale, kernel
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.kernel.backward(dout, q, k, v, out, lse, causal=ctx.causal, scale=ctx.scale)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def kernel_attention(q, k, v, *, causal: bool, scale: float | None = None, kernel="auto") -> torch.Tensor:
    """Attention of the whole (local) sequence through a block kernel, with autograd."""
    scale = default_scale(q.shape[-1]) if scale is None else scale
    return KernelAttention.apply(q, k, v, causal, scale, select_kernel(q, kernel))
