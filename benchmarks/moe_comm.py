"""Bytes and time per MoE step of the reference MoE communication methods vs gloo's bandwidth, same run.

``W`` gloo processes on 127.0.0.1 (VLLM_ASCEND_DEVICE=reference) run one synthetic MoE layer step
(float32, ``--hidden``, ``--experts-per-rank`` SwiGLU experts per rank of ``--inter``, top-``--top-k``
softmax routing of random logits, the same tokens per rank) for each tokens-per-rank value, through
``vllm_ascend.runner.ops.moe_comm``:

- ``allgather``: what serving does around ``allgather_experts``, done here explicitly: vLLM's AgRs
  dispatch all-gathers every rank's hidden states and router logits (``all_gather_single``), each rank
  routes every token and computes its experts' share, and vLLM's combine reduce-scatters the partial
  outputs (``reduce_scatter_single``) back to each rank's tokens;
- ``alltoall``: ``alltoall_experts`` (a counts all-to-all, then the token copies there and back);
- ``mc2 cap C``: ``mc2_experts`` over the reference ``moe_distribute_dispatch``/``combine``, every
  rank padded to a per-rank capacity ``C``: the serving decode capacity (``mc2_capacity`` of
  ``--max-num-seqs``, only for steps that fit) and the forced one (every step's: the largest tokens value).

Bytes: every ``torch.distributed`` collective the step issues goes through a counting shim while it
runs (a collective the shim does not know fails the run). Per rank, excluding the chunk a rank keeps
for itself: all-to-all = the split sizes' rows to / from the peers; all-gather = own input to each peer,
the others' parts in; reduce-scatter = the peers' chunks of the input out, ``W - 1`` chunks in;
all-reduce = a ring's ``2 (W - 1) / W`` of the tensor each way. Columns show the largest rank's.

Bandwidth, measured in the same processes before the steps: ``p2p`` = every rank ``isend``s a buffer
to every peer and ``irecv``s one from each at once (the exchange pattern of a MoE step), ``a2a`` = an
equal-split ``all_to_all_single``; per-rank bytes sent / median time of the slowest rank, the best of
``--bw-sizes``; latency = median time of an ``all_to_all_single`` of 4 bytes per peer.

Each step: a barrier, then routing + communication + experts timed; the step's time is the slowest
rank's; the median over ``--steps`` steps; "in collectives" is the slowest rank's time inside the
counted collectives (waiting for peers included). "experts alone" times routing + experts of the rank's own
tokens in one process (the same copies, no communication). Every method's output is checked once per
configuration against that one-process all-experts oracle (within 1e-4) and the run fails if one differs.
Run: ``uv run --no-sync python benchmarks/moe_comm.py [--quick] [--write benchmarks/RESULTS-moe-comm.md]``.
"""

from __future__ import annotations

import os

os.environ["VLLM_ASCEND_DEVICE"] = "reference"

import argparse
import contextlib
import inspect
import math
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _report import machine, write_measured_table

from vllm_ascend.core.device.config import get_device_adaptor
from vllm_ascend.runner.ops.moe_comm import (
    allgather_experts,
    alltoall_experts,
    mc2_capacity,
    mc2_experts,
)

TOLERANCE = 1e-4
#: Collectives a MoE step may issue whose bytes the shim counts; any other one fails the run.
COUNTED = (
    "all_to_all_single", "all_gather_single", "all_gather_into_tensor", "reduce_scatter_single",
    "reduce_scatter_tensor", "all_reduce",
)  # fmt: skip
UNCOUNTED = (
    "all_gather", "all_to_all", "broadcast", "reduce", "reduce_scatter", "gather", "scatter", "send", "recv",
    "isend", "irecv", "batch_isend_irecv", "barrier", "all_gather_object", "broadcast_object_list",
)  # fmt: skip


# -- counting shim ---------------------------------------------------------------------------------------
@dataclass
class Traffic:
    """Bytes this rank sent to and received from its peers, the collectives issued and the time in them."""

    sent: int = 0
    recv: int = 0
    calls: dict[str, int] = field(default_factory=dict)
    seconds: float = field(default=0.0, compare=False)

    def add(self, name: str, sent: int, recv: int) -> None:
        self.sent += sent
        self.recv += recv
        self.calls[name] = self.calls.get(name, 0) + 1


def _row_bytes(t: torch.Tensor) -> int:
    return math.prod(t.shape[1:]) * t.element_size()


