"""Weight updates from a trainer (vLLM's weight-transfer API) by a broadcast over a stateless process group.

vLLM's built-in ``nccl`` engine runs on PyNccl and CUDA streams; here the group is a ``torch.distributed``
process group of the device's collective backend (``hccl`` on NPUs through the device adaptor, ``gloo`` on the
reference device), built outside torch's global state by vLLM's ``stateless_init_torch_distributed_process_group``
(rendezvous over a TCP store the trainer, rank 0, hosts). Workers take ranks ``rank_offset + dp_index *
world_size + rank`` as vLLM's engines number them.

A round: the trainer sends ``names`` / ``dtype_names`` / ``shapes`` (``update_info``), then broadcasts the
tensors' bytes in that order, one tensor per broadcast or ``packed`` into chunks of at most
``packed_buffer_size_bytes`` (a tensor larger than that travels alone); both sides derive the same chunk plan
from the metadata. Each worker loads every chunk through the model's ``load_weights`` inside vLLM's layerwise
reload, so ``process_weights_after_loading`` runs again and every parameter keeps its storage (captured graphs
read it). MoE layers laid out by an expert placement (EPLB: permuted or redundant slots, moved experts) get
their new checkpoint experts put back into that placement (``AscendMoERunner.begin_weight_update`` /
``end_weight_update``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Self

import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

#: Backends served: the device's collective backend (core's platform refuses the other one per device).
BACKENDS = ("hccl", "gloo")
DEFAULT_PACKED_BUFFER_SIZE_BYTES = 64 << 20
MAX_PACKED_BUFFER_SIZE_BYTES = 16 << 30
DEFAULT_TIMEOUT_S = 600.0
#: Byte alignment of each tensor inside a packed chunk (so every slice can be viewed as its dtype).
ALIGN = 16
#: dtype names an update may carry (``str(torch.<dtype>)`` without ``torch.``).
DTYPES = {
    name: getattr(torch, name)
    for name in (
        "float32",
        "float16",
        "bfloat16",
        "float64",
        "int8",
        "uint8",
        "int16",
        "int32",
        "int64",
        "bool",
        "float8_e4m3fn",
        "float8_e5m2",
    )
}


class WeightTransferError(ValueError):
    """A malformed init / update info (names the field and the allowed values)."""


def _check(ok: bool, where: str, field_name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise WeightTransferError(f"{where}.{field_name}={value!r} is invalid; allowed: {allowed}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_wire_fields(info: Any, where: str) -> None:
    """The fields trainer and workers share: rendezvous, group size, packing, timeout."""
    _check(
        isinstance(info.master_address, str) and bool(info.master_address),
        where,
        "master_address",
        info.master_address,
        "a host name or IP address the trainer's TCP store listens on",
    )
    _check(
        _is_int(info.master_port) and 1 <= info.master_port <= 65535,
        where,
        "master_port",
        info.master_port,
        "an integer in [1, 65535]",
    )
    _check(
        _is_int(info.world_size) and info.world_size >= 2,
        where,
        "world_size",
        info.world_size,
        "an integer >= 2 (the trainer plus every inference worker)",
    )
    _check(isinstance(info.packed, bool), where, "packed", info.packed, "True or False")
    _check(
        _is_int(info.packed_buffer_size_bytes)
        and ALIGN <= info.packed_buffer_size_bytes <= MAX_PACKED_BUFFER_SIZE_BYTES,
        where,
        "packed_buffer_size_bytes",
        info.packed_buffer_size_bytes,
        f"an integer in [{ALIGN}, {MAX_PACKED_BUFFER_SIZE_BYTES}]",
    )
    _check(
        isinstance(info.timeout_s, (int, float))
        and not isinstance(info.timeout_s, bool)
        and math.isfinite(info.timeout_s)
        and info.timeout_s > 0,
        where,
        "timeout_s",
        info.timeout_s,
        "a positive number of seconds",
    )


@dataclass(kw_only=True)
class CollectiveInitInfo(WeightTransferInitInfo):
    """Worker side of the handshake (``init_weight_transfer_engine``): where the trainer's store listens, the
    group size, the first worker rank, and the wire format the trainer chose."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    packed: bool = True
    packed_buffer_size_bytes: int = DEFAULT_PACKED_BUFFER_SIZE_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        check_wire_fields(self, "init_info")
        _check(
            _is_int(self.rank_offset) and 1 <= self.rank_offset < self.world_size,
            "init_info",
            "rank_offset",
            self.rank_offset,
            f"an integer in [1, world_size={self.world_size}) (rank 0 is the trainer)",
        )


