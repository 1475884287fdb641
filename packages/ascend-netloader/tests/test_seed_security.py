"""Finding 4: a shared token (HMAC over a seed nonce) on both channels, required off loopback, and TLS
on both channels when the seed has a certificate (https:// sources never fall back to plain TCP)."""

from __future__ import annotations

import os
import re
import socket
import ssl
import subprocess
import sys

import httpx
import pytest
import torch

from vllm_ascend.netloader.client import NetLoaderError, PeerUnavailable, SeedClient
from vllm_ascend.netloader.manifest import Manifest
from vllm_ascend.netloader.protocol import FrameReader, MessageType, encode
from vllm_ascend.netloader.security import (
    AUTH_HEADER,
    HTTP_CONTEXT,
    SecurityError,
    ServerSecurity,
    is_loopback,
    mac,
    read_token,
)
from vllm_ascend.netloader.seed_server import SeedServer, create_app
from vllm_ascend.netloader.transfer import TensorStreamServer

TOKEN = b"0123456789abcdef0123456789abcdef"


def _raw(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())


def _same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return got.keys() == want.keys() and all(_raw(got[n]) == _raw(want[n]) for n in want)


def test_non_loopback_bind_needs_a_token(state_dict):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("seed.example") and not is_loopback("10.0.0.2")
    message = (
        "the seed binds to 0.0.0.0, which is not a loopback address: a shared token is required "
        "(set VLLM_ASCEND_NETLOADER_TOKEN or pass --token-file; clients send the same token)"
    )
    with pytest.raises(SecurityError, match=re.escape(message)):
        SeedServer.serving(state_dict, host="0.0.0.0")
    with pytest.raises(SecurityError, match=re.escape(message)):
        TensorStreamServer(*Manifest.from_state_dict({}), host="0.0.0.0")
    with pytest.raises(SecurityError, match="the netloader token has 5 bytes; at least 16 are required"):
        ServerSecurity(b"short")


def test_token_on_a_public_bind(state_dict):
    """Bound to 0.0.0.0 (reached through 127.0.0.1): the right token loads; none or a wrong one is refused."""
    with SeedServer.serving(state_dict, host="0.0.0.0", security=ServerSecurity(TOKEN)) as seed:
        url = f"http://127.0.0.1:{seed.port}"
        with SeedClient(url, token=TOKEN.decode()) as client:
            assert _same(dict(client.iter_tensors()), state_dict)
        with SeedClient(url) as client, pytest.raises(NetLoaderError) as info:
            client.fetch_manifest()
        assert str(info.value) == (
            f"fetching the manifest: seed {url} answered 401: this seed requires a token: "
            "send X-Netloader-Auth: <nonce>:<mac>"
        )
        with SeedClient(url, token=b"x" * 32) as client, pytest.raises(NetLoaderError) as info:
            client.fetch_manifest()
        assert str(info.value) == (
            f"fetching the manifest: seed {url} answered 401: authentication failed: "
            "the MAC does not match this seed's token"
        )
        with httpx.Client(base_url=url) as http:  # a nonce is single-use: a replayed MAC is refused
            nonce = http.get("/auth/nonce").json()["nonce"]
            credentials = {AUTH_HEADER: f"{nonce}:{mac(TOKEN, HTTP_CONTEXT, bytes.fromhex(nonce))}"}
            assert http.get("/manifest", headers=credentials).status_code == 200
            replayed = http.get("/manifest", headers=credentials)
            assert (replayed.status_code, replayed.json()) == (
                401,
                {"detail": "authentication failed: the nonce was used before"},
            )
            assert http.get("/health").status_code == 200
        with socket.create_connection(("127.0.0.1", seed.stream.port), timeout=10) as conn:
            conn.sendall(encode(MessageType.TENSOR_REQUEST, {"names": []}))
            reader = FrameReader(conn.recv_into)
            assert reader.next().header["auth"] is True
            assert reader.next().header == {
                "message": "authentication required: expected an AUTH frame, got a TENSOR_REQUEST frame"
            }
            assert reader.next() is None
        with socket.create_connection(("127.0.0.1", seed.stream.port), timeout=10) as conn:
            conn.sendall(encode(MessageType.AUTH, {"mac": "00" * 32}))
            reader = FrameReader(conn.recv_into)
            reader.next()
            assert reader.next().header == {
                "message": "authentication failed: the MAC does not match this seed's token"
            }


