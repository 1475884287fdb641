"""Seed server and client over loopback: bitwise copies, recovery from damage, exact failures."""

from __future__ import annotations

import hashlib
import re
import socket

import httpx
import pytest
import torch
from fastapi import FastAPI
from safetensors.torch import save_file

from vllm_ascend.netloader.client import ChecksumError, NetLoaderError, PeerUnavailable, SeedClient
from vllm_ascend.netloader.manifest import Manifest, ManifestError
from vllm_ascend.netloader.protocol import FrameReader, MessageType, encode
from vllm_ascend.netloader.seed_server import CheckpointError, SeedServer, create_app, load_checkpoint
from vllm_ascend.netloader.transfer import TensorStreamServer

CHUNK = 1000  # the conftest seed's chunk size


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    def raw(t: torch.Tensor) -> list[int]:
        return t.contiguous().reshape(-1).view(torch.uint8).tolist()

    return a.dtype == b.dtype and a.shape == b.shape and raw(a) == raw(b)


def test_manifest_and_bitwise_stream(seed, state_dict):
    with SeedClient(seed.url) as client:
        manifest = client.fetch_manifest()
        assert manifest == Manifest.from_state_dict(state_dict)[0]
        got = dict(client.iter_tensors())
    assert list(got) == list(state_dict)
    assert all(bitwise_equal(got[n], state_dict[n]) for n in state_dict)
    assert state_dict["embed.weight"].numel() * 2 > CHUNK  # several frames for one tensor


def test_fetch_into_preallocated_and_subset(seed, state_dict):
    targets = {n: torch.empty_like(t) for n, t in state_dict.items()}
    noncontiguous = torch.empty(16, 24).t()  # a strided target gets its bytes through a staging copy
    targets["layers.0.linear.weight"] = noncontiguous
    with SeedClient(seed.url) as client:
        assert client.fetch_into(targets) == Manifest.from_state_dict(state_dict)[0].total_bytes
        names = ["step", "mask"]
        assert [n for n, _ in client.iter_tensors(names)] == ["mask", "step"]  # stream order
        single = client.fetch_tensor("layers.0.q.weight")
    assert all(bitwise_equal(targets[n], state_dict[n]) for n in state_dict)
    assert bitwise_equal(single, state_dict["layers.0.q.weight"])


def test_target_mismatch_is_reported_before_any_transfer(seed):
    with SeedClient(seed.url) as client, pytest.raises(ManifestError) as info:
        client.fetch_into({"step": torch.empty(1, dtype=torch.int32), "nope": torch.empty(1)})
    assert info.value.problems == ["tensor 'nope' is not served by the seed"]
    with SeedClient(seed.url) as client, pytest.raises(ManifestError) as info:
        client.fetch_into({"step": torch.empty(1, dtype=torch.int32)})
    assert info.value.problems == [
        "tensor 'step': the seed serves int64, the target is torch.int32",
        "tensor 'step': the seed serves shape [], the target has [1]",
    ]


def test_tensor_ranges_and_http_errors(seed, state_dict):
    raw = state_dict["layers.0.linear.weight"].numpy().tobytes()
    with httpx.Client(base_url=seed.url) as http:
        assert (
            http.get("/tensors/layers.0.linear.weight", params={"start": 8, "end": 40}).content == raw[8:40]
        )
        assert http.get("/health").json() == {"status": "ok", "tensors": 8, "bytes": 3327}
        assert http.get("/transfer").json() == {
            "port": seed.stream.port,
            "protocol": 2,
            "tls": False,
            "auth": False,
        }
        r = http.get("/tensors/layers.0.linear.weight", params={"start": 8, "end": 4000})
        assert (r.status_code, r.json()["detail"]) == (
            416,
            "byte range [8, 4000) is outside tensor 'layers.0.linear.weight' of 1536 bytes",
        )
        r = http.get("/tensors/nope")
        assert (r.status_code, r.json()["detail"]) == (404, "tensor 'nope' is not served by this seed")


def _stream_answer(seed, request: bytes) -> list:
    """Send raw bytes to the seed's stream port; return the decoded answer frames after its CHALLENGE."""
    with socket.create_connection(("127.0.0.1", seed.stream.port), timeout=10) as conn:
        conn.sendall(request)
        conn.shutdown(socket.SHUT_WR)
        reader = FrameReader(conn.recv_into)
        challenge = reader.next()
        assert challenge.type is MessageType.CHALLENGE and challenge.header["auth"] is False
        assert len(bytes.fromhex(challenge.header["nonce"])) == 32
        frames = []
        while (frame := reader.next()) is not None:
            frames.append((frame.type.name, frame.header))
    return frames


