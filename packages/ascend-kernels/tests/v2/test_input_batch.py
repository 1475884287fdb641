"""V2 input-batch kernels: the Ascend Triton kernels (interpreter) against the torch references."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import input_batch as triton_impl
from vllm_ascend.kernels.v2 import input_batch as v2

# every case under both launch grids and both reference forms
pytestmark = pytest.mark.usefixtures("launch_grid", "reference_form")


def _batch(seed: int, num_reqs: int, max_reqs: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    query_lens = torch.randint(1, 9, (num_reqs,), generator=g)
    qsl = torch.zeros(max_reqs + 1, dtype=torch.int32)
    qsl[1 : num_reqs + 1] = torch.cumsum(query_lens, 0)
    return {
        "pos_ptr": torch.full((int(query_lens.sum()) + 4,), -7, dtype=torch.int64),
        "seq_lens_ptr": torch.full((max_reqs,), -3, dtype=torch.int32),
        "idx_mapping_ptr": torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32),
        "query_start_loc_ptr": qsl,
        "num_computed_tokens_ptr": torch.randint(0, 50, (max_reqs,), generator=g, dtype=torch.int32),
        "max_num_reqs": max_reqs,
        "BLOCK_SIZE": 4,
    }


@pytest.mark.parametrize("num_reqs", [0, 1, 5, 11])
def test_prepare_pos_seq_lens(num_reqs: int) -> None:
    args = _batch(num_reqs, num_reqs, 12)
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    v2.prepare_pos_seq_lens_torch((num_reqs + 1,), **ref)
    triton_impl.prepare_pos_seq_lens((num_reqs + 1,), **args)
    assert torch.equal(args["pos_ptr"], ref["pos_ptr"])
    assert torch.equal(args["seq_lens_ptr"], ref["seq_lens_ptr"])
    assert (ref["seq_lens_ptr"][num_reqs:] == 0).all()
    if num_reqs:
        first = int(ref["num_computed_tokens_ptr"][ref["idx_mapping_ptr"][0]])
        assert ref["pos_ptr"][0] == first


def _clone(args: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def _qsl(lens: torch.Tensor) -> torch.Tensor:
    qsl = torch.zeros(lens.numel() + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(lens, 0)
    return qsl


def _same(name: str, grid: tuple[int, ...], args: dict) -> dict:
    """Run the Triton kernel ``name`` and its torch reference on copies of ``args``; assert every tensor
    equal; return the reference's copy."""
    ref = _clone(args)
    getattr(v2, f"{name}_torch")(grid, **ref)
    getattr(triton_impl, name)(grid, **args)
    for key, value in args.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, ref[key]), key
    return ref


@pytest.mark.parametrize("num_reqs", [0, 1, 4, 9])
# The interpreter's tile is 4: 3 or 1 lookahead tokens take one tile on the "work" grid (vLLM's one block),
# 6 a loop of tiles.
@pytest.mark.parametrize(("lookahead", "lookahead_block"), [(3, 4), (1, 1), (6, 8)])
def test_prepare_prefill_inputs(num_reqs: int, lookahead: int, lookahead_block: int) -> None:
    g = torch.Generator().manual_seed(10 + num_reqs)
    max_reqs, max_len = 12, 48
    prefill = torch.randint(5, 40, (max_reqs,), generator=g, dtype=torch.int32)
    computed = torch.minimum(torch.randint(0, 40, (max_reqs,), generator=g, dtype=torch.int32), prefill + 2)
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    query_lens = torch.clamp(prefill[idx.long()] - computed[idx.long()], min=1, max=11)
    args = {
        "input_ids_ptr": torch.full((int(query_lens.sum()) + 4,), -1, dtype=torch.int32),
        "next_prefill_tokens_ptr": torch.full((lookahead, max_reqs), -5, dtype=torch.int32),
        "next_prefill_tokens_stride": max_reqs,
        "num_lookahead": lookahead,
        "idx_mapping_ptr": idx,
        "query_start_loc_ptr": _qsl(query_lens),
        "all_token_ids_ptr": torch.randint(0, 500, (max_reqs, max_len), generator=g, dtype=torch.int32),
        "all_token_ids_stride": max_len,
        "prefill_lens_ptr": prefill,
        "num_computed_tokens_ptr": computed,
        "BLOCK_SIZE": 1024,
        "LOOKAHEAD_BLOCK": lookahead_block,
    }
    ref = _same("prepare_prefill_inputs", (num_reqs,), args)
    prefilling = (computed[idx.long()] < prefill[idx.long()]).sum()
    assert (ref["input_ids_ptr"] != -1).sum() == query_lens[computed[idx.long()] < prefill[idx.long()]].sum()
    assert (ref["next_prefill_tokens_ptr"] != -5).sum() == lookahead * prefilling


