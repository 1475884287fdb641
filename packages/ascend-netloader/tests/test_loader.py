"""NetLoader inside vLLM's loader interface: weights from a seed, or vLLM's default loader as fallback."""

from __future__ import annotations

import logging
import math
import socket
from types import SimpleNamespace

import pytest
import torch
from fastapi import FastAPI, Request
from safetensors.torch import save_file
from torch import nn
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.config.load import LoadConfig

from vllm_ascend.netloader import live_seed
from vllm_ascend.netloader.client import NetLoaderError
from vllm_ascend.netloader.live_seed import elastic_load, serve_model
from vllm_ascend.netloader.loader import NetLoader
from vllm_ascend.netloader.manifest import Manifest
from vllm_ascend.netloader.security import TOKEN_ENV, SecurityError, ServerSecurity, read_token
from vllm_ascend.netloader.seed_server import SeedServer
from vllm_ascend.netloader.transfer import TensorStreamServer


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
    # the manifest is checked against the model's own files (headers only): these hold other values
    save_file(TinyModel(2).state_dict(), str(tmp_path / "model.safetensors"))
    with SeedServer.serving(source.state_dict()) as seed:
        loader = NetLoader(
            LoadConfig(load_format="netloader", model_loader_extra_config={"source": seed.url})
        )
        loader.download_model(_model_config(tmp_path))  # the seed answers: nothing is downloaded
        with set_current_vllm_config(VllmConfig()):
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


def _manifest_seed(manifest: dict, asked: list[str]) -> SeedServer:
    """A seed whose HTTP side answers ``manifest`` to every path, appending each path to ``asked``."""
    app = FastAPI()

    @app.get("/{path:path}")
    def answer(path: str, request: Request) -> dict:
        asked.append(request.url.path)
        return manifest

    return SeedServer(TensorStreamServer(*Manifest.from_state_dict({})), app=app)


def _relayout(manifest: dict) -> dict:
    """``manifest`` with offsets, nbytes and total_bytes recomputed from dtypes and shapes."""
    sizes = {"bfloat16": 2, "float16": 2, "float32": 4}
    offset = 0
    for t in manifest["tensors"]:
        t["nbytes"] = sizes[t["dtype"]] * math.prod(t["shape"])
        t["offset"], offset = offset, offset + t["nbytes"]
    manifest["total_bytes"] = offset
    return manifest


def _manipulated(case: str) -> dict:
    manifest = Manifest.from_state_dict(TinyModel(0).state_dict())[0].to_dict()
    tensors = manifest["tensors"]  # embed.weight, proj.weight, proj.bias
    if case == "missing":
        del tensors[0], tensors[1]
    elif case == "extra":
        tensors.append(dict(tensors[2], name="proj.extra"))
    elif case == "huge shape":
        tensors[1]["shape"] = [2**40]
    elif case == "dtype":
        tensors[1]["dtype"] = "float16"
    return _relayout(manifest)


MISMATCHES = {
    "missing": "2 missing (embed.weight, proj.bias)",
    "extra": "1 unexpected (proj.extra)",
    "huge shape": "1 with another dtype or shape ('proj.weight': seed float32 [1099511627776], "
    "model float32 [5, 8])",
    "dtype": "1 with another dtype or shape ('proj.weight': seed float16 [5, 8], model float32 [5, 8])",
}


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_mismatched_manifest_falls_back_before_any_transfer(tmp_path, case):
    records = _Records()
    logging.getLogger("vllm_ascend.netloader.loader").addHandler(records)
    on_disk, target = TinyModel(0), TinyModel(1)
    save_file(on_disk.state_dict(), str(tmp_path / "model.safetensors"))
    asked: list[str] = []
    with _manifest_seed(_manipulated(case), asked) as seed:
        loader = NetLoader(
            LoadConfig(load_format="netloader", model_loader_extra_config={"source": seed.url})
        )
        with set_current_vllm_config(VllmConfig()):
            loader.load_weights(target, _model_config(tmp_path))
    logging.getLogger("vllm_ascend.netloader.loader").removeHandler(records)
    reason = f"WeightMismatch: the seed does not serve this model's weights: {MISMATCHES[case]}"
    assert loader.fallback_reason == reason
    assert records.messages == [
        f"netloader: cannot load from seed {seed.url} ({reason}); falling back to the default loader"
    ]
    assert asked == ["/manifest"]  # nothing was requested (or allocated) after the manifest
    assert _same(on_disk, target)


def test_mismatch_with_fallback_off_fails_naming_the_tensors(tmp_path):
    save_file(TinyModel(0).state_dict(), str(tmp_path / "model.safetensors"))
    target = TinyModel(1)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    asked: list[str] = []
    with _manifest_seed(_manipulated("missing"), asked) as seed:
        extra = {"source": seed.url, "fallback": False}
        loader = NetLoader(LoadConfig(load_format="netloader", model_loader_extra_config=extra))
        with pytest.raises(NetLoaderError) as info, set_current_vllm_config(VllmConfig()):
            loader.load_weights(target, _model_config(tmp_path))
    assert str(info.value) == (
        f"netloader: cannot load from seed {seed.url} (WeightMismatch: the seed does not serve this "
        "model's weights: 2 missing (embed.weight, proj.bias)); fallback is off"
    )
    assert asked == ["/manifest"]
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())