def _splits(given: list[int] | None, rows: int, world: int) -> list[int]:
    return list(given) if given else [rows // world] * world


def _peer_bytes(name: str, a: dict[str, Any]) -> tuple[int, int]:
    """(sent, received) bytes of one collective for the calling rank, its own chunk excluded."""
    group = a.get("group")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if name == "all_to_all_single":
        out, inp = a["output"], a["input"]
        ins = _splits(a.get("input_split_sizes"), inp.shape[0], world)
        outs = _splits(a.get("output_split_sizes"), out.shape[0], world)
        return (sum(ins) - ins[rank]) * _row_bytes(inp), (sum(outs) - outs[rank]) * _row_bytes(out)
    if name in ("all_gather_single", "all_gather_into_tensor"):
        inp, out = a["input_tensor"], a["output_tensor"]
        return inp.nbytes * (world - 1), out.nbytes - inp.nbytes
    if name in ("reduce_scatter_single", "reduce_scatter_tensor"):
        inp, out = a["input"], a["output"]
        return inp.nbytes - out.nbytes, out.nbytes * (world - 1)
    ring = a["tensor"].nbytes * 2 * (world - 1) // world  # all_reduce
    return ring, ring


@contextlib.contextmanager
def counting(traffic: Traffic) -> Iterator[None]:
    """Count the bytes of every collective called through ``torch.distributed`` inside the block."""
    originals = {name: getattr(dist, name) for name in COUNTED + UNCOUNTED if hasattr(dist, name)}
    inside = [False]  # a collective implemented with another is counted once

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(fn)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if inside[0]:
                return fn(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            traffic.add(name, *_peer_bytes(name, bound.arguments))
            inside[0] = True
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                traffic.seconds += time.perf_counter() - started
                inside[0] = False

        return wrapper

    def refused(name: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(
                f"the MoE step called torch.distributed.{name}, which the byte counter does not count"
            )

        return wrapper

    for name, fn in originals.items():
        setattr(dist, name, counted(name, fn) if name in COUNTED else refused(name))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


# -- gloo's bandwidth --------------------------------------------------------------------------------------
def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _timed(fn: Callable[[], None], repeats: int) -> float:
    """Median over ``repeats`` of the slowest rank's time of ``fn`` (after a barrier)."""
    times = []
    for _ in range(repeats):
        dist.barrier()
        started = time.perf_counter()
        fn()
        times.append(_slowest(time.perf_counter() - started))
    return statistics.median(times)


def _exchange(send: torch.Tensor, recv: dict[int, torch.Tensor]) -> None:
    """``send`` to every peer and one buffer from each, all at once (isend/irecv)."""
    reqs = [dist.isend(send, p) for p in recv] + [dist.irecv(buf, p) for p, buf in recv.items()]
    for r in reqs:
        r.wait()


def gloo_bandwidth(sizes: list[int], repeats: int) -> dict[str, float]:
    """Best sustained per-rank MB/s of the all-peers isend/irecv exchange and of all_to_all_single."""
    world, rank = dist.get_world_size(), dist.get_rank()
    best = {"p2p": 0.0, "a2a": 0.0}
    for size in sizes:
        send = torch.ones(size // 4)
        recv = {p: torch.empty(size // 4) for p in range(world) if p != rank}
        a2a_in, a2a_out = torch.ones(world * (size // 4)), torch.empty(world * (size // 4))
        sent = size * (world - 1)
        p2p_s = _timed(lambda send=send, recv=recv: _exchange(send, recv), repeats)
        a2a_s = _timed(lambda o=a2a_out, i=a2a_in: dist.all_to_all_single(o, i), repeats)
        best["p2p"] = max(best["p2p"], sent / p2p_s / 1e6)
        best["a2a"] = max(best["a2a"], sent / a2a_s / 1e6)
    tiny_in, tiny_out = torch.ones(world), torch.empty(world)
    best["latency_ms"] = _timed(lambda: dist.all_to_all_single(tiny_out, tiny_in), 4 * repeats) * 1e3
    return best


# -- the MoE step ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    hidden: int
    inter: int
    local: int
    top_k: int


def _experts(w13: torch.Tensor, w2: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    ad = get_device_adaptor()

    def run(rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return ad.grouped_matmul(ad.swiglu(ad.grouped_matmul(rows, w13, counts)), w2, counts)

    return run


def _problem(shape: Shape, world: int, tokens: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every rank's tokens and router logits (the same on every process)."""
    gen = torch.Generator().manual_seed(1000 + tokens)
    xs = [torch.randn(tokens, shape.hidden, generator=gen) for _ in range(world)]
    logits = [torch.randn(tokens, world * shape.local, generator=gen) for _ in range(world)]
    return xs, logits


def _weights(shape: Shape, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    experts = world * shape.local
    w13 = torch.randn(experts, shape.hidden, 2 * shape.inter, generator=gen) / shape.hidden**0.5
    w2 = torch.randn(experts, shape.inter, shape.hidden, generator=gen) / shape.inter**0.5
    return w13, w2


def _methods(shape: Shape, tokens: int, capacities: list[int]) -> dict[str, Callable[..., torch.Tensor]]:
    """``name -> step(x, logits, experts)``: the full MoE output of this rank's tokens ``x``."""
    ad = get_device_adaptor()
    world, rank, group = dist.get_world_size(), dist.get_rank(), dist.group.WORLD

    def allgather(
        x: torch.Tensor, logits: torch.Tensor, experts: Callable[..., torch.Tensor]
    ) -> torch.Tensor:
        every_x = x.new_empty(world * x.shape[0], x.shape[1])
        every_logits = logits.new_empty(world * logits.shape[0], logits.shape[1])
        dist.all_gather_single(every_x, x)
        dist.all_gather_single(every_logits, logits)
        weights, ids = ad.moe_gating_top_k(every_logits, shape.top_k)
        ids = ids.long()
        local_ids = torch.where(ids // shape.local == rank, ids % shape.local, -1)
        share = allgather_experts(every_x, local_ids, weights, shape.local, experts)
        out = share.new_empty(x.shape[0], share.shape[1])
        dist.reduce_scatter_single(out, share)
        return out

    def alltoall(x: torch.Tensor, logits: torch.Tensor, experts: Callable[..., torch.Tensor]) -> torch.Tensor:
        weights, ids = ad.moe_gating_top_k(logits, shape.top_k)
        return alltoall_experts(x, ids.long(), weights, shape.local, experts, group)

    def mc2(capacity: int) -> Callable[..., torch.Tensor]:
        def step(x: torch.Tensor, logits: torch.Tensor, experts: Callable[..., torch.Tensor]) -> torch.Tensor:
            weights, ids = ad.moe_gating_top_k(logits, shape.top_k)
            return mc2_experts(x, ids.long(), weights, shape.local, experts, group, capacity)

        return step

    methods = {"allgather": allgather, "alltoall": alltoall}
    methods.update({f"mc2 cap {c}": mc2(c) for c in capacities if tokens <= c})
    return methods


def _oracle(
    shape: Shape, x: torch.Tensor, logits: torch.Tensor, experts: Callable[..., torch.Tensor]
) -> torch.Tensor:
    """Every expert in this process: routing and experts of ``x`` without communication."""
    ad = get_device_adaptor()
    weights, ids = ad.moe_gating_top_k(logits, shape.top_k)
    sorted_x, row_idx, counts = ad.moe_init_routing(x, ids, logits.shape[1])
    return ad.moe_finalize_routing(experts(sorted_x, counts), row_idx, weights)


def _rank_main(rank: int, world: int, port: int, args: argparse.Namespace, result: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        shape = Shape(args.hidden, args.inter, args.experts_per_rank, args.top_k)
        bandwidth = gloo_bandwidth(args.bw_sizes, args.bw_repeats)
        w13, w2 = _weights(shape, world)
        every_expert = _experts(w13, w2)
        mine = slice(rank * shape.local, (rank + 1) * shape.local)
        experts = _experts(w13[mine].contiguous(), w2[mine].contiguous())
        rows = []
        for tokens in args.tokens:
            xs, logits = _problem(shape, world, tokens)
            x, lg = xs[rank], logits[rank]
            expected = _oracle(shape, x, lg, every_expert)
            alone = _timed(lambda x=x, lg=lg: _oracle(shape, x, lg, every_expert), args.steps)
            for name, step in _methods(shape, tokens, args.capacities).items():
                error = (step(x, lg, experts) - expected).abs().max().item()
                worst = _slowest(error)
                if not worst <= TOLERANCE:
                    raise RuntimeError(
                        f"{name} at {world} ranks, {tokens} tokens/rank differs from the one-process oracle "
                        f"by {worst:.3g} (> {TOLERANCE})"
                    )
                traffics, times, in_comm = [], [], []
                for _ in range(args.steps):
                    traffic = Traffic()
                    dist.barrier()
                    started = time.perf_counter()
                    with counting(traffic):
                        step(x, lg, experts)
                    times.append(_slowest(time.perf_counter() - started))
                    in_comm.append(_slowest(traffic.seconds))
                    traffics.append(traffic)
                if any(t != traffics[0] for t in traffics):
                    raise RuntimeError(f"{name}: the same step moved different bytes on repeats")
                most = torch.tensor([traffics[0].sent, traffics[0].recv], dtype=torch.float64)
                dist.all_reduce(most, op=dist.ReduceOp.MAX)
                rows.append(
                    {
                        "tokens": tokens,
                        "method": name,
                        "calls": traffics[0].calls,
                        "sent": int(most[0]),
                        "recv": int(most[1]),
                        "median_ms": statistics.median(times) * 1e3,
                        "comm_ms": statistics.median(in_comm) * 1e3,
                        "alone_ms": alone * 1e3,
                        "error": worst,
                    }
                )
        if rank == 0:
            result.put({"world": world, "bandwidth": bandwidth, "rows": rows})
    finally:
        dist.destroy_process_group()


def run_world(world: int, args: argparse.Namespace) -> dict[str, Any]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    result = ctx.SimpleQueue()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, args, result)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=args.timeout)
    failed = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
    for p in procs:
        if p.is_alive():
            p.kill()
    if failed:
        raise RuntimeError(f"{world} ranks: rank(s) exited with {failed} (None: still running at --timeout)")
    return result.get()


# -- report ------------------------------------------------------------------------------------------------
def _calls(calls: dict[str, int]) -> str:
    short = {
        "all_to_all_single": "a2a",
        "all_gather_single": "ag",
        "all_gather_into_tensor": "ag",
        "reduce_scatter_single": "rs",
        "reduce_scatter_tensor": "rs",
        "all_reduce": "ar",
    }
    return " + ".join(f"{n}×{short[name]}" for name, n in calls.items())


def table(runs: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"float32, hidden {args.hidden}, {args.experts_per_rank} experts/rank × inter {args.inter}, "
        f"top-{args.top_k}; median of {args.steps} steps; {machine()}",
        "",
    ]
    for run in runs:
        bw = run["bandwidth"]
        lines.append(
            f"- {run['world']} ranks: gloo p2p exchange {bw['p2p']:.0f} MB/s, all_to_all_single "
            f"{bw['a2a']:.0f} MB/s per rank (best of {', '.join(_size(s) for s in args.bw_sizes)} per peer); "
            f"all_to_all_single latency {bw['latency_ms']:.2f} ms"
        )
    lines += [
        "",
        "| ranks | tokens/rank | method | collectives | KiB sent/rank | KiB recv/rank | bytes ÷ p2p BW ms "
        "| bytes ÷ a2a BW ms | + calls × latency ms | in collectives ms | measured step ms | experts alone ms |",
        "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        bw = run["bandwidth"]
        for row in run["rows"]:
            moved = max(row["sent"], row["recv"])
            calls = sum(row["calls"].values())
            a2a_ms = moved / bw["a2a"] / 1e3
            lines.append(
                f"| {run['world']} | {row['tokens']} | {row['method']} | {_calls(row['calls'])} "
                f"| {row['sent'] / 1024:,.1f} | {row['recv'] / 1024:,.1f} | {moved / bw['p2p'] / 1e3:.2f} "
                f"| {a2a_ms:.2f} | {a2a_ms + calls * bw['latency_ms']:.2f} | {row['comm_ms']:.2f} | {row['median_ms']:.2f} "
                f"| {row['alone_ms']:.2f} |"
            )
    return "\n".join(lines)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 ranks, hidden 512, 3 token counts, 3 steps")
    parser.add_argument("--ranks", type=_ints, default=[2, 4], help="world sizes (default: 2,4)")
    parser.add_argument("--tokens", type=_ints, default=[1, 8, 64, 256, 1024], help="tokens per rank")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument(
        "--inter", type=int, default=64, help="expert intermediate size (small: comm dominates)"
    )
    parser.add_argument("--experts-per-rank", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--max-num-seqs", type=int, default=256, help="sets the serving MC2 decode capacity")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per row (median)")
    parser.add_argument("--bw-sizes", type=_ints, default=[1 << 18, 1 << 22, 1 << 25], help="bytes per peer")
    parser.add_argument("--bw-repeats", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per world size")
    parser.add_argument("--write", type=Path, help="also write the table into this markdown file")
    args = parser.parse_args()
    if args.quick:
        args.ranks, args.tokens, args.hidden, args.steps = [2], [1, 16, 128], 512, 3
        args.max_num_seqs, args.bw_sizes, args.bw_repeats = 16, [1 << 16, 1 << 20], 3
    largest = max(args.tokens)
    args.capacities = sorted(
        {mc2_capacity(args.max_num_seqs, 1, largest, forced=False), mc2_capacity(1, 1, largest, forced=True)}
    )
    runs = [run_world(world, args) for world in args.ranks]
    text = table(runs, args)
    print(f"$ {' '.join(['python', *sys.argv])}\n{text}")
    if args.write is not None:
        write_measured_table(args.write, f"`{' '.join(['python', *sys.argv])}`\n\n{text}")


if __name__ == "__main__":
    main()
