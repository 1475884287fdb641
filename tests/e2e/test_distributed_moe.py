"""A tiny Qwen3-MoE over two ranks through vLLM's multiprocess executor: tensor parallel (each rank a slice
of every expert), expert parallel (each rank half the experts, vLLM's expert map) and data parallel with
expert parallel; greedy tokens equal HF transformers' and no traceback at start-up or shutdown."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import MAX_NEW_TOKENS
from .distributed import run_case

PROMPTS = (
    "the quick ascend kernel",
    "river mountain forest ocean cloud rain snow wind stone light shadow morning evening winter summer",
    "red green blue yellow",
)


@pytest.fixture(scope="module")
def moe_case(tiny_qwen3_moe: Path) -> tuple[list[list[int]], list[list[int]]]:
    """The prompts' token ids and HF's greedy continuation (distinct per prompt)."""
    from transformers import AutoTokenizer

    from vllm_ascend.runner.testing.hf_reference import hf_greedy

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_moe)
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    expected = hf_greedy(tiny_qwen3_moe, prompts, MAX_NEW_TOKENS).token_ids
    assert len({tuple(t) for t in expected}) == len(expected), expected
    return prompts, expected


@pytest.mark.parametrize(
    "options",
    [
        {"tensor_parallel_size": 2},
        {"tensor_parallel_size": 2, "enable_expert_parallel": True},
        {"data_parallel_size": 2, "enable_expert_parallel": True},
    ],
    ids=["tp2", "tp2-ep", "dp2-ep"],
)
def test_moe_over_two_ranks_matches_hf(tiny_qwen3_moe, moe_case, options):
    prompts, expected = moe_case
    result, output = run_case(tiny_qwen3_moe, prompts, **options)
    assert result["tokens"] == expected
    assert "Traceback" not in output, output[-6000:]
    assert "[shutdown]" in output
