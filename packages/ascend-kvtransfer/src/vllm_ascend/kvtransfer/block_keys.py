"""Pool keys of KV blocks: a content hash of each block-aligned prefix, the same in every instance.

vLLM's own block hashes start from a per-process random seed unless ``PYTHONHASHSEED`` is set, so two
instances would never agree on them (upstream asks users to pin ``PYTHONHASHSEED`` on every node). These keys
are a SHA-256 chain over the token ids instead: block ``i``'s hash covers every token up to the end of block
``i``, seeded by a namespace (the model, its dtype and KV cache dtype, the block size) and by what else makes
equal tokens hold different KV (the LoRA adapter, the cache salt, multimodal inputs' hashes). The worker adds
which slice of the model its cache holds (tensor/pipeline rank), so keys never collide across layouts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.request import Request


def pool_namespace(vllm_config: VllmConfig, override: str | None = None) -> str:
    """What must match for two instances to share blocks: the model, its dtypes and the block size."""
    if override:
        return override
    model = vllm_config.model_config
    parts = (
        str(model.model),
        str(getattr(model, "revision", None) or ""),
        str(model.dtype),
        str(vllm_config.cache_config.cache_dtype),
        str(vllm_config.cache_config.block_size),
    )
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def request_seed(request: Request) -> bytes:
    """Bytes beyond the tokens that change a request's KV: its LoRA adapter, cache salt and multimodal inputs."""
    extra: list[str] = []
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        extra.append(f"lora:{lora.lora_name}:{getattr(lora, 'lora_path', '')}")
    salt = getattr(request, "cache_salt", None)
    if salt:
        extra.append(f"salt:{salt}")
    for feature in getattr(request, "mm_features", None) or ():
        extra.append(f"mm:{getattr(feature, 'identifier', feature)}:{getattr(feature, 'mm_position', '')}")
    return "\x1f".join(extra).encode()


def chain_hashes(
    namespace: str,
    seed: bytes,
    token_ids: Sequence[int],
    block_size: int,
    start: int = 0,
    previous: bytes | None = None,
) -> list[bytes]:
    """Hashes of full blocks ``start, start+1, ...`` of ``token_ids`` (``previous``: block ``start - 1``'s)."""
    digest = (
        previous if previous is not None else hashlib.sha256(namespace.encode() + b"\x00" + seed).digest()
    )
    out = []
    full = len(token_ids) // block_size
    tokens = np.asarray(token_ids[start * block_size : full * block_size], dtype=np.int64)
    for index in range(full - start):
        block = tokens[index * block_size : (index + 1) * block_size].tobytes()
        digest = hashlib.sha256(digest + block).digest()
        out.append(digest)
    return out


class RequestKeys:
    """The growing chain of one request's block hashes (prompt and generated tokens)."""

    def __init__(self, namespace: str, request: Request, block_size: int) -> None:
        self.namespace, self.block_size = namespace, block_size
        self.seed = request_seed(request)
        self.hashes: list[bytes] = []

    def extend(self, token_ids: Sequence[int]) -> list[bytes]:
        """Hashes of every full block of ``token_ids`` (computed once, extended as tokens arrive)."""
        if len(token_ids) // self.block_size > len(self.hashes):
            previous = self.hashes[-1] if self.hashes else None
            self.hashes += chain_hashes(
                self.namespace, self.seed, token_ids, self.block_size, len(self.hashes), previous
            )
        return self.hashes


def block_key(namespace: str, digest: bytes, shard: str) -> str:
    """The pool key of one block of one cache shard (``shard``: which ranks' slice, e.g. ``tp0of2``)."""
    return f"vllm-ascend/{namespace}/{shard}/{digest.hex()}"
