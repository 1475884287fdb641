"""Sleep mode for RL rollouts, in graph mode, on the runner vLLM selects (Model Runner V2, async scheduling).

One engine on the reference device with ``enable_sleep_mode`` and compiled PIECEWISE graphs (``torch.compile``
mode 3, captured pieces replayed): the weights and the KV cache are regions of the adaptor's tagged memory pool
(``HostMemoryPool``: private host mappings, released with ``madvise``). Sleeping releases the pool's bytes and
the process's resident memory; waking backs the same addresses, so the graphs captured before the sleep replay
after it (the graph wrapper refuses a replay whose inputs moved) and the tokens equal HF's.
"""

from __future__ import annotations

import gc

import psutil
import pytest
import torch

from .conftest import MAX_NEW_TOKENS, TINY_ENGINE
from .conftest import worker_of as _worker

CAPTURE_SIZES = [1, 2, 4, 8]
GRAPHS = {"mode": 3, "cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": CAPTURE_SIZES}


@pytest.fixture(scope="module")
def llm(tiny_qwen3, tmp_path_factory):
    from vllm import LLM

    cache = tmp_path_factory.mktemp("compile-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_CACHE_ROOT", str(cache / "vllm"))
        patch.setenv("VLLM_DISABLE_COMPILE_CACHE", "1")
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
        engine = LLM(model=str(tiny_qwen3), **TINY_ENGINE, enable_sleep_mode=True, compilation_config=GRAPHS)
        yield engine
        engine.llm_engine.engine_core.shutdown()
    del engine
    gc.collect()


def _greedy(llm, prompts):
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _pieces(llm) -> list:
    from vllm.compilation.cuda_graph import CUDAGraphWrapper

    from vllm_ascend.runner.graph_wrapper import ACLGraphWrapper

    wrappers = [w for w in list(CUDAGraphWrapper._all_instances) if w.runtime_mode.name == "PIECEWISE"]
    assert wrappers and all(isinstance(w, ACLGraphWrapper) for w in wrappers)
    return wrappers


def _replays(llm) -> int:
    return sum(w.replays for w in _pieces(llm))


def _tensors(worker) -> list[torch.Tensor]:
    model = worker.model_runner.get_model()
    caches = [t for t in worker.model_runner.kv_caches if isinstance(t, torch.Tensor)]
    return [*model.parameters(), *caches]


def _touch_kv_cache(worker) -> None:
    """Make every KV page resident (a serving engine's are; host pages are resident once written)."""
    for cache in worker.model_runner.kv_caches:
        if isinstance(cache, torch.Tensor):
            cache.zero_()


def _rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


def _nbytes(tensors: list[torch.Tensor]) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def test_engine_runs_graphs_on_the_sleep_mode_backend_and_pool(llm, qwen3_prompts, qwen3_hf):
    from vllm_ascend.core.device.config import get_device_adaptor
    from vllm_ascend.kernels.device.memory_pool import HostMemoryPool
    from vllm_ascend.runner.sleep_mode import AscendSleepModeBackend

    assert len({tuple(t) for t in qwen3_hf.token_ids}) == len(qwen3_hf.token_ids)  # a meaningful comparison
    worker = _worker(llm)
    assert llm.llm_engine.vllm_config.model_config.sleep_mode_backend == "ascend"
    assert type(worker.sleep_mode_backend) is AscendSleepModeBackend
    pool = get_device_adaptor().memory_pool()
    assert type(pool) is HostMemoryPool
    model = worker.model_runner.get_model()
    params = list(model.parameters())
    kv = [t for t in worker.model_runner.kv_caches if isinstance(t, torch.Tensor)]
    assert all(pool.owns(p) for p in params) and all(pool.owns(t) for t in kv)
    assert pool.allocated_bytes("weights") >= _nbytes(params)
    assert pool.allocated_bytes("kv_cache") >= _nbytes(kv) >= 32 << 20
    assert pool.allocated_bytes("graph") > 0  # what the captures allocated (their static outputs among it)
    before = _replays(llm)
    assert _greedy(llm, qwen3_prompts) == qwen3_hf.token_ids
    assert _replays(llm) > before  # decode steps replayed captured pieces


def _asleep(llm, level: int) -> tuple:
    """Sleep at ``level`` with every KV page resident first: (worker, pool, addresses, resident set released)."""
    from vllm_ascend.core.device.config import get_device_adaptor

    worker = _worker(llm)
    pool = get_device_adaptor().memory_pool()
    addresses = [t.data_ptr() for t in _tensors(worker)]
    _touch_kv_cache(worker)
    rss = _rss()
    llm.sleep(level=level)
    assert pool.get_current_usage() == 0 and llm.llm_engine.is_sleeping()
    return worker, pool, addresses, rss - _rss()


