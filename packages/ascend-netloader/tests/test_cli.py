"""``vllm-ascend netloader-seed`` mistakes: each is one line on stderr naming the option or file, a non-zero
exit status and no traceback (run in-process; none of them gets as far as serving)."""

from __future__ import annotations

import argparse
import shutil
import socket

import pytest
import torch
from safetensors.torch import save_file

from vllm_ascend.netloader.cli import SEED_COMMAND
from vllm_ascend.netloader.security import TOKEN_ENV

TOKEN = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def checkpoint(tmp_path):
    root = tmp_path / "model"
    root.mkdir()
    save_file({"a": torch.arange(6, dtype=torch.float32)}, str(root / "model.safetensors"))
    return root


@pytest.fixture(autouse=True)
def no_token(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)


def seed_cli(capsys, *argv: str) -> tuple[int, str]:
    """Exit status and stderr of ``vllm-ascend netloader-seed ARGV`` (nothing may reach stdout).

    The parser is put together the way core's ``vllm-ascend`` does it, without loading every extension
    into core's registries in this process."""
    parser = argparse.ArgumentParser(prog="vllm-ascend")
    sub = parser.add_subparsers(dest="command", required=True)
    SEED_COMMAND.configure(sub.add_parser(SEED_COMMAND.name))
    try:
        status = SEED_COMMAND.run(parser.parse_args([SEED_COMMAND.name, *map(str, argv)]))
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err and err.count("\n") == 1, err
    return status, err


BAD_VALUES = [
    (["--chunk-mib", "0"], "--chunk-mib must be an integer from 1 to 1024, got 0"),
    (["--chunk-mib", "-3"], "--chunk-mib must be an integer from 1 to 1024, got -3"),
    (["--chunk-mib", "1.5"], "--chunk-mib must be an integer from 1 to 1024, got 1.5"),
    (["--chunk-mib", "4096"], "--chunk-mib must be an integer from 1 to 1024, got 4096"),
    (["--max-connections", "-1"], "--max-connections must be an integer from 1 to 4096, got -1"),
    (["--max-connections", "lots"], "--max-connections must be an integer from 1 to 4096, got lots"),
    (["--max-pending", "0"], "--max-pending must be an integer from 1 to 65536, got 0"),
    (["--max-pending-per-peer", "0"], "--max-pending-per-peer must be an integer from 1 to 65536, got 0"),
    (["--port", "70000"], "--port must be an integer from 0 to 65535, got 70000"),
    (["--port", "-1"], "--port must be an integer from 0 to 65535, got -1"),
    (["--stream-port", "http"], "--stream-port must be an integer from 0 to 65535, got http"),
    (["--port", "18080", "--stream-port", "18080"], "--port and --stream-port must differ, both are 18080"),
    (["--host", ""], "--host must be an address or host name, got an empty string"),
]
BAD_SECONDS = ["nan", "inf", "-inf", "-1", "0", "1e9", "soon"]


@pytest.mark.parametrize("argv,message", BAD_VALUES, ids=[" ".join(a) for a, _ in BAD_VALUES])
def test_bad_values(capsys, checkpoint, argv, message):
    assert seed_cli(capsys, "--checkpoint", checkpoint, *argv) == (2, f"netloader-seed: {message}\n")


def test_bad_seconds(capsys, checkpoint):
    for option in ("--timeout", "--handshake-timeout"):
        for value in BAD_SECONDS:
            assert seed_cli(capsys, "--checkpoint", checkpoint, f"{option}={value}") == (
                2,
                f"netloader-seed: {option} must be a number of seconds above 0 and at most 86400, got {value}\n",
            )


def test_argparse_mistakes_are_one_line_too(capsys, checkpoint):
    assert seed_cli(capsys) == (2, "netloader-seed: the following arguments are required: --checkpoint\n")
    assert seed_cli(capsys, "--checkpoint", checkpoint, "--chunk-mib") == (
        2,
        "netloader-seed: argument --chunk-mib: expected one argument\n",
    )
    assert seed_cli(
        capsys, "--checkpoint", checkpoint, "--timeout", "-inf"
    ) == (  # "-inf" looks like an option
        2,
        "netloader-seed: argument --timeout: expected one argument\n",
    )


