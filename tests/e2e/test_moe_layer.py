"""The runner's MoE layer serves MoE models with shared experts: a tiny Qwen2-MoE (routed experts plus a
gated shared expert) through vLLM on the reference device, greedy tokens equal to HF transformers'."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_ascend.testing.tiny_models import build_tiny_model, qwen2_moe_spec

MAX_NEW_TOKENS = 12
PROMPTS = ("the quick ascend kernel", "river mountain forest ocean cloud rain", "red green blue yellow")


@pytest.fixture(scope="module")
def tiny_qwen2_moe(tiny_models_root: Path) -> Path:
    return build_tiny_model(qwen2_moe_spec(), tiny_models_root)


def test_shared_experts_match_hf(make_llm, tiny_qwen2_moe):
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    from vllm_ascend.core.device.config import get_device_adaptor
    from vllm_ascend.runner.ops.moe import AscendMoERunner
    from vllm_ascend.testing.hf_reference import hf_greedy

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen2_moe)
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    expected = hf_greedy(tiny_qwen2_moe, prompts, MAX_NEW_TOKENS).token_ids
    assert len({tuple(t) for t in expected}) == len(expected), expected

    llm = make_llm(tiny_qwen2_moe)
    counts = get_device_adaptor().call_counts
    before = counts["moe_finalize_routing"]
    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected
    (layers,) = llm.apply_model(
        lambda model: [
            (type(m).__name__, m._shared_experts is not None)
            for m in model.modules()
            if isinstance(m, AscendMoERunner)
        ]
    )
    assert layers == [("AscendMoERunner", True)] * 2
    assert counts["moe_finalize_routing"] - before >= 2 * MAX_NEW_TOKENS