def _check_awake(llm, worker, addresses, qwen3_prompts, qwen3_hf) -> None:
    assert not llm.llm_engine.is_sleeping()
    assert [t.data_ptr() for t in _tensors(worker)] == addresses
    before = _replays(llm)
    assert _greedy(llm, qwen3_prompts) == qwen3_hf.token_ids
    assert _replays(llm) > before  # the graphs captured before the sleep, on the same addresses


def test_sleep_level_1_releases_memory_and_graphs_replay_after_wake_up(llm, qwen3_prompts, qwen3_hf):
    from vllm_ascend.core.device.config import get_device_adaptor

    resident = get_device_adaptor().memory_pool().get_current_usage()
    worker, pool, addresses, released = _asleep(llm, level=1)
    # The KV cache's pages went back to the OS; the weights' contents are kept on the host (level 1).
    assert released >= 0.9 * pool.allocated_bytes("kv_cache")
    assert pool.offloaded_bytes() >= pool.allocated_bytes("weights")
    llm.wake_up()
    assert pool.get_current_usage() == resident and pool.offloaded_bytes() == 0
    _check_awake(llm, worker, addresses, qwen3_prompts, qwen3_hf)


def test_sleep_level_2_discards_weights_until_reloaded_then_identical(llm, qwen3_prompts, qwen3_hf):
    worker, pool, addresses, released = _asleep(llm, level=2)
    weights_bytes = pool.allocated_bytes("weights")
    assert released >= 0.9 * (pool.allocated_bytes("kv_cache") + weights_bytes)  # nothing kept on the host
    llm.wake_up(tags=["weights"])
    assert pool.get_current_usage("weights") == weights_bytes and pool.get_current_usage("kv_cache") == 0
    embed = worker.model_runner.get_model().model.embed_tokens.weight
    assert float(embed.abs().sum()) == 0.0  # backed again, contents discarded
    llm.collective_rpc("reload_weights")
    llm.wake_up(tags=["kv_cache"])
    _check_awake(llm, worker, addresses, qwen3_prompts, qwen3_hf)


def _check_sleep_cycle(result: dict, expected: list[list[int]]) -> None:
    report = result["reports"]
    states = report["states"]
    assert result["tokens"] == expected and report["rounds"] == [expected, expected]
    for awake, level1, level2, woken in zip(
        *(states[k] for k in ("awake", "level1", "level2", "woken")), strict=True
    ):
        assert awake["owned"] and awake["resident"] == awake["allocated"] > 0, awake
        assert (
            level1["resident_all"] == 0 and level2["resident_all"] == 0
        )  # every region released, every rank
        assert woken["resident"] == awake["resident"] and woken["addresses"] == awake["addresses"]
        assert (
            woken["replays"] > level2["replays"] > awake["replays"]
        )  # graphs captured at start replayed after


def test_tensor_parallel_sleep_levels_with_extra_cleanup_recapture_graphs(
    tiny_qwen3, qwen3_prompts, qwen3_hf
):
    """TP=2 (two worker processes, gloo) on the runner vLLM selects, PIECEWISE graphs, each rank's pool; with
    ``rl_config.sleep_mode_extra_cleanup`` every sleep drops the captured graphs, captured again on use."""
    from .distributed import run_case

    rl = {"rl_config": {"enabled": True, "sleep_mode_extra_cleanup": True}}
    result, output = run_case(
        tiny_qwen3, qwen3_prompts, sleep_cycle=True, tensor_parallel_size=2, enable_sleep_mode=True,
        compilation_config=GRAPHS, additional_config=rl,
    )  # fmt: skip
    _check_sleep_cycle(result, qwen3_hf.token_ids)
    states = result["reports"]["states"]
    for awake, level1, level2, woken in zip(
        *(states[k] for k in ("awake", "level1", "level2", "woken")), strict=True
    ):
        assert awake["graphs"] > 0 and level1["graphs"] == 0 and level2["graphs"] == 0 and woken["graphs"] > 0
    assert output.count("Sleep mode extra cleanup:") == 4  # two sleeps on two ranks
    assert "Traceback" not in output, output[-6000:]
    assert "Using Model Runner V2" in output


def test_expert_parallel_moe_sleep_levels_keep_addresses_and_tokens(tiny_qwen3_moe, qwen3_moe_prompts):
    """A tiny Qwen3-MoE with its experts split over two EP ranks, PIECEWISE graphs."""
    from vllm_ascend.testing.hf_reference import hf_greedy

    from .distributed import run_case

    expected = hf_greedy(tiny_qwen3_moe, qwen3_moe_prompts, MAX_NEW_TOKENS).token_ids
    assert len({tuple(t) for t in expected}) == len(expected)
    result, output = run_case(
        tiny_qwen3_moe, qwen3_moe_prompts, sleep_cycle=True, tensor_parallel_size=2, enable_expert_parallel=True,
        enable_sleep_mode=True, compilation_config=GRAPHS,
    )  # fmt: skip
    _check_sleep_cycle(result, expected)
    assert "Traceback" not in output, output[-6000:]
