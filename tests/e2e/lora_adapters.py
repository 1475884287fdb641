"""PEFT LoRA adapters the LoRA e2e modules build on the tiny models, and their HF + PEFT oracle."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tests.e2e.conftest import MAX_NEW_TOKENS

#: (name, rank, alpha, target modules) on tiny Qwen3: different ranks, scalings and layers per adapter.
ADAPTERS = (
    ("attn-r8", 8, 16, ["q_proj", "k_proj", "v_proj", "o_proj"]),
    ("mlp-r16", 16, 8, ["gate_proj", "up_proj", "down_proj"]),
    ("all-r4", 4, 4, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
)
MAX_LORA_RANK = 16


def build_adapter(
    base_dir: Path,
    out_dir: Path,
    rank: int,
    alpha: int,
    targets: list[str],
    seed: int,
    std: float = 0.3,
    **config: object,
) -> None:
    """A PEFT LoRA adapter with random A and B of standard deviation ``std`` (PEFT's default B = 0 would be the
    base model); ``config``: more ``LoraConfig`` fields (e.g. ``target_parameters`` for 3D expert weights)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
    lora_config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, **config)  # type: ignore[arg-type]
    peft_model = get_peft_model(model, lora_config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    peft_model.save_pretrained(out_dir)


def hf_greedy(
    base_dir: Path, adapter_dir: Path | None, prompts: list[list[int]], dtype: torch.dtype = torch.float32
) -> list[list[int]]:
    """HF greedy tokens (``MAX_NEW_TOKENS`` each) of the base model in ``dtype``, or of it with a PEFT adapter
    (PEFT keeps the adapter's own weights in fp32)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=dtype)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    outs = []
    with torch.no_grad():
        for ids in prompts:
            got = model.generate(
                torch.tensor([ids]),
                max_new_tokens=MAX_NEW_TOKENS,
                do_sample=False,
                min_new_tokens=MAX_NEW_TOKENS,
            )
            outs.append(got[0, len(ids) :].tolist())
    return outs


def hf_table(
    base_dir: Path, adapters: dict[str, Path], prompts: list[list[int]]
) -> dict[str | None, list[list[int]]]:
    """HF + PEFT greedy tokens per adapter name (``None``: the base model)."""
    table: dict[str | None, list[list[int]]] = {None: hf_greedy(base_dir, None, prompts)}
    for name, path in adapters.items():
        table[name] = hf_greedy(base_dir, path, prompts)
    return table


def count_reference_calls(
    names: tuple[str, ...], setattr_: Callable[[Any, str, Any], None]
) -> dict[str, int]:
    """Counts of the calls of the LoRA kernels' references ``names`` (the reference device runs them), each
    wrapped through ``setattr_`` (a MonkeyPatch's ``setattr``, undone by its owner)."""
    from vllm_ascend.kernels import lora

    counts = dict.fromkeys(names, 0)
    for name in names:
        original = getattr(lora, name)

        def counted(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            counts[_name] += 1
            return _original(*args, **kwargs)

        setattr_(lora, name, counted)
    return counts