@pytest.mark.parametrize(("num_reqs", "new_sampled"), [(0, 1), (1, 1), (7, 1), (6, 0)])
# The interpreter's tile is 4: spans of 8 take loops of tiles, 4 and 3 one tile on the "work" grid (vLLM's
# one block; 3 clips a 4-wide tile), requests of up to 6 logits clipped.
@pytest.mark.parametrize("block_size", [8, 4, 3])
def test_combine_sampled_and_draft_tokens(num_reqs: int, new_sampled: int, block_size: int) -> None:
    g = torch.Generator().manual_seed(20 + num_reqs)
    max_reqs, steps = 10, 5
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    num_logits = torch.randint(max(new_sampled, 1), steps + new_sampled + 1, (num_reqs,), generator=g)
    qsl = _qsl(num_logits + torch.randint(0, 4, (num_reqs,), generator=g))
    cu = _qsl(num_logits)
    prefill = torch.randint(3, 20, (max_reqs,), generator=g, dtype=torch.int32)
    args = {
        "input_ids_ptr": torch.randint(0, 100, (int(qsl[-1]) + 2,), generator=g, dtype=torch.int32),
        "idx_mapping_ptr": idx,
        "last_sampled_tokens_ptr": torch.randint(500, 600, (max_reqs, 1), generator=g, dtype=torch.int64),
        "query_start_loc_ptr": qsl,
        "seq_lens_ptr": prefill[idx.long()]
        + torch.randint(-3, 8, (num_reqs,), generator=g, dtype=torch.int32),
        "prefill_len_ptr": prefill,
        "draft_tokens_ptr": torch.randint(700, 800, (max_reqs, steps), generator=g, dtype=torch.int64),
        "draft_tokens_stride": steps,
        "cu_num_logits_ptr": cu,
        "logits_indices_ptr": torch.full((int(cu[-1]),), -1, dtype=torch.int64),
        "BLOCK_SIZE": block_size,
        "NUM_NEW_SAMPLED_TOKENS": new_sampled,
    }
    ref = _same("combine_sampled_and_draft_tokens", (num_reqs,), args)
    written = (torch.arange(int(cu[-1])) - torch.repeat_interleave(cu[:-1], num_logits)) < block_size
    assert (ref["logits_indices_ptr"][written] >= 0).all()
    assert (ref["logits_indices_ptr"][~written] == -1).all()
    if num_reqs > 5:
        assert (ref["input_ids_ptr"] >= 700).any()  # drafts written


@pytest.mark.parametrize("num_reqs", [0, 1, 6, 13])
def test_get_num_sampled_and_rejected(num_reqs: int) -> None:
    g = torch.Generator().manual_seed(30 + num_reqs)
    max_reqs = 16
    num_logits = torch.randint(1, 5, (num_reqs,), generator=g)
    args = {
        "num_sampled_ptr": torch.minimum(torch.randint(1, 5, (num_reqs,), generator=g), num_logits).to(
            torch.int32
        ),
        "num_rejected_ptr": torch.full((num_reqs,), -1, dtype=torch.int32),
        "seq_lens_ptr": torch.randint(5, 30, (num_reqs,), generator=g, dtype=torch.int32),
        "cu_num_logits_ptr": _qsl(num_logits),
        "idx_mapping_ptr": torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32),
        "prefill_len_ptr": torch.randint(5, 30, (max_reqs,), generator=g, dtype=torch.int32),
    }
    ref = _same("get_num_sampled_and_rejected", (num_reqs,), args)
    assert (ref["num_rejected_ptr"] >= 0).all()
    chunked = args["seq_lens_ptr"] < args["prefill_len_ptr"][args["idx_mapping_ptr"].long()]
    if num_reqs >= 6:  # both kinds of request (a program each on the "work" grid, tiles on "cores")
        assert chunked.any() and not chunked.all()


