"""Suffix decoding: tree contents against brute-force substring counts, drafts on crafted sequences,
frequency ordering, the global tree's eviction and memory bounds, and the proposer's request lifecycle."""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from vllm_ascend.specdecode.ngram import NgramProposer
from vllm_ascend.specdecode.replay import replay
from vllm_ascend.specdecode.suffix import (
    Draft,
    SuffixCache,
    SuffixConfigError,
    SuffixDecodingProposer,
    SuffixTree,
)


def brute_counts(seqs, depth):
    """Occurrences of every substring of length 1..depth."""
    counts: Counter[tuple[int, ...]] = Counter()
    for seq in seqs:
        for i in range(len(seq)):
            for n in range(1, depth + 1):
                if i + n <= len(seq):
                    counts[tuple(seq[i : i + n])] += 1
    return dict(counts)


def path_of(tree, node):
    """The string a node stands for (a search from the root)."""
    stack = [(0, ())]
    while stack:
        current, path = stack.pop()
        if current == node:
            return path
        stack.extend((child, (*path, token)) for token, child in (tree._children[current] or {}).items())
    raise AssertionError(f"node {node} is not in the tree")


def longest_stored_suffix(context, counts, depth):
    for n in range(min(depth, len(context)), 0, -1):
        if tuple(context[-n:]) in counts:
            return tuple(context[-n:])
    return ()


@pytest.mark.parametrize("depth", [1, 2, 3, 6])
def test_tree_holds_exactly_the_substrings_of_its_live_sequences(depth):
    rng = random.Random(depth)
    tree = SuffixTree(depth)
    seqs: dict[int, list[int]] = {}
    for _ in range(60):
        op = rng.random()
        if op < 0.45 or not seqs:
            seq = [rng.randrange(4) for _ in range(rng.randrange(0, 25))]
            seqs[tree.new_sequence(seq[:3])] = seq
            tree.extend(max(seqs), seq[3:])
        elif op < 0.7:
            sid = rng.choice(list(seqs))
            extra = [rng.randrange(4) for _ in range(rng.randrange(1, 6))]
            tree.extend(sid, extra)
            seqs[sid] += extra
        else:
            sid = rng.choice(list(seqs))
            tree.remove(sid)
            del seqs[sid]
        counts = brute_counts(seqs.values(), depth)
        assert tree.substring_counts() == counts
        assert tree.num_nodes <= len(counts) + 1  # freed nodes are not kept alive
        assert tree.num_tokens == sum(len(s) for s in seqs.values())
        context = [rng.randrange(4) for _ in range(rng.randrange(1, 10))]
        node, offset, length = tree.match(context)
        assert length == len(longest_stored_suffix(context, counts, depth))
        assert length == len(path_of(tree, node)) + offset
        for sid, seq in seqs.items():
            node, offset, length = tree.sequence_tail(sid)
            assert offset == 0 and path_of(tree, node) == tuple(seq[len(seq) - length :])
            # every longer suffix occurs only at the end: nothing to draft from
            assert all(counts[tuple(seq[-n:])] == 1 for n in range(length + 1, min(depth, len(seq)) + 1))
    for sid in list(seqs):
        tree.remove(sid)
    assert tree.num_nodes == 1 and tree.substring_counts() == {}


def test_incremental_updates_equal_a_rebuild():
    rng = random.Random(7)
    seq = [rng.randrange(6) for _ in range(300)]
    whole = SuffixTree(5)
    whole.new_sequence(seq)
    step = SuffixTree(5)
    sid = step.new_sequence()
    pos = 0
    while pos < len(seq):
        n = rng.randrange(1, 5)
        step.extend(sid, seq[pos : pos + n])
        pos += n
        rebuilt = SuffixTree(5)
        rebuilt_id = rebuilt.new_sequence(seq[:pos])
        tail = step.sequence_tail(sid)
        assert path_of(step, tail[0]) == path_of(rebuilt, rebuilt.sequence_tail(rebuilt_id)[0])
        assert step.speculate(*tail, 4, 1.0, 0.05) == rebuilt.speculate(
            *rebuilt.sequence_tail(rebuilt_id), 4, 1.0, 0.05
        )
    assert step.substring_counts() == whole.substring_counts()


