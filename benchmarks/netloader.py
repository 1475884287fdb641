"""netloader transfer throughput over loopback vs raw TCP, raw TLS and torch.distributed gloo ceilings.

One synthetic state dict (``--mib`` MiB of float32 in ``--tensors`` tensors) is moved over 127.0.0.1
in the same run by:

- raw TCP: a thread ``sendall``s every tensor's memory, the receiver ``recv_into``s a preallocated buffer
  (no framing, no checksums: the socket ceiling);
- raw TLS: the same through stdlib ``ssl`` (the ceiling for an encrypted channel);
- gloo: ``torch.distributed`` send/recv of the tensors between two processes (gloo backend, TCP);
- netloader: a seed (``SeedServer``) and ``SeedClient.fetch_into`` into preallocated tensors (framing,
  sha256 of every tensor on the client) — plain, with a token, with TLS, with token + TLS.

Each row is the best of ``--repeats`` runs (GB/s = 1e9 bytes/s). The seed's own start-up hashing is not
timed. Certificates for the TLS rows are made with the ``openssl`` CLI in a temporary directory.
Run: ``uv run --no-sync python benchmarks/netloader.py [--mib 512] [--write benchmarks/RESULTS-netloader.md]``.
"""

from __future__ import annotations

import argparse
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _report import machine, write_measured_table

from vllm_ascend.netloader.client import SeedClient
from vllm_ascend.netloader.security import ServerSecurity
from vllm_ascend.netloader.seed_server import SeedServer

TOKEN = b"benchmark-token-0123456789abcdef"


def make_state_dict(mib: int, tensors: int) -> dict[str, torch.Tensor]:
    per = (mib << 20) // tensors // 4
    g = torch.Generator().manual_seed(0)
    return {f"layers.{i}.weight": torch.rand(per, generator=g) for i in range(tensors)}


def byte_views(state_dict: dict[str, torch.Tensor]) -> list[memoryview]:
    return [memoryview(t.view(torch.uint8).numpy()).cast("B") for t in state_dict.values()]


