"""A tiny Qwen3-MoE over two ranks through vLLM's multiprocess executor: tensor parallel (each rank a slice
of every expert), expert parallel (each rank half the experts, vLLM's expert map) and data parallel with
expert parallel, with the per-step communication choice and with all-gather, all-to-all and MC2 each
forced; greedy tokens equal HF transformers' and no traceback at start-up or shutdown."""

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

    from vllm_ascend.testing.hf_reference import hf_greedy

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_moe)
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    expected = hf_greedy(tiny_qwen3_moe, prompts, MAX_NEW_TOKENS).token_ids
    assert len({tuple(t) for t in expected}) == len(expected), expected
    return prompts, expected


CASES = {
    "tp2": {"tensor_parallel_size": 2},
    "tp2-ep": {"tensor_parallel_size": 2, "enable_expert_parallel": True},
    "dp2-ep": {"data_parallel_size": 2, "enable_expert_parallel": True},
}
METHODS = ("allgather", "alltoall", "mc2")


@pytest.mark.parametrize(
    ("case", "method"),
    [("tp2", None), ("tp2-ep", None), ("dp2-ep", None)]
    + [(case, method) for case in ("tp2-ep", "dp2-ep") for method in METHODS],
)
def test_moe_over_two_ranks_matches_hf(tiny_qwen3_moe, moe_case, case, method):
    """Greedy tokens equal HF's with the per-step choice and with each communication method forced: the
    forced method is the one every rank used (each announces a method the first time it runs it)."""
    prompts, expected = moe_case
    env = {"VLLM_ASCEND_MOE_COMM_METHOD": method} if method else None
    result, output = run_case(tiny_qwen3_moe, prompts, env=env, **CASES[case])
    assert result["tokens"] == expected
    assert "Traceback" not in output, output[-6000:]
    assert "[shutdown]" in output
    used = {m for m in METHODS if f"MoE communication {m} first used" in output}
    if case == "tp2":
        assert used == {"allgather"}  # tensor-parallel experts: nothing to route between ranks
    elif method is not None:
        assert used == {method}, output[-6000:]
    else:
        assert "mc2" in used  # the reference device follows A3: decode-sized steps use MC2


def test_moe_on_310p_over_two_ranks_uses_all_gather(tiny_qwen3_moe, moe_case):
    """The reference device emulating 310P (float16, the 310P worker): expert parallel over two ranks routes by
    all-gather (no all-to-all or MC2 there) and greedy tokens equal HF's float16 ones."""
    import torch

    from vllm_ascend.testing.hf_reference import hf_greedy

    prompts, _ = moe_case
    expected = hf_greedy(tiny_qwen3_moe, prompts, MAX_NEW_TOKENS, dtype=torch.float16).token_ids
    env = {"VLLM_ASCEND_REFERENCE_FAMILY": "310p"}
    options = {**CASES["tp2-ep"], "dtype": "float16"}
    result, output = run_case(tiny_qwen3_moe, prompts, env=env, **options)
    assert result["tokens"] == expected
    assert {worker[0] for worker in result["workers"]} == {"NPUWorker310"}, result["workers"]
    assert "Traceback" not in output, output[-6000:]
    assert {m for m in METHODS if f"MoE communication {m} first used" in output} == {"allgather"}
