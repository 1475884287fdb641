"""Run one vLLM engine over several ranks (``distributed_executor_backend="mp"``, gloo) in a fresh process.

Everything the engine's processes print is captured, so tests can check there is no traceback. Data
parallelism runs as vLLM 0.32 serves it: ``AsyncLLM`` with ``data_parallel_size`` (one engine process per
rank, each request sent to a chosen rank).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import MAX_NEW_TOKENS

CASE_SCRIPT = r"""
import asyncio, json, sys

spec = json.loads(sys.argv[1])
model, prompts, options = spec["model"], spec["prompts"], spec["options"]
common = dict(model=model, dtype="float32", block_size=16, max_model_len=256, kv_cache_memory_bytes=64 << 20,
              seed=0, distributed_executor_backend="mp", **options)

from vllm import SamplingParams

params = SamplingParams(max_tokens=spec["max_tokens"], temperature=0.0, ignore_eos=True)


def describe(wrapper):
    import os

    worker = wrapper.worker
    return [type(worker).__name__, os.getpid(), worker.parallel_config.data_parallel_index, worker.rank]


def run_llm():
    from vllm import LLM

    llm = LLM(**common)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    workers = llm.collective_rpc(describe)
    llm.llm_engine.engine_core.shutdown()
    return [list(o.outputs[0].token_ids) for o in outputs], workers


async def run_async_dp():
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**common))
    size = options["data_parallel_size"]

    async def one(index, prompt):
        final = None
        async for out in engine.generate({"prompt_token_ids": prompt}, params, request_id=f"req-{index}",
                                         data_parallel_rank=index % size):
            final = out
        return list(final.outputs[0].token_ids)

    try:
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))), None
    finally:
        engine.shutdown()


tokens, workers = asyncio.run(run_async_dp()) if "data_parallel_size" in options else run_llm()
print("RESULT " + json.dumps({"tokens": tokens, "workers": workers}), flush=True)
"""


def run_case(model: Path, prompts: list[list[int]], **options) -> tuple[dict, str]:
    """Serve ``prompts`` greedily in a fresh process: its tokens and, through ``LLM``, its workers
    (``[class, pid, DP index, rank]`` each), and everything it printed."""
    spec = {"model": str(model), "prompts": prompts, "options": options, "max_tokens": MAX_NEW_TOKENS}
    proc = subprocess.run(
        [sys.executable, "-c", CASE_SCRIPT, json.dumps(spec)],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, output[-6000:]
    return json.loads(lines[-1][len("RESULT ") :]), output
