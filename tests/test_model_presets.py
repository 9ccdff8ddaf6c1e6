"""The named model configurations: the real-model presets have the published models' parameter counts, and the
tiny presets keep the properties their docstrings promise."""

import math

import pytest

from pylib.model import ModelConfig
from pylib.plan import presets as P
from pylib.seedcheck.meta_tables import meta_model


def parameter_count(cfg: ModelConfig) -> int:
    """Parameters of the reference model for `cfg`, from a one-layer meta-device build (every layer is the same)."""
    one = meta_model(cfg, n_layers=1)
    layer = sum(p.numel() for p in one.layers[0].parameters())
    return sum(p.numel() for p in one.parameters()) + (cfg.n_layers - 1) * layer


def test_llama2_presets_have_the_published_parameter_counts_plus_layernorm_betas():
    # Llama 2 normalises with RMSNorm (gamma only); the reference model's LayerNorm adds a beta of h per norm:
    # 2 per layer and the final one.
    for preset, published in ((P.llama2_70b, 68_976_648_192), (P.llama2_7b, 6_738_415_616)):
        cfg = preset()
        betas = (2 * cfg.n_layers + 1) * cfg.d_model
        assert parameter_count(cfg) == published + betas, preset.__name__


def test_presets_by_name_are_the_functions_of_that_name():
    assert set(P.PRESETS) == {
        "llama2_70b",
        "gpt_style_70b",
        "deepseek_v3_like",
        "llama2_7b",
        "mixtral_8x7b",
        "llama3_405b",
    }
    for name, fn in P.PRESETS.items():
        assert fn.__name__ == name and isinstance(fn(), ModelConfig)


def test_tiny_odd_sizes_are_distinct_and_none_a_power_of_two():
    cfg = P.tiny_odd()
    sizes = [cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.d_ff]
    assert len(set(sizes)) == len(sizes)
    assert not any(math.log2(n).is_integer() for n in sizes)


@pytest.mark.parametrize("name", ["tiny", "tiny_gqa", "tiny_moe", "tiny_odd", "tiny_layer", "probe_config"])
def test_tiny_presets_are_float64_or_named_otherwise_and_build(name):
    cfg = getattr(P, name)()
    assert cfg.dtype == ("float32" if name == "probe_config" else "float64")
    assert parameter_count(cfg) > 0
    assert getattr(P, name)() == cfg  # a fresh, equal config on every call
