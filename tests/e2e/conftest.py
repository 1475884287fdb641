"""End-to-end fixtures: real vLLM in-process on the reference device, tiny local models.

The environment is fixed before vLLM is imported: engine in-process, a small KV cache, no hub
access, the plugin on the reference device. Models are built once per session under pytest's
temporary directory (seconds; no downloads).
"""

from __future__ import annotations

import os

for _name, _value in {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_ASCEND_DEVICE": "reference",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_name, _value)

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from vllm_ascend.testing.tiny_models import (  # noqa: E402
    build_tiny_model,
    llama_spec,
    qwen3_moe_spec,
    qwen3_spec,
)


@pytest.fixture(scope="session")
def tiny_models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def tiny_qwen3(tiny_models_root: Path) -> Path:
    """Qwen3 (tied embeddings), hidden 128, 2 layers, 4 heads / 2 KV heads of 32, vocab 512."""
    return build_tiny_model(qwen3_spec(), tiny_models_root)


@pytest.fixture(scope="session")
def tiny_qwen3_moe(tiny_models_root: Path) -> Path:
    """Qwen3-MoE (tied embeddings): the Qwen3 geometry with 8 experts of 128, top-2, in every layer."""
    return build_tiny_model(qwen3_moe_spec(), tiny_models_root)


@pytest.fixture(scope="session")
def tiny_llama(tiny_models_root: Path) -> Path:
    """Llama (untied LM head), same geometry as the Qwen3 model."""
    return build_tiny_model(llama_spec(), tiny_models_root)


#: Four prompts of different lengths; the last three share a prefix of more than two 16-token blocks.
RUNNER_PROMPTS = (
    "the quick ascend kernel",
    "river mountain forest ocean cloud rain snow wind stone light shadow morning evening winter summer "
    "red green blue yellow black white quick slow small large bright dark warm cold",
    "river mountain forest ocean cloud rain snow wind stone light shadow morning evening winter summer "
    "red green blue yellow black white quick slow small large bright dark warm cold old new first last runs",
    "river mountain forest ocean cloud rain snow wind stone light shadow morning evening winter summer "
    "red green blue yellow black white quick slow small large bright dark warm cold tensor",
)


def _token_ids(model_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer(text)["input_ids"] for text in RUNNER_PROMPTS]


@pytest.fixture(scope="session")
def qwen3_prompts(tiny_qwen3: Path) -> list[list[int]]:
    return _token_ids(tiny_qwen3)


@pytest.fixture(scope="session")
def qwen3_moe_prompts(tiny_qwen3_moe: Path) -> list[list[int]]:
    return _token_ids(tiny_qwen3_moe)


@pytest.fixture(scope="session")
def llama_prompts(tiny_llama: Path) -> list[list[int]]:
    return _token_ids(tiny_llama)


@pytest.fixture
def v1_runner(monkeypatch: pytest.MonkeyPatch):
    """Engines built in the test run on vLLM's V1 model runner (``VLLM_USE_V2_MODEL_RUNNER=0``): the reduced
    V1 matrix. vLLM caches its environment once an engine has started in the process; the cache is dropped
    so the variable is read, and again afterwards."""
    import vllm.envs as envs

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    envs.disable_envs_cache()
    yield
    envs.disable_envs_cache()


def worker_of(llm):
    """The worker of an in-process ``vllm.LLM`` (its first rank)."""
    return llm.collective_rpc(lambda wrapper: wrapper.worker)[0]


#: The engine arguments of the tiny-model tests (fp32, block size 16, 64 MiB KV cache).
TINY_ENGINE = dict(dtype="float32", block_size=16, max_model_len=256, kv_cache_memory_bytes=64 << 20, seed=0)


@pytest.fixture
def make_llm():
    """Build ``vllm.LLM`` on a tiny model (fp32, block size 16, 64 MiB KV cache); shut it down afterwards."""
    built = []

    def factory(model_dir: Path, **overrides):
        from vllm import LLM

        llm = LLM(model=str(model_dir), **{**TINY_ENGINE, **overrides})
        built.append(llm)
        return llm

    yield factory
    import gc

    for llm in built:
        llm.llm_engine.engine_core.shutdown()
    built.clear()
    gc.collect()


#: Tokens generated per prompt in the HF comparisons.
MAX_NEW_TOKENS = 12


@pytest.fixture(scope="session")
def qwen3_hf(tiny_qwen3: Path, qwen3_prompts: list[list[int]]):
    from vllm_ascend.testing.hf_reference import hf_greedy

    return hf_greedy(tiny_qwen3, qwen3_prompts, MAX_NEW_TOKENS)


@pytest.fixture(scope="session")
def llama_hf(tiny_llama: Path, llama_prompts: list[list[int]]):
    from vllm_ascend.testing.hf_reference import hf_greedy

    return hf_greedy(tiny_llama, llama_prompts, MAX_NEW_TOKENS)


@pytest.fixture(scope="session")
def qwen3_lora_adapters(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The PEFT adapters of ``lora_adapters.ADAPTERS`` on tiny Qwen3, built once for the LoRA modules."""
    from tests.e2e.lora_adapters import ADAPTERS, build_adapter

    root = tmp_path_factory.mktemp("lora")
    built = {}
    for seed, (name, rank, alpha, targets) in enumerate(ADAPTERS):
        built[name] = root / name
        build_adapter(tiny_qwen3, built[name], rank, alpha, targets, seed)
    return built


@pytest.fixture(scope="session")
def qwen3_lora_hf_tokens(tiny_qwen3, qwen3_lora_adapters, qwen3_prompts) -> dict[str | None, list[list[int]]]:
    """HF + PEFT greedy tokens of ``qwen3_prompts`` per adapter (``None``: the base model)."""
    from tests.e2e.lora_adapters import hf_table

    return hf_table(tiny_qwen3, qwen3_lora_adapters, qwen3_prompts)


@pytest.fixture
def fresh_compile_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """vLLM's and Inductor's caches are keyed without the plugin's code: the test compiles afresh."""
    import torch._inductor.config as inductor_config

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    monkeypatch.setenv("VLLM_DISABLE_COMPILE_CACHE", "1")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    with inductor_config.patch(fx_graph_cache=False):
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """A failing test's report carries the log tails of the servers it left running (``pd.py`` instances): a
    hang inside a server shows in that server's log, not in the client's timeout."""
    import sys

    report = yield
    pd = sys.modules.get(__name__.rpartition(".")[0] + ".pd")
    if report.failed and pd is not None:
        for inst in pd.LIVE:
            report.sections.append((f"log tail of {inst.base} ({inst.log})", inst.log_tail()))
    return report