def test_text_that_repeats_nothing_costs_one_node_per_token():
    tree = SuffixTree(24)
    seq = tree.new_sequence(range(1000))
    assert tree.num_nodes == 1001  # a leaf per token under the root: the rest is read from the sequence
    assert len(tree.substring_counts()) == sum(min(24, 1000 - i) for i in range(1000))
    tree.extend(seq, [500, 501, 502])  # "500 501 502" seen again: one path of internal nodes appears
    assert tree.num_nodes < 1001 + 3 * 24
    assert tree.speculate(*tree.match([7, 500, 501, 502]), 4, 2.0, 0.1).token_ids == [503, 504, 505, 506]
    tree.remove(seq)
    assert tree.num_nodes == 1 and tree.substring_counts() == {}


def test_draft_continues_the_longest_earlier_match():
    tree = SuffixTree(8)
    seq = tree.new_sequence([1, 2, 3, 4, 5, 1, 2, 3])
    draft = tree.speculate(*tree.sequence_tail(seq), 5, 1.0, 0.1)
    assert draft.token_ids == [4, 5, 1]  # match "1 2 3" (3 tokens) allows 3 draft tokens at factor 1
    assert draft.match_len == 3 and draft.score == pytest.approx(3.0)
    assert tree.speculate(*tree.sequence_tail(seq), 2, 1.0, 0.1).token_ids == [4, 5]
    assert tree.speculate(*tree.sequence_tail(seq), 5, 2.0, 0.1).token_ids == [4, 5, 1, 2, 3]
    assert tree.speculate(*tree.sequence_tail(seq), 5, 0.5, 0.1).token_ids == [4]


def test_match_plus_draft_never_exceed_the_tree_depth():
    tree = SuffixTree(4)
    seq = tree.new_sequence([1, 2, 3, 4, 5, 6, 7, 1, 2, 3])
    draft = tree.speculate(*tree.sequence_tail(seq), 10, 10.0, 0.0)
    # depth 4: "1 2 3" allows one more token, "3" allows three (the higher score)
    assert draft.token_ids == [4, 5, 6] and draft.match_len == 1
    assert tree.speculate(*tree.sequence_tail(seq), 1, 10.0, 0.0) == Draft([4], 1.0, 3)  # the longest match
    no_repeat = tree.new_sequence([9, 8])
    assert tree.speculate(*tree.sequence_tail(no_repeat), 10, 10.0, 0.0).token_ids == []


def test_most_frequent_continuation_wins_and_low_probability_stops_the_draft():
    tokens = [7, 8, 9, 0, 7, 8, 9, 1, 7, 8, 9, 2, 7, 8, 5, 3, 7, 8]
    tree = SuffixTree(8)
    seq = tree.new_sequence(tokens)
    tail = tree.sequence_tail(seq)
    # after "7 8": 9 three times, 5 once; after "7 8 9": 0, 1, 2 once each (first seen wins the tie)
    draft = tree.speculate(*tail, 4, 2.0, 0.1)
    assert draft.token_ids == [9, 0, 7, 8]
    assert draft.score == pytest.approx(0.75 + 0.25 + 0.25 + 0.25)
    assert tree.speculate(*tail, 4, 2.0, 0.5).token_ids == [9]  # 3/4 kept, 3/4 * 1/3 dropped
    assert tree.speculate(*tail, 4, 2.0, 0.8).token_ids == []


