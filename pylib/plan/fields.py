"""The checks every public value of pylib runs on its fields when it is built, and the one message they refuse with.

    integer(owner, "n_layers", value, low=1)         an int (not a bool, not a float), low <= value <= high
    number(owner, "gpu_memory", value, above=0)      an int or a float, not a bool, finite, in its range
    flag(owner, "causal", value)                     True or False
    instance(owner, "moe", value, MoEConfig)         an instance of that class
    choice(owner, "mlp", value, ("gelu", "swiglu"))  one of the names
    names(owner, "cp_kinds", value, CP_KINDS)        a non-empty tuple of those names, none unknown
    sequence(owner, "meshes", value, "ParallelConfig")  a non-empty tuple (or list)
    refusal(owner, name, value, rule, **numbers)     "ModelConfig: n_layers=0 must be >= 1", in the reader's language

A check returns the value (an integer-like value such as numpy's int64 as a Python int) or raises: `TypeError` for a
value of the wrong kind, `ValueError` for one out of range or not among the names, its message naming the owner, the
field, the value and the rule (`refusal`). Each rule is one message of the catalog (`N_` below), so the Chinese
edition refuses in Chinese with the same numbers. A dataclass calls these in its `__post_init__`, before anything
else reads the fields; nothing is changed before every field has passed.

`divisors(n)` lists a number's divisors from its prime factors (Pollard's rho past trial division), so a planner
asked about 2**40 ranks or a prime batch answers at once; `MAX_SIZE` is the largest world size, batch or sequence
length the planner searches.
"""

from __future__ import annotations

import math
import operator
import random

from pylib.i18n import N_, UnknownLanguage, language, tr

OWNED_FIELD = N_("{owner}: {name}={value} {rule}")
FIELD = N_("{name}={value} {rule}")
INTEGER = N_("must be an integer, not {kind}")
NUMBER = N_("must be a number, not {kind}")
FLAG = N_("must be True or False, not {kind}")
INSTANCE = N_("must be a {wanted}, not {kind}")
FINITE = N_("must be finite")
AT_LEAST = N_("must be >= {low}")
POSITIVE = N_("must be a positive integer")
ABOVE = N_("must be > {low}")
AT_MOST = N_("must be <= {high}")
BELOW = N_("must be < {high}")
ONE_OF = N_("must be one of {choices}")
TUPLE_OF = N_("must be a non-empty tuple of {choices}")
REPEATED = N_("names {name!r} twice")

MAX_SIZE = 2**24  # world size, batch (sequences) and sequence length the planner searches: 16,777,216


def refusal(owner: str | None, name: str, value, rule: str, /, **numbers) -> str:
    """`owner: name=value rule` in the reader's language; `rule` one of this module's rules, filled with `numbers`.
    Under an unknown $PYLIB_LANG it raises `UnknownLanguage` with the refusal in English, so neither is lost."""
    template = FIELD if owner is None else OWNED_FIELD
    try:
        language()
    except UnknownLanguage as e:
        english = template.format(owner=owner, name=name, value=_shown(value), rule=rule.format(**numbers))
        raise UnknownLanguage(f"{e}; the refusal was: {english}") from None
    return tr(template, owner=owner, name=name, value=_shown(value), rule=tr(rule, **numbers))


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value) -> str:
    return type(value).__name__


def integer(owner, name, value, *, low: int | None = 1, high: int | None = None, none: bool = False):
    """`value` as an int: an int or anything with __index__ (numpy's integers), not a bool; low <= value <= high.
    none=True lets None through (a field whose None means a default)."""
    if value is None and none:
        return None
    if type(value) is not int:
        if isinstance(value, bool) or not hasattr(type(value), "__index__"):
            raise TypeError(refusal(owner, name, value, INTEGER, kind=_kind(value)))
        value = operator.index(value)
    if low is not None and value < low:
        raise ValueError(refusal(owner, name, value, AT_LEAST, low=low))
    if high is not None and value > high:
        raise ValueError(refusal(owner, name, value, AT_MOST, high=high))
    return value


