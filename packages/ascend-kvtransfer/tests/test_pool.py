"""The KV pool client and ``vllm-ascend kv-pool`` against a real ``mooncake_master`` on 127.0.0.1.

A module-scoped master serves the data tests; tests that kill or freeze a master start their own. Every
pool call is checked to return within its ``op_timeout_s``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from vllm_ascend.core.sdk import ConfigError
from vllm_ascend.kvtransfer import pool_cli
from vllm_ascend.kvtransfer.pool import KVPool, PoolConfig, PoolUnavailable
from vllm_ascend.kvtransfer.pool_cli import MasterError, find_master_binary, start_master, wait_ready

HOST = "127.0.0.1"
TIMEOUT = 3.0
SLACK = 1.0  # thread start, Python overhead


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def launch(port: int) -> subprocess.Popen[bytes]:
    proc = start_master(
        HOST, port, metrics_port=free_port(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_ready(proc, HOST, port, timeout=20)
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def master():
    port = free_port()
    proc = launch(port)
    yield f"{HOST}:{port}"
    stop(proc)


def config(master: str, **overrides) -> PoolConfig:
    values = {"global_segment_size": 32 << 20, "local_buffer_size": 8 << 20, "op_timeout_s": TIMEOUT}
    return PoolConfig(master=master, **{**values, **overrides})


@pytest.fixture(scope="module")
def pool(master):
    client = KVPool(config(master))
    yield client
    client.close()


def host_buffer(pool: KVPool, nbytes: int, seed: int = 0) -> torch.Tensor:
    """Random bytes registered with ``pool``; unregistered when the test ends (before the memory is freed:
    registering a region that overlaps a registered one fails)."""
    gen = torch.Generator().manual_seed(seed)
    tensor = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
    pool.register(tensor.data_ptr(), nbytes)
    _REGISTERED.append((pool, tensor))
    return tensor


_REGISTERED: list[tuple[KVPool, torch.Tensor]] = []


@pytest.fixture(autouse=True)
def _unregister_after_each_test():
    yield
    while _REGISTERED:
        pool, tensor = _REGISTERED.pop()
        if pool.healthy:
            pool.unregister(tensor.data_ptr())


def block_layout(tensor: torch.Tensor, block: int, layers: int, piece: int, stride: int):
    """One block's pieces: layer l's K and V at ``l * stride`` (+ ``piece``), block-major inside a layer."""
    base = tensor.data_ptr() + block * 2 * piece
    ptrs = [base + layer * stride + kv * piece for layer in range(layers) for kv in (0, 1)]
    return ptrs, [piece] * len(ptrs)


def pieces(tensor: torch.Tensor, ptrs: list[int], sizes: list[int]) -> bytes:
    start = tensor.data_ptr()
    return b"".join(
        tensor[p - start : p - start + n].numpy().tobytes() for p, n in zip(ptrs, sizes, strict=True)
    )


def timed(call):
    start = time.monotonic()
    try:
        result = call()
    except PoolUnavailable as exc:
        result = exc
    return result, time.monotonic() - start


def test_multi_buffer_round_trip(pool):
    layers, piece, blocks = 4, 512, 3
    stride = blocks * 2 * piece
    src = host_buffer(pool, layers * stride, seed=1)
    dst = host_buffer(pool, layers * stride, seed=9)
    dst.zero_()
    keys = [f"round-trip/{b}" for b in range(blocks)]
    src_layout = [block_layout(src, b, layers, piece, stride) for b in range(blocks)]
    assert pool.put(keys, [p for p, _ in src_layout], [s for _, s in src_layout]) == [True] * blocks
    # read the blocks back into other block slots, in another order
    dst_layout = [block_layout(dst, (b + 1) % blocks, layers, piece, stride) for b in range(blocks)]
    order = [2, 0, 1]
    got = pool.get(
        [keys[b] for b in order], [dst_layout[b][0] for b in order], [dst_layout[b][1] for b in order]
    )
    assert got == [True] * blocks
    for b in range(blocks):
        assert pieces(dst, *dst_layout[b]) == pieces(src, *src_layout[b])


def test_exists(pool):
    src = host_buffer(pool, 4096, seed=2)
    assert pool.put(["exists/a"], [[src.data_ptr()]], [[4096]]) == [True]
    assert pool.exists(["exists/a", "exists/never-put", "exists/a"]) == [True, False, True]
    assert pool.exists([]) == []


def test_put_twice_is_not_an_error_and_keeps_the_first_bytes(pool):
    src = host_buffer(pool, 2048, seed=3)
    dst = host_buffer(pool, 1024, seed=4)
    first = src[:1024].clone()
    assert pool.put(["twice"], [[src.data_ptr()]], [[1024]]) == [True]
    assert pool.put(["twice"], [[src.data_ptr() + 1024]], [[1024]]) == [True]
    assert pool.get(["twice"], [[dst.data_ptr()]], [[1024]]) == [True]
    assert torch.equal(dst, first)


def test_missing_key_and_wrong_size_are_false_fast_and_leave_buffers(pool):
    src = host_buffer(pool, 1024, seed=5)
    dst = host_buffer(pool, 4096, seed=6)
    before = dst.clone()
    assert pool.put(["sized"], [[src.data_ptr()]], [[1024]]) == [True]
    p = dst.data_ptr()
    result, took = timed(
        lambda: pool.get(
            ["missing", "sized", "sized"], [[p], [p + 1024], [p + 2048, p + 3000]], [[64], [512], [512, 1024]]
        )
    )
    assert result == [False, False, False]
    assert took < 1.0
    assert torch.equal(dst, before)
    assert pool.healthy


def test_bad_batches_are_refused_by_name(pool):
    with pytest.raises(ValueError, match="get needs one ptrs list and one sizes list per key"):
        pool.get(["a", "b"], [[1]], [[1]])
    with pytest.raises(ValueError, match="put key 'a' needs as many buffers as sizes"):
        pool.put(["a"], [[1, 2]], [[1]])
    with pytest.raises(ValueError, match="put key 'a' has a buffer size <= 0"):
        pool.put(["a"], [[1]], [[0]])
    assert pool.put([], [], []) == []


CHILD = textwrap.dedent(
    """
    import sys, torch
    from vllm_ascend.kvtransfer.pool import KVPool, PoolConfig
    pool = KVPool(PoolConfig(master=sys.argv[1], global_segment_size=0, local_buffer_size=1 << 20, op_timeout_s=5))
    out = torch.zeros(3000, dtype=torch.uint8)
    pool.register(out.data_ptr(), out.numel())
    p = out.data_ptr()
    print(pool.exists(["shared/a", "shared/none"]))
    print(pool.get(["shared/a", "shared/none"], [[p, p + 1000], [p + 2000]], [[1000, 1000], [10]]))
    print(out[:2000].numpy().tobytes().hex())
    pool.close()
    """
)


def test_a_client_in_another_process_reads_the_keys(pool, master):
    src = host_buffer(pool, 4096, seed=7)
    p = src.data_ptr()
    assert pool.put(["shared/a"], [[p + 100, p + 3000]], [[1000, 1000]]) == [True]
    proc = subprocess.run([sys.executable, "-c", CHILD, master], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    exists, got, data = proc.stdout.splitlines()
    assert (exists, got) == ("[True, False]", "[True, False]")
    assert bytes.fromhex(data) == src[100:1100].numpy().tobytes() + src[3000:4000].numpy().tobytes()


def test_master_killed_calls_are_bounded_and_pool_recovers():
    port = free_port()
    proc = launch(port)
    try:
        client = KVPool(config(f"{HOST}:{port}"))
        buf = host_buffer(client, 8192, seed=8)
        p = buf.data_ptr()
        assert client.put(["killed/a"], [[p, p + 1000]], [[1000, 1000]]) == [True]
        stop(proc)
        calls = {
            "exists": lambda: client.exists(["killed/a"]),
            "get": lambda: client.get(["killed/a"], [[p + 4000, p + 5000]], [[1000, 1000]]),
            "put": lambda: client.put(["killed/b"], [[p]], [[1000]]),
        }
        for name, call in calls.items():
            result, took = timed(call)
            assert isinstance(result, PoolUnavailable) or result == [False], (name, result)
            assert took < TIMEOUT + SLACK, (name, took)
            assert not client.healthy, name
        assert f"{HOST}:{port}" in str(timed(calls["get"])[0])
        # the master comes back on the same port: the pool is healthy again (the old keys are gone)
        proc = launch(port)
        deadline = time.monotonic() + 20
        while not client.reconnect() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert client.healthy
        # until the client has mounted its segment on the new master the pool has no room: puts answer False
        while (
            timed(lambda: client.put(["killed/c"], [[p]], [[1000]]))[0] != [True]
            and time.monotonic() < deadline
        ):
            time.sleep(0.5)
            client.reconnect()
        assert client.exists(["killed/a", "killed/c"]) == [False, True]
        assert client.get(["killed/c"], [[p + 6000]], [[1000]]) == [True]
        stop(proc)
        timed(lambda: client.exists(["killed/c"]))
        assert not client.healthy
        _, took = timed(client.close)
        assert took < 1.0
    finally:
        stop(proc)


def test_unreachable_master_at_construction():
    address = f"{HOST}:{free_port()}"
    result, took = timed(lambda: KVPool(config(address, op_timeout_s=2.0)))
    assert isinstance(result, PoolUnavailable)
    assert address in str(result) and "cannot connect" in str(result)
    assert took < 2.0 + SLACK


def test_frozen_master_at_construction():
    """A master that accepts connections but never answers (SIGSTOP): Mooncake's setup would block for
    minutes holding the GIL; the pool gives up within op_timeout_s."""
    port = free_port()
    proc = launch(port)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        ticks = []
        ticker = threading.Thread(
            target=lambda: [ticks.append(time.sleep(0.05)) for _ in range(40)], daemon=True
        )
        ticker.start()
        result, took = timed(lambda: KVPool(config(f"{HOST}:{port}", op_timeout_s=2.0)))
        assert isinstance(result, PoolUnavailable)
        assert f"{HOST}:{port}" in str(result) and "did not answer" in str(result)
        assert took < 2.0 + SLACK
        ticker.join(timeout=5)
        assert len(ticks) == 40  # other threads ran meanwhile: nothing held the GIL
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        stop(proc)


CONFIG_MISTAKES = [
    (
        {"master": "localhost"},
        "kv pool master must be HOST:PORT with a port from 1 to 65535, got 'localhost'",
    ),
    ({"master": "h:0"}, "kv pool master must be HOST:PORT"),
    ({"master": "h:1", "protocol": "udp"}, "kv pool protocol must be one of tcp, rdma, ascend, got 'udp'"),
    ({"master": "h:1", "op_timeout_s": 0}, "kv pool op_timeout_s must be a number of seconds above 0"),
    ({"master": "h:1", "op_timeout_s": float("nan")}, "kv pool op_timeout_s must be a number of seconds"),
    ({"master": "h:1", "global_segment_size": -1}, "kv pool global_segment_size must be an integer number"),
    ({"master": "h:1", "local_hostname": ""}, "kv pool local_hostname must be a non-empty string"),
]


@pytest.mark.parametrize("values,message", CONFIG_MISTAKES, ids=[m for _, m in CONFIG_MISTAKES])
def test_config_mistakes_name_the_field_and_allowed_values(values, message):
    with pytest.raises(ConfigError) as info:
        PoolConfig(**values)
    assert str(info.value).startswith(message)


def test_from_extra_config_reads_upstream_names_and_sizes():
    cfg = PoolConfig.from_extra_config(
        {"master_server_address": "10.0.0.1:50088", "global_segment_size": "1GB", "local_buffer_size": 4096},
        other_keys=("lookup_rpc_port",),
    )
    assert cfg == PoolConfig(
        master="10.0.0.1:50088", global_segment_size=1 << 30, local_buffer_size=4096, protocol="tcp"
    )
    assert PoolConfig.from_extra_config({"master": "h:1", "op_timeout_s": 2.5}).op_timeout_s == 2.5


EXTRA_MISTAKES = [
    ({"master": "h:1", "backend": "x"}, "kv pool config key(s) 'backend' not supported; allowed: master, "),
    (
        {},
        "kv pool master (HOST:PORT of mooncake_master) is required; give it as master, master_server_address",
    ),
    (
        {"master": "h:1", "mooncake_master": "h:2"},
        "kv pool master is given twice, as 'master' and 'mooncake_master'",
    ),
    ({"master": "h:1", "global_segment_size": "1XB"}, "kv pool global_segment_size must be a byte count"),
    ({"master_server_address": "nohost"}, "kv pool master must be HOST:PORT"),
]


@pytest.mark.parametrize("extra,message", EXTRA_MISTAKES, ids=[m[:40] for _, m in EXTRA_MISTAKES])
def test_from_extra_config_mistakes(extra, message):
    with pytest.raises(ConfigError) as info:
        PoolConfig.from_extra_config(extra)
    assert str(info.value).startswith(message)
    if "master_server_address" in extra:
        assert "(master was given as 'master_server_address')" in str(info.value)


def test_kv_pool_command_starts_reports_and_stops_on_sigterm():
    port, metrics = free_port(), free_port()
    command = [sys.executable, "-m", "vllm_ascend.core.cli", "kv-pool", "--host", HOST, "--port", str(port)]
    command += ["--metrics-port", str(metrics), "--eviction-high-watermark-ratio", "0.8"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = [None]
        reader = threading.Thread(target=lambda: line.__setitem__(0, proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout=60)
        assert line[0] == f"kv-pool master at {HOST}:{port}\n"
        with socket.create_connection((HOST, port), timeout=2):
            pass
        client = KVPool(config(f"{HOST}:{port}", global_segment_size=0))
        assert client.exists(["cli/none"]) == [False]
        client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def kv_pool_command(*argv: str) -> subprocess.CompletedProcess[str]:
    """``vllm-ascend kv-pool ARGV`` run to its end, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "vllm_ascend.core.cli", "kv-pool", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--port", "0"], "kv-pool: --port must be an integer from 1 to 65535, got 0\n"),
        (
            ["--port", "7", "--metrics-port", "7"],
            "kv-pool: --metrics-port must differ from --port, both are 7\n",
        ),
        (
            ["--eviction-ratio", "2"],
            "kv-pool: --eviction-ratio must be a number above 0 and at most 1, got 2\n",
        ),
        (
            ["--master-flag", "x"],
            "kv-pool: --master-flag must be NAME=VALUE with a mooncake_master flag name, got x\n",
        ),
    ],
)
def test_kv_pool_command_mistakes(argv, message):
    proc = kv_pool_command(*argv)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", message)


