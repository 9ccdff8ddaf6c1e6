"""Article B's symbols (h, h_ffn, n_head, n_kv_head, d_head, h_kv, V, L; E, K, h_ffn_e; b, s, N) evaluated for a
config, article B's symbolic shapes evaluated with them, and measured shapes written back in symbols.

    sizes = symbol_sizes(cfg, b=8, s=16, N=2)
    evaluate("[b, n_head/N, s, d_head]", sizes)      # -> (8, 4, 16, 6)
    describe((48, 12), "[h, h_kv]", sizes, N=2)      # -> "[h, h_kv/N]"
    seed_b_shape(torch_shape, linear=True)           # torch's [out, in] -> article B's [in, out]
"""

from __future__ import annotations

import re

from pylib.model import ModelConfig


def symbol_sizes(cfg: ModelConfig, b: int | None = None, s: int | None = None, N: int | None = None) -> dict:
    """Article B's symbols evaluated for a config (and a batch, a sequence length, a parallel degree N)."""
    out = dict(
        h=cfg.d_model,
        h_ffn=cfg.d_ff,
        n_head=cfg.n_heads,
        n_kv_head=cfg.kv_heads,
        d_head=cfg.d_head,
        h_kv=cfg.d_kv,
        V=cfg.vocab_size,
        L=cfg.n_layers,
    )
    if cfg.moe is not None:
        out.update(E=cfg.moe.n_experts, K=cfg.moe.top_k, h_ffn_e=cfg.moe.d_ff or cfg.d_ff)
    for k, v in (("b", b), ("s", s), ("N", N)):
        if v is not None:
            out[k] = v
    return out


_TERM = re.compile(r"^[A-Za-z_][A-Za-z_0-9]*(\s*[*/]\s*[A-Za-z_0-9]+)*$")


def evaluate(symbolic: str, sizes: dict) -> tuple[int, ...]:
    """'[b, n_head/N, s, d_head]' -> a tuple of ints, every term evaluated with `sizes` (must divide evenly)."""
    inner = symbolic.strip()
    if not (inner.startswith("[") and inner.endswith("]")):
        raise ValueError(f"not a shape: {symbolic!r}")
    out = []
    for term in inner[1:-1].split(","):
        term = term.strip()
        if not _TERM.match(term):
            raise ValueError(f"cannot evaluate {term!r} in {symbolic!r}")
        value = eval(term, {"__builtins__": {}}, dict(sizes))  # noqa: S307 - names and * / only (checked above)
        if value != int(value):
            raise ValueError(f"{term} = {value} is not a whole number ({sizes})")
        out.append(int(value))
    return tuple(out)


def describe(local, full_symbolic: str, sizes: dict, N: int) -> str:
    """A measured local shape written against the full shape's symbols: each dim as `sym`, `sym/N` or a number,
    e.g. (48, 12) against '[h, h_kv]' -> '[h, h_kv/N]'."""
    if local is None:
        return "—"
    syms = [t.strip() for t in full_symbolic.strip()[1:-1].split(",")]
    full = evaluate(full_symbolic, sizes)
    terms = []
    for sym, f, v in zip(syms, full, local):
        if v == f:
            terms.append(sym)
        elif v * N == f:
            terms.append(f"{sym}/N")
        else:
            terms.append(str(v))
    return "[" + ", ".join(terms) + "]"


def seed_b_shape(torch_shape, linear: bool):
    """torch's [out, in] -> article B's [in, out] for a linear weight; anything else unchanged."""
    return None if torch_shape is None else (tuple(reversed(torch_shape)) if linear else tuple(torch_shape))
