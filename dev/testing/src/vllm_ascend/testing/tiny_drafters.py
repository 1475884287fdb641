"""Tiny random-weight draft checkpoints for speculative decoding, built next to a tiny target.

- :func:`build_eagle_head` writes an EAGLE-1 or EAGLE-3 head in the published layouts vLLM loads
  (Llama geometry; EAGLE-1: ``fc`` over ``[embedding, hidden]`` and a decoder layer without input
  norm, sharing the target's embeddings and LM head; EAGLE-3: ``fc`` over the target's auxiliary
  hidden states, ``midlayer`` over ``[embedding, hidden]``, its own norm and LM head).
- :func:`add_mtp_layer` appends a multi-token-prediction layer to a GLM-4.5 checkpoint
  (``num_nextn_predict_layers = 1``: ``enorm``/``hnorm``/``eh_proj``, a decoder layer shaped like the
  last one, weights perturbed, and ``shared_head.norm`` at layer index ``num_hidden_layers``); transformers ignores it, vLLM's
  ``mtp`` method drafts with it.

Weights are drawn at ``init_std`` from a fixed seed; the output directory is keyed by the target and
the arguments, so a build is reused.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from vllm_ascend.runner.demo_model import publish_build

EAGLE_METHODS = ("eagle", "eagle3")


def _target_config(target_dir: Path) -> dict[str, Any]:
    return json.loads((target_dir / "config.json").read_text())


def _randn(gen: torch.Generator, std: float, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * std


def _decoder_layer(
    gen: torch.Generator, cfg: dict[str, Any], prefix: str, std: float, qkv_in: int | None = None
) -> dict[str, torch.Tensor]:
    """A Llama/GLM-style dense decoder layer: attention projections, gated MLP, post-attention norm."""
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    q_out, kv_out = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    qkv_in = qkv_in or hidden
    return {
        f"{prefix}.self_attn.q_proj.weight": _randn(gen, std, q_out, qkv_in),
        f"{prefix}.self_attn.k_proj.weight": _randn(gen, std, kv_out, qkv_in),
        f"{prefix}.self_attn.v_proj.weight": _randn(gen, std, kv_out, qkv_in),
        f"{prefix}.self_attn.o_proj.weight": _randn(gen, std, hidden, q_out),
        f"{prefix}.mlp.gate_proj.weight": _randn(gen, std, inter, hidden),
        f"{prefix}.mlp.up_proj.weight": _randn(gen, std, inter, hidden),
        f"{prefix}.mlp.down_proj.weight": _randn(gen, std, hidden, inter),
        f"{prefix}.post_attention_layernorm.weight": torch.ones(hidden),
    }


def _finish(tmp: Path, out: Path, target_dir: Path) -> Path:
    for name in os.listdir(target_dir):
        if name.startswith("tokenizer") or name in ("special_tokens_map.json", "vocab.json", "merges.txt"):
            shutil.copy(target_dir / name, tmp / name)
    return publish_build(tmp, out, "1")


def build_eagle_head(
    target_dir: Path,
    root: Path,
    method: str = "eagle",
    aux_layer_ids: tuple[int, ...] = (0, 1),
    init_std: float = 0.2,
    seed: int = 7,
) -> Path:
    """Build (or reuse) an EAGLE (``method="eagle"``) or EAGLE-3 (``"eagle3"``) head for the tiny
    target at ``target_dir``; return its directory. EAGLE-3 reads the target's hidden states after
    the layers in ``aux_layer_ids``."""
    from safetensors.torch import save_file

    if method not in EAGLE_METHODS:
        raise ValueError(f"method = {method!r} is not an EAGLE method; allowed: {', '.join(EAGLE_METHODS)}")
    target = _target_config(target_dir)
    out = root / f"{target_dir.name}-{method}-{'-'.join(map(str, aux_layer_ids))}-s{seed}"
    if (out / "complete").exists():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    hidden = target["hidden_size"]
    config: dict[str, Any] = {
        key: target[key]
        for key in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
            "rms_norm_eps",
            "rope_theta",
            "eos_token_id",
        )
        if key in target
    }
    config.update(model_type="llama", num_hidden_layers=1, tie_word_embeddings=False, torch_dtype="float32")
    gen = torch.Generator().manual_seed(seed)
    if method == "eagle":
        config["architectures"] = ["LlamaForCausalLM"]
        weights = _decoder_layer(gen, config, "layers.0", init_std)
        weights["fc.weight"] = _randn(gen, init_std, hidden, 2 * hidden)
    else:
        config["architectures"] = ["LlamaForCausalLMEagle3"]
        config["draft_vocab_size"] = target["vocab_size"]
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_layer_ids)}
        weights = _decoder_layer(gen, config, "midlayer", init_std, qkv_in=2 * hidden)
        weights["midlayer.input_layernorm.weight"] = torch.ones(hidden)
        weights["midlayer.hidden_norm.weight"] = torch.ones(hidden)
        weights["fc.weight"] = _randn(gen, init_std, hidden, hidden * len(aux_layer_ids))
        weights["norm.weight"] = torch.ones(hidden)
        weights["lm_head.weight"] = _randn(gen, init_std, target["vocab_size"], hidden)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"))
    return _finish(tmp, out, target_dir)


def add_mtp_layer(target_dir: Path, root: Path, init_std: float = 0.2, seed: int = 11) -> Path:
    """A copy of the GLM-4.5 checkpoint at ``target_dir`` with one MTP layer appended
    (``num_nextn_predict_layers = 1``); return its directory. The main model is unchanged."""
    from safetensors.torch import load_file, save_file

    target = _target_config(target_dir)
    if target.get("model_type") != "glm4_moe":
        raise ValueError(
            f"add_mtp_layer builds GLM-4.5 MTP layers; {target_dir} is {target.get('model_type')!r}"
        )
    out = root / f"{target_dir.name}-mtp-s{seed}"
    if (out / "complete").exists():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    hidden, layer = target["hidden_size"], target["num_hidden_layers"]
    gen = torch.Generator().manual_seed(seed)
    prefix = f"model.layers.{layer}"
    weights = load_file(str(target_dir / "model.safetensors"))
    # The MTP block has the last layer's structure (a MoE layer): its weights, perturbed.
    last = f"model.layers.{layer - 1}."
    mtp = {
        prefix + "." + name[len(last) :]: value + _randn(gen, init_std / 2, *value.shape)
        for name, value in weights.items()
        if name.startswith(last)
    }
    mtp.update(
        {
            f"{prefix}.input_layernorm.weight": torch.ones(hidden),
            f"{prefix}.enorm.weight": torch.ones(hidden),
            f"{prefix}.hnorm.weight": torch.ones(hidden),
            f"{prefix}.eh_proj.weight": _randn(gen, init_std, hidden, 2 * hidden),
            f"{prefix}.shared_head.norm.weight": torch.ones(hidden),
        }
    )
    weights.update(mtp)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"))
    target["num_nextn_predict_layers"] = 1
    (tmp / "config.json").write_text(json.dumps(target, indent=2))
    for name in os.listdir(target_dir):
        if name == "generation_config.json":
            shutil.copy(target_dir / name, tmp / name)
    return _finish(tmp, out, target_dir)