@pytest.mark.parametrize(
    ("num_reqs", "with_counts", "with_qsl"),
    [(0, True, True), (1, True, True), (7, True, False), (9, False, True)],
)
def test_post_update(num_reqs: int, with_counts: bool, with_qsl: bool) -> None:
    g = torch.Generator().manual_seed(40 + num_reqs)
    max_reqs, width, vocab, max_len = 12, 6, 8, 48
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    if num_reqs > 2:
        idx[2] = -1  # a skipped row
    args = {
        "idx_mapping_ptr": idx,
        "num_computed_tokens_ptr": torch.randint(0, 10, (max_reqs,), generator=g, dtype=torch.int32),
        "last_sampled_tokens_ptr": torch.full((max_reqs, 1), -1, dtype=torch.int64),
        "output_bin_counts_ptr": torch.randint(0, 3, (max_reqs, vocab), generator=g, dtype=torch.int32)
        if with_counts
        else None,
        "output_bin_counts_stride": vocab if with_counts else 0,
        "sampled_tokens_ptr": torch.randint(0, vocab, (num_reqs, width), generator=g, dtype=torch.int64),
        "sampled_tokens_stride": width,
        "num_sampled_ptr": torch.randint(0, width + 1, (num_reqs,), generator=g, dtype=torch.int32),
        "num_rejected_ptr": torch.randint(0, 2, (num_reqs,), generator=g, dtype=torch.int32),
        "query_start_loc_ptr": _qsl(torch.randint(1, 4, (num_reqs,), generator=g)) if with_qsl else None,
        "all_token_ids_ptr": torch.zeros((max_reqs, max_len), dtype=torch.int32),
        "all_token_ids_stride": max_len,
        "total_len_ptr": torch.randint(0, 20, (max_reqs,), generator=g, dtype=torch.int32),
    }
    ref = _same("post_update", (num_reqs,), args)
    if num_reqs:
        assert ref["all_token_ids_ptr"].any() or not args["num_sampled_ptr"].any()


@pytest.mark.parametrize("num_reqs", [0, 1, 5, 11])
def test_post_update_num_computed_tokens(num_reqs: int) -> None:
    g = torch.Generator().manual_seed(50 + num_reqs)
    args = {
        "idx_mapping_ptr": torch.randperm(16, generator=g)[:num_reqs].to(torch.int32),
        "num_computed_tokens_ptr": torch.randint(0, 10, (16,), generator=g, dtype=torch.int32),
        "query_start_loc_ptr": _qsl(torch.randint(1, 6, (num_reqs,), generator=g)),
    }
    before = args["num_computed_tokens_ptr"].clone()
    ref = _same("post_update_num_computed_tokens", (num_reqs,), args)
    assert int((ref["num_computed_tokens_ptr"] - before).sum()) == int(args["query_start_loc_ptr"][-1])


@pytest.mark.parametrize("num_reqs", [0, 1, 5, 11])
# The interpreter's tile is 4: spans of 8 take a loop of tiles; 4 and 3 one tile on the "work" grid (a
# program per request, vLLM's one block; 3 clips a 4-wide tile), requests of up to 7 logits clipped.
@pytest.mark.parametrize("block_size", [8, 4, 3])
def test_expand_idx_mapping(num_reqs: int, block_size: int) -> None:
    g = torch.Generator().manual_seed(60 + num_reqs)
    counts = torch.randint(1, 8, (num_reqs,), generator=g)
    cu = _qsl(counts)
    args = {
        "idx_mapping_ptr": torch.randperm(16, generator=g)[:num_reqs].to(torch.int32),
        "expanded_idx_mapping_ptr": torch.full((int(cu[-1]),), -1, dtype=torch.int32),
        "expanded_local_pos_ptr": torch.full((int(cu[-1]),), -1, dtype=torch.int32),
        "cu_num_logits_ptr": cu,
        "BLOCK_SIZE": block_size,
    }
    ref = _same("expand_idx_mapping", (num_reqs,), args)
    written = (torch.arange(int(cu[-1])) - torch.repeat_interleave(cu[:-1], counts)) < block_size
    assert (ref["expanded_local_pos_ptr"][written] >= 0).all()
    assert (ref["expanded_local_pos_ptr"][~written] == -1).all()


def test_references_cap_lanes_at_block_size() -> None:
    """``combine_sampled_and_draft_tokens`` and ``expand_idx_mapping`` touch at most ``BLOCK_SIZE`` lanes a
    row (vLLM's ``tl.arange(0, BLOCK_SIZE)``): the logits and drafts past it are left alone."""
    qsl, cu = torch.tensor([0, 6, 13], dtype=torch.int32), torch.tensor([0, 5, 11], dtype=torch.int32)
    input_ids = torch.full((13,), -1, dtype=torch.int32)
    logits_indices = torch.full((11,), -1, dtype=torch.int64)
    v2.combine_sampled_and_draft_tokens_torch(
        (2,),
        input_ids_ptr=input_ids,
        idx_mapping_ptr=torch.tensor([1, 0], dtype=torch.int32),
        last_sampled_tokens_ptr=torch.tensor([500, 501], dtype=torch.int32),
        query_start_loc_ptr=qsl,
        seq_lens_ptr=torch.tensor([3, 20], dtype=torch.int32),  # row 0 chunk-prefilling (3 <= 4)
        prefill_len_ptr=torch.tensor([10, 4], dtype=torch.int32),
        draft_tokens_ptr=torch.arange(700, 716, dtype=torch.int64).view(2, 8),
        draft_tokens_stride=8,
        cu_num_logits_ptr=cu,
        logits_indices_ptr=logits_indices,
        BLOCK_SIZE=4,
        NUM_NEW_SAMPLED_TOKENS=1,
    )
    assert logits_indices.tolist() == [1, 2, 3, 4, -1, 7, 8, 9, 10, -1, -1]
    # row 1 (state 0): last sampled at 13 - 6 = 7; drafts 700.. at 13 - 5 = 8, capped at 4 of 5
    assert input_ids.tolist() == [-1] * 7 + [500, 700, 701, 702, 703, -1]

    expanded = torch.full((11,), -1, dtype=torch.int32)
    local = torch.full((11,), -1, dtype=torch.int32)
    v2.expand_idx_mapping_torch((2,), torch.tensor([3, 9], dtype=torch.int32), expanded, local, cu, 4)
    assert expanded.tolist() == [3, 3, 3, 3, -1, 9, 9, 9, 9, -1, -1]
    assert local.tolist() == [0, 1, 2, 3, -1, 0, 1, 2, 3, -1, -1]


