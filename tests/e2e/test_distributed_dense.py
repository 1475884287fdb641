"""Dense Qwen3 over several ranks on the reference device, through vLLM's multiprocess executor (gloo).

Each case starts one engine in its own Python process, so everything its ranks print (worker
processes included) is captured: greedy tokens must equal HF's and TP=1's, and start-up and
shutdown must print no traceback. Data parallelism runs the way vLLM 0.32 serves a dense model
over DP ranks: ``AsyncLLM`` with ``data_parallel_size=2`` (the API server's engine client), one
independent engine process per rank; each request is sent to a chosen rank. ``LLM(data_parallel_size=...)``
is refused by vLLM itself for offline use, and its offline one-process-per-rank launch is
refused for dense models.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import MAX_NEW_TOKENS
from .distributed import run_case


@pytest.fixture(scope="module")
def tp1_tokens(tiny_qwen3: Path, qwen3_prompts: list[list[int]]) -> list[list[int]]:
    """The same prompts on one rank, in this process (the single-device baseline)."""
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(tiny_qwen3),
        dtype="float32",
        block_size=16,
        max_model_len=256,
        kv_cache_memory_bytes=64 << 20,
        seed=0,
    )
    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in qwen3_prompts], params, use_tqdm=False)
    llm.llm_engine.engine_core.shutdown()
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.mark.parametrize(
    "options",
    [{"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2}, {"data_parallel_size": 2}],
    ids=["tp2", "pp2", "dp2"],
)
def test_dense_qwen3_over_two_ranks_matches_hf(tiny_qwen3, qwen3_prompts, qwen3_hf, tp1_tokens, options):
    assert len({tuple(t) for t in qwen3_hf.token_ids}) == len(qwen3_hf.token_ids)  # a meaningful comparison
    assert tp1_tokens == qwen3_hf.token_ids
    result, output = run_case(tiny_qwen3, qwen3_prompts, **options)
    if "data_parallel_size" in options:
        # One engine process per DP rank; requests 1 and 3 were sent to rank 1 (vLLM checks the rank).
        assert "(EngineCore_DP0 pid=" in output and "(EngineCore_DP1 pid=" in output, output[-6000:]
    else:
        # Two ranks of one engine, each an NPUWorker in its own process.
        workers = result["workers"]
        assert sorted(w[3] for w in workers) == [0, 1], workers
        assert {w[0] for w in workers} == {"NPUWorker"} and len({w[1] for w in workers}) == 2, workers
    assert result["tokens"] == qwen3_hf.token_ids
    assert "Traceback" not in output, output[-6000:]
    assert "[shutdown]" in output  # the engine did shut down (the part that used to print a traceback)
