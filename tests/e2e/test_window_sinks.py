"""Sliding-window attention served end to end on the reference device: greedy tokens equal HF fp32.

A tiny Mistral with ``sliding_window=8`` (every layer windowed), shorter than the prompts, so the window
changes HF's own tokens (checked). vLLM gives the windowed layers a ``SlidingWindowSpec`` KV group whose
blocks that fell out of the window become the null block; the backend never reads them.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from vllm_ascend.testing.tiny_models import (
    TinyModelSpec,
    build_tiny_model,
    common_config,
    register_model_builder,
)

from .conftest import MAX_NEW_TOKENS, RUNNER_PROMPTS

WINDOW = 8


def _mistral_config(spec: TinyModelSpec, vocab_size: int) -> Any:
    from transformers import MistralConfig

    return MistralConfig(**common_config(spec, vocab_size), tie_word_embeddings=False, **spec.extra)


register_model_builder("mistral", _mistral_config)


@pytest.fixture(scope="module")
def tiny_mistral_sw(tiny_models_root: Path) -> Path:
    return build_tiny_model(
        TinyModelSpec(kind="mistral", seed=7, extra={"sliding_window": WINDOW}), tiny_models_root
    )


@pytest.fixture(scope="module")
def prompts(tiny_mistral_sw: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_mistral_sw)
    ids = [tokenizer(text)["input_ids"] for text in RUNNER_PROMPTS]
    assert max(len(p) for p in ids) > 3 * WINDOW  # the window matters for the long prompts
    return ids


def _hf_tokens(model_dir: Path, prompts: list[list[int]], sliding_window: int | None) -> list[list[int]]:
    """HF fp32 greedy tokens (full recomputation each step) with the config's window or none."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    config.sliding_window = sliding_window
    model = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            for _ in range(MAX_NEW_TOKENS):
                ids = torch.cat([ids, model(input_ids=ids).logits[0, -1].argmax().view(1, 1)], dim=1)
            out.append(ids[0, len(prompt) :].tolist())
    return out


def test_sliding_window_mistral_matches_hf_fp32(tiny_mistral_sw, prompts):
    """16 tokens per step: long prompts are prefilled in chunks beside other requests' decodes, so chunked
    prefill with context, decode past the window and mixed batches all run over the windowed cache."""
    from vllm import LLM, SamplingParams

    hf = _hf_tokens(tiny_mistral_sw, prompts, WINDOW)
    full = _hf_tokens(tiny_mistral_sw, prompts, None)
    assert hf != full  # the window changes HF's own greedy tokens

    llm = LLM(
        model=str(tiny_mistral_sw),
        dtype="float32",
        block_size=16,
        max_model_len=256,
        kv_cache_memory_bytes=64 << 20,
        seed=0,
        max_num_batched_tokens=16,
        max_num_seqs=4,
    )
    try:
        params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        got = [list(o.outputs[0].token_ids) for o in outputs]
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    assert got == hf
