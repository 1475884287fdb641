"""Peer authentication and TLS for the seed's two channels (HTTP control and TCP stream).

Authentication is a shared token: the seed hands out a nonce and the client answers
``HMAC-SHA256(token, context || nonce)``; the seed compares in constant time, so the token itself
never crosses the wire. The ``context`` differs per channel, so a MAC made for one cannot be
replayed on the other. Stream nonces live and die with their connection; HTTP nonces are
stateless (:class:`HttpNonces`): MACed with a per-process secret and stamped with their issue
time, so handing them out costs the seed no memory and a flood of ``GET /auth/nonce`` cannot
push out a nonce a client holds. A seed that binds to a non-loopback address refuses to start
without a token. TLS (stdlib :mod:`ssl`) wraps both channels when the seed is given a certificate
and key; the client verifies the seed's certificate against a CA file.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import ipaddress
import os
import re
import secrets
import ssl
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from vllm_ascend.netloader.protocol import BUSY_PREFIX

MIN_TOKEN_BYTES = 16
NONCE_BYTES = 32
"""Random bytes of a stream CHALLENGE nonce."""
STREAM_CONTEXT = b"vllm-ascend-netloader/stream/1:"
HTTP_CONTEXT = b"vllm-ascend-netloader/http/1:"
AUTH_HEADER = "X-Netloader-Auth"
TOKEN_ENV = "VLLM_ASCEND_NETLOADER_TOKEN"
_HEX_MAC = re.compile(r"[0-9a-fA-F]{64}")
_MAX_PEM_BYTES = 1 << 20


class SecurityError(ValueError):
    """Authentication or TLS settings that cannot be used, or a peer that failed authentication."""


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals; any other name or address counts as remote."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_token(token: str | bytes) -> bytes:
    """``token`` as bytes, refused when shorter than :data:`MIN_TOKEN_BYTES`."""
    raw = token.encode() if isinstance(token, str) else bytes(token)
    raw = raw.strip()
    if len(raw) < MIN_TOKEN_BYTES:
        raise SecurityError(
            f"the netloader token has {len(raw)} bytes; at least {MIN_TOKEN_BYTES} are required "
            "(e.g. `openssl rand -hex 32`)"
        )
    return raw


def read_token(file: str | os.PathLike[str] | None = None, env: str | None = TOKEN_ENV) -> bytes | None:
    """The token from ``file`` (first) or the environment variable ``env``; None when neither is set."""
    if file is not None:
        path = Path(file)
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise SecurityError(f"cannot read the netloader token file {path}: {exc.strerror}") from None
        source = f"token file {path}"
    else:
        value = os.environ.get(env) if env else None
        if not value:
            return None
        text, source = value.encode(), f"${env}"
    try:
        return check_token(text)
    except SecurityError as exc:
        raise SecurityError(f"{source}: {exc}") from None


def mac(token: bytes, context: bytes, nonce: bytes) -> str:
    """The hex HMAC-SHA256 a client sends for ``nonce`` on the channel named by ``context``."""
    return hmac.new(token, context + nonce, hashlib.sha256).hexdigest()


def is_mac(answer: object) -> bool:
    """Whether ``answer`` has the form of a MAC: 64 hexadecimal digits (an HMAC-SHA256)."""
    return isinstance(answer, str) and _HEX_MAC.fullmatch(answer) is not None


def mac_matches(token: bytes, context: bytes, nonce: bytes, answer: str) -> bool:
    """Constant-time check of a client's ``answer`` for ``nonce`` (False when it is not a MAC at all)."""
    if not is_mac(answer):
        return False
    expected = hmac.new(token, context + nonce, hashlib.sha256).digest()
    return hmac.compare_digest(expected, bytes.fromhex(answer))


@dataclass(frozen=True)
class ServerSecurity:
    """A seed's settings: the shared ``token`` (None: no authentication) and its TLS certificate and key.

    The certificate and key are loaded here, so a file that is missing, not PEM, encrypted or not a
    matching pair is refused before anything is served.
    """

    token: bytes | None = None
    certfile: str | None = None
    keyfile: str | None = None
    _context: ssl.SSLContext | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.token is not None:
            object.__setattr__(self, "token", check_token(self.token))
        if (self.certfile is None) != (self.keyfile is None):
            raise SecurityError("TLS needs both a certificate and its private key (--tls-cert and --tls-key)")
        if self.certfile is not None and self.keyfile is not None:
            object.__setattr__(self, "_context", _server_context(self.certfile, self.keyfile))

    @property
    def tls(self) -> bool:
        return self._context is not None

    def check_bind(self, host: str) -> None:
        """Refuse a non-loopback ``host`` without a token: anyone who can connect would read every weight."""
        if self.token is None and not is_loopback(host):
            raise SecurityError(
                f"the seed binds to {host}, which is not a loopback address: a shared token is required "
                f"(set {TOKEN_ENV} or pass --token-file; clients send the same token)"
            )

    def server_context(self) -> ssl.SSLContext | None:
        """The TLS context for both ports (None without certificates)."""
        return self._context


