"""A tiny gpt-oss served end to end on the reference device: greedy tokens equal HF transformers fp32.

gpt-oss brings together what the runner's dense attention and MoE layer gained for it: per-head attention
sinks, alternating sliding-window (layer 0, window 8, shorter than the prompts) and full-attention layers,
attention biases, YaRN rope (factor 4), and MoE experts with a router bias, expert biases and vLLM's
clamped ``swigluoai`` activation (``clipped_swiglu`` through the device adaptor). The sinks are drawn in [0, 2] so that they move
HF's own greedy tokens (checked against HF with the sinks pushed to -1e4, i.e. absent), and the expert
weights are scaled so that the activation's clamp is reached.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch

from vllm_ascend.testing.tiny_models import (
    TinyModelSpec,
    build_tiny_model,
    common_config,
    register_model_builder,
)

from .conftest import MAX_NEW_TOKENS, RUNNER_PROMPTS

WINDOW = 8
EXPERTS, TOP_K = 4, 2
#: Scale on the experts' gate/up weights: enough for some pre-activations to pass the clamp limit (7).
GATE_UP_SCALE = 4.0
#: gpt-oss's YaRN rope, scaled (as the real model's factor 32 is) so that the scaling is exercised.
YARN_FACTOR = 4


def _gpt_oss_config(spec: TinyModelSpec, vocab_size: int) -> Any:
    from transformers import GptOssConfig

    common = common_config(spec, vocab_size)
    common.pop("rope_theta")  # in rope_parameters (YaRN)
    return GptOssConfig(
        **common,
        num_local_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"] * (spec.num_layers // 2),
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": YARN_FACTOR,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "original_max_position_embeddings": spec.max_position_embeddings // YARN_FACTOR,
            "truncate": False,
        },
        **spec.extra,
    )


def _gpt_oss_weights(spec: TinyModelSpec, model: Any) -> None:
    """Sinks in [0, 2] per head, random expert biases (HF initialises them to zero), larger gate/up."""
    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("self_attn.sinks"):
                param.copy_(torch.rand(param.shape, generator=gen) * 2)
            elif name.endswith("experts.gate_up_proj"):
                param.mul_(GATE_UP_SCALE)
            elif name.endswith(("experts.gate_up_proj_bias", "experts.down_proj_bias")):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)


register_model_builder("gpt_oss", _gpt_oss_config, _gpt_oss_weights)


@pytest.fixture(scope="module")
def tiny_gpt_oss(tiny_models_root: Path) -> Path:
    return build_tiny_model(
        TinyModelSpec(
            kind="gpt_oss",
            hidden_size=64,
            intermediate_size=64,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            seed=11,
        ),
        tiny_models_root,
    )


@pytest.fixture(scope="module")
def prompts(tiny_gpt_oss: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt_oss)
    ids = [tokenizer(text)["input_ids"] for text in RUNNER_PROMPTS]
    assert max(len(p) for p in ids) > 3 * WINDOW  # the window matters for the long prompts
    return ids


def _hf_tokens_with(
    model_dir: Path, prompts: list[list[int]], sinks: float | None, windowed: bool
) -> list[list[int]]:
    """HF fp32 greedy tokens with every sink set to ``sinks`` (None: as saved), with the config's sliding
    layer or with every layer full attention."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    if not windowed:
        config.layer_types = ["full_attention"] * config.num_hidden_layers
    model = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=torch.float32).eval()
    with torch.no_grad():
        if sinks is not None:
            for layer in model.model.layers:
                layer.self_attn.sinks.fill_(sinks)
        out = []
        for prompt in prompts:
            ids = torch.tensor([prompt])
            for _ in range(MAX_NEW_TOKENS):
                ids = torch.cat([ids, model(input_ids=ids).logits[0, -1].argmax().view(1, 1)], dim=1)
            out.append(ids[0, len(prompt) :].tolist())
    return out


def _assert_clamp_reached(model_dir: Path, prompt: list[int]) -> None:
    """Some expert pre-activation of HF's forward on ``prompt`` passes gpt-oss's clamp limit."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    largest: list[float] = []
    for layer in model.model.layers:
        experts = layer.mlp.experts
        apply_gate = experts._apply_gate

        def recording(gate_up: torch.Tensor, apply_gate: Any = apply_gate) -> torch.Tensor:
            largest.append(float(gate_up.abs().max()))
            return apply_gate(gate_up)

        experts._apply_gate = recording
    with torch.no_grad():
        model(input_ids=torch.tensor([prompt]))
    assert max(largest) > model.config.swiglu_limit, largest


def test_gpt_oss_with_sinks_matches_hf_fp32(tiny_gpt_oss, prompts):
    """16 tokens per step: long prompts are prefilled in chunks beside other requests' decodes, over the
    sliding-window layer's cache and the full layer's, with sinks in both."""
    from vllm import LLM, SamplingParams

    from vllm_ascend.core.device.config import get_device_adaptor
    from vllm_ascend.testing.hf_reference import hf_greedy

    hf = hf_greedy(tiny_gpt_oss, prompts, MAX_NEW_TOKENS).token_ids
    assert hf == _hf_tokens_with(tiny_gpt_oss, prompts, None, True)  # the helper reproduces hf_greedy
    assert hf != _hf_tokens_with(tiny_gpt_oss, prompts, -1e4, True)  # the sinks change HF's tokens
    assert hf != _hf_tokens_with(tiny_gpt_oss, prompts, None, False)  # and so does the window
    _assert_clamp_reached(tiny_gpt_oss, prompts[1])

    llm = LLM(
        model=str(tiny_gpt_oss),
        dtype="float32",
        block_size=16,
        max_model_len=256,
        kv_cache_memory_bytes=64 << 20,
        seed=0,
        max_num_batched_tokens=16,
        max_num_seqs=4,
    )
    try:
        counts = get_device_adaptor().call_counts
        before = counts["clipped_swiglu"]
        params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        got = [list(o.outputs[0].token_ids) for o in outputs]
        assert counts["clipped_swiglu"] - before >= 2 * MAX_NEW_TOKENS  # gpt-oss's experts ran through it
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    assert got == hf
