"""The tiny model ``vllm-ascend demo`` serves, built on disk: random weights and a locally trained tokenizer.

Nothing is downloaded: the tokenizer is a byte-level BPE trained with ``tokenizers`` on a
generated corpus (with a ChatML chat template), the model a ``transformers`` config with
weights drawn at ``init_std`` (0.2 by default, large enough for greedy outputs to be diverse).
Builders are registered by name in :data:`MODEL_BUILDERS`: the runner ships the two dense families the
demo offers (``qwen3``, ``llama``); the repository's dev-only ``vllm_ascend.testing.tiny_models`` registers
the families its tests build (MoE, hybrid, state-space) with :func:`register_model_builder` and builds them
with :func:`build_tiny_model`. The output directory is keyed by a hash of the spec, so a build is reused until
the spec changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

#: Bump when the builders change what they write, so cached builds are rebuilt.
BUILD_VERSION = 1
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_WORDS = (
    "the a an ascend device kernel cache block token model layer head query key value attention norm "
    "rotary embedding sampler batch prefill decode chunk prefix graph stream event memory host tensor "
    "vector matrix weight bias scale shape stride queue worker runner engine server request response "
    "river mountain forest ocean cloud rain snow wind stone light shadow morning evening winter summer "
    "red green blue yellow black white quick slow small large bright dark warm cold old new first last "
    "runs reads writes computes returns waits sleeps wakes builds loads stores splits merges sorts"
).split()


@dataclass(frozen=True)
class TinyModelSpec:
    """What to build. ``kind`` names a builder in :data:`MODEL_BUILDERS`; ``extra`` goes to its config."""

    kind: str = "qwen3"
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    vocab_size: int = 512
    max_position_embeddings: int = 1024
    init_std: float = 0.2
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def key(self) -> str:
        blob = json.dumps({"version": BUILD_VERSION, **asdict(self)}, sort_keys=True)
        return f"{self.kind}-h{self.hidden_size}-l{self.num_layers}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


ConfigFactory = Callable[[TinyModelSpec, int], Any]
WeightsHook = Callable[[TinyModelSpec, Any], None]
MODEL_BUILDERS: dict[str, ConfigFactory] = {}
#: Per kind, what to set on the freshly initialised model before it is saved (e.g. non-zero buffers).
WEIGHT_HOOKS: dict[str, WeightsHook] = {}


def register_model_builder(
    kind: str, factory: ConfigFactory, weights_hook: WeightsHook | None = None
) -> None:
    """Register ``factory(spec, vocab_size) -> transformers config`` under ``kind``, and optionally
    ``weights_hook(spec, model)`` run on the initialised model before it is saved."""
    if kind in MODEL_BUILDERS and MODEL_BUILDERS[kind] is not factory:
        raise ValueError(f"tiny model kind {kind!r} is already registered")
    MODEL_BUILDERS[kind] = factory
    if weights_hook is not None:
        WEIGHT_HOOKS[kind] = weights_hook


def common_config(spec: TinyModelSpec, vocab_size: int) -> dict[str, Any]:
    """The config fields every family takes from the spec (tests building other families start from it)."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.init_std,
        rope_theta=10000.0,
    )


def _qwen3_config(spec: TinyModelSpec, vocab_size: int) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(**common_config(spec, vocab_size), tie_word_embeddings=True, **spec.extra)


def _llama_config(spec: TinyModelSpec, vocab_size: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(**common_config(spec, vocab_size), tie_word_embeddings=False, **spec.extra)


register_model_builder("qwen3", _qwen3_config)
register_model_builder("llama", _llama_config)


def corpus(num_lines: int = 2000, seed: int = 0) -> list[str]:
    """A deterministic English-like corpus for training the tokenizer."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 14))) + "." for _ in range(num_lines)]


def build_tokenizer(
    vocab_size: int,
    seed: int = 0,
    special_tokens: Sequence[str] = SPECIAL_TOKENS,
    chat_template: str = CHAT_TEMPLATE,
) -> Any:
    """A byte-level BPE trained on :func:`corpus` with ``special_tokens`` and ``chat_template`` (Qwen's
    ``<|im_end|>`` end of turn, ``<|endoftext|>`` padding), as a HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(seed=seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    fast.chat_template = chat_template
    return fast


def train_tokenizer(out_dir: Path, vocab_size: int, seed: int = 0) -> Any:
    """Train the demo's tokenizer (:func:`build_tokenizer`) and save it (with the chat template) as a HF tokenizer."""
    fast = build_tokenizer(vocab_size, seed)
    fast.save_pretrained(out_dir)
    return fast


def default_cache_dir() -> Path:
    """``$VLLM_ASCEND_CACHE_DIR`` or ``$XDG_CACHE_HOME/vllm-ascend`` (``~/.cache/vllm-ascend``)."""
    from vllm_ascend.core.sdk import envs

    explicit = envs.VLLM_ASCEND_CACHE_DIR
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-ascend"


def build_tiny_model(spec: TinyModelSpec | None = None, root: Path | None = None) -> Path:
    """Build (or reuse) the model of ``spec`` under ``root`` (default: the user cache); return its directory."""
    from transformers import AutoModelForCausalLM

    spec = spec or TinyModelSpec()
    if spec.kind not in MODEL_BUILDERS:
        raise ValueError(
            f"tiny model kind {spec.kind!r} is unknown; allowed: {', '.join(sorted(MODEL_BUILDERS))}"
        )
    out = (root or default_cache_dir() / "models") / spec.key()
    if (out / "complete").exists():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(tmp, spec.vocab_size, spec.seed)
    config = MODEL_BUILDERS[spec.kind](spec, max(len(tokenizer), spec.vocab_size))
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.bos_token_id = None
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if spec.kind in WEIGHT_HOOKS:
        WEIGHT_HOOKS[spec.kind](spec, model)
    model.save_pretrained(tmp, safe_serialization=True)
    return publish_build(tmp, out, json.dumps(asdict(spec), sort_keys=True))


def publish_build(tmp: Path, out: Path, marker: str) -> Path:
    """Mark the build in ``tmp`` complete and move it to ``out`` (a concurrent identical build may win)."""
    (tmp / "complete").write_text(marker)
    try:
        tmp.rename(out)
    except OSError:  # another process finished the same build first
        if not (out / "complete").exists():
            raise
    return out


def qwen3_spec(**overrides: Any) -> TinyModelSpec:
    return replace(TinyModelSpec(kind="qwen3"), **overrides)


def llama_spec(**overrides: Any) -> TinyModelSpec:
    return replace(TinyModelSpec(kind="llama", seed=1), **overrides)
