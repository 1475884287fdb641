"""Multi-LoRA end to end: PEFT adapters on tiny Qwen3, served by vLLM through the Ascend punica wrapper,
token for token equal to HF + PEFT in fp32."""

from __future__ import annotations

import pytest
import torch

from tests.e2e.conftest import MAX_NEW_TOKENS
from tests.e2e.lora_adapters import ADAPTERS, MAX_LORA_RANK, count_reference_calls, hf_greedy


@pytest.fixture(scope="module")
def kernel_calls():
    """Counts of the LoRA kernels' reference calls (the reference device runs them) while the module runs."""
    patch = pytest.MonkeyPatch()
    names = (
        "lora_shrink_torch",
        "lora_shrink_segmented_torch",
        "lora_expand_torch",
        "lora_expand_segmented_torch",
    )
    yield count_reference_calls(names, patch.setattr)
    patch.undo()


@pytest.fixture(scope="module", params=["v2", "v1"])
def llm(request, tiny_qwen3, kernel_calls):
    """One engine per runner (vLLM's default Model Runner V2, then V1 with ``VLLM_USE_V2_MODEL_RUNNER=0``): two
    adapter slots, two adapters cached on the host (three adapters force evictions)."""
    import vllm.envs as envs
    from vllm import LLM

    patch = pytest.MonkeyPatch()
    if request.param == "v1":
        patch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    envs.disable_envs_cache()
    engine = LLM(
        model=str(tiny_qwen3),
        dtype="float32",
        block_size=16,
        max_model_len=256,
        kv_cache_memory_bytes=64 << 20,
        seed=0,
        enable_lora=True,
        max_loras=2,
        max_cpu_loras=2,
        max_lora_rank=MAX_LORA_RANK,
    )
    engine.runner_label = request.param
    yield engine
    engine.llm_engine.engine_core.shutdown()
    patch.undo()
    envs.disable_envs_cache()


def _generate(llm, prompts, names, qwen3_lora_adapters):
    from vllm import SamplingParams, TokensPrompt
    from vllm.lora.request import LoRARequest

    ids = {name: i + 1 for i, (name, *_rest) in enumerate(ADAPTERS)}
    requests = [None if n is None else LoRARequest(n, ids[n], str(qwen3_lora_adapters[n])) for n in names]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, min_tokens=MAX_NEW_TOKENS)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, lora_request=requests)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_adapters_change_the_hf_output(qwen3_lora_hf_tokens):
    """Diversity guard: each adapter's HF + PEFT tokens differ from the base model's and from each other's."""
    rows = [tuple(map(tuple, tokens)) for tokens in qwen3_lora_hf_tokens.values()]
    assert len(set(rows)) == len(rows)


def test_a_mixed_batch_equals_hf_peft(
    llm, qwen3_lora_adapters, qwen3_lora_hf_tokens, qwen3_prompts, kernel_calls
):
    """Base and two adapters in one batch (each prompt under each), every request equal to HF + PEFT."""
    names = [None, "attn-r8", "mlp-r16"]
    prompts, expected, labels = [], [], []
    for i, prompt in enumerate(qwen3_prompts):
        for name in names:
            prompts.append(prompt)
            expected.append(qwen3_lora_hf_tokens[name][i])
            labels.append(name)
    before = dict(kernel_calls)
    got = _generate(llm, prompts, labels, qwen3_lora_adapters)
    for label, want, have in zip(labels, expected, got, strict=True):
        assert have == want, f"adapter {label}"
    calls = {name: kernel_calls[name] - before[name] for name in kernel_calls}
    print(f"{llm.runner_label} kernel calls: {calls}")
    assert all(count > 0 for count in calls.values()), calls  # prefill runs segmented, decode per token