def number(owner, name, value, *, low=None, above=None, high=None, below=None, none: bool = False):
    """`value`, an int or a float (not a bool), finite, >= low, > above, <= high, < below (those given)."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(refusal(owner, name, value, NUMBER, kind=_kind(value)))
    if not math.isfinite(value):
        raise ValueError(refusal(owner, name, value, FINITE))
    if low is not None and value < low:
        raise ValueError(refusal(owner, name, value, AT_LEAST, low=low))
    if above is not None and not value > above:
        raise ValueError(refusal(owner, name, value, ABOVE, low=above))
    if high is not None and value > high:
        raise ValueError(refusal(owner, name, value, AT_MOST, high=high))
    if below is not None and not value < below:
        raise ValueError(refusal(owner, name, value, BELOW, high=below))
    return value


def flag(owner, name, value) -> bool:
    """`value`, which must be True or False (a bool: 1, "yes" and None are refused)."""
    if type(value) is not bool:
        raise TypeError(refusal(owner, name, value, FLAG, kind=_kind(value)))
    return value


def instance(owner, name, value, cls: type, *, none: bool = False):
    """`value`, which must be an instance of `cls` (or None with none=True)."""
    if value is None and none:
        return None
    if not isinstance(value, cls):
        raise TypeError(refusal(owner, name, value, INSTANCE, wanted=cls.__name__, kind=_kind(value)))
    return value


def choice(owner, name, value, choices: tuple):
    """`value`, which must be one of `choices` (compared by type too: True is not 1)."""
    if type(value) not in {type(c) for c in choices} or value not in choices:
        raise ValueError(refusal(owner, name, value, ONE_OF, choices=choices))
    return value


def sequence(owner, name, values, what) -> tuple:
    """`values` as a tuple (a list is taken as one), not empty; `what` says what it holds, for the message."""
    if not isinstance(values, (tuple, list)) or not values:
        error = ValueError if isinstance(values, (tuple, list)) else TypeError
        raise error(refusal(owner, name, values, TUPLE_OF, choices=what))
    return tuple(values)


def names(owner, name, values, choices: tuple) -> tuple:
    """`values` as a tuple (a list is taken as one): non-empty, each one of `choices`, none twice."""
    values = sequence(owner, name, values, choices)
    for v in values:
        choice(owner, name, v, choices)
    for v in values:
        if values.count(v) > 1:
            raise ValueError(refusal(owner, name, values, REPEATED, name=v))
    return tuple(values)


# ------------------------------------------------------------------------------------------------ divisors


def _small_factors(n: int, out: list[int]) -> int:
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        while n % p == 0:
            out.append(p)
            n //= p
    return n


def _is_prime(n: int) -> bool:
    """Miller-Rabin with the bases that decide every n < 3.3e24 exactly."""
    if n < 2:
        return False
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41):
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41):
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _rho(n: int) -> int:
    """A non-trivial factor of the composite odd n (Pollard's rho, Brent's variant)."""
    rng = random.Random(n)
    while True:
        y, c, m, g, r, q = rng.randrange(1, n), rng.randrange(1, n), 64, 1, 1, 1
        x = ys = y
        while g == 1:
            x = y
            for _ in range(r):
                y = (y * y + c) % n
            k = 0
            while k < r and g == 1:
                ys = y
                for _ in range(min(m, r - k)):
                    y = (y * y + c) % n
                    q = q * abs(x - y) % n
                g = math.gcd(q, n)
                k += m
            r *= 2
        if g == n:
            g = 1
            while g == 1:
                ys = (ys * ys + c) % n
                g = math.gcd(abs(x - ys), n)
        if g != n:
            return g


def _factor(n: int, out: list[int]) -> None:
    if n == 1:
        return
    if _is_prime(n):
        out.append(n)
        return
    d = _rho(n)
    _factor(d, out)
    _factor(n // d, out)


def divisors(n: int) -> list[int]:
    """Every divisor of the positive integer n, ascending, from its prime factorisation."""
    n = integer(None, "n", n, low=1)
    primes: list[int] = []
    _factor(_small_factors(n, primes), primes)
    out = [1]
    for p in sorted(set(primes)):
        out = [d * p**e for d in out for e in range(primes.count(p) + 1)]
    return sorted(out)


__all__ = ["MAX_SIZE", "choice", "divisors", "flag", "instance", "integer", "names", "number", "refusal", "sequence"]
