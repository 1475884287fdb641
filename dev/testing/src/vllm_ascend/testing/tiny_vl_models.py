"""Tiny random-weight vision-language checkpoints (Qwen2.5-VL, Qwen3-VL) built offline from HF config classes.

Each build holds the model, a locally trained tokenizer with Qwen's vision special tokens and a chat template
that renders image items, and the PIL image processor (``Qwen2VLImageProcessorPil``, which transformers loads for the saved
``Qwen2VLImageProcessor`` where torchvision is missing: torchvision cannot be installed beside this torch). No video
processor class is saved: transformers' Qwen video processors require torchvision too (Qwen3-VL's checkpoint
carries the video geometry fields vLLM reads, see :data:`QWEN3_VL_VIDEO_FIELDS`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from vllm_ascend.runner.demo_model import build_tokenizer, default_cache_dir, publish_build

VL_BUILD_VERSION = 2
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", *VISION_TOKENS)
#: Renders string contents and Qwen-style content lists (``{"type": "image"}`` / ``"text"`` items).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or item['type'] == 'image_url' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
#: Pixels per image bounds of the saved processor: small, so tiny images stay a few dozen tokens.
MIN_PIXELS = 56 * 56
MAX_PIXELS = 224 * 224


#: Qwen3-VL's video geometry (transformers' ``Qwen3VLVideoProcessor`` defaults), saved for vLLM's video budget:
#: its Qwen3-VL processing info reads these fields from the video processor even when videos are disabled.
QWEN3_VL_VIDEO_FIELDS = {
    "size": {"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "min_frames": 4,
    "max_frames": 768,
    "max_video_tokens": 768,
    "fps": 2,
}


@dataclass(frozen=True)
class TinyVLSpec:
    """What to build: ``kind`` is ``qwen2_5_vl`` or ``qwen3_vl``."""

    kind: str = "qwen2_5_vl"
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    vision_hidden_size: int = 64
    vision_depth: int = 2
    vision_heads: int = 2
    vocab_size: int = 512
    init_std: float = 0.2
    seed: int = 0

    def key(self) -> str:
        import hashlib

        blob = json.dumps({"version": VL_BUILD_VERSION, **asdict(self)}, sort_keys=True)
        return f"{self.kind}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def _text_config(spec: TinyVLSpec, vocab_size: int, mrope_section: list[int], **extra: Any) -> dict[str, Any]:
    return dict(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=2048,
        initializer_range=spec.init_std,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": mrope_section,
            **extra,
        },
    )


def _config(spec: TinyVLSpec, tokenizer: Any) -> Any:
    ids = {
        name: tokenizer.convert_tokens_to_ids(tok)
        for name, tok in (
            ("vision_start_token_id", "<|vision_start|>"),
            ("vision_end_token_id", "<|vision_end|>"),
            ("image_token_id", "<|image_pad|>"),
            ("video_token_id", "<|video_pad|>"),
        )
    }
    vocab_size = max(len(tokenizer), spec.vocab_size)
    half_head = spec.hidden_size // spec.num_heads // 2
    section = [half_head - 2 * (half_head * 3 // 8), half_head * 3 // 8, half_head * 3 // 8]
    vision: dict[str, Any] = dict(
        depth=spec.vision_depth,
        hidden_size=spec.vision_hidden_size,
        num_heads=spec.vision_heads,
        out_hidden_size=spec.hidden_size,
        initializer_range=spec.init_std,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
    if spec.kind == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig

        vision |= dict(
            intermediate_size=spec.vision_hidden_size * 2,
            patch_size=14,
            window_size=56,
            fullatt_block_indexes=[spec.vision_depth - 1],
        )
        text = _text_config(spec, vocab_size, section, type="mrope")
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **ids)
    if spec.kind == "qwen3_vl":
        from transformers import Qwen3VLConfig

        vision |= dict(
            intermediate_size=spec.vision_hidden_size * 2,
            patch_size=16,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
        )
        text = _text_config(spec, vocab_size, section, mrope_interleaved=True)
        text |= dict(head_dim=spec.hidden_size // spec.num_heads)
        return Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **ids)
    raise ValueError(f"tiny VL kind {spec.kind!r} is unknown; allowed: qwen2_5_vl, qwen3_vl")


def _image_processor(spec: TinyVLSpec) -> Any:
    """The PIL image processor (transformers saves it as ``Qwen2VLImageProcessor`` and, without torchvision,
    loads that name's PIL backend)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        patch_size=14 if spec.kind == "qwen2_5_vl" else 16,
        merge_size=2,
        temporal_patch_size=2,
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    )


def build_tiny_vl_model(spec: TinyVLSpec | None = None, root: Path | None = None) -> Path:
    """Build (or reuse) the checkpoint of ``spec`` under ``root`` (default: the user cache); return its directory."""
    from transformers import AutoModelForImageTextToText

    spec = spec or TinyVLSpec()
    out = (root or default_cache_dir() / "models") / spec.key()
    if (out / "complete").exists():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec.vocab_size, spec.seed, SPECIAL_TOKENS, CHAT_TEMPLATE)
    config = _config(spec, tokenizer)
    for cfg in (config, config.text_config):
        cfg.eos_token_id = tokenizer.eos_token_id
        cfg.pad_token_id = tokenizer.pad_token_id
        cfg.bos_token_id = None
    torch.manual_seed(spec.seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    _image_processor(spec).save_pretrained(tmp)
    if spec.kind == "qwen3_vl":
        (tmp / "video_preprocessor_config.json").write_text(json.dumps(QWEN3_VL_VIDEO_FIELDS))
    return publish_build(tmp, out, json.dumps(asdict(spec), sort_keys=True))