def test_kv_pool_command_reports_a_taken_port():
    with socket.create_server((HOST, 0)) as taken:
        port = taken.getsockname()[1]
        proc = kv_pool_command("--port", str(port), "--metrics-port", str(free_port()))
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.startswith(f"kv-pool: --host {HOST} --port {port}: cannot listen: ")


def test_kv_pool_command_reports_a_master_that_exits():
    """The metrics port is taken: the master exits 1 before listening, and the command says so."""
    port = free_port()
    with socket.create_server((HOST, 0)) as taken:
        metrics = taken.getsockname()[1]
        proc = kv_pool_command("--port", str(port), "--metrics-port", str(metrics))
    assert (proc.returncode, proc.stdout) == (1, "")
    assert f"kv-pool: mooncake_master exited with status 1 before listening on {HOST}:{port}\n" in proc.stderr


def test_missing_master_binary_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(pool_cli.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(pool_cli.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MasterError, match=r"mooncake_master not found .*install vllm-ascend\[kvtransfer\]"):
        find_master_binary()


def test_pool_modules_import_no_vllm():
    code = (
        "import sys, vllm_ascend.kvtransfer.pool, vllm_ascend.kvtransfer.pool_cli\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'vllm', 'mooncake'}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "[]\n"), proc.stderr
