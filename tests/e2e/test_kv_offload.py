"""KV offload to host memory through vLLM's ``OffloadingConnector`` on the reference device: configured as vLLM
documents it (``spec_name`` left at its default, or vLLM's ``kv_offloading_size``), the platform gives it the
Ascend spec; multi-turn conversations whose prefixes exceed the device KV cache hit host memory on their second
turns (vLLM's connector counters) and give the same greedy tokens as an engine without offload.
"""

from __future__ import annotations

import gc
import random
from pathlib import Path

import pytest

from vllm_ascend.testing.tiny_models import build_tiny_model

from .test_mla_deepseek import deepseek_v3_spec

#: 64 blocks of 16 tokens on the device: four 320-token conversations do not fit together
DEVICE_KV_BYTES = {"qwen3": 1 << 20, "deepseek": 384 << 10}
HOST_BYTES = 32 << 20
TURN_TOKENS = 320
REPLY = 6


def _engine(model: Path, offload: str | None, kv_bytes: int):
    from vllm import LLM

    kwargs: dict = dict(
        model=str(model),
        dtype="float32",
        block_size=16,
        max_model_len=512,
        kv_cache_memory_bytes=kv_bytes,
        seed=0,
        enable_prefix_caching=True,
        disable_log_stats=False,
    )
    if offload == "connector":
        kwargs["kv_transfer_config"] = {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": HOST_BYTES},
        }
    elif offload == "size":
        kwargs["kv_offloading_size"] = HOST_BYTES / (1 << 30)
    return LLM(**kwargs)


def _conversations(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 500) for _ in range(TURN_TOKENS)] for _ in range(count)]


def _two_turns(llm, conversations: list[list[int]]) -> tuple[list[list[int]], list[list[int]]]:
    """Turn 1 of every conversation, then each second turn (history + reply + new tokens) alone."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=REPLY, temperature=0.0, ignore_eos=True)
    first = llm.generate([{"prompt_token_ids": c} for c in conversations], params, use_tqdm=False)
    first_ids = [list(o.outputs[0].token_ids) for o in first]
    second_ids = []
    for history, reply in zip(conversations, first_ids, strict=True):
        prompt = history + reply + [11, 12, 13, 14, 15]
        out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
        second_ids.append(list(out.outputs[0].token_ids))
    return first_ids, second_ids


def _counter(llm, name: str) -> float:
    return sum(m.value for m in llm.get_metrics() if m.name == name and hasattr(m, "value"))


def _worker_spec(wrapper) -> tuple[str, str]:
    """The offloading spec and worker classes vLLM built in this worker."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    half = get_kv_transfer_group().connector_worker
    return type(half.spec).__name__, type(half.worker).__name__


def _run(model: Path, offload: str | None, kv_bytes: int, conversations: list[list[int]]) -> dict:
    llm = _engine(model, offload, kv_bytes)
    try:
        first, second = _two_turns(llm, conversations)
        spec = None
        if offload:
            spec = llm.collective_rpc(_worker_spec)[0]
        return {
            "first": first,
            "second": second,
            "external_hits": _counter(llm, "vllm:external_prefix_cache_hits"),
            "local_hits": _counter(llm, "vllm:prefix_cache_hits"),
            "stored": _counter(llm, "vllm:kv_offload_store_bytes"),
            "loaded": _counter(llm, "vllm:kv_offload_load_bytes"),
            "spec": spec,
            "runner": llm.collective_rpc(lambda wrapper: type(wrapper.worker.model_runner).__name__)[0],
        }
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


@pytest.fixture(scope="module")
def qwen3_runs(tiny_qwen3: Path) -> dict:
    conversations = _conversations(4, seed=0)
    return {
        side: _run(tiny_qwen3, side, DEVICE_KV_BYTES["qwen3"], conversations)
        for side in (None, "connector", "size")
    }


def test_second_turns_hit_host_memory_with_the_same_tokens(qwen3_runs):
    plain, offload = qwen3_runs[None], qwen3_runs["connector"]
    assert offload["first"] == plain["first"] and offload["second"] == plain["second"]
    assert len({tuple(t) for t in plain["second"]}) == len(plain["second"])  # a meaningful comparison
    # the device holds 1024 tokens: each second turn's 320-token history was evicted, and comes from host memory
    # (whole blocks: 20 per conversation, minus what the device still held)
    assert offload["external_hits"] >= 3 * TURN_TOKENS
    assert offload["stored"] > 0 and offload["loaded"] > 0
    assert plain["external_hits"] == 0
    assert plain["local_hits"] < offload["external_hits"] + offload["local_hits"]


def test_vllm_defaults_get_the_ascend_spec(qwen3_runs):
    """``spec_name`` left out (and vLLM's ``kv_offloading_size``, which builds the same connector) -> the
    platform's ``NPUOffloadingSpec``, whose worker copies through the adaptor."""
    for side in ("connector", "size"):
        assert qwen3_runs[side]["spec"] == ("NPUOffloadingSpec", "NPUOffloadingWorker")
    size = qwen3_runs["size"]
    assert size["second"] == qwen3_runs[None]["second"]
    assert size["external_hits"] == qwen3_runs["connector"]["external_hits"]


def test_mla_latent_cache_offloads_with_the_same_tokens(tiny_models_root: Path):
    spec = deepseek_v3_spec(
        kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, first_k_dense_replace=1
    )
    model = build_tiny_model(spec, tiny_models_root)
    conversations = _conversations(4, seed=1)
    plain = _run(model, None, DEVICE_KV_BYTES["deepseek"], conversations)
    offload = _run(model, "connector", DEVICE_KV_BYTES["deepseek"], conversations)
    assert offload["second"] == plain["second"] and offload["first"] == plain["first"]
    assert len({tuple(t) for t in plain["second"]}) == len(plain["second"])
    assert offload["external_hits"] >= 2 * TURN_TOKENS


def test_hybrid_models_are_refused_by_name(tmp_path: Path):
    from vllm_ascend.testing.tiny_models import qwen3_next_spec

    model = build_tiny_model(qwen3_next_spec(), tmp_path)
    # the platform's ConfigError, as vLLM's config validation reports it
    with pytest.raises(
        ValueError, match=r"kv_connector = 'OffloadingConnector' with Qwen3NextForCausalLM .* not supported"
    ):
        _engine(model, "connector", 1 << 20)


def test_offload_on_the_v1_runner(v1_runner, tiny_qwen3: Path, qwen3_runs):
    """vLLM's V1 model runner (``VLLM_USE_V2_MODEL_RUNNER=0``) drives the same connector and worker."""
    offload = _run(tiny_qwen3, "connector", DEVICE_KV_BYTES["qwen3"], _conversations(4, seed=0))
    assert offload["spec"] == ("NPUOffloadingSpec", "NPUOffloadingWorker")
    assert (offload["runner"], qwen3_runs["connector"]["runner"]) == ("NPUModelRunner", "NPUModelRunnerV2")
    assert offload["first"] == qwen3_runs[None]["first"] and offload["second"] == qwen3_runs[None]["second"]
    assert offload["external_hits"] == qwen3_runs["connector"]["external_hits"]