def _read_pem(path: str, label: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(_MAX_PEM_BYTES)
    except OSError as exc:
        raise SecurityError(f"cannot read the TLS {label} file {path}: {exc.strerror}") from None


def _server_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    """A TLS 1.2+ server context for ``certfile``/``keyfile``, with one clear message per kind of mistake."""
    cert, key = _read_pem(certfile, "certificate"), _read_pem(keyfile, "private key")
    if b"-----BEGIN CERTIFICATE-----" not in cert:
        raise SecurityError(
            f"TLS certificate file {certfile} is not a PEM certificate (no '-----BEGIN CERTIFICATE-----' line)"
        )
    if not re.search(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----", key):
        raise SecurityError(
            f"TLS private key file {keyfile} is not a PEM private key (no '-----BEGIN ... PRIVATE KEY-----' line)"
        )
    if b"ENCRYPTED" in key:
        raise SecurityError(f"TLS private key file {keyfile} is encrypted; the seed needs an unencrypted key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile, keyfile, password=_no_password)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise SecurityError(
                f"TLS private key file {keyfile} does not belong to the certificate in {certfile}"
            ) from None
        raise SecurityError(
            f"cannot load TLS certificate {certfile} with key {keyfile}: {exc.reason or exc.strerror}"
        ) from None
    return context


def _no_password() -> bytes:
    """Never prompt on the terminal for a key's passphrase (an encrypted key is refused above)."""
    raise SecurityError("the TLS private key asks for a passphrase; the seed needs an unencrypted key")


def client_context(ca_file: str | os.PathLike[str]) -> ssl.SSLContext:
    """A TLS context that trusts only the CA in ``ca_file`` and checks the seed's host name."""
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except (ssl.SSLError, OSError) as exc:
        raise SecurityError(f"cannot load the TLS CA file {ca_file}: {exc}") from None


class HttpNonces:
    """Single-use HTTP nonces that cost the seed no memory until they are used.

    A nonce is ``issued-at (ms, u64) || 16 random bytes || HMAC-SHA256(secret, both)[:16]`` with a
    secret of this process, so the seed recognises its own nonces without storing them. One is
    accepted for ``ttl`` seconds after it was issued, once: a used nonce is remembered until it
    expires (only after its request authenticated, so only token holders add to that set); while
    ``max_used`` are remembered, further requests are refused until some expire.
    """

    _STAMP = struct.Struct("!Q")
    SIZE = _STAMP.size + 16 + 16

    def __init__(self, ttl: float = 60.0, max_used: int = 1 << 16) -> None:
        self.ttl, self.max_used = ttl, max_used
        self._secret = secrets.token_bytes(32)
        self._used: set[bytes] = set()
        self._expiry: list[tuple[int, bytes]] = []
        self._lock = threading.Lock()

    @staticmethod
    def _now_ms() -> int:
        return time.monotonic_ns() // 1_000_000

    def _tag(self, body: bytes) -> bytes:
        return hmac.new(self._secret, b"netloader-nonce:" + body, hashlib.sha256).digest()[:16]

    def issue(self) -> bytes:
        body = self._STAMP.pack(self._now_ms()) + secrets.token_bytes(16)
        return body + self._tag(body)

    def check(self, nonce: bytes) -> str | None:
        """Why ``nonce`` cannot be used (not issued by this seed, or expired); None when it can."""
        body, tag = nonce[:-16], nonce[-16:]
        if len(nonce) != self.SIZE or not hmac.compare_digest(self._tag(body), tag):
            return "the nonce was not issued by this seed"
        (issued,) = self._STAMP.unpack_from(body)
        if self._now_ms() - issued > self.ttl * 1000:
            return f"the nonce expired ({self.ttl:g} s after it was issued)"
        return None

    def use(self, nonce: bytes) -> str | None:
        """Mark a checked nonce used; why it cannot be (used before; or, starting with ``seed busy:``, too many
        in use); None when done."""
        (issued,) = self._STAMP.unpack_from(nonce)
        with self._lock:
            now = self._now_ms()
            while self._expiry and self._expiry[0][0] < now:
                self._used.discard(heapq.heappop(self._expiry)[1])
            if nonce in self._used:
                return "the nonce was used before"
            if len(self._used) >= self.max_used:
                return f"{BUSY_PREFIX} {self.max_used} requests authenticated in the last {self.ttl:g} s; retry later"
            self._used.add(nonce)
            heapq.heappush(self._expiry, (issued + int(self.ttl * 1000) + 1, nonce))
        return None
