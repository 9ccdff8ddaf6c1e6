"""The GPU path runs on every torch from 2.6 to 2.13: pylib and bench call only torch 2.6's names outside
`pylib.runtime.compat`, and with every newer name hidden the collectives, TP+SP, ZeRO-1/2/3, ETP and CP give the
same results as with them.

tests/data/torch26_api.txt is torch 2.6.0's public surface and tests/data/torch26_signatures.txt the keyword
parameters of its functions and classes, both read statically from its wheel by tools/torch_api_surface.py (its
docstring says how); tests/data/torch26_sdpa_schemas.txt holds 2.6's schemas of the fused attention ops. The scan
sees module attributes (`torch.x`, `dist.x`, `F.x`, names imported from torch) and the keywords passed to them,
not methods of tensors or other objects."""

from __future__ import annotations

import ast
import importlib
import re
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from pylib.plan import RunOptions
from pylib.runtime import ParallelConfig, compat, launch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
API = {line for line in (DATA / "torch26_api.txt").read_text().split() if not line.startswith("#")}


def _modules() -> set[str]:
    """Every dotted prefix that has names of its own in API (torch, torch.nn, torch.nn.functional, ...)."""
    return {line.rsplit(".", 1)[0] for line in API} | {"torch.ops"}


SIGNATURES = {
    name: set(params.split(","))
    for name, _, params in (line.partition(" ") for line in (DATA / "torch26_signatures.txt").read_text().splitlines())
    if not name.startswith("#")
}
MODULES = _modules()  # the prefixes an attribute chain walks through; the first other attribute is a name
COMPAT = ROOT / "pylib" / "runtime" / "compat.py"  # where newer names are allowed: scanned by no test here
SCANNED = sorted(p for p in [*ROOT.glob("pylib/**/*.py"), *ROOT.glob("bench/**/*.py")] if p != COMPAT)


# ------------------------------------------------------------------------------------------------ the scanner


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> the torch module or object it stands for, from every import in the file."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch" or a.name.startswith("torch."):
                    out[a.asname or "torch"] = a.name if a.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "torch" or node.module.startswith("torch."):
                for a in node.names:
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _chain(node) -> list[str] | None:
    """a.b.c -> ["a", "b", "c"] when the chain starts at a plain name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _resolve(dotted: list[str]) -> str | None:
    """The torch name a chain uses (e.g. 'torch.nn.functional.softmax'), walking through modules; None when the
    chain is only a module."""
    cur = dotted[0]
    for part in dotted[1:]:
        nxt = f"{cur}.{part}"
        if nxt in MODULES:
            cur = nxt
            continue
        return nxt
    return None


def _mark_parents(tree):
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child._parent = node


def unknown_names(source: str) -> list[tuple[int, str]]:
    """Uses of torch names that torch 2.6 does not have. Only the outermost attribute of a chain counts, so
    `torch.nn.functional.softmax` is one use; anything after the first non-module name (`torch.float32.itemsize`,
    `torch.ops.aten.mm.default`) is an attribute of that object, not a torch name."""
    tree = ast.parse(source)
    _mark_parents(tree)
    found = []
    aliases = _aliases(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in MODULES:
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Attribute) and not isinstance(getattr(node, "_parent", None), ast.Attribute):
            chain = _chain(node)
            if chain and chain[0] in aliases:
                name = _resolve([*aliases[chain[0]].split("."), *chain[1:]])
                if name is not None:
                    found.append((node.lineno, name))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                chain = _chain(node.args[0])
                if chain and chain[0] in aliases:
                    full = ".".join([*aliases[chain[0]].split("."), *chain[1:]])
                    if full in MODULES:
                        found.append((node.lineno, f"{full}.{node.args[1].value}"))
    return [(line, name) for line, name in found if name not in API and name.split(".")[-1] != "__version__"]


def _called_name(func, aliases) -> str | None:
    """The torch name a call's function expression stands for, if any."""
    if isinstance(func, ast.Name) and func.id in aliases:
        return aliases[func.id]
    chain = _chain(func) if isinstance(func, ast.Attribute) else None
    if chain and chain[0] in aliases:
        return _resolve([*aliases[chain[0]].split("."), *chain[1:]])
    return None


