"""The worker half of the Mooncake connectors (runs in each vLLM worker process, one per rank).

It registers the runner's KV caches with Mooncake, serves its handshake socket, and moves blocks on a
pool of transfer threads: decode reads a request's blocks from every prefill rank holding its heads (pull),
or prefill writes each layer's blocks into decode's as soon as the layer ran (layer-wise push). Every
outcome reaches vLLM through ``get_finished`` (finished sends/receives) and
``get_block_ids_with_load_errors`` (blocks whose transfer failed: vLLM recomputes them or fails the
request, per ``kv_load_failure_policy``).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch

from vllm_ascend.core.sdk import (
    CPU_KERNEL,
    DeviceConfigError,
    get_device_adaptor,
    init_logger,
    latent_cache_parts,
)
from vllm_ascend.kvtransfer.config import MooncakeTransferConfig
from vllm_ascend.kvtransfer.engine import MooncakeEngine, Transfer
from vllm_ascend.kvtransfer.layout import (
    LayerLayout,
    LayoutError,
    RankView,
    check_tp,
    describe_cache,
    notified_ranks,
    plan_copies,
    source_ranks,
)
from vllm_ascend.kvtransfer.metadata import MooncakeConnectorMetadata, Peer, PushTask, RecvTask
from vllm_ascend.kvtransfer.side_channel import (
    AgentMetadata,
    MetadataRequest,
    SideChannelServer,
    TransferDone,
    ask,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

logger = init_logger(__name__)


def _head_runs(cache: torch.Tensor) -> torch.Tensor | None:
    """A layer's cache ``[blocks, Hkv, block_size, 2D]`` whose blocks the device lays out head by head (core's
    ``cpu_kernel``: each head's keys and values one run of memory, no per-token cells), as ``[blocks, Hkv, 1,
    2 * block_size * D]``: heads of one cell each, so a slice of the heads (another TP size) moves whole runs.
    None for the token-major layout, whose cells are a token's keys and values for one head."""
    if cache.dim() != 4:
        return None
    shape, stride = tuple(cache.shape), tuple(cache.stride())
    try:
        adaptor = get_device_adaptor()
    except DeviceConfigError:  # no device platform active (the connector driven on its own): vLLM's layout
        return None
    if adaptor.kv_block_layout(cache.dtype, shape, stride, shape[3] // 2) != CPU_KERNEL:
        return None
    run = shape[2] * shape[3]
    return cache.as_strided((shape[0], shape[1], 1, run), (stride[0], run, run, 1))


def _is_latent(spec: Any) -> bool:
    """MLA's latent cache: the same bytes on every tensor-parallel rank."""
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    return isinstance(spec, MLAAttentionSpec)


class _Expected:
    """Notices still expected for one transfer (known from the first), and whether all said the bytes arrived."""

    def __init__(self, deadline: float) -> None:
        self.count: int | None = None
        self.deadline, self.ok = deadline, True


class MooncakeWorker:
    """Registration, handshakes and transfers of one worker rank."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        config: MooncakeTransferConfig,
        kv_cache_config: KVCacheConfig,
        *,
        layerwise: bool,
    ) -> None:
        from vllm.distributed.parallel_state import (
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
        )

        self.config, self.layerwise = config, layerwise
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.port = config.side_channel_port(
            vllm_config.parallel_config.data_parallel_rank, self.tp_rank, self.tp_size
        )
        if len(kv_cache_config.kv_cache_groups) != 1:
            raise LayoutError(
                f"the Mooncake connectors move one KV cache group; this model has "
                f"{len(kv_cache_config.kv_cache_groups)} (run with --disable-hybrid-kv-cache-manager)"
            )
        group = kv_cache_config.kv_cache_groups[0]
        self._spec = group.kv_cache_spec
        self._kv_lora_rank = int(getattr(vllm_config.model_config.hf_text_config, "kv_lora_rank", 0) or 0)
        self._num_blocks = kv_cache_config.num_blocks
        self.block_size = vllm_config.cache_config.block_size
        self._pool = ThreadPoolExecutor(config.num_transfer_threads, thread_name_prefix="kvtransfer")
        self._lock = threading.Lock()
        self._engine: MooncakeEngine | None = None
        self._server: SideChannelServer | None = None
        self.metadata: AgentMetadata | None = None
        self._peers: dict[tuple[str, int], AgentMetadata] = {}
        self._finished_recving: set[str] = set()
        self._finished_sending: set[str] = set()
        self._failed_blocks: set[int] = set()
        self._loading: set[str] = set()
        self._released: set[str] = set()
        self._sending: dict[str, _Expected] = {}
        self._awaiting: dict[str, tuple[RecvTask, _Expected]] = {}
        self._early: dict[str, list[TransferDone]] = defaultdict(list)
        self._step_pushes: list[tuple[PushTask, Future[bool]]] = []
        self._push_ok: dict[str, bool] = {}

    # -- registration --------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Describe and register every layer's cache; start the engine and the handshake socket."""
        latent = _is_latent(self._spec)
        heads = int(getattr(self._spec, "num_kv_heads", 0) or 0)
        layers: list[LayerLayout] = []
        for name in sorted(kv_caches):
            cache = kv_caches[name]
            tensors = cache if isinstance(cache, list | tuple) else [cache]
            for index, tensor in enumerate(tensors):
                label = f"{name}[{index}]" if len(tensors) > 1 else name
                # MLA's latent allocation holds two planes (c_kv, then k_pe: the attention ops' paged form)
                parts = (
                    latent_cache_parts(tensor.view(tensor.shape[0], self.block_size, -1), self._kv_lora_rank)
                    if latent
                    else (tensor,)
                )
                head_runs = None if latent else _head_runs(tensor)
                described = [
                    describe_cache(
                        label,
                        part,
                        self._num_blocks,
                        block_size=self.block_size if head_runs is None else 1,
                        num_heads=heads,
                        replicated=latent,
                    )
                    for part in (parts if head_runs is None else (head_runs,))
                ]
                layers.append(LayerLayout(label, [r for d in described for r in d.regions], latent))
        self._engine = MooncakeEngine(self.config.side_channel_host, self.config.protocol)
        for storage in {
            _storage_range(t) for c in kv_caches.values() for t in (c if isinstance(c, list | tuple) else [c])
        }:
            self._engine.register(*storage)
        self.metadata = AgentMetadata(
            self.config.engine_id,
            self._engine.session_id,
            self.tp_rank,
            self.tp_size,
            self.block_size,
            layers,
        )
        self._server = SideChannelServer(
            self.config.side_channel_host, self.port, self.metadata, self._on_notice
        )
        logger.info(
            "KV transfer: %d layers (first: %d regions, geometry %s) registered with Mooncake (%s, session %s), "
            "handshake on %s",
            len(layers),
            len(layers[0].regions) if layers else 0,
            layers[0].regions[0].geometry if layers and layers[0].regions else None,
            self.config.protocol,
            self._engine.session_id,
            self._server.address,
        )

    # -- every step ----------------------------------------------------------------------------
    def bind(self, metadata: MooncakeConnectorMetadata) -> None:
        """Take this step's plan: start pulls, expect pushes and pulls, note released requests."""
        now = time.monotonic()
        with self._lock:
            for req_id, timeout in metadata.send.items():
                self._expect(self._sending, req_id, now + timeout)
            for task in metadata.recv:
                self._loading.add(task.request_id)
                if task.transfer_id is not None:
                    self._awaiting[task.transfer_id] = (task, _Expected(now + self.config.transfer_timeout))
                    self._apply_early(task.transfer_id)
            # an aborted request's blocks are freed by vLLM when it sees the receive end: as a finished send
            # while the transfer still runs, or already (a reported receive of a finished request)
            self._released.update(r for r in metadata.release if r in self._loading)
        for task in metadata.recv:
            if task.transfer_id is None:
                self._pool.submit(self._pull, task)

    def _expect(self, table: dict[str, _Expected], key: str, deadline: float) -> None:
        table[key] = _Expected(deadline)
        self._apply_early(key)

    def _apply_early(self, key: str) -> None:
        for notice in self._early.pop(key, []):
            self._take(notice)

    def _on_notice(self, notice: TransferDone) -> None:
        with self._lock:
            self._take(notice)

    def _take(self, notice: TransferDone) -> None:
        """A peer's part ended: prefill frees after the last reader, decode schedules after the last writer."""
        key = notice.request_id
        if key in self._sending:
            entry = self._sending[key]
        elif key in self._awaiting:
            entry = self._awaiting[key][1]
        else:
            self._early[key].append(notice)
            return
        if entry.count is None:  # the first notice tells how many peer ranks take part
            entry.count = max(1, notice.expected)
        entry.count -= 1
        entry.ok = entry.ok and notice.ok
        if entry.count > 0:
            return
        if key in self._sending:
            del self._sending[key]
            self._finished_sending.add(key)
        else:
            task, _ = self._awaiting.pop(key)
            if not entry.ok:
                self._failed_blocks.update(task.local_block_ids)
            self._received(task.request_id)

    def _received(self, req_id: str) -> None:
        self._loading.discard(req_id)
        if req_id in self._released:
            self._released.discard(req_id)
            self._finished_sending.add(req_id)
        else:
            self._finished_recving.add(req_id)

    def get_finished(self) -> tuple[set[str], set[str]]:
        """Requests whose sends / receives ended since the last call (expired waits included)."""
        now = time.monotonic()
        with self._lock:
            for req_id, entry in list(self._sending.items()):
                if entry.deadline <= now:
                    logger.warning(
                        "request %s: decode did not read its KV blocks within %g s; freeing them",
                        req_id,
                        self.config.abort_request_timeout,
                    )
                    del self._sending[req_id]
                    self._finished_sending.add(req_id)
            for transfer_id, (task, entry) in list(self._awaiting.items()):
                if entry.deadline <= now:
                    logger.warning(
                        "request %s: prefill did not push its KV blocks within %g s (transfer %s)",
                        task.request_id,
                        self.config.transfer_timeout,
                        transfer_id,
                    )
                    del self._awaiting[transfer_id]
                    self._failed_blocks.update(task.local_block_ids)
                    self._received(task.request_id)
            sending, recving = self._finished_sending, self._finished_recving
            self._finished_sending, self._finished_recving = set(), set()
        return sending, recving

    def get_block_ids_with_load_errors(self) -> set[int]:
        with self._lock:
            failed, self._failed_blocks = self._failed_blocks, set()
        return failed

    # -- pull (decode reads) -------------------------------------------------------------------
    def _pull(self, task: RecvTask) -> None:
        ok = False
        try:
            self._read(task)
            ok = True
        except Exception as exc:
            logger.warning(
                "request %s: reading %d KV blocks from %s failed: %s",
                task.request_id,
                len(task.local_block_ids),
                task.peer.address(0),
                exc,
            )
        finally:
            self._notify(
                task.peer,
                notified_ranks(self.tp_rank, self.tp_size, task.peer.tp_size),
                task.remote_request_id,
                ok,
            )
            with self._lock:
                if not ok:
                    self._failed_blocks.update(task.local_block_ids)
                self._received(task.request_id)

    def _read(self, task: RecvTask) -> None:
        if len(task.local_block_ids) != len(task.remote_block_ids):
            raise LayoutError(
                f"prefill offered {len(task.remote_block_ids)} blocks for {len(task.local_block_ids)} local ones"
            )
        if not task.local_block_ids:
            return
        check_tp(self.tp_size, task.peer.tp_size)
        replicated = all(layer.replicated for layer in self._local_view().layers)
        for rank in source_ranks(self.tp_rank, self.tp_size, task.peer.tp_size, replicated):
            remote = self._peer(task.peer, rank)
            here, there, lengths = plan_copies(
                self._local_view(),
                RankView(remote.layers, remote.tp_rank, remote.tp_size),
                task.local_block_ids,
                task.remote_block_ids,
            )
            self._engine_or_fail().read(remote.session, Transfer(here, there, lengths))

    # -- layer-wise push (prefill writes) ------------------------------------------------------
    def save_kv_layer(self, layer_name: str, meta: MooncakeConnectorMetadata) -> None:
        """After ``layer_name`` ran: write its blocks of this step's pushed requests, off the critical path."""
        if not meta.push:
            return
        indices = [
            i for i, layer in enumerate(self._local_view().layers) if layer.name.split("[")[0] == layer_name
        ]
        for task in meta.push:
            if task.local_block_ids:
                self._step_pushes.append((task, self._pool.submit(self._push_layers, task, indices)))

    def wait_for_save(self, meta: MooncakeConnectorMetadata) -> None:
        """The step's writes ended: tell decode about each request whose prompt ended in this step."""
        if not meta.push:
            return
        for task, future in self._step_pushes:
            ok = future.result()
            self._push_ok[task.transfer_id] = self._push_ok.get(task.transfer_id, True) and ok
        self._step_pushes = []
        for task in meta.push:
            ok = self._push_ok.get(task.transfer_id, True)
            if task.last:
                self._push_ok.pop(task.transfer_id, None)
                self._notify(
                    task.peer,
                    notified_ranks(self.tp_rank, self.tp_size, task.peer.tp_size),
                    task.transfer_id,
                    ok,
                )

    def _push_layers(self, task: PushTask, indices: list[int]) -> bool:
        try:
            check_tp(self.tp_size, task.peer.tp_size)
            local = self._local_view()
            for rank in notified_ranks(self.tp_rank, self.tp_size, task.peer.tp_size):
                remote = self._peer(task.peer, rank)
                here, there, lengths = plan_copies(
                    RankView([local.layers[i] for i in indices], self.tp_rank, self.tp_size),
                    RankView([remote.layers[i] for i in indices], remote.tp_rank, remote.tp_size),
                    task.local_block_ids,
                    task.remote_block_ids,
                )
                self._engine_or_fail().write(remote.session, Transfer(here, there, lengths))
            return True
        except Exception as exc:
            logger.warning(
                "request %s: pushing KV blocks to %s failed: %s", task.request_id, task.peer.address(0), exc
            )
            return False

    # -- helpers -------------------------------------------------------------------------------
    def _local_view(self) -> RankView:
        if self.metadata is None:
            raise RuntimeError("the KV caches were not registered with the Mooncake connector")
        return RankView(self.metadata.layers, self.tp_rank, self.tp_size)

    def _engine_or_fail(self) -> MooncakeEngine:
        if self._engine is None:
            raise RuntimeError("the Mooncake engine was not started (no KV caches registered)")
        return self._engine

    def _peer(self, peer: Peer, rank: int) -> AgentMetadata:
        """A remote rank's metadata, asked once per engine and rank."""
        key = (peer.engine_id, rank)
        cached = self._peers.get(key)
        if cached is not None:
            return cached
        answer = ask(peer.address(rank), MetadataRequest(), self.config.transfer_timeout)
        if not isinstance(answer, AgentMetadata):
            raise LayoutError(f"{peer.address(rank)} answered {type(answer).__name__} to a metadata request")
        if answer.engine_id != peer.engine_id or answer.tp_size != peer.tp_size:
            raise LayoutError(
                f"{peer.address(rank)} is engine {answer.engine_id!r} with tp_size {answer.tp_size}, expected "
                f"{peer.engine_id!r} with tp_size {peer.tp_size}"
            )
        if answer.block_size != self.block_size:
            raise LayoutError(
                f"block size {answer.block_size} on the peer, {self.block_size} here: set the same --block-size"
            )
        self._peers[key] = answer
        return answer

    def _notify(self, peer: Peer, ranks: list[int], key: str, ok: bool) -> None:
        expected = max(1, self.tp_size // peer.tp_size)
        for rank in ranks:
            try:
                ask(peer.address(rank), TransferDone(key, ok, expected), self.config.transfer_timeout)
            except Exception as exc:
                logger.warning("telling %s that transfer %s ended failed: %s", peer.address(rank), key, exc)

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._engine is not None:
            self._engine.close()


def _storage_range(tensor: torch.Tensor) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()