def test_a_stream_that_wants_a_token_the_client_lacks(state_dict):
    """The HTTP side open, the stream side behind a token: the client says so instead of hanging."""
    manifest, data = Manifest.from_state_dict(state_dict)
    stream = TensorStreamServer(manifest, data, security=ServerSecurity(TOKEN))
    with (
        SeedServer(stream, app=create_app(manifest, data, stream.port)) as seed,
        SeedClient(seed.url) as client,
    ):
        with pytest.raises(NetLoaderError) as info:
            dict(client.iter_tensors())
    assert str(info.value) == f"seed {seed.url} requires a token and none is configured"


def test_tls_on_both_channels(state_dict, tls_files):
    security = ServerSecurity(TOKEN, tls_files["cert"], tls_files["key"])
    with SeedServer.serving(state_dict, security=security) as seed:
        assert seed.url.startswith("https://127.0.0.1:")
        with SeedClient(seed.url, token=TOKEN, ca_file=tls_files["ca"]) as client:
            assert _same(dict(client.iter_tensors()), state_dict)
            assert _raw(client.fetch_tensor("step")) == _raw(state_dict["step"])
        with socket.create_connection(("127.0.0.1", seed.stream.port), timeout=10) as conn:
            conn.sendall(encode(MessageType.TENSOR_REQUEST, {"names": []}))  # plain TCP gets no frames
            try:
                answer = conn.recv(1 << 16)
            except ConnectionResetError:  # the TLS side answers garbage with an alert and a reset
                answer = b""
            assert not answer.startswith(b"VANL")
        context = ssl.create_default_context(cafile=tls_files["ca"])
        with (
            socket.create_connection(("127.0.0.1", seed.stream.port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
        ):
            assert FrameReader(conn.recv_into).next().type is MessageType.CHALLENGE
        with httpx.Client(base_url=seed.url.replace("https", "http")) as http, pytest.raises(httpx.HTTPError):
            http.get("/health")


def test_tls_is_verified_and_https_needs_a_ca(state_dict, tls_files, other_ca):
    security = ServerSecurity(None, tls_files["cert"], tls_files["key"])
    with SeedServer.serving(state_dict, security=security) as seed:
        with SeedClient(seed.url, retries=0, ca_file=other_ca["ca"]) as client:
            with pytest.raises(PeerUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
                client.fetch_manifest()
        message = (
            f"source {seed.url} is https:// but no CA file is configured: the seed's certificate cannot be "
            "verified (set the CA that signed it, or use an http:// source on a trusted network)"
        )
        with pytest.raises(SecurityError, match=re.escape(message)):
            SeedClient(seed.url)
    with pytest.raises(SecurityError, match="is not https://; use https:// so both channels are encrypted"):
        SeedClient("http://127.0.0.1:1", ca_file=tls_files["ca"])


def test_https_source_never_streams_over_plain_tcp(state_dict, tls_files):
    """A TLS control plane that points at a plain stream port is refused, whether it admits it or not."""
    manifest, data = Manifest.from_state_dict(state_dict)
    tls_stream = TensorStreamServer(
        manifest, data, security=ServerSecurity(None, tls_files["cert"], tls_files["key"])
    )
    plain = TensorStreamServer(manifest, data).start()
    try:
        honest = create_app(manifest, data, plain.port, stream_tls=False)
        with (
            SeedServer(tls_stream, app=honest) as seed,
            SeedClient(seed.url, ca_file=tls_files["ca"]) as client,
        ):
            with pytest.raises(NetLoaderError) as info:
                dict(client.iter_tensors())
        assert str(info.value) == (
            f"seed {seed.url} is https:// but its stream port does not use TLS; "
            "refusing to receive weights over plain TCP"
        )
        lying = create_app(manifest, data, plain.port, stream_tls=True)
        with (
            SeedServer(tls_stream, app=lying) as seed,
            SeedClient(seed.url, retries=0, ca_file=tls_files["ca"]) as client,
        ):
            with pytest.raises(PeerUnavailable, match=r"last error: SSL\w*Error"):
                dict(client.iter_tensors())
    finally:
        plain.stop()


def test_tokens_from_files_and_the_environment(tmp_path, monkeypatch):
    (tmp_path / "token").write_bytes(TOKEN + b"\n")
    assert read_token(tmp_path / "token") == TOKEN
    monkeypatch.setenv("MY_TOKEN", TOKEN.decode())
    assert read_token(None, "MY_TOKEN") == TOKEN
    monkeypatch.delenv("MY_TOKEN")
    assert read_token(None, "MY_TOKEN") is None
    with pytest.raises(SecurityError, match=r"cannot read the netloader token file .*missing: No such file"):
        read_token(tmp_path / "missing")
    with pytest.raises(SecurityError, match="TLS needs both a certificate and its private key"):
        ServerSecurity(TOKEN, str(tmp_path / "token"), None)
    with pytest.raises(SecurityError) as info:
        ServerSecurity(TOKEN, "/nonexistent.pem", str(tmp_path / "token"))
    assert (
        str(info.value) == "cannot read the TLS certificate file /nonexistent.pem: No such file or directory"
    )
    (tmp_path / "short").write_bytes(b"abc\n")
    with pytest.raises(SecurityError) as info:
        read_token(tmp_path / "short")
    assert str(info.value) == (
        f"token file {tmp_path / 'short'}: the netloader token has 3 bytes; at least 16 are required "
        "(e.g. `openssl rand -hex 32`)"
    )
    monkeypatch.setenv("MY_TOKEN", "tiny")
    with pytest.raises(SecurityError, match=r"^\$MY_TOKEN: the netloader token has 4 bytes"):
        read_token(None, "MY_TOKEN")


def test_seed_command_security_flags(tmp_path, tls_files):
    from safetensors.torch import save_file

    weights = {"a": torch.arange(6, dtype=torch.float32)}
    save_file(weights, str(tmp_path / "model.safetensors"))
    command = [sys.executable, "-m", "vllm_ascend.core.cli", "netloader-seed", "--checkpoint", str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ASCEND_NETLOADER_TOKEN"}
    refused = subprocess.run(
        [*command, "--host", "0.0.0.0"], capture_output=True, text=True, env=env, timeout=120
    )
    assert refused.returncode == 2
    assert refused.stderr.endswith(
        "netloader-seed: the seed binds to 0.0.0.0, which is not a loopback address: a shared token is "
        "required (set VLLM_ASCEND_NETLOADER_TOKEN or pass --token-file; clients send the same token)\n"
    )
    env["VLLM_ASCEND_NETLOADER_TOKEN"] = TOKEN.decode()
    flags = ["--host", "0.0.0.0", "--tls-cert", tls_files["cert"], "--tls-key", tls_files["key"]]
    proc = subprocess.Popen(
        [*command, *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        line = proc.stdout.readline()
        match = re.fullmatch(
            r"seed serving 1 tensors \(0\.0 MiB\) from .* at https://0\.0\.0\.0:(\d+) \(stream port \d+; "
            r"token required; TLS\); Ctrl-C stops it\n",
            line,
        )
        assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = f"https://127.0.0.1:{match.group(1)}"
        with SeedClient(url, token=TOKEN, ca_file=tls_files["ca"]) as client:
            assert _same(dict(client.iter_tensors()), weights)
    finally:
        proc.kill()
        proc.wait(timeout=30)