def unknown_keywords(source: str) -> list[tuple[int, str]]:
    """Keyword arguments passed to a torch function or class that its torch 2.6 signature does not have."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _called_name(node.func, aliases)
            if name in SIGNATURES:
                found += [
                    (node.lineno, f"{name}({k.arg}=)") for k in node.keywords if k.arg not in (None, *SIGNATURES[name])
                ]
    return found


def version_branches(source: str) -> list[tuple[int, str]]:
    """hasattr/getattr-with-default on a torch module, or torch.__version__ inside a comparison."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            is_probe = node.func.id == "hasattr" or (node.func.id == "getattr" and len(node.args) == 3)
            chain = _chain(node.args[0])
            if is_probe and chain and chain[0] in aliases:
                out.append((node.lineno, f"{node.func.id}({'.'.join(chain)}, ...)"))
        if isinstance(node, ast.Compare):
            for sub in ast.walk(node):
                chain = _chain(sub) if isinstance(sub, ast.Attribute) else None
                if chain and chain[0] in aliases and chain[-1] == "__version__":
                    out.append((node.lineno, "torch.__version__ compared"))
    return out


# ------------------------------------------------------------------------------------------------ the surface


def test_the_committed_list_is_torch_2_6s_surface():
    header = (DATA / "torch26_api.txt").read_text().splitlines()[0]
    assert header.startswith("# torch 2.6.0 public API surface"), header
    for name in ("torch.distributed.all_gather_into_tensor", "torch.distributed.reduce_scatter_tensor"):
        assert name in API
    for newer in compat.POST_26_APIS:
        assert ".".join(newer) not in API, f"{newer} is listed as post-2.6 but torch 2.6 has it"


def test_the_scanner_flags_a_post_2_6_name_and_a_version_branch():
    snippet = (
        "import torch\nimport torch.distributed as dist\nimport torch.nn.functional as F\n"
        "from torch.distributed import all_gather_single\n"
        "dist.all_gather_single(a, b)\nF.softmax(x, -1)\ntorch.nn.functional.no_such_fn(x)\n"
        "torch.ops.aten._scaled_dot_product_flash_attention.default(q, k, v)\ntorch.float32.itemsize\n"
        "getattr(dist, 'reduce_scatter_single')\n"
        "if hasattr(dist, 'all_gather_single'): pass\nif torch.__version__ >= '2.13': pass\n"
    )
    assert sorted(unknown_names(snippet)) == [
        (4, "torch.distributed.all_gather_single"),
        (5, "torch.distributed.all_gather_single"),
        (7, "torch.nn.functional.no_such_fn"),
        (10, "torch.distributed.reduce_scatter_single"),
    ]
    assert [line for line, _ in version_branches(snippet)] == [11, 12]
    calls = "import torch\nimport torch.distributed as dist\nfrom torch.distributed import init_process_group\n"
    calls += "dist.init_process_group(backend='gloo', device_id=None)\ntorch.zeros(2, dtype=torch.float32, pin=True)\n"
    calls += "init_process_group(bakend='gloo')\ndist.P2POp(dist.isend, t, 1, group=None)\n"
    assert unknown_keywords(calls) == [(5, "torch.zeros(pin=)"), (6, "torch.distributed.init_process_group(bakend=)")]