@dataclass(kw_only=True)
class GlooTrainerInitInfo(TrainerInitInfo):
    """Trainer side (``WeightTransferTrainerFactory.trainer_init``): the trainer is rank 0 of ``world_size`` and
    hosts the store at ``master_address:master_port``; the wire format is sent to the workers."""

    backend: ClassVar[str] = "gloo"

    master_address: str
    master_port: int
    world_size: int
    packed: bool = True
    packed_buffer_size_bytes: int = DEFAULT_PACKED_BUFFER_SIZE_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        check_wire_fields(self, "trainer init_info")
        _check(
            _is_int(self.rank) and self.rank >= 0, "trainer init_info", "rank", self.rank, "an integer >= 0"
        )


@dataclass(kw_only=True)
class HcclTrainerInitInfo(GlooTrainerInitInfo):
    """The same over HCCL (a trainer on NPUs)."""

    backend: ClassVar[str] = "hccl"


@dataclass
class CollectiveUpdateInfo(WeightTransferUpdateInfo):
    """One round's tensors, in broadcast order: checkpoint names, dtype names, full shapes."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        count = len(self.names)
        for name, values in (("dtype_names", self.dtype_names), ("shapes", self.shapes)):
            if not isinstance(values, list) or len(values) != count:
                got = f"{len(values)} entries" if isinstance(values, list) else repr(values)
                raise WeightTransferError(
                    f"update_info.{name} has {got}; allowed: a list of {count} entries, one per name"
                )
        for i, name in enumerate(self.names):
            _check(
                isinstance(name, str) and bool(name), "update_info", f"names[{i}]", name, "a parameter name"
            )
        for i, dtype in enumerate(self.dtype_names):
            _check(dtype in DTYPES, "update_info", f"dtype_names[{i}]", dtype, ", ".join(DTYPES))
        for i, shape in enumerate(self.shapes):
            _check(
                isinstance(shape, (list, tuple)) and all(_is_int(d) and d >= 0 for d in shape),
                "update_info",
                f"shapes[{i}]",
                shape,
                "a list of non-negative integers",
            )

    def specs(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        return [
            (name, DTYPES[dtype], tuple(shape))
            for name, dtype, shape in zip(self.names, self.dtype_names, self.shapes, strict=True)
        ]

    @classmethod
    def from_meta(cls, meta: Iterable[ParamMeta]) -> CollectiveUpdateInfo:
        meta = list(meta)
        return cls(
            names=[m.name for m in meta],
            dtype_names=[str(m.dtype).removeprefix("torch.") for m in meta],
            shapes=[list(m.shape) for m in meta],
        )


@dataclass(frozen=True)
class Chunk:
    """One broadcast: tensors ``first .. first + len(offsets) - 1`` at byte ``offsets`` of a ``nbytes`` buffer."""

    first: int
    offsets: tuple[int, ...]
    nbytes: int


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def plan_chunks(
    specs: list[tuple[str, torch.dtype, tuple[int, ...]]], buffer_size: int | None
) -> list[Chunk]:
    """The broadcasts of one round, the same on every rank: one per tensor (``buffer_size`` None), or
    consecutive tensors packed at ``ALIGN``-byte offsets into buffers of at most ``buffer_size`` bytes (a larger
    tensor alone in its own)."""
    chunks: list[Chunk] = []
    first, end = 0, 0
    offsets: list[int] = []
    for i, (_, dtype, shape) in enumerate(specs):
        size = _nbytes(dtype, shape)
        start = -(-end // ALIGN) * ALIGN
        if offsets and (buffer_size is None or start + size > buffer_size):
            chunks.append(Chunk(first, tuple(offsets), end))
            first, offsets, start = i, [], 0
        offsets.append(start)
        end = start + size
    if offsets:
        chunks.append(Chunk(first, tuple(offsets), end))
    return chunks


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def pack(tensors: list[torch.Tensor], chunk: Chunk, device: torch.device) -> torch.Tensor:
    """The chunk's buffer holding ``tensors``' bytes at its offsets."""
    buffer = torch.zeros(chunk.nbytes, dtype=torch.uint8, device=device)
    for tensor, offset in zip(tensors, chunk.offsets, strict=True):
        data = _as_bytes(tensor)
        buffer[offset : offset + data.numel()].copy_(data)
    return buffer


def unpack(
    buffer: torch.Tensor, chunk: Chunk, specs: list[tuple[str, torch.dtype, tuple[int, ...]]]
) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` views into a received chunk's buffer."""
    out = []
    for k, offset in enumerate(chunk.offsets):
        name, dtype, shape = specs[chunk.first + k]
        size = _nbytes(dtype, shape)
        out.append((name, buffer[offset : offset + size].view(dtype).view(shape)))
    return out


