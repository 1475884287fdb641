"""NetLoader inside vLLM's loader interface: weights from a seed, or vLLM's default loader as fallback."""

from __future__ import annotations

import logging
import socket
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.config.load import LoadConfig

from vllm_ascend.netloader.loader import NetLoader
from vllm_ascend.netloader.seed_server import SeedServer


class TinyModel(nn.Module):
    """A model with vLLM's ``load_weights(iterable of (name, tensor)) -> loaded names`` contract."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(11, 8).to(torch.bfloat16)
        self.proj = nn.Linear(8, 5)

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            params[name].data.copy_(tensor)
            loaded.add(name)
        return loaded


def _model_config(path) -> SimpleNamespace:
    return SimpleNamespace(
        model=str(path), revision=None, quantization=None, is_moe=False, multimodal_config=None
    )


def _same(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(
        torch.equal(sa[k].view(torch.uint8), sb[k].view(torch.uint8)) for k in sa if sa[k].dim()
    )


def test_loads_from_seed(tmp_path):
    source, target = TinyModel(0), TinyModel(1)
    assert not _same(source, target)
    with SeedServer.serving(source.state_dict()) as seed:
        loader = NetLoader(
            LoadConfig(load_format="netloader", model_loader_extra_config={"source": seed.url})
        )
        loader.download_model(_model_config(tmp_path))  # the seed answers: nothing is downloaded
        loader.load_weights(target, _model_config(tmp_path))
    assert loader.fallback_reason is None
    assert _same(source, target)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_falls_back_to_default_loader_when_seed_is_unreachable(tmp_path):
    records = _Records()
    logging.getLogger("vllm_ascend.netloader.loader").addHandler(records)
    source, target = TinyModel(0), TinyModel(1)
    save_file(source.state_dict(), str(tmp_path / "model.safetensors"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        extra = {"source": url, "timeout": 2, "retries": 1}
        loader = NetLoader(LoadConfig(load_format="netloader", model_loader_extra_config=extra))
        with set_current_vllm_config(VllmConfig()):  # vLLM's default loader reads it
            loader.load_weights(target, _model_config(tmp_path))
    assert _same(source, target)
    assert loader.fallback_reason.startswith(
        f"PeerUnavailable: fetching the manifest: seed {url} failed 2 attempts; last error: ConnectError:"
    )
    logging.getLogger("vllm_ascend.netloader.loader").removeHandler(records)
    assert records.messages == [
        f"netloader: cannot load from seed {url} ({loader.fallback_reason}); falling back to the default loader"
    ]


def test_bad_extra_config_is_rejected():
    with pytest.raises(ValueError, match=r"model_loader_extra_config\.source is required"):
        NetLoader(LoadConfig(load_format="netloader", model_loader_extra_config={}))