@pytest.mark.slow
@pytest.mark.parametrize("path", SCANNED, ids=lambda p: str(p.relative_to(ROOT)))
def test_pylib_and_bench_use_only_torch_2_6_names_outside_compat(path):
    source = path.read_text()
    bad = unknown_names(source)
    assert not bad, f"{path.relative_to(ROOT)} uses names torch 2.6 lacks (route them through compat): {bad}"
    keywords = unknown_keywords(source)
    assert not keywords, f"{path.relative_to(ROOT)} passes keywords torch 2.6 lacks: {keywords}"
    branches = version_branches(source)
    assert not branches, f"{path.relative_to(ROOT)} branches on torch's version outside compat: {branches}"


def test_only_the_traced_collectives_call_compats_communication_functions():
    """compat's all_gather_into / reduce_scatter_into communicate; only collectives.py (which traces) may call them,
    and agreement.py, the untraced descriptor exchange that collectives.py runs before each collective on gloo."""
    callers = sorted(
        str(path.relative_to(ROOT))
        for path in ROOT.glob("pylib/**/*.py")
        if path != COMPAT and re.search(r"\b(all_gather_into|reduce_scatter_into)\(", path.read_text())
    )
    assert callers == ["pylib/runtime/agreement.py", "pylib/runtime/collectives.py"], callers


def test_compat_reads_versions_and_names_the_supported_range():
    assert compat.torch_version("2.11.0+cu128") == (2, 11)
    assert compat.unsupported_reason("2.6.0") is None and compat.unsupported_reason("2.13.1") is None
    assert "older than 2.6" in compat.unsupported_reason("2.5.1")
    assert "newer than 2.13" in compat.unsupported_reason("2.14.0")
    with pytest.raises(ValueError, match="cannot read a torch version"):
        compat.torch_version("nightly")


def _schema_args(text: str) -> list[str]:
    """The positional argument types of a schema, e.g. ['Tensor', 'Tensor', 'float', ...]."""
    inside = text[text.index("(") + 1 : text.index(") ->")]
    args = []
    for arg in inside.split(", "):
        if arg == "*":
            args.append("*")
            continue
        args.append(arg.split(" ")[0])
    return args


def test_the_fused_attention_ops_take_torch_2_6s_positional_arguments():
    """pylib.cp.kernels calls these ops positionally; their argument types and order must be 2.6's."""
    for line in (DATA / "torch26_sdpa_schemas.txt").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line[: line.index("(")]
        installed = str(getattr(torch.ops.aten, name).default._schema).removeprefix("aten::")
        assert _schema_args(installed) == _schema_args(line), (name, installed, line)


# ------------------------------------------------------------------------------------------------ hidden APIs


def _run_with_newer_apis_hidden(fn, *args, **kwargs):
    """Inside a forked rank: delete every post-2.6 name compat uses from torch, count the 2.6 calls, run fn."""
    for module, name in compat.POST_26_APIS:
        delattr(importlib.import_module(module), name)
    calls = Counter()
    for name in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        real = getattr(dist, name)

        def counting(*a, _real=real, _name=name, **kw):
            calls[_name] += 1
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # 2.13 deprecates them; 2.6 .. 2.12 do not
                return _real(*a, **kw)

        setattr(dist, name, counting)
    assert not hasattr(dist, "all_gather_single")
    return fn(*args, **kwargs), dict(calls)


def _run_as_installed(fn, *args, **kwargs):
    return fn(*args, **kwargs), {}


def _both(fn, world, *args, **kwargs):
    """(results with the installed torch's names, results with only 2.6's names, 2.6 calls per rank)."""
    plain = [r for r, _ in launch(_run_as_installed, world, fn, *args, backend="gloo", timeout=200, **kwargs)]
    hidden = launch(_run_with_newer_apis_hidden, world, fn, *args, backend="gloo", timeout=200, **kwargs)
    return plain, [r for r, _ in hidden], [c for _, c in hidden]


