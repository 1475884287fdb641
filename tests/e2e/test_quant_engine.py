"""ModelSlim checkpoints through vLLM with ``quantization="ascend"`` on the reference device.

Each scheme exports a tiny Qwen3 (and Qwen3-MoE, for the schemes with MoE experts) with the project's
exporter, serves it through ``vllm.LLM``, and compares against the independent fake-quant forward of
``quant_oracle`` (dequantised weights, the same activation quantisation, float64): greedy tokens must be
identical and the reported log-probabilities equal within 1e-3 relative. Device memory of the
quantized model is measured against the float model's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.e2e.quant_oracle import load_oracle
from vllm_ascend.quant.export import export_modelslim

MAX_NEW_TOKENS = 16
TOP_LOGPROBS = 5
PROMPTS = (
    "the quick ascend kernel",
    "river mountain forest ocean cloud rain snow wind stone light shadow morning evening winter summer",
    "red green blue yellow black white quick slow small large bright dark",
)
DENSE_SCHEMES = ("W8A8", "W8A8_DYNAMIC", "W8A16", "W4A16", "W4A8_DYNAMIC")
MOE_SCHEMES = ("W8A8_DYNAMIC", "W4A8_DYNAMIC", "W8A16")
#: Schemes with a MoE variant; for the others the exporter leaves the experts FLOAT (a mixed model).
QUANTIZED_EXPERTS = ("W8A8_DYNAMIC", "W4A8_DYNAMIC")
#: Bytes of quantized linear weights relative to fp32: int8 = 1/4, packed int4 = 1/8.
WEIGHT_BYTES = {"W8A8": 1, "W8A8_DYNAMIC": 1, "W8A16": 1, "W4A16": 0.5, "W4A8_DYNAMIC": 0.5}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path, str], Path]:
    root = tmp_path_factory.mktemp("modelslim")
    done: dict[tuple[str, str], Path] = {}

    def export(model: Path, scheme: str) -> Path:
        key = (model.name, scheme)
        if key not in done:
            done[key] = root / f"{model.name}-{scheme}"
            export_modelslim(model, done[key], scheme, progress=False)
        return done[key]

    return export


def _prompt_ids(model: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return [tokenizer(text)["input_ids"] for text in PROMPTS]


def _param_bytes(model: torch.nn.Module) -> dict[str, int]:
    """Bytes of the model's parameters by dtype."""
    sizes: dict[str, int] = {}
    for tensor in model.parameters():
        key = str(tensor.dtype).removeprefix("torch.")
        sizes[key] = sizes.get(key, 0) + tensor.numel() * tensor.element_size()
    return sizes


def _serve(make_llm, model: Path, prompts: list[list[int]], **kwargs):
    from vllm import SamplingParams, TokensPrompt

    llm = make_llm(model, **kwargs)
    params = SamplingParams(
        temperature=0.0, max_tokens=MAX_NEW_TOKENS, logprobs=TOP_LOGPROBS, ignore_eos=True
    )
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    (sizes,) = llm.apply_model(_param_bytes)
    return (
        llm,
        [list(o.outputs[0].token_ids) for o in outputs],
        [o.outputs[0].logprobs for o in outputs],
        sizes,
    )


#: An activation closer than this (relative; a few fp32 ulps) to a rounding tie may round the other way in fp32.
TIE_MARGIN = 3e-7


def _check_against_oracle(model: Path, prompts, tokens, logprobs) -> None:
    """Greedy tokens equal the oracle's; log-probabilities within 1e-3 relative. A sequence in which the
    oracle met an activation within fp32 noise of a rounding tie (the engine may round it the other way,
    one quantisation step) is held to 5e-2 instead — and at least one prompt must be free of such ties."""
    oracle = load_oracle(model)
    tight = 0
    for prompt, got, steps in zip(prompts, tokens, logprobs, strict=True):
        assert oracle.greedy(prompt, MAX_NEW_TOKENS) == got, (model.name, prompt)
        logits = oracle.logits(prompt + got[:-1])
        rel = 1e-3 if oracle.tie_margin >= TIE_MARGIN else 5e-2
        tight += rel == 1e-3
        reference = torch.log_softmax(logits.double(), dim=-1)[len(prompt) - 1 :]
        for step, (position, entries) in enumerate(zip(reference, steps, strict=True)):
            for token_id, entry in entries.items():
                expected = float(position[token_id])
                assert entry.logprob == pytest.approx(expected, rel=rel, abs=1e-4), (
                    model.name,
                    step,
                    token_id,
                    oracle.tie_margin,
                )
    assert tight >= 1, f"{model.name}: every prompt met a rounding tie"


