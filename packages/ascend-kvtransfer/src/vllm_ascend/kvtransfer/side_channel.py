"""The handshake socket each worker serves: its engine's address and cache layout, and transfer notices.

Messages are msgpack (msgspec) over ZeroMQ REQ/ROUTER on ``kv_port + rank``. A peer asks for
:class:`AgentMetadata` once per remote rank, and tells a rank when its part of a request's transfer ended
(:class:`TransferDone`): prefill then frees the request's blocks (pull), decode then schedules the request
(layer-wise push). Anything that does not decode as one of these messages is answered with an
:class:`Error` naming what was wrong, and the server keeps serving.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import msgspec
import zmq

from vllm_ascend.core.sdk import init_logger
from vllm_ascend.kvtransfer.layout import LayerLayout

logger = init_logger(__name__)


class AgentMetadata(msgspec.Struct, tag="meta", frozen=True):
    """A worker's Mooncake session, its place in tensor parallelism and its cache layout."""

    engine_id: str
    session: str
    tp_rank: int
    tp_size: int
    block_size: int
    layers: list[LayerLayout]


class MetadataRequest(msgspec.Struct, tag="get_meta", frozen=True):
    """Ask for the worker's :class:`AgentMetadata`."""


class TransferDone(msgspec.Struct, tag="done", frozen=True):
    """The sender's part of the transfer for ``request_id`` ended (``ok``: the bytes arrived); ``expected``:
    how many ranks of the sender's instance send this notice for the same request."""

    request_id: str
    ok: bool = True
    expected: int = 1


class Ack(msgspec.Struct, tag="ack", frozen=True):
    """A notice was taken."""


class Error(msgspec.Struct, tag="error", frozen=True):
    """The request could not be served; ``message`` says why."""

    message: str


Message = AgentMetadata | MetadataRequest | TransferDone | Ack | Error
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


class SideChannelError(RuntimeError):
    """A peer's handshake socket did not answer, or answered with an error."""


class SideChannelServer:
    """Serves :class:`AgentMetadata` and hands :class:`TransferDone` notices to ``on_done``."""

    def __init__(
        self, host: str, port: int, metadata: AgentMetadata, on_done: Callable[[TransferDone], None]
    ):
        self.address = f"tcp://{host}:{port}"
        self._metadata, self._on_done = metadata, on_done
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket: zmq.Socket[bytes] = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        try:
            self._socket.bind(self.address)
        except zmq.ZMQError as exc:
            self._socket.close()
            raise SideChannelError(
                f"cannot bind the KV transfer handshake socket {self.address} ({exc}); another instance may "
                "use this kv_port: give each instance on a host its own kv_port (ranks take kv_port + rank)"
            ) from exc
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kvtransfer-side-channel", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            try:
                frames = self._socket.recv_multipart()
            except zmq.ZMQError:
                return
            identity, payload = frames[0], frames[-1]
            reply = self._answer(payload)
            try:
                self._socket.send_multipart([identity, b"", _encoder.encode(reply)])
            except zmq.ZMQError as exc:
                logger.warning("KV transfer side channel: reply failed: %s", exc)

    def _answer(self, payload: bytes) -> Message:
        try:
            message = _decoder.decode(payload)
        except msgspec.DecodeError as exc:
            return Error(f"malformed side-channel message: {exc}")
        if isinstance(message, MetadataRequest):
            return self._metadata
        if isinstance(message, TransferDone):
            try:
                self._on_done(message)
            except Exception as exc:  # a bad notice must not stop the channel
                logger.exception("KV transfer side channel: handling %r failed", message)
                return Error(f"notice for {message.request_id!r} failed: {exc}")
            return Ack()
        return Error(f"unexpected side-channel message {type(message).__name__}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._socket.close(linger=0)


def ask(address: str, message: Message, timeout: float) -> Message:
    """Send ``message`` to a peer's handshake socket and return its answer (a fresh socket per call)."""
    socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.REQ)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
    socket.setsockopt(zmq.SNDTIMEO, int(timeout * 1000))
    try:
        socket.connect(address)
        socket.send(_encoder.encode(message))
        answer = _decoder.decode(socket.recv())
    except zmq.Again as exc:
        raise SideChannelError(f"no answer from {address} within {timeout:g} s") from exc
    except (zmq.ZMQError, msgspec.DecodeError) as exc:
        raise SideChannelError(f"side channel {address}: {exc}") from exc
    finally:
        socket.close(linger=0)
    if isinstance(answer, Error):
        raise SideChannelError(f"{address} refused {type(message).__name__}: {answer.message}")
    return answer
