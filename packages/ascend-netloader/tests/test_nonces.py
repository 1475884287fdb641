"""HTTP nonces are stateless and MACed: a flood of ``GET /auth/nonce`` cannot push out a nonce a client
holds, and an expired, replayed, forged or tampered nonce (or a malformed header) is refused with its reason."""

from __future__ import annotations

import json
import random
import socket
import time

import httpx

from vllm_ascend.netloader.client import SeedClient
from vllm_ascend.netloader.manifest import Manifest
from vllm_ascend.netloader.security import AUTH_HEADER, HTTP_CONTEXT, HttpNonces, ServerSecurity, mac
from vllm_ascend.netloader.seed_server import SeedServer, create_app
from vllm_ascend.netloader.transfer import TensorStreamServer

TOKEN = b"0123456789abcdef0123456789abcdef"
MALFORMED = (
    "authentication failed: X-Netloader-Auth must be <nonce>:<mac>, a nonce from GET /auth/nonce and its MAC "
    "as 64 hexadecimal digits"
)


def _credentials(nonce_hex: str, token: bytes = TOKEN) -> dict[str, str]:
    return {AUTH_HEADER: f"{nonce_hex}:{mac(token, HTTP_CONTEXT, bytes.fromhex(nonce_hex))}"}


def _refusal(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["detail"]


def _seed(state_dict, nonce_ttl: float = 60.0) -> SeedServer:
    manifest, data = Manifest.from_state_dict(state_dict)
    stream = TensorStreamServer(manifest, data, security=ServerSecurity(TOKEN))
    return SeedServer(stream, app=create_app(manifest, data, stream.port, TOKEN, nonce_ttl=nonce_ttl))


def _pipelined_nonces(port: int, count: int) -> list[str]:
    """``count`` nonces asked for without authentication, pipelined on one connection (quick)."""
    request = b"GET /auth/nonce HTTP/1.1\r\nHost: seed\r\n\r\n"
    nonces: list[str] = []
    with socket.create_connection(("127.0.0.1", port), timeout=20) as conn:
        conn.sendall(request * count)
        buffer = b""
        while len(nonces) < count:
            chunk = conn.recv(1 << 16)
            assert chunk, "the seed closed the connection"
            buffer += chunk
            while b"\r\n\r\n" in buffer:
                head, rest = buffer.split(b"\r\n\r\n", 1)
                length = int(
                    next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:"))[15:]
                )
                if len(rest) < length:
                    break
                assert head.startswith(b"HTTP/1.1 200 ")
                nonces.append(json.loads(rest[:length])["nonce"])
                buffer = rest[length:]
    return nonces


def test_a_nonce_flood_does_not_push_out_a_held_nonce(state_dict):
    with _seed(state_dict) as seed, httpx.Client(base_url=seed.url) as http:
        held = http.get("/auth/nonce").json()["nonce"]
        flood = _pipelined_nonces(seed.port, 4200)  # the old store kept the newest 4,096
        assert len(set(flood) | {held}) == 4201
        assert http.get("/manifest", headers=_credentials(held)).status_code == 200
        assert http.get("/manifest", headers=_credentials(flood[0])).status_code == 200
        with SeedClient(seed.url, token=TOKEN, retries=0) as client:
            assert client.fetch_manifest().total_bytes == http.get("/health").json()["bytes"]


def test_issuing_keeps_no_state():
    nonces = HttpNonces(ttl=60)
    held = nonces.issue()
    for _ in range(100_000):
        nonces.issue()
    assert nonces.check(held) is None and nonces.use(held) is None
    assert nonces.use(held) == "the nonce was used before"


def test_expired_nonces_are_refused(state_dict):
    with _seed(state_dict, nonce_ttl=0.3) as seed, httpx.Client(base_url=seed.url) as http:
        nonce = http.get("/auth/nonce").json()["nonce"]
        time.sleep(0.4)
        assert _refusal(http.get("/manifest", headers=_credentials(nonce))) == (
            401,
            "authentication failed: the nonce expired (0.3 s after it was issued)",
        )
        fresh = http.get("/auth/nonce").json()["nonce"]
        assert http.get("/manifest", headers=_credentials(fresh)).status_code == 200


def test_replayed_forged_and_tampered_nonces_are_refused(state_dict):
    with _seed(state_dict) as seed, _seed(state_dict) as other, httpx.Client(base_url=seed.url) as http:
        nonce = http.get("/auth/nonce").json()["nonce"]
        assert http.get("/manifest", headers=_credentials(nonce)).status_code == 200
        assert _refusal(http.get("/transfer", headers=_credentials(nonce))) == (
            401,
            "authentication failed: the nonce was used before",
        )
        not_issued = "authentication failed: the nonce was not issued by this seed"
        forged = (
            random.Random(1).randbytes(HttpNonces.SIZE).hex()
        )  # with a right MAC: the token is not enough
        assert _refusal(http.get("/manifest", headers=_credentials(forged))) == (401, not_issued)
        fresh = bytearray.fromhex(http.get("/auth/nonce").json()["nonce"])
        fresh[7] ^= 0xFF  # another issue time (to live longer)
        assert _refusal(http.get("/manifest", headers=_credentials(fresh.hex()))) == (401, not_issued)
        elsewhere = httpx.get(f"{other.url}/auth/nonce").json()["nonce"]
        assert _refusal(http.get("/manifest", headers=_credentials(elsewhere))) == (401, not_issued)
        wrong_token = _credentials(http.get("/auth/nonce").json()["nonce"], token=b"y" * 32)
        assert _refusal(http.get("/manifest", headers=wrong_token)) == (
            401,
            "authentication failed: the MAC does not match this seed's token",
        )


MALFORMED_VALUES = [
    "",
    "nocolon",
    "zz:zz",
    "{nonce}:",
    "{nonce}:{mac}0",
    "{nonce}:{mac_upper_short}",
    "{nonce}00:{mac}",
    "{nonce}:é" + "0" * 63,
    "{nonce}:" + "٠" * 64,  # Arabic-Indic zeros: digits to str.isdigit, not hexadecimal here
    "{nonce}:{mac}:extra",
    "ÿ" * 5000,
]


def test_malformed_auth_headers_get_a_clean_401(state_dict):
    with _seed(state_dict) as seed, httpx.Client(base_url=seed.url) as http:
        nonce = http.get("/auth/nonce").json()["nonce"]
        answer = mac(TOKEN, HTTP_CONTEXT, bytes.fromhex(nonce))
        for value in MALFORMED_VALUES:
            header = value.format(nonce=nonce, mac=answer, mac_upper_short=answer.upper()[:-1])
            response = http.get("/manifest", headers={AUTH_HEADER: header.encode("utf-8")})
            assert _refusal(response) == (401, MALFORMED), value
        assert http.get("/manifest", headers=_credentials(nonce)).status_code == 200  # still usable
