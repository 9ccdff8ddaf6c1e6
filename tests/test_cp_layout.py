"""The CP sequence layouts: which tokens each rank holds, the inverse, the positions, and the errors."""

import pytest
import torch

from pylib.cp import (
    check_sequence,
    layout_chunks,
    layout_order,
    sequence_positions,
    sequence_shard_spec,
    shard_sequence,
    unshard_sequence,
)


def test_zigzag_rank_holds_chunks_r_and_2cp_minus_1_minus_r():
    s, cp = 16, 4
    tokens = torch.arange(s)
    held = [shard_sequence(tokens, 0, r, cp, "zigzag").tolist() for r in range(cp)]
    assert held == [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]
    assert [layout_chunks(r, cp, "zigzag") for r in range(cp)] == [(0, 7), (1, 6), (2, 5), (3, 4)]


def test_contiguous_rank_holds_one_consecutive_chunk():
    held = [shard_sequence(torch.arange(12), 0, r, 3, "contiguous").tolist() for r in range(3)]
    assert held == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_unshard_inverts_shard_along_any_dim(layout, cp):
    x = torch.randn(2, 3, 24, 5, dtype=torch.float64)
    for dim in (2, -2):
        parts = [shard_sequence(x, dim, r, cp, layout) for r in range(cp)]
        assert all(p.shape[2] == 24 // cp for p in parts)
        assert torch.equal(unshard_sequence(parts, dim, layout), x)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_sequence_positions_are_the_sharded_token_indices(layout):
    s, cp = 24, 4
    for r in range(cp):
        assert torch.equal(sequence_positions(s, r, cp, layout), shard_sequence(torch.arange(s), 0, r, cp, layout))
    order = layout_order(s, cp, layout)
    assert sorted(order.tolist()) == list(range(s))
    assert torch.equal(order, torch.cat([sequence_positions(s, r, cp, layout) for r in range(cp)]))


def test_shard_sequence_carries_gradients_back_to_the_full_tensor():
    x = torch.randn(2, 8, 3, dtype=torch.float64, requires_grad=True)
    shard_sequence(x, 1, 1, 2, "zigzag").sum().backward()
    held = torch.zeros(8)
    held[[2, 3, 4, 5]] = 1.0  # rank 1 of 2 holds chunks 1 and 2 of 4
    assert torch.equal(x.grad[0, :, 0], held.double())


def test_sequence_not_divisible_raises_naming_the_numbers():
    with pytest.raises(
        ValueError, match=r"zigzag layout .* 2\*cp=8 chunks: sequence length s=12 is not divisible by 8"
    ):
        shard_sequence(torch.zeros(12), 0, 0, 4, "zigzag")
    with pytest.raises(
        ValueError, match=r"contiguous layout .* cp=5 chunks: sequence length s=12 is not divisible by 5"
    ):
        check_sequence(12, 5, "contiguous")
    check_sequence(12, 3, "contiguous")  # 12 / 3 is fine for contiguous, while zigzag needs 2*3 = 6 | 12
    with pytest.raises(ValueError, match="layout='striped' must be one of"):
        sequence_positions(8, 0, 2, "striped")
    with pytest.raises(ValueError, match="odd length 3"):
        unshard_sequence([torch.zeros(3), torch.zeros(3)], 0, "zigzag")


def test_sequence_shard_spec_states_axis_dim_and_chunks():
    spec = sequence_shard_spec("x", (2, 16, 8), 1, 1, 4, "zigzag")
    assert (spec.axis, spec.dim, spec.kind, spec.local_shape) == ("cp", 1, "sequence-zigzag", (2, 4, 8))
    assert spec.fraction == 0.25
    assert "chunks 1, 6 of 8" in spec.note
