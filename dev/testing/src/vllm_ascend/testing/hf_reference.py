"""HF transformers oracle: greedy continuations and per-step logits on the same weights."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class GreedyResult:
    """Generated ids per prompt and, per generated step, the full-vocabulary logits (float32)."""

    token_ids: list[list[int]]
    logits: list[torch.Tensor]


def hf_model_class(model_dir: Path | str) -> Any:
    """The transformers class the checkpoint's ``architectures`` names (``AutoModelForCausalLM`` otherwise).

    Not the auto classes: vLLM registers its own config classes with ``AutoConfig`` for some model types
    while it loads a model (``deepseek_v32`` -> ``DeepseekV3Config``), after which ``AutoModelForCausalLM``
    in the same process silently builds a DeepSeek-V3 (no indexer) from a DeepSeek-V3.2 checkpoint."""
    import transformers

    config = json.loads((Path(model_dir) / "config.json").read_text())
    architectures = config.get("architectures") or []
    cls = getattr(transformers, architectures[0], None) if architectures else None
    return cls if cls is not None else transformers.AutoModelForCausalLM


@torch.inference_mode()
def hf_greedy(
    model_dir: Path | str, prompts: list[list[int]], max_new_tokens: int, dtype: torch.dtype = torch.float32
) -> GreedyResult:
    """Greedy decoding with full re-computation each step (no cache, ignores EOS), one prompt at a time,
    with the weights and activations in ``dtype`` (float16 for the 310P family)."""
    model = hf_model_class(model_dir).from_pretrained(model_dir, dtype=dtype)
    model.eval()
    all_ids: list[list[int]] = []
    all_logits: list[torch.Tensor] = []
    for prompt in prompts:
        ids = torch.tensor([prompt], dtype=torch.long)
        steps = []
        for _ in range(max_new_tokens):
            logits = model(input_ids=ids).logits[0, -1].float()
            steps.append(logits)
            ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
        all_ids.append(ids[0, len(prompt) :].tolist())
        all_logits.append(torch.stack(steps))
    return GreedyResult(all_ids, all_logits)


@torch.inference_mode()
def hf_vl_greedy(
    model_dir: Path | str, requests: list[tuple[str, list[Any]]], max_new_tokens: int
) -> list[list[int]]:
    """Greedy ids of a vision-language checkpoint in fp32 for ``(prompt text, images)`` requests: the
    checkpoint's own processor expands each image placeholder, then HF's ``generate`` (KV cache, EOS ignored),
    one request at a time. (Not re-computation: a random model may generate an image placeholder token, which
    a full re-run would take for an image.)"""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    model = hf_model_class(model_dir).from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    results: list[list[int]] = []
    for text, images in requests:
        inputs = processor(text=[text], images=images or None, return_tensors="pt")
        out = model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            min_new_tokens=0,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=processor.tokenizer.pad_token_id,
        )
        results.append(out[0, inputs["input_ids"].shape[1] :].tolist())
    return results