def test_checkpoint_mistakes(capsys, tmp_path, checkpoint):
    def refused(path) -> str:
        status, err = seed_cli(capsys, "--checkpoint", path)
        assert status == 2
        return err

    assert (
        refused(tmp_path / "missing")
        == f"netloader-seed: --checkpoint: {tmp_path / 'missing'} does not exist\n"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    assert refused(empty) == (
        f"netloader-seed: --checkpoint: directory {empty} holds no *.safetensors files (it is empty)\n"
    )
    torch_only = tmp_path / "torch"
    torch_only.mkdir()
    for name in ("pytorch_model.bin", "config.json", "tokenizer.json", "vocab.txt"):
        (torch_only / name).write_bytes(b"{}")
    assert refused(torch_only) == (
        f"netloader-seed: --checkpoint: directory {torch_only} holds no *.safetensors files "
        "(found config.json, pytorch_model.bin, tokenizer.json, …)\n"
    )
    (checkpoint / "extra.safetensors").write_bytes(b"PK\x03\x04 not safetensors at all")
    assert refused(checkpoint) == (
        f"netloader-seed: --checkpoint: {checkpoint / 'extra.safetensors'} is not a valid safetensors file "
        "(Error while deserializing header: header too large)\n"
    )
    assert refused(torch_only / "config.json") == (
        f"netloader-seed: --checkpoint: {torch_only / 'config.json'} is not a valid safetensors file "
        "(Error while deserializing header: header too small)\n"
    )
    (checkpoint / "extra.safetensors").unlink()
    (checkpoint / "dir.safetensors").mkdir()
    assert refused(checkpoint) == (
        f"netloader-seed: --checkpoint: {checkpoint / 'dir.safetensors'} is not a regular file\n"
    )
    shutil.rmtree(checkpoint / "dir.safetensors")
    save_file({"a": torch.zeros(1)}, str(checkpoint / "model-2.safetensors"))
    assert refused(checkpoint) == (
        f"netloader-seed: --checkpoint: tensor 'a' is in both model-2.safetensors and model.safetensors "
        f"of {checkpoint}\n"
    )


def test_tls_mistakes(capsys, tmp_path, checkpoint, tls_files, other_ca):
    def refused(*argv) -> str:
        status, err = seed_cli(capsys, "--checkpoint", checkpoint, *argv)
        assert status == 2
        return err

    cert, key = tls_files["cert"], tls_files["key"]
    assert refused("--tls-cert", cert, "--tls-key", other_ca["key"]) == (
        f"netloader-seed: TLS private key file {other_ca['key']} does not belong to the certificate in {cert}\n"
    )
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    assert refused("--tls-cert", text, "--tls-key", key) == (
        f"netloader-seed: TLS certificate file {text} is not a PEM certificate "
        "(no '-----BEGIN CERTIFICATE-----' line)\n"
    )
    assert refused("--tls-cert", cert, "--tls-key", cert) == (
        f"netloader-seed: TLS private key file {cert} is not a PEM private key "
        "(no '-----BEGIN ... PRIVATE KEY-----' line)\n"
    )
    assert refused("--tls-cert", key, "--tls-key", key) == (
        f"netloader-seed: TLS certificate file {key} is not a PEM certificate (no '-----BEGIN CERTIFICATE-----' line)\n"
    )
    assert refused("--tls-cert", cert, "--tls-key", tls_files["encrypted_key"]) == (
        f"netloader-seed: TLS private key file {tls_files['encrypted_key']} is encrypted; "
        "the seed needs an unencrypted key\n"
    )
    garbled = tmp_path / "garbled.pem"
    garbled.write_text("-----BEGIN CERTIFICATE-----\nnot base64 !!\n-----END CERTIFICATE-----\n")
    err = refused("--tls-cert", garbled, "--tls-key", key)
    assert err.startswith(f"netloader-seed: cannot load TLS certificate {garbled} with key {key}: ")
    assert refused("--tls-cert", tmp_path / "nope.pem", "--tls-key", key) == (
        f"netloader-seed: cannot read the TLS certificate file {tmp_path / 'nope.pem'}: No such file or directory\n"
    )
    assert refused("--tls-key", key) == (
        "netloader-seed: TLS needs both a certificate and its private key (--tls-cert and --tls-key)\n"
    )


def test_token_mistakes(capsys, tmp_path, checkpoint, monkeypatch):
    def refused(*argv) -> str:
        status, err = seed_cli(capsys, "--checkpoint", checkpoint, *argv)
        assert status == 2
        return err

    assert refused("--token-file", tmp_path) == (
        f"netloader-seed: cannot read the netloader token file {tmp_path}: Is a directory\n"
    )
    (tmp_path / "short").write_text("abc\n")
    assert refused("--token-file", tmp_path / "short") == (
        f"netloader-seed: token file {tmp_path / 'short'}: the netloader token has 3 bytes; at least 16 are "
        "required (e.g. `openssl rand -hex 32`)\n"
    )
    monkeypatch.setenv("SEED_TOKEN", "tiny")
    assert refused("--token-env", "SEED_TOKEN") == (
        "netloader-seed: $SEED_TOKEN: the netloader token has 4 bytes; at least 16 are required "
        "(e.g. `openssl rand -hex 32`)\n"
    )
    assert refused("--host", "0.0.0.0") == (
        "netloader-seed: the seed binds to 0.0.0.0, which is not a loopback address: a shared token is required "
        f"(set {TOKEN_ENV} or pass --token-file; clients send the same token)\n"
    )


def test_ports_in_use_and_hosts_that_cannot_be_listened_on(capsys, checkpoint, monkeypatch):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert seed_cli(capsys, "--checkpoint", checkpoint, "--port", port) == (
            1,
            f"netloader-seed: --port {port}: cannot listen on 127.0.0.1:{port} for the HTTP port: "
            "the address is already in use\n",
        )
        assert seed_cli(capsys, "--checkpoint", checkpoint, "--stream-port", port) == (
            1,
            f"netloader-seed: --stream-port {port}: cannot listen on 127.0.0.1:{port} for the stream port: "
            "the address is already in use\n",
        )
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert seed_cli(capsys, "--checkpoint", checkpoint, "--host", "203.0.113.7") == (  # TEST-NET-3: not ours
        1,
        "netloader-seed: --host 203.0.113.7: cannot listen on 203.0.113.7:0 for the stream port: "
        "Cannot assign requested address\n",
    )
