"""NetLoaderConfig: model_loader_extra_config validation with exact messages."""

from __future__ import annotations

import re

import pytest

from vllm_ascend.netloader.config import NetLoaderConfig


def test_defaults_and_values():
    assert NetLoaderConfig.from_extra_config({"source": "http://10.0.0.2:18080/"}) == NetLoaderConfig(
        "http://10.0.0.2:18080", 30.0, 3, True, None, None
    )
    cfg = NetLoaderConfig.from_extra_config(
        {"source": "https://[::1]:443", "timeout": 5, "retries": 0, "ca_file": "ca.pem", "token_file": "t"}
    )
    assert (cfg.source, cfg.timeout, cfg.retries, cfg.fallback) == ("https://[::1]:443", 5.0, 0, True)
    assert (cfg.token_file, cfg.ca_file) == ("t", "ca.pem")
    assert NetLoaderConfig.from_extra_config({"source": "http://h:1", "fallback": False}).fallback is False


@pytest.mark.parametrize(
    "extra,message",
    [
        (None, "model_loader_extra_config must be a dict for load format 'netloader', got NoneType"),
        (
            {},
            "model_loader_extra_config.source is required for load format 'netloader' (e.g. 'http://10.0.0.2:18080')",
        ),
        (
            {"source": "http://h:1", "port": 1, "host": 2},
            "model_loader_extra_config: unknown key(s) 'host', 'port'; allowed: source, timeout, retries, fallback, token_file, ca_file",
        ),
        (
            {"source": "ftp://h:1"},
            "model_loader_extra_config.source = 'ftp://h:1': expected an http:// or https:// "
            "URL with host and port, e.g. 'http://10.0.0.2:18080'",
        ),
        ({"source": "http://host"}, "model_loader_extra_config.source = 'http://host': expected an http://"),
        ({"source": "http://host:99999"}, "model_loader_extra_config.source = 'http://host:99999': expected"),
        ({"source": 5}, "model_loader_extra_config.source = 5: expected"),
        (
            {"source": "http://h:1", "timeout": 0},
            "model_loader_extra_config.timeout = 0: expected a positive number",
        ),
        (
            {"source": "http://h:1", "timeout": True},
            "model_loader_extra_config.timeout = True: expected a positive",
        ),
        (
            {"source": "http://h:1", "retries": -1},
            "model_loader_extra_config.retries = -1: expected an integer >= 0",
        ),
        (
            {"source": "http://h:1", "fallback": "no"},
            "model_loader_extra_config.fallback = 'no': expected true or false",
        ),
        (
            {"source": "http://h:1", "token_file": 3},
            "model_loader_extra_config.token_file = 3: expected a file",
        ),
        (
            {"source": "https://h:1"},
            "model_loader_extra_config.ca_file = None: an https:// source needs the CA file that signed the "
            "seed's certificate, and an http:// source takes none",
        ),
        (
            {"source": "http://h:1", "ca_file": "ca.pem"},
            "model_loader_extra_config.ca_file = 'ca.pem': an https://",
        ),
    ],
)
def test_errors(extra, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        NetLoaderConfig.from_extra_config(extra)