def make_certs(root: Path) -> dict[str, str]:
    """A throwaway CA and a 127.0.0.1 certificate it signed."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=root, check=True, capture_output=True)

    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=bench-ca")
    openssl("req", *ec, "-keyout", "seed.key", "-out", "seed.csr", "-subj", "/CN=127.0.0.1")
    (root / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl(
        "x509", "-req", "-in", "seed.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "seed.pem", "-days", "1", "-extfile", "ext.cnf",
    )  # fmt: skip
    return {"ca": str(root / "ca.pem"), "cert": str(root / "seed.pem"), "key": str(root / "seed.key")}


def raw_copy(views: list[memoryview], certs: dict[str, str] | None = None) -> float:
    """Seconds to move ``views`` over one loopback connection (TLS when ``certs``)."""
    listener = socket.create_server(("127.0.0.1", 0))
    total = sum(v.nbytes for v in views)
    sink = memoryview(bytearray(min(total, 64 << 20)))

    def send() -> None:
        conn, _ = listener.accept()
        if certs is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certs["cert"], certs["key"])
            conn = context.wrap_socket(conn, server_side=True)
        with conn:
            for view in views:
                conn.sendall(view)

    sender = threading.Thread(target=send)
    sender.start()
    conn = socket.create_connection(("127.0.0.1", listener.getsockname()[1]))
    if certs is not None:
        conn = ssl.create_default_context(cafile=certs["ca"]).wrap_socket(conn, server_hostname="127.0.0.1")
    started = time.perf_counter()
    got = 0
    with conn:
        while got < total:
            n = conn.recv_into(sink[: min(len(sink), total - got)])
            if n == 0:
                raise RuntimeError(f"raw copy ended after {got} of {total} bytes")
            got += n
    seconds = time.perf_counter() - started
    sender.join()
    listener.close()
    return seconds


def _gloo_rank(rank: int, port: int, sizes: list[int], repeats: int, result: mp.SimpleQueue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tensors = [torch.ones(n) if rank == 1 else torch.empty(n) for n in sizes]
    best = float("inf")
    for _ in range(repeats):
        dist.barrier()
        started = time.perf_counter()
        for t in tensors:
            dist.send(t, 1 - rank) if rank == 1 else dist.recv(t, 1 - rank)
        best = min(best, time.perf_counter() - started)
    dist.barrier()
    if rank == 0:
        result.put(best)
    dist.destroy_process_group()


def gloo_copy(state_dict: dict[str, torch.Tensor], repeats: int) -> float:
    """Best seconds for gloo send/recv of tensors of the same sizes between two processes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    result = ctx.SimpleQueue()
    sizes = [t.numel() for t in state_dict.values()]
    procs = [ctx.Process(target=_gloo_rank, args=(r, port, sizes, repeats, result)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        if p.exitcode != 0:
            raise RuntimeError(f"gloo rank exited with {p.exitcode}")
    return result.get()


def netloader_copy(
    state_dict: dict[str, torch.Tensor], security: ServerSecurity, client: dict, repeats: int
) -> float:
    targets = {n: torch.empty_like(t) for n, t in state_dict.items()}
    best = float("inf")
    with SeedServer.serving(state_dict, security=security) as seed:
        for _ in range(repeats):
            with SeedClient(seed.url, **client) as c:
                c.fetch_manifest()
                started = time.perf_counter()
                c.fetch_into(targets)
                best = min(best, time.perf_counter() - started)
    if not all(torch.equal(targets[n], state_dict[n]) for n in state_dict):
        raise RuntimeError("netloader delivered different bytes")
    return best


def best_of(repeats: int, run: Callable[[], float]) -> float:
    return min(run() for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=512, help="state dict size, MiB (default: %(default)s)")
    parser.add_argument("--tensors", type=int, default=32, help="tensors in it (default: %(default)s)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs per row, best kept (default: %(default)s)"
    )
    parser.add_argument("--write", type=Path, help="also write the table into this markdown file")
    args = parser.parse_args()

    state_dict = make_state_dict(args.mib, args.tensors)
    total = sum(t.numel() * t.element_size() for t in state_dict.values())
    views = byte_views(state_dict)
    with tempfile.TemporaryDirectory() as tmp:
        certs = make_certs(Path(tmp))
        tls = {"cert": certs["cert"], "key": certs["key"]}
        rows: list[tuple[str, float]] = [
            ("raw TCP socket copy (ceiling)", best_of(args.repeats, lambda: raw_copy(views))),
            ("raw TLS socket copy (ceiling)", best_of(args.repeats, lambda: raw_copy(views, certs))),
            ("torch.distributed gloo send/recv (ceiling)", gloo_copy(state_dict, args.repeats)),
            ("netloader, no auth, no TLS", netloader_copy(state_dict, ServerSecurity(), {}, args.repeats)),
            (
                "netloader, token",
                netloader_copy(state_dict, ServerSecurity(TOKEN), {"token": TOKEN}, args.repeats),
            ),
            (
                "netloader, TLS",
                netloader_copy(
                    state_dict, ServerSecurity(None, **_files(tls)), {"ca_file": certs["ca"]}, args.repeats
                ),
            ),
            (
                "netloader, token + TLS",
                netloader_copy(
                    state_dict,
                    ServerSecurity(TOKEN, **_files(tls)),
                    {"token": TOKEN, "ca_file": certs["ca"]},
                    args.repeats,
                ),
            ),
        ]
    raw_tcp = total / rows[0][1]
    lines = [
        f"{total / 2**20:.0f} MiB in {len(state_dict)} tensors over 127.0.0.1, best of {args.repeats}; {machine()}",
        "",
        "| transfer | seconds | GB/s | vs raw TCP |",
        "|---|---:|---:|---:|",
        *(
            f"| {name} | {seconds:.3f} | {total / seconds / 1e9:.2f} | {total / seconds / raw_tcp:.0%} |"
            for name, seconds in rows
        ),
    ]
    print("\n".join(lines))
    if args.write is not None:
        write_measured_table(args.write, "\n".join(lines))


def _files(tls: dict[str, str]) -> dict[str, str]:
    return {"certfile": tls["cert"], "keyfile": tls["key"]}


if __name__ == "__main__":
    main()
