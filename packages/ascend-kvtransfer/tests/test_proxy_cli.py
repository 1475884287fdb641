"""``vllm-ascend pd-proxy`` mistakes: each is one line on stderr naming the option and what it allows, status 2
(1 when the port cannot be opened), no traceback (run in-process; none of them gets as far as serving)."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys

import pytest

from vllm_ascend.kvtransfer.proxy_cli import PD_PROXY_COMMAND

P, D = "http://127.0.0.1:8100", "http://127.0.0.1:8200"


def proxy_cli(capsys, *argv: str) -> tuple[int, str]:
    """Exit status and stderr of ``vllm-ascend pd-proxy ARGV`` (nothing may reach stdout), with the parser
    put together the way core's ``vllm-ascend`` does it."""
    parser = argparse.ArgumentParser(prog="vllm-ascend")
    sub = parser.add_subparsers(dest="command", required=True)
    PD_PROXY_COMMAND.configure(sub.add_parser(PD_PROXY_COMMAND.name))
    try:
        status = PD_PROXY_COMMAND.run(parser.parse_args([PD_PROXY_COMMAND.name, *argv]))
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err and err.count("\n") == 1, err
    return status, err


URL_FORM = "http(s)://HOST:PORT"
MISTAKES = [
    (["--decode", D], "the following arguments are required: --prefill"),
    (["--prefill", P], "the following arguments are required: --decode"),
    (["--prefill", "127.0.0.1:8100", "--decode", D], f"--prefill must be {URL_FORM}, got 127.0.0.1:8100"),
    (["--prefill", "ftp://h:1", "--decode", D], f"--prefill must be {URL_FORM}, got ftp://h:1"),
    (["--prefill", "http://h", "--decode", D], f"--prefill must be {URL_FORM}, got http://h"),
    (["--prefill", "http://h:99999", "--decode", D], f"--prefill must be {URL_FORM}, got http://h:99999"),
    (["--prefill", P, "--decode", "http://h:1/v1"], f"--decode must be {URL_FORM}, got http://h:1/v1"),
    (["--prefill", P, "--decode", "http://u:pw@h:1"], f"--decode must be {URL_FORM}, got http://u:pw@h:1"),
    (
        ["--prefill", P, "--decode", D, "--decode", D + "/"],
        f"--decode must name each instance once, got {D} 2 times",
    ),
    (["--prefill", P, "--decode", D, "--port", "0"], "--port must be an integer from 1 to 65535, got 0"),
    (
        ["--prefill", P, "--decode", D, "--port", "http"],
        "--port must be an integer from 1 to 65535, got http",
    ),
    (
        ["--prefill", P, "--decode", D, "--host", ""],
        "--host must be an address or host name, got an empty string",
    ),
    (
        ["--prefill", P, "--decode", D, "--public-url", "http://h:1"],
        "--public-url is only used with --layerwise",
    ),
    (
        ["--prefill", P, "--decode", D, "--layerwise", "--public-url", "h:1"],
        f"--public-url must be {URL_FORM}, got h:1",
    ),
    (["--prefill", P, "--decode", D, "--port"], "argument --port: expected one argument"),
]


@pytest.mark.parametrize("argv,message", MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_mistakes_are_one_line_and_status_2(capsys, argv, message):
    assert proxy_cli(capsys, *argv) == (2, f"pd-proxy: {message}\n")


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e9", "soon"])
def test_bad_timeout(capsys, value):
    assert proxy_cli(capsys, "--prefill", P, "--decode", D, f"--timeout={value}") == (
        2,
        f"pd-proxy: --timeout must be a number of seconds above 0 and at most 86400, got {value}\n",
    )


def test_port_in_use_is_one_line_and_status_1(capsys):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        status, err = proxy_cli(capsys, "--prefill", P, "--decode", D, "--port", str(port))
    assert status == 1
    assert err.startswith(f"pd-proxy: --host 127.0.0.1 --port {port}: cannot listen: ")


def test_the_proxy_imports_no_vllm():
    """The proxy runs on hosts without vLLM: neither module pulls in vLLM, torch or Mooncake."""
    code = (
        "import sys, vllm_ascend.kvtransfer.proxy, vllm_ascend.kvtransfer.proxy_cli\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'vllm', 'torch', 'mooncake'}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "[]\n"), proc.stderr
