"""N-gram proposer: vllm_ascend.specdecode (bytes.rfind per request) vs vLLM 0.32's numba proposer.

Replay: B requests, each a prompt of ~L tokens (vocabulary 32k) built from fresh random spans and
copies of earlier spans (as in code editing or RAG), then S decode steps where each new token
either continues a copied span or is random. At every step both proposers get the same
``token_ids_cpu [B, max_model_len]`` / ``num_tokens_no_spec`` and one sampled token per request,
through vLLM's drafter call shape ``propose(k, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)``.

Columns: µs per request per step (median of --reps replays, after a warm-up replay; the two
proposers' replays alternate so both see the same background load); ratio =
vLLM µs / ours (>1: ours faster); first = the first call's ms (numba compiles there); drafted =
mean draft length; same = fraction of (request, step) with identical drafts. The two differ by
design where the longest n-gram occurs several times: vLLM takes the earliest occurrence, ours the
most recent. Both run on one thread.
Run: ``uv run --all-packages python benchmarks/ngram.py [--quick]``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import numpy as np  # noqa: E402

from vllm_ascend.specdecode.ngram import NgramProposer  # noqa: E402

VOCAB = 32000
MIN_N, MAX_N = 2, 5
CONFIGS = [(1, 3900, 5), (16, 3900, 5), (64, 3900, 3), (64, 3900, 5), (256, 1000, 3), (16, 16000, 5)]
QUICK_CONFIGS = [(64, 3900, 5)]


def make_replay(batch: int, prompt_len: int, steps: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens [batch, prompt_len + steps], prompt_lens [batch])``."""
    rng = np.random.default_rng(seed)
    total = prompt_len + steps + 64
    out = np.empty((batch, prompt_len + steps), dtype=np.int32)
    lens = np.empty(batch, dtype=np.int64)
    for b in range(batch):
        seq: list[int] = []
        while len(seq) < total:
            if len(seq) > 64 and rng.random() < 0.5:  # copy an earlier span
                start = int(rng.integers(0, len(seq) - 32))
                seq.extend(seq[start : start + int(rng.integers(8, 32))])
            else:
                seq.extend(rng.integers(0, VOCAB, size=int(rng.integers(4, 48))).tolist())
        out[b] = seq[: prompt_len + steps]
        lens[b] = prompt_len + int(rng.integers(-prompt_len // 20, prompt_len // 20 + 1))
    return out, np.minimum(lens, prompt_len)


def replay(propose: Callable, tokens: np.ndarray, prompt_lens: np.ndarray, steps: int, k: int, max_len: int):
    """Run ``steps`` decode steps; returns (seconds per request per step, first call s, drafts per step)."""
    batch = tokens.shape[0]
    token_ids_cpu = np.zeros((batch, max_len), dtype=np.int32)
    token_ids_cpu[:, : tokens.shape[1]] = tokens
    drafts, elapsed, first = [], 0.0, 0.0
    for step in range(steps):
        num_tokens = (prompt_lens + step + 1).astype(np.int32)
        sampled = [[int(tokens[b, num_tokens[b] - 1])] for b in range(batch)]
        t0 = time.perf_counter()
        out = propose(k, sampled, num_tokens, token_ids_cpu)
        dt = time.perf_counter() - t0
        if step == 0:
            first = dt
        elapsed += dt
        drafts.append(out)
    return elapsed / (batch * steps), first, drafts


def vllm_proposer(batch: int, k: int, max_len: int):
    try:
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer as VllmNgram
    except ImportError as exc:
        print(f"vLLM's n-gram proposer is not importable ({exc}); measuring ours alone")
        return None
    cfg = SimpleNamespace(
        speculative_config=SimpleNamespace(
            prompt_lookup_min=MIN_N, prompt_lookup_max=MAX_N, num_speculative_tokens=k
        ),
        model_config=SimpleNamespace(max_model_len=max_len),
        scheduler_config=SimpleNamespace(max_num_seqs=max(batch, 1024)),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
    )
    return VllmNgram(cfg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    configs = QUICK_CONFIGS if args.quick else CONFIGS
    print(
        f"n-gram proposer, min_n={MIN_N} max_n={MAX_N}, {args.steps} steps, median of {args.reps} replays\n"
    )
    print(
        "| B | L | k | ours µs | vLLM µs | ratio | ours first ms | vLLM first ms | drafted ours/vLLM | same |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for batch, prompt_len, k in configs:
        max_len = prompt_len + args.steps + 1024
        tokens, prompt_lens = make_replay(batch, prompt_len, args.steps, seed=batch * 7 + prompt_len + k)
        ours = NgramProposer(MIN_N, MAX_N, k, max_len)
        peer = vllm_proposer(batch, k, max_len)
        proposers = {"ours": ours, "vllm": peer} if peer is not None else {"ours": ours}
        row: dict[str, list] = {name: [] for name in proposers}
        firsts, drafts = {}, {}
        for name, prop in proposers.items():  # warm-up replay (numba compiles on its first real call)
            _, firsts[name], drafts[name] = replay(prop.propose, tokens, prompt_lens, args.steps, k, max_len)
        for _ in range(args.reps):  # interleaved, so both see the same background load
            for name, prop in proposers.items():
                row[name].append(replay(prop.propose, tokens, prompt_lens, args.steps, k, max_len)[0])
        us = {n: statistics.median(v) * 1e6 for n, v in row.items() if v}
        drafted = {n: np.mean([len(d) for step in ds for d in step]) for n, ds in drafts.items()}
        if "vllm" in us:
            pairs = [
                (a, b)
                for sa, sb in zip(drafts["ours"], drafts["vllm"], strict=True)
                for a, b in zip(sa, sb, strict=True)
            ]
            same = sum(a == b for a, b in pairs) / len(pairs)
            print(
                f"| {batch} | {prompt_len} | {k} | {us['ours']:.2f} | {us['vllm']:.2f} | {us['vllm'] / us['ours']:.2f} "
                f"| {firsts['ours'] * 1e3:.2f} | {firsts['vllm'] * 1e3:.1f} | {drafted['ours']:.2f}/{drafted['vllm']:.2f} "
                f"| {same:.3f} |"
            )
        else:
            print(
                f"| {batch} | {prompt_len} | {k} | {us['ours']:.2f} | - | - | {firsts['ours'] * 1e3:.2f} | - "
                f"| {drafted['ours']:.2f}/- | - |"
            )


if __name__ == "__main__":
    main()