def test_stream_server_rejects_bad_requests_with_error_frames(seed):
    assert _stream_answer(seed, b"GET / HTTP/1.1\r\n\r\n") == [
        ("ERROR", {"message": "bad frame magic b'GET ', expected b'VANL'"})
    ]
    assert _stream_answer(seed, encode(MessageType.TENSOR_REQUEST, {"names": ["step", "nope"]})) == [
        ("ERROR", {"message": "invalid weight manifest: tensor 'nope' is not served by the seed"})
    ]
    assert _stream_answer(seed, encode(MessageType.END, {"tensors": 0, "bytes": 0})) == [
        ("ERROR", {"message": "expected a TENSOR_REQUEST frame, got a END frame"})
    ]
    assert _stream_answer(seed, encode(MessageType.TENSOR_REQUEST, {"names": []})[:20]) == [
        ("ERROR", {"message": "truncated frame: stream ended after 2 of 12 TENSOR_REQUEST header bytes"})
    ]
    assert _stream_answer(seed, b"") == [
        ("ERROR", {"message": "expected a TENSOR_REQUEST frame, got an empty stream"})
    ]
    frames = _stream_answer(seed, encode(MessageType.TENSOR_REQUEST, {"names": ["mask", "step"]}))
    assert frames == [
        ("TENSOR", {"name": "mask", "offset": 3312, "start": 0, "length": 7}),
        ("TENSOR", {"name": "step", "offset": 3319, "start": 0, "length": 8}),
        ("END", {"tensors": 2, "bytes": 15}),
    ]


def test_transient_corruption_is_refetched(fresh_state_dict):
    sd = fresh_state_dict
    manifest, good = Manifest.from_state_dict(sd)
    bad = dict(good)
    flipped = bytearray(good["embed.weight"])
    flipped[300] ^= 0xFF
    bad["embed.weight"] = memoryview(flipped)  # only the stream port serves the damaged bytes
    stream = TensorStreamServer(manifest, bad, chunk_bytes=CHUNK)
    app = create_app(manifest, good, stream.port)
    paths = []

    @app.middleware("http")
    async def record(request, call_next):
        paths.append(request.url.path)
        return await call_next(request)

    with SeedServer(stream, app=app) as server, SeedClient(server.url, backoff=0) as client:
        got = dict(client.iter_tensors())
    assert all(bitwise_equal(got[n], sd[n]) for n in sd)
    assert paths == ["/manifest", "/transfer", "/tensors/embed.weight"]  # only the damaged tensor again


def test_persistent_corruption_fails_with_checksums(fresh_state_dict):
    sd = fresh_state_dict
    expected = hashlib.sha256(sd["layers.0.linear.weight"].numpy().tobytes()).hexdigest()
    server = SeedServer.serving(sd, chunk_bytes=CHUNK)
    sd["layers.0.linear.weight"][0, 0] += 1  # the served bytes are the tensor's memory
    received = hashlib.sha256(sd["layers.0.linear.weight"].numpy().tobytes()).hexdigest()
    with server, SeedClient(server.url, retries=2, backoff=0) as client:
        with pytest.raises(ChecksumError) as info:
            dict(client.iter_tensors())
    assert str(info.value) == (
        f"tensor 'layers.0.linear.weight': sha256 mismatch after 3 attempts (manifest {expected}, received {received})"
    )


def _cut_seed(sd, cutting_stream, cut_at: int, cuts: int) -> SeedServer:
    manifest, data = Manifest.from_state_dict(sd)
    return SeedServer(cutting_stream(manifest, data, chunk_bytes=CHUNK, cut_at=cut_at, cuts=cuts))


def test_truncated_stream_resumes_after_last_whole_tensor(fresh_state_dict, cutting_stream):
    sd = fresh_state_dict
    # every answer is cut after 2500 bytes: only resuming after the last whole tensor completes
    with (
        _cut_seed(sd, cutting_stream, 2500, 100) as server,
        SeedClient(server.url, retries=10, backoff=0) as client,
    ):
        got = dict(client.iter_tensors())
    assert all(bitwise_equal(got[n], sd[n]) for n in sd)
    assert server.stream.requests == 3