def open_group(
    backend: str, address: str, port: int, rank: int, world_size: int, timeout_s: float
) -> ProcessGroup:
    """This process's member of the trainer-workers group (rank 0 hosts the store)."""
    from vllm.distributed.utils import stateless_init_torch_distributed_process_group

    group = stateless_init_torch_distributed_process_group(
        address, port, rank, world_size, backend, timeout=timedelta(seconds=timeout_s)
    )
    assert not isinstance(group, tuple)
    return group


def close_group(group: ProcessGroup) -> None:
    from vllm.distributed.utils import stateless_destroy_torch_distributed_process_group

    stateless_destroy_torch_distributed_process_group(group)


def broadcast(group: ProcessGroup, buffer: torch.Tensor) -> None:
    """Rank 0's ``buffer`` into every rank's (the group's own rank numbering; empty buffers are not sent)."""
    if buffer.numel():
        group.broadcast(buffer, 0).wait()


class CollectiveTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Trainer side: rank 0 opens the group with the workers (their ``init_weight_transfer_engine`` runs on a
    thread meanwhile), and each ``send_weights`` drives ``start_weight_update`` → ``update_weights`` (a thread,
    while this thread broadcasts) → ``finish_weight_update``. Other trainer ranks only iterate the source."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(
        self,
        *,
        client: VLLMWeightSyncClient,
        source: WeightSource | None = None,
        is_sender: bool = True,
        init_info: GlooTrainerInitInfo | None = None,
    ) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.init_info = init_info
        self.group: ProcessGroup | None = None

    @classmethod
    def trainer_init(
        cls,
        init_info: GlooTrainerInitInfo,
        *,
        client: VLLMWeightSyncClient,
        source: WeightSource | None = None,
    ) -> Self:
        if source is None:
            raise WeightTransferError(
                f"trainer_init: source=None is invalid for {init_info.backend!r}; "
                "allowed: a WeightSource (e.g. ModuleSource(model))"
            )
        engine = cls(client=client, source=source, is_sender=init_info.is_sender, init_info=init_info)
        if not engine.is_sender:
            return engine
        worker_info = CollectiveInitInfo(
            master_address=init_info.master_address,
            master_port=init_info.master_port,
            rank_offset=1,
            world_size=init_info.world_size,
            packed=init_info.packed,
            packed_buffer_size_bytes=init_info.packed_buffer_size_bytes,
            timeout_s=init_info.timeout_s,
        )
        with ThreadPoolExecutor(max_workers=1) as pool:
            joined = pool.submit(client.init_weight_transfer_engine, asdict(worker_info))
            engine.group = open_group(
                init_info.backend,
                init_info.master_address,
                init_info.master_port,
                0,
                init_info.world_size,
                init_info.timeout_s,
            )
            joined.result()
        return engine

    def send_weights(self) -> None:
        assert self.source is not None and self.init_info is not None
        meta = self.source.metadata()
        if not self.is_sender:
            for _ in self.source:
                pass
            return
        assert self.group is not None, "trainer_init() opens the group"
        info = CollectiveUpdateInfo.from_meta(meta)
        self.client.start_weight_update()
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            received = pool.submit(self.client.update_weights, asdict(info))
            self._broadcast(info.specs(), self._checked(self.source, meta))
            received.result()
        finally:
            # A failed broadcast leaves the workers inside theirs: do not join the RPC thread.
            pool.shutdown(wait=False)
        self.client.finish_weight_update()

    def _broadcast(
        self, specs: list[tuple[str, torch.dtype, tuple[int, ...]]], pairs: Iterator[torch.Tensor]
    ) -> None:
        assert self.group is not None and self.init_info is not None
        info = self.init_info
        for chunk in plan_chunks(specs, info.packed_buffer_size_bytes if info.packed else None):
            tensors = [next(pairs) for _ in chunk.offsets]
            broadcast(self.group, pack(tensors, chunk, tensors[0].device))

    @staticmethod
    def _checked(source: WeightSource, meta: list[ParamMeta]) -> Iterator[torch.Tensor]:
        """The source's tensors, each checked against the metadata the workers were sent."""
        items = iter(source)
        for expected in meta:
            name, tensor = next(items)
            if (name, tensor.dtype, tuple(tensor.shape)) != (expected.name, expected.dtype, expected.shape):
                raise WeightTransferError(
                    f"source yielded {name!r} {tensor.dtype} {tuple(tensor.shape)}; metadata() declared "
                    f"{expected.name!r} {expected.dtype} {expected.shape}: iteration must match metadata()"
                )
            yield tensor

    def shutdown(self) -> None:
        if self.group is not None:
            close_group(self.group)
            self.group = None


