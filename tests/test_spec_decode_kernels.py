"""The runner's torch stand-ins for vLLM's draft-input Triton kernels write what vLLM's C++ CPU ops write.

The platform registers the stand-ins with vLLM's kernel dispatcher; each case then launches the kernel
through vLLM's own launch wrapper (the arguments the proposer passes, bound to kernel parameter names
by the dispatcher) and, on copies of the same buffers, vLLM's CPU adapters over ``torch.ops._C``.
Every buffer either one touches (outputs, in-place inputs, graph padding, untouched tails) must match.
"""

from __future__ import annotations

import itertools
import os

import pytest
import torch
import vllm.v1.spec_decode.utils as spec_utils
from vllm.triton_utils import dispatcher
from vllm.utils import cpu_triton_utils as cpu_tl

from vllm_ascend.core.device.host import import_host_kernels
from vllm_ascend.core.platform import AscendPlatform
from vllm_ascend.runner.spec_decode_kernels import SPEC_DECODE_KERNEL_OVERRIDES

SENTINEL = -77
KERNEL_NAMES = (
    "eagle_step_slot_mapping_metadata_kernel",
    "eagle_prepare_inputs_padded_kernel",
    "eagle_prepare_next_token_padded_kernel",
    "copy_and_expand_eagle_inputs_kernel",
)


@pytest.fixture(scope="module", autouse=True)
def _registered():
    """What the platform does at worker start (once per process), and the torch.ops._C CPU kernels for this
    host's ISA (the library vLLM's CPU platform picks: ``vllm._C`` itself is the AVX-512 + BF16 build)."""
    import_host_kernels()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ASCEND_DEVICE", "reference")
        AscendPlatform.register_triton_kernel_overrides()


@pytest.fixture
def gen():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"torch seed {seed}")
    return torch.Generator().manual_seed(seed)


def _randint(gen, low, high, size, dtype=torch.int32):
    return torch.randint(low, high, size, generator=gen, dtype=dtype)


def _clones(tensors):
    return [t.clone() for t in tensors]


def _assert_same(ours, theirs, names):
    for name, a, b in zip(names, ours, theirs, strict=True):
        assert a.dtype == b.dtype, name
        assert torch.equal(a, b), f"{name}: ours {a.tolist()} vs C++ {b.tolist()}"


def test_platform_registration_resolves_every_kernel_to_ours():
    assert set(SPEC_DECODE_KERNEL_OVERRIDES) == {f"vllm.v1.spec_decode.utils.{n}" for n in KERNEL_NAMES}
    launchers = {
        "eagle_step_slot_mapping_metadata_kernel": spec_utils._eagle_step_slot_mapping_metadata,
        "eagle_prepare_inputs_padded_kernel": spec_utils._eagle_prepare_inputs_padded,
        "eagle_prepare_next_token_padded_kernel": spec_utils._eagle_prepare_next_token_padded,
        "copy_and_expand_eagle_inputs_kernel": spec_utils._copy_and_expand_eagle_inputs,
    }
    for name in KERNEL_NAMES:
        qualname = f"vllm.v1.spec_decode.utils.{name}"
        ours = SPEC_DECODE_KERNEL_OVERRIDES[qualname]
        assert dispatcher._registry[qualname][1] is ours
        wrapper = getattr(spec_utils, name)
        assert isinstance(wrapper, dispatcher.KernelOverride) and wrapper.func is ours
        # our parameter names are the kernel's, so launches are forwarded by keyword
        assert wrapper._forward_by_name, name
        assert launchers[name].kernel is wrapper


