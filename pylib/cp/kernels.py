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

Three kernels:
  `TorchKernel`  plain torch, any device and dtype: the CPU path and the reference.
  `SDPAKernel`   torch's own fused scaled-dot-product attention ops, which return the LSE and have a backward that
                 takes it: on CUDA the flash kernel (fp16/bf16) or the memory-efficient one (also fp32), on CPU
                 torch's CPU flash kernel. It ships inside every CUDA torch from 2.6: no extra package.
  `FlashKernel`  flash-attn 2 (optional; used when it imports), fp16/bf16 on CUDA.

`select_kernel(q, "auto")` picks, on CUDA, flash-attn when it imports and suits dtype and head size, else the first
fused torch op that works on this device for this dtype and head size (found once, by running it on a tiny input
against `TorchKernel`, then cached per device, dtype and d_head), else `TorchKernel`; on CPU always `TorchKernel`
(kernel="sdpa" asks for torch's CPU fused kernel). The CUDA paths have not run in this repository's CI (no GPU):
`bench/gpu_single.py` checks them against the float32 reference on one GPU.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math

import torch

from pylib.i18n import N_, tr
from pylib.model.attention import expand_kv
from pylib.plan.heads import kv_group_problem


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
    if problem := kv_group_problem(q.shape[1], k.shape[1]):
        raise ValueError(problem)
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError(f"a causal block must be square: s_q={q.shape[2]}, s_k={k.shape[2]}")


class TorchKernel:
    """Attention of a block in plain torch: scores, masked, log-sum-exp, softmax, weighted sum.

    Computes in the accumulation dtype (float32 for half inputs, as a fused kernel does in registers)."""

    name = "torch"

    def __repr__(self) -> str:
        return "TorchKernel()"

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

    def __repr__(self) -> str:
        return "FlashKernel()"

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
        # flash-attn reads softmax_lse as float32 without checking: a ring merging in bf16 hands it bf16 rows
        _flash_attn_backward(*t, lse.to(torch.float32).contiguous(), dq, dk, dv, **kwargs)
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


def _expand(k, v, n_head):
    return expand_kv(k, n_head).contiguous(), expand_kv(v, n_head).contiguous()


def _fold_kv_heads(dk, dv, n_kv: int):
    """Gradients of the expanded K/V heads [b, n_head, s, d] -> [b, n_kv_head, s, d]: each K/V head served
    n_head / n_kv_head query heads, so their gradients add."""
    if dk.shape[1] == n_kv:
        return dk, dv
    group = dk.shape[1] // n_kv
    return dk.unflatten(1, (n_kv, group)).sum(2), dv.unflatten(1, (n_kv, group)).sum(2)


SDPA_VARIANTS = ("flash", "efficient", "cpu")


class SDPAKernel:
    """torch's fused attention ops (`torch.ops.aten._scaled_dot_product_*`), forward and backward with the LSE.

    The block-kernel interface of the module docstring: q [b, n_head, s_q, d_head], k, v [b, n_kv_head, s_k, d_head]
    -> out [b, n_head, s_q, d_head] (q's dtype), lse [b, n_head, s_q] (float32; float64 for float64 inputs).
    variant "flash" (CUDA, fp16/bf16), "efficient" (CUDA, fp16/bf16/fp32) or "cpu" (torch's CPU flash kernel:
    float64/float32/bf16). GQA: K and V are expanded to n_head heads for the op and dK, dV summed back. The ops'
    extra backward arguments (sequence offsets, RNG state: unused without dropout) are the ones one forward of the
    variant returned (`template`, from `prepare_sdpa`), the pairing torch's own autograd uses; the memory-efficient
    op pads its LSE to a multiple of `lse_align` rows, which backward restores. The positional arguments are torch
    2.6's and 2.13's alike (`pylib.runtime.compat`, tests/test_torch_range.py)."""

    name = "sdpa"

    def __init__(self, variant: str, template: tuple = (), lse_align: int = 1):
        if variant not in SDPA_VARIANTS:
            raise ValueError(f"SDPAKernel variant={variant!r} must be one of {SDPA_VARIANTS}")
        self.variant, self.template, self.lse_align = variant, template, lse_align

    def __repr__(self) -> str:
        return f"SDPAKernel({self.variant!r})"

    def _forward_op(self, q, k, v, causal, scale):
        """The op's raw outputs for [b, n_head, s, d] q, k, v (K/V already expanded)."""
        aten = torch.ops.aten
        if self.variant == "flash":
            return aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
        if self.variant == "efficient":
            return aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal, scale=scale)
        return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)

    def forward(self, q, k, v, *, causal: bool, scale: float):
        _check_shapes(q, k, v, causal)
        kf, vf = _expand(k, v, q.shape[1])
        res = self._forward_op(q.contiguous(), kf, vf, causal, scale)
        out, lse = res[0], res[1][..., : q.shape[2]]  # the efficient op pads the LSE's rows
        return out, lse.to(accumulation_dtype(q.dtype))

    def backward(self, dout, q, k, v, out, lse, *, causal: bool, scale: float):
        _check_shapes(q, k, v, causal)
        acc = accumulation_dtype(q.dtype)
        s_q, s_k, n_kv = q.shape[2], k.shape[2], k.shape[1]
        kf, vf = _expand(k, v, q.shape[1])
        q, dout, out = q.contiguous(), dout.to(q.dtype).contiguous(), out.to(q.dtype).contiguous()
        lse = lse.to(acc).contiguous()  # the ops read the LSE in float32 (float64 for float64 inputs)
        aten = torch.ops.aten
        if self.variant == "flash":
            cum_q, cum_k, seed, offset = self.template
            dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(
                dout, q, kf, vf, out, lse, cum_q, cum_k, s_q, s_k, 0.0, causal, seed, offset, scale=scale
            )
        elif self.variant == "efficient":
            seed, offset = self.template
            rows = -(-s_q // self.lse_align) * self.lse_align
            if rows != s_q:
                lse = torch.nn.functional.pad(lse, (0, rows - s_q))
            dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
                dout, q, kf, vf, None, out, lse, seed, offset, 0.0, [True, True, True, False], causal, scale=scale
            )
        else:
            dq, dk, dv = aten._scaled_dot_product_flash_attention_for_cpu_backward(
                dout, q, kf, vf, out, lse, 0.0, causal, scale=scale
            )
        dk, dv = _fold_kv_heads(dk.to(acc), dv.to(acc), n_kv)
        return dq.to(acc), dk, dv


