"""Draft-model input builders (``spec_decode_inputs``) on hand-computed batches."""

from __future__ import annotations

import pytest
import torch

import vllm_ascend.kernels as K

S = -77  # sentinel: an element no function should touch


def _full(values, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype)


def test_eagle_step_slot_mapping_values():
    # block_size 4, max_model_len 14; the table has 3 blocks per row and one spare row.
    table = _full([[7, 2, 5], [1, 9, 3], [4, 4, 6], [8, 8, 8], [0, 0, 0]])
    positions = _full([2, 10, 12, 13], torch.int64)
    seq_lens = _full([3, 14, 13, 14, 99])
    out_positions = _full([S] * 5, torch.int64)
    out_slots = _full([S] * 7, torch.int64)
    K.eagle_step_slot_mapping(positions, table, seq_lens, out_positions, out_slots[:6], 4, 14)
    # r0: 3 -> block 0 (7), slot 31; r1: 11 -> block 2 (3), slot 15, length capped at 14;
    # r2: 13 -> block 3 clamped to the last (6), slot 25; r3: 14 reaches the limit -> 0, pad, length 1.
    assert out_positions.tolist() == [3, 11, 13, 0, S]
    assert out_slots.tolist() == [31, 15, 25, -1, -1, -1, S]
    assert seq_lens.tolist() == [4, 14, 14, 1, 99] and seq_lens.dtype == torch.int32


@pytest.mark.parametrize(("block_size", "max_model_len"), [(0, 8), (4, 0)])
def test_eagle_step_slot_mapping_rejects_bad_geometry(block_size, max_model_len):
    field = "block_size" if block_size == 0 else "max_model_len"
    with pytest.raises(ValueError, match=f"{field} must be positive, got 0"):
        K.eagle_step_slot_mapping(
            _full([1], torch.int64),
            _full([[0]]),
            _full([2]),
            _full([0], torch.int64),
            _full([0], torch.int64),
            block_size,
            max_model_len,
        )


def test_eagle_prepare_inputs_padded_values():
    # drafts [2, 0, 3, 1], query lengths [3, 5, 4, 2]; r1 has no drafts (and was discarded: valid 0)
    cu = _full([2, 2, 5, 6])
    valid = _full([1, 0, 4, 1])
    qsl = _full([0, 3, 8, 12, 14])
    indices, rejected = _full([S] * 6), _full([S] * 6)
    K.eagle_prepare_inputs_padded(cu, valid, qsl, indices, rejected)
    assert rejected.tolist() == [2, 0, 0, 1, S, S]
    assert indices.tolist() == [0, 7, 11, 12, S, S]


def test_eagle_prepare_next_token_padded_values():
    sampled = _full([[3, 5, -1], [-1, -1, -1], [4, 12, -1], [1, 2, 3], [6, -1, -1], [-1, 7, -1]])
    discard = torch.tensor([False, False, False, True, False, False])
    backup = _full([90, 91, 92, 93, 94, 95])
    next_ids, counts = _full([S] * 7), _full([S] * 7)
    K.eagle_prepare_next_token_padded(sampled, discard, backup, 10, next_ids, counts)
    # 12 >= vocab 10 is not valid; the last valid token wins even after a rejected slot
    assert counts.tolist() == [2, 0, 1, 0, 1, 1, S]
    assert next_ids.tolist() == [5, 91, 4, 93, 6, 7, S]


def test_eagle_prepare_next_token_padded_without_sampled_tokens_takes_the_backup():
    next_ids, counts = _full([S] * 2), _full([S] * 2)
    K.eagle_prepare_next_token_padded(
        torch.empty(2, 0, dtype=torch.int32), torch.tensor([False, True]), _full([8, 9]), 10, next_ids, counts
    )
    assert next_ids.tolist() == [8, 9] and counts.tolist() == [0, 0]


def _expand(shift: bool, capacity: int):
    # r0: tokens 10..13 at positions 20..23, one rejected; r1: tokens 14, 15 at 7, 8, none rejected
    outs = [
        _full([S] * capacity),
        _full([S] * capacity, torch.int64),
        torch.ones(capacity, dtype=torch.bool),
        torch.ones(capacity, dtype=torch.bool),
        _full([S] * 4),
        _full([S] * 6),
    ]
    K.copy_and_expand_eagle_inputs(
        _full([10, 11, 12, 13, 14, 15]),
        _full([20, 21, 22, 23, 7, 8], torch.int64),
        _full([50, 51]),
        _full([0, 4, 6]),
        _full([2, 5]),
        *outs,
        padding_token_id=0,
        parallel_drafting_token_id=99,
        num_padding_slots_per_request=2,
        shift_input_ids=shift,
    )
    return [o.tolist() for o in outs]


def test_copy_and_expand_eagle_inputs_shifted():
    ids, pos, rejected, masked, new, hidden = _expand(shift=True, capacity=10)
    # r0 -> outputs 0..4: shifted tokens 11, 12, bonus 50, parallel 99, one rejected slot;
    # r1 -> outputs 5..7: shifted 15, bonus 51, parallel 99; 8, 9 untouched
    assert ids == [11, 12, 50, 99, 0, 15, 51, 99, S, S]
    assert pos == [20, 21, 22, 23, 0, 7, 8, 9, S, S]
    T, F = True, False
    assert rejected == [F, F, F, F, T, F, F, F, T, T]
    assert masked == [F, F, F, T, F, F, F, T, T, T]
    assert new == [2, 3, 6, 7]
    assert hidden == [0, 1, 2, 3, 5, 6]


def test_copy_and_expand_eagle_inputs_unshifted():
    ids, pos, rejected, masked, new, hidden = _expand(shift=False, capacity=11)
    # r0 -> outputs 0..5: 10, 11, 12, bonus, parallel, rejected; r1 -> 6..9: 14, 15, bonus, parallel
    assert ids == [10, 11, 12, 50, 99, 0, 14, 15, 51, 99, S]
    assert pos == [20, 21, 22, 23, 24, 0, 7, 8, 9, 10, S]
    T, F = True, False
    assert rejected == [F, F, F, F, F, T, F, F, F, F, T]
    assert masked == [F, F, F, F, T, F, F, F, F, T, T]
    assert new == [3, 4, 8, 9]
    assert hidden == [S] * 6  # only written when shifting


def test_every_builder_runs_without_reading_values_on_the_host():
    """On ``meta`` tensors any host read (``.item()``, ``.tolist()``, data-dependent shapes) raises."""
    meta = torch.device("meta")

    def t(*shape, dtype=torch.int32):
        return torch.empty(*shape, dtype=dtype, device=meta)

    K.eagle_step_slot_mapping(t(3, dtype=torch.int64), t(3, 4), t(3), t(3, dtype=torch.int64), t(5), 4, 16)
    K.eagle_prepare_inputs_padded(t(3), t(3), t(4), t(3), t(3))
    K.eagle_prepare_next_token_padded(t(3, 4), t(3, dtype=torch.bool), t(3), 10, t(3), t(3))
    K.copy_and_expand_eagle_inputs(
        t(9), t(9, dtype=torch.int64), t(3), t(4), t(3), t(15), t(15, dtype=torch.int64),
        t(15, dtype=torch.bool), t(15, dtype=torch.bool), t(6), t(9), 0, 5, 2, True,
    )  # fmt: skip