def _assert_same(a, b, where="result"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _every_gather_and_scatter():
    from pylib.runtime import agreement_check
    from pylib.runtime import collectives as C

    agreement_check(False)  # count the collectives' own calls, not the agreement check's descriptor exchange
    r, n = dist.get_rank(), dist.get_world_size()
    x = torch.arange(12, dtype=torch.float64).reshape(3, 4) + 100 * r
    rows = torch.full((r + 1, 2), float(r))
    out = dict(
        gather=C.all_gather_tensor(x, 1),
        scatter=C.reduce_scatter_tensor(x.repeat(n, 1), 0),
        gather_rows=C.all_gather_rows(rows, [1, 2]),
        scatter_rows=C.reduce_scatter_rows(torch.ones(3, 2) * (r + 1), [1, 2]),
        scatter_async=C.reduce_scatter_async(x.repeat(1, n), 1).wait(),
    )
    return out


def test_collectives_give_the_same_results_with_every_post_2_6_api_hidden():
    plain, hidden, calls = _both(_every_gather_and_scatter, 2)
    _assert_same(plain, hidden)
    assert all(c == {"all_gather_into_tensor": 2, "reduce_scatter_tensor": 3} for c in calls), calls
    x0 = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    torch.testing.assert_close(plain[1]["gather"], torch.cat([x0, x0 + 100], 1))
    torch.testing.assert_close(plain[0]["scatter"], 2 * x0 + 100)
    torch.testing.assert_close(plain[1]["scatter_rows"], torch.full((2, 2), 3.0))


def _zero_stages(cfg):
    from pylib.experiments.dp_training import train_data_parallel

    out = {}
    for stage in ("zero1", "zero2", "zero3"):
        run = train_data_parallel(cfg, stage, steps=2, keep_events=False)
        out[stage] = dict(losses=run["losses"], grads=run["grad_shards"], params=run["param_shards"])
    return out


@pytest.mark.slow
def test_zero_1_2_3_train_the_same_with_every_post_2_6_api_hidden():
    from pylib.model import ModelConfig

    cfg = ModelConfig(vocab_size=16, d_model=8, n_layers=1, n_heads=2, d_ff=16, dtype="float64")
    plain, hidden, calls = _both(_zero_stages, 2, cfg)
    _assert_same(plain, hidden)
    assert all(c.get("reduce_scatter_tensor", 0) > 0 and c.get("all_gather_into_tensor", 0) > 0 for c in calls)


COMPOSED = {
    # TP with SP, ETP (experts' rows all-gathered over the ETP group) and ZeRO-3 on one mesh
    "tp+sp, etp, zero-3": (dict(tp=2, dp=2, ep=2, etp=2), "moe", RunOptions(zero_stage=3, n_microbatches=1)),
    # CP (ring, zig-zag) with ZeRO-2 over dp-cp
    "cp ring, zero-2": (dict(cp=2, dp=2), "dense", RunOptions(zero_stage=2, n_microbatches=1, cp_kind="ring")),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(COMPOSED))
def test_composed_steps_train_the_same_with_every_post_2_6_api_hidden(name):
    from pylib.experiments.compose_training import compare_with_reference, train, train_reference
    from pylib.model import ModelConfig, MoEConfig

    axes, kind, options = COMPOSED[name]
    moe = MoEConfig(n_experts=2, top_k=1) if kind == "moe" else None
    cfg = ModelConfig(vocab_size=16, d_model=8, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=16, dtype="float64", moe=moe)
    pc = ParallelConfig(**axes)
    plain, hidden, calls = _both(train, pc.dense_world_size, cfg, pc, options, steps=2, batch=4, seq=8)
    for a, b in zip(plain, hidden):
        _assert_same(a["losses"], b["losses"], "losses")
        _assert_same([p[-1] for p in a["params"]], [p[-1] for p in b["params"]], "params")
    assert sum(c.get("all_gather_into_tensor", 0) for c in calls) > 0
    err = compare_with_reference(hidden, train_reference(cfg, steps=2, batch=4, seq=8))
    assert err["missing"] == [] and err["loss_err"] < 1e-12 and err["param_err"] < 1e-12, err
