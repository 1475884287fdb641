"""NgramProposer against a naive per-request reference, plus config and input validation."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from vllm_ascend.specdecode.ngram import NgramConfigError, NgramProposer


def naive(tokens: list[int], min_n: int, max_n: int, k: int, max_model_len: int) -> list[int]:
    """Longest n in [min_n, max_n] whose suffix occurs earlier; most recent occurrence; next k tokens."""
    total = len(tokens)
    if total >= max_model_len:
        return []
    for n in range(max_n, min_n - 1, -1):
        if n >= total:
            continue
        suffix = tokens[total - n :]
        for start in range(total - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                follow = tokens[start + n : start + n + k]
                return follow[: max_model_len - total]
    return []


def _batch(seqs: list[list[int]], cols: int) -> tuple[np.ndarray, np.ndarray]:
    token_ids = np.full((len(seqs) + 2, cols), 7, dtype=np.int32)  # extra rows and padding are noise
    for i, s in enumerate(seqs):
        token_ids[i, : len(s)] = s
    return token_ids, np.array([len(s) for s in seqs])


def _check(proposer: NgramProposer, seqs: list[list[int]], cols: int, k: int | None = None) -> int:
    token_ids, num_tokens = _batch(seqs, cols)
    drafts, counts = proposer.propose_batch(token_ids, num_tokens, k)
    kk = proposer.k if k is None else k
    hits = 0
    for i, s in enumerate(seqs):
        expected = naive(s, proposer.min_n, proposer.max_n, kk, proposer.max_model_len)
        assert drafts[i, : counts[i]].tolist() == expected, (i, s)
        assert (drafts[i, counts[i] :] == -1).all()
        hits += bool(expected)
    return hits


@pytest.mark.parametrize("min_n,max_n,k", [(1, 1, 1), (1, 3, 4), (2, 5, 3), (3, 3, 5)])
def test_matches_reference_on_random_sequences(min_n, max_n, k):
    rng = np.random.default_rng(min_n * 10 + max_n)
    proposer = NgramProposer(min_n, max_n, k, max_model_len=300)
    seqs = [rng.integers(0, 6, size=int(rng.integers(0, 120))).tolist() for _ in range(60)]
    hits = _check(proposer, seqs, cols=300)
    assert hits > 10  # the small vocabulary makes matches common


def test_matches_reference_on_repetitive_sequences():
    rng = np.random.default_rng(3)
    proposer = NgramProposer(2, 4, 5, max_model_len=512)
    seqs = []
    for _ in range(40):
        motif = rng.integers(0, 1000, size=int(rng.integers(1, 9))).tolist()
        seq = (motif * 50)[: int(rng.integers(2, 200))]
        if rng.random() < 0.5:  # sprinkle mutations
            seq[int(rng.integers(0, len(seq)))] = int(rng.integers(0, 1000))
        seqs.append(seq)
    assert _check(proposer, seqs, cols=512) >= 30
    assert _check(proposer, seqs, cols=512, k=2) >= 30


def test_most_recent_occurrence_of_longest_ngram_wins():
    p = NgramProposer(1, 3, 3, max_model_len=100)
    #        0  1  2  3  4  5  6  7  8  9  10 11 12
    seq = [1, 2, 3, 9, 9, 1, 2, 3, 8, 5, 2, 3, 1, 2, 3]
    drafts, counts = p.propose_batch(np.array([seq]), np.array([len(seq)]))
    assert drafts[0, : counts[0]].tolist() == [8, 5, 2]  # "1 2 3" at 5..7 beats 0..2
    seq = [4, 2, 3, 6, 7, 1, 5, 3, 0, 2, 3]  # "2 3" occurs at 1..2; "3" alone more recently at 7
    drafts, counts = p.propose_batch(np.array([seq]), np.array([len(seq)]))
    assert drafts[0, : counts[0]].tolist() == [6, 7, 1]


def test_overlapping_match_and_max_model_len_cap():
    p = NgramProposer(2, 2, 4, max_model_len=9)
    seq = [5, 6, 5, 6, 5, 6]  # last "5 6" most recently at 2..3, followed by "5 6"
    drafts, counts = p.propose_batch(np.array([seq]), np.array([6]))
    assert drafts[0].tolist() == [5, 6, -1, -1] and counts.tolist() == [2]
    seq = [5, 6, 1, 2, 3, 4, 5, 6, 0]
    drafts, counts = p.propose_batch(np.array([[*seq, 0]]), np.array([8]))
    assert drafts[0].tolist() == [1, -1, -1, -1]  # 8 tokens, max_model_len 9: one slot left
    drafts, counts = p.propose_batch(np.array([seq]), np.array([9]))
    assert counts.tolist() == [0]  # at max_model_len: nothing


def test_no_match_short_and_inactive_requests():
    p = NgramProposer(1, 2, 2, max_model_len=50)
    token_ids = np.array([[1, 2, 3, 4, 0, 0], [3, 3, 0, 0, 0, 0], [9, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]])
    drafts, counts = p.propose_batch(token_ids, np.array([4, 2, 1, 3]))
    assert counts.tolist() == [0, 1, 0, 1]
    drafts, counts = p.propose_batch(token_ids, np.array([4, 2, 1, 3]), active=np.array([1, 0, 1, 1]))
    assert counts.tolist() == [0, 0, 0, 1]
    drafts, counts = p.propose_batch(token_ids, np.array([], dtype=np.int64))
    assert drafts.shape == (0, 2)


def test_vllm_call_shape():
    p = NgramProposer(1, 2, 3, max_model_len=64)
    token_ids = np.zeros((8, 64), dtype=np.int32)
    token_ids[0, :6] = [1, 2, 3, 4, 1, 2]
    token_ids[1, :6] = [1, 2, 3, 4, 1, 2]
    out = p.propose(
        2, [[2], []], np.array([6, 6, 0, 0, 0, 0, 0, 0], dtype=np.int32), token_ids, slot_mappings=None
    )
    assert out == [[3, 4], []]
    num_tokens = np.array([6, 6, 0, 0, 0, 0, 0, 0], dtype=np.int32)
    assert p.propose(0, [[2], [2]], num_tokens, token_ids) == [[], []]  # dynamic speculation chose k=0


def test_config_validation_messages():
    cases = [
        ((0, 1, 1, 10), "min_n must be an integer >= 1, got 0"),
        ((1, True, 1, 10), "max_n must be an integer >= 1, got True"),
        ((3, 2, 1, 10), "min_n (3) must be <= max_n (2)"),
        ((1, 2, 0, 10), "num_speculative_tokens must be an integer >= 1, got 0"),
        ((1, 2, 1, 1.5), "max_model_len must be an integer >= 2, got 1.5"),
    ]
    for args, message in cases:
        with pytest.raises(NgramConfigError, match=re.escape(message)):
            NgramProposer(*args)
    p = NgramProposer(1, 2, 3, 10)
    with pytest.raises(NgramConfigError, match=re.escape("k (4) must be <= num_speculative_tokens (3)")):
        p.propose_batch(np.zeros((1, 10), dtype=np.int64), np.array([3]), k=4)


def test_input_validation_messages():
    p = NgramProposer(1, 2, 3, 10)
    with pytest.raises(
        ValueError, match=re.escape("token_ids must be 2-D and num_tokens 1-D, got shapes (10,) and (1,)")
    ):
        p.propose_batch(np.zeros(10, dtype=np.int64), np.array([3]))
    with pytest.raises(ValueError, match=re.escape("num_tokens has 3 requests but token_ids only 2 rows")):
        p.propose_batch(np.zeros((2, 10), dtype=np.int64), np.array([1, 2, 3]))
    with pytest.raises(
        ValueError, match=re.escape("num_tokens must lie in [0, 10] (the columns of token_ids)")
    ):
        p.propose_batch(np.zeros((2, 10), dtype=np.int64), np.array([1, 11]))
    with pytest.raises(ValueError, match=re.escape("active must have shape (2,), got (3,)")):
        p.propose_batch(np.zeros((2, 10), dtype=np.int64), np.array([1, 1]), active=np.ones(3, dtype=bool))


def test_from_vllm_config():
    spec = SimpleNamespace(prompt_lookup_min=2, prompt_lookup_max=4, num_speculative_tokens=3)
    cfg = SimpleNamespace(speculative_config=spec, model_config=SimpleNamespace(max_model_len=2048))
    assert (
        repr(NgramProposer.from_vllm_config(cfg))
        == "NgramProposer(min_n=2, max_n=4, k=3, max_model_len=2048)"
    )
    spec.prompt_lookup_max = None
    with pytest.raises(
        NgramConfigError, match=r"speculative_config\.prompt_lookup_max must be set for the ngram method"
    ):
        NgramProposer.from_vllm_config(cfg)
    with pytest.raises(NgramConfigError, match=r"vllm_config\.speculative_config is required"):
        NgramProposer.from_vllm_config(SimpleNamespace(speculative_config=None))


def test_tokens_sharing_a_low_byte_are_not_confused():
    """The search runs on each token's low byte; a more recent occurrence that only matches there
    (0x101 vs 1, 0x201 vs 1) must lose to the exact, earlier one, for the anchor and for longer n."""
    seq = [1, 2, 9, 0x101, 2, 8, 1, 2]  # "1 2": low-byte hit at 3..4, exact at 0..1
    drafts, counts = NgramProposer(2, 2, 3, max_model_len=64).propose_batch(
        np.array([seq], dtype=np.int32), np.array([len(seq)])
    )
    assert drafts[0, : counts[0]].tolist() == naive(seq, 2, 2, 3, 64) == [9, 0x101, 2]
    seq = [7, 1, 2, 5, 0x207, 1, 2, 6, 3, 1, 2, 4, 7, 1, 2]  # "7 1 2" exact at 0..2, low byte only at 4..6
    for dtype in (np.int32, np.int64):
        drafts, counts = NgramProposer(2, 4, 2, max_model_len=64).propose_batch(
            np.array([seq], dtype=dtype), np.array([len(seq)])
        )
        assert drafts[0, : counts[0]].tolist() == naive(seq, 2, 4, 2, 64) == [5, 0x207]
    rng = np.random.default_rng(11)
    values = [1, 0x101, 0x01000001, 2, 0x202, 0]
    seqs = [rng.choice(values, size=int(rng.integers(2, 60))).tolist() for _ in range(50)]
    assert _check(NgramProposer(1, 4, 3, 100), seqs, cols=100) > 20


def _random_stream(rng: np.random.Generator, kind: str) -> list[int]:
    """A token stream of one of several shapes: small vocabulary, a repeated motif with mutations,
    spans copied from earlier, a constant run, or a short context."""
    if kind == "short":
        return rng.integers(0, 3, size=int(rng.integers(0, 7))).tolist()
    length = int(rng.integers(2, 160))
    if kind == "small_vocab":
        return rng.integers(0, 4, size=length).tolist()
    if kind == "constant":
        return [int(rng.integers(0, 2**31 - 1))] * length
    if kind == "motif":
        motif = rng.integers(0, 50, size=int(rng.integers(1, 7))).tolist()
        seq = (motif * (length // len(motif) + 1))[:length]
        for _ in range(int(rng.integers(0, 4))):
            seq[int(rng.integers(0, length))] = int(rng.integers(0, 50))
        return seq
    # "copies": fresh ids (including values whose bytes straddle token boundaries) and earlier spans
    seq = []
    while len(seq) < length:
        if len(seq) > 4 and rng.random() < 0.5:
            start = int(rng.integers(0, len(seq) - 2))
            seq += seq[start : start + int(rng.integers(2, 12))]
        else:
            seq += rng.choice([0, 1, 0x100, 0x10000, 0x01000000, 0x01000001, 7], size=3).tolist()
    return seq[:length]


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_randomized_streams_match_reference_rule(dtype):
    """Many random streams and settings (min_n 1..4, max_n == min_n and above, tight max_model_len):
    ``propose_batch`` and vLLM's ``propose`` call both return exactly the reference rule's drafts."""
    rng = np.random.default_rng(17)
    kinds = ["short", "small_vocab", "constant", "motif", "copies"]
    settings = [(1, 1), (1, 2), (1, 4), (2, 2), (2, 5), (3, 4), (4, 6)]
    drafted = 0
    for trial in range(40):
        min_n, max_n = settings[trial % len(settings)]
        k = int(rng.integers(1, 6))
        max_model_len = int(rng.choice([8, 64, 400]))
        proposer = NgramProposer(min_n, max_n, k, max_model_len)
        seqs = [_random_stream(rng, kinds[int(rng.integers(0, len(kinds)))]) for _ in range(12)]
        seqs = [s[:max_model_len] for s in seqs]
        token_ids = np.full((len(seqs) + 1, max_model_len), 0x01000000, dtype=dtype)
        for i, s in enumerate(seqs):
            token_ids[i, : len(s)] = s
        num_tokens = np.array([len(s) for s in seqs])
        expected = [naive(s, min_n, max_n, k, max_model_len) for s in seqs]
        drafts, counts = proposer.propose_batch(token_ids, num_tokens)
        assert [d[:c] for d, c in zip(drafts.tolist(), counts.tolist(), strict=True)] == expected, trial
        sampled = [[1] if i % 3 else [] for i in range(len(seqs))]  # every third request sampled nothing
        got = proposer.propose(k, sampled, num_tokens, token_ids)
        assert got == [e if i % 3 else [] for i, e in enumerate(expected)], trial
        drafted += sum(bool(e) for e in expected)
    assert drafted > 150  # about 40 % of requests get a draft (short and tight-length ones cannot)