class CollectiveWeightTransferEngine(WeightTransferEngine[CollectiveInitInfo, CollectiveUpdateInfo]):
    """Worker side: joins the trainer's group, receives each round's chunks and loads them in place."""

    init_info_cls = CollectiveInitInfo
    update_info_cls = CollectiveUpdateInfo
    #: The trainer-side engine core hands vLLM's ``WeightTransferTrainerFactory`` under the same backend name.
    trainer_engine = CollectiveTrainerWeightTransferEngine
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        if config.backend not in BACKENDS:
            raise WeightTransferError(
                f"weight_transfer_config.backend={config.backend!r} is not this engine's; allowed: "
                + ", ".join(BACKENDS)
            )
        self.group: ProcessGroup | None = None
        self.packed = True
        self.packed_buffer_size_bytes = DEFAULT_PACKED_BUFFER_SIZE_BYTES
        self._placed: list[Any] = []

    def parse_init_info(self, init_dict: dict[str, Any]) -> CollectiveInitInfo:
        try:
            return CollectiveInitInfo(**init_dict)
        except TypeError as exc:
            allowed = ", ".join(CollectiveInitInfo.__dataclass_fields__)
            raise WeightTransferError(f"init_info: {exc}; allowed fields: {allowed}") from None

    def parse_update_info(self, update_dict: dict[str, Any]) -> CollectiveUpdateInfo:
        try:
            return CollectiveUpdateInfo(**update_dict)
        except TypeError as exc:
            raise WeightTransferError(
                f"update_info: {exc}; allowed fields: names, dtype_names, shapes"
            ) from None

    def worker_rank(self, init_info: CollectiveInitInfo) -> int:
        parallel = self.parallel_config
        return init_info.rank_offset + parallel.data_parallel_index * parallel.world_size + parallel.rank

    def init_transfer_engine(self, init_info: CollectiveInitInfo) -> None:
        rank = self.worker_rank(init_info)
        _check(
            rank < init_info.world_size,
            "init_info",
            "world_size",
            init_info.world_size,
            f"> {rank} (this worker's rank: rank_offset + dp_index * world_size + rank)",
        )
        if self.group is not None:
            self.shutdown()
        self.packed = init_info.packed
        self.packed_buffer_size_bytes = init_info.packed_buffer_size_bytes
        self.group = open_group(
            self.config.backend,
            init_info.master_address,
            init_info.master_port,
            rank,
            init_info.world_size,
            init_info.timeout_s,
        )

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        from vllm_ascend.runner.ops.moe import AscendMoERunner

        self._placed = [m for m in self.model.modules() if isinstance(m, AscendMoERunner)]
        for layer in self._placed:
            layer.begin_weight_update()
        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        for layer in self._placed:
            layer.end_weight_update()
        self._placed = []

    def receive_weights(self, update_info: CollectiveUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError(
                "weight transfer group not initialized: call init_weight_transfer_engine first"
            )
        specs = update_info.specs()
        for chunk in plan_chunks(specs, self.packed_buffer_size_bytes if self.packed else None):
            # A fresh buffer per chunk: the layerwise reload keeps the views until its layer is complete.
            buffer = torch.empty(chunk.nbytes, dtype=torch.uint8, device=self.device)
            broadcast(self.group, buffer)
            self.model.load_weights(unpack(buffer, chunk, specs))

    def shutdown(self) -> None:
        if self.group is not None:
            close_group(self.group)
            self.group = None


__all__ = [
    "CollectiveInitInfo",
    "CollectiveTrainerWeightTransferEngine",
    "CollectiveUpdateInfo",
    "CollectiveWeightTransferEngine",
    "GlooTrainerInitInfo",
    "HcclTrainerInitInfo",
    "plan_chunks",
]
