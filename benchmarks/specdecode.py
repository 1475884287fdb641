"""Speculative-decoding proposers on one closed-loop replay: our n-gram vs vLLM 0.32's numba n-gram, and
our suffix decoding vs arctic-inference's ``SuffixDecodingCache``.

Our suffix-decoding proposer (``vllm_ascend.specdecode.suffix``, when importable) runs the same replays,
beside arctic-inference's cache (driven as vLLM 0.32's suffix proposer drives it) when ``arctic_inference``
is importable; otherwise the table says that column is absent and why.
Token streams are real text (but for the ``synthetic`` control): Python source (vLLM's own ``vllm/v1``
package, read from the installed wheel) and the English-like corpus of
``vllm_ascend.testing.tiny_models.corpus``, tokenized with a byte-level BPE trained here (16k
vocabulary). Each request is its own window of a stream (no two overlap); its prompt is the first
512–2048 tokens. Workloads differ in how much the continuation repeats its context:

- ``text``: the corpus continues (random words from a small vocabulary: little beyond word bigrams);
- ``code``: the source file(s) continue (imports, identifiers, idioms recur);
- ``edit``: the continuation rewrites the prompt with edits (copies of 16–128-token spans of the prompt,
  in order, separated by 1–8 fresh tokens), as in "apply this change to the file" or RAG answers;
- ``synthetic`` (a control, not text): ``benchmarks/ngram.py``'s stream — spans of uniform random ids
  over 32k alternating with copies of earlier 8–32-token spans.

Decode steps replay greedy decoding with a perfect target: the stream is the target's output, so a
request's drafts are accepted while they match the stream's next tokens, plus one bonus token; every
proposer drives its own trajectory. Each step a proposer gets vLLM's CPU-drafter call
``propose(k, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`` with the previous step's accepted
tokens as ``sampled_token_ids``, and ``token_ids_cpu`` holding each context (zeros after it).

Columns: µs = proposal time per request per step (median and p90 over all timed steps of ``--reps``
replays, after one warm-up replay; the proposers' replays alternate so both see the same background
load); ratio = vLLM's median µs / ours (> 1: ours faster); tok/step = tokens emitted per request per
step (1 + accepted drafts); drafted = mean draft length; same = fraction of (request, step) where the two
proposers, given identical inputs (our trajectory), return identical drafts. They differ by design where
the longest matching n-gram occurs more than once: vLLM continues its earliest occurrence, ours the most
recent; "unexplained" counts drafts that do not follow that rule (every differing pair and 1 in 16 equal
ones are checked against a plain reference).

First call: each proposer in a fresh interpreter (``NUMBA_CACHE_DIR`` a new empty directory): module
import, construction, first and second ``propose`` on a real batch. vLLM's constructor "warms" numba with
an all-empty batch, which never reaches the jitted function, so its compilation lands on the first
decode step.
Run: ``uv run --no-sync python benchmarks/specdecode.py [--quick] [--suffix-only]
[--write benchmarks/RESULTS-specdecode.md]`` (about 6 minutes on 2 busy cores).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import glob  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from _report import machine, write_measured_table  # noqa: E402

MIN_N, MAX_N, K = 2, 5, 5
MAX_MODEL_LEN = 4096
PROMPT_MIN, PROMPT_MAX = 512, 2048
VOCAB = 16000
WORKLOADS = ("text", "code", "edit", "synthetic")
BATCHES = (1, 8, 32, 128, 256)
QUICK_BATCHES = (1, 8)
FIRST_CALL_BATCH = 32


def spec_config(batch: int) -> SimpleNamespace:
    """The parts of a ``VllmConfig`` both n-gram proposers read."""
    return SimpleNamespace(
        speculative_config=SimpleNamespace(
            method="ngram", prompt_lookup_min=MIN_N, prompt_lookup_max=MAX_N, num_speculative_tokens=K
        ),
        model_config=SimpleNamespace(max_model_len=MAX_MODEL_LEN),
        scheduler_config=SimpleNamespace(max_num_seqs=max(batch, 256)),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
    )


def make_proposer(name: str, batch: int) -> Any:
    """Our n-gram proposer (``ours``) or vLLM's (``vllm``), built as the runner builds its drafter."""
    if name == "ours":
        from vllm_ascend.specdecode.ngram import NgramProposer

        return NgramProposer.from_vllm_config(spec_config(batch))
    if name == "vllm":
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer as VllmNgram

        return VllmNgram(spec_config(batch))
    raise ValueError(f"unknown proposer {name!r}; allowed: ours, vllm")