@pytest.mark.parametrize("scheme", DENSE_SCHEMES)
def test_dense_scheme_matches_fake_quant_oracle(scheme, make_llm, exported, tiny_qwen3):
    model = exported(tiny_qwen3, scheme)
    prompts = _prompt_ids(model)
    # W8A8_DYNAMIC is served without naming the method: the description file selects it.
    kwargs = {} if scheme == "W8A8_DYNAMIC" else {"quantization": "ascend"}
    llm, tokens, logprobs, sizes = _serve(make_llm, model, prompts, **kwargs)
    assert llm.llm_engine.vllm_config.model_config.quantization == "ascend"
    assert len({tuple(t) for t in tokens}) == len(tokens), tokens  # prompts do not collapse to one output
    _check_against_oracle(model, prompts, tokens, logprobs)

    # Linear weights stay quantized on the device: int8 (or int4 packed in int32) bytes, no float copy;
    # the float bytes left are the unquantized tensors plus per-channel/per-group scales (a few %).
    quantized = int(sizes.get("int8", 0) + sizes.get("int32", 0))
    linear_fp32 = _linear_weight_bytes_fp32(tiny_qwen3)
    float_rest = _total_fp32_bytes(tiny_qwen3) - linear_fp32
    assert (
        linear_fp32 * WEIGHT_BYTES[scheme] / 4 <= quantized <= linear_fp32 * WEIGHT_BYTES[scheme] / 4 * 1.05
    )
    assert sizes.get("float32", 0) <= float_rest + 0.1 * linear_fp32, sizes
    print(f"{scheme}: device bytes {sum(sizes.values())} vs float {_total_fp32_bytes(tiny_qwen3)}", sizes)


@pytest.mark.parametrize("scheme", MOE_SCHEMES)
def test_moe_scheme_matches_fake_quant_oracle(scheme, make_llm, exported, tiny_qwen3_moe):
    model = exported(tiny_qwen3_moe, scheme)
    prompts = _prompt_ids(model)
    _, tokens, logprobs, sizes = _serve(make_llm, model, prompts, quantization="ascend")
    assert len({tuple(t) for t in tokens}) == len(tokens), tokens
    _check_against_oracle(model, prompts, tokens, logprobs)
    if scheme in QUANTIZED_EXPERTS:
        assert sizes.get("float32", 0) < _total_fp32_bytes(tiny_qwen3_moe) / 2, sizes
    else:
        assert sizes.get("float32", 0) > _total_fp32_bytes(tiny_qwen3_moe) / 2, sizes
    print(
        f"MoE {scheme}: device bytes {sum(sizes.values())} vs float {_total_fp32_bytes(tiny_qwen3_moe)}",
        sizes,
    )


def _linear_weight_bytes_fp32(model: Path) -> int:
    """fp32 bytes of the tensors the exporter quantizes (2-D linear weights inside the decoder layers)."""
    from safetensors import safe_open

    total = 0
    for file in model.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            for name in f.keys():
                shape = f.get_slice(name).get_shape()
                if ".layers." in name and name.endswith("proj.weight") and len(shape) == 2:
                    total += shape[0] * shape[1] * 4
    return total


def _total_fp32_bytes(model: Path) -> int:
    from safetensors import safe_open

    total = 0
    for file in model.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            for name in f.keys():
                numel = 1
                for dim in f.get_slice(name).get_shape():
                    numel *= dim
                total += numel * 4
    return total
