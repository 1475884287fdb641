"""Vision-language models through ``vllm.LLM`` with the plugin on the reference device: greedy tokens equal HF
transformers fp32 for text+image prompts, on the runner vLLM selects (Model Runner V2).

One engine per model, shared by the module's tests: chunked prefill with a step budget (32 tokens) smaller
than the prompts, so image-token runs are split across steps; prefix caching on. The vision tower's attention
goes through the adaptor's ``packed_attention`` (``AscendMMEncoderAttention``), its 2-D rope through
``rotary_embedding`` (``AscendApplyRotaryEmb``) and the language model's multimodal rotary embedding through
``mrope`` (``AscendMRotaryEmbedding``); the tests count the calls.
Images only: transformers' Qwen video processors need torchvision, which cannot be installed here
(``vllm_ascend.testing.image_only_processors``).
"""

from __future__ import annotations

import os

import pytest

os.environ["VLLM_ASCEND_TESTING_IMAGE_ONLY_PROCESSORS"] = "1"

MAX_NEW_TOKENS = 8
#: Prompt lengths (after vLLM's placeholder expansion) of the last :func:`_generate` call.
_LAST_PROMPT_LENGTHS: list[int] = []
#: Tokens per scheduler step: every image prompt below is longer, so its prefill (and image run) is chunked.
STEP_TOKENS = 32


def _image(height: int, width: int, seed: int):
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _prompt(text: str, num_images: int) -> str:
    from vllm_ascend.testing.tiny_vl_models import IMAGE_PLACEHOLDER

    return f"<|im_start|>user\n{IMAGE_PLACEHOLDER * num_images}{text}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def vl(request, tmp_path_factory):
    """(kind, model dir, engine) for one tiny VL checkpoint."""
    from vllm import LLM

    from vllm_ascend.testing.image_only_processors import install
    from vllm_ascend.testing.tiny_vl_models import TinyVLSpec, build_tiny_vl_model

    install()  # the HF oracle's processor, in this process
    model_dir = build_tiny_vl_model(TinyVLSpec(kind=request.param), tmp_path_factory.mktemp("vl"))
    llm = LLM(
        model=str(model_dir),
        dtype="float32",
        block_size=16,
        max_model_len=1024,
        max_num_batched_tokens=STEP_TOKENS,
        max_num_seqs=4,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
        limit_mm_per_prompt={"image": 3, "video": 0},
        kv_cache_memory_bytes=64 << 20,
        disable_log_stats=False,
        seed=0,
    )
    yield request.param, model_dir, llm
    llm.llm_engine.engine_core.shutdown()


def _generate(llm, requests: list[tuple[str, list]]) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    inputs = [
        {"prompt": text, "multi_modal_data": {"image": images}} if images else {"prompt": text}
        for text, images in requests
    ]
    outputs = llm.generate(inputs, params, use_tqdm=False)
    _LAST_PROMPT_LENGTHS[:] = [len(o.prompt_token_ids) for o in outputs]
    return [list(o.outputs[0].token_ids) for o in outputs]


def _counts() -> dict[str, int]:
    from vllm_ascend.core.sdk import get_device_adaptor

    return dict(get_device_adaptor().call_counts)


def test_images_of_different_sizes_in_a_mixed_batch_match_hf(vl):
    from vllm_ascend.testing.hf_reference import hf_vl_greedy

    kind, model_dir, llm = vl
    wide, small, tall = _image(168, 224, 1), _image(112, 140, 2), _image(224, 112, 3)
    requests = [
        (_prompt("the river and the mountain", 1), [wide]),
        (_prompt("compare the two", 2), [small, tall]),
        (_prompt("the quick ascend kernel reads the cache", 0), []),
        (_prompt("three of them", 3), [tall, wide, small]),
        (_prompt("the river and the mountain", 1), [small]),
    ]
    expected = hf_vl_greedy(model_dir, requests, MAX_NEW_TOKENS)
    # Same text, another image: HF's tokens differ, so equality below depends on the pixels.
    assert expected[0] != expected[4], expected
    assert len({tuple(ids) for ids in expected}) == len(expected), expected

    before = _counts()
    got = _generate(llm, requests)
    after = _counts()
    assert got == expected, (kind, got, expected)
    assert after.get("packed_attention", 0) > before.get("packed_attention", 0), (before, after)
    assert after.get("mrope", 0) > before.get("mrope", 0), (before, after)
    # the vision tower's 2-D rope (vLLM's ApplyRotaryEmb) through rotary_embedding
    assert after.get("rotary_embedding", 0) > before.get("rotary_embedding", 0), (before, after)
    # Every image prompt is longer than a step: its image-token run is split between steps.
    assert all(
        length > STEP_TOKENS
        for length, (_, images) in zip(_LAST_PROMPT_LENGTHS, requests, strict=True)
        if images
    )


