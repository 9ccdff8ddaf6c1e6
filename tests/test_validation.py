"""Every public value refuses a bad field when it is built, naming the field: NaN, inf, negatives, zero, bools for
ints, floats for ints, strings, unknown names and huge sizes (`pylib.plan.fields`, `pylib.analysis.inputs`); a
refusal changes nothing; the planner answers absurd sizes at once; messages never show braces or hide an error."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pylib.analysis import planner as P
from pylib.analysis.efficiency import CostModel
from pylib.dp import wrap
from pylib.i18n import MissingField, UnknownLanguage, tr
from pylib.labs.files import find_labs, select_labs
from pylib.labs.runner import resolve_overrides
from pylib.model import build_model
from pylib.plan import check
from pylib.plan.config import ModelConfig, MoEConfig
from pylib.plan.fields import divisors
from pylib.plan.options import MixedPrecision, RunOptions
from pylib.plan.recompute import Recompute
from pylib.runtime import ParallelConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bad_values import BAD_FIELDS, NAN, named_as  # noqa: E402  (bench/bad_values.py: the bench counts the same values)

ROOT = Path(__file__).resolve().parents[1]
CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=4, n_heads=4, d_ff=64)

# How each owner of BAD_FIELDS is built with one bad field.
BUILD = {
    cls.__name__: cls
    for cls in (ModelConfig, MoEConfig, RunOptions, Recompute, MixedPrecision, ParallelConfig, CostModel, P.SearchSpace)
}
BUILD["Cluster"] = lambda **kw: P.Cluster(**{"world_size": 8, **kw})
BUILD["Workload"] = lambda **kw: P.Workload(**{"batch": 8, "seq": 16, **kw})


def _cases():
    for owner, table in BAD_FIELDS.items():
        for name, values in table.items():
            for value in values:
                yield pytest.param(
                    lambda o=BUILD[owner], k=name, v=value: o(**{k: v}),
                    named_as(owner, name),
                    id=f"{owner}.{name}={value!r}",
                )


@pytest.mark.parametrize("build, field", list(_cases()))
def test_a_bad_field_is_refused_naming_it(build, field):
    with pytest.raises((TypeError, ValueError)) as err:
        build()
    assert field in str(err.value), str(err.value)


def test_integer_like_values_are_taken_as_ints():
    np = pytest.importorskip("numpy")
    cfg = ModelConfig(n_layers=np.int64(3))
    assert type(cfg.n_layers) is int and cfg == ModelConfig(n_layers=3)
    assert RunOptions(n_microbatches=np.int32(4)).n_microbatches == 4


def test_valid_values_stay_valid():
    """What the presets, the calibration and the book build: ints for floats are fine, numbers keep their value."""
    assert P.Cluster(8, gpu_memory=80, usable_fraction=1).usable_memory == 80
    assert MoEConfig(capacity_factor=1).capacity_factor == 1
    assert (
        RunOptions(zero_stage="zero2").zero_stage == 2 and RunOptions(recompute="full").recompute.granularity == "full"
    )
    assert P.SearchSpace(micro_batch_sizes=[1, 2]).micro_batch_sizes == [1, 2]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(gradient_divide_factor=NAN), "gradient_divide_factor"),
        (dict(gradient_divide_factor=0), "gradient_divide_factor"),
        (dict(gradient_divide_factor=True), "gradient_divide_factor"),
        (dict(bucket_bytes=0), "bucket_bytes"),
        (dict(zero_stage="zero4"), "zero_stage"),
    ],
)
def test_a_refused_wrap_leaves_the_model_as_it_was(kwargs, field):
    model = build_model(ModelConfig())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stage = kwargs.pop("zero_stage", "ddp")
    with pytest.raises((TypeError, ValueError), match=field):
        wrap(model, stage, None, precision=MixedPrecision("bfloat16"), **kwargs)
    after = model.state_dict()
    assert all(after[k].dtype == torch.float32 and torch.equal(after[k], v) for k, v in before.items())


def test_divisors_by_factorisation_match_trial_division():
    for n in range(1, 400):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    assert len(divisors(2**40)) == 41 and len(divisors(10**12)) == 169 and divisors(1_000_003) == [1, 1_000_003]


@pytest.mark.parametrize(
    "world, batch, seq, field",
    [(2**40, 8, 16, "world_size"), (8, 10**12, 16, "batch"), (8, 8, 2**40, "seq"), (True, 8, 16, "world_size")],
)
def test_absurd_sizes_are_refused_at_once(world, batch, seq, field):
    t0 = time.perf_counter()
    with pytest.raises((TypeError, ValueError), match=field):
        P.enumerate_plans(CFG, world, batch, seq)
    assert time.perf_counter() - t0 < 1.0


def test_prime_sizes_are_answered_at_once():
    t0 = time.perf_counter()
    assert P.enumerate_plans(CFG, 1_000_003, 1_000_003, 16)  # trial division took seconds here
    assert P.enumerate_plans(CFG, 8, 999_983, 16)
    assert time.perf_counter() - t0 < 1.0


def test_a_message_missing_a_field_raises_naming_it():
    with pytest.raises(MissingField, match=r"needs the field 'n' \(fields given: none\)"):
        tr("{n} ranks")
    with pytest.raises(MissingField, match=r"'m'.*fields given: n"):
        tr("{n} ranks of {m}", n=2)
    assert tr("{n} ranks", n=2) == "2 ranks" and tr("plain words") == "plain words"


def test_an_unknown_language_set_after_import_carries_the_error_it_hid(monkeypatch):
    monkeypatch.setenv("PYLIB_LANG", "klingon")
    with pytest.raises(UnknownLanguage, match=r"PYLIB_LANG='klingon'.*the refusal was: ModelConfig: n_layers=0"):
        ModelConfig(n_layers=0)
    with pytest.raises(UnknownLanguage, match=r"PYLIB_LANG='klingon'.*the message was: .*does not divide"):
        check(ModelConfig(), ParallelConfig(dp=2), 2, batch=3, seq=16)


def test_an_unknown_language_in_the_environment_fails_the_import():
    env = {**os.environ, "PYLIB_LANG": "klingon", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", "import pylib.plan.config"], env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "PYLIB_LANG='klingon' in the environment" in done.stderr


def test_a_labs_folder_that_does_not_exist_is_named(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ValueError, match=f"the labs folder {missing} does not exist"):
        select_labs(["00"], missing)
    with pytest.raises(ValueError, match="is not a folder"):
        find_labs(Path(__file__))


@pytest.mark.parametrize(
    "number, overrides, named",
    [
        ("00", {"h": -4}, "h"),
        ("00", {"b": 0}, "b"),
        ("06", {"lr": math.inf}, "lr"),
        ("06", {"lr": -0.01}, "lr"),
        ("92", {"microbatch_counts": []}, "microbatch_counts"),
        ("92", {"microbatch_counts": [0, 2]}, "microbatch_counts"),
        ("00", {"lang": "klingon"}, "klingon"),
    ],
)
def test_an_impossible_lab_parameter_is_refused_before_any_rank_starts(number, overrides, named):
    (lab,) = select_labs([number])
    with pytest.raises(ValueError, match=named):
        resolve_overrides([lab], overrides)