def test_eviction_and_reload_keep_the_tokens(llm, qwen3_lora_adapters, qwen3_lora_hf_tokens, qwen3_prompts):
    """Three adapters over two slots and a two-adapter host cache: adapters are evicted and loaded again
    between and within the batches, and every request still equals HF + PEFT."""
    order = ["all-r4", "attn-r8", "mlp-r16", None, "all-r4", "mlp-r16"]
    for _round in range(2):
        prompts = [qwen3_prompts[i % len(qwen3_prompts)] for i in range(len(order))]
        got = _generate(llm, prompts, order, qwen3_lora_adapters)
        for i, (name, have) in enumerate(zip(order, got, strict=True)):
            assert have == qwen3_lora_hf_tokens[name][i % len(qwen3_prompts)], f"adapter {name}"
        order = order[::-1]


def test_vllm_built_the_ascend_punica_wrapper_on_the_runner_it_chose(llm):
    """vLLM 0.32 keeps LoRA on Model Runner V2 (not among V2's missing features): the runner's NPUModelRunnerV2;
    ``VLLM_USE_V2_MODEL_RUNNER=0`` gives V1's NPUModelRunner. Either LoRA manager holds the Ascend punica wrapper."""
    from vllm_ascend.runner.model_runner import NPUModelRunner
    from vllm_ascend.runner.model_runner_v2 import NPUModelRunnerV2
    from vllm_ascend.runner.punica_wrapper import AscendPunicaWrapper

    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    assert type(runner) is {"v2": NPUModelRunnerV2, "v1": NPUModelRunner}[llm.runner_label]
    wrappers = runner.lora_manager._adapter_manager.punica_wrapper_mapping.values()
    assert [type(w) for w in wrappers] == [AscendPunicaWrapper]


@pytest.fixture(scope="module")
def merged_tokens(tiny_qwen3, qwen3_lora_adapters, qwen3_prompts, tmp_path_factory) -> list[list[int]]:
    """Greedy tokens of a full checkpoint holding PEFT's ``merge_and_unload()`` of ``attn-r8`` (W + s·BA in the
    weights), run by HF transformers from the saved files: a second in-process vLLM engine would tear down the
    process's distributed groups at its shutdown, under the module's engine."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    merged_dir = tmp_path_factory.mktemp("lora-merged") / "attn-r8-merged"
    base = AutoModelForCausalLM.from_pretrained(tiny_qwen3, torch_dtype=torch.float32)
    PeftModel.from_pretrained(base, qwen3_lora_adapters["attn-r8"]).merge_and_unload().save_pretrained(
        merged_dir
    )
    return hf_greedy(merged_dir, None, qwen3_prompts)


def test_the_adapter_equals_its_merged_checkpoint(
    llm, qwen3_lora_adapters, merged_tokens, qwen3_lora_hf_tokens, qwen3_prompts
):
    """The oracle without PEFT at inference time: vLLM serving base + ``attn-r8`` gives the greedy tokens of the
    checkpoint with the adapter merged into its weights."""
    got = _generate(llm, qwen3_prompts, ["attn-r8"] * len(qwen3_prompts), qwen3_lora_adapters)
    assert got == merged_tokens
    assert merged_tokens != qwen3_lora_hf_tokens[None]  # the merge changed the model


def test_an_unknown_adapter_is_vllms_clean_error(llm, qwen3_prompts, tmp_path):
    """A request naming a path with no adapter fails with vLLM's LoRAAdapterNotFoundError naming the adapter
    and the path. Last in the module: vLLM 0.32's in-process ``LLM`` keeps the failed request scheduled, so
    the engine fails its next steps too (the server checks adapters before scheduling)."""
    from vllm import SamplingParams, TokensPrompt
    from vllm.exceptions import LoRAAdapterNotFoundError
    from vllm.lora.request import LoRARequest

    missing = LoRARequest("missing", 99, str(tmp_path / "no-such-adapter"))
    with pytest.raises(
        LoRAAdapterNotFoundError, match=r"Loading lora missing failed: No adapter found for .*no-such-adapter"
    ):
        llm.generate(
            [TokensPrompt(prompt_token_ids=qwen3_prompts[0])],
            SamplingParams(max_tokens=2),
            lora_request=missing,
        )