def test_persistently_truncated_stream_gives_up(fresh_state_dict, cutting_stream):
    with (
        _cut_seed(fresh_state_dict, cutting_stream, 100, 100) as server,
        SeedClient(server.url, retries=1, backoff=0) as client,
    ):
        with pytest.raises(PeerUnavailable) as info:
            dict(client.iter_tensors())
    assert str(info.value) == (
        f"streaming tensors: seed {server.url} failed 2 attempts; last error: ProtocolError: "
        "truncated TENSOR payload for 'embed.weight': stream ended after 24 of 1000 bytes"
    )


def test_seed_error_frames_and_bad_transfer_answers(fresh_state_dict):
    manifest, data = Manifest.from_state_dict(fresh_state_dict)
    small, small_data = Manifest.from_state_dict({"step": fresh_state_dict["step"]})
    stream = TensorStreamServer(small, small_data)  # serves less than the HTTP manifest promises
    with (
        SeedServer(stream, app=create_app(manifest, data, stream.port)) as server,
        SeedClient(server.url) as client,
    ):
        with pytest.raises(NetLoaderError) as info:
            client.fetch_into({"mask": torch.empty(7, dtype=torch.bool)})
    assert str(info.value) == (
        f"seed {server.url} reported an error: invalid weight manifest: tensor 'mask' is not served by the seed"
    )
    app = create_app(manifest, data, 0)
    with SeedServer(stream, app=app) as server, SeedClient(server.url, retries=0) as client:
        with pytest.raises(PeerUnavailable) as info:
            dict(client.iter_tensors())
    assert str(info.value) == (
        f"streaming tensors: seed {server.url} failed 1 attempts; last error: ProtocolError: GET /transfer "
        "answered {'port': 0, 'protocol': 2, 'tls': False, 'auth': False}: "
        "expected {'port': 1..65535, 'protocol': 2, 'tls': bool, 'auth': bool}"
    )


def test_unreachable_peer():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connections are refused
        with SeedClient(f"http://127.0.0.1:{port}", retries=1, backoff=0) as client:
            with pytest.raises(PeerUnavailable) as info:
                client.fetch_manifest()
    assert re.fullmatch(
        rf"fetching the manifest: seed http://127\.0\.0\.1:{port} failed 2 attempts; last error: ConnectError: .+",
        str(info.value),
    )


def _idle_stream() -> TensorStreamServer:
    return TensorStreamServer(*Manifest.from_state_dict({}))


def test_bad_manifest_and_client_errors_from_peer():
    app = FastAPI()
    good = Manifest.from_state_dict({"w": torch.zeros(2)})[0].to_dict()
    good["tensors"][0]["nbytes"] = 9

    @app.get("/manifest")
    def manifest():
        return good

    with SeedServer(_idle_stream(), app=app) as server, SeedClient(server.url) as client:
        with pytest.raises(ManifestError) as info:
            client.fetch_manifest()
    assert str(info.value) == (
        "invalid weight manifest: tensors[0] ('w').nbytes = 9: expected 8 (shape [2] × 4 bytes of float32)"
    )
    with SeedServer(_idle_stream(), app=FastAPI()) as server, SeedClient(server.url) as client:
        with pytest.raises(NetLoaderError) as info:
            client.fetch_manifest()
    assert str(info.value) == f"fetching the manifest: seed {server.url} answered 404: Not Found"


def test_checkpoint_directory_is_served_bitwise(tmp_path, fresh_state_dict):
    sd = fresh_state_dict
    del sd["empty"]  # safetensors stores no zero-size tensors in some versions; keep the test about bytes
    names = list(sd)
    save_file({n: sd[n] for n in names[:4]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({n: sd[n] for n in names[4:]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    loaded = load_checkpoint(tmp_path)
    with SeedServer.serving(loaded) as server, SeedClient(server.url) as client:
        got = dict(client.iter_tensors())
    assert sorted(got) == sorted(sd) and all(bitwise_equal(got[n], sd[n]) for n in sd)
    save_file({names[0]: sd[names[0]]}, str(tmp_path / "model-extra.safetensors"))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path)
    assert str(info.value) == (
        f"tensor '{names[0]}' is in both model-00001-of-00002.safetensors and model-extra.safetensors of {tmp_path}"
    )
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(tmp_path / 'missing'))} does not exist$"):
        load_checkpoint(tmp_path / "missing")


def test_bad_chunk_size():
    with pytest.raises(ValueError, match="chunk_bytes must be a positive integer, got 0"):
        TensorStreamServer(*Manifest.from_state_dict({}), chunk_bytes=0)
