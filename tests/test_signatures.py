"""pylib's signatures, read from the source (no import): short parameter lists and one name per concept.

A function that needs more than ten parameters is carrying a bag of options or threading a measurement through
an algorithm; the options travel as one `pylib.plan.RunOptions` (the planner's as a `Plan` or a `SearchSpace`),
measurement as a recorder object. And one concept has one spelling: a `ParallelConfig` parameter is `par`, the
microbatch count `n_microbatches` (never `m` or `microbatches`), the ZeRO stage `zero_stage` (a `ZeroStage`;
never `stage` or `zero`), the recomputation choice a `Recompute`, and no signature restates a `RunOptions` default.
Where `stage` or `m` means something else (a pipeline stage, a GEMM's rows) an allow-list says what.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from pylib.plan import RunOptions

PYLIB = Path(__file__).resolve().parent.parent / "pylib"
MAX_PARAMETERS = 10


def _functions():
    """(where, function name, [(parameter, default node or None)]) of every def in pylib; self and cls left out,
    keyword-only parameters counted, *args and **kwargs not."""
    for path in sorted(PYLIB.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = node.args
            positional = a.posonlyargs + a.args
            defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
            params = list(zip(positional, defaults)) + list(zip(a.kwonlyargs, a.kw_defaults))
            if params and params[0][0].arg in ("self", "cls"):
                params = params[1:]
            where = f"{path.relative_to(PYLIB.parent)}:{node.lineno}"
            yield where, node.name, [(p.arg, d, p.annotation) for p, d in params]


FUNCTIONS = list(_functions())


def test_the_source_is_read():
    names = {name for _, name, _ in FUNCTIONS}
    assert {"run_pipeline", "from_full", "enumerate_plans", "chunk_saved_bytes"} <= names


def test_no_function_takes_more_than_ten_parameters():
    over = [f"{where} {name}: {len(params)}" for where, name, params in FUNCTIONS if len(params) > MAX_PARAMETERS]
    assert not over, f"more than {MAX_PARAMETERS} parameters (pass a RunOptions, a Plan or a recorder):\n" + "\n".join(
        over
    )


# parameter name -> the one spelling of its concept
RENAMED = {
    "pc": "par (a ParallelConfig)",
    "microbatches": "n_microbatches (the microbatch count)",
    "zero": "zero_stage (a ZeroStage)",
    "recompute_method": "recompute, a Recompute(granularity, method, num_layers)",
    "recompute_num_layers": "recompute, a Recompute(granularity, method, num_layers)",
}


def test_one_spelling_per_concept_in_signatures():
    found = [
        f"{where} {name}({p}): spell it {RENAMED[p]}"
        for where, name, params in FUNCTIONS
        for p, _, _ in params
        if p in RENAMED
    ]
    assert not found, "\n".join(found)


# Where a parameter named `stage` or `m` means something else than the ZeRO stage or the microbatch count:
# (file under pylib/, function) -> what it means there. Anywhere else `stage` is the ZeRO stage spelled the old
# way (spell it zero_stage, a ZeroStage) and `m` the microbatch count (spell it n_microbatches).
OTHER_MEANING = {
    "stage": {
        # a pipeline stage: its index or the module that holds its layers
        ("compose/model.py", "_wrap"): "the pipeline stage's module",
        ("compose/reductions.py", "parameter_map"): "the pipeline stage's module",
        ("compose/reductions.py", "reduction_table"): "the pipeline stage's module",
        ("compose/reductions.py", "kv_replica_counts"): "the pipeline stage's module",
        ("compose/stage.py", "__init__"): "the pipeline stage's index",
        ("compose/stage.py", "from_full"): "the pipeline stage's index",
        ("plan/split.py", "layers_of_stage"): "the pipeline stage's index",
        ("pp/executor.py", "shape_of"): "the pipeline stage's index",
        ("pp/split.py", "__init__"): "the pipeline stage's index",
        ("pp/split.py", "from_full"): "the pipeline stage's index",
        # a stage of one layer's computation (seed check, layer-flow figure)
        ("seedcheck/traffic_light.py", "derived_remedy"): "a stage of the layer's flow",
        ("viz/layer_flow.py", "_stage_detail"): "a stage of the layer's flow (FlowStage)",
    },
    "m": {
        ("analysis/efficiency.py", "gemm_seconds"): "a GEMM's rows, [m, k] x [k, n]",
        ("dp/fsdp.py", "walk"): "a module",
        ("viz/dp.py", "_memory_bar"): "one stage's measured bytes",
        ("viz/tp.py", "_matrix"): "a matrix to draw",
    },
}
SPELLING = {"stage": "zero_stage (a ZeroStage)", "m": "n_microbatches (the microbatch count)"}


def test_stage_and_m_are_not_the_zero_stage_or_the_microbatch_count():
    found = [
        f"{where} {name}({p}): spell it {SPELLING[p]}, or list it in OTHER_MEANING with what it means there"
        for where, name, params in FUNCTIONS
        for p, _, _ in params
        if p in OTHER_MEANING and (where.split(":")[0].removeprefix("pylib/"), name) not in OTHER_MEANING[p]
    ]
    assert not found, "\n".join(found)


def test_every_other_meaning_is_still_there():
    """An entry of OTHER_MEANING whose function is gone or renamed its parameter is stale: remove it."""
    present = {
        (where.split(":")[0].removeprefix("pylib/"), name, p) for where, name, params in FUNCTIONS for p, *_ in params
    }
    stale = [f"{key} ({p})" for p, keys in OTHER_MEANING.items() for key in keys if (*key, p) not in present]
    assert not stale, "\n".join(stale)


def test_a_zero_stage_parameter_is_the_zero_stage_and_the_enum_is_called_zero_stage():
    """Parameters annotated `ZeroStage` are named zero_stage, and none named zero_stage has a string default."""
    found = []
    for where, name, params in FUNCTIONS:
        for p, default, annotation in params:
            ann = ast.unparse(annotation) if annotation is not None else ""
            if "ZeroStage" in ann and p != "zero_stage":
                found.append(f"{where} {name}({p}: {ann})")
            if p == "zero_stage" and isinstance(default, ast.Constant) and isinstance(default.value, str):
                found.append(f"{where} {name}({p}={default.value!r})")
    assert not found, "\n".join(found)


def test_no_signature_restates_a_run_options_default():
    """A parameter named like one of the composed run's options with RunOptions' default written as a literal is a
    second copy of that default (RunOptions holds the one): take the options instead. The CP mode's own `kind` and
    `layout` default to the same constants (`CP_KIND`, `CP_LAYOUT` in pylib.plan.options), never to a literal. The
    modes' other defaults are their own (a TP layer's `sequence_parallel` off, the pipeline's `v` = 1 and its 1F1B
    `schedule`)."""
    fields = {f.name: f.default for f in dataclasses.fields(RunOptions)}
    same_as = {"kind": "cp_kind", "layout": "cp_layout"}  # the CP mode's names for two of the options
    found = []
    for where, name, params in FUNCTIONS:
        for p, default, _ in params:
            field = same_as.get(p, p)
            if field in ("cp_kind", "cp_layout", "zero_stage", "recompute", "n_microbatches"):
                if isinstance(default, ast.Constant) and default.value == fields[field]:
                    found.append(f"{where} {name}({p}={default.value!r})")
    assert not found, "\n".join(found)
