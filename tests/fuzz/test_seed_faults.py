"""A seed that dies, stalls or corrupts its answer mid-transfer: the client raises its own error
(PeerUnavailable, ChecksumError, NetLoaderError) within its timeout and retries, never hangs and
never hands out a partial tensor (the netloader loader then falls back to the default loader)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading

import pytest
import torch
from safetensors.torch import save_file

from vllm_ascend.netloader.client import ChecksumError, NetLoaderError, PeerUnavailable, SeedClient
from vllm_ascend.netloader.manifest import Manifest
from vllm_ascend.netloader.protocol import MAGIC, PREFIX, VERSION, MessageType, encode_prefix
from vllm_ascend.netloader.seed_server import SeedServer, create_app
from vllm_ascend.netloader.transfer import TensorStreamServer

from .conftest import make_state_dict, raw_bytes


class FaultyStream(TensorStreamServer):
    """After ``after`` answer bytes: ``stall`` (stop sending mid-frame, keep the connection), or send
    ``inject`` bytes in place of the next frame (at a frame boundary), then drop the connection."""

    def __init__(self, *args, after: int, stall: bool = False, inject: bytes = b"", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.after, self.stall, self.inject = after, stall, inject
        self.release = threading.Event()
        self._local = threading.local()

    def _serve(self, stream, entries) -> None:
        self._local.sent = 0
        super()._serve(stream, entries)

    def _send(self, conn, part) -> None:
        if self.stall and self._local.sent + len(part) > self.after:
            conn.sendall(part[: self.after - self._local.sent])
            self.release.wait(60)
            raise ConnectionAbortedError("stall ended by the test")
        if self.inject and self._local.sent >= self.after and isinstance(part, bytes):  # a frame prefix
            conn.sendall(self.inject)
            raise ConnectionAbortedError("fault injected by the test")
        self._local.sent += len(part)
        conn.sendall(part)


def _faulty_seed(state_dict, **fault) -> SeedServer:
    manifest, data = Manifest.from_state_dict(state_dict)
    return SeedServer(FaultyStream(manifest, data, chunk_bytes=256, **fault))


def test_seed_killed_mid_transfer(tmp_path):
    """A real seed process is SIGKILLed after the first tensor arrived: the rest fails as PeerUnavailable."""
    g = torch.Generator().manual_seed(3)
    weights = {
        f"w{i}": torch.randn(1 << 20, generator=g) for i in range(16)
    }  # 64 MiB: more than socket buffers
    save_file(weights, str(tmp_path / "model.safetensors"))
    command = [sys.executable, "-m", "vllm_ascend.core.cli", "netloader-seed", "--checkpoint", str(tmp_path)]
    proc = subprocess.Popen(
        [*command, "--chunk-mib", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()
        match = re.search(r"at (http://127\.0\.0\.1:\d+) ", line)
        assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
        with SeedClient(match.group(1), timeout=10, retries=1, backoff=0) as client:
            stream = client.iter_tensors()
            name, first = next(stream)
            assert raw_bytes(first) == raw_bytes(weights[name])
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            with pytest.raises(PeerUnavailable) as info:
                for name, tensor in stream:
                    assert raw_bytes(tensor) == raw_bytes(weights[name])  # whatever arrives is whole
        assert str(info.value).startswith(
            f"streaming tensors: seed {match.group(1)} failed 2 attempts; last error:"
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_seed_stalled_mid_transfer():
    state_dict = make_state_dict()
    seed = _faulty_seed(state_dict, after=3000, stall=True)
    try:
        with seed, SeedClient(seed.url, timeout=0.5, retries=1, backoff=0) as client:
            with pytest.raises(PeerUnavailable) as info:
                dict(client.iter_tensors())
    finally:
        seed.stream.release.set()
    assert str(info.value) == (
        f"streaming tensors: seed {seed.url} failed 2 attempts; last error: TimeoutError: timed out"
    )


def test_seed_corrupting_frames_mid_transfer():
    """Garbage, a frame for the wrong tensor, or a deeply nested header after real data: ProtocolError, retried."""
    state_dict = make_state_dict()
    wrong = encode_prefix(MessageType.TENSOR, {"name": "step", "offset": 0, "start": 0, "length": 0})
    nested = b'{"name":' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    cases = {
        b"\x00" * 64: "bad frame magic b'\\x00\\x00\\x00\\x00', expected b'VANL'",
        wrong: "TENSOR frame out of order: got 'step' at byte 0 (stream offset 0), expected 'embed.weight' at byte",
        PREFIX.pack(MAGIC, VERSION, MessageType.TENSOR, len(nested), 0) + nested: (
            "TENSOR frame header nests 50001 levels deep; at most 8 are allowed"
        ),
    }
    for inject, message in cases.items():
        with (
            _faulty_seed(state_dict, after=1000, inject=inject) as seed,
            SeedClient(seed.url, timeout=5, retries=1, backoff=0) as client,
        ):
            with pytest.raises(PeerUnavailable) as info:
                dict(client.iter_tensors())
        assert str(info.value).startswith(
            f"streaming tensors: seed {seed.url} failed 2 attempts; last error: ProtocolError: {message}"
        ), str(info.value)


def test_seed_corrupting_bytes():
    """Flipped payload bytes on both channels: ChecksumError naming the tensor, no tensor handed out."""
    state_dict = make_state_dict()
    manifest, data = Manifest.from_state_dict(state_dict)
    damaged = dict(data)
    flipped = bytearray(data["layers.0.weight"])
    flipped[17] ^= 0x40
    damaged["layers.0.weight"] = memoryview(flipped)
    stream = TensorStreamServer(manifest, damaged)
    app = create_app(manifest, damaged, stream.port)
    received = []
    with SeedServer(stream, app=app) as seed, SeedClient(seed.url, retries=1, backoff=0) as client:
        with pytest.raises(ChecksumError) as info:
            for name, _ in client.iter_tensors():
                received.append(name)
    assert received == ["embed.weight"]
    assert str(info.value).startswith("tensor 'layers.0.weight': sha256 mismatch after 2 attempts (manifest ")
    assert isinstance(info.value, NetLoaderError)
