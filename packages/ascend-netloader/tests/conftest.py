"""A seed on 127.0.0.1 serving a small state dict, and a stream server that cuts connections on purpose."""

from __future__ import annotations

import subprocess
import threading

import pytest
import torch

from vllm_ascend.netloader.seed_server import SeedServer
from vllm_ascend.netloader.transfer import TensorStreamServer

CHUNK = 1000


def make_state_dict() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(40, 16, generator=g).to(torch.bfloat16),
        "layers.0.linear.weight": torch.randn(24, 16, generator=g),
        "layers.0.linear.bias": torch.randn(24, generator=g).to(torch.float16),
        "layers.0.q.weight": torch.randint(-128, 128, (24, 16), generator=g, dtype=torch.int8),
        "layers.0.fp8": torch.randn(8, 8, generator=g).to(torch.float8_e4m3fn),
        "mask": torch.rand(7, generator=g) > 0.5,
        "step": torch.tensor(123456789, dtype=torch.int64),
        "empty": torch.empty(0, 3),
    }


class CuttingStream(TensorStreamServer):
    """Closes each of its first ``cuts`` connections after ``cut_at`` answer bytes; counts requests."""

    def __init__(self, *args, cut_at: int, cuts: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cut_at, self.cuts, self.requests = cut_at, cuts, 0
        self._local = threading.local()

    def _serve(self, stream, entries) -> None:
        self.requests += 1
        self._local.sent, self._local.cut = 0, self.cuts > 0
        self.cuts -= 1
        super()._serve(stream, entries)

    def _send(self, conn, part) -> None:
        if self._local.cut and self._local.sent + len(part) > self.cut_at:
            conn.sendall(part[: self.cut_at - self._local.sent])
            raise ConnectionAbortedError("cut by the test")
        self._local.sent += len(part)
        conn.sendall(part)


@pytest.fixture(scope="module")
def state_dict():
    return make_state_dict()


@pytest.fixture
def fresh_state_dict():
    """A new copy of the test state dict (tests may damage it)."""
    return make_state_dict()


@pytest.fixture
def cutting_stream():
    return CuttingStream


@pytest.fixture(scope="module")
def seed(state_dict):
    with SeedServer.serving(state_dict, chunk_bytes=CHUNK) as server:
        yield server


def _openssl(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca_and_cert(root, name: str) -> dict[str, str]:
    """A CA and a seed certificate for 127.0.0.1/localhost it signed (EC keys: quick to make)."""
    root.mkdir()
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        cwd=root,
    )
    _openssl("req", *ec, "-keyout", "seed.key", "-out", "seed.csr", "-subj", "/CN=127.0.0.1", cwd=root)
    (root / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "x509", "-req", "-in", "seed.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "seed.pem", "-days", "2", "-extfile", "ext.cnf", cwd=root,
    )  # fmt: skip
    _openssl(
        "pkey", "-in", "seed.key", "-aes256", "-passout", "pass:secret", "-out", "encrypted.key", cwd=root
    )
    return {
        "ca": str(root / "ca.pem"),
        "cert": str(root / "seed.pem"),
        "key": str(root / "seed.key"),
        "encrypted_key": str(root / "encrypted.key"),
    }


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory):
    return make_ca_and_cert(tmp_path_factory.mktemp("tls") / "good", "netloader-test-ca")


@pytest.fixture(scope="session")
def other_ca(tmp_path_factory):
    return make_ca_and_cert(tmp_path_factory.mktemp("tls") / "other", "another-ca")