def test_the_higher_scoring_tree_wins():
    cache = SuffixCache(max_tree_depth=8, max_cached_requests=4)
    cache.start_request("a", [50, 51])
    cache.add_tokens("a", [1, 2, 3, 4, 5, 6] * 3)
    cache.stop_request("a")
    cache.start_request("b", [9, 9, 1, 2, 3])  # its own tree has no earlier "1 2 3"
    draft = cache.speculate("b", 3, 1.0, 0.1)
    assert draft.token_ids == [4, 5, 6] and draft.match_len == 3 and draft.score == pytest.approx(3.0)
    cache.add_tokens("b", [8, 1, 2, 3, 7, 1, 2, 3])
    # local: "1 2 3" -> 8 or 7 (1/2 each: score 1.5); global: -> 4 in three of four (score 2.25)
    assert cache.speculate("b", 3, 1.0, 0.1).token_ids == [4, 5, 6]
    cache.start_request("c", [1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 3])
    assert cache.speculate("c", 3, 1.0, 0.1).token_ids == [9, 1, 2]  # local: always 9 (score 3)


def test_global_tree_keeps_the_newest_requests_only():
    depth = 4
    cache = SuffixCache(max_tree_depth=depth, max_cached_requests=3)
    rng = random.Random(1)
    outputs = {}
    for i in range(20):
        cache.start_request(i, [rng.randrange(50) for _ in range(10)])
        outputs[i] = [rng.randrange(8) for _ in range(rng.randrange(5, 40))]
        for token in outputs[i]:
            cache.add_tokens(i, [token])
        cache.stop_request(i)
        kept = list(outputs)[-3:]
        assert cache.cached_requests == kept
        counts = brute_counts([outputs[k] for k in kept], depth)
        assert cache.global_tree.substring_counts() == counts
        # memory bound: at most max_tree_depth nodes per cached token (+ root); no local tree left behind
        assert cache.num_nodes == cache.global_tree.num_nodes <= len(counts) + 1
        assert cache.num_nodes <= depth * sum(len(outputs[k]) for k in kept) + 1
    assert cache.active_requests == set()


def test_no_global_tree_when_max_cached_requests_is_zero():
    cache = SuffixCache(max_tree_depth=8, max_cached_requests=0)
    cache.start_request("a", [1, 2, 3, 4, 1, 2])
    cache.add_tokens("a", [3])
    assert cache.speculate("a", 3, 1.0, 0.1).token_ids == [4, 1, 2]
    cache.stop_request("a")
    assert cache.cached_requests == [] and cache.global_tree.num_tokens == 0 and cache.num_nodes == 1


def _batch(contexts, num_prompt):
    width = max(len(c) for c in contexts)
    tokens = np.zeros((len(contexts) + 2, width + 8), dtype=np.int64)  # extra rows/cols like vLLM's buffer
    for row, ctx in enumerate(contexts):
        tokens[row, : len(ctx)] = ctx
    return tokens, np.array([len(c) for c in contexts]), np.array(num_prompt)


def test_proposer_follows_the_request_lifecycle():
    proposer = SuffixDecodingProposer(num_speculative_tokens=4, max_model_len=64, max_tree_depth=8)
    prompt_a, prompt_b = [3, 4, 5, 6, 3, 4], [20, 21]
    ctx = {"a": [*prompt_a, 5], "b": [*prompt_b, 22]}
    tokens, lengths, num_prompt = _batch([ctx["a"], ctx["b"]], [6, 2])
    drafts = proposer.propose(
        4, [[5], [22]], lengths, tokens, req_ids=["a", "b"], num_prompt_tokens=num_prompt
    )
    assert drafts == [[6, 3, 4], []]  # match "3 4 5": three tokens
    assert proposer.cache.active_requests == {"a", "b"}

    ctx["b"] += [23, 20, 21]
    tokens, lengths, num_prompt = _batch([ctx["b"]], [2])
    drafts = proposer.propose(4, [[23, 20, 21]], lengths, tokens, req_ids=["b"], num_prompt_tokens=num_prompt)
    assert drafts == [[22, 23]]  # "20 21" seen before the generated tokens
    assert proposer.cache.active_requests == {"b"}  # "a" left the batch: stopped
    assert proposer.cache.cached_requests == ["a", "b"]
    assert proposer.cache.global_tree.substring_counts() == brute_counts([[5], [22, 23, 20, 21]], 8)

    # "a" comes back (preempted and resumed): restarted from its whole context, counted once globally
    ctx["a"] += [6]
    tokens, lengths, num_prompt = _batch([ctx["a"], ctx["b"]], [6, 2])
    drafts = proposer.propose(4, [[6], []], lengths, tokens, req_ids=["a", "b"], num_prompt_tokens=num_prompt)
    assert drafts[1] == []  # sampled nothing (a prefill chunk): no draft
    assert proposer.cache.cached_requests == ["b", "a"]
    assert proposer.cache.global_tree.substring_counts() == brute_counts([[22, 23, 20, 21], [5, 6]], 8)
    assert proposer.propose(0, [[6]], lengths, tokens, req_ids=["a"], num_prompt_tokens=num_prompt) == [[]]