def _slot_mapping_case(gen, batch, padding, block_size, max_model_len, extra_rows):
    n_blocks = -(-max_model_len // block_size)
    table = _randint(gen, 0, 1000, (batch + extra_rows, n_blocks))[:batch]
    near_end = torch.tensor([max_model_len - 1, max_model_len - 2, 0])
    positions = _randint(gen, 0, max_model_len, (batch,), torch.int64)
    positions[: min(batch, 3)] = near_end[: min(batch, 3)]
    seq_lens = (positions + 1).to(torch.int32) + _randint(gen, 0, 2, (batch,))
    clamped = torch.full((batch + 4,), SENTINEL, dtype=torch.int64)
    slots = torch.full((batch + padding + 4,), SENTINEL, dtype=torch.int64)
    return table, positions, seq_lens, clamped, slots, n_blocks


@pytest.mark.parametrize(
    ("batch", "padding", "block_size", "max_model_len"),
    [(1, 0, 16, 64), (3, 2, 4, 30), (8, 5, 16, 200), (16, 0, 1, 9)],
)
def test_eagle_step_slot_mapping_matches_cpp(gen, batch, padding, block_size, max_model_len):
    table, positions, seq_lens, clamped, slots, n_blocks = _slot_mapping_case(
        gen, batch, padding, block_size, max_model_len, extra_rows=2
    )
    outs = [seq_lens, clamped, slots]
    theirs = _clones(outs)
    spec_utils.eagle_step_update_slot_mapping_and_metadata(
        positions_1d=positions,
        block_table_tensor=table,
        seq_lens=outs[0],
        block_size=block_size,
        max_model_len=max_model_len,
        out_clamped_positions=outs[1][:batch],
        out_slot_mapping=outs[2][: batch + padding],
        input_batch_size=batch + padding,
    )
    cpu_tl._eagle_step_slot_mapping_metadata_kernel_impl(
        positions,
        table,
        table.stride(0),
        theirs[0],
        theirs[1][:batch],
        theirs[2][: batch + padding],
        block_size,
        max_model_len,
        n_blocks,
        -1,
        batch,
    )
    _assert_same(outs, theirs, ["seq_lens", "out_clamped_positions", "out_slot_mapping"])
    assert (slots[:batch][positions + 1 >= max_model_len] == -1).all()
    assert (slots[batch : batch + padding] == -1).all() and (slots[batch + padding :] == SENTINEL).all()


def _draft_batch(gen, num_reqs, max_drafts):
    """Per request a draft count (0 for prefills / no drafts) and a query length."""
    drafts = _randint(gen, 0, max_drafts + 1, (num_reqs,))
    prefill = _randint(gen, 1, 6, (num_reqs,))
    query_lens = torch.where(drafts > 0, drafts + 1, prefill)
    return drafts, query_lens


@pytest.mark.parametrize(("num_reqs", "max_drafts"), [(1, 1), (4, 0), (7, 3), (32, 5)])
def test_eagle_prepare_inputs_padded_matches_cpp(gen, num_reqs, max_drafts):
    drafts, query_lens = _draft_batch(gen, num_reqs, max_drafts)
    cu = torch.cumsum(drafts, 0).to(torch.int32)
    # accepted + 1, or 0 for a discarded request (also without drafts)
    valid = (torch.rand(num_reqs, generator=gen) * (drafts + 2).float()).floor().to(torch.int32)
    qsl = torch.zeros(num_reqs + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(query_lens, 0)
    outs = [torch.full((num_reqs,), SENTINEL, dtype=torch.int32) for _ in range(2)]
    theirs = _clones(outs)
    spec_utils._eagle_prepare_inputs_padded(cu, valid, qsl, outs[0], outs[1], num_reqs)
    cpu_tl._eagle_prepare_inputs_padded_kernel_impl(cu, valid, qsl, theirs[0], theirs[1], num_reqs)
    _assert_same(outs, theirs, ["token_indices_to_sample", "num_rejected_tokens"])
    assert (outs[1][drafts == 0] == 0).all()


@pytest.mark.parametrize(("num_reqs", "width", "strided"), [(1, 1, False), (5, 2, True), (9, 4, False)])
def test_eagle_prepare_next_token_padded_matches_cpp(gen, num_reqs, width, strided):
    vocab = 50
    wide = _randint(gen, 0, vocab, (num_reqs, width + 3 if strided else width))
    sampled = wide[:, :width]
    accepted = _randint(gen, 0, width + 1, (num_reqs,))  # 0: every slot rejected
    sampled[torch.arange(width) >= accepted.unsqueeze(1)] = -1
    if num_reqs > 2:
        sampled[1, 0] = vocab + 3  # out-of-vocabulary ids are not valid either
    discard = torch.rand(num_reqs, generator=gen) < 0.3
    backup = _randint(gen, 0, vocab, (num_reqs,))
    outs = [torch.full((num_reqs,), SENTINEL, dtype=torch.int32) for _ in range(2)]
    theirs = _clones(outs)
    spec_utils._eagle_prepare_next_token_padded(
        sampled,
        discard,
        backup,
        outs[0],
        outs[1],
        vocab,
        width,
        num_reqs,
        sampled.stride(0),
        BLOCK_SIZE_TOKENS=spec_utils.next_power_of_2(width),
    )
    cpu_tl._eagle_prepare_next_token_padded_kernel_impl(  # the C++ op reads rows back to back
        sampled.contiguous(), discard, backup, theirs[0], theirs[1], vocab, width, num_reqs
    )
    _assert_same(outs, theirs, ["next_token_ids", "valid_sampled_tokens_count"])
    assert (outs[1][discard] == 0).all() and torch.equal(outs[0][discard], backup[discard])


def _expand_case(gen, batch, max_drafts, padded_tokens):
    drafts, query_lens = _draft_batch(gen, batch, max_drafts)
    rejected = (torch.rand(batch, generator=gen) * (query_lens.float())).floor().to(torch.int32)
    rejected = torch.where(drafts > 0, rejected, 0)
    qsl = torch.zeros(batch + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(query_lens, 0)
    qend = qsl[1:] - 1 - rejected
    total = int(qsl[-1]) + padded_tokens
    token_ids = _randint(gen, 0, 1000, (total,))
    starts = _randint(gen, 0, 500, (batch,), torch.int64)
    positions = torch.zeros(total, dtype=torch.int64)
    for r in range(batch):
        lo, hi = int(qsl[r]), int(qsl[r + 1])
        positions[lo:hi] = starts[r] + torch.arange(hi - lo)
    next_ids = _randint(gen, 0, 1000, (batch,))
    return qsl, qend, total, token_ids, positions, next_ids, int(query_lens.max())


@pytest.mark.parametrize(
    ("batch", "max_drafts", "slots", "shift", "padded_tokens"),
    [
        *itertools.product([1, 4, 11], [0, 3], [1, 3], [True, False], [0]),
        (6, 2, 2, True, 5),
        (6, 2, 2, False, 3),
    ],
)
def test_copy_and_expand_eagle_inputs_matches_cpp(gen, batch, max_drafts, slots, shift, padded_tokens):
    qsl, qend, total, token_ids, positions, next_ids, max_query = _expand_case(
        gen, batch, max_drafts, padded_tokens
    )
    capacity = total + batch * slots + 7
    outs = [
        torch.full((capacity,), SENTINEL, dtype=torch.int32),  # input ids
        torch.full((capacity,), SENTINEL, dtype=torch.int64),  # positions
        torch.rand(capacity, generator=gen) < 0.5,  # rejected mask (random: untouched must stay)
        torch.rand(capacity, generator=gen) < 0.5,  # masked mask
        torch.full((batch * slots,), SENTINEL, dtype=torch.int32),  # token indices to sample
        torch.full((total,), SENTINEL, dtype=torch.int32),  # hidden-state mapping
    ]
    theirs = _clones(outs)
    per_request = max_query + slots - int(shift)
    block = min(256, spec_utils.next_power_of_2(per_request))
    spec_utils._copy_and_expand_eagle_inputs(
        target_token_ids_ptr=token_ids,
        target_positions_ptr=positions,
        next_token_ids_ptr=next_ids,
        out_input_ids_ptr=outs[0],
        out_positions_ptr=outs[1],
        out_is_rejected_token_mask_ptr=outs[2],
        out_is_masked_token_mask_ptr=outs[3],
        out_new_token_indices_ptr=outs[4],
        out_hidden_state_mapping_ptr=outs[5],
        query_start_loc_ptr=qsl,
        query_end_loc_ptr=qend,
        padding_token_id=0,
        parallel_drafting_token_id=999_999,
        total_input_tokens=total,
        num_padding_slots_per_request=slots,
        shift_input_ids=shift,
        BLOCK_SIZE_TOKENS=block,
        batch_size=batch,
        num_blocks=-(-per_request // block),
    )
    cpu_tl._copy_and_expand_eagle_inputs_kernel_impl(
        token_ids, positions, next_ids, *theirs, qsl, qend, 0, 999_999, total, slots, shift, block
    )
    names = ["input_ids", "positions", "is_rejected", "is_masked", "new_token_indices", "hidden_map"]
    _assert_same(outs, theirs, names)
    written = int(qsl[-1]) + batch * (slots - int(shift))
    assert (outs[0][written:] == SENTINEL).all()
    assert int(outs[2][:written].sum()) == int((qsl[1:] - 1 - qend).sum())
    assert (outs[4] != SENTINEL).all()