def test_post_update_reference_values() -> None:
    """Negative states skipped, ``num_sampled == 0`` rows only advance ``num_computed_tokens``, a token
    sampled twice in a row counts twice, and ``query_start_loc=None`` means query length 0."""
    computed = torch.tensor([10, 20, 30, 40], dtype=torch.int32)
    last = torch.full((4,), -1, dtype=torch.int32)
    counts = torch.zeros((4, 8), dtype=torch.int32)
    all_ids = torch.zeros((4, 12), dtype=torch.int32)
    total = torch.tensor([2, 3, 4, 5], dtype=torch.int32)
    args = {
        "idx_mapping_ptr": torch.tensor([2, -1, 0, 3], dtype=torch.int32),
        "num_computed_tokens_ptr": computed,
        "last_sampled_tokens_ptr": last,
        "output_bin_counts_ptr": counts,
        "output_bin_counts_stride": 8,
        "sampled_tokens_ptr": torch.tensor([[5, 5, 1], [7, 7, 7], [6, 0, 0], [4, 2, 3]]),
        "sampled_tokens_stride": 3,
        "num_sampled_ptr": torch.tensor([3, 2, 0, 1], dtype=torch.int32),
        "num_rejected_ptr": torch.tensor([0, 1, 2, 1], dtype=torch.int32),
        "query_start_loc_ptr": torch.tensor([0, 3, 6, 9, 12], dtype=torch.int32),
        "all_token_ids_ptr": all_ids,
        "all_token_ids_stride": 12,
        "total_len_ptr": total,
    }
    v2.post_update_torch((4,), **args)
    assert computed.tolist() == [11, 20, 33, 42]
    assert last.tolist() == [-1, -1, 1, 4]
    assert total.tolist() == [2, 3, 7, 6]
    assert all_ids[2, 4:7].tolist() == [5, 5, 1] and all_ids[3, 5].item() == 4
    assert int(all_ids.count_nonzero()) == 4
    assert counts[2].tolist() == [0, 1, 0, 0, 0, 2, 0, 0] and counts[3].tolist() == [0, 0, 0, 0, 1, 0, 0, 0]
    assert int(counts.sum()) == 4
    v2.post_update_torch((4,), **{**args, "query_start_loc_ptr": None, "output_bin_counts_ptr": None})
    assert computed.tolist() == [9, 20, 33, 41]
    assert int(counts.sum()) == 4


@pytest.mark.parametrize(
    ("kernel", "run", "num_reqs"),
    [
        ("_expand_idx_mapping_kernel", lambda: test_expand_idx_mapping(11, 4), 11),
        ("_post_update_kernel", lambda: test_post_update(7, True, False), 7),
        ("_prefill_inputs_kernel", lambda: test_prepare_prefill_inputs(9, 3, 4), 9),
        ("_combine_sampled_and_draft_kernel", lambda: test_combine_sampled_and_draft_tokens(7, 1, 4), 7),
    ],
)
def test_work_grid_launches_a_program_per_request(
    launch_grid: str, monkeypatch: pytest.MonkeyPatch, kernel: str, run, num_reqs: int
) -> None:
    """A program per request (vLLM's grid) with no grid-stride loop on "work" (CUDA's; the tests above
    compare that variant with the references); at most the interpreter's programs on "cores"."""
    seen = []
    jit = getattr(triton_impl, kernel)

    class Launches:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append((tuple(grid), kwargs["PER_ITEM"]))
                return jit[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(triton_impl, kernel, Launches())
    run()
    assert seen == ([((num_reqs,), True)] if launch_grid == "work" else [((4,), False)])