KERNELS = {"torch": TorchKernel, "flash": FlashKernel, "sdpa": SDPAKernel}
PROBE_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}


def sdpa_candidates(device_type: str, dtype: torch.dtype) -> tuple[str, ...]:
    """The SDPAKernel variants worth trying, best first (the flash op takes only half precision)."""
    if device_type == "cuda":
        if dtype in FLASH_DTYPES:
            return ("flash", "efficient")
        return ("efficient",) if dtype == torch.float32 else ()
    if device_type == "cpu" and dtype in (torch.float64, torch.float32, torch.bfloat16):
        return ("cpu",)
    return ()


def _probe_inputs(device, dtype, d_head):
    """Tiny GQA inputs q [1, 2, 8, d], k, v [1, 1, 8, d], dout [1, 2, 8, d] (random; on meta, shapes only)."""
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, h, 8, d_head, generator=g).to(device=device, dtype=dtype) for h in (2, 1, 1, 2)]


def prepare_sdpa(variant: str, device, dtype: torch.dtype, d_head: int) -> SDPAKernel:
    """An SDPAKernel of `variant` with its backward template (the extra arguments a forward of the op returns, and
    the LSE's row padding) taken from one forward on a tiny input on `device`. Works on the meta device too, where
    only shapes are computed (tests/test_cp_fused_kernel.py checks the CUDA variants' calls that way)."""
    q, k, v, _ = _probe_inputs(device, dtype, d_head)
    scale = default_scale(d_head)
    kernel = SDPAKernel(variant)
    raw = kernel._forward_op(q, *_expand(k, v, 2), True, scale)
    if variant == "flash":
        kernel.template = (raw[2], raw[3], raw[6], raw[7])
    elif variant == "efficient":
        kernel.template = (raw[2], raw[3])
        one = kernel._forward_op(q[:, :, :1], *_expand(k[:, :, :1], v[:, :, :1], 2), False, scale)
        kernel.lse_align = max(1, one[1].shape[-1])  # the op pads the LSE's rows to a multiple of this
    return kernel


def probe_sdpa(variant: str, device: torch.device, dtype: torch.dtype, d_head: int) -> SDPAKernel:
    """A prepared SDPAKernel of `variant` that has just run forward and backward on a tiny GQA input on `device`
    and agreed with TorchKernel (relative error under PROBE_TOLERANCE); raises (RuntimeError, ValueError) where
    it cannot."""
    kernel = prepare_sdpa(variant, device, dtype, d_head)
    q, k, v, dout = _probe_inputs(device, dtype, d_head)
    scale = default_scale(d_head)
    ref = TorchKernel()
    got = (*kernel.forward(q, k, v, causal=True, scale=scale),)
    want = (*ref.forward(q, k, v, causal=True, scale=scale),)
    got += kernel.backward(dout, q, k, v, want[0], want[1], causal=True, scale=scale)
    want += ref.backward(dout, q, k, v, want[0], want[1], causal=True, scale=scale)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        a, b = a.double(), b.double()
        err = ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
        if not err <= PROBE_TOLERANCE[dtype]:
            raise ValueError(f"SDPAKernel({variant!r}) {name} differs from TorchKernel by {err:.1e} (relative)")
    return kernel


