"""RFork from a live instance: a running model serves its own post-load weights as a seed.

:func:`serve_model` starts a seed (the :class:`~.seed_server.SeedServer` machinery) in the calling
process over a ``kind: "live"`` manifest of the model's live state (:func:`live_state`: parameters
and persistent buffers under their post-load names, each tensor once). On a CPU device the seed
sends straight from the parameters' memory; the checksums are taken when serving starts, so
weights changed afterwards are refused by the loading side (checksum mismatch) instead of being
served half-updated. :func:`serve_live_weights` does this inside each worker of a ``vllm.LLM``.

The loading side (``load_format="netloader"``, or :func:`elastic_load` into a model that already
exists) checks the live manifest against its own model's live state (same names, dtypes and shapes)
and receives each tensor straight into the parameter of that name, with no ``load_weights`` pass.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from vllm_ascend.core.sdk import init_logger
from vllm_ascend.netloader.client import NetLoaderError, SeedClient
from vllm_ascend.netloader.manifest import Manifest, ManifestError, TensorSpec, check_expected, spec_of
from vllm_ascend.netloader.protocol import ProtocolError
from vllm_ascend.netloader.security import ServerSecurity, read_token
from vllm_ascend.netloader.seed_server import SeedServer
from vllm_ascend.netloader.transfer import DEFAULT_CHUNK_BYTES, TensorStreamServer

logger = init_logger(__name__)

FALLBACK_ERRORS = (NetLoaderError, ManifestError, ProtocolError)
"""Failures after which a loader falls back (or, with ``fallback`` off, fails) rather than crashing."""

_SERVING: dict[int, SeedServer] = {}
"""Live seeds started by :func:`serve_live_weights` in this process, by ``id(model)``."""


def live_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters and persistent buffers by post-load name, each tensor once (tied weights
    keep their first name), detached (they share the parameters' memory)."""
    state: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            state[name] = tensor.detach()
    return state


def live_specs(model: nn.Module) -> dict[str, TensorSpec]:
    """Name → (dtype, shape) of :func:`live_state`: what a live seed must serve to this model."""
    return {name: spec_of(tensor) for name, tensor in live_state(model).items()}


def serve_model(
    model: nn.Module,
    host: str = "127.0.0.1",
    port: int = 0,
    stream_port: int = 0,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    security: ServerSecurity | None = None,
) -> SeedServer:
    """A started seed serving ``model``'s live state (``kind: "live"``) from this process.

    ``security`` (token, TLS certificate) is the seed server's: a non-loopback ``host`` needs a token.
    """
    security = security or ServerSecurity()
    security.check_bind(host)  # before hashing the weights
    manifest, data = Manifest.from_state_dict(live_state(model), kind="live")
    stream = TensorStreamServer(manifest, data, host, stream_port, chunk_bytes, security=security)
    return SeedServer(stream, host, port).start()


def model_parallel_size() -> int:
    """Tensor × pipeline parallel ranks of this vLLM process's model (1 outside a vLLM worker).

    A live seed holds one rank's shard and a loader takes one source, so both sides need 1.
    """
    from vllm.distributed.parallel_state import (
        get_pp_group,
        get_tensor_model_parallel_world_size,
        model_parallel_is_initialized,
    )

    if not model_parallel_is_initialized():
        return 1
    return get_tensor_model_parallel_world_size() * get_pp_group().world_size


def _serve_in_worker(
    model: nn.Module,
    host: str,
    port: int,
    stream_port: int,
    token_file: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> str:
    if model_parallel_size() != 1:
        raise NetLoaderError(
            f"live weights are served from single-rank engines only; this one has {model_parallel_size()} "
            "tensor/pipeline-parallel ranks"
        )
    if id(model) in _SERVING:
        raise RuntimeError(f"this model already serves its weights at {_SERVING[id(model)].url}")
    security = ServerSecurity(read_token(token_file), tls_cert, tls_key)
    server = serve_model(model, host, port, stream_port, security=security)
    _SERVING[id(model)] = server
    logger.info("netloader: serving %d live tensors at %s", len(server.stream.manifest), server.url)
    return server.url


def _stop_in_worker(model: nn.Module) -> bool:
    server = _SERVING.pop(id(model), None)
    if server is None:
        return False
    server.stop()
    return True


def serve_live_weights(
    llm: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    stream_port: int = 0,
    token_file: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> list[str]:
    """Serve a running ``vllm.LLM``'s post-load weights from inside its workers; the seed URLs (one a worker).

    With ``port`` 0 each worker picks free ports. The token comes from ``token_file`` or the
    ``VLLM_ASCEND_NETLOADER_TOKEN`` environment variable of the worker; ``tls_cert``/``tls_key`` turn
    on TLS. Stop with :func:`stop_live_weights`.
    """
    serve = functools.partial(
        _serve_in_worker,
        host=host,
        port=port,
        stream_port=stream_port,
        token_file=token_file,
        tls_cert=tls_cert,
        tls_key=tls_key,
    )
    return llm.apply_model(serve)


def stop_live_weights(llm: Any) -> list[bool]:
    """Stop the seeds :func:`serve_live_weights` started for ``llm`` (per worker: whether one ran)."""
    return llm.apply_model(_stop_in_worker)


def load_live(client: SeedClient, model: nn.Module) -> int:
    """Fill ``model``'s live state from a live seed, after checking the names, dtypes and shapes; bytes."""
    manifest = client.fetch_manifest()
    if manifest.kind != "live":
        raise ManifestError([f"kind = {manifest.kind!r}: expected 'live' (a running instance's weights)"])
    if model_parallel_size() != 1:
        raise NetLoaderError(
            f"a live seed serves one rank's weights; this model has {model_parallel_size()} "
            "tensor/pipeline-parallel ranks"
        )
    check_expected(manifest, live_specs(model))
    return client.fetch_into(live_state(model))


def elastic_load(
    model: nn.Module,
    sources: Sequence[str],
    timeout: float = 30.0,
    retries: int = 3,
    token: str | bytes | None = None,
    ca_file: str | None = None,
) -> str | None:
    """Load ``model``'s weights in place from the first of ``sources`` (live seed URLs) that serves them.

    Each source is tried in order; a failure is logged and the next is tried. Returns the source
    used, or None when none could serve (the caller reverts to its default loader).
    """
    for source in sources:
        try:
            with SeedClient(source, timeout=timeout, retries=retries, token=token, ca_file=ca_file) as client:
                load_live(client, model)
        except FALLBACK_ERRORS as exc:
            logger.warning("netloader: elastic load from %s failed (%s: %s)", source, type(exc).__name__, exc)
            continue
        return source
    return None
