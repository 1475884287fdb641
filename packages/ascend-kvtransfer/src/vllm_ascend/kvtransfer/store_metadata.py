"""What ``AscendStoreConnector``'s scheduler half tells its workers each step, and whose slice a key names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

if TYPE_CHECKING:
    from vllm.config import VllmConfig


@dataclass(frozen=True)
class BlockTask:
    """Move blocks of one request: ``hashes[i]`` (a prefix hash) <-> device block ``block_ids[i]``."""

    request_id: str
    hashes: list[bytes]
    block_ids: list[int]


@dataclass
class StoreConnectorMetadata(KVConnectorMetadata):
    """Loads to start, saves to issue after the step, and finished requests whose blocks wait for the workers
    (``release``: reported in ``finished_sending`` once no put or get of theirs is outstanding)."""

    loads: list[BlockTask] = field(default_factory=list)
    saves: list[BlockTask] = field(default_factory=list)
    release: list[str] = field(default_factory=list)
    sync_load: bool = False


def shard_name(latent: bool, tp_rank: int, tp_size: int, pp_rank: int, pp_size: int) -> str:
    """Which slice of the model's KV a worker holds: MLA's latent cache is the same on every TP rank."""
    tp = "tp*" if latent else f"tp{tp_rank}of{tp_size}"
    return f"{tp}.pp{pp_rank}of{pp_size}"


def lookup_shard(vllm_config: VllmConfig) -> str:
    """The shard the scheduler looks up: rank 0's (every rank puts its own slice of the same blocks)."""
    parallel = vllm_config.parallel_config
    latent = bool(getattr(vllm_config.model_config, "use_mla", False))
    return shard_name(latent, 0, parallel.tensor_parallel_size, 0, parallel.pipeline_parallel_size)