# --- token streams ------------------------------------------------------------------------------------


def source_texts(max_chars: int) -> tuple[list[str], list[str]]:
    """(Python files of the installed ``vllm/v1`` package up to ``max_chars``, English-like corpus lines)."""
    import vllm

    from vllm_ascend.testing.tiny_models import corpus

    root = Path(vllm.__file__).parent / "v1"
    code, size = [], 0
    for path in sorted(glob.glob(str(root / "**" / "*.py"), recursive=True)):
        text = Path(path).read_text()
        if len(text) < 2000:
            continue
        code.append(text)
        size += len(text)
        if size >= max_chars:
            break
    return code, corpus(num_lines=max_chars // 50, seed=1)


def tokenize(code: list[str], text: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(code token stream, text token stream), one BPE trained on both."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(code + text, trainer=trainer)
    files = [np.asarray(e.ids, dtype=np.int32) for e in tok.encode_batch(code)]
    return np.concatenate(files), np.asarray(tok.encode(" ".join(text)).ids, dtype=np.int32)


@dataclass
class Streams:
    """The tokenized code and text streams the workloads' requests are cut from."""

    code: np.ndarray
    text: np.ndarray

    def requests(
        self, workload: str, batch: int, length: int, seed: int
    ) -> tuple[list[np.ndarray], np.ndarray]:
        """``batch`` token streams of ``length`` tokens and their prompt lengths.

        Requests read disjoint windows of a stream, so no two share text (only what the corpus repeats).
        """
        if workload not in WORKLOADS:
            raise ValueError(f"unknown workload {workload!r}; allowed: {', '.join(WORKLOADS)}")
        rng = np.random.default_rng(seed)
        prompt_lens = rng.integers(PROMPT_MIN, PROMPT_MAX + 1, size=batch)
        source = self.text if workload == "text" else self.code
        if workload != "synthetic" and len(source) // length < batch:
            raise ValueError(f"{workload}: {len(source)} tokens hold fewer than {batch} windows of {length}")
        slots = rng.permutation(len(source) // length)[:batch] * length
        out = []
        for p, start in zip(prompt_lens.tolist(), slots.tolist(), strict=False):
            window = source[start : start + length]
            if workload == "edit":
                out.append(self._edit(rng, window[:p], length))
            elif workload == "synthetic":
                out.append(self._synthetic(rng, length))
            else:
                out.append(window)
        return out, prompt_lens

    @staticmethod
    def _synthetic(rng: np.random.Generator, length: int) -> np.ndarray:
        seq: list[int] = []
        while len(seq) < length:
            if len(seq) > 64 and rng.random() < 0.5:
                start = int(rng.integers(0, len(seq) - 32))
                seq.extend(seq[start : start + int(rng.integers(8, 32))])
            else:
                seq.extend(rng.integers(0, 32000, size=int(rng.integers(4, 48))).tolist())
        return np.asarray(seq[:length], dtype=np.int32)

    def _edit(self, rng: np.random.Generator, prompt: np.ndarray, length: int) -> np.ndarray:
        prompt_len = len(prompt)
        parts, size, cursor = [prompt], prompt_len, 0
        while size < length:
            span = int(rng.integers(16, 129))
            if cursor + span > prompt_len:
                cursor = int(rng.integers(0, prompt_len // 2))
            parts.append(prompt[cursor : cursor + span])
            fresh = int(rng.integers(1, 9))
            at = int(rng.integers(0, len(self.code) - fresh))
            parts.append(self.code[at : at + fresh])
            cursor += span + int(rng.integers(0, 32))
            size += span + fresh
        return np.concatenate(parts)[:length]


# --- the replay ---------------------------------------------------------------------------------------


def reference_draft(ctx: np.ndarray, latest: bool) -> list[int]:
    """Drafts by definition: the longest suffix n-gram (``MIN_N..MAX_N``) found earlier in ``ctx``,
    continued from its most recent (``latest``) or earliest occurrence."""
    total = len(ctx)
    k = min(K, MAX_MODEL_LEN - total)
    if k <= 0 or total < 2:
        return []
    for n in range(min(MAX_N, total - 1), MIN_N - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(ctx[: total - 1], n)
        hits = np.flatnonzero((windows == ctx[total - n :]).all(axis=1))
        if hits.size:
            begin = int(hits[-1] if latest else hits[0]) + n
            return ctx[begin : begin + min(k, total - begin)].tolist()
    return []


@dataclass
class Replay:
    """What one replay measured."""

    step_us: list[float] = field(default_factory=list)  # µs per request, one entry per step
    accepted: list[int] = field(default_factory=list)  # accepted drafts per (request, step)
    drafted: list[int] = field(default_factory=list)  # draft length per (request, step)
    same: int = 0
    compared: int = 0
    unexplained: list[str] = field(default_factory=list)


def replay(
    proposer: Any,
    streams: list[np.ndarray],
    prompt_lens: np.ndarray,
    steps: int,
    shadow: Any = None,
    explain: bool = True,
) -> Replay:
    """``steps`` greedy decode steps of the batch, drafting with ``proposer`` (timed).

    With ``shadow``, it also drafts for the same inputs (untimed); with ``explain``, differing drafts are
    checked against :func:`reference_draft` (``proposer`` continuing the latest occurrence, ``shadow`` the
    earliest).
    A proposer that ``tracks_requests`` also gets the rows' request ids and prompt lengths, as the
    runner passes them.
    """
    batch = len(streams)
    buf = np.zeros((batch, MAX_MODEL_LEN), dtype=np.int32)
    pos = (prompt_lens + 1).astype(np.int32)  # the prefill sampled one token
    for b, stream in enumerate(streams):
        buf[b, : pos[b]] = stream[: pos[b]]
    sampled = [[int(s[p - 1])] for s, p in zip(streams, pos.tolist(), strict=True)]
    ids = {"req_ids": [f"req-{b}" for b in range(batch)], "num_prompt_tokens": prompt_lens}
    extra = ids if getattr(proposer, "tracks_requests", False) else {}
    shadow_extra = ids if getattr(shadow, "tracks_requests", False) else {}
    out = Replay()
    for step in range(steps):
        t0 = time.perf_counter()
        drafts = proposer.propose(K, sampled, pos, buf, **extra)
        out.step_us.append((time.perf_counter() - t0) * 1e6 / batch)
        if shadow is not None:
            other = shadow.propose(K, sampled, pos.copy(), buf, **shadow_extra)
            for b in range(batch):
                out.compared += 1
                mine, theirs = list(drafts[b]), list(other[b])
                if not explain or (mine == theirs and (b + step) % 16):
                    out.same += mine == theirs
                    continue
                ctx = buf[b, : pos[b]]
                ok = mine == reference_draft(ctx, latest=True) and theirs == reference_draft(
                    ctx, latest=False
                )
                out.same += mine == theirs
                if not ok:
                    out.unexplained.append(f"request {b} step {step} len {pos[b]}: ours {mine} vLLM {theirs}")
        for b, stream in enumerate(streams):
            draft = drafts[b]
            p = int(pos[b])
            truth = stream[p : p + len(draft) + 1]
            a = 0
            while a < len(draft) and a < len(truth) - 1 and draft[a] == truth[a]:
                a += 1
            new = truth[: a + 1]
            buf[b, p : p + len(new)] = new
            pos[b] = p + len(new)
            sampled[b] = new.tolist()
            out.accepted.append(a)
            out.drafted.append(len(draft))
    return out


def first_call(name: str, streams: list[np.ndarray], prompt_lens: np.ndarray) -> dict[str, float]:
    """ms to import, construct, and make the first and second ``propose`` of proposer ``name``."""
    t0 = time.perf_counter()
    if name == "vllm":
        import vllm.v1.spec_decode.ngram_proposer  # noqa: F401
    else:
        import vllm_ascend.specdecode.ngram  # noqa: F401
    t1 = time.perf_counter()
    proposer = make_proposer(name, len(streams))
    t2 = time.perf_counter()
    pos = (prompt_lens + 1).astype(np.int32)
    buf = np.zeros((len(streams), MAX_MODEL_LEN), dtype=np.int32)
    for b, stream in enumerate(streams):
        buf[b, : pos[b]] = stream[: pos[b]]
    sampled = [[int(s[p - 1])] for s, p in zip(streams, pos.tolist(), strict=True)]
    times = []
    for _ in range(2):
        t = time.perf_counter()
        proposer.propose(K, sampled, pos, buf)
        times.append(time.perf_counter() - t)
    return {
        "import": (t1 - t0) * 1e3,
        "init": (t2 - t1) * 1e3,
        "first": times[0] * 1e3,
        "second": times[1] * 1e3,
    }


def first_call_fresh(name: str, stream_file: Path) -> dict[str, float]:
    """:func:`first_call` in a new interpreter with an empty numba cache directory."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        done = subprocess.run(
            [sys.executable, __file__, "--first-call", name, "--streams", str(stream_file)],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batches 1 and 8, 8 steps, one rep")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--write", type=Path, help="also write the tables into this markdown file")
    parser.add_argument("--suffix-only", action="store_true", help="only the suffix-decoding table (printed)")
    parser.add_argument("--first-call", choices=("ours", "vllm"), help=argparse.SUPPRESS)
    parser.add_argument("--streams", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.suffix_only and args.write:
        parser.error("--write needs every table: drop --suffix-only")
    if args.first_call:
        data = np.load(args.streams)
        streams = [data[f"s{i}"] for i in range(len(data["prompt_lens"]))]
        print(json.dumps(first_call(args.first_call, streams, data["prompt_lens"])))
        return
    steps, reps = (8, 1) if args.quick else (args.steps, args.reps)
    batches = QUICK_BATCHES if args.quick else BATCHES
    length = PROMPT_MAX + 1 + steps * (K + 1)
    code, text = source_texts(400_000 if args.quick else 4_000_000)
    streams = Streams(*tokenize(code, text))
    if args.suffix_only:
        suffix_lines(streams, batches, length, steps, reps)
        return

    # first call, fresh interpreters (code workload)
    reqs, prompt_lens = streams.requests("code", FIRST_CALL_BATCH, length, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        stream_file = Path(tmp) / "streams.npz"
        np.savez(stream_file, prompt_lens=prompt_lens, **{f"s{i}": s for i, s in enumerate(reqs)})
        firsts = {name: first_call_fresh(name, stream_file) for name in ("ours", "vllm")}

    lines = [
        f"n-gram min_n={MIN_N} max_n={MAX_N} k={K}, max_model_len={MAX_MODEL_LEN}, prompts {PROMPT_MIN}–"
        f"{PROMPT_MAX} tokens, {steps} decode steps, {reps} timed replays; {machine()}",
        "",
        f"First call, fresh interpreter, batch {FIRST_CALL_BATCH} (code), ms:",
        "",
        "| proposer | import | construct | first propose | second propose |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {name} | {f['import']:.0f} | {f['init']:.1f} | {f['first']:.2f} | {f['second']:.2f} |"
            for name, f in firsts.items()
        ),
        "",
        "| workload | B | ours µs med / p90 | vLLM µs med / p90 | ratio | tok/step ours / vLLM "
        "| drafted ours / vLLM | same | unexplained |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    print("\n".join(lines), flush=True)
    unexplained: list[str] = []
    for workload in WORKLOADS:
        for batch in batches:
            reqs, prompt_lens = streams.requests(workload, batch, length, seed=batch * 31 + len(workload))
            row, odd = ngram_row(workload, reqs, prompt_lens, steps, reps)
            print(row, flush=True)
            lines.append(row)
            unexplained += odd
    for u in unexplained[:20]:
        print("unexplained:", u)
    lines += suffix_lines(streams, batches, length, steps, reps)
    if args.write is not None:
        write_measured_table(args.write, "\n".join(lines))


def ngram_row(
    workload: str, reqs: list[np.ndarray], prompt_lens: np.ndarray, steps: int, reps: int
) -> tuple[str, list[str]]:
    """One table row for the n-gram proposers, and the unexplained draft differences."""
    batch = len(reqs)
    proposers = {name: make_proposer(name, batch) for name in ("ours", "vllm")}
    runs: dict[str, list[Replay]] = {name: [] for name in proposers}
    for p in proposers.values():  # warm-up (vLLM's numba compiles here, once per process)
        replay(p, reqs, prompt_lens, steps)
    for _ in range(reps):  # interleaved, so both see the same background load
        for name, p in proposers.items():
            runs[name].append(replay(p, reqs, prompt_lens, steps))
    check = replay(proposers["ours"], reqs, prompt_lens, steps, shadow=proposers["vllm"])
    us = {n: [t for r in rs for t in r.step_us] for n, rs in runs.items()}
    med = {n: float(np.median(v)) for n, v in us.items()}
    tok = {n: 1 + float(np.mean(rs[0].accepted)) for n, rs in runs.items()}
    drafted = {n: float(np.mean(rs[0].drafted)) for n, rs in runs.items()}
    row = (
        f"| {workload} | {batch} | {med['ours']:.2f} / {percentile(us['ours'], 90):.2f} "
        f"| {med['vllm']:.2f} / {percentile(us['vllm'], 90):.2f} | {med['vllm'] / med['ours']:.2f} "
        f"| {tok['ours']:.2f} / {tok['vllm']:.2f} | {drafted['ours']:.2f} / {drafted['vllm']:.2f} "
        f"| {check.same / check.compared:.3f} | {len(check.unexplained)} |"
    )
    return row, [f"{workload} B={batch}: {u}" for u in check.unexplained]


SUFFIX = {"max_tree_depth": 24, "max_cached_requests": 10000, "max_spec_factor": 1.0, "min_token_prob": 0.1}


class ArcticSuffixProposer:
    """arctic-inference's ``SuffixDecodingCache`` driven as vLLM 0.32's ``SuffixDecodingProposer`` drives it,
    behind our proposer's call (``req_ids``/``num_prompt_tokens`` stand in for vLLM's ``InputBatch``)."""

    tracks_requests = True

    def __init__(
        self,
        k: int,
        max_model_len: int,
        max_tree_depth: int,
        max_cached_requests: int,
        max_spec_factor: float,
        min_token_prob: float,
    ) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.k, self.max_model_len, self.max_tree_depth = k, max_model_len, max_tree_depth
        self.max_spec_factor, self.min_token_prob = max_spec_factor, min_token_prob
        self.cache = SuffixDecodingCache(
            max_tree_depth=max_tree_depth, max_cached_requests=max_cached_requests
        )

    def propose(
        self,
        num_speculative_tokens: int,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        *,
        req_ids: list[str],
        num_prompt_tokens: np.ndarray,
    ) -> list[list[int]]:
        cache = self.cache
        drafts: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            num_tokens = int(num_tokens_no_spec[i])
            if not sampled or num_tokens >= self.max_model_len:
                drafts.append([])
                continue
            req_id = req_ids[i]
            if req_id not in cache.active_requests:
                if req_id in cache.cached_requests:
                    cache.evict_cached_response(req_id)
                cache.start_request(req_id, token_ids_cpu[i, : int(num_prompt_tokens[i])])
            cache.add_active_response(req_id, sampled)
            pattern = token_ids_cpu[i, max(0, num_tokens - self.max_tree_depth) : num_tokens]
            draft = cache.speculate(
                req_id,
                pattern,
                max_spec_tokens=min(num_speculative_tokens, self.k, self.max_model_len - num_tokens - 1),
                max_spec_factor=self.max_spec_factor,
                min_token_prob=self.min_token_prob,
            )
            drafts.append(draft.token_ids)
        for req_id in cache.active_requests - set(req_ids):
            cache.stop_request(req_id)
        return drafts


def suffix_lines(streams: Streams, batches: tuple[int, ...], length: int, steps: int, reps: int) -> list[str]:
    """Our suffix-decoding proposer beside arctic-inference's ``SuffixDecodingCache`` (when importable) on
    the same replays: a fresh proposer per replay (its trees start empty), replays alternating."""
    try:
        from vllm_ascend.specdecode.suffix import SuffixDecodingProposer
    except ImportError as exc:
        return ["", f"Suffix decoding: not measured ({exc})."]
    makers: dict[str, Any] = {"ours": lambda: SuffixDecodingProposer(K, MAX_MODEL_LEN, **SUFFIX)}
    try:
        import arctic_inference.suffix_decoding  # noqa: F401

        arctic = f"arctic-inference {importlib.metadata.version('arctic-inference')}"
        makers["arctic"] = lambda: ArcticSuffixProposer(K, MAX_MODEL_LEN, **SUFFIX)
    except ImportError as exc:
        arctic = f"arctic column absent: arctic_inference is not importable here ({exc})"
        print(f"suffix decoding: {arctic}", flush=True)
    settings = ", ".join(f"{k} {v}" for k, v in SUFFIX.items())
    columns = (
        "ratio = ours / arctic (goal ≤ 1.5); tok/step and drafted as above; same = identical drafts on "
        "identical inputs (ours' trajectory)"
        if "arctic" in makers
        else "tok/step and drafted as above"
    )
    beside = f"{arctic}, driven as vLLM 0.32's suffix proposer drives it" if "arctic" in makers else arctic
    lines = [
        "",
        f"Suffix decoding, k={K}, {settings} (vLLM's suffix_decoding_* defaults); {beside}. µs per request "
        f"per step over steps 2..{steps} of {reps} replays each (step 1 indexes the prompts: its ms per "
        f"request shown apart); {columns}.",
        "",
    ]
    if "arctic" in makers:
        lines += [
            "| workload | B | ours µs med / p90 | arctic µs med / p90 | ratio | step 1 ms ours / arctic "
            "| tok/step ours / arctic | drafted ours / arctic | same |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
    else:
        lines += [
            "| workload | B | ours µs med / p90 | step 1 ms | tok/step | drafted |",
            "|---|---:|---:|---:|---:|---:|",
        ]
    print("\n".join(lines), flush=True)
    for workload in WORKLOADS:
        for batch in batches:
            reqs, prompt_lens = streams.requests(workload, batch, length, seed=batch * 31 + len(workload))
            runs: dict[str, list[Replay]] = {name: [] for name in makers}
            for _ in range(reps):
                for name, make in makers.items():
                    runs[name].append(replay(make(), reqs, prompt_lens, steps))
            us = {n: [t for r in rs for t in r.step_us[1:]] for n, rs in runs.items()}
            med = {n: float(np.median(v)) for n, v in us.items()}
            p90 = {n: percentile(v, 90) for n, v in us.items()}
            first = {n: float(np.median([r.step_us[0] for r in rs])) / 1e3 for n, rs in runs.items()}
            tok = {n: 1 + float(np.mean(rs[0].accepted)) for n, rs in runs.items()}
            drafted = {n: float(np.mean(rs[0].drafted)) for n, rs in runs.items()}
            if "arctic" not in makers:
                lines.append(
                    f"| {workload} | {batch} | {med['ours']:.1f} / {p90['ours']:.1f} | {first['ours']:.2f} "
                    f"| {tok['ours']:.2f} | {drafted['ours']:.2f} |"
                )
            else:
                check = replay(
                    makers["ours"](), reqs, prompt_lens, steps, shadow=makers["arctic"](), explain=False
                )
                lines.append(
                    f"| {workload} | {batch} | {med['ours']:.1f} / {p90['ours']:.1f} "
                    f"| {med['arctic']:.1f} / {p90['arctic']:.1f} | {med['ours'] / med['arctic']:.2f} "
                    f"| {first['ours']:.2f} / {first['arctic']:.2f} | {tok['ours']:.2f} / {tok['arctic']:.2f} "
                    f"| {drafted['ours']:.2f} / {drafted['arctic']:.2f} | {check.same / check.compared:.3f} |"
                )
            print(lines[-1], flush=True)
    return lines


if __name__ == "__main__":
    main()