def test_proposals_stop_at_max_model_len():
    proposer = SuffixDecodingProposer(num_speculative_tokens=4, max_model_len=10, max_tree_depth=8)
    ctx = [1, 2, 3, 4, 5, 1, 2, 3]
    tokens, lengths, num_prompt = _batch([ctx], [7])
    drafts = proposer.propose(4, [[3]], lengths, tokens, req_ids=["r"], num_prompt_tokens=num_prompt)
    assert drafts == [[4]]  # 8 tokens + 1 draft + the verified token = max_model_len


def test_from_vllm_config_and_bad_settings():
    spec = SimpleNamespace(
        num_speculative_tokens=5,
        suffix_decoding_max_tree_depth=12,
        suffix_decoding_max_cached_requests=7,
        suffix_decoding_max_spec_factor=1.5,
        suffix_decoding_min_token_prob=0.2,
    )
    proposer = SuffixDecodingProposer.from_vllm_config(
        SimpleNamespace(speculative_config=spec, model_config=SimpleNamespace(max_model_len=128))
    )
    assert (proposer.k, proposer.max_model_len, proposer.max_spec_factor, proposer.min_token_prob) == (
        5,
        128,
        1.5,
        0.2,
    )
    assert (proposer.cache.max_tree_depth, proposer.cache.max_cached_requests) == (12, 7)
    with pytest.raises(SuffixConfigError, match="speculative_config is required"):
        SuffixDecodingProposer.from_vllm_config(SimpleNamespace(speculative_config=None))
    with pytest.raises(
        SuffixConfigError, match=r"suffix_decoding_min_token_prob must be a number in \[0.0, 1.0\]"
    ):
        SuffixDecodingProposer(4, 64, min_token_prob=1.5)
    with pytest.raises(SuffixConfigError, match="suffix_decoding_max_spec_factor must be a number >= 0"):
        SuffixDecodingProposer(4, 64, max_spec_factor=-1)
    with pytest.raises(SuffixConfigError, match="suffix_decoding_max_tree_depth must be an integer >= 1"):
        SuffixDecodingProposer(4, 64, max_tree_depth=0)
    with pytest.raises(
        SuffixConfigError, match="suffix_decoding_max_cached_requests must be an integer >= 0"
    ):
        SuffixDecodingProposer(4, 64, max_cached_requests=-1)


def test_replay_measures_drafts_and_acceptance():
    rng = random.Random(3)
    motif = [rng.randrange(100) for _ in range(12)]
    prompts = [motif * 2 + [rng.randrange(100)] for _ in range(6)]
    outputs = [motif * 4 for _ in range(6)]
    suffix = replay(SuffixDecodingProposer(4, 512), prompts, outputs, num_speculative_tokens=4, batch_size=4)
    assert suffix.request_steps > 0 and suffix.propose_s > 0
    assert 0 < suffix.accepted_tokens <= suffix.drafted_tokens
    assert suffix.accepted_per_request_step > 1  # a repeating motif: most drafts are accepted
    total = sum(len(o) for o in outputs)
    # one verified token per request-step, but a draft that runs to the end of its output has none after it
    assert total <= suffix.request_steps + suffix.accepted_tokens <= total + len(outputs)
    ngram = replay(NgramProposer(2, 4, 4, 512), prompts, outputs, num_speculative_tokens=4, batch_size=4)
    assert ngram.accepted_tokens > 0
    assert total <= ngram.request_steps + ngram.accepted_tokens <= total + len(outputs)
