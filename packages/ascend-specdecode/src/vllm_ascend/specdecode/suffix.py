"""Suffix decoding (https://arxiv.org/abs/2411.04975): drafts from suffix trees of past tokens.

``SuffixTree`` is a depth-bounded suffix trie over one or more token sequences: every substring of
length <= ``max_depth`` has its number of occurrences, and nodes link to the node of their string minus
its first token (suffix links). A substring seen once is a leaf referring to its occurrence, so text
that repeats nothing costs about one node per token; appending a token walks the suffix links of the
sequence's repeated suffixes only. A tree built token by token equals one built from the whole
sequence, and removing a sequence frees every node only it used.

``SuffixCache`` keeps one tree per active request (its prompt and generated tokens) and one global tree
of the generated tokens of the last ``max_cached_requests`` requests (oldest evicted first). A draft
walks the longest suffix of the request's context found in a tree, then repeatedly follows the most
frequent continuation while its estimated probability (product of count ratios) stays >= ``min_token_prob``;
among match lengths and the two trees the draft with the highest score (sum of those probabilities: the
expected number of accepted tokens) wins. A draft is at most ``max_spec_factor`` x match length tokens,
and match plus draft never exceed ``max_depth``.

Memory is bounded: a tree holds at most ``max_depth`` nodes per token of its sequences (about one per
token where the text does not repeat itself), local trees exist only for requests in the running batch,
and the global tree only for the generated tokens of ``max_cached_requests`` requests.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

_ROOT = 0


class SuffixConfigError(ValueError):
    """An invalid suffix decoding setting."""


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise SuffixConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_float(name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise SuffixConfigError(f"{name} must be a number in [{low}, {high}], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Draft:
    """A proposal: its tokens, score (sum of their estimated probabilities) and the match it extends."""

    token_ids: list[int]
    score: float
    match_len: int


_NO_DRAFT = Draft([], 0.0, 0)
_Ints = list[int]
_ExtendState = tuple[
    list[dict[int, int] | None],
    _Ints,
    _Ints,
    _Ints,
    _Ints,
    _Ints,
    _Ints,
    _Ints,
    dict[int, int],
    dict[int, list[int]],
]


class SuffixTree:
    """Depth-bounded suffix trie over token sequences, with occurrence counts and suffix links.

    A substring seen once is stored as a *leaf*: the node of its shortest unique prefix, holding a
    reference to its occurrence (sequence, end position); the tokens after it are read from that
    sequence instead of being nodes (they are unique too, so their counts are 1). A leaf seen a second
    time becomes *internal*: its children (one per continuation seen) are nodes. So a token of text that
    repeats nothing costs O(1) nodes instead of ``max_depth``.

    Nodes live in parallel lists indexed by node id (freed ids are reused); node 0 is the (internal) root.
    ``count[n]``: occurrences of n's string; ``cont[n]``: for an internal node, occurrences followed by a
    further token (its children's counts summed), the denominator of continuation probabilities.
    ``best[n]`` caches the token of n's most frequent child (kept exact as counts change, or -1 where an
    equal count makes the first-seen order decide: found again when a draft needs it), so a draft step
    costs O(1) however many continuations a node has.
    Each sequence keeps its *active* node: its longest suffix that is an internal node (the suffixes whose
    continuations are nodes; by suffix links, the shorter ones follow).
    """

    def __init__(self, max_depth: int) -> None:
        self.max_depth = _check_int("max_depth", max_depth, 1)
        self._children: list[dict[int, int] | None] = [None]
        self._count = [0]
        self._cont = [0]
        self._link = [_ROOT]
        self._depth = [0]
        # internal node -> token of its most frequent child (first seen on ties); -1: unknown
        self._best = [-1]
        # leaf -> its occurrence: sequence (-1: internal node) and position of its string's last token
        self._ref_seq = [-1]
        self._ref_end = [0]
        self._free: list[int] = []
        self._tokens: dict[int, list[int]] = {}
        self._active: dict[int, int] = {}
        self._next_seq = 0
        # what extend uses, bound once: the node lists and the per-sequence state
        self._extend_state: _ExtendState = (
            self._children,
            self._count,
            self._cont,
            self._link,
            self._depth,
            self._best,
            self._ref_seq,
            self._ref_end,
            self._active,
            self._tokens,
        )

    @property
    def num_nodes(self) -> int:
        """Live nodes, the root included (the tree's memory is proportional to this)."""
        return len(self._count) - len(self._free)

    @property
    def num_tokens(self) -> int:
        """Tokens of all live sequences (each was counted once at the root)."""
        return self._cont[_ROOT]

    def tokens(self, seq: int) -> list[int]:
        """Sequence ``seq``'s tokens (the tree's own list: do not modify)."""
        return self._tokens[seq]

    def new_sequence(self, tokens: Iterable[int] = ()) -> int:
        """Start a sequence (optionally with ``tokens``); return its id."""
        seq = self._next_seq
        self._next_seq += 1
        self._tokens[seq] = []
        self._active[seq] = _ROOT
        self.extend(seq, tokens)
        return seq

    def _new_leaf(self, depth: int, seq: int, end: int) -> int:
        """A new leaf ``depth`` deep occurring in ``seq`` ending at ``end``: a freed node id if there is
        one, else a new id appended to every list."""
        if self._free:
            node = self._free.pop()
            self._count[node] = 1
            self._cont[node] = 0
            self._link[node] = _ROOT
            self._depth[node] = depth
            self._best[node] = -1
            self._ref_seq[node] = seq
            self._ref_end[node] = end
            return node
        node = len(self._count)
        self._children.append(None)
        self._count.append(1)
        self._cont.append(0)
        self._link.append(_ROOT)
        self._depth.append(depth)
        self._best.append(-1)
        self._ref_seq.append(seq)
        self._ref_end.append(end)
        return node

    def extend(self, seq: int, tokens: Iterable[int]) -> None:
        """Append ``tokens`` to sequence ``seq``: every new suffix (up to ``max_depth``) is counted."""
        (
            children,
            count,
            cont,
            link,
            depth,
            best,
            ref_seq,
            ref_end,
            actives,
            all_tokens,
        ) = self._extend_state
        new_leaf = self._new_leaf
        max_depth = self.max_depth
        stored = all_tokens[seq]
        start = len(stored)
        stored.extend(map(int, tokens))
        for pos in range(start, len(stored)):
            token = stored[pos]
            node = actives[seq]
            if depth[node] == max_depth:
                node = link[node]
            created = -1  # the node made in the previous round: its suffix link is this round's child
            active = _ROOT
            split: list[tuple[int, int, int]] | None = (
                None  # (new child, parent, token): linked after the walk
            )
            while True:
                kids = children[node]
                if kids is None:
                    kids = children[node] = {}
                child = kids.get(token)
                if child is None:
                    child = new_leaf(depth[node] + 1, seq, pos)
                    kids[token] = child
                    if created >= 0:
                        link[created] = child
                    created = child
                else:
                    grown = count[child] + 1
                    count[child] = grown
                    top = best[node]
                    if top >= 0 and top != token:
                        rival = count[kids[top]]
                        if grown > rival:
                            best[node] = token
                        elif grown == rival:
                            best[node] = -1
                    if created >= 0:
                        link[created] = child
                        created = -1
                    if active == _ROOT:
                        active = child
                    other = ref_seq[child]
                    if other >= 0:
                        # A leaf seen again becomes internal: its one earlier occurrence's continuation
                        # becomes a child leaf. When that occurrence ends its (other, still growing)
                        # sequence, the node is that sequence's new active unless a longer suffix of it
                        # became internal earlier in the same walk.
                        ref_seq[child] = -1
                        end = ref_end[child] + 1
                        other_tokens = all_tokens[other]
                        if end < len(other_tokens):
                            if depth[child] < max_depth:
                                next_token = other_tokens[end]
                                grandchild = new_leaf(depth[child] + 1, other, end)
                                children[child] = {next_token: grandchild}
                                best[child] = next_token
                                cont[child] = 1
                                if split is None:
                                    split = []
                                split.append((grandchild, child, next_token))
                        elif depth[child] > depth[actives[other]]:
                            actives[other] = child
                cont[node] += 1
                if node == _ROOT:
                    break
                node = link[node]
            if split is not None:
                for child, parent, token in split:
                    link_kids = children[link[parent]]
                    assert link_kids is not None
                    link[child] = link_kids[token]
            actives[seq] = active

    def remove(self, seq: int) -> None:
        """Forget sequence ``seq``: its substrings' counts drop and nodes left unused are freed."""
        children, count, cont, link, depth, ref_seq, best = (
            self._children,
            self._count,
            self._cont,
            self._link,
            self._depth,
            self._ref_seq,
            self._best,
        )
        max_depth = self.max_depth
        dead: list[tuple[int, int, int]] = []  # (parent, token, node)
        active = _ROOT
        for token in self._tokens[seq]:
            node = active if depth[active] < max_depth else link[active]
            active = _ROOT
            while True:
                kids = children[node]
                assert kids is not None
                child = kids[token]
                count[child] -= 1
                cont[node] -= 1
                if best[node] == token:
                    best[node] = -1
                if count[child] == 0:
                    dead.append((node, token, child))
                if active == _ROOT and ref_seq[child] < 0:
                    active = child
                if node == _ROOT:
                    break
                node = link[node]
        del self._tokens[seq], self._active[seq]
        for parent, token, node in dead:  # a dead node's descendants are dead too; no live node links to it
            kids = children[parent]
            if kids is not None:
                del kids[token]
            children[node] = None
            ref_seq[node] = -1
            self._free.append(node)

    def _leaf_next(self, leaf: int, offset: int) -> int:
        """The token ``offset`` places past leaf ``leaf``'s string (-1: none yet, or past ``max_depth``)."""
        seq_tokens = self._tokens[self._ref_seq[leaf]]
        pos = self._ref_end[leaf] + 1 + offset
        if pos < len(seq_tokens) and self._depth[leaf] + offset < self.max_depth:
            return seq_tokens[pos]
        return -1

    def _suffix(self, node: int, offset: int) -> tuple[int, int]:
        """The position of (node's string + ``offset`` implicit tokens) without its first token."""
        target = self._link[node]
        if offset:
            seq_tokens = self._tokens[self._ref_seq[node]]
            pos = self._ref_end[node] + 1
            while offset and self._ref_seq[target] < 0:
                kids = self._children[target]
                assert kids is not None
                target = kids[seq_tokens[pos]]
                pos += 1
                offset -= 1
        return target, offset

    def substring_counts(self) -> dict[tuple[int, ...], int]:
        """Every stored substring (length 1..max_depth) with its number of occurrences."""
        out: dict[tuple[int, ...], int] = {}
        stack: list[tuple[int, tuple[int, ...]]] = [(_ROOT, ())]
        while stack:
            node, path = stack.pop()
            if self._ref_seq[node] >= 0:
                offset = 0
                while (token := self._leaf_next(node, offset)) >= 0:
                    path = (*path, token)
                    out[path] = 1
                    offset += 1
                continue
            for token, child in (self._children[node] or {}).items():
                out[(*path, token)] = self._count[child]
                stack.append((child, (*path, token)))
        return out

    def sequence_tail(self, seq: int) -> tuple[int, int, int]:
        """Sequence ``seq``'s active suffix (its longest internal one) as ``match`` gives it: ``(node, 0,
        length)``. Its longer suffixes occur only at its end: no continuation to draft from."""
        node = self._active[seq]
        return node, 0, self._depth[node]

    def match(self, context: Sequence[int]) -> tuple[int, int, int]:
        """``(node, offset, length)``: the longest suffix of ``context`` stored in the tree, as a node and a
        number of implicit tokens past it (a leaf's), and its length; ``(root, 0, 0)`` when none is."""
        children, depth, ref_seq = self._children, self._depth, self._ref_seq
        node = _ROOT
        offset = 0
        for token in context[max(0, len(context) - self.max_depth) :]:
            token = int(token)
            while True:
                if ref_seq[node] >= 0:
                    if self._leaf_next(node, offset) == token:
                        offset += 1
                        break
                elif depth[node] < self.max_depth:
                    kids = children[node]
                    child = kids.get(token) if kids else None
                    if child is not None:
                        node = child
                        break
                if node == _ROOT:
                    break
                node, offset = self._suffix(node, offset)
        return node, offset, depth[node] + offset

    def speculate(
        self,
        node: int,
        offset: int,
        match_len: int,
        max_tokens: int,
        max_spec_factor: float,
        min_token_prob: float,
    ) -> Draft:
        """Best draft continuing the matched string (``node`` + ``offset`` implicit tokens, ``match_len``
        long) or one of its suffixes.

        From each candidate match (length m) the most frequent continuation is followed while the running
        product of ``count[child] / cont[parent]`` (1 along a leaf) stays >= ``min_token_prob``, for at most
        ``min(max_tokens, int(max_spec_factor * m))`` tokens; the highest score wins, the longer match on
        ties. Candidates stop once their length cap cannot beat the best score.
        """
        tokens, score, length = self._speculate(
            node, offset, match_len, max_tokens, max_spec_factor, min_token_prob
        )
        return Draft(tokens, score, length) if tokens else _NO_DRAFT

    def _speculate(
        self,
        node: int,
        offset: int,
        match_len: int,
        max_tokens: int,
        max_spec_factor: float,
        min_token_prob: float,
    ) -> tuple[list[int], float, int]:
        """:meth:`speculate` as ``(tokens, score, match_len)``, each candidate's draft walked inline: along
        a leaf (probability unchanged) its tokens are one slice of its occurrence's sequence."""
        children, count, cont, best, depth = self._children, self._count, self._cont, self._best, self._depth
        ref_seq, ref_end, all_tokens = self._ref_seq, self._ref_end, self._tokens
        max_depth = self.max_depth
        best_tokens: list[int] = []
        best_score = 0.0
        best_len = 0
        while node != _ROOT:
            limit = min(max_tokens, int(max_spec_factor * match_len + 1e-9))
            if limit <= best_score:
                break
            tokens: list[int] = []
            prob = 1.0
            score = 0.0
            at, at_offset = node, offset  # only a leaf has implicit tokens: an internal node's offset is 0
            while True:
                seq = ref_seq[at]
                if seq >= 0:
                    seq_tokens = all_tokens[seq]
                    pos = ref_end[at] + 1 + at_offset
                    n = min(limit - len(tokens), len(seq_tokens) - pos, max_depth - depth[at] - at_offset)
                    if n > 0:
                        tokens += seq_tokens[pos : pos + n]
                        for _ in range(n):
                            score += prob
                    break
                if len(tokens) >= limit or not cont[at]:
                    break
                kids = children[at]
                assert kids is not None
                token = best[at]
                if token < 0:
                    token = best[at] = max(kids, key=lambda t: count[kids[t]])  # ties: the first seen
                prob *= count[kids[token]] / cont[at]
                if prob < min_token_prob:
                    break
                at = kids[token]
                tokens.append(token)
                score += prob
            if score > best_score:
                best_tokens, best_score, best_len = tokens, score, match_len
            node, offset = self._suffix(node, offset)
            match_len -= 1
        return best_tokens, best_score, best_len


@dataclass
class _Request:
    """A running request: its local tree and its sequence there."""

    tree: SuffixTree
    seq: int


class SuffixCache:
    """Per-request suffix trees plus a global tree of generated tokens, and the drafts they give.

    ``max_tree_depth``: the trees' depth (match + draft length); ``max_cached_requests``: requests whose
    generated tokens the global tree keeps (0 disables it; oldest evicted first).
    """

    def __init__(self, max_tree_depth: int, max_cached_requests: int) -> None:
        self.max_tree_depth = _check_int("suffix_decoding_max_tree_depth", max_tree_depth, 1)
        self.max_cached_requests = _check_int("suffix_decoding_max_cached_requests", max_cached_requests, 0)
        self.global_tree = SuffixTree(self.max_tree_depth)
        self._active: dict[Hashable, _Request] = {}
        self._cached: OrderedDict[Hashable, int] = OrderedDict()

    @property
    def active_requests(self) -> set[Hashable]:
        return set(self._active)

    @property
    def cached_requests(self) -> list[Hashable]:
        """Requests whose generated tokens the global tree holds, oldest first."""
        return list(self._cached)

    @property
    def num_nodes(self) -> int:
        """Nodes of all trees (local and global): what the cache's memory is proportional to."""
        return self.global_tree.num_nodes + sum(r.tree.num_nodes for r in self._active.values())

    def start_request(self, req_id: Hashable, prompt: Iterable[int]) -> None:
        """Index ``prompt`` in a new local tree; a restarted request's earlier generated tokens are dropped
        from the global tree (they are indexed again as the request's context is)."""
        if req_id in self._active:
            raise KeyError(f"request {req_id!r} is already active")
        tree = SuffixTree(self.max_tree_depth)
        seq = tree.new_sequence(prompt)
        self._active[req_id] = _Request(tree, seq)
        if req_id in self._cached:
            self.global_tree.remove(self._cached.pop(req_id))
        if self.max_cached_requests:
            while len(self._cached) >= self.max_cached_requests:
                _, oldest = self._cached.popitem(last=False)
                self.global_tree.remove(oldest)
            self._cached[req_id] = self.global_tree.new_sequence()

    def is_active(self, req_id: Hashable) -> bool:
        return req_id in self._active

    def add_tokens(self, req_id: Hashable, tokens: Sequence[int]) -> None:
        """Append generated ``tokens`` to the request's local tree and (unless evicted) the global tree."""
        request = self._active[req_id]
        request.tree.extend(request.seq, tokens)
        seq = self._cached.get(req_id)
        if seq is not None:
            self.global_tree.extend(seq, tokens)

    def num_indexed(self, req_id: Hashable) -> int:
        """Tokens of the request's context (prompt + generated) its local tree holds."""
        request = self._active[req_id]
        return len(request.tree.tokens(request.seq))

    def stop_request(self, req_id: Hashable) -> None:
        """Drop the request's local tree; its generated tokens stay in the global tree until evicted."""
        del self._active[req_id]

    def _global_match(self, req_id: Hashable, context: list[int]) -> tuple[int, int, int]:
        """Where the global tree's drafts for ``context`` start, without a :meth:`match` walk when possible.

        The request's own sequence there (its ``g`` generated tokens) is a suffix of ``context``; its longest
        internal suffix (``a`` long) is taken directly when ``a < g`` or ``a`` is the tree's depth, as it
        yields the same best draft: no longer suffix of the context has a continuation. One of length
        ``a < m <= g`` occurs only at that end (else it would be internal), and one longer than ``g`` found
        elsewhere would make all ``g`` tokens occur twice (``a = g``). Otherwise (no generated tokens yet,
        all of them repeated, or the request evicted from the global tree) a full :meth:`match`."""
        glob = self.global_tree
        seq = self._cached.get(req_id)
        if seq is not None:
            tail = glob.sequence_tail(seq)
            if tail[2] < len(glob.tokens(seq)) or tail[2] == glob.max_depth:
                return tail
        return glob.match(context)

    def speculate(
        self, req_id: Hashable, max_spec_tokens: int, max_spec_factor: float, min_token_prob: float
    ) -> Draft:
        """The best draft for the request's current context from its local tree or the global tree."""
        tokens, score, match_len = self._speculate(
            req_id, self._active[req_id], max_spec_tokens, max_spec_factor, min_token_prob
        )
        return Draft(tokens, score, match_len) if tokens else _NO_DRAFT

    def _speculate(
        self,
        req_id: Hashable,
        request: _Request,
        max_spec_tokens: int,
        max_spec_factor: float,
        min_token_prob: float,
    ) -> tuple[list[int], float, int]:
        """:meth:`speculate` as ``(tokens, score, match_len)`` for the active ``request``."""
        if max_spec_tokens <= 0:
            return [], 0.0, 0
        tree = request.tree
        node, offset, match_len = tree.sequence_tail(request.seq)
        best = tree._speculate(node, offset, match_len, max_spec_tokens, max_spec_factor, min_token_prob)
        glob = self.global_tree
        if glob.num_tokens:
            node, offset, match_len = self._global_match(req_id, tree.tokens(request.seq))
            other = glob._speculate(node, offset, match_len, max_spec_tokens, max_spec_factor, min_token_prob)
            if other[1] > best[1]:
                return other
        return best


class SuffixDecodingProposer:
    """vLLM's ``suffix`` method: drafts from a :class:`SuffixCache` fed with each request's context.

    ``num_speculative_tokens``: the most tokens a draft has; the other settings are those of
    ``speculative_config.suffix_decoding_*``. The runner passes the batch's request ids and prompt
    lengths (``tracks_requests``) so that requests are started, extended and stopped as they run.
    """

    tracks_requests = True

    def __init__(
        self,
        num_speculative_tokens: int,
        max_model_len: int,
        max_tree_depth: int = 24,
        max_cached_requests: int = 10000,
        max_spec_factor: float = 1.0,
        min_token_prob: float = 0.1,
    ) -> None:
        self.k = _check_int("num_speculative_tokens", num_speculative_tokens, 1)
        self.max_model_len = _check_int("max_model_len", max_model_len, 2)
        if (
            isinstance(max_spec_factor, bool)
            or not isinstance(max_spec_factor, int | float)
            or max_spec_factor < 0
        ):
            raise SuffixConfigError(
                f"suffix_decoding_max_spec_factor must be a number >= 0, got {max_spec_factor!r}"
            )
        self.max_spec_factor = float(max_spec_factor)
        self.min_token_prob = _check_float("suffix_decoding_min_token_prob", min_token_prob, 0.0, 1.0)
        self.cache = SuffixCache(max_tree_depth, max_cached_requests)

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> SuffixDecodingProposer:
        """Build from ``speculative_config`` (``num_speculative_tokens``, ``suffix_decoding_*``)."""
        spec = getattr(vllm_config, "speculative_config", None)
        if spec is None:
            raise SuffixConfigError("vllm_config.speculative_config is required for the suffix method")
        return cls(
            spec.num_speculative_tokens,
            vllm_config.model_config.max_model_len,
            max_tree_depth=spec.suffix_decoding_max_tree_depth,
            max_cached_requests=spec.suffix_decoding_max_cached_requests,
            max_spec_factor=spec.suffix_decoding_max_spec_factor,
            min_token_prob=spec.suffix_decoding_min_token_prob,
        )

    def __repr__(self) -> str:
        return (
            f"SuffixDecodingProposer(k={self.k}, max_tree_depth={self.cache.max_tree_depth}, "
            f"max_cached_requests={self.cache.max_cached_requests}, max_spec_factor={self.max_spec_factor}, "
            f"min_token_prob={self.min_token_prob})"
        )

    def propose(
        self,
        num_speculative_tokens: int,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
        *,
        req_ids: Sequence[Hashable],
        num_prompt_tokens: np.ndarray,
    ) -> list[list[int]]:
        """One draft per request of the batch (row i: ``req_ids[i]``, context ``token_ids_cpu[i, :num_tokens_no_spec[i]]``
        whose first ``num_prompt_tokens[i]`` tokens are the prompt).

        A request is started the first time it samples, its new context tokens are indexed every step,
        and requests no longer in the batch are stopped (their generated tokens stay in the global tree).
        Requests that sampled nothing this step (a prefill chunk) get no draft; ``slot_mappings`` is
        unused (no model runs).
        """
        cache = self.cache
        batch = len(sampled_token_ids)
        limit = min(num_speculative_tokens, self.k)
        drafts: list[list[int]] = []
        active = cache._active
        max_model_len, factor, min_prob = self.max_model_len, self.max_spec_factor, self.min_token_prob
        for row in range(batch):
            if not sampled_token_ids[row]:
                drafts.append([])
                continue
            req_id = req_ids[row]
            num_tokens = int(num_tokens_no_spec[row])
            request = active.get(req_id)
            if request is None:
                cache.start_request(req_id, token_ids_cpu[row, : int(num_prompt_tokens[row])].tolist())
                request = active[req_id]
            indexed = len(request.tree.tokens(request.seq))
            if num_tokens > indexed:
                cache.add_tokens(req_id, token_ids_cpu[row, indexed:num_tokens].tolist())
            budget = min(limit, max_model_len - num_tokens - 1)
            drafts.append(cache._speculate(req_id, request, budget, factor, min_prob)[0])
        for req_id in cache.active_requests.difference(req_ids[:batch]):
            cache.stop_request(req_id)
        return drafts