def test_live_seed_serves_the_models_current_weights_without_files(tmp_path):
    source, target = TinyModel(0), TinyModel(1)
    with torch.no_grad():
        source.proj.bias.add_(100.0)  # changed after "loading": the live state, not any file
    with serve_model(source) as seed:
        loader = NetLoader(
            LoadConfig(load_format="netloader", model_loader_extra_config={"source": seed.url})
        )
        loader.load_weights(target, _model_config(tmp_path))  # tmp_path holds no weights: none are read
    assert loader.fallback_reason is None
    assert _same(source, target)
    assert seed.stream.manifest.kind == "live"
    assert [e.name for e in seed.stream.manifest.tensors] == ["embed.weight", "proj.weight", "proj.bias"]


def test_live_seed_for_another_model_is_refused(tmp_path):
    class Wider(TinyModel):
        def __init__(self) -> None:
            super().__init__(0)
            self.proj = nn.Linear(8, 6)

    with serve_model(Wider()) as seed:
        extra = {"source": seed.url, "fallback": False}
        loader = NetLoader(LoadConfig(load_format="netloader", model_loader_extra_config=extra))
        with pytest.raises(
            NetLoaderError,
            match=r"2 with another dtype or shape \('proj.weight': seed "
            r"float32 \[6, 8\], model float32 \[5, 8\], 'proj.bias'",
        ):
            loader.load_weights(TinyModel(1), _model_config(tmp_path))


def test_elastic_load_uses_the_first_live_source_that_serves(tmp_path):
    source, target = TinyModel(0), TinyModel(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
        with serve_model(source) as live, SeedServer.serving(source.state_dict()) as checkpoint:
            assert elastic_load(target, [dead, live.url], timeout=2, retries=0) == live.url
            assert _same(source, target)
            # a checkpoint seed's names go through load_weights, not into parameters by name
            assert elastic_load(TinyModel(1), [dead, checkpoint.url], timeout=2, retries=0) is None


def test_weights_changed_after_serving_started_are_refused(tmp_path):
    source = TinyModel(0)
    with serve_model(source) as seed:
        with torch.no_grad():
            source.proj.bias.add_(1.0)  # after the checksums were taken
        extra = {"source": seed.url, "retries": 0, "fallback": False}
        loader = NetLoader(LoadConfig(load_format="netloader", model_loader_extra_config=extra))
        with pytest.raises(NetLoaderError, match=r"ChecksumError: tensor 'proj.bias': sha256 mismatch"):
            loader.load_weights(TinyModel(1), _model_config(tmp_path))


def test_live_seeds_are_single_rank_only(tmp_path, monkeypatch):
    source = TinyModel(0)
    with serve_model(source) as seed:
        monkeypatch.setattr(live_seed, "model_parallel_size", lambda: 2)
        extra = {"source": seed.url, "fallback": False}
        loader = NetLoader(LoadConfig(load_format="netloader", model_loader_extra_config=extra))
        with pytest.raises(NetLoaderError, match="a live seed serves one rank's weights; this model has 2"):
            loader.load_weights(TinyModel(1), _model_config(tmp_path))
        with pytest.raises(NetLoaderError, match="single-rank engines only; this one has 2"):
            live_seed._serve_in_worker(source, "127.0.0.1", 0, 0)


def test_live_seed_on_a_non_loopback_address_needs_the_token(tmp_path, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    source, target = TinyModel(0), TinyModel(1)
    with pytest.raises(SecurityError, match=r"the seed binds to 0\.0\.0\.0, which is not a loopback address"):
        serve_model(source, host="0.0.0.0")
    token_file = tmp_path / "token"
    token_file.write_text("0123456789abcdef0123456789abcdef\n")
    security = ServerSecurity(read_token(token_file))
    with serve_model(source, host="0.0.0.0", security=security) as seed:
        url = f"http://127.0.0.1:{seed.port}"
        without = NetLoader(
            LoadConfig(load_format="netloader", model_loader_extra_config={"source": url, "fallback": False})
        )
        with pytest.raises(NetLoaderError, match="401"):
            without.load_weights(TinyModel(1), _model_config(tmp_path))
        extra = {"source": url, "token_file": str(token_file), "fallback": False}
        NetLoader(LoadConfig(load_format="netloader", model_loader_extra_config=extra)).load_weights(
            target, _model_config(tmp_path)
        )
    assert _same(source, target)


def test_quantized_model_refuses_a_live_seed(tmp_path):
    config = SimpleNamespace(**dict(vars(_model_config(tmp_path)), quantization="fp8"))
    with serve_model(TinyModel(0)) as seed:
        extra = {"source": seed.url, "fallback": False}
        loader = NetLoader(LoadConfig(load_format="netloader", model_loader_extra_config=extra))
        with pytest.raises(
            NetLoaderError, match="a live seed cannot load a 'fp8' model: its post-load weights"
        ):
            loader.load_weights(TinyModel(1), config)