def test_prefix_cache_is_keyed_by_the_image(vl):
    """Same text, image A then image B then A again: each answer is its own image's HF answer (a cache keyed
    by text alone would hand B A's blocks), and the repeat hits the cache."""
    from vllm_ascend.testing.hf_reference import hf_vl_greedy

    _, model_dir, llm = vl
    first, second = _image(196, 196, 11), _image(196, 196, 12)
    text = _prompt("the stone in the morning light", 1)
    expected = hf_vl_greedy(model_dir, [(text, [first]), (text, [second])], MAX_NEW_TOKENS)
    assert expected[0] != expected[1], expected

    assert _generate(llm, [(text, [first])]) == [expected[0]]
    assert _generate(llm, [(text, [second])]) == [expected[1]]
    hits_before = _prefix_cache_hits(llm)
    assert _generate(llm, [(text, [first])]) == [expected[0]]
    assert _prefix_cache_hits(llm) > hits_before


def _prefix_cache_hits(llm) -> int:
    from vllm.v1.metrics.reader import Counter

    return sum(
        int(metric.value)
        for metric in llm.get_metrics()
        if isinstance(metric, Counter) and metric.name == "vllm:prefix_cache_hits"
    )


def test_qwen2_5_vl_language_model_in_compiled_piecewise_graphs_matches_hf(
    tmp_path_factory, tmp_path, monkeypatch
):
    """Graph mode for the language model (``mode=3``, PIECEWISE graphs of the compiled pieces between attention
    ops; the vision tower runs eagerly, as vLLM compiles no MM encoder by default): tokens still equal HF fp32,
    the pieces replay, and ``mrope`` is traced as one op."""
    from vllm import LLM

    from vllm_ascend.testing.hf_reference import hf_vl_greedy
    from vllm_ascend.testing.image_only_processors import install
    from vllm_ascend.testing.tiny_vl_models import TinyVLSpec, build_tiny_vl_model

    from .test_graph_mode import _replays, _wrappers

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    monkeypatch.setenv("VLLM_DISABLE_COMPILE_CACHE", "1")
    install()
    model_dir = build_tiny_vl_model(TinyVLSpec(kind="qwen2_5_vl"), tmp_path_factory.mktemp("vl-graph"))
    requests = [
        (_prompt("the river and the mountain", 1), [_image(168, 224, 31)]),
        (_prompt("the quick ascend kernel reads the cache", 0), []),
        (_prompt("compare the two", 2), [_image(112, 140, 32), _image(224, 112, 33)]),
    ]
    expected = hf_vl_greedy(model_dir, requests, MAX_NEW_TOKENS)
    llm = LLM(
        model=str(model_dir),
        dtype="float32",
        block_size=16,
        max_model_len=1024,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        limit_mm_per_prompt={"image": 2, "video": 0},
        kv_cache_memory_bytes=64 << 20,
        compilation_config={
            "mode": 3,
            "cudagraph_mode": "PIECEWISE",
            "cudagraph_capture_sizes": [1, 2, 4, 16],
        },
        seed=0,
    )
    try:
        assert llm.llm_engine.vllm_config.compilation_config.mode == 3
        before_replays, before = _replays(_wrappers(llm)["PIECEWISE"]), _counts()
        assert _generate(llm, requests) == expected
        after = _counts()
        assert _replays(_wrappers(llm)["PIECEWISE"]) > before_replays
        assert after.get("mrope", 0) > before.get("mrope", 0) and after.get(
            "packed_attention", 0
        ) > before.get("packed_attention", 0), (before, after)
    finally:
        llm.llm_engine.engine_core.shutdown()