_FUSED: dict[tuple, tuple[SDPAKernel | None, str]] = {}


def fused_kernel(device: torch.device, dtype: torch.dtype, d_head: int) -> tuple[SDPAKernel | None, str]:
    """(the first working SDPAKernel for this device, dtype and d_head, or None; why the others were passed over).
    Probed once per (device, dtype, d_head) and cached: later calls inspect nothing."""
    key = (str(device), dtype, int(d_head))
    if key not in _FUSED:
        reasons = []
        found = None
        for variant in sdpa_candidates(torch.device(device).type, dtype):
            try:
                found = probe_sdpa(variant, torch.device(device), dtype, d_head)
                break
            except (RuntimeError, ValueError, NotImplementedError) as exc:
                reasons.append(f"{variant}: {str(exc).splitlines()[0][:200]}")
        if not sdpa_candidates(torch.device(device).type, dtype):
            reasons.append(f"no fused torch op for {str(dtype).replace('torch.', '')} on {torch.device(device).type}")
        _FUSED[key] = (found, "; ".join(reasons))
    return _FUSED[key]


def clear_kernel_cache() -> None:
    """Forget every probed kernel and selection (tests; or after changing devices)."""
    _FUSED.clear()
    _SELECTED.clear()


def choose_kernel(
    device_type: str,
    dtype: torch.dtype,
    d_head: int,
    flash_is_available: bool,
    requested: str = "auto",
    *,
    fused: str | None = None,
    fused_problem: str = "",
) -> str:
    """The kernel name for these tensors: "flash", "sdpa" or "torch". A pure function, so the choice is testable
    on CPU. `fused` names the SDPAKernel variant that works here (None: none does, or none was asked about;
    `fused_problem` says why).

    requested="auto": flash-attn when it is available, the tensors are CUDA, dtype is fp16/bf16 and d_head is a
    multiple of 8 up to 256; else on CUDA torch's fused op when one works; torch otherwise. requested="flash" or
    "sdpa" raises naming the unmet condition."""
    if requested == "torch":
        return "torch"
    if requested not in ("auto", "flash", "sdpa"):
        raise ValueError(f"kernel={requested!r} must be 'auto', 'torch', 'flash', 'sdpa' or a kernel object")
    if requested == "sdpa":
        if fused is None:
            raise ValueError(f"kernel='sdpa' cannot run: {fused_problem or 'no fused torch op works here'}")
        return "sdpa"
    problems = []  # (message, fields): translated only when said (a rank run that says nothing asks no language)
    if not flash_is_available:
        problems.append((N_("flash-attn is not installed (optional: pip install flash-attn --no-build-isolation)"), {}))
    if device_type != "cuda":
        problems.append((N_("tensors are on {device}, flash-attn needs cuda"), dict(device=device_type)))
    if dtype not in FLASH_DTYPES:
        problems.append((N_("dtype {dtype} is not float16/bfloat16"), dict(dtype=str(dtype).replace("torch.", ""))))
    if d_head % 8 or d_head > FLASH_MAX_HEAD_DIM:
        problems.append((N_("d_head={d} is not a multiple of 8 up to {most}"), dict(d=d_head, most=FLASH_MAX_HEAD_DIM)))
    if not problems:
        return "flash"
    if requested == "flash":
        said = tr("; ").join(tr(message, **fields) for message, fields in problems)
        raise ValueError(tr("kernel='flash' cannot run: {problems}", problems=said))
    if device_type == "cuda" and fused is not None:
        return "sdpa"
    return "torch"


_SELECTED: dict[tuple, object] = {}


def select_kernel(q: torch.Tensor, kernel="auto"):
    """A kernel object for q's device, dtype and head size. `kernel` may already be a kernel object.

    The choice is made once per (request, device, dtype, d_head) and cached: a ring calls this once per attention
    call, and only the first call on a new device/dtype/head size probes anything."""
    if not isinstance(kernel, str):
        if not (hasattr(kernel, "forward") and hasattr(kernel, "backward")):
            raise TypeError(f"a block kernel needs forward() and backward(); got {type(kernel).__name__}")
        return kernel
    key = (kernel, str(q.device), q.dtype, q.shape[-1])
    if key not in _SELECTED:
        device_type, d = q.device.type, q.shape[-1]
        flash = flash_available() if kernel in ("auto", "flash") else False
        fused, problem = None, ""
        if kernel == "sdpa" or (kernel == "auto" and device_type == "cuda"):
            fused, problem = fused_kernel(q.device, q.dtype, d)
        name = choose_kernel(
            device_type, q.dtype, d, flash, kernel, fused=fused.variant if fused else None, fused_problem=problem
        )
        _SELECTED[key] = fused if name == "sdpa" else KERNELS[name]()
    return _SELECTED[key]


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
