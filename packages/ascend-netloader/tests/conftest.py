"""A seed on 127.0.0.1 serving a small state dict, and a stream server that cuts connections on purpose."""

from __future__ import annotations

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

    def _serve(self, conn) -> None:
        self.requests += 1
        self._local.sent, self._local.cut = 0, self.cuts > 0
        self.cuts -= 1
        super()._serve(conn)

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
