"""Independent oracles for hidden-state drafters: the drafts a head should propose, with HF transformers.

Both methods draft from the target's last hidden states, one token ahead: at position ``i`` the head
reads ``token[i + 1]`` and ``target_hidden[i]`` (HF's last hidden state: after the final norm, as vLLM's
models return it), and a draft step reads the previous draft and the head's own output there.

- EAGLE-1 (Li et al. 2024): ``fc([embed(token), hidden])``, one Llama decoder layer without input norm
  (residual added back, no final norm); the target's LM head makes the logits.
- MTP layers (``num_nextn_predict_layers = 1``; GLM-4.5, DeepSeek-V3): ``eh_proj([enorm(embed(token)),
  hnorm(hidden)])`` (the embedding zeroed at position 0), the full decoder layer stored at index
  ``num_hidden_layers``, ``shared_head.norm`` and an LM head (the target's for GLM, the layer's for DeepSeek).

Everything is recomputed without a cache over the whole context from the checkpoint files (HF's
decoder layers, causal mask): nothing is shared with vLLM's draft models or our proposer.
"""

from __future__ import annotations

import abc
import json
from pathlib import Path
from typing import Any

import torch


def _causal(length: int) -> torch.Tensor:
    return torch.full((length, length), float("-inf")).triu(1).view(1, 1, length, length)


def _load(module: torch.nn.Module, weights: dict[str, torch.Tensor], prefix: str, source: Path) -> None:
    state = {k.removeprefix(prefix): v for k, v in weights.items() if k.startswith(prefix)}
    missing = module.load_state_dict(state, strict=False).missing_keys
    if missing:
        raise ValueError(f"{source} lacks {[prefix + name for name in missing]}")


