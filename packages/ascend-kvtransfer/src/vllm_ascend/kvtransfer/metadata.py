"""What the scheduler half tells the worker half each step, and the ``kv_transfer_params`` contract.

``kv_transfer_params`` travel through the proxy between instances:

- pull (``MooncakeConnectorV1``): the proxy asks prefill for ``{"do_remote_decode": true}``; prefill's
  response carries ``do_remote_prefill``, ``remote_engine_id``, ``remote_host``, ``remote_port`` (its
  handshake port), ``remote_block_ids``, ``remote_request_id`` and ``remote_tp_size``, handed to decode as is.
- layer-wise push (``MooncakeLayerwiseConnector``): decode gets ``{"do_remote_prefill": true, "transfer_id",
  "metaserver"}`` and posts its own address and new block ids (``remote_first_block``: the prompt block the
  first one stands for) to the metaserver; prefill gets those fields with ``do_remote_decode``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

PULL_FIELDS = ("remote_engine_id", "remote_host", "remote_port", "remote_block_ids", "remote_request_id")
PUSH_FIELDS = ("transfer_id", "remote_engine_id", "remote_host", "remote_port", "remote_block_ids")


def missing_fields(params: dict[str, Any], fields: tuple[str, ...]) -> list[str]:
    """The ``fields`` absent (or null) in ``params``."""
    return [f for f in fields if params.get(f) is None]


@dataclass(frozen=True)
class Peer:
    """Where a remote instance's rank-0 handshake socket is and how it is split."""

    engine_id: str
    host: str
    port: int
    tp_size: int

    def address(self, rank: int) -> str:
        return f"tcp://{self.host}:{self.port + rank}"


@dataclass(frozen=True)
class RecvTask:
    """Decode: blocks ``local_block_ids`` receive the peer's ``remote_block_ids`` (pull) or are written by
    the peer under ``transfer_id`` (layer-wise push)."""

    request_id: str
    local_block_ids: list[int]
    remote_block_ids: list[int]
    peer: Peer
    remote_request_id: str
    transfer_id: str | None = None


@dataclass(frozen=True)
class PushTask:
    """Layer-wise prefill: after each layer of this step, write ``local_block_ids`` to the peer's
    ``remote_block_ids``; ``last``: the prompt ends in this step, so tell the peer when it is written."""

    request_id: str
    transfer_id: str
    local_block_ids: list[int]
    remote_block_ids: list[int]
    peer: Peer
    last: bool


@dataclass
class MooncakeConnectorMetadata(KVConnectorMetadata):
    """One step's work for the worker half."""

    recv: list[RecvTask] = field(default_factory=list)
    #: prefill (pull): request id -> seconds its blocks wait for decode's pull
    send: dict[str, float] = field(default_factory=dict)
    push: list[PushTask] = field(default_factory=list)
    #: decode: requests aborted while their blocks were being received (freed once the transfer ended)
    release: list[str] = field(default_factory=list)
