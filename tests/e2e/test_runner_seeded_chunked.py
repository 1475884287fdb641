"""Seeded random sampling under chunked prefill (issue 14, finding 1).

vLLM rewinds a seeded request's generator with ``set_offset`` after a prefill chunk whose token is
thrown away; the reference device's generators are CPU generators, which have no offset, so the
engine died. Two engines here: one whose token budget (64) chunks every prompt, one that prefills each
prompt in one step. Seeded requests must give the same tokens in both, and in a second run.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

CHUNK_BUDGET = 64
PROMPT_LENGTHS = (200, 250, 290)
SEEDS = (11, 22, 33)
MAX_TOKENS = 8


def _prompts(model_dir: Path) -> list[list[int]]:
    """Prompts of ``PROMPT_LENGTHS`` tokens: the tokenizer's non-special vocabulary, shuffled per prompt."""
    import random

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab = sorted(set(tokenizer.get_vocab().values()) - set(tokenizer.all_special_ids))
    rng = random.Random(0)
    return [rng.sample(vocab, n) for n in PROMPT_LENGTHS]


def _run_engine(model_dir: Path, prompts: list[list[int]], max_num_batched_tokens: int) -> dict:
    """Two rounds of the seeded requests (plus one unseeded) on a fresh engine; what the runner held back."""
    from vllm import LLM, SamplingParams

    from vllm_ascend.runner import model_runner

    held_rows: list[int] = []
    original = model_runner.generators_held_back

    def recording(generators, rows):
        rows = list(rows)
        held_rows.extend(row for row in rows if row in generators)
        return original(generators, rows)

    params = [SamplingParams(temperature=1.0, seed=seed, max_tokens=MAX_TOKENS) for seed in SEEDS]
    params.append(SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS))
    requests = [{"prompt_token_ids": p} for p in [*prompts, prompts[0]]]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model_runner, "generators_held_back", recording)
        llm = LLM(
            model=str(model_dir),
            dtype="float32",
            block_size=16,
            max_model_len=512,
            max_num_batched_tokens=max_num_batched_tokens,
            kv_cache_memory_bytes=64 << 20,
            seed=0,
        )
        try:
            runs = [
                [list(o.outputs[0].token_ids) for o in llm.generate(requests, params, use_tqdm=False)]
                for _ in range(2)
            ]
            budget = llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
            v2 = llm.llm_engine.vllm_config.use_v2_model_runner
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()
    return {"runs": runs, "held_rows": held_rows, "budget": budget, "v2": v2}


@pytest.fixture(scope="module", params=["v2", "v1"])
def engines(request, tiny_qwen3):
    """Both runners: V2 (vLLM's choice; its Gumbel noise is a hash of the seed and position, so chunking
    cannot shift it) and V1 (per-request generators, held back on discarded chunks)."""
    import vllm.envs as envs

    prompts = _prompts(tiny_qwen3)
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "v1":
            patch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
        envs.disable_envs_cache()
        result = {
            "chunked": _run_engine(tiny_qwen3, prompts, CHUNK_BUDGET),
            "whole": _run_engine(tiny_qwen3, prompts, 2048),
        }
    envs.disable_envs_cache()
    assert result["chunked"]["v2"] is result["whole"]["v2"] is (request.param == "v2")
    return result


def test_chunked_engine_chunked_seeded_prompts_and_survived(engines):
    chunked, whole = engines["chunked"], engines["whole"]
    assert chunked["budget"] == CHUNK_BUDGET < min(PROMPT_LENGTHS)
    assert all(len(tokens) == MAX_TOKENS for run in chunked["runs"] for tokens in run)
    assert whole["budget"] >= sum(PROMPT_LENGTHS) + PROMPT_LENGTHS[0]
    assert whole["held_rows"] == []
    if not chunked["v2"]:
        # V1: seeded rows sampled on discarded prefill chunks, their generators held back.
        assert chunked["held_rows"], "no seeded prefill chunk was discarded: the prompts were not chunked"
    else:
        assert chunked["held_rows"] == []  # V2 never builds V1's generators


def test_seeded_tokens_identical_chunked_or_not_and_across_runs(engines):
    seeded = len(SEEDS)
    chunked_runs = [run[:seeded] for run in engines["chunked"]["runs"]]
    whole_runs = [run[:seeded] for run in engines["whole"]["runs"]]
    assert chunked_runs[0] == chunked_runs[1]
    assert whole_runs[0] == whole_runs[1]
    assert chunked_runs[0] == whole_runs[0]
    # Random sampling really ran: the three seeds give three different continuations.
    assert len({tuple(tokens) for tokens in chunked_runs[0]}) == seeded