class DraftReference(abc.ABC):
    """Greedy drafts of a hidden-state drafter for a context (subclasses define the head)."""

    target: Any

    @abc.abstractmethod
    def head(self, token_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The head's outputs at positions ``0..T-1`` for inputs ``(token_ids[i], hidden[i])``."""

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.target.get_output_embeddings()(out)

    @torch.inference_mode()
    def drafts(self, context: list[int], num_drafts: int) -> list[int]:
        """The ``num_drafts`` tokens proposed after ``context`` (its last token just sampled)."""
        ids = torch.tensor(context)
        states = self.target(input_ids=ids.unsqueeze(0), output_hidden_states=True).hidden_states
        target_hidden = states[-1][0]
        tokens, hidden = ids[1:], target_hidden[:-1]  # position i reads token i + 1 and target hidden i
        drafted: list[int] = []
        for _ in range(num_drafts):
            out = self.head(tokens, hidden)[-1]
            draft = int(self.logits(out).argmax())
            drafted.append(draft)
            tokens = torch.cat([tokens, torch.tensor([draft])])
            hidden = torch.cat([hidden, out.unsqueeze(0)])
        return drafted


class EagleReference(DraftReference):
    """EAGLE-1: a tiny target and a head built by ``build_eagle_head(..., "eagle")``."""

    @torch.inference_mode()
    def __init__(self, target_dir: Path, head_dir: Path) -> None:
        from safetensors.torch import load_file
        from transformers import AutoModelForCausalLM, LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        self.target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
        config = LlamaConfig(**json.loads((head_dir / "config.json").read_text()))
        config._attn_implementation = "eager"
        weights = load_file(str(head_dir / "model.safetensors"))
        self.fc = torch.nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.fc.weight.copy_(weights["fc.weight"])
        self.layer = LlamaDecoderLayer(config, layer_idx=0).eval()
        self.layer.input_layernorm = torch.nn.Identity()
        _load(self.layer, weights, "layers.0.", head_dir)
        self.rotary = LlamaRotaryEmbedding(config)

    def head(self, token_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        embeds = self.target.get_input_embeddings()(token_ids)
        x = self.fc(torch.cat([embeds, hidden], dim=-1)).unsqueeze(0)
        positions = torch.arange(x.shape[1]).unsqueeze(0)
        out = self.layer(x, attention_mask=_causal(x.shape[1]), position_ids=positions,
                         position_embeddings=self.rotary(x, positions))  # fmt: skip
        return (out[0] if isinstance(out, tuple) else out)[0]


class MtpReference(DraftReference):
    """A multi-token-prediction layer stored at index ``num_hidden_layers`` of the checkpoint:
    ``eh_proj([enorm(embed(token)), hnorm(hidden)])`` (the embedding zeroed at position 0), then HF's own decoder
    layer loaded from that index (HF converts a MoE layer's expert layout as for the main layers), causal over
    the whole context. Subclasses choose the embedding and what the layer's output feeds (``head``/``logits``)."""

    #: Modules under ``model.layers.{index}.`` loaded besides ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm``.
    extra_modules: tuple[str, ...] = ()

    @torch.inference_mode()
    def __init__(self, model_dir: Path) -> None:
        from safetensors.torch import load_file
        from transformers import AutoConfig

        from vllm_ascend.testing.hf_reference import hf_model_class

        model_cls = hf_model_class(model_dir)
        self.target = model_cls.from_pretrained(model_dir, dtype=torch.float32).eval()
        config = AutoConfig.from_pretrained(model_dir)
        config._attn_implementation = "eager"
        index = config.num_hidden_layers
        weights = load_file(str(model_dir / "model.safetensors"))
        hidden, norm_cls = config.hidden_size, type(self.target.model.norm)
        self.enorm = norm_cls(hidden, eps=config.rms_norm_eps)
        self.hnorm = norm_cls(hidden, eps=config.rms_norm_eps)
        self.shared_norm = norm_cls(hidden, eps=config.rms_norm_eps)
        self.eh_proj = torch.nn.Linear(2 * hidden, hidden, bias=False)
        self.shared_lm_head = torch.nn.Linear(hidden, config.vocab_size, bias=False)
        self.embed = torch.nn.Embedding(config.vocab_size, hidden)
        modules = {"enorm.": self.enorm, "hnorm.": self.hnorm, "eh_proj.": self.eh_proj,
                   "shared_head.norm.": self.shared_norm, "shared_head.head.": self.shared_lm_head,
                   "embed_tokens.": self.embed}  # fmt: skip
        for name in ("enorm.", "hnorm.", "eh_proj.", "shared_head.norm.", *self.extra_modules):
            _load(modules[name], weights, f"model.layers.{index}.{name}", model_dir)
        config.num_hidden_layers = index + 1
        extended = model_cls.from_pretrained(model_dir, config=config, dtype=torch.float32).eval()
        self.layer = extended.model.layers[index]
        self.rotary = extended.model.rotary_emb

    def embeddings(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.target.get_input_embeddings()(token_ids)

    def layer_output(self, token_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(token_ids.shape[0])
        embeds = torch.where(positions.unsqueeze(-1) == 0, 0.0, self.embeddings(token_ids))
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(hidden)], dim=-1)).unsqueeze(0)
        out = self.layer(x, attention_mask=_causal(x.shape[1]), position_ids=positions.unsqueeze(0),
                         position_embeddings=self.rotary(x, positions.unsqueeze(0)))  # fmt: skip
        return (out[0] if isinstance(out, tuple) else out)[0]


class GlmMtpReference(MtpReference):
    """GLM-4.5 MTP (a checkpoint built by ``add_mtp_layer``): the target's embedding; the layer's output is the
    next step's hidden state, and ``shared_head.norm`` then the target's LM head make the logits."""

    def head(self, token_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.layer_output(token_ids, hidden)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.target.get_output_embeddings()(self.shared_norm(out))


class DeepseekMtpReference(MtpReference):
    """DeepSeek-V3 MTP: the layer's own ``embed_tokens`` and ``shared_head.head``; its output normed by
    ``shared_head.norm`` is both the next step's hidden state and the input of ``shared_head.head``."""

    extra_modules = ("shared_head.head.", "embed_tokens.")

    def embeddings(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.embed(token_ids)

    def head(self, token_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.shared_norm(self.layer_output(token_ids, hidden))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.shared_lm_head(out)
