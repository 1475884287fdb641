"""Run one vLLM engine over several ranks (``distributed_executor_backend="mp"``, gloo) in its own process.

Everything the engine's processes print is captured, so tests can check there is no traceback. Data
parallelism runs as vLLM 0.32 serves it: ``AsyncLLM`` with ``data_parallel_size`` (one engine process per
rank, each request sent to a chosen rank). Each case's process is forked from a warm interpreter that
imported vLLM once (:mod:`vllm_ascend.testing.script_host`), one per environment read at import (the emulated
device family).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from vllm_ascend.testing.process import OUTPUT_TAIL_CHARS
from vllm_ascend.testing.script_host import shared_script_host

from .conftest import MAX_NEW_TOKENS

CASE_SCRIPT = r"""
import asyncio, json, sys

spec = json.loads(sys.argv[1])
model, prompts, options = spec["model"], spec["prompts"], spec["options"]
common = {**dict(model=model, dtype="float32", block_size=16, max_model_len=256, kv_cache_memory_bytes=64 << 20,
                seed=0, distributed_executor_backend="mp"), **options}

from vllm import SamplingParams

params = SamplingParams(max_tokens=spec["max_tokens"], temperature=0.0, ignore_eos=True)


def describe(wrapper):
    import os

    worker = wrapper.worker
    return [type(worker).__name__, os.getpid(), worker.parallel_config.data_parallel_index, worker.rank]


def moe_report(wrapper):
    # Per rank: the MoE layers' communication steps, placement schedule state and per-slot gate/up sums.
    model = wrapper.worker.model_runner.model
    layers = [m for m in model.modules() if hasattr(m, "comm_steps")]
    schedule = layers[0].eplb if layers else None
    report = {
        "rank": wrapper.worker.rank,
        "comm_steps": {str(k.value): sum(m.comm_steps[k] for m in layers) for k in layers[0].comm_steps} if layers else {},
        "w13_sums": [m.routed_experts.w13_weight.double().sum(dim=(1, 2)).tolist() for m in layers],
    }
    if schedule is not None:
        report.update(
            steps=schedule.step,
            table=schedule.table.tolist(),
            rebalances=[[step, table.tolist()] for step, table in schedule.rebalances],
            windows=list(schedule.windows),
            expert_maps=[m.expert_map.tolist() for m in layers],
        )
    return report


def pool_state(wrapper):
    # Per rank: the tagged memory pool's bytes, whether it holds every weight and KV tensor, their addresses,
    # and the graph replays so far.
    from vllm.compilation.cuda_graph import CUDAGraphWrapper

    from vllm_ascend.core.sdk import get_device_adaptor

    worker = wrapper.worker
    pool = get_device_adaptor().memory_pool()
    model = worker.model_runner.get_model()
    tensors = [*model.parameters(), *[t for t in worker.model_runner.kv_caches if hasattr(t, "data_ptr")]]
    return {
        "rank": worker.rank,
        # weights and KV cache (graph regions come and go with captures)
        "resident": pool.get_current_usage("weights") + pool.get_current_usage("kv_cache"),
        "allocated": pool.allocated_bytes("weights") + pool.allocated_bytes("kv_cache"),
        "resident_all": pool.get_current_usage(),
        "owned": all(pool.owns(t) for t in tensors),
        "addresses": [t.data_ptr() for t in tensors],
        "replays": sum(getattr(w, "replays", 0) for w in list(CUDAGraphWrapper._all_instances)),
        "graphs": sum(len(getattr(w, "entries", ())) for w in list(CUDAGraphWrapper._all_instances)),
    }


def sleep_cycle(llm):
    # Level 1 then level 2 (weights reloaded from the checkpoint), generating after each wake-up.
    states, rounds = {"awake": llm.collective_rpc(pool_state)}, []
    llm.sleep(level=1)
    states["level1"] = llm.collective_rpc(pool_state)
    llm.wake_up()
    rounds.append(llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False))
    llm.sleep(level=2)
    states["level2"] = llm.collective_rpc(pool_state)
    llm.wake_up(tags=["weights"])
    llm.collective_rpc("reload_weights")
    llm.wake_up(tags=["kv_cache"])
    rounds.append(llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False))
    states["woken"] = llm.collective_rpc(pool_state)
    return {"states": states, "rounds": [[list(o.outputs[0].token_ids) for o in r] for r in rounds]}


def run_llm():
    from vllm import LLM

    from vllm.lora.request import LoRARequest

    llm = LLM(**common)
    loras = [None if r is None else LoRARequest(*r) for r in spec["lora_requests"]] if spec["lora_requests"] else None
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False, lora_request=loras)
    workers = llm.collective_rpc(describe)
    reports = llm.collective_rpc(moe_report) if spec.get("report") else None
    if spec.get("sleep_cycle"):
        reports = sleep_cycle(llm)
    llm.llm_engine.engine_core.shutdown()
    return [list(o.outputs[0].token_ids) for o in outputs], workers, reports


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
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))), None, None
    finally:
        engine.shutdown()


tokens, workers, reports = asyncio.run(run_async_dp()) if "data_parallel_size" in options else run_llm()
print("RESULT " + json.dumps({"tokens": tokens, "workers": workers, "reports": reports}), flush=True)
"""


def run_case(
    model: Path,
    prompts: list[list[int]],
    env: dict[str, str] | None = None,
    max_tokens: int = MAX_NEW_TOKENS,
    report: bool = False,
    lora_requests: list[tuple[str, int, str] | None] | None = None,
    sleep_cycle: bool = False,
    **options,
) -> tuple[dict, str]:
    """Serve ``prompts`` greedily in a process of its own (``env``: variables added to this process's): its
    tokens and, through ``LLM``, its workers (``[class, pid, DP index, rank]`` each) and with ``report``
    each rank's MoE layers' state (``moe_report``), or with ``sleep_cycle`` the tokens after a level-1 and a
    level-2 sleep with each rank's pool state (``sleep_cycle``), and everything it printed. ``lora_requests``: per prompt,
    ``(name, id, path)`` of a LoRA adapter or None (through ``LLM``; needs ``enable_lora=True``)."""
    spec = {
        "model": str(model),
        "prompts": prompts,
        "options": options,
        "max_tokens": max_tokens,
        "report": report,
        "lora_requests": lora_requests,
        "sleep_cycle": sleep_cycle,
    }
    environ = {**os.environ, **(env or {})}
    result, output = shared_script_host().run(CASE_SCRIPT, json.dumps(spec), env=environ, timeout=300)
    assert result is not None, output[-OUTPUT_TAIL_CHARS:]
    return result, output
